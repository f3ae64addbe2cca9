"""The `sage` command line. Every command has --help, a row in README.md's command table and a section of
docs/cli.md generated from its --help (tests keep all three true)."""

from __future__ import annotations

import json
import shlex
import signal
import sys
import traceback
from contextlib import suppress
from pathlib import Path
from typing import Annotated

import click
import typer
from rich.text import Text
from typer.core import TyperGroup

from sage.flows.terminal import (
    BUSY,
    FORMATS,
    MAX_CELL,
    cell,
    console,
    err,
    expected_error,
    fail,
    print_rows,
    quiet_prefect_tracebacks,
)
from sage.warehouse.db import warehouse_path

try:  # typer 0.29 runs commands on a bundled copy of click, whose exceptions are its own classes
    from typer._click.exceptions import UsageError as _BundledUsageError
except ImportError:
    _BundledUsageError = click.UsageError
_USAGE_ERRORS = (click.UsageError, _BundledUsageError)


class _Commands(TyperGroup):
    """Every command ends an expected failure the same way: one sentence on stderr saying what is wrong and what
    to do, and a non-zero exit code; the traceback only with `sage --verbose`. Anything else is a bug and keeps
    its traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except _USAGE_ERRORS as e:  # a bad option or argument: the usage line, then `error:` as every command
            if e.ctx is not None:
                err.print(Text(e.ctx.get_usage()), highlight=False)
                err.print(Text(f"Try '{e.ctx.command_path} --help' for help."), highlight=False)
            err.print("[bold red]error:[/]", Text(e.format_message()), highlight=False)
            ctx.exit(e.exit_code)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
            raise
        except Exception as e:
            known = expected_error(e) or _expected_here(e)
            if known is None:
                raise
            if ctx.params.get("verbose"):
                traceback.print_exc()
            err.print(f"[bold red]error:[/] {known[0]}", highlight=False)
            ctx.exit(known[1])


def _expected_here(e: Exception) -> tuple[str, int] | None:
    """Expected failures of the flows' own (not in `expected_error`): a configured Prefect API that is down."""
    from sage.flows.api_server import PrefectUnreachable
    from sage.flows.terminal import USAGE

    return (str(e), USAGE) if isinstance(e, PrefectUnreachable) else None


app = typer.Typer(cls=_Commands, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False)


@app.callback()
def main(verbose: Annotated[bool, typer.Option("--verbose", help="Show a failure's traceback, not only its sentence.")]
         = False) -> None:
    """SAGE: four roles (Challenger, Planner, Critic, Solver) evolve one LLM from seed problems."""


ConfigOpt = Annotated[str, typer.Option("--config", "-c",
                                        help="Profile name in configs/ (cpu, paper-7b) or a YAML path.")]
SetOpt = Annotated[list[str] | None, typer.Option("--set",
                                                  help="Override one field: section.field=value (repeatable).")]
DirOpt = Annotated[Path, typer.Option("--dir", help="Project directory holding warehouse.duckdb.")]
SkipBadOpt = Annotated[bool, typer.Option("--skip-bad", help="Load a seed file even when some of its code problems "
                                          "cannot be used (reported with file, line and reason, and skipped); "
                                          "the same as --set seeds.skip_bad=true.")]


def _config(config: str, overrides: list[str] | None):
    from sage.configs import ConfigError, load_config

    try:
        return load_config(config, overrides or [])
    except ConfigError as e:
        fail(str(e))


