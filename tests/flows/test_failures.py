"""Expected failures end every command the same way: a sentence saying what is wrong and what to do, a
non-zero exit code, no traceback (unless `sage --verbose`), and the warehouse file as it was."""

from __future__ import annotations

import hashlib
import json
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
    for w in words:  # the console wraps at spaces, where a path may follow
        assert w in " ".join(out.split()), out[-3000:]


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
    seed = (f"{cli} seed --set seeds.n_math=200 --set seeds.n_code=0 --set validate.n_math=100 "
            f"--set validate.n_code=0 --set run.dir=")
    ids = "sql 'select question_id, origin from questions order by 1' --format csv --dir"
    r = _mounted(tmp_path, f"cp {project}/warehouse.duckdb {mnt}/ && {fill}; {seed}{mnt}; echo rc=$?; "
                           f"{cli} sql 'select count(*) AS n from questions' --dir {mnt} --format csv; rm {mnt}/fill; "
                           f"{seed}{mnt} > /dev/null; echo rc=$?; {cli} {ids} {mnt}")
    assert "rc=2" in r.stdout, r.stdout + r.stderr
    assert "no space left" in r.stderr and "Traceback" not in r.stderr
    said = " ".join(r.stderr.split())
    assert f"the warehouse {mnt}/warehouse.duckdb" in said and "free at least" in said, r.stderr
    out = r.stdout.split("rc=")
    assert out[1].split()[-1] == "200"  # everything committed before is intact
    # the same command on the freed disk: the seeds of an uninterrupted seeding, row for row
    clean = tmp_path / "clean"
    clean.mkdir()
    shutil.copy(project / "warehouse.duckdb", clean)
    assert subprocess.run(f"{seed}{clean}", shell=True, capture_output=True).returncode == 0
    uninterrupted = sage("sql", "select question_id, origin from questions order by 1", "--format", "csv",
                         "--dir", str(clean)).stdout.split()
    assert out[2].split()[0] == "0" and out[2].split()[1:] == uninterrupted and len(uninterrupted) > 301


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


@pytest.mark.parametrize("setting, field", [("train.lr=.inf", "train.lr"),
                                            ("sandbox.timeout_s=.inf", "sandbox.timeout_s"),
                                            ("iteration.alpha=.nan", "iteration.alpha"),
                                            ("roles.solver.unconstrained=[.inf]", "roles.solver.unconstrained.0")])
def test_a_setting_that_is_not_finite(project, setting, field):
    """`gt=0` admits infinity: lr=.inf trained an adapter of NaNs, timeout_s=.inf overflowed the sandbox's timer."""
    before = digest(project / "warehouse.duckdb")
    for args in (["config", "--set", setting], [*RUN, "--set", f"run.dir={project}", "--set", setting]):
        _assert_sentence(sage(*args), f"{field}: Input should be a finite number")
    assert digest(project / "warehouse.duckdb") == before


def test_a_warehouse_from_a_newer_version(project):
    import duckdb

    from sage.warehouse.db import migrations

    wh_file = project / "warehouse.duckdb"
    with duckdb.connect(str(wh_file)) as con:
        con.execute("INSERT INTO migrations (version, name) VALUES (999, 'from_the_future')")
    before = digest(wh_file)
    for args in (["status", "--dir", str(project)], ["sql", "select 1", "--dir", str(project)],
                 [*RUN, "--set", f"run.dir={project}"]):
        _assert_sentence(sage(*args), f"the warehouse {wh_file} has schema version 999, newer than this version of "
                                      f"sage knows ({len(migrations())}); nothing was changed")
        assert digest(wh_file) == before


def test_paths_of_the_wrong_kind(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    _assert_sentence(sage(*RUN, "--set", f"run.dir={tmp_path}/file"), f"{tmp_path}/file is a file, not a directory")
    _assert_sentence(sage("seed", "--set", f"run.dir={tmp_path}/file/sub"), f"{tmp_path}/file is a file")
    (tmp_path / "p" / "warehouse.duckdb").mkdir(parents=True)
    for args in (["status", "--dir", f"{tmp_path}/p"], [*RUN, "--set", f"run.dir={tmp_path}/p"]):
        _assert_sentence(sage(*args), f"the warehouse {tmp_path}/p/warehouse.duckdb is a directory")
    assert (tmp_path / "file").read_text() == "not a directory" and not any((tmp_path / "p" / "warehouse.duckdb")
                                                                            .iterdir())


def test_a_file_size_limit(project):
    """Under `ulimit -f` the Prefect server, the sandbox and the warehouse failed one after another (and the run
    blamed the sandbox backend): the command now refuses before it starts."""
    import resource

    before = digest(project / "warehouse.duckdb")
    r = subprocess.run([sys.executable, "-m", "sage.flows.cli", *RUN, "--set", f"run.dir={project}"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "300"},
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (2_000_000, 2_000_000)))
    _assert_sentence(r, "a file-size limit of 2,000,000 bytes is set (ulimit -f)", "nothing was written")
    assert "bubblewrap" not in r.stderr and r.stderr.count("error:") == 1
    assert digest(project / "warehouse.duckdb") == before


