"""Parent side of a warm sandbox slot: one zygote (`zygote.py`) per worker, reused while it stays clean.

A slot is started like a one-job child (the same bwrap or unshare command line, uid, inode-capped tmpfs and
environment) but runs the zygote, which forks a fresh child per job. What the jobs of one slot share, one
after another: the slot's namespaces (mount, pid, network, IPC, UTS), its uid, its tmpfs and the zygote
that forks them. The zygote reports after each job whether anything was left there (a process, a file, an
IPC object, a kernel key); a slot is reused only after a clean report, and is torn down (`teardown`: kill,
uid sweep, tmpfs removal) after anything else: a timeout, an output or protocol violation, a dirty or
missing report. A slot lives within one `Sandbox.execute` call.
"""

from __future__ import annotations

import marshal
import os
import socket
import subprocess
import time

from sage.engines.verify.clock import tree
from sage.engines.verify.isolation import (
    IS_ROOT,
    TMPFS_BYTES,
    TMPFS_INODES,
    UIDS,
    child_env,
    command,
    die_with_parent,
    interpreter,
    scratch_root_needed,
    teardown,
    temp_dir,
)


class Slot:
    """One zygote: started on first use, reused after clean jobs, replaced after anything else."""

    def __init__(self, backend: str):
        self.backend = backend
        self.proc = self.sock = self.uid = self.tmp = None
        self.start_error = ""
        # The slot's own processes (the wrappers, the zygote), parents first: what they were charged before a job
        # is not the job's (`clock.JobClock.watch`); the zygote is charged each job's processes as it reaps them.
        self.residents: list[int] = []

    @property
    def alive(self) -> bool:
        return self.proc is not None

    def start(self, until: float) -> bool:
        """Start the zygote and wait (until `until`, monotonic) for it to say ready; False if it did not."""
        self.uid = UIDS.take() if IS_ROOT else None
        self.tmp = temp_dir("sage-sbx-") if scratch_root_needed(self.backend) else None
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        setup_r, setup_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                command(self.backend, self.uid, self.tmp, (setup_r, child_sock.fileno()), zygote=True),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                pass_fds=(setup_r, child_sock.fileno()), env=child_env(self.backend, self.tmp), cwd="/",
                start_new_session=True, preexec_fn=die_with_parent)
        finally:
            os.close(setup_r)
            child_sock.close()
        self.sock = parent_sock
        os.write(setup_w, marshal.dumps({"tmpfs_bytes": TMPFS_BYTES, "tmpfs_inodes": TMPFS_INODES,
                                         "ro_dirs": interpreter()[1]}, 4))
        os.close(setup_w)
        if self._line(until) == b"ready":
            self.residents = tree(self.proc.pid)
            return True
        self.start_error = self._stderr()
        return False

    def send(self, fds: tuple[int, int, int, int]) -> None:
        """Hand the zygote one job's pipe ends (job in, results out, stdout, stderr)."""
        self.sock.sendmsg([b"job"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, bytes(memoryview(
            __import__("array").array("i", fds))))])

    def report(self, until: float) -> tuple[int, bool] | None:
        """The zygote's `done <exit status> <clean>` for the job in flight, waiting until `until` at most."""
        line = self._line(until)
        parts = line.split() if line else []
        if len(parts) != 3 or parts[0] != b"done" or parts[2] not in (b"0", b"1"):
            return None
        try:
            return int(parts[1]), parts[2] == b"1"
        except ValueError:
            return None

    def _line(self, until: float) -> bytes | None:
        buf = b""
        while not buf.endswith(b"\n") and len(buf) < 64:
            left = until - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(64 - len(buf))
            except (TimeoutError, OSError):
                return None
            if not data:
                return None
            buf += data
        return buf.strip()

    def _stderr(self) -> str:
        try:
            os.set_blocking(self.proc.stderr.fileno(), False)
            return (self.proc.stderr.read() or b"")[-4000:].decode("utf-8", "replace")
        except (OSError, TypeError):
            return ""

    def close(self, until: float, grace_s: float = 0.0) -> int | None:
        """Tear the slot down (`isolation.teardown`), holding the caller until `until` at most; `grace_s` lets
        a zygote whose socket was closed exit by itself first."""
        if self.sock is not None:
            self.sock.close()
        proc, self.proc, self.sock = self.proc, None, None
        if proc is None and self.uid is None and self.tmp is None:
            return None
        code = teardown(proc, self.uid, self.tmp, self.backend, until, grace_s)
        self.uid = self.tmp = None
        return code