def _check_seed_file(cfg) -> None:
    """A user's seed file is read and checked before anything is written, so a bad row (SeedFileError, with
    file and line, or a question longer than the model can read) leaves the warehouse as it was; so are
    `seeds.math_generators` (ConfigError naming the generator or setting) and the validation size they must give
    (ConfigError naming the generators short and their counts). (A missing file is the seed stage's to report: a
    run whose seeds are loaded never reads it again.)"""
    from sage.engines.data.seeds import default_math, load_file
    from sage.stages.seed import check_sizes, refuse_unreadable

    _check_file_size_limit()
    source = Path(cfg.seeds.source)
    if source.is_file():
        refuse_unreadable(cfg, load_file(source), cfg.seeds.source)
    if cfg.seeds.source == "default" and cfg.seeds.math_generators is not None:
        default_math(len(cfg.seeds.math_generators), cfg.seeds.seed, "seed", cfg.seeds.math_generators)
    check_sizes(cfg)


def _check_model(cfg) -> None:
    """The model resolves (bundled and installed, or an existing directory; a Hugging Face id is looked up when it
    loads) before a run is recorded: a missing one is one sentence (ModelNotFoundError), not a run recorded
    `failed` after seeding and a Prefect start."""
    from sage.engines.llm.models import ModelNotFoundError, resolve_model

    try:
        resolve_model(cfg.model.name, cfg.model.cache_dir)
    except ModelNotFoundError:
        raise
    except OSError as e:  # the bundled model is converted into model.cache_dir on first use
        fail(f"model.cache_dir {cfg.model.cache_dir}: the converted model cannot be written there ({e.strerror or e}"
             f"{f': {e.filename}' if e.filename else ''}); pick a writable directory (--set model.cache_dir=DIR)")


#: The smallest file-size limit (`ulimit -f`) a run starts under: the warehouse, the Prefect server's database,
#: converted models and adapters are written as files of hundreds of megabytes and more.
MIN_FILE_SIZE_LIMIT = 1 << 30


