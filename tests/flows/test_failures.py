"""Expected failures end every command the same way: a sentence saying what is wrong and what to do, a
non-zero exit code, no traceback (unless `sage --verbose`), and the warehouse file as it was."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys

import pytest

from sage.warehouse import Warehouse

RUN = ["run", "-n", "1", "--set", "seeds.n_math=2", "--set", "seeds.n_code=0"]


def sage(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sage.flows.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env={**os.environ, "COLUMNS": "300"})


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def project(tmp_path):
    """A project directory with a real warehouse holding a few rows."""
    with Warehouse.open(tmp_path / "warehouse.duckdb") as wh:
        wh.insert_batch("questions", [dict(question_id=f"q{i}", origin="seed", domain="math", text=f"{i}+1?",
                                           verifier={"answer": str(i + 1)}, norm_hash=f"h{i}") for i in range(200)])
    return tmp_path


def _blocks(path) -> tuple[int, set[int], set[int]]:
    """The warehouse's block size, the blocks holding the questions table's rows and those holding any table's."""
    import duckdb

    with duckdb.connect(str(path), read_only=True) as con:
        size = con.execute("SELECT block_size FROM pragma_database_size()").fetchone()[0]
        tables = [t for (t,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()]
        blocks = {t: {b for (b,) in con.execute(f"SELECT DISTINCT block_id FROM pragma_storage_info('{t}') "
                                                "WHERE block_id >= 0").fetchall()} for t in tables}
    return size, blocks["questions"], set().union(*blocks.values())


def _damage(path, how: str) -> None:
    """Damage the file: cut in half, its header zeroed, or 200 bytes overwritten inside a block the open
    reads nothing of (the questions table's rows, or an index: a block no table's rows use)."""
    if how == "truncated":
        os.truncate(path, path.stat().st_size // 2)
    elif how == "zeroed header":
        with open(path, "r+b") as f:
            f.write(b"\0" * 4096)
    else:
        size, questions, rows = _blocks(path)
        used = (path.stat().st_size - 3 * 4096) // size
        block = min(questions) if how == "overwritten rows" else min(set(range(1, used)) - rows)
        with open(path, "r+b") as f:
            f.seek(3 * 4096 + block * size + 5000)
            f.write(bytes(range(200)))


def _assert_sentence(r, *words: str, code: int = 2) -> None:
    out = r.stdout + r.stderr
    assert r.returncode == code, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    for w in words:
        assert w in out.replace("\n", " "), out[-3000:]


@pytest.mark.parametrize("how", ["truncated", "zeroed header", "overwritten rows", "overwritten index"])
def test_a_damaged_warehouse_is_named_and_left_alone(project, how):
    wh_file = project / "warehouse.duckdb"
    _damage(wh_file, how)
    before = digest(wh_file)
    for args in (["status", "--dir", str(project)], ["sql", "select 1", "--dir", str(project)],
                 [*RUN, "--set", f"run.dir={project}"]):
        r = sage(*args)
        _assert_sentence(r, f"the warehouse {wh_file} is damaged", "nothing was changed", "export-parquet")
        assert "the warehouse the warehouse" not in r.stderr
        assert digest(wh_file) == before


def test_damage_found_in_the_middle_of_a_command_reads_once():
    """Damage a query reaches after the open (the file is not known there) is worded once, without claiming
    that nothing was written."""
    import duckdb

    from sage.flows.terminal import expected_error

    text, code = expected_error(duckdb.Error("Corrupt database file: computed checksum 1 does not match stored "
                                             "checksum 2 in block at location 12288"))
    assert code == 2 and text.startswith("the warehouse is damaged (Corrupt database file: computed checksum 1")
    assert "the warehouse the warehouse" not in text and "nothing was changed" not in text


def test_verbose_shows_the_traceback_too(project):
    _damage(project / "warehouse.duckdb", "truncated")
    r = sage("--verbose", "status", "--dir", str(project))
    assert r.returncode == 2 and "Traceback" in r.stderr and "is damaged" in r.stderr


def test_a_warehouse_held_by_another_program(project):
    wh_file = project / "warehouse.duckdb"
    before = digest(wh_file)
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
                               "print('held', flush=True); time.sleep(120)", str(wh_file)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for args in (["status", "--dir", str(project)], [*RUN, "--set", f"run.dir={project}"]):
            _assert_sentence(sage(*args), "in use by PID", str(holder.pid), code=3)
    finally:
        holder.kill()
        holder.wait()
    assert digest(wh_file) == before


def test_a_bad_seed_file_through_sage_run(project):
    bad = project / "seeds.jsonl"
    bad.write_text('{"question": "What is 1+1?", "answer": "2", "domain": "math"}\n{"question": 5}\n')
    before = digest(project / "warehouse.duckdb")
    _assert_sentence(sage(*RUN, "--set", f"run.dir={project}", "--set", f"seeds.source={bad}"), f"{bad}:2")
    assert digest(project / "warehouse.duckdb") == before


@pytest.mark.parametrize("generators, says", [("{gcd: {}, basic_arithmetc: {}}", "no generator 'basic_arithmetc'"),
                                              ("{gcd: {max_digits: 2}}", "seeds.math_generators.gcd: reasoning-gym "
                                                                          "refused {'max_digits': 2}"),
                                              # taken by its config, fails drawing a problem (three default weights)
                                              ("{simple_equations: {operators: ['+']}}",
                                               "seeds.math_generators.simple_equations: reasoning-gym could not "
                                               "generate a problem with {'operators': ['+']}: ValueError")])
def test_bad_math_generators_through_sage_run(project, generators, says):
    before = digest(project / "warehouse.duckdb")
    _assert_sentence(sage(*RUN, "--set", f"run.dir={project}", "--set", f"seeds.math_generators={generators}"), says)
    assert digest(project / "warehouse.duckdb") == before


def _mounted(tmp_path, script: str) -> subprocess.CompletedProcess:
    """Run `script` in a private mount namespace with a small tmpfs at tmp_path/mnt (root only)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to mount a private tmpfs")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=8m tmpfs {mnt} && {script}"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "300"})
    if "mount:" in r.stderr and r.returncode != 0 and "sage" not in r.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()[:200]}")
    return r


def test_a_read_only_file_system(project, tmp_path):
    cli = f"{sys.executable} -m sage.flows.cli"
    src = project / "warehouse.duckdb"
    r = _mounted(tmp_path, f"cp {src} {tmp_path}/mnt/warehouse.duckdb && mount -o remount,ro {tmp_path}/mnt && "
                           f"{cli} seed --set run.dir={tmp_path}/mnt --set seeds.n_math=2 --set seeds.n_code=0; "
                           f"echo rc=$?; sha256sum {tmp_path}/mnt/warehouse.duckdb")
    assert "rc=2" in r.stdout, r.stdout + r.stderr
    assert "read-only" in r.stderr and "Traceback" not in r.stderr
    assert r.stdout.split()[-2] == digest(src)


def test_a_full_disk_during_a_commit(project, tmp_path):
    cli = f"{sys.executable} -m sage.flows.cli"
    mnt = tmp_path / "mnt"
    fill = (f"avail=$(df -k {mnt} | tail -1 | awk '{{print $4}}'); "
            f"dd if=/dev/zero of={mnt}/fill bs=1k count=$((avail - 8)) 2>/dev/null")
    r = _mounted(tmp_path, f"cp {project}/warehouse.duckdb {mnt}/ && {fill}; "
                           f"{cli} seed --set run.dir={mnt} --set seeds.n_math=200 --set seeds.n_code=0 "
                           f"--set validate.n_math=100 --set validate.n_code=0; echo rc=$?; rm {mnt}/fill; "
                           f"{cli} sql 'select count(*) AS n from questions' --dir {mnt} --format csv")
    assert "rc=2" in r.stdout, r.stdout + r.stderr
    assert "no space left" in r.stderr and "Traceback" not in r.stderr
    assert r.stdout.strip().splitlines()[-1] == "200"  # everything committed before is intact


def test_iterations_must_be_at_least_one(tmp_path):
    for n in ("0", "-1"):
        r = sage("run", "-n", n, "--set", f"run.dir={tmp_path}")
        assert r.returncode == 2 and "-n" in r.stderr and "Traceback" not in r.stderr
        assert not (tmp_path / "warehouse.duckdb").exists()


@pytest.fixture
def bad_inputs(tmp_path):
    (tmp_path / "latin1.yaml").write_bytes("run:\n  dir: caf\xe9\n".encode("latin-1"))
    (tmp_path / "folder.yaml").mkdir()
    return tmp_path


@pytest.mark.parametrize("case", ["non-UTF-8 YAML", "YAML path a directory", "profile a directory",
                                  "seed path without suffix", "sql on a missing folder"])
def test_each_bad_input_gets_one_sentence_and_exit_2(bad_inputs, case):
    d = bad_inputs
    args, says = {
        "non-UTF-8 YAML": (["config", "-c", f"{d}/latin1.yaml"], [f"{d}/latin1.yaml:2: not UTF-8 text (byte 15)"]),
        "YAML path a directory": (["run", "-c", f"{d}/folder.yaml"], [f"config {d}/folder.yaml is a directory"]),
        "profile a directory": (["config", "-c", str(d)], [f"config {d} is a directory", "cpu"]),
        "seed path without suffix": (["seed", "--set", f"run.dir={d}/p", "--set", f"seeds.source={d}/seeds"],
                                     [f"{d}/seeds: no such file", "nothing was written"]),
        "sql on a missing folder": (["sql", "select 1", "--dir", f"{d}/missing"], [f"no warehouse at {d}/missing"]),
    }[case]
    _assert_sentence(sage(*args), *says, code=2)
