"""Inode exhaustion: a candidate that creates files until its tmpfs runs out of inodes, then waits until
killed (asleep, so its time limit stops it at a known moment: the wall-clock ceiling, `clock.WALL_FACTOR` limits).
The private tmpfs mounts cap inodes, so the job returns within 0.5 s of the ceiling with teardown included, and
leaves no process and no mount behind; bwrap run by an unprivileged user gets the
cap too (through a user namespace of its own). Not run on `rlimit`: its work dir is on the host's disk, with
no cap to test."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import psutil
import pytest

from sage.configs.schema import SandboxConfig
from sage.engines.verify.clock import WALL_FACTOR
from sage.engines.verify.isolation import IS_ROOT, TMPFS_INODES, UIDS
from sage.engines.verify.sandbox import Job, Sandbox, available_backends

TIMEOUT_S = 2.0
CEILING_S = WALL_FACTOR * TIMEOUT_S
FILL = ("import os\ndef f(wait):\n    made = []\n    for d in ('.', '/tmp', '/dev/shm'):\n        n = 0\n"
        "        try:\n            while n < 10**7:\n"
        "                os.close(os.open(os.path.join(d, 'i%d' % n), os.O_CREAT | os.O_WRONLY, 0o600))\n"
        "                n += 1\n        except OSError:\n            pass\n        made.append(n)\n"
        "    while wait:\n        __import__('time').sleep(1)\n    return made\n")


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
    capped, waiting = sandbox.execute([Job(FILL, "f", [[False]]), Job(FILL, "f", [[True]])])
    wall = time.monotonic() - start
    made = capped.outputs[0]
    assert capped.status == "ok" and made[0] > 0 and sum(made) <= 3 * TMPFS_INODES, made
    assert waiting.status == "timeout" and waiting.outputs == [None]
    assert waiting.duration_s <= CEILING_S + 0.5 and wall <= CEILING_S + 0.5, (waiting.duration_s, wall)
    assert _mounts() == before
    assert not _sandbox_processes()


UNPRIVILEGED = """
import json, sys, time
from sage.configs.schema import SandboxConfig
from sage.engines.verify.isolation import scratch_root_needed
from sage.engines.verify.sandbox import Job, Sandbox
sandbox = Sandbox(SandboxConfig(backend="bwrap", timeout_s=float(sys.argv[2]), cpu_s=5, workers=2))
start = time.monotonic()
capped, waiting = sandbox.execute([Job(sys.argv[1], "f", [[False]]), Job(sys.argv[1], "f", [[True]])])
print(json.dumps({"inode_cap": scratch_root_needed("bwrap"), "made": capped.outputs[0],
                  "status": [capped.status, waiting.status], "duration": waiting.duration_s,
                  "wall": time.monotonic() - start}))
"""


def test_unprivileged_bwrap_caps_inodes_too():
    """The same attack through bwrap started by an unprivileged user (nobody), which cannot mount a capped
    tmpfs on the host: it gets one in a user namespace of its own, and the host is unaffected."""
    if not IS_ROOT or not all(shutil.which(t) for t in ("setpriv", "bwrap")):
        pytest.skip("running the sandbox as another user needs root, setpriv and bwrap")
    nobody = 65534
    drop = ["setpriv", f"--reuid={nobody}", f"--regid={nobody}", "--clear-groups"]
    probe = subprocess.run(drop + ["unshare", "--user", "--map-root-user", "--mount", "/bin/sh", "-c",
                                   "mount -t tmpfs -o nr_inodes=16 probe /tmp"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("unprivileged user namespaces cannot mount here: bwrap keeps size caps only")
    before = _mounts()
    started = time.time()
    run = subprocess.run([*drop, sys.executable, "-c", UNPRIVILEGED, FILL, str(TIMEOUT_S)], capture_output=True,
                         text=True, cwd="/", env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"}, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["inode_cap"] and got["status"] == ["ok", "timeout"]
    assert 0 < min(got["made"]) and max(got["made"]) <= TMPFS_INODES, got["made"]
    assert got["duration"] <= CEILING_S + 0.5 and got["wall"] <= CEILING_S + 0.5, got
    assert _mounts() == before
    end = time.monotonic() + 5  # unprivileged, no uid sweep: the sandbox's pid namespace dies by itself
    while (left := _processes_since(nobody, started)) and time.monotonic() < end:
        time.sleep(0.1)
    assert not left


def _processes_since(uid: int, started: float) -> list[int]:
    return [p.pid for p in psutil.process_iter(["uids", "create_time", "status"])
            if p.info["uids"] and p.info["uids"].real == uid and p.info["create_time"] >= started - 1
            and p.info["status"] != psutil.STATUS_ZOMBIE]