def _check_file_size_limit() -> None:
    """A file-size limit (RLIMIT_FSIZE) below `MIN_FILE_SIZE_LIMIT` ends the command before anything is written:
    under it each file stops growing at the limit, and the Prefect server, the sandbox and the warehouse fail
    one after another, each in its own words."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if soft != resource.RLIM_INFINITY and soft < MIN_FILE_SIZE_LIMIT:
        fail(f"a file-size limit of {soft:,} bytes is set (ulimit -f), below the {MIN_FILE_SIZE_LIMIT >> 30} GiB "
             f"the warehouse, the Prefect server's database and the models need; nothing was written. Raise it "
             f"(`ulimit -f unlimited`) and run the command again")


def _open(path: Path, read_only: bool = False):
    from sage.warehouse import Warehouse, WarehouseBusy

    try:
        return Warehouse.open(path, read_only=read_only)
    except WarehouseBusy as e:
        fail(str(e), code=BUSY)
    except FileNotFoundError as e:  # no warehouse there: a bad --dir, not a busy file
        fail(str(e))


@app.command()
def seed(config: ConfigOpt = "cpu", set_: SetOpt = None, skip_bad: SkipBadOpt = False) -> None:
    """Load the seed pool and the held-out validation set into the warehouse (idempotent)."""
    from sage.configs.names import Stage
    from sage.flows.record import run_recorded
    from sage.flows.session import Session
    from sage.stages import seed as seed_stage
    from sage.warehouse import WarehouseBusy
    from sage.warehouse.queries import question_counts

    cfg = _config(config, [*(set_ or []), *(["seeds.skip_bad=true"] if skip_bad else [])])
    _check_seed_file(cfg)
    path = warehouse_path(cfg.run.dir)
    fresh, made = not path.exists(), [p for p in (path.parent, *path.parent.parents) if not p.exists()]
    try:
        with Session(cfg.run.dir) as s, console.status("loading seeds (code tasks run in the sandbox)..."):
            ctx = s.context_for(cfg, None)
            report = run_recorded(ctx, Stage.SEED, seed_stage.run, run_id=seed_stage.seeds_key(ctx), iteration=0)
            counts = question_counts(s.warehouse)
    except BaseException as e:
        if fresh and not isinstance(e, WarehouseBusy):  # a busy file is another process's: never removed
            _remove_new(path, made)
        raise
    if report is None:
        console.print("seeds already loaded (nothing to do)")
    else:
        console.print(f"seed: {report.rows_out} new question(s) of {report.rows_in} loaded")
        for line in report.info.get("skipped", []):
            err.print(f"skipped {line}", highlight=False, markup=False)
    print_rows(counts, title=f"questions in {warehouse_path(cfg.run.dir)}")


def _remove_new(path: Path, made: list[Path]) -> None:
    """After a failed `sage seed` in a new directory: remove the warehouse it made there (it holds no question:
    the seeds commit in one transaction, at the end) and the directories it made, so the failure leaves no file
    behind, as its sentence says."""
    from sage.warehouse import Warehouse, snapshot_path

    try:
        with Warehouse.open(path, read_only=True) as wh:
            if wh.count("questions"):
                return
    except Exception:  # what it holds cannot be read: left as it is
        return
    for p in (path, path.with_name(path.name + ".wal"), path.with_name(path.name + ".writer"), snapshot_path(path),
              *made):  # the directories innermost first
        with suppress(OSError):
            p.rmdir() if p in made else p.unlink(missing_ok=True)


@app.command()
def sql(query: Annotated[str | None, typer.Argument(
            help="SQL to run, e.g. \"select * from curriculum_drift\". Without it, statements are read from "
                 "standard input: an interactive shell at a terminal (end each with `;`, leave with Ctrl-D or "
                 "`.quit`), else a script such as `sage sql < queries.sql`.", show_default=False)] = None,
        directory: DirOpt = Path("./sage-runs"),
        fmt: Annotated[str, typer.Option("--format", "-f", help="table (fits the terminal: long cells cut; when the "
                                         "columns do not fit, ids and timestamps hidden first, then text cut, then "
                                         "columns on the right hidden, each named), line (one `column = value` per "
                                         "line: every column, whole), csv or json.")] = "table",
        write: Annotated[bool, typer.Option("--write", help="Open the warehouse for writing (default read-only).")]
        = False) -> None:
    """Run SQL against the warehouse and print the result as a table, lines, CSV or JSON."""
    if fmt not in FORMATS:
        fail(f"--format {fmt!r}: use table, line, csv or json")
    path = warehouse_path(directory)
    if query is not None:
        _run_sql(path, query, fmt, write)
    elif sys.stdin.isatty():
        _sql_shell(path, fmt, write)
    else:
        _run_sql(path, sys.stdin.read(), fmt, write)


def _run_sql(path: Path, text: str, fmt: str, write: bool, *, shell: bool = False) -> None:
    """Run each statement of `text` in turn and print each result. Each statement opens the warehouse for its
    own time only (a run in progress waits for nothing longer). An error ends the command, naming the statement,
    or, in the shell (`shell`), is printed and the shell goes on."""
    import duckdb

    try:
        statements = [st.query.strip() for st in duckdb.extract_statements(text)]
    except duckdb.Error as e:
        return _sql_error(f"{type(e).__name__}: {e}", shell)
    if not statements and not shell:
        fail('no SQL to run: give a query, e.g. `sage sql "select * from curriculum_drift"`, or statements on '
             'standard input')
    for statement in statements:
        wh = _open(path, read_only=not write)
        try:
            with wh.held() as con:
                cur = con.execute(statement)
                columns = [d[0] for d in cur.description or []]
                rows = [dict(zip(columns, r)) for r in cur.fetchall()] if columns else []
        except duckdb.Error as e:
            where = f"in `{statement[:80]}`: " if len(statements) > 1 else ""
            return _sql_error(f"{where}{type(e).__name__}: {e}", shell)
        finally:
            wh.close()
        print_rows(rows, fmt, columns=columns, count=True)


def _sql_error(message: str, shell: bool) -> None:
    if not shell:
        fail(message)
    err.print(message, highlight=False, markup=False)


def _sql_shell(path: Path, fmt: str, write: bool) -> None:
    """An interactive SQL shell: lines gather until one ends with `;`, then run as `_run_sql` runs them, with
    history (`~/.sage_sql_history`) and line editing where Python has readline."""
    try:
        import readline
    except ImportError:   # not every Python is built with it
        readline = None
    history = Path.home() / ".sage_sql_history"
    if readline is not None:
        with suppress(OSError):
            readline.read_history_file(history)
    console.print(f"sage sql on {path} ({'read-write' if write else 'read-only'}): end a statement with `;`, "
                  f"leave with Ctrl-D or `.quit`", highlight=False, markup=False)
    buffer: list[str] = []
    try:
        while True:
            try:
                line = input("sage> " if not buffer else "  ...> ")
            except KeyboardInterrupt:   # Ctrl-C drops the statement being typed, as shells do
                buffer = []
                print()
                continue
            if not buffer and line.strip() in (".quit", ".exit", "quit", "exit"):
                break
            buffer.append(line)
            if line.rstrip().endswith(";"):
                _run_sql(path, "\n".join(buffer), fmt, write, shell=True)
                buffer = []
    except EOFError:
        print()
    finally:
        if readline is not None:
            with suppress(OSError):
                readline.write_history_file(history)


@app.command()
def status(directory: DirOpt = Path("./sage-runs"),
           run: Annotated[str | None, typer.Option("--run", help="Show only this run.")] = None,
           fmt: Annotated[str, typer.Option("--format", "-f", help="table (fits the terminal: columns that do not fit "
                                            "hidden, and named) or line (one `column = value` per line).")]
           = "table") -> None:
    """List runs, their iterations and each stage's state."""
    from sage.warehouse.queries import question_counts, run_config, run_ids, runs_overview, stage_states
    from sage.warehouse.runs import dead_rows

    if fmt not in ("table", "line"):
        fail(f"--format {fmt!r}: use table or line")
    path = warehouse_path(directory)
    if not path.exists():  # a mistyped --dir, or no run yet: the state to fix, as `sage sql` says it
        fail(f"no warehouse at {path}: start a project there with `sage run` (`make run` sets up and runs the "
             f"defaults), or give --dir of an existing one")
    with _open(path, read_only=True) as wh, wh.held():  # one connection: every table from the same state
        runs = [r for r in runs_overview(wh) if run is None or r["run_id"] == run]
        names = run_ids(wh) if run is not None and not runs else []
        counts = question_counts(wh)
        stages = {r["run_id"]: stage_states(wh, r["run_id"]) for r in runs}
        dead = dead_rows(wh)  # recorded `running`, but the process that ran them is gone: shown `dead`
        configs = {rid: (run_config(wh, rid) or (None,))[0] for (rid, it, _) in dead if it is None}
    for r in runs:
        if (r["run_id"], None, None) in dead:
            r["status"] = "dead"
        for row in stages[r["run_id"]]:
            if (r["run_id"], row["iteration"], row["stage"]) in dead:
                row["status"] = "dead"
    if run is not None and not runs:
        have = f"runs here: {', '.join(map(cell, names))}" if names else "no runs yet (start one with `sage run`)"
        fail(f"no run '{cell(run)}' in {path}; {have}")
    more = "`sage status --format line` shows them"
    if counts:
        print_rows(counts, fmt, title="questions", more=more)
    if not runs:
        console.print("no runs yet. Start one with `sage run` (or `make run`).")
    for r in runs:
        print_rows([r], fmt, title=f"run {r['run_id']}", more=more)
        rows = stages[r["run_id"]]
        if fmt == "line":
            print_rows(rows, fmt, title="stages")
            _say_dead(r, rows, dead, configs.get(r["run_id"]), directory)
            continue
        # Errors are sentences: printed whole under the table, which then fits a narrower terminal.
        print_rows([{k: v for k, v in row.items() if k != "error"} for row in rows], title="stages", more=more)
        for row in rows:
            if row.get("error"):
                console.print(Text(f"error in iteration {row['iteration']} {cell(row['stage'])}: {cell(row['error'])}"),
                              soft_wrap=True)
        _say_dead(r, rows, dead, configs.get(r["run_id"]), directory)