def test_an_impossible_validation_size(project, tmp_path):
    """cpu.yaml's generators hold a few hundred distinct problems: 100,000 drew for minutes and gigabytes."""
    before = digest(project / "warehouse.duckdb")
    for d in (project, tmp_path / "fresh"):
        r = sage("seed", "--set", f"run.dir={d}", "--set", "validate.n_math=100000")
        _assert_sentence(r, "validate.n_math=100000: too few problems", "reasoning_gym:products 66 of 16666")
    assert digest(project / "warehouse.duckdb") == before
    assert not (tmp_path / "fresh").exists()


def test_a_failed_seed_in_a_new_directory_leaves_no_file(tmp_path):
    """A code problem whose reference solution raises is found in the sandbox, inside the seed stage, after the
    warehouse was made: it is removed again, as 'nothing was written' says."""
    bad = tmp_path / "seeds.jsonl"
    bad.write_text('{"domain": "code", "question": "Write boom.", "entry_point": "boom", "inputs": [[1]], '
                   '"solution": "def boom(x):\\n    raise ValueError(\'no\')\\n"}\n')
    _assert_sentence(sage("seed", "--set", f"run.dir={tmp_path}/new", "--set", f"seeds.source={bad}"),
                     f"{bad}:1", "nothing was written")
    assert not (tmp_path / "new").exists()


def test_a_full_disk_during_the_read_only_copy(project, tmp_path):
    """The copy for other DuckDB clients (`run.snapshot`) fails on a full disk: its part copy is removed (it held
    the space the next commit needs), the log names the copy and the space, and the seeds are committed."""
    cli = f"{sys.executable} -m sage.flows.cli"
    mnt = tmp_path / "mnt"
    fill = (f"avail=$(df -k {mnt} | tail -1 | awk '{{print $4}}'); "
            f"dd if=/dev/zero of={mnt}/fill bs=1k count=$((avail - 1400)) 2>/dev/null")
    seed = (f"{cli} seed --set run.dir={mnt} --set seeds.n_math=2 --set seeds.n_code=0 --set validate.n_math=2 "
            f"--set validate.n_code=0")
    r = _mounted(tmp_path, f"cp {project}/warehouse.duckdb {mnt}/ && {fill}; {seed}; echo rc=$?; ls {mnt}; "
                           f"rm {mnt}/fill; {seed}; echo rc=$?; ls {mnt}; "
                           f"{cli} sql 'select count(*) AS n from questions' --dir {mnt} --format csv")
    out = r.stdout + r.stderr
    assert r.stdout.count("rc=0") == 2 and "Traceback" not in out, out
    assert ".partial" not in r.stdout.split("rc=0")[1] and "snapshot" not in r.stdout.split("rc=0")[1], out
    assert f"no space left for {mnt}/warehouse.snapshot.duckdb" in r.stderr and "free at least" in r.stderr, out
    assert "seeds already loaded" in r.stdout, out  # on the freed disk: done once, whole
    assert r.stdout.strip().splitlines()[-1] == "204"


