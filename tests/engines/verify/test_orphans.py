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

from bench.orphans import OWNER, running  # the owner script the benchmark times, and its process reader
from sage.engines.verify.isolation import backend_possible


def start_owner(backend: str) -> subprocess.Popen:
    """The owner process of `OWNER` on `backend`, once it says its sandbox job and math workers started (the test
    is skipped where the backend cannot run)."""
    if not backend_possible(backend):
        pytest.skip(f"{backend} is not usable here")
    owner = subprocess.Popen([sys.executable, "-c", OWNER, backend], stdout=subprocess.PIPE, text=True)
    if owner.stdout.readline().strip() != "started":
        owner.kill()
        owner.wait()
        pytest.fail("the owner process did not start its sandbox job and math workers")
    return owner


@pytest.mark.parametrize("backend", ["bwrap", "unshare", "rlimit"])
def test_sigkill_of_the_owner_leaves_no_process(backend):
    owner = start_owner(backend)
    try:
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


@pytest.mark.parametrize("owner_alive", [True, False], ids=["reader", "no-reader"])
@pytest.mark.parametrize("backend", ["bwrap", "unshare"])
def test_a_job_runs_only_while_someone_reads_its_results(backend, owner_alive):
    """A process between the pipeline and the sandbox can be orphaned before it arms its parent-death signal
    (`unshare --fork` arms it in the child after forking), so the chain goes on starting without its owner.
    The sandboxed child then finds nobody reading its results and never runs the job; with the reader open,
    the same command runs it (a job that loops forever)."""
    import tempfile

    from sage.configs.schema import SandboxConfig
    from sage.engines.verify import sandbox as sb
    from sage.engines.verify.isolation import IS_ROOT, UIDS, child_env, command, scratch_root_needed, teardown

    if not backend_possible(backend):
        pytest.skip(f"{backend} is not usable here")
    cfg = SandboxConfig(backend=backend, timeout_s=60, cpu_s=60)
    uid = UIDS.take() if IS_ROOT else None
    tmp = tempfile.mkdtemp(prefix="sage-sbx-") if scratch_root_needed(backend) else None
    job_r, job_w = os.pipe()
    res_r, res_w = os.pipe()
    os.write(job_w, sb._payload(sb.Job("def f():\n    while True: pass", "f", [[]]), cfg, "0" * 32, backend))
    os.close(job_w)
    if not owner_alive:
        os.close(res_r)
    proc = subprocess.Popen(command(backend, uid, tmp, (job_r, res_w)), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(job_r, res_w),
                            env=child_env(backend, tmp), cwd="/", start_new_session=True)
    os.close(job_r)
    os.close(res_w)
    try:
        if owner_alive:
            time.sleep(3)
            assert proc.poll() is None  # the job loops
        else:
            assert proc.wait(timeout=30) != 0
    finally:
        teardown(proc, uid, tmp, backend, time.monotonic() + 10)
        if owner_alive:
            os.close(res_r)


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


def _owned_dirs(pid: int) -> list[str]:
    import tempfile
    from pathlib import Path

    from sage.engines.verify.isolation import TEMP_PREFIXES

    root = Path(tempfile.gettempdir())
    return sorted(str(d) for p in TEMP_PREFIXES for d in root.glob(f"{p}{pid}-*"))


@pytest.mark.parametrize("backend", ["bwrap", "rlimit"])
def test_the_temp_dirs_of_a_killed_owner_go_at_the_next_start(backend):
    """SIGKILL runs no cleanup: the owner's child-module dir and its jobs' scratch roots stay in the temp dir,
    named with its PID; the next process to start a sandbox removes them."""
    owner = start_owner(backend)
    try:
        deadline = time.monotonic() + 60
        while not _owned_dirs(owner.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
    left = _owned_dirs(owner.pid)
    assert left  # what the killed owner left behind
    deadline = time.monotonic() + 30  # its sandboxed processes notice its death and exit on their own
    while any(_holds(p, left) for p in psutil.process_iter()) and time.monotonic() < deadline:
        time.sleep(0.5)
    r = subprocess.run([sys.executable, "-c", "from sage.configs.schema import SandboxConfig\n"
                        "from sage.engines.verify.sandbox import Sandbox\n"
                        f"Sandbox(SandboxConfig(backend={backend!r}))"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert _owned_dirs(owner.pid) == []


def _holds(proc: psutil.Process, dirs: list[str]) -> bool:
    try:
        return any(proc.cwd().startswith(d) for d in dirs)
    except psutil.Error:
        return False


def test_a_live_owner_keeps_its_temp_dirs(tmp_path, monkeypatch):
    """Only dirs whose owner is gone are removed: a live process's (another user's included) and names
    without a PID stay."""
    import tempfile

    from sage.engines.verify import isolation

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    live = subprocess.Popen(["sleep", "60"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    try:
        keep = [tmp_path / f"sage-sandbox-child-{live.pid}-abc", tmp_path / "sage-sbx-legacy123",
                tmp_path / "sage-sbx-1-abc", tmp_path / f"sage-sbx-{os.getpid()}-abc"]  # PID 1 is always alive
        gone = [tmp_path / f"sage-sandbox-child-{dead.pid}-abc", tmp_path / f"sage-sbx-{dead.pid}-xyz",
                tmp_path / f"sage-sandbox-probe-{dead.pid}-q"]
        for d in keep + gone:
            d.mkdir()
            (d / "sage_sandbox_child.py").write_text("x = 1\n")
        assert sorted(isolation.sweep_temp_dirs()) == sorted(map(str, gone))
        assert all(d.is_dir() for d in keep) and not any(d.exists() for d in gone)
    finally:
        live.kill()
        live.wait()


def test_a_killed_trainings_temp_dir_is_swept():
    """A SIGKILL during training left the training child's folder (and TRL's `sage-trl-*` inside it, through
    TMPDIR) behind; named with the owner's PID, the sweep removes it once that process is gone."""
    import tempfile
    from pathlib import Path

    from sage.engines.verify.isolation import sweep_temp_dirs

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    left = Path(tempfile.mkdtemp(prefix=f"sage-train-{gone.pid}-"))
    (left / "sage-trl-x").mkdir()
    alive = Path(tempfile.mkdtemp(prefix=f"sage-train-{os.getppid()}-"))
    try:
        assert str(left) in sweep_temp_dirs() and not left.exists()
        assert alive.exists()
    finally:
        alive.rmdir()