def _say_dead(run: dict, stages: list[dict], dead: dict, config: str | None, directory: Path) -> None:
    """Under a run's tables, for what `sage status` shows `dead`: whose process is gone, and the command that
    resumes (the same `sage run` resumes a run; a lone `sage stage` is resumed by itself, or by `sage run`)."""
    rid = run["run_id"]
    gone = [row for row in stages if row["status"] == "dead"]
    if run["status"] != "dead" and not gone:
        return
    pid = dead.get((rid, None, None), next((dead[(rid, g["iteration"], g["stage"])] for g in gone), (None,)))[0]
    what = ", ".join(f"iteration {g['iteration']} {g['stage']}" for g in gone)
    line = (f"run {cell(rid)}: dead{f' in {what}' if what else ''}: its process {f'(PID {pid}) ' if pid else ''}is "
            f"gone (killed outright?) and never recorded how it ended; committed batches are kept. ")
    if run["status"] != "dead":
        whole = resume_command(config, rid, directory)
        _sentence(f"{line}Resume the stage with the command below"
                  + (", or the whole run with the one after it:" if whole else
                     f", or the whole run with `sage run --run {shlex.quote(rid)}` and the -c and --set it was "
                     f"started with:"),
                  f"sage stage {gone[0]['stage']} --run {shlex.quote(rid)} --iteration {gone[0]['iteration']}")
        if whole:
            console.print(Text(f"  {whole}"), soft_wrap=True)
    elif command := resume_command(config, rid, directory):
        _sentence(f"{line}Resume it, with the config it was started with, by:", command)
    else:
        _sentence(f"{line}Resume it with the -c and --set it was started with:", f"sage run --run {shlex.quote(rid)}")


