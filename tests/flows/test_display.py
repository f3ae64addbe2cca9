"""The terminal display of `sage run` (flows/progress.py): on a terminal, one bar per (iteration, stage) and log
lines above the live region, never through it; without one, one plain line per finished stage.

What a terminal shows is worked out from the bytes written to it by `screen`, a small emulator of the controls
rich writes (carriage return, newline, cursor up, erase line, colours, cursor show/hide); any other control
fails the test, so a new kind of output cannot slip past unexamined."""

from __future__ import annotations

import io
import logging
import os
import re
import signal
import subprocess
import sys

import pytest
from rich.console import Console

from sage.flows.iteration import STAGE_NAMES
from sage.flows.progress import LINES, LIVE, QUIET, Display
from sage.flows.record import Interrupted
from tests.flows import scripted_run

WIDTH = 140
_CONTROL = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])|[\r\n]|[^\x1b\r\n]+")


def screen(raw: str) -> list[str]:
    """The lines a terminal (scrollback included) holds after `raw` was written to it."""
    lines, row, col = [""], 0, 0
    for m in _CONTROL.finditer(raw):
        text, (args, op) = m.group(), m.groups()
        if text == "\n":
            row, col = row + 1, 0
            lines += [""] * (row + 1 - len(lines))
        elif text == "\r":
            col = 0
        elif op == "A":
            row = max(0, row - int(args or 1))
        elif op == "K" and args == "2":
            lines[row] = ""
        elif op in ("m", "l", "h"):
            continue  # colours, cursor hidden/shown
        elif op:
            raise AssertionError(f"unexpected control {text!r}")
        else:
            line = lines[row].ljust(col)
            lines[row] = line[:col] + text + line[col + len(text):]
            col += len(text)
    return [line.rstrip() for line in lines]


def _terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=WIDTH, record=True), out


def test_live_display_of_a_two_iteration_run(prefect_api, tmp_path):
    console, out = _terminal()
    display = Display(console, run_id="scripted", iterations=2, verbose=True)
    assert display.mode == LIVE
    scripted_run.run(tmp_path, iterations=2, as_cli=True, display=display)
    lines = screen(out.getvalue())
    text = "\n".join(lines)

    stage_lines = [line for line in lines if re.match(r"[✓✗] iteration \d+ ", line)]
    keys = [tuple(line.split()[2:4]) for line in stage_lines]
    expected = [("0", "seed")] + [(str(k), name) for k in (1, 2) for name in STAGE_NAMES]
    assert keys == expected, text  # one bar per (iteration, stage), in order, none reused or reprinted
    assert all(line.startswith("✓") and "━" * 10 in line for line in stage_lines), text
    challenge_1 = next(line for line in stage_lines if line.split()[2:4] == ["1", "challenge"])
    assert re.search(r"\b5/5 rows\b", challenge_1) and "5 in, 10 out" in challenge_1, challenge_1
    train = [line for line in stage_lines if line.split()[3] == "train"]
    assert len(train) == 2 and all("skipped train.enabled is false" in line for line in train), text

    # The live region (its header) is gone at the end and left no copies behind; Prefect's lines sit between
    # the stage lines, whole, never inside a bar's line.
    assert "run scripted · iteration" not in text, text
    logs = [i for i, line in enumerate(lines) if re.match(r"\d\d:\d\d:\d\d\.\d+ \| (INFO|WARNING) ", line)]
    assert any("no validation questions" in lines[i] for i in logs), text
    assert any("Finished in state Completed()" in lines[i] for i in logs), text
    assert not any("━" in lines[i] for i in logs), text
    warning = next(i for i in logs if "no validation questions" in lines[i])
    assert lines.index(stage_lines[0]) < warning < lines.index(stage_lines[1])  # printed when it happened


