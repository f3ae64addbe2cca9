"""Code sandbox: run untrusted Python functions on test inputs in an isolated child, decide in the parent.

Backends, tried in order (`available_backends()` probes each once per process):

- `bwrap`: bubblewrap with every namespace unshared (no network), read-only /usr, one tmpfs capped in size
  and inodes for /tmp, /dev/shm and the work dir, mounted in a private mount namespace around bwrap (when
  unprivileged, one owned by a user namespace of our own; where neither works, bwrap's own size-capped
  tmpfs mounts), read-only root and /dev; started under `setpriv` to a dedicated uid when
  we are root (bwrap would otherwise map the sandbox back to uid 0, where RLIMIT_NPROC does nothing).
- `unshare` (root only): new mount/net/pid/ipc/uts namespaces; the child itself builds a tmpfs root with
  read-only /usr, chroots and drops to the dedicated uid (see `child._enter_root`).
- `rlimit`: plain rlimits, `no_new_privs` and (as root) the dedicated uid; no filesystem or network
  isolation. `auto` never picks it (with neither of the others it stops with how to install bubblewrap);
  chosen explicitly, every `Sandbox` built on it logs a warning that generated code can reach the host.

Always: the system `/usr/bin/python3 -I -S` (the virtualenv may live where other uids cannot read), minimal
environment, hard=soft rlimits set in the job's own process before any untrusted code, stdin from /dev/null,
capped non-blocking reads, a time limit kept in the parent (`clock`: the CPU time charged to all the job's
processes, under a wall-clock ceiling of `clock.WALL_FACTOR` times the limit), SIGKILL of the process group and
(as root) of every process of the uid, temp dirs removed. The limit covers that teardown: a job returns within
`TEARDOWN_S` of being stopped (its processes charged its limit, or the ceiling reached) whatever it did, and its
duration includes the teardown; what the kernel has not finished by then goes on in the background, and a uid is
reused only once none of its processes remain. Each concurrent job has its own uid (`isolation`), so
RLIMIT_NPROC, `kill(-1)` and the final sweep stay per job. Results come back as typed JSON records on a separate
pipe with a per-run nonce (`child`); the parent reads them as hostile input (`protocol`): a malformed record fails
only its own job, with status `protocol_error`.

Warm slots (bwrap and unshare): within one `execute` call of two jobs or more each worker keeps a slot (`slot.py`): the
namespaces, uid and tmpfs above, with a zygote (`zygote.py`) as their pid 1 that forks a fresh child per
job and never runs untrusted code nor reads a job's payload. What the jobs of one slot share, one after
another: those namespaces (mount, pid, network, IPC, UTS), the uid, the tmpfs and the zygote. A slot is
reused only when the job ended and the zygote found nothing left: no other process in the pid namespace,
/tmp, /work and /dev/shm as they were, no SysV IPC object, no new kernel key (and RLIMIT_MSGQUEUE is 0, so
no POSIX message queue). After anything else (a timeout, an output or protocol violation, a crash of the
slot, anything left) the slot is torn down as a one-job sandbox is and a fresh one starts for the next
job. `rlimit` runs every job in a fresh interpreter.
"""

from __future__ import annotations

import logging
import marshal
import os
import secrets
import select
import selectors
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from sage.configs.schema import SandboxConfig
from sage.engines.verify.clock import JobClock
from sage.engines.verify.isolation import (
    BACKENDS,
    FSIZE_BYTES,
    IS_ROOT,
    NOFILE,
    TEARDOWN_S,
    TMPFS_BYTES,
    TMPFS_INODES,
    UIDS,
    backend_possible,
    child_dir,
    child_env,
    command,
    die_with_parent,
    interpreter,
    scratch_root_needed,
    sweep_once,
    teardown,
    temp_dir,
)
from sage.engines.verify.protocol import Records
from sage.engines.verify.slot import Slot

log = logging.getLogger(__name__)
NO_ISOLATION = ("no isolating sandbox backend works on this machine: install bubblewrap (`apt-get install "
                "bubblewrap`, or `make sandbox-deps`), or run as root with util-linux `unshare` and `setpriv`. "
                "`sandbox.backend: rlimit` runs generated code without isolation and must be chosen explicitly.")


@dataclass
class Job:
    code: str  # untrusted Python source defining the function
    entry_point: str  # function name to call
    inputs: list[list]  # each test input = a list of positional args
    # Trusted source run in a process the code cannot reach (`child._harness`): its `__sage_harness__` is called
    # on each input instead of the code's function, which it calls through the name `entry_point` (or
    # `candidate`). For checks whose assertions must not be computed where the candidate runs.
    harness: str = ""