def resume_command(config: str | None, run_id: str, directory: Path) -> str | None:
    """The whole `sage run` that resumes run `run_id` from its stored config (JSON): the profile it differs least
    from, a --set for each field that differs, and run.dir; None when the stored config is empty or does not load
    (one written by another version)."""
    import yaml
    from pydantic import BaseModel

    from sage.configs import _profiles, config_from_dict, load_config
    from sage.configs.schema import SageConfig

    try:
        data = json.loads(config or "null")
        if not data or not isinstance(data, dict):
            return None
        stored = config_from_dict(data).model_dump(mode="json")
    except ValueError:
        return None

    def differ(model, base: dict, mine: dict, prefix: str) -> list[str]:
        found = []
        for name, info in model.model_fields.items():
            kind = info.annotation if isinstance(info.annotation, type) else None
            if kind is not None and issubclass(kind, BaseModel):
                found += differ(kind, base[name], mine[name], f"{prefix}{name}.")
            elif base[name] != mine[name] and f"{prefix}{name}" != "run.dir":
                value = yaml.safe_dump(mine[name], default_flow_style=True, width=10**6).strip()
                found.append(f"{prefix}{name}={value.removesuffix(chr(10) + '...')}")
        return found

    profile, sets = min(((p, differ(SageConfig, load_config(p).model_dump(mode="json"), stored, ""))
                         for p in _profiles()), key=lambda found: len(found[1]))
    words = ["sage", "run", "--run", run_id, "-c", profile,
             *(w for a in [*sets, f"run.dir={directory}"] for w in ("--set", a))]
    return " ".join(map(shlex.quote, words))


def _summary(wh, run_id: str, iteration: int) -> None:
    from sage.warehouse.queries import iteration_summary

    for name, rows in iteration_summary(wh, run_id, iteration).items():
        if rows:
            print_rows(rows, title=f"iteration {iteration}: {name}")


