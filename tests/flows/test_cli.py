import os
import re
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

import pytest

from sage.flows.cli import app

ROOT = Path(__file__).parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
CLI_MD = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
COMMANDS = sorted(c.name or c.callback.__name__ for c in app.registered_commands)


def _sage(*args):
    return subprocess.run([sys.executable, "-m", "sage.flows.cli", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_help_a_readme_row_and_a_reference_section(name):
    """Each command: its `--help` works, the README's commands table has a one-line row linking to its section of
    docs/cli.md, and that section holds the generated help (tests/flows/test_cli_reference.py checks it is current)."""
    r = _sage(name, "--help")
    assert r.returncode == 0 and "Usage" in r.stdout
    row = rf"^\| \[`sage {re.escape(name)}`\]\(docs/cli\.md#sage-{re.escape(name)}\) \| \S[^\n]* \|$"
    assert re.search(row, README, re.M), f"README's commands table has no row for `sage {name}`"
    section = CLI_MD.split(f"\n## `sage {name}`\n", 1)
    assert len(section) == 2, f"docs/cli.md has no section `sage {name}`"
    assert f'<!-- [[[cog help("{name}")]]] -->' in section[1].split("\n## ", 1)[0]


def test_readme_starts_with_the_commands():
    """`make run` and `make test` are the README's first two commands; the head names the other test tiers."""
    head = README.split("\n## ")[0]
    first_block = re.search(r"```bash\n(.*?)```", head, re.S).group(1)
    assert [line.split("#")[0].strip() for line in first_block.splitlines()][:2] == ["make run", "make test"]
    assert "make test-fast" in head and "make lint" in head


def test_readme_is_a_manual():
    """The README stays a manual: short, with short table cells; measurements and experiments live in docs/."""
    lines = README.splitlines()
    assert len(lines) <= 380, f"README has {len(lines)} lines: move detail to docs/ (about 350 at most)"
    cells = [(n, c.strip()) for n, line in enumerate(lines, 1) if line.startswith("|") for c in line.split("|")[1:-1]]
    long = [(n, len(c)) for n, c in cells if len(c) > 220]
    assert not long, f"README table cells over 220 characters (line, length): {long}"


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    heads = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("doc", ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))])
def test_local_links_resolve(doc):
    """Every relative link and image of the README and docs/ points at a file that exists (and a heading that
    exists, where it names one)."""
    path = ROOT / doc
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        assert dest.exists(), f"{doc} links to {target}, which does not exist"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{doc} links to {target}: no such heading"


@pytest.mark.parametrize("where", ["an empty folder", "a missing folder"])
def test_status_without_a_warehouse_is_one_sentence_and_exit_2(tmp_path, where):
    d = tmp_path if where == "an empty folder" else tmp_path / "nonexistent"
    r = _sage("status", "--dir", str(d))
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr, r.stderr
    said = "".join(r.stderr.split())  # the console wraps long paths anywhere
    assert said.startswith(f"error:nowarehouseat{d}/warehouse.duckdb:startaprojecttherewith`sagerun`")
    assert ". " not in " ".join(r.stderr.split())


def test_run_takes_the_project_directory_as_the_other_commands_do(tmp_path, monkeypatch):
    """`sage run --dir D` is `--set run.dir=D`: the run is created in D's warehouse and stores D as its run.dir."""
    from typer.testing import CliRunner

    from sage.flows import cli
    from sage.warehouse import Warehouse

    monkeypatch.setattr(cli, "_check_prefect", lambda: None)
    monkeypatch.setattr(cli, "_run_flow", lambda directory, *args, **kwargs: [])  # no iterations: no flow
    r = CliRunner().invoke(app, ["run", "--dir", str(tmp_path / "p"), "--run", "r1"])
    assert r.exit_code == 0, r.output
    with Warehouse.open(tmp_path / "p" / "warehouse.duckdb", read_only=True) as wh:
        stored = wh.rows("SELECT config ->> '$.run.dir' AS dir FROM runs WHERE run_id = 'r1'")
    assert stored == [{"dir": str(tmp_path / "p")}]