@dataclass
class ExecResult:
    outputs: list  # one per input: the returned value (decoded), or None when that input failed
    errors: list[str | None]  # one per input: None, or a short error
    status: str  # ok | error | timeout | memory | crashed | output_limit | protocol_error
    backend: str
    duration_s: float
    stdout: str = ""  # capped tail, informational only
    stderr: str = ""
    # CPU seconds the job's processes had been charged when its time limit stopped it (`clock.JobClock`): at least
    # the limit when its CPU time ran out, less when the wall-clock ceiling did. None for any other end (not
    # measured: that would cost every job a pass over /proc).
    cpu_s: float | None = None


_PROBED: dict[str, bool] = {}
_PROBE_LOCK = threading.Lock()


def available_backends() -> list[str]:
    """Backends that run a trivial job correctly on this machine, in preference order (probed once)."""
    with _PROBE_LOCK:
        for backend in BACKENDS:
            if backend not in _PROBED:
                ok = False
                if backend_possible(backend):
                    probe = Job("def f(x):\n    return (x, [1.5, None, True])\n", "f", [[7]])
                    res = _run_job(probe, backend, SandboxConfig(timeout_s=20, cpu_s=10))
                    ok = res.status == "ok" and res.outputs == [(7, [1.5, None, True])]
                _PROBED[backend] = ok
        return [b for b in BACKENDS if _PROBED[b]]


# ------------------------------------------------------------------------------------------ running


def _tail(data: bytearray, cap: int = 4000) -> str:
    return bytes(data[-cap:]).decode("utf-8", "replace")


