"""A warm sandbox slot's init process: inside the slot's namespaces, it forks one fresh child per job.

This file, like `child.py`, is handed to the system interpreter inside the sandbox (`python3 -I -S`), so it
uses the standard library only. argv: `setup_fd ctrl_fd [chroot ROOT UID GID]`. It reads the slot's set-up
(marshal: tmpfs sizes, read-only dirs) from `setup_fd`, builds its root like a one-job child does (unshare
backend), and becomes pid 1 of the slot's pid namespace (bwrap `--as-pid-1`, or `unshare --fork`), where
signals from the jobs cannot reach it. It never runs untrusted code and never reads a job: per job it
receives, over the `ctrl_fd` unix socket, four pipe ends (job in, results out, stdout, stderr) as
SCM_RIGHTS, forks, and only the fork reads the job's payload and runs it (`child.run`, which sets the
rlimits first). So a job's fork is a copy of a zygote that holds no other job's data.

After each job the zygote kills every other process of its pid namespace (`kill(-1)`), reaps them, and
checks what the jobs of this slot share: the tmpfs (/tmp, /work, /dev/shm: entries, owner, mode, modification
time, extended attributes), SysV IPC objects, kernel keys, the network
namespace's sockets, and the zygote's own limits, priority, scheduling, affinity, autogroup and host name (every
fork inherits them). Each job's fork starts a session of its own, so a job that renices its scheduler autogroup
slows only itself. It reports `done <exit status> <clean>` on `ctrl_fd`. When anything was left or changed,
`clean` is 0 and the zygote exits: the parent starts a fresh slot for the next job.
The zygote is non-dumpable, so a job (same uid) can neither ptrace it nor read its memory or its fds.
"""

FDS_PER_JOB = 4  # job_r, res_w, out_w, err_w
# Imported once by the zygote, so each job's fork has them loaded: what a check job's harness and candidate
# processes both import (HumanEval's prompts import `typing`, ~10 ms a time; every check seeds `random`). None
# holds state a job could tell apart from a fresh import's: `random`'s seed, which every fork would share, is
# drawn afresh in each job (`child.run`).
WARM_MODULES = ("json", "_json", "marshal", "resource", "typing", "math", "collections", "itertools", "functools",
                "re", "string", "heapq", "bisect", "copy", "random")
SHARED_DIRS = ("/tmp", "/work", "/dev/shm")
# Kernel state a job could change for the next: the IPC namespace's objects, keys, IPv6 and unix sockets, the
# scheduler autogroup. The namespaces' settings (/proc/sys: pid_max, the IPC and message queue limits, the
# network's) need no comparing: every backend binds /proc/sys read-only (`isolation.command`).
KERNEL_STATE = ("/proc/sysvipc/shm", "/proc/sysvipc/sem", "/proc/sysvipc/msg", "/proc/keys",
                "/proc/net/sockstat6", "/proc/net/unix", "/proc/self/autogroup")


def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _sockets():
    """The slot's network namespace's socket counts (/proc/net/sockstat: in use, in TIME_WAIT, fragments),
    without its machine-wide fields (orphans, allocated, memory). A socket left in TIME_WAIT shows its ports to
    the next job for a minute. Listing the sockets (/proc/net/tcp6) walks the host's tables: 5-20 ms a job."""
    import re

    return re.sub(rb" (?:orphan|alloc|mem) \d+", b"", _read("/proc/net/sockstat") or b"")


def _settled_sockets(time):
    """The slot's socket counts once the set-up's own sockets are gone: bwrap brings up loopback over a netlink
    socket in the slot's network namespace, which the kernel frees a moment after bwrap closes it (after an RCU
    grace period). A baseline that counted it would make the first job's slot look changed. Waits 0.5 s at
    most for "sockets: used 0", the count of a namespace with no socket (the zygote's own is the parent's)."""
    until = time.monotonic() + 0.5
    while b"sockets: used 0\n" not in (counts := _sockets()) and time.monotonic() < until:
        time.sleep(0.002)
    return counts


