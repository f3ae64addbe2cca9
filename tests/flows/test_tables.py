"""What `sage sql`, `sage status` and `sage config --schema` print at a given terminal width (COLUMNS): headers
whole, long cells cut, long ids and timestamps hidden before measures and text, text cut before more columns are
hidden (from the right), a line naming what was hidden and how to see it, one `column = value` line per column
(`--format line`, or on its own when not even the first column fits),
model-written text shown and never obeyed; and the one-sentence errors of a missing run and a bad stage name."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

WIDE = "SELECT " + ", ".join(f"i * {k} AS measurement_{k:02d}" for k in range(22)) + " FROM range(3) t(i)"


def sage(*args, width: int = 80, text: bool = True):
    return subprocess.run([sys.executable, "-m", "sage.flows.cli", *map(str, args)], capture_output=True, text=text,
                          timeout=120, env={**os.environ, "COLUMNS": str(width)})


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A warehouse with one run, `run-a`, whose stages include a failed one with a long error."""
    from sage.warehouse import Warehouse

    d = tmp_path_factory.mktemp("project")
    wh = Warehouse.open(d / "warehouse.duckdb")
    wh.execute("INSERT INTO runs (run_id, config, config_hash, base_model, seed) VALUES ('run-a', '{}', 'h', 'm', 0)")
    for stage, status, error in [("challenge", "done", None), ("critique_question", "done", None),
                                 ("critique_plan", "failed", "ValueError: " + "bad plan " * 20)]:
        wh.execute("INSERT INTO stage_runs (run_id, iteration, stage, status, rows_in, rows_out, seconds, error) "
                   "VALUES ('run-a', 1, ?, ?, 10, 9, 1.5, ?)", [stage, status, error])
    wh.close()
    return d


def header(out: str) -> str:
    return next(line for line in out.splitlines() if "measurement_00" in line)


@pytest.mark.parametrize("width", [80, 160])
def test_a_wide_result_keeps_headers_whole_and_names_the_columns_it_hides(project, width):
    r = sage("sql", WIDE, "--dir", project, width=width)
    lines = r.stdout.splitlines()
    assert r.returncode == 0, r.stderr
    assert max(len(line) for line in lines) <= width
    names = [c.strip() for c in header(r.stdout).strip("┃").split("┃")]
    shown = len(names)
    assert names == [f"measurement_{k:02d}" for k in range(shown)]  # from the left, none cut
    footer = " ".join(x.strip() for x in lines[lines.index(next(x for x in lines if "columns hidden" in x)):-1])
    hidden = ", ".join(f"measurement_{k:02d}" for k in range(shown, 22))
    assert f"{22 - shown} of 22 columns hidden: {hidden}; --format line or --format csv shows them" in footer
    assert lines[-1] == "3 rows"
    assert shown >= (9 if width == 160 else 4)


AUDIT = ("SELECT 'run-078ccdf3' AS run_id, 1 AS iteration, md5('q' || i) AS question_id, 'math' AS domain, "
         "'What is the sum of the first ' || i || ' odd numbers, counted from one upwards?' AS text, "
         "'7' AS label, 0.25 AS loss, md5('p' || i) AS parent_id, TIMESTAMP '2026-12-07 18:00:00' AS created_at, "
         "'rejected_ungrounded' AS rejection_reason FROM range(2) t(i)")


def test_ids_and_timestamps_are_hidden_before_measures_and_text(project):
    """At 80 columns the hash ids and the timestamp go first; the measure, the label and the reason stay, and the
    question text is cut, not hidden; numbers are right-aligned."""
    r = sage("sql", AUDIT, "--dir", project, width=80)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and max(map(len, lines)) <= 80, r.stdout
    names = [c.strip() for c in next(x for x in lines if "iteration" in x).strip("┃").split("┃")]
    assert names == ["iteration", "domain", "text", "label", "loss", "rejection_reason"], names
    assert "What is the sum o…" in r.stdout and "upwards?" not in r.stdout
    assert "4 of 10 columns hidden: run_id, question_id, parent_id, created_at;" in r.stdout
    row = next(x for x in lines if "What is" in x)
    assert "│         1 │ math   │" in row, row  # a number right, text left


def test_a_result_that_fits_shows_every_column_and_no_footer(project):
    r = sage("sql", "SELECT 1 AS alpha, 'x' AS beta, 2.5 AS gamma", "--dir", project)
    assert "…" not in r.stdout and "hidden" not in r.stdout and "gamma" in r.stdout


def test_format_line_prints_every_column_whole(project):
    r = sage("sql", "SELECT i AS n, repeat('word ', 40) AS a_long_name FROM range(2) t(i)", "--dir", project,
             "--format", "line")
    assert r.returncode == 0, r.stderr
    long = "word " * 40
    assert r.stdout == f"          n = 0\na_long_name = {long}\n\n          n = 1\na_long_name = {long}\n\n2 rows\n"


def test_csv_and_json_are_unchanged_by_the_width(project):
    for fmt in ("csv", "json"):
        outs = {sage("sql", WIDE, "--dir", project, "-f", fmt, width=w).stdout for w in (40, 80, 300)}
        assert len(outs) == 1 and "measurement_21" in outs.pop()


def test_columns_too_wide_for_the_terminal_are_printed_as_lines(project):
    """Not even the first column fits with its header whole: lines, not a table of `…`."""
    query = ("SELECT i AS first_column_with_a_long_header_name, i AS middle, "
             "i AS last_column_with_a_long_header_name FROM range(2) t(i)")
    r = sage("sql", query, "--dir", project, width=36)
    assert r.returncode == 0 and "┃" not in r.stdout and "…" not in r.stdout
    assert "first_column_with_a_long_header_name = 1" in r.stdout.splitlines()
    assert "middle = 0" in r.stdout and r.stdout.endswith("\n2 rows\n")


