"""`import sage` sets a passive OpenMP wait policy and torch's threads to the usable cores, before torch
starts, and leaves a user's own settings alone."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = "import os, sage, torch; print(os.environ['OMP_WAIT_POLICY'], torch.get_num_threads())"


def _probe(**env: str) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**base, **env}, capture_output=True, text=True,
                         check=True)
    return out.stdout.split()


def test_passive_wait_and_usable_cores_by_default():
    assert _probe() == ["PASSIVE", str(len(os.sched_getaffinity(0)))]


def test_the_users_settings_win():
    assert _probe(OMP_WAIT_POLICY="ACTIVE", OMP_NUM_THREADS="1") == ["ACTIVE", "1"]
