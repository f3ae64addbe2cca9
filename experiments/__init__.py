"""Learning studies: does the loop teach the model (`learning`), held-out and out-of-distribution scores of its
checkpoints (`heldout`: fresh problems no choice was made on), prompt and reward studies (`prompts`, `rewards`),
and verdict parity with the official harnesses (`humaneval_parity`, `math_parity`). Run as
`python -m experiments.NAME`; the long ones are resumable (rerunning the same command computes only what is
missing); never run as tests. The performance ratios are in bench/.

Importing `sage` here puts its OpenMP settings (passive wait, threads = usable cores) in place before any study
imports torch, as bench/ does (docs/performance.md, the OpenMP row).
"""

import sage  # noqa: F401