def _best(wh, run_id: str, directory: str) -> None:
    """The run's last words: its best checkpoint by validation (as `sage status`, early stopping and `sage export`
    choose it) and the command that exports it."""
    import shlex

    from sage.warehouse.checkpoints import CheckpointNotFound, resolve_checkpoint

    def checkpoint(name: str):
        try:
            return resolve_checkpoint(wh, run_id, name)
        except CheckpointNotFound:
            return None

    export = f"sage export --run {shlex.quote(run_id)} --checkpoint"
    where = f" --dir {shlex.quote(directory)}"
    best, command = checkpoint("best"), None
    if best is None:
        latest = checkpoint("latest")
        line = "best checkpoint: none, nothing was validated"
        if latest is not None and latest.adapter is not None:
            line, command = f"{line}; export the last adapter (iteration {latest.iteration}) with:", \
                f"{export} latest{where}"
    elif best.adapter is None:
        line = (f"best checkpoint: the base model (iteration 0, validation pass@1 {cell(best.val_accuracy)}); no "
                f"adapter beat it, so there is no adapter to export; this writes the base model:")
        command = f"{export} best --merge{where}"
    else:
        line = (f"best checkpoint: iteration {best.iteration} (validation pass@1 {cell(best.val_accuracy)}, adapter "
                f"{best.adapter}); export it with:")
        command = f"{export} best{where}"
    _sentence(line, command)


def _sentence(line: str, command: str | None = None) -> None:
    """A sentence, wrapped at words to the terminal, then the command it names on a line of its own, indented and
    never wrapped by us, so it copies whole (a terminal narrower than the command still folds it)."""
    console.print(Text(line))
    if command is not None:
        console.print(Text(f"  {command}"), soft_wrap=True)


QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress display: only warnings, errors and the "
                                                              "final summary.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Also print Prefect's INFO log lines (above the live "
                                                                  "display) and a failure's traceback.")]


def _display(quiet: bool, verbose: bool, **shown):
    """The progress display of a flow command (`flows/progress.py`): live on a terminal, one line per finished
    stage otherwise, nothing with --quiet. The command's --verbose and `sage --verbose` mean the same."""
    from sage.flows.progress import QUIET, Display
    from sage.flows.terminal import current_context
    from sage.flows.terminal import verbose as root_verbose

    verbose = verbose or root_verbose()
    ctx = current_context()
    if verbose and ctx is not None:
        ctx.find_root().params["verbose"] = True
    return Display(err, QUIET if quiet else None, verbose=verbose, **shown)


def _check_prefect() -> None:
    """Before any work: a configured Prefect API (PREFECT_API_URL) that does not answer ends the command with one
    sentence naming it and the fix (PrefectUnreachable, through the command group's error path)."""
    from sage.flows.api_server import check_api

    check_api()


def _say(display):
    """How `_run_flow` says a private Prefect server is starting: a line on stderr, none with --quiet."""
    from sage.flows.progress import QUIET

    if display is not None and display.mode == QUIET:
        return None
    return lambda line: err.print(line, highlight=False, markup=False, soft_wrap=True)


def _run_flow(directory: str, fn, *args, engines: dict | None = None, display=None):
    """Run flow `fn` in a session for `directory` that shows progress on `display` (default: the terminal's),
    reporting to the Prefect API of `flows/api_server.py`. SIGINT and SIGTERM stop it within seconds: the stage in
    flight ends `interrupted` (its committed batches are kept), every helper this process started stops, and the
    command says how to resume and exits 130 or 143."""
    from sage.flows.api_server import cancel_interrupted, prefect_api
    from sage.flows.progress import Display
    from sage.flows.record import Interrupted, ended, stopped_by_signals
    from sage.flows.session import Session

    def signal_name(e: BaseException) -> str:
        return signal.Signals(Interrupted.received or getattr(e, "signal", signal.SIGINT)).name

    resume = " ".join(["sage", *sys.argv[1:]])
    with stopped_by_signals():
        try:
            with prefect_api(_say(display)), display or Display(err) as shown, \
                    Session(directory, display=shown, engines=engines) as session:
                quiet_prefect_tracebacks()
                try:
                    return fn(*args)
                except BaseException as e:  # Prefect recorded the runs a signal stopped as Crashed: say Cancelled
                    if ended(e) == "interrupted":
                        cancel_interrupted(session.flow_runs, f"interrupted ({signal_name(e)}); committed work is "
                                                              f"kept; resume with: {resume}")
                    raise
        except BaseException as e:
            if ended(e) != "interrupted":
                raise
            signum = signal.Signals[signal_name(e)]
            err.print(f"interrupted ({signum.name}): committed work is kept, the batch in flight was "
                      f"dropped; resume with: {resume}", highlight=False, soft_wrap=True)
            raise typer.Exit(128 + signum) from None