def _dir(os, path):
    """What a later job could see of a shared dir: its entries, owner, mode, modification time (a job that made
    and removed a file changed it) and extended attributes."""
    try:
        st = os.stat(path)
        return sorted(os.listdir(path)), st.st_uid, st.st_gid, st.st_mode, st.st_mtime_ns, sorted(os.listxattr(path))
    except OSError:
        return None


def _self(os, resource):
    """The zygote's own inherited settings, which a job of the same uid could change from outside (the
    sandbox's seccomp filter forbids it; checked here too): every rlimit, nice value, scheduling policy and
    priority, CPU affinity, umask and host name."""
    limits = [resource.getrlimit(getattr(resource, n)) for n in sorted(dir(resource)) if n.startswith("RLIMIT_")]
    mask = os.umask(0o22)
    os.umask(mask)
    return (limits, os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0), os.sched_getparam(0).sched_priority,
            sorted(os.sched_getaffinity(0)), mask, os.uname().nodename)


def _state(sockets=_sockets):
    """What the jobs of this slot could leave for the next one, beyond processes."""
    import os
    import resource

    return [_dir(os, d) for d in SHARED_DIRS], [_read(p) for p in KERNEL_STATE], sockets(), _self(os, resource)


def _recv_job(sock, array):
    """One job's pipe ends from the parent, or None at end of stream (the slot closes)."""
    fds = array.array("i")
    msg, anc, _, _ = sock.recvmsg(64, __import__("socket").CMSG_SPACE(FDS_PER_JOB * fds.itemsize))
    for _level, _kind, data in anc:
        fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    if not msg:
        return None
    if msg != b"job" or len(fds) != FDS_PER_JOB:
        raise SystemExit("bad job message")
    return list(fds)


def _wait_job(os, pid):
    """Reap children until the job's own process exits; its wait status as an exit code (-signal if killed)."""
    while True:
        done, status = os.waitpid(-1, 0)
        if done == pid:
            return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _kill_rest(os, signal):
    """SIGKILL every other process of the pid namespace and reap them all; True if there was any."""
    try:
        os.kill(-1, signal.SIGKILL)
        left = True
    except ProcessLookupError:
        left = False
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return left


def serve(os, ctrl_fd):
    import array
    import ctypes
    import signal
    import socket

    import sage_sandbox_child as child  # pyright: ignore[reportMissingImports]

    for name in WARM_MODULES:
        __import__(name)
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no ptrace, /proc/1/mem or /proc/1/fd by a job
    sock = socket.socket(fileno=ctrl_fd)
    baseline = _state(lambda: _settled_sockets(__import__("time")))
    sock.sendall(b"ready\n")
    while True:
        fds = _recv_job(sock, array)
        if fds is None:
            os._exit(0)
        job_r, res_w, out_w, err_w = fds
        pid = os.fork()
        if pid == 0:
            sock.close()
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            child._close_all_but(os, (job_r, res_w))  # nothing of the zygote's (its socket, other fds) stays open
            os.setsid()  # a session, and so a scheduler autogroup, of its own: its nice value dies with the job
            child.run(child._read_job(os, job_r), res_w)
        for fd in fds:
            os.close(fd)
        code = _wait_job(os, pid)
        clean = not _kill_rest(os, signal) and _state() == baseline
        sock.sendall(b"done %d %d\n" % (code, 1 if clean else 0))
        if not clean:
            os._exit(0)


def main():
    import os
    import sys

    import sage_sandbox_child as child  # pyright: ignore[reportMissingImports]

    setup_fd, ctrl_fd = int(sys.argv[1]), int(sys.argv[2])
    setup = __import__("marshal").loads(child._read_all(os, setup_fd))
    if len(sys.argv) > 3 and sys.argv[3] == "chroot":
        child._enter_root(os, sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), setup)
    child._die_with_parent(os)
    serve(os, ctrl_fd)