def test_without_a_terminal_one_plain_line_per_stage(tmp_path):
    p = subprocess.run([sys.executable, "-m", "tests.flows.scripted_run", str(tmp_path), "--iterations", "2",
                        "--as-cli"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stderr.splitlines()
    stage_lines = [line for line in lines if re.match(r"iteration \d+ \w+: ", line)]
    expected = ["iteration 0 seed"] + [f"iteration {k} {name}" for k in (1, 2) for name in STAGE_NAMES]
    assert [line.split(":")[0] for line in stage_lines] == expected, p.stderr
    assert re.fullmatch(r"iteration 1 challenge: 5 in, 10 out; .* \(\d+\.\d s\)", stage_lines[1]), stage_lines[1]
    assert "\x1b[" not in p.stderr and "━" not in p.stderr  # no live region, no colours
    # Prefect's INFO lines only with --verbose; its warnings always
    assert "Finished in state" not in p.stderr and "no validation questions" in p.stderr


def test_log_records_and_summaries_reach_the_terminal_escaped():
    """Log text and stage summaries can carry model output: its escape sequences are shown, not obeyed; a
    stage that fails ends its bar with a cross."""
    console, out = _terminal()
    display = Display(console, run_id="r", iterations=1)
    handler = logging.StreamHandler(sys.stderr)
    log = logging.getLogger("sage-test-display")
    log.addHandler(handler)
    log.propagate = False
    try:
        with display:
            assert handler not in log.handlers  # swapped for one printing through the console
            log.warning("model said \x1b[2Jboom")
            log.info("not shown without verbose")
            with display.stage(1, "challenge") as shown:
                display.report(1, "challenge", 1, 2, 0)
                shown("challenge: 2 in, 2 out; note \x1b]0;title\x07")
            with pytest.raises(RuntimeError), display.stage(1, "solve"):
                display.report(1, "solve", 1, 4, 0)
                raise RuntimeError("boom")
            try:
                with pytest.raises(Interrupted), display.stage(1, "train"):
                    raise Interrupted(signal.SIGTERM)
            finally:
                Interrupted.received = None  # what a command's `stopped_by_signals` puts back
        assert log.handlers == [handler]  # restored
    finally:
        log.removeHandler(handler)
    raw = out.getvalue()
    assert "\x1b[2J" not in raw and "\x1b]0" not in raw and "\x07" not in raw
    lines = screen(raw)
    assert "model said \\x1b[2Jboom" in lines
    assert not any("not shown" in line for line in lines)
    assert any(line.startswith("✓ iteration 1 challenge") and "note \\x1b]0;title\\x07" in line for line in lines)
    assert any(line.startswith("✗ iteration 1 solve") and "1/4 rows" in line and "failed: RuntimeError" in line
               for line in lines), lines
    assert any(line.startswith("✗ iteration 1 train") and line.endswith("interrupted (SIGTERM)") for line in lines), \
        lines  # not "interrupted: Interrupted"


def test_plain_lines_mode_when_the_console_is_not_a_terminal():
    out = io.StringIO()
    display = Display(Console(file=out, width=WIDTH))
    assert display.mode == LINES
    with display:
        with display.stage(2, "verify") as shown:
            display.report(2, "verify", 3, 8, 0)
            shown("verify: 8 in, 8 out; pass_rate 0.5")
    assert re.fullmatch(r"iteration 2 verify: 8 in, 8 out; pass_rate 0\.5 \(\d+\.\d s\)\n", out.getvalue())


@pytest.mark.parametrize("mode", [None, QUIET])
def test_transformers_progress_bars_are_off_while_a_display_is_up(monkeypatch, mode):
    """Loading a model prints transformers' "Loading weights" bar; `--quiet` promises only warnings, errors and
    the summary, and the live display draws its own bars: off in every mode, back on after."""
    from transformers.utils import logging as hf_logging

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    hf_logging.enable_progress_bar()
    with Display(Console(file=io.StringIO(), width=WIDTH), mode):
        assert not hf_logging.is_progress_bar_enabled()
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"  # for the training subprocess
    assert hf_logging.is_progress_bar_enabled() and "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ


def test_training_bar_counts_optimizer_steps_and_shows_the_loss():
    """The train stage reports steps, not rows, with its last loss; a stage interrupted mid-way keeps both."""
    console, out = _terminal()
    with Display(console, run_id="r", iterations=1) as display:
        with pytest.raises(KeyboardInterrupt), display.stage(1, "train"):
            display.report(1, "train", 1, 3, 40, unit="steps", note="loss 0.7500")
            display.report(1, "train", 2, 3, 80, unit="steps", note="loss 0.2500")
            raise KeyboardInterrupt
    line = next(x for x in screen(out.getvalue()) if x.startswith("✗ iteration 1 train"))
    assert "2/3 steps" in line and "loss 0.2500" in line and "loss 0.75" not in line and "rows" not in line


def test_after_a_signal_the_terminal_shows_none_of_prefects_crash_reports(monkeypatch):
    """Prefect logs every run a signal cut short as an error (a crash, or a DuckDB "Query interrupted" with its
    traceback); the terminal's handlers drop those once a signal arrived, and keep everything else."""
    import logging

    from sage.flows import terminal
    from sage.flows.record import Interrupted

    seen = []

    class Collect(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    handler, root = Collect(), logging.getLogger()
    root.addHandler(handler)
    monkeypatch.setattr(terminal, "verbose", lambda: False)
    try:
        terminal.quiet_prefect_tracebacks()
        log = logging.getLogger("prefect.task_runs")
        log.propagate, log.level = True, logging.INFO
        log.error("Crash detected! Execution was aborted by an interrupt signal.")
        log.error("Task run encountered an exception RuntimeError: Query interrupted")
        Interrupted.received = 2
        log.error("Task run encountered an exception RuntimeError: Query interrupted")
        log.info("Finished in state Completed()")
        logging.getLogger("sage").error("a failure of our own")
    finally:
        Interrupted.received = None
        root.removeHandler(handler)
    assert seen == ["Task run encountered an exception RuntimeError: Query interrupted",
                    "Finished in state Completed()", "a failure of our own"]


class _Clock:
    """A clock the test moves: `progress.time` with a `monotonic` that returns `now`."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.mark.parametrize("width", [80, 140])
def test_a_running_stage_is_one_line_whole_at_80_columns(width, monkeypatch):
    """The stage, its count, the loss, tokens per second and the ETA on one line that fits, at 80 columns too; a
    long bar and the iteration in the label only from `WIDE` columns (the header names the iteration). Rate and ETA
    run from the stage's first report: 24 rows left at 8 rows per 10 s is 30 s."""
    from sage.flows import progress
    from sage.flows.progress import WIDE

    clock = _Clock()
    monkeypatch.setattr(progress, "time", clock)
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=width)
    with Display(console, run_id="run-f92dd238", iterations=10) as display, display.stage(3, "critique_question"):
        clock.now += 40  # loading the model: not part of the rate
        display.report(3, "critique_question", 0, 32, tokens=0)
        clock.now += 10
        display.report(3, "critique_question", 8, 32, tokens=9000, note="loss 0.8638")
        display._live.refresh()
        shown = screen(out.getvalue())
    line = next(x for x in reversed(shown) if x.startswith(("⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏")))
    assert all(len(x) <= width for x in shown), shown
    assert "critique_question" in line and "8/32 rows" in line and line.endswith("900 tok/s ETA 0:30"), line
    assert ("iteration 3 critique_question" in line) == (width >= WIDE)
    assert any("run-f92dd238 · iteration 3/10 · critique_question" in x for x in shown)
    bar = sum(line.count(c) for c in "━╺╸")
    assert "loss 0.8638" in line and bar == (24 if width >= WIDE else 8)
    done = next(x for x in screen(out.getvalue()) if x.startswith("✓"))
    assert done.startswith("✓ iteration 3 critique_question") and len(done) <= width, done


def test_no_eta_before_a_stage_has_done_anything(monkeypatch):
    """Before any row is done (or for a stage that reports no total) the bar shows the time taken, never an ETA."""
    from sage.flows import progress

    clock = _Clock()
    monkeypatch.setattr(progress, "time", clock)
    out = io.StringIO()
    with Display(Console(file=out, force_terminal=True, width=80), run_id="r") as display, \
            display.stage(1, "solve"):
        display.report(1, "solve", 0, 16)
        clock.now += 65
        display.report(1, "solve", 0, 16)
        display._live.refresh()
        shown = screen(out.getvalue())
    line = next(x for x in reversed(shown) if "0/16 rows" in x)
    assert "ETA" not in line and re.search(r"  \d+:\d\d$", line), line  # the time taken (rich's own clock)


def test_a_finished_line_names_one_throughput():
    """A stage that measures its own throughput (training's `tokens_per_s`) shows that one, as tok/s, and not the
    bar's as well."""
    console, out = _terminal()
    with Display(console, run_id="r", iterations=1) as display:
        with display.stage(1, "train") as shown:
            display.report(1, "train", 1, 2, 400, unit="steps", note="loss 0.5000")
            display.report(1, "train", 2, 2, 800, unit="steps", note="loss 0.2500")
            shown("train: 8 in, 2 out; loss 0.25, grad_norm 1.5, tokens_per_s 2831")
    line = next(x for x in screen(out.getvalue()) if x.startswith("✓ iteration 1 train"))
    assert line.count("tok/s") == 1 and "2,831 tok/s" in line and "tokens_per_s" not in line, line
    assert "loss 0.25, grad_norm 1.5" in line and "2/2 steps" in line