@app.command()
def run(config: ConfigOpt = "cpu", set_: SetOpt = None, skip_bad: SkipBadOpt = False,
        iterations: Annotated[int | None, typer.Option("--iterations", "-n", min=1, help="Iterations to run, at least "
                                                       "1 (default: run.iterations).")] = None,
        run_id: Annotated[str | None, typer.Option("--run", help="Run name (default: run-<config hash>, so the same "
                                                   "config resumes).")] = None,
        directory: Annotated[Path | None, typer.Option("--dir", help="Project directory holding warehouse.duckdb "
                                                       "(default: run.dir, ./sage-runs); the same as --set "
                                                       "run.dir=DIR.")] = None,
        quiet: QuietOpt = False, verbose: VerboseOpt = False) -> None:
    """Seed if needed, then run SAGE iterations as Prefect flows; resumes a run where it stopped."""
    from sage.flows.evolve import evolve_flow
    from sage.flows.session import Session

    cfg = _config(config, [*(set_ or []), *(["seeds.skip_bad=true"] if skip_bad else []),
                           *([f"run.dir={directory}"] if directory is not None else [])])
    n = iterations or cfg.run.iterations
    directory = str(Path(cfg.run.dir).expanduser())
    _check_prefect()
    _check_seed_file(cfg)
    _check_model(cfg)
    with Session(directory) as s:
        rid = s.create_run(cfg, run_id)
    console.print(f"run {rid}: {n} iteration(s) of {cfg.model.name} ({cfg.model.backend}); "
                  f"warehouse {warehouse_path(directory)}")
    summaries = _run_flow(directory, evolve_flow, directory, rid, n,
                          display=_display(quiet, verbose, run_id=rid, iterations=n))
    wh = _open(warehouse_path(directory), read_only=True)
    try:
        for k in range(1, len(summaries) + 1):  # early stopping may end the run before n
            _summary(wh, rid, k)
        _sentence(f"warehouse: {warehouse_path(directory)}; its numbers per iteration:",
                  f"sage sql \"select * from curriculum_drift where run_id = '{rid}'\" --dir {directory}")
        _best(wh, rid, directory)
    finally:
        wh.close()


@app.command()
def stage(name: Annotated[str, typer.Argument(help="Stage to run, e.g. verify (see `sage status` for names).")],
          run_id: Annotated[str, typer.Option("--run", help="Run id (see `sage status`).")],
          iteration: Annotated[int, typer.Option("--iteration", "-i", help="Iteration number.")],
          directory: DirOpt = Path("./sage-runs"),
          force: Annotated[bool, typer.Option("--force", help="Redo the stage even if it is done: replace its rows for "
                                              "the iteration; the stages after it become stale and the next `sage run` "
                                              "redoes them.")] = False,
          quiet: QuietOpt = False, verbose: VerboseOpt = False) -> None:
    """Re-run exactly one stage of one iteration (skipped if done, unless --force)."""
    from sage.flows.iteration import RUNNABLE, stage_flow
    from sage.flows.session import Session
    from sage.warehouse.runs import check_stage_target

    if name not in RUNNABLE:
        fail(f"unknown stage {name!r}; one of: {', '.join(RUNNABLE)}")
    if not warehouse_path(directory).exists():
        fail(f"no warehouse at {warehouse_path(directory)}")
    _check_file_size_limit()
    _check_prefect()
    with Session(str(directory)) as s:  # refused here, before a flow run starts or a row is written
        check_stage_target(s.warehouse, run_id, iteration, name, force)
    result = _run_flow(str(directory), stage_flow, str(directory), run_id, iteration, name, force,
                       display=_display(quiet, verbose, run_id=run_id))
    console.print(f"{name}: already done (use --force to redo)" if result is None else f"{name}: {result}")


