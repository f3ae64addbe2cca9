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


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


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
    time.sleep(5)
    left = [(p.pid, p.cmdline()[:4], p.uids()) for p in family if _alive(p)]
    assert not left