def test_long_cells_are_cut_even_on_a_wide_terminal(project):
    r = sage("sql", "SELECT i, repeat('z', 300) AS zs FROM range(2) t(i)", "--dir", project, width=300)
    row = next(line for line in r.stdout.splitlines() if "zzz" in line)
    assert "z" * 39 + "…" in row and "z" * 41 not in row and "hidden" not in r.stdout


HOSTILE = "'a' || chr(27) || '[2J' || chr(13) || '[bold]b[/bold]' || chr(7) || chr(8238) || 'c' || chr(155) || 'd'"
SHOWN = "a\\x1b[2J\\r[bold]b[/bold]\\x07\\u202ec\\x9bd"


@pytest.mark.parametrize("fmt", ["table", "line"])
def test_model_written_text_is_shown_not_obeyed(project, fmt):
    """Escape sequences, carriage returns, bells, bidi overrides and rich markup, in cells and in headers."""
    query = f"SELECT {HOSTILE} AS \"h\x1b[31mx\", i, {HOSTILE} AS other, 3 AS last FROM range(2) t(i)"
    r = sage("sql", query, "--dir", project, "-f", fmt, width=200, text=False)
    out = r.stdout.decode()
    assert r.returncode == 0 and not any(c in out for c in "\x1b\r\x07\u202e\x9b\x08"), out
    assert SHOWN in out and "h\\x1b[31mx" in out


def test_status_tables_fit_80_columns_with_headers_and_stage_names_whole(project):
    r = sage("status", "--dir", project)
    lines = r.stdout.splitlines()
    # tables and sentences fit; an error and a command (a dead run's resume command) are printed whole, to copy
    sentences = ("error", "  sage ")
    assert r.returncode == 0 and max(len(line) for line in lines if not line.startswith(sentences)) <= 80, r.stdout
    stages = lines[lines.index(next(line for line in lines if line.strip() == "stages")) + 2]
    assert [c.strip() for c in stages.strip("┃").split("┃")][:3] == ["iteration", "stage", "status"]
    assert "critique_question" in r.stdout and "critique_plan" in r.stdout and "critiq…" not in r.stdout
    # the error is a sentence under the table, whole
    assert f"error in iteration 1 critique_plan: ValueError: {'bad plan ' * 20}".rstrip() in r.stdout


def test_status_format_line(project):
    r = sage("status", "--dir", project, "--format", "line")
    assert r.returncode == 0 and "   stage = critique_question" in r.stdout and "rows_out = 9" in r.stdout


def test_status_of_a_run_that_does_not_exist_names_the_runs_that_do(project):
    r = sage("status", "--dir", project, "--run", "nosuch")
    assert r.returncode == 2 and r.stdout == ""
    assert "no run 'nosuch'" in r.stderr and "runs here: run-a" in r.stderr and "no runs yet" not in r.stderr


def test_status_of_a_run_in_a_warehouse_without_runs(tmp_path):
    from sage.warehouse import Warehouse

    Warehouse.open(tmp_path / "warehouse.duckdb").close()
    r = sage("status", "--dir", tmp_path, "--run", "nosuch")
    assert r.returncode == 2 and "no run 'nosuch'" in r.stderr and "no runs yet" in r.stderr


def test_status_rejects_an_unknown_format(project):
    r = sage("status", "--dir", project, "--format", "csv")
    assert r.returncode == 2 and "use table or line" in r.stderr


def test_config_schema_shows_the_profiles_value_beside_the_default():
    r = sage("config", "--schema", width=200)
    row = next(line for line in r.stdout.splitlines() if "train.lr " in line)
    assert r.returncode == 0 and [c.strip() for c in row.strip("│").split("│")][:3] == ["train.lr", "3e-06", "0.0003"]
    assert "profile: cpu" in r.stdout
    r = sage("config", "--schema", "--set", "train.lr=0.5", width=80)  # too narrow for 4 columns: lines
    assert r.returncode == 0 and "  field = train.lr\ndefault = 3e-06\nprofile = 0.5\n" in r.stdout


def test_the_stage_deployment_takes_only_a_stage_it_can_run():
    from prefect.exceptions import ParameterTypeError
    from prefect.utilities.callables import parameter_schema

    from sage.flows.iteration import RUNNABLE, stage_flow

    schema = parameter_schema(stage_flow.fn).model_dump()
    assert schema["definitions"]["RunnableStage"]["enum"] == list(RUNNABLE)  # the UI offers a list
    params = {"directory": "d", "run_id": "r", "iteration": 1}
    assert stage_flow.validate_parameters({**params, "stage": "verify"})["stage"] == "verify"
    with pytest.raises(ParameterTypeError, match="stage: Input should be 'challenge'.*'verify'.*or 'validate'"):
        stage_flow.validate_parameters({**params, "stage": "verfy"})


def test_a_zero_is_never_minus_zero():
    from sage.flows.terminal import cell

    assert cell(-0.0) == "0" and cell(-0.00012) == "-0.00012" and cell(0.5) == "0.5"


def test_a_bad_option_says_error_as_every_command_does(project):
    """A usage error (typer's) reads as the commands' own errors: `error:` on stderr after the usage line, exit 2."""
    r = sage("status", "--bogus", "--dir", project)
    assert r.returncode == 2 and "error: No such option: --bogus" in r.stderr, r.stderr
    assert "Error" not in r.stderr and "Usage: " in r.stderr