def test_a_damaged_write_ahead_log(project):
    """A batch whose process died before the file was closed stays in the write-ahead log; damaged, it is named,
    with what moving it aside gives back: every batch before it."""
    wh_file, wal = project / "warehouse.duckdb", project / "warehouse.duckdb.wal"
    subprocess.run([sys.executable, "-c", "import duckdb, os, sys; c = duckdb.connect(sys.argv[1]); "
                    "c.execute(\"SET checkpoint_threshold='1GB'\"); c.execute(\"INSERT INTO questions (question_id, "
                    "origin, domain, text, verifier, norm_hash) SELECT 'x' || range, 'seed', 'math', 'x' || range, "
                    "'{}', 'x' || range FROM range(5000)\"); os._exit(0)", str(wh_file)], check=True)
    assert wal.stat().st_size > 0
    with open(wal, "r+b") as f:
        f.seek(wal.stat().st_size // 2)
        f.write(b"\xff" * 64)
    before = digest(wh_file)
    r = sage("status", "--dir", str(project))
    _assert_sentence(r, f"the write-ahead log {wal} of the warehouse {wh_file} is damaged", "nothing was changed",
                     f"mv {wal} {wal}.damaged", "every batch committed before the one in flight")
    assert digest(wh_file) == before
    wal.rename(f"{wal}.damaged")
    r = sage("sql", "select count(*) AS n from questions", "--dir", str(project), "--format", "csv")
    assert r.returncode == 0 and r.stdout.split()[:2] == ["n", "200"], r.stdout + r.stderr


def test_a_missing_model_before_anything_starts(project):
    """A model that is not there was found by the first stage that generates, after seeding and a Prefect start,
    with the run recorded `failed`; it is now refused before the run is recorded."""
    before = digest(project / "warehouse.duckdb")
    r = sage(*RUN, "--set", f"run.dir={project}", "--set", f"model.name={project}/no-such-model")
    _assert_sentence(r, f"model path '{project}/no-such-model' does not exist")
    assert "Prefect" not in r.stderr and r.stderr.count("error:") == 1
    assert digest(project / "warehouse.duckdb") == before
    (project / "a-file").write_text("")  # where the bundled model would be converted to: a file
    r = sage(*RUN, "--set", f"run.dir={project}", "--set", f"model.cache_dir={project}/a-file")
    _assert_sentence(r, f"model.cache_dir {project}/a-file: the converted model cannot be written there")
    assert digest(project / "warehouse.duckdb") == before


def test_a_seed_question_longer_than_the_model_can_read(project):
    """A 10 MB question loaded and the Solver was shown it cut to a few thousand characters, in silence: it is
    refused at load, with file and line; --skip-bad loads the rest and names it."""
    seeds = project / "long.jsonl"
    seeds.write_text('{"question": "What is 1+1?", "answer": "2", "domain": "math"}\n'
                     + json.dumps({"question": "Add these. " + "1 + " * 20_000 + "1", "answer": "20001",
                                   "domain": "math"}) + "\n")
    before = digest(project / "warehouse.duckdb")
    for args in (["seed"], RUN):
        _assert_sentence(sage(*args, "--set", f"run.dir={project}", "--set", f"seeds.source={seeds}",
                              "--set", "model.max_model_len=1024"),
                         f"1 problem(s) of {seeds} are longer than the model can read",
                         f"{seeds}:2: the question has 80,012 characters, more than model.max_model_len (1024 tokens)",
                         "nothing was written")
        assert digest(project / "warehouse.duckdb") == before
    r = sage("seed", "--skip-bad", "--set", f"run.dir={project}", "--set", f"seeds.source={seeds}",
             "--set", "model.max_model_len=1024")
    assert r.returncode == 0 and "1 new question(s) of 2 loaded" in r.stdout and f"skipped {seeds}:2" in r.stderr, \
        r.stdout + r.stderr


def test_a_full_disk_during_a_run_is_said_once(project, tmp_path):
    """Prefect logged the failure three times (ERROR lines of the task and the flow) before the sentence."""
    cli = f"{sys.executable} -m sage.flows.cli"
    mnt = tmp_path / "mnt"
    fill = (f"avail=$(df -k {mnt} | tail -1 | awk '{{print $4}}'); "
            f"dd if=/dev/zero of={mnt}/fill bs=1k count=$((avail - 8)) 2>/dev/null")
    r = _mounted(tmp_path, f"cp {project}/warehouse.duckdb {mnt}/ && {fill}; "
                           f"{cli} run -n 1 --set run.dir={mnt} --set seeds.n_math=200 --set seeds.n_code=0 "
                           f"--set validate.n_math=100 --set validate.n_code=0; echo rc=$?")
    assert "rc=2" in r.stdout, r.stdout + r.stderr
    assert r.stderr.count("no space left") == 1 and "ERROR" not in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_more_code_tasks_than_the_set_holds(tmp_path):
    """seeds.n_code beyond the codeio tasks of its half loaded fewer in silence (and the seed half ran into the
    validation half's tasks): refused before any sandbox run, naming the count."""
    r = sage("seed", "--set", f"run.dir={tmp_path}/new", "--set", "seeds.n_code=5000", "--set", "seeds.n_math=2")
    _assert_sentence(r, "seeds.n_code=5000: reasoning_gym:codeio has", "tasks for the seed set", "lower seeds.n_code")
    assert not (tmp_path / "new").exists()
