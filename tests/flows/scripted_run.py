"""Run iterations with the ScriptedLLM in this process (used by tests, also as a subprocess).

    python -m tests.flows.scripted_run DIR [--iterations N] [--pause-at-call K] [--marker FILE] [--as-cli]

With --pause-at-call K the scripted generator writes MARKER and sleeps forever on its K-th call, so a test
can signal the process in the middle of a stage. --as-cli runs the flow the way `sage run` does (its signal
handling, progress display and Prefect API choice), exiting with the command's exit code.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import typer

from sage.engines.llm.base import GenRequest
from tests.scripted import ScriptedLLM, prompt_text

MATH_SEEDS = [("What is 2+2?", "4"), ("What is 10-3?", "7"), ("Compute 6*7.", "42"), ("What is 9+1?", "10")]
CODE_SEED = ("Write a Python function `add(a, b)` that returns a + b.",
             {"entry_point": "add", "inputs": [[1, 2], [3, 4]], "outputs": [3, 7]})

# the grounded form (`iteration.math_labels: program`, cpu.yaml): the program uses exactly the question's numbers
# and an operation the question names (`+`), so its result 7 is the label
CHALLENGE_MATH = ("<question>What is 3+4?</question>\n<solution>\n```python\ndef solve():\n    return 3 + 4\n```\n"
                  "</solution>\n<answer>7</answer>")
CHALLENGE_CODE = ("<question>Write mul(a, b) returning a * b.</question>\n<signature>def mul(a, b)</signature>\n"
                  "<solution>\n```python\ndef mul(a, b):\n    return a * b\n```\n</solution>\n"
                  "<inputs>\n[2, 3]\n[4, 5]\n[1, 7]\n</inputs>")


def script(req: GenRequest) -> str | list[str]:
    """Deterministic answers by prompt kind; sample texts differ only where a test needs variance."""
    text = prompt_text(req)
    if "Reference problem:" in text:
        return CHALLENGE_MATH
    if "Reference task:" in text:
        return CHALLENGE_CODE
    if "Rate this problem" in text:
        return "Clear and solvable. <score>9</score>"
    if "Rate this plan" in text:
        # plans for questions about 10-3 get a low score: withheld at beta 0.3
        return "Weak plan. <score>2</score>" if "10-3" in text else "Good plan. <score>8</score>"
    if "numbered plan" in text:
        return "<plan>\n1. Read the numbers.\n2. Compute.\n</plan>"
    if "```python" in text or "Python" in text:
        if "add(" in text:
            return ["<answer>\n```python\ndef add(a, b):\n    return a + b\n```\n</answer>",
                    "<answer>\n```python\ndef add(a, b):\n    return a - b\n```\n</answer>"]
        return "<answer>\n```python\ndef mul(a, b):\n    return a * b\n```\n</answer>"
    answers = {"2+2": "4", "10-3": "7", "6*7": "42", "9+1": "10", "3+4": "7"}
    right = next((a for k, a in answers.items() if k in text), "0")
    return [f"The answer is <answer>\\boxed{{{right}}}</answer>", "<answer>\\boxed{-1}</answer>"]


class PausingScriptedLLM(ScriptedLLM):
    def __init__(self, pause_at: int | None, marker: Path | None):
        super().__init__(script)
        self.pause_at, self.marker = pause_at, marker

    def generate(self, requests, progress=None):
        if self.pause_at is not None and len(self.calls) + 1 == self.pause_at:
            self.marker.write_text("paused")
            while True:
                time.sleep(1)
        return super().generate(requests, progress)


def seed_rows() -> list[dict]:
    from sage.warehouse import content_id, norm_hash

    rows = [dict(question_id=content_id("seed", q), origin="seed", domain="math", text=q, verifier={"answer": a},
                 norm_hash=norm_hash(q), source="test") for q, a in MATH_SEEDS]
    q, v = CODE_SEED
    rows.append(dict(question_id=content_id("seed", q), origin="seed", domain="code", text=q, verifier=v,
                     norm_hash=norm_hash(q), source="test"))
    return rows


OVERRIDES = ["iteration.n_challenge=5", "iteration.n_probe=2", "iteration.n_plan=5", "iteration.n_solve=2",
             "run.batch_rows=2", "roles.challenger.constrain=false", "roles.planner.constrain=false",
             "roles.critic.constrain=false", "roles.solver.constrain=false", "seeds.source=unused.jsonl",
             "train.enabled=false",  # scripted token ids are bytes, not a model's vocabulary
             # the loop these tests check (the plan gate, every reward term): plans shown to every answer whose plan
             # passed, as SAGE.md has it, whatever loop `cpu.yaml` runs
             "iteration.hints=always", "train.hinted_prompt=shown", "rewards.solver_plan=0.2", "rewards.solver_gt=0.6"]


def prepare(directory: Path, run_id: str = "scripted", extra: list[str] = ()) -> str:
    """Create the run and its seeds (the `seed` stage marked done: these tests bring their own seeds)."""
    from sage.configs import load_config
    from sage.flows.session import Session
    from sage.stages.seed import seeds_key
    from sage.warehouse.queries import mark_stage_finished, mark_stage_running

    cfg = load_config("cpu", [f"run.dir={directory}", *OVERRIDES, *extra])
    with Session(directory) as s:
        rid = s.create_run(cfg, run_id)
        wh = s.warehouse
        wh.insert_batch("questions", seed_rows())
        key = seeds_key(s.context_for(cfg, None))
        mark_stage_running(wh, key, 0, "seed")
        mark_stage_finished(wh, key, 0, "seed", "done", 0, 0, 0.0, None)
    return rid


def run(directory: Path, iterations: int = 1, pause_at: int | None = None, marker: Path | None = None,
        run_id: str = "scripted", as_cli: bool = False, display=None) -> list[dict]:
    from sage.flows.evolve import evolve_flow
    from sage.flows.session import Session, warehouse_path

    rid = run_id if warehouse_path(directory).exists() else prepare(directory, run_id)
    llm = PausingScriptedLLM(pause_at, marker)
    if as_cli:
        from sage.flows.cli import _run_flow

        return _run_flow(str(directory), evolve_flow, str(directory), rid, iterations, engines={"llm": llm},
                         display=display)
    with Session(directory, engines={"llm": llm}):
        return evolve_flow(str(directory), rid, iterations)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=Path)
    ap.add_argument("--iterations", type=int, default=1)
    ap.add_argument("--pause-at-call", type=int)
    ap.add_argument("--marker", type=Path)
    ap.add_argument("--as-cli", action="store_true")
    a = ap.parse_args()
    try:
        print(json.dumps(run(a.dir, a.iterations, a.pause_at_call, a.marker, as_cli=a.as_cli), default=str))
    except typer.Exit as e:  # how the command ends when a signal stopped it
        raise SystemExit(e.exit_code) from None


if __name__ == "__main__":
    main()