@app.command()
def report(run_id: Annotated[str, typer.Option("--run", help="Run id (see `sage status`).")],
           directory: DirOpt = Path("./sage-runs"),
           out: Annotated[Path | None, typer.Option("--out", help="Output folder (default: <dir>/reports/<run>).")]
           = None) -> None:
    """Write PNG plots and an HTML page of a run's curriculum, rewards, gate and validation curve."""
    from sage.flows.report import write_report
    from sage.warehouse.runs import run_dirname

    wh = _open(warehouse_path(directory), read_only=True)
    try:
        html = write_report(wh, run_id, out or Path(directory) / "reports" / run_dirname(run_id))
    except ValueError as e:
        fail(str(e))
    finally:
        wh.close()
    console.print(f"report: {html}")


@app.command("export-parquet")
def export_parquet(run_id: Annotated[str, typer.Option("--run", help="Run id (see `sage status`).")],
                   dest: Annotated[str, typer.Argument(help="Folder or fsspec URL (s3://bucket/path, ...) to write.")],
                   directory: DirOpt = Path("./sage-runs")) -> None:
    """Write every table of a run as Hive-partitioned Parquet under DEST, for workers and notebooks."""
    from sage.warehouse.export import ExportError, export_run

    wh = _open(warehouse_path(directory), read_only=True)
    try:
        counts = export_run(wh, run_id, dest)
    except (ExportError, ImportError, ValueError) as e:
        fail(str(e))
    finally:
        wh.close()
    print_rows([{"table": t, "rows": n} for t, n in counts.items()], title=f"exported run {run_id} to {dest}")


@app.command("config")
def show_config(config: ConfigOpt = "cpu", set_: SetOpt = None,
                schema: Annotated[bool, typer.Option("--schema", help="List every field with its default, its value in "
                                                     "the profile (with --set overrides) and its help text.")]
                = False) -> None:
    """Print the resolved configuration (profile plus --set overrides) as YAML, or every field's help."""
    import yaml

    from sage.configs.schema import SageConfig

    cfg = _config(config, set_)
    if schema:
        defaults, active = SageConfig().model_dump(mode="json"), cfg.model_dump(mode="json")
        rows = [{"field": f"{section}.{name}", "default": json.dumps(defaults[section][name]),
                 "profile": json.dumps(active[section][name]), "help": f.description}
                for section, info in SageConfig.model_fields.items()
                for name, f in info.annotation.model_fields.items()]
        # A table where every column fits with room for the help (default and profile cut at 24 characters),
        # else one `column = value` line each: a hidden column would hide what the command is for.
        print_rows(rows, title=f"profile: {config}" + (" with --set" if set_ else ""), hide=False,
                   max_cell={"field": MAX_CELL, "default": 24, "profile": 24, "help": console.width})
        return
    print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), end="")


# Commands kept in their own modules (none imports Prefect until the command runs).
from sage.flows.eval_command import eval_command  # noqa: E402
from sage.flows.export import export_command  # noqa: E402
from sage.flows.serve import serve_command  # noqa: E402

app.command("eval")(eval_command)
app.command("export")(export_command)
app.command("serve")(serve_command)

if __name__ == "__main__":
    app()
