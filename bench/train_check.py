"""The training step checked against a plain PEFT loop: its lead in throughput and the gradients it takes. Run it
before landing anything that touches engines/train/.

    .venv/bin/python -m bench.train_check [--min-ratio 1.3] [--max-norm-diff 0.001] [--repeats 2]

Runs `bench/train.py` twice at the shape `cpu.yaml` trains (2 rows a pass x 4, 16 random rows of ~350 prompt +
~100 completion tokens, two updates, pi_old the rows' stored sampling log-probs as the train stage takes them on
the hf backend), the plain loop and the project's trainer on the same rows each time:

- bf16 base, fp32 LoRA (what `cpu.yaml` runs), the two loops alternated `--repeats` times in one process: fails
  (exit 1) when the trainer's best throughput is under `--min-ratio` times the plain loop's best. Both loops run
  on the same machine in the same minutes, so other load slows both; the ratio is what is compared.
- float32, one pass each: fails when a per-update gradient norm differs from the plain loop's by more than
  `--max-norm-diff` (relative), or the number of updates differs. The plain loop computes the same objective
  (TRL's clipped ratio against the same pi_old, the same token mean, clipping and AdamW), and in float32 the two
  agree to about 1e-6 (docs/performance.md), so a gap is a change of what is trained. In bf16 they do not: the
  plain loop computes the LoRA in float32, ours in bf16, the stored log-probs carry the sampler's own rounding,
  and Adam's first steps amplify it (a few percent, as far as a real change of the weighting would move them).
  The bf16 norms are printed beside, not gated.

5.2 CPU minutes: 7.7 min of wall clock on 2 cores at load average 5-7 (docs/performance.md).
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

#: `cpu.yaml`'s training shape, as docs/performance.md's training row measures it (the dtype is added per run).
SHAPE = ["--rows", "16", "--minibatch", "2", "--grad-accum", "4", "--prompt-len", "450", "--prompt-jitter", "0.45",
         "--completion-len", "150", "--jitter", "0.7"]


def norm_gaps(result: dict) -> list[float]:
    """Each update's relative gradient-norm difference of the trainer from the plain loop in `bench/train.py`'s
    `result` (as many as both made)."""
    plain, ours = result["grad_norms"]["plain"], result["grad_norms"]["trl"]
    return [abs(t - p) / abs(p) for p, t in zip(plain, ours)]


def verdict(timed: dict, exact: dict, min_ratio: float, max_norm_diff: float) -> list[str]:
    """What fails: the throughput ratio of `timed` (the bf16 run) under `min_ratio`, or in `exact` (the float32
    run) a different number of updates or a per-update gradient norm further than `max_norm_diff` (relative) from
    the plain loop's. Empty: passed."""
    failures = []
    if timed["ratio"] < min_ratio:
        failures.append(f"the trainer runs at {timed['ratio']:.2f}x the plain loop's throughput, under "
                        f"{min_ratio:.2f}x")
    plain, ours = exact["grad_norms"]["plain"], exact["grad_norms"]["trl"]
    if len(plain) != len(ours):
        failures.append(f"the trainer made {len(ours)} updates and the plain loop {len(plain)}")
    for k, (p, t, gap) in enumerate(zip(plain, ours, norm_gaps(exact)), start=1):
        if gap > max_norm_diff:
            failures.append(f"update {k}'s float32 gradient norm is {t:.6f} against the plain loop's {p:.6f}, "
                            f"{gap:.2%} apart (at most {max_norm_diff:.2%})")
    return failures


def norms_line(label: str, result: dict) -> str:
    """One line of both loops' per-update gradient norms and their relative gaps."""
    plain, ours = result["grad_norms"]["plain"], result["grad_norms"]["trl"]
    return (f"[train_check] {label} gradient norms: plain {', '.join(f'{x:.6f}' for x in plain)}; ours "
            f"{', '.join(f'{x:.6f}' for x in ours)} ({', '.join(f'{g:.4%}' for g in norm_gaps(result))} apart)")


def measure(dtype: str, repeats: int) -> dict | None:
    """`bench/train.py`'s result at SHAPE in `dtype` (None if it failed)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        if train.main([*SHAPE, "--dtype", dtype, "--repeats", str(repeats), "--json", f.name]) != 0:
            return None
        return json.loads(Path(f.name).read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-ratio", type=float, default=1.3, help="least trainer / plain-loop throughput (bf16)")
    ap.add_argument("--max-norm-diff", type=float, default=0.001,
                    help="largest relative difference of a per-update float32 gradient norm from the plain loop's")
    ap.add_argument("--repeats", type=int, default=2, help="alternate the two loops this many times in bf16; best "
                    "of each")
    a = ap.parse_args(argv)
    timed = measure("bf16", a.repeats)
    exact = timed and measure("fp32", 1)
    if not exact:
        return 1
    print(norms_line("float32 (checked)", exact))
    print(norms_line("bf16 (rounding; not checked)", timed))
    failures = verdict(timed, exact, a.min_ratio, a.max_norm_diff)
    for failure in failures:
        print(f"[train_check] FAILED: {failure}")
    if not failures:
        print(f"[train_check] passed: the trainer at {timed['ratio']:.2f}x the plain loop in bf16 (at least "
              f"{a.min_ratio:.2f}x), float32 gradient norms within {a.max_norm_diff:.2%}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