def test_sql_formats(tmp_path):
    from sage.warehouse import Warehouse

    Warehouse.open(tmp_path / "warehouse.duckdb").close()
    r = _sage("sql", "SELECT 1 AS a, 'x' AS b", "--dir", str(tmp_path), "--format", "csv")
    assert r.returncode == 0 and r.stdout.splitlines() == ["a,b", "1,x"]
    r = _sage("sql", "SELECT 1 AS a", "--dir", str(tmp_path), "--format", "json")
    assert r.returncode == 0 and r.stdout.strip() == '[{"a": 1}]'
    r = _sage("sql", "SELECT count(*) AS n FROM questions", "--dir", str(tmp_path))
    assert r.returncode == 0 and "n" in r.stdout
    r = _sage("sql", "SELEC nonsense", "--dir", str(tmp_path))
    assert r.returncode == 2 and "error" in r.stderr.lower()


@pytest.fixture
def empty_warehouse(tmp_path):
    from sage.warehouse import Warehouse

    Warehouse.open(tmp_path / "warehouse.duckdb").close()
    return tmp_path


def test_sql_reads_a_script_from_standard_input(empty_warehouse):
    sage = [sys.executable, "-m", "sage.flows.cli", "sql", "--dir", str(empty_warehouse), "-f", "csv"]
    r = subprocess.run(sage, input="SELECT 1 AS a;\nSELECT 'x;y' AS b;  -- a comment\n", capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.splitlines() == ["a", "1", "b", "x;y"], r.stderr
    r = subprocess.run(sage, input="SELECT 1 AS a; SELECT nope; SELECT 3 AS c;", capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stdout.splitlines() == ["a", "1"]        # stops at the statement that fails
    assert "in `SELECT nope;`" in r.stderr and "Binder Error" in r.stderr
    r = subprocess.run(sage, input="", capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no SQL to run" in r.stderr


def test_sql_without_a_query_at_a_terminal_is_a_shell(empty_warehouse):
    """At a terminal (a pseudo-terminal here) `sage sql` reads statement after statement, ended by `;`, possibly
    over several lines; an error is printed and the shell goes on; Ctrl-D leaves it."""
    import pty
    import select

    main, child = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "sage.flows.cli", "sql", "--dir", str(empty_warehouse)],
                         stdin=child, stdout=child, stderr=child, env={**os.environ, "COLUMNS": "80",
                                                                       "HOME": str(empty_warehouse)})
    os.close(child)
    out = b""

    def until(prompt: bytes, since: int) -> None:
        """Read until output written after offset `since` ends with `prompt`: the shell asks for the next line.
        (Typed ahead, before the prompt that reads it, a line or Ctrl-D can be dropped as readline sets the
        terminal up, and the shell then waits for input that never comes.)"""
        nonlocal out
        deadline = time.monotonic() + 120
        while not (len(out) > since and out.endswith(prompt)):
            assert time.monotonic() < deadline and p.poll() is None, out.decode(errors="replace")
            if select.select([main], [], [], 1)[0]:
                out += os.read(main, 4096)

    typed = 0
    for line in [b"SELECT 41 + 1", b" AS answer;", b"SELECT nope;", b"SELECT 'after' AS s;"]:
        until(b"> ", typed)
        os.write(main, line + b"\n")
        typed = len(out)
    until(b"sage> ", typed)
    os.write(main, b"\x04")
    deadline = time.monotonic() + 120
    with suppress(OSError):   # the shell exited and closed its end
        while time.monotonic() < deadline:
            if select.select([main], [], [], 1)[0]:
                if not (chunk := os.read(main, 4096)):
                    break
                out += chunk
    assert p.wait(10) == 0, out.decode(errors="replace")
    os.close(main)
    text = out.decode(errors="replace")
    assert "sage sql on" in text and "answer" in text and "42" in text and "1 row" in text
    assert "Binder Error" in text and "after" in text.split("Binder Error")[1]     # it went on after the error
    assert (empty_warehouse / ".sage_sql_history").exists()


def test_sql_empty_result_shows_the_header_and_0_rows(empty_warehouse):
    r = _sage("sql", "SELECT 1 AS alpha, 'x' AS beta WHERE false", "--dir", str(empty_warehouse))
    assert r.returncode == 0, r.stderr
    header = next(line for line in r.stdout.splitlines() if "alpha" in line)
    assert "beta" in header and "0 rows" in r.stdout
    r = _sage("sql", "SELECT 1 AS alpha, 'x' AS beta WHERE false", "--dir", str(empty_warehouse), "-f", "csv")
    assert r.stdout == "alpha,beta\n"
    r = _sage("sql", "SELECT 1 AS a UNION ALL SELECT 2", "--dir", str(empty_warehouse))
    assert "2 rows" in r.stdout


def test_sql_csv_ends_lines_with_newline_only(empty_warehouse):
    r = subprocess.run([sys.executable, "-m", "sage.flows.cli", "sql", "--dir", str(empty_warehouse), "-f", "csv",
                        "SELECT i, 'a,b' AS s, NULL AS n FROM range(3) t(i)"], capture_output=True, timeout=120)
    assert r.returncode == 0 and b"\r" not in r.stdout
    assert r.stdout.decode().split("\n") == ["i,s,n", '0,"a,b",', '1,"a,b",', '2,"a,b",', ""]


def test_sql_table_escapes_control_characters_and_markup(empty_warehouse):
    """Cells can hold model output: escape sequences, carriage returns and rich markup are shown, not obeyed."""
    query = "SELECT 'ok' || chr(27) || '[31mred' || chr(10) || 'x' || chr(13) || '[bold]b[/bold]' || chr(7) AS t"
    r = subprocess.run([sys.executable, "-m", "sage.flows.cli", "sql", "--dir", str(empty_warehouse), query],
                       capture_output=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    out = r.stdout.decode()
    assert r.returncode == 0 and not any(c in out for c in "\x1b\r\x07")
    assert "ok\\x1b[31mred\\nx\\r[bold]b[/bold]\\x07" in out


def test_sql_table_fits_the_terminal_width(empty_warehouse):
    query = "SELECT repeat('word ', 200) AS long_text, 42 AS answer, repeat('z', 300) AS other"
    for width in (40, 100):
        r = subprocess.run([sys.executable, "-m", "sage.flows.cli", "sql", "--dir", str(empty_warehouse), query],
                           capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": str(width)})
        lines = r.stdout.splitlines()
        assert r.returncode == 0 and lines and max(len(line) for line in lines) <= width, r.stdout
        assert "42" in r.stdout and "…" in r.stdout and len(lines) <= 8  # cut, not wrapped over many lines


def test_one_row_too_wide_for_the_terminal_is_shown_on_its_side(empty_warehouse):
    query = "SELECT " + ", ".join(f"{i} AS column_number_{i}" for i in range(12))
    r = subprocess.run([sys.executable, "-m", "sage.flows.cli", "sql", "--dir", str(empty_warehouse), query],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "80"})
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and max(len(line) for line in lines) <= 80
    assert all(f"column_number_{i}" in r.stdout for i in range(12)) and "…" not in r.stdout  # nothing cut
    assert lines[-1] == "1 row"


@pytest.mark.parametrize("args", [[], ["sql", "SELECT 1"], ["status"], ["config"]])
def test_quick_commands_import_no_torch_transformers_or_prefect(empty_warehouse, args):
    """`sage sql`, `status` and `config` start fast: importing the CLI and running them loads none of the heavy
    libraries (they load where a command needs them: run, stage, eval, serve, export)."""
    args = [*args, "--dir", str(empty_warehouse)] if args[:1] in (["sql"], ["status"]) else args
    code = ("import sys\nfrom sage.flows.cli import app\nargs = sys.argv[1:]\nif args:\n"
            "    try:\n        app(args)\n    except SystemExit as e:\n        assert not e.code, e.code\n"
            "print('LOADED', sorted(m for m in ('torch', 'transformers', 'prefect') if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "LOADED []"


def test_the_readme_line_that_reads_the_warehouse_from_python_works(tmp_path):
    line = next(line for line in README.splitlines() if line.startswith(".venv/bin/python -c \"import duckdb"))
    code = line.removeprefix(".venv/bin/python -c ").strip('"')
    from sage.warehouse import Warehouse

    with Warehouse.open(tmp_path / "sage-runs" / "warehouse.duckdb") as wh:
        wh.snapshot()   # as a run leaves it after every stage
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0 and "pool_size" in r.stdout, r.stderr