def _communicate(exited, streams: tuple[int, int], job_w: int, payload: bytes, res_r: int, records: Records,
                 cfg: SandboxConfig, clock: JobClock,
                 watch: int | None = None) -> tuple[str | None, bytearray, bytearray]:
    """Feed the job, read stdout/stderr/results until the end record, exit (`exited()`, checked at least every
    50 ms and whenever `watch` is readable), the end of its time limit (`clock`) or a cap."""
    sel = selectors.DefaultSelector()
    out, err = bytearray(), bytearray()
    bufs = {streams[0]: out, streams[1]: err, res_r: None}
    for fd in bufs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    if watch is not None:
        sel.register(watch, selectors.EVENT_READ)
    os.set_blocking(job_w, False)
    sel.register(job_w, selectors.EVENT_WRITE)
    pending, got, reason = memoryview(payload), 0, None
    try:
        while reason is None and not records.ended and records.violation is None:
            now = time.monotonic()
            if clock.expired(now):
                reason = "timeout"
                break
            if exited():
                reason = "exited"
            for key, _ in sel.select(min(clock.wait_s(now), 0.05)):
                fd = key.fd
                if fd == watch:
                    if exited():
                        reason = "exited"
                    continue
                if fd == job_w:
                    try:
                        pending = pending[os.write(fd, pending):]
                    except (BrokenPipeError, BlockingIOError):
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(fd)
                        os.close(fd)
                        job_w = -1
                    continue
                try:
                    data = os.read(fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not data:
                    sel.unregister(fd)
                    continue
                got += len(data)
                if fd == res_r:
                    records.feed(data)
                else:
                    bufs[fd] += data
                if got > cfg.max_output_bytes + 4096:
                    reason = "output_limit"
                    break
            if reason == "exited":
                break
    finally:
        sel.close()
        if job_w >= 0:
            os.close(job_w)
    return reason, out, err


def _status(reason: str | None, records: Records, returncode: int | None, err: bytearray) -> str:
    if records.violation:
        return "protocol_error"
    if reason in ("timeout", "output_limit"):
        return reason
    errors = [records.load_error] if records.load_error else [e for e in records.errors if e]
    if any(e.startswith("MemoryError") for e in errors) or (not records.ended and b"MemoryError" in err):
        return "memory"
    if any(e.startswith("OutputLimit") for e in errors):
        return "output_limit"
    if not records.ended:
        return "timeout" if returncode in (-signal.SIGKILL, 128 + signal.SIGKILL, -signal.SIGXCPU) \
            else "crashed"
    if errors:
        return "error"
    return "ok"


def _payload(job: Job, cfg: SandboxConfig, nonce: str, backend: str) -> bytes:
    """The job as the child reads it: data only (marshal), never the expected outputs, in a length-prefixed frame;
    a check job's harness follows in a frame of its own, which the child reads only once the candidate's process
    exists without it (`child._read_job`)."""
    job_bytes = marshal.dumps({
        "code": job.code, "entry_point": job.entry_point, "nonce": nonce, "harness": bool(job.harness),
        "inputs": [list(args) for args in job.inputs],
        "max_output_bytes": cfg.max_output_bytes, "tmpfs_bytes": TMPFS_BYTES,
        "tmpfs_inodes": TMPFS_INODES, "ro_dirs": interpreter()[1],
        "parent": os.getpid() if backend == "rlimit" else None,  # the child's parent outside a namespace
        # MSGQUEUE 0: no POSIX message queue, which would outlive the job in a warm slot's IPC namespace
        "limits": {"CPU": cfg.cpu_s, "AS": cfg.memory_mb << 20, "FSIZE": FSIZE_BYTES, "NOFILE": NOFILE,
                   "NPROC": cfg.max_procs, "CORE": 0, "MSGQUEUE": 0}}, 4)
    frames = [job_bytes] + ([job.harness.encode("utf-8")] if job.harness else [])
    return b"".join(len(f).to_bytes(8, "big") + f for f in frames)


def _run_in_slot(job: Job, slot: Slot, cfg: SandboxConfig) -> ExecResult:
    """Run one job in a warm slot's fresh fork (starting the slot first if needed); the slot is kept only
    when the job ended and its zygote reported the slot clean, and is torn down otherwise."""
    start = time.monotonic()
    clock = JobClock(cfg.timeout_s, start)
    nonce = secrets.token_hex(16)
    records = Records(nonce, len(job.inputs), cfg.max_output_bytes + 4096)
    reason, out, err, report = "exited", bytearray(), bytearray(), None
    reads: list[int] = []  # the parent's ends of the results, stdout and stderr pipes
    try:
        if not slot.alive and not slot.start(clock.ceiling):
            err += slot.start_error.encode()
            raise _SlotFailed
        clock.watch(slot.proc.pid, slot.residents)
        job_r, job_w = os.pipe()
        res_r, res_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        reads = [res_r, out_r, err_r]
        try:
            slot.send((job_r, res_w, out_w, err_w))
        except OSError:
            os.close(job_w)
            raise
        finally:
            for fd in (job_r, res_w, out_w, err_w):
                os.close(fd)
        got: list = []

        def exited() -> bool:
            if not got and (slot.proc.poll() is not None or _readable(slot.sock)):
                got.append(slot.report(time.monotonic() + 0.05))
            return bool(got)

        reason, out, err = _communicate(exited, (out_r, err_r), job_w, _payload(job, cfg, nonce, slot.backend),
                                        res_r, records, cfg, clock, watch=slot.sock.fileno())
        if reason is None and records.ended and records.violation is None:  # wait for the zygote's report
            got.append(slot.report(clock.ceiling))
        report = got[0] if got else None
        _drain(res_r, records, (out_r, err_r), out, err, cfg)
    except (_SlotFailed, OSError):
        report = None
    finally:
        for fd in reads:
            os.close(fd)
        keep = report is not None and report[1] and reason not in ("timeout", "output_limit") \
            and records.violation is None
        returncode = report[0] if report else None
        if not keep:
            closed = slot.close(clock.teardown_by())
            returncode = returncode if returncode is not None else closed
    return _result(job, records, reason, returncode, out, err, slot.backend, time.monotonic() - start, clock)


class _SlotFailed(Exception):
    """The slot's zygote did not start."""


def _readable(sock) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


def _run_job(job: Job, backend: str, cfg: SandboxConfig) -> ExecResult:
    start = time.monotonic()
    clock = JobClock(cfg.timeout_s, start)
    uid = UIDS.take() if IS_ROOT else None
    tmp = temp_dir("sage-sbx-") if scratch_root_needed(backend) else None
    nonce = secrets.token_hex(16)
    records = Records(nonce, len(job.inputs), cfg.max_output_bytes + 4096)
    proc = None
    try:
        if tmp and uid is not None and backend == "rlimit":
            os.chown(tmp, uid, uid)
        payload = _payload(job, cfg, nonce, backend)
        job_r, job_w = os.pipe()
        res_r, res_w = os.pipe()
        try:
            proc = subprocess.Popen(
                command(backend, uid, tmp, (job_r, res_w)), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, pass_fds=(job_r, res_w), env=child_env(backend, tmp),
                cwd=tmp if backend == "rlimit" else "/", start_new_session=True, preexec_fn=die_with_parent)
        except BaseException:
            os.close(job_w)
            os.close(res_r)
            raise
        finally:
            os.close(job_r)
            os.close(res_w)
        clock.watch(proc.pid)
        try:
            streams = (proc.stdout.fileno(), proc.stderr.fileno())
            reason, out, err = _communicate(lambda: proc.poll() is not None, streams, job_w, payload, res_r,
                                            records, cfg, clock)
            _drain(res_r, records, streams, out, err, cfg)
        finally:
            os.close(res_r)
    finally:
        grace = min(0.05, max(0.0, clock.ceiling - time.monotonic())) if records.ended else 0.0
        returncode = teardown(proc, uid, tmp, backend, clock.teardown_by(), grace)
    return _result(job, records, reason, returncode, out, err, backend, time.monotonic() - start, clock)


def _drain(res_r: int, records: Records, streams: tuple[int, int], out: bytearray, err: bytearray,
           cfg: SandboxConfig) -> None:
    """Read what is already buffered in the pipes (the child may have exited before we read it)."""
    budget = cfg.max_output_bytes
    for fd, sink in ((res_r, None), (streams[0], out), (streams[1], err)):
        while budget > 0:
            try:
                data = os.read(fd, 1 << 16)
            except (BlockingIOError, OSError):
                break
            if not data:
                break
            budget -= len(data)
            if sink is None:
                records.feed(data)
            else:
                sink.extend(data)


def _result(job, records, reason, returncode, out, err, backend, duration, clock) -> ExecResult:
    status = _status(reason, records, returncode, err)
    n = len(job.inputs)
    if status == "protocol_error":
        log.warning("sandbox job failed with protocol_error: %s", records.violation)
        outputs, errors = [None] * n, [f"protocol violation: {records.violation}"] * n
    elif records.load_error:
        outputs, errors = [None] * n, [records.load_error] * n
    else:
        outputs, errors = records.outputs, records.errors
        for i in range(n):
            if i not in records.seen:
                errors[i] = status if status != "ok" else "no result"
    return ExecResult(outputs, errors, status, backend, duration, _tail(out), _tail(err),
                      clock.used_s if reason == "timeout" else None)


class Sandbox:
    """Runs jobs on the first working isolating backend (or the configured one), in parallel."""

    def __init__(self, cfg: SandboxConfig | None = None):
        self.cfg = cfg or SandboxConfig()
        sweep_once()  # the temp dirs of a sandbox owner that was killed (SIGKILL runs no cleanup)
        available = available_backends()
        if self.cfg.backend == "auto":
            isolating = [b for b in available if b != "rlimit"]
            if not isolating:
                raise RuntimeError(NO_ISOLATION)
            self.backend = isolating[0]
        elif self.cfg.backend in available:
            self.backend = self.cfg.backend
        else:
            raise RuntimeError(f"sandbox backend {self.cfg.backend!r} unavailable here (have {available})")
        if self.backend == "rlimit":
            log.warning("sandbox.backend is rlimit: generated code runs WITHOUT isolation and can read and write "
                        "this host's files, shared memory and local sockets; install bubblewrap "
                        "(apt-get install bubblewrap) and use sandbox.backend: auto")
        # 2x cores: jobs spend much of their time waiting on the kernel (bench/verify.py measures it)
        self.workers = self.cfg.workers or 2 * (os.cpu_count() or 1)

    def execute(self, jobs: list[Job]) -> list[ExecResult]:
        """Run `jobs` in parallel, up to `workers` at a time; results in the order of `jobs`. On bwrap and
        unshare each worker runs its jobs in a warm slot (`slot.py`) that lives until this call returns; a
        single job runs in a fresh one-job sandbox, which starts faster than a slot."""
        if not jobs:
            return []
        workers = min(self.workers, len(jobs))
        if self.backend == "rlimit" or child_dir() is None or len(jobs) == 1:  # a slot pays off from 2 jobs
            run = lambda j: _run_job(j, self.backend, self.cfg)  # noqa: E731
            with ThreadPoolExecutor(max_workers=workers) as pool:
                return list(pool.map(run, jobs))
        free = [Slot(self.backend) for _ in range(workers)]
        lock = threading.Lock()

        def run_in_slot(job: Job) -> ExecResult:
            with lock:
                slot = free.pop()
            try:
                return _run_in_slot(job, slot, self.cfg)
            finally:
                with lock:
                    free.append(slot)

        try:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                return list(pool.map(run_in_slot, jobs))
        finally:
            until = time.monotonic() + TEARDOWN_S
            for slot in free:
                slot.close(until, grace_s=0.05)


__all__ = ["Job", "ExecResult", "Sandbox", "available_backends"]
