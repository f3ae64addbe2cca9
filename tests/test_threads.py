"""`import sage` sets a passive OpenMP wait policy and torch's threads to the usable cores, before torch
starts, turns off the Hub's usage telemetry, and leaves a user's own settings alone."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = "import os, sage, torch; print(os.environ['OMP_WAIT_POLICY'], torch.get_num_threads())"


def _probe(code: str = PROBE, unset: tuple[str, ...] = ("OMP_WAIT_POLICY", "OMP_NUM_THREADS"),
           **env: str) -> list[str]:
    """What `code` prints in a fresh process, with `unset` removed from this environment and `env` added."""
    base = {k: v for k, v in os.environ.items() if k not in unset}
    out = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                         check=True)
    return out.stdout.split()


def test_passive_wait_and_usable_cores_by_default():
    assert _probe() == ["PASSIVE", str(len(os.sched_getaffinity(0)))]


def test_the_users_settings_win():
    assert _probe(OMP_WAIT_POLICY="ACTIVE", OMP_NUM_THREADS="1") == ["ACTIVE", "1"]


TELEMETRY = ("import sage, huggingface_hub.constants as c, os; "
             "print(os.environ['HF_HUB_DISABLE_TELEMETRY'], c.HF_HUB_DISABLE_TELEMETRY)")


def test_hub_telemetry_off_unless_the_user_turns_it_on():
    unset = ("HF_HUB_DISABLE_TELEMETRY", "DO_NOT_TRACK")  # the Hub honours DO_NOT_TRACK too (sage.flows sets it)
    assert _probe(TELEMETRY, unset) == ["1", "True"]
    assert _probe(TELEMETRY, unset, HF_HUB_DISABLE_TELEMETRY="0") == ["0", "False"]


PREFECT_TELEMETRY = ("import sage.flows, os; from prefect._internal.analytics.enabled import is_telemetry_enabled; "
                     "print(os.environ['DO_NOT_TRACK'], is_telemetry_enabled())")


def test_prefect_client_telemetry_off_unless_the_user_turns_it_on():
    """Prefect's client telemetry prints a notice above the display on a terminal's first run; `sage.flows` turns
    it off (DO_NOT_TRACK), and a user's own setting wins."""
    unset = ("DO_NOT_TRACK", "CI", "GITHUB_ACTIONS")
    assert _probe(PREFECT_TELEMETRY, unset) == ["1", "False"]
    assert _probe(PREFECT_TELEMETRY, unset, DO_NOT_TRACK="0") == ["0", "True"]
