"""The training step's lead over a plain PEFT loop, checked: run before landing anything that touches
engines/train/.

    .venv/bin/python -m bench.train_check [--min-ratio 1.3] [--max-norm-diff 0.05] [--repeats 2]

Runs `bench/train.py` at the shape `cpu.yaml` trains (bf16 base, fp32 LoRA, 2 rows a pass x 4, 16 random rows of
~350 prompt + ~100 completion tokens, two updates, pi_old as the train stage takes it on the hf backend), the
plain loop and the project's trainer alternated `--repeats` times in one process, and fails (exit 1) when the
trainer's best throughput is under `--min-ratio` times the plain loop's best, or when a per-update gradient norm
differs from the plain loop's by more than `--max-norm-diff` (relative). The two loops take the same updates; bf16
rounding alone keeps them a few percent apart (the plain loop computes the LoRA in float32, ours in bf16, and ours
takes the sampler's bf16 log-probs as pi_old: up to 4.8% on a 2-core AMD EPYC, docs/performance.md), so a larger
gap is a change of what is trained. Both loops run on the same machine in the same minutes, so other load slows
both; the ratio is what is compared. About three minutes on a calm 2-core machine, twice that under load.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import train  # noqa: E402

#: `cpu.yaml`'s training shape, as docs/performance.md's training row measures it.
SHAPE = ["--dtype", "bf16", "--rows", "16", "--minibatch", "2", "--grad-accum", "4", "--prompt-len", "450",
         "--prompt-jitter", "0.45", "--completion-len", "150", "--jitter", "0.7"]


def verdict(result: dict, min_ratio: float, max_norm_diff: float) -> list[str]:
    """What fails in `bench/train.py`'s result: the throughput ratio under `min_ratio`, a per-update gradient norm
    further than `max_norm_diff` (relative) from the plain loop's, or a different number of updates. Empty: passed."""
    failures = []
    if result["ratio"] < min_ratio:
        failures.append(f"the trainer runs at {result['ratio']:.2f}x the plain loop's throughput, under "
                        f"{min_ratio:.2f}x")
    plain, ours = result["grad_norms"]["plain"], result["grad_norms"]["trl"]
    if len(plain) != len(ours):
        failures.append(f"the trainer made {len(ours)} updates and the plain loop {len(plain)}")
    for k, (p, t) in enumerate(zip(plain, ours), start=1):
        if abs(t - p) > max_norm_diff * abs(p):
            failures.append(f"update {k}'s gradient norm is {t:.4f} against the plain loop's {p:.4f}, more than "
                            f"{max_norm_diff:.0%} apart")
    return failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-ratio", type=float, default=1.3, help="least trainer / plain-loop throughput to pass")
    ap.add_argument("--max-norm-diff", type=float, default=0.05,
                    help="largest relative difference of a per-update gradient norm from the plain loop's")
    ap.add_argument("--repeats", type=int, default=2, help="alternate the two loops this many times; best of each")
    a = ap.parse_args(argv)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        if train.main([*SHAPE, "--repeats", str(a.repeats), "--json", f.name]) != 0:
            return 1
        result = json.loads(Path(f.name).read_text())
    failures = verdict(result, a.min_ratio, a.max_norm_diff)
    for failure in failures:
        print(f"[train_check] FAILED: {failure}")
    if not failures:
        print(f"[train_check] passed: the trainer at {result['ratio']:.2f}x the plain loop (at least "
              f"{a.min_ratio:.2f}x), gradient norms within {a.max_norm_diff:.0%}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
