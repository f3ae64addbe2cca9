"""Benchmarks: each measures one part of the pipeline against its peer, side by side; never run as tests.

Importing `sage` here puts its OpenMP settings (passive wait, threads = usable cores) in place before any
benchmark run as `python -m bench.NAME` imports torch: spinning OpenMP threads collapse under load and would
measure the machine's other jobs instead of the code (README, OpenMP wait policy). A benchmark run as a
script (`python bench/NAME.py`) imports `sage` before torch itself.
"""

import sage  # noqa: F401
