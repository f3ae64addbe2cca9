"""Inode exhaustion: a candidate that creates files until its tmpfs runs out of inodes, then spins until
killed. The private tmpfs mounts cap inodes, so the job returns within the time limit plus 0.5 s with
teardown included, and leaves no process and no mount behind. Not run on `rlimit`: its work dir is on the
host's disk, with no cap to test."""

from __future__ import annotations

import time

import psutil
import pytest

from sage.configs.schema import SandboxConfig
from sage.engines.verify.isolation import TMPFS_INODES, UIDS
from sage.engines.verify.sandbox import Job, Sandbox, available_backends

TIMEOUT_S = 2.0
FILL = ("import os\ndef f(spin):\n    made = []\n    for d in ('.', '/tmp', '/dev/shm'):\n        n = 0\n"
        "        try:\n            while n < 10**7:\n"
        "                os.close(os.open(os.path.join(d, 'i%d' % n), os.O_CREAT | os.O_WRONLY, 0o600))\n"
        "                n += 1\n        except OSError:\n            pass\n        made.append(n)\n"
        "    while spin:\n        pass\n    return made\n")


def _mounts() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return sorted(line.split()[4] for line in f)


def _sandbox_processes() -> list[int]:
    uids = set(UIDS._locks)
    return [p.pid for p in psutil.process_iter(["uids", "status"])
            if p.info["uids"] and p.info["uids"].real in uids and p.info["status"] != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize("backend", [b for b in available_backends() if b != "rlimit"])
def test_inode_exhaustion_returns_in_time_and_leaves_nothing(backend):
    sandbox = Sandbox(SandboxConfig(backend=backend, timeout_s=TIMEOUT_S, cpu_s=5, workers=2))
    before = _mounts()
    start = time.monotonic()
    capped, spinning = sandbox.execute([Job(FILL, "f", [[False]]), Job(FILL, "f", [[True]])])
    wall = time.monotonic() - start
    made = capped.outputs[0]
    assert capped.status == "ok" and made[0] > 0 and sum(made) <= 3 * TMPFS_INODES, made
    assert spinning.status == "timeout" and spinning.outputs == [None]
    assert spinning.duration_s <= TIMEOUT_S + 0.5 and wall <= TIMEOUT_S + 0.5, (spinning.duration_s, wall)
    assert _mounts() == before
    assert not _sandbox_processes()
