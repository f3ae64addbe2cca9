"""Nothing the verifiers start outlives the pipeline: SIGKILL of the process that owns a sandbox (with a job
running forever) and a math checker (its worker processes) leaves none of their processes alive."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from sage.engines.verify.isolation import backend_possible
from tests.processes import running

OWNER = """
import sys, threading, time
from sage.configs.schema import MathCheckConfig, SandboxConfig
from sage.engines.verify.mathcheck import MathChecker
from sage.engines.verify.sandbox import Job, Sandbox
sandbox = Sandbox(SandboxConfig(backend=sys.argv[1], timeout_s=300, cpu_s=300))
checker = MathChecker(MathCheckConfig(timeout_s=300))
threading.Thread(target=lambda: sandbox.execute([Job("def f():\\n    while True: pass", "f", [[]])]), daemon=True).start()
threading.Thread(target=lambda: checker.check_many([("1", "1")] * 4), daemon=True).start()
print("started", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("backend", ["bwrap", "unshare", "rlimit"])
def test_sigkill_of_the_owner_leaves_no_process(backend):
    if not backend_possible(backend):
        pytest.skip(f"{backend} is not usable here")
    owner = subprocess.Popen([sys.executable, "-c", OWNER, backend], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 60
        family: list[psutil.Process] = []
        while time.monotonic() < deadline:  # math workers and the sandbox's own processes
            family = psutil.Process(owner.pid).children(recursive=True)
            if len(family) >= 3:
                break
            time.sleep(0.2)
        assert len(family) >= 3, [p.cmdline()[:3] for p in family]
    finally:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
    # Each process notices its owner's death on its own (parent-death signal, a watcher's poll), which takes
    # seconds on a loaded machine: wait for them to go, up to 30 s.
    deadline = time.monotonic() + 30
    while (left := running(family)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left


def test_a_uid_is_reused_only_once_no_process_of_it_remains():
    """A uid whose lock a dead pipeline released may still run that pipeline's leftovers: taking it again
    kills them first."""
    import shutil

    from sage.engines.verify.isolation import IS_ROOT, _UidPool

    if not IS_ROOT or shutil.which("setpriv") is None:
        pytest.skip("dedicated sandbox uids need root and setpriv")
    first = _UidPool()
    uid = first.take()
    leftover = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", "300"],
                                start_new_session=True)
    try:
        time.sleep(0.3)
        assert leftover.poll() is None
        os.close(first._locks.pop(uid))  # the owner is gone: its lock is released, its leftover still runs
        second = _UidPool()
        taken = second.take()
        assert taken == uid
        assert leftover.wait(5) == -signal.SIGKILL
    finally:
        if leftover.poll() is None:
            leftover.kill()
