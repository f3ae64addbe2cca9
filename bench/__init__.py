"""Performance benchmarks only: each measures one part of the pipeline against its peer and prints the ratios
side by side; never run as tests. The learning studies (does it learn, held-out scores, prompts, rewards,
parity with the official harnesses) are in experiments/.

Importing `sage` here puts its OpenMP settings (passive wait, threads = usable cores) in place before any
benchmark run as `python -m bench.NAME` imports torch: spinning OpenMP threads collapse under load and would
measure the machine's other jobs instead of the code (docs/performance.md, the OpenMP row). A benchmark run as a
script (`python bench/NAME.py`) imports `sage` before torch itself.
"""

import sage  # noqa: F401
