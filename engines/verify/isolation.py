"""Operating-system side of the sandbox: dedicated uids, process sweeps, backend command lines.

Each concurrent job runs under its own uid (root only), taken from a process-wide pool and held with an
exclusive `flock`, so two processes (say a test run and a pipeline) never share one; that keeps
RLIMIT_NPROC, `kill(-1)` and the final "kill everything of this uid" sweep per job. The child module
(`child.py`) is compiled once by the sandbox interpreter into a root-owned, world-readable dir,
which bwrap binds read-only at /sandbox.
"""

from __future__ import annotations

import atexit
import fcntl
import functools
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BACKENDS = ("bwrap", "unshare", "rlimit")
FSIZE_BYTES = 16 << 20  # RLIMIT_FSIZE: largest file the child may write
TMPFS_BYTES = 64 << 20  # size of each private tmpfs (/tmp, /dev/shm, the work dir)
# Inodes of each private tmpfs: without a cap the kernel allows millions, a candidate creating empty files
# pins hundreds of MiB of kernel memory, and tearing the mount down outlasts the time limit.
TMPFS_INODES = 4096
# How long past its deadline a job's teardown (kill, reap, process sweep, temp dirs) may hold the caller. What
# the kernel has not finished by then goes on in the background, so the time limit holds whatever the job did.
TEARDOWN_S = 0.25
NOFILE = 64
UID_BASE, UID_SPAN = 61000, 512  # dedicated sandbox uids (root only), skipping any in /etc/passwd
LOCK_DIR = Path(tempfile.gettempdir()) / "sage-sandbox-uids"
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/work"}
_CHILD_SOURCE = Path(__file__).with_name("child.py").read_text()
_ZYGOTE_SOURCE = Path(__file__).with_name("zygote.py").read_text()

# ------------------------------------------------------------------------------------------ uids


class _UidPool:
    """Process-wide pool of dedicated uids; each is held with an exclusive flock for the process lifetime."""

    def __init__(self):
        self._free: list[int] = []
        self._locks: dict[int, int] = {}
        self._mutex = threading.Lock()

    def take(self) -> int:
        with self._mutex:
            if self._free:
                return self._free.pop()
            LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
            for uid in range(UID_BASE, UID_BASE + UID_SPAN):
                if uid in self._locks or _uid_exists(uid):
                    continue
                fd = os.open(LOCK_DIR / str(uid), os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    os.close(fd)
                    continue
                if not sweep_uid(uid, 0.2):  # a process of a dead pipeline still runs as this uid: not reused
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    os.close(fd)
                    continue
                clear_keys(uid)  # whatever an earlier holder (another tool, a sandbox before seccomp) planted
                self._locks[uid] = fd
                return uid
        raise RuntimeError("no free sandbox uid")

    def give(self, uid: int) -> None:
        with self._mutex:
            self._free.append(uid)


def die_with_parent() -> None:
    """For `preexec_fn`: have Linux SIGKILL the child when the thread that started it exits (PR_SET_PDEATHSIG),
    so sandboxes, math workers and servers the pipeline starts never outlive it, even when it is killed outright."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)


@functools.cache
def _setpriv_pdeathsig() -> list[str]:
    """setpriv's own `--pdeathsig KILL` where it has one (util-linux 2.33+). Changing the uid clears the
    parent-death signal `die_with_parent` set, and bwrap arms its own only after setting up its namespaces:
    an owner killed in between left bwrap and the sandbox running for good. setpriv sets it again right after
    the uid change, and it then holds across the exec of bwrap."""
    try:
        ok = subprocess.run(["setpriv", "--pdeathsig", "KILL", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return ["--pdeathsig", "KILL"] if ok else []


#: keyctl's number per architecture, for `clear_keys`
_KEYCTL = {"x86_64": 250, "aarch64": 219}
_CLEAR_KEYS = """import ctypes, os
libc, nr = ctypes.CDLL(None), {nr}
for ring in (-4, -5):  # the user keyring and the user session keyring
    libc.syscall(nr, 7, ring)  # KEYCTL_CLEAR
"""
_KEYS_AFTER_CLEAR: dict[int, int] = {}


def _key_count(uid: int) -> int:
    """How many keys (keyrings included) the kernel holds for `uid` (/proc/key-users), 0 when none."""
    try:
        with open("/proc/key-users") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name.strip() == str(uid):
                    return int(rest.split()[1].split("/")[0])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def clear_keys(uid: int) -> None:
    """Empty the kernel keyrings of a pooled uid that outlive its processes (user, user session):
    kernel keys are not namespaced, so a key planted by one holder of the uid would be read by the next. The
    sandbox's seccomp filter denies jobs the key syscalls; this clears what got there some other way. Runs a
    process as `uid` only when the kernel lists keys for it that were not there after the last clear."""
    count = _key_count(uid)
    if count == 0 or _KEYS_AFTER_CLEAR.get(uid) == count or os.uname().machine not in _KEYCTL:
        return
    try:
        subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", interpreter()[0], "-I", "-S",
                        "-c", _CLEAR_KEYS.format(nr=_KEYCTL[os.uname().machine])],
                       capture_output=True, timeout=10, env=ENV, cwd="/")
    except (OSError, subprocess.SubprocessError):
        return
    _KEYS_AFTER_CLEAR[uid] = _key_count(uid)


def _uid_exists(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


UIDS = _UidPool()
IS_ROOT = os.geteuid() == 0


def remove_owned(uid: int, dirs: tuple[str, ...] = ("/tmp", "/var/tmp", "/dev/shm")) -> None:
    """rlimit backend: delete what the job's uid left in the host's world-writable dirs (top level)."""
    for d in dirs:
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            except OSError:
                continue


def sweep_uid(uid: int, wait_s: float) -> bool:
    """SIGKILL every (non-zombie) process whose uid is `uid`, until none is left or `wait_s` passes; True when
    none is left."""
    end = time.monotonic() + wait_s
    while True:
        alive = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                if os.stat(f"/proc/{name}").st_uid != uid:
                    continue
                with open(f"/proc/{name}/stat", "rb") as f:
                    if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                        continue
                os.kill(int(name), signal.SIGKILL)
                alive.append(name)
            except (OSError, IndexError):
                continue
        if not alive or time.monotonic() > end:
            return not alive
        time.sleep(0.001)


# ------------------------------------------------------------------------------------------ backends


def interpreter() -> tuple[str, list[str]]:
    """The system interpreter, plus read-only dirs it needs besides /usr."""
    path = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else shutil.which("python3")
    real = os.path.realpath(path or "")
    extra = [] if real.startswith("/usr/") else [os.path.dirname(os.path.dirname(real))]
    return path or "python3", extra


def _system_links() -> list[str]:
    args = []
    for d in ("bin", "lib", "lib64", "sbin", "lib32", "libx32"):
        if os.path.islink("/" + d):
            args += ["--symlink", os.readlink("/" + d), "/" + d]
        elif os.path.isdir("/" + d):
            args += ["--ro-bind", "/" + d, "/" + d]
    return args


#: What the sandbox makes in the temp directory, each name `<prefix><owner PID>-<random>`: the child module's
#: dir, each job's or slot's scratch root, the user-namespace probe's mount point; and a training child's folder
#: (engines/train/launch.py), which holds the trainer's own.
TEMP_PREFIXES = ("sage-sandbox-child-", "sage-sbx-", "sage-sandbox-probe-", "sage-train-")
_SWEPT: list[bool] = []
_SWEEP_LOCK = threading.Lock()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def sweep_temp_dirs() -> list[str]:
    """Remove the sandbox's temp dirs whose owner process is gone: a SIGKILLed run's atexit and teardown never
    ran. A dir whose owner is alive (or whose name holds no PID) is left alone. Returns the dirs removed."""
    removed = []
    root = Path(tempfile.gettempdir())
    for prefix in TEMP_PREFIXES:
        for d in root.glob(f"{prefix}*"):
            pid = d.name[len(prefix):].split("-", 1)[0]
            if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)) or not d.is_dir():
                continue
            shutil.rmtree(d, ignore_errors=True)
            if not d.exists():
                removed.append(str(d))
    return removed


def sweep_once() -> None:
    """`sweep_temp_dirs`, once per process: when its first sandbox starts."""
    with _SWEEP_LOCK:
        if not _SWEPT:
            _SWEPT.append(True)
            sweep_temp_dirs()


def temp_dir(prefix: str) -> str:
    """A new temp dir named with this process's PID, so a later process can tell when it is stale."""
    sweep_once()
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")


_CHILD_DIR: list[str | None] = []
_CHILD_LOCK = threading.Lock()


def child_dir() -> str | None:
    """A root-owned, world-readable dir holding the child module and its .pyc compiled by the sandbox
    interpreter (saves compiling the source in every child); None if that fails (then `-c` source)."""
    with _CHILD_LOCK:
        if not _CHILD_DIR:
            path = None
            try:
                d = temp_dir("sage-sandbox-child-")
                atexit.register(shutil.rmtree, d, True)
                os.chmod(d, 0o755)
                (Path(d) / "sage_sandbox_child.py").write_text(_CHILD_SOURCE)
                (Path(d) / "sage_sandbox_zygote.py").write_text(_ZYGOTE_SOURCE)
                subprocess.run([interpreter()[0], "-I", "-S", "-m", "py_compile", f"{d}/sage_sandbox_child.py",
                                f"{d}/sage_sandbox_zygote.py"], check=True, capture_output=True, timeout=60)
                for root, dirs, files in os.walk(d):
                    for name in dirs + files:
                        os.chmod(os.path.join(root, name), 0o755 if name in dirs else 0o644)
                path = d
            except (OSError, subprocess.SubprocessError):
                path = None
            _CHILD_DIR.append(path)
        return _CHILD_DIR[0]


def command(backend: str, uid: int | None, root: str | None, fds: tuple[int, int], zygote: bool = False) -> list[str]:
    """The command line of a one-job child (`fds`: job in, results out) or, with `zygote`, of a warm slot's
    zygote (`fds`: set-up in, control socket; bwrap and unshare only, needs `child_dir()`)."""
    python, extra = interpreter()
    cdir = child_dir()
    if cdir:
        inside = "/sandbox" if backend == "bwrap" else cdir  # bwrap binds it there, above its private /tmp
        module = "sage_sandbox_zygote" if zygote else "sage_sandbox_child"
        stub = f"import sys; sys.path.insert(0, {inside!r}); import {module} as c; c.main()"
        if not zygote:  # a zygote's fork imports nothing after the path is set
            stub = stub.replace("; c.main()", "; del sys.path[0]; c.main()")
        child = [python, "-I", "-S", "-c", stub, str(fds[0]), str(fds[1])]
    else:
        child = [python, "-I", "-S", "-c", _CHILD_SOURCE, str(fds[0]), str(fds[1])]
    drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *_setpriv_pdeathsig()] \
        if uid is not None else []
    # /proc/sys is bound read-only on every backend with namespaces. Its per-namespace files (pid_max, the IPC and
    # message queue limits, the network's) belong to the slot's namespaces, which outlive each job; under bwrap the
    # job's uid is root of the user namespace that owns them, so the kernel lets it write them (a pid_max of 301
    # left every later job of the slot short of pids). Read-only closes every such file at once, today's and a
    # later kernel's, where comparing them after each job would need a list of names; bwrap's own cover of
    # /proc/sys is skipped because the dir itself is not writable. The values read through it are still the
    # reader's namespaces' own: the kernel picks them by the reading process, not by the mount.
    if backend == "bwrap":
        binds = [a for d in extra for a in ("--ro-bind", d, d)]
        if root is not None:  # one private tmpfs, inode-capped, bound at /work, /tmp and /dev/shm alike
            scratch = ["--bind", root, "/dev/shm", "--remount-ro", "/dev", "--bind", root, "/tmp",
                       "--bind", root, "/work"]
            if not IS_ROOT:  # bwrap runs as root of the mounting user namespace: map the sandbox back to our uid
                scratch += ["--uid", str(os.getuid()), "--gid", str(os.getgid()), "--cap-drop", "ALL"]
        else:  # bwrap has no inode option for its tmpfs mounts: size caps only
            size = str(TMPFS_BYTES)
            scratch = ["--size", size, "--tmpfs", "/dev/shm", "--remount-ro", "/dev", "--size", size, "--tmpfs",
                       "/tmp", "--size", size, "--tmpfs", "/work"]
        inner = drop + [
            "bwrap", "--unshare-all", "--die-with-parent", "--new-session", *(["--as-pid-1"] if zygote else []),
            "--ro-bind", "/usr", "/usr",
            *_system_links(), *binds, "--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev",
            *scratch,
            *(["--ro-bind", cdir, "/sandbox"] if cdir else []), "--remount-ro", "/", "--chdir", "/work", "--", *child]
        return inner if root is None else _scratch_mount(root) + inner
    if backend == "unshare":
        return ["unshare", "--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child",
                *child, "chroot", str(root), str(uid), str(uid)]
    return (["setpriv", "--no-new-privs", *drop[1:]] if shutil.which("setpriv") else []) + child


def _scratch_mount(root: str) -> list[str]:
    """Prefix that mounts an inode-capped tmpfs on `root` in a private mount namespace, so the mount vanishes
    with the job's processes and the host never sees it, then runs the rest. Unprivileged, the mount namespace
    belongs to a user namespace of our own (where we are root, as tmpfs mounts require); bwrap then nests its
    own user namespace inside and maps the sandbox back to our uid with no capabilities.

    The rest runs as pid 1 of a pid namespace of its own, killed when `unshare` above it dies (which dies with
    the pipeline, `die_with_parent`); when pid 1 dies the kernel kills every process inside. bwrap's own
    `--die-with-parent` leaves a gap: its sandbox's first process arms it only after setting up its mounts, and
    one whose bwrap was killed before that outlived the pipeline."""
    script = (f'mount -t tmpfs -o size={TMPFS_BYTES},nr_inodes={TMPFS_INODES},mode=1777,nosuid,nodev sage-sandbox '
              '"$0" && exec "$@"')
    user = [] if IS_ROOT else ["--user", "--map-root-user"]
    return ["unshare", *user, "--mount", "--propagation", "private", "--pid", "--fork", "--kill-child", "--",
            "/bin/sh", "-c", script, root]


@functools.cache
def _userns_mount_works() -> bool:
    """Can this unprivileged process mount a tmpfs in a user namespace of its own? Kernels and distributions
    that forbid unprivileged user namespaces say no (probed once)."""
    root = temp_dir("sage-sandbox-probe-")
    try:
        return subprocess.run(_scratch_mount(root) + ["/bin/true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        os.rmdir(root)


def scratch_root_needed(backend: str) -> bool:
    """Does the job need a host directory (rlimit: its work dir; unshare, and bwrap wherever it can get an
    inode-capped tmpfs: a mount point)? bwrap can as root with `unshare` and `mount`, and unprivileged where
    a user namespace of our own may mount one; elsewhere its tmpfs mounts cap size only."""
    if backend != "bwrap":
        return True
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    return IS_ROOT or _userns_mount_works()


def backend_possible(backend: str) -> bool:
    if IS_ROOT and not shutil.which("setpriv"):
        return False  # never run untrusted code as root
    if backend == "bwrap":
        return shutil.which("bwrap") is not None
    if backend == "unshare":
        return IS_ROOT and shutil.which("unshare") is not None
    return True


def child_env(backend: str, tmp: str | None) -> dict[str, str]:
    if backend == "rlimit":  # no private /tmp: point the child's temp files at its own work dir
        return {**ENV, "HOME": str(tmp), "TMPDIR": str(tmp)}
    return dict(ENV)


def teardown(proc, uid: int | None, tmp: str | None, backend: str, until: float, grace_s: float = 0.0) -> int | None:
    """Kill a job's processes and release what it held (its uid, temp dir, and on rlimit what its uid left in
    the host's temp dirs), holding the caller until `until` (monotonic) at most; returns the child's exit
    status, or None when it was not reaped by then. What is left at `until` finishes on a daemon thread: a
    killed process can take the kernel a while to tear down, and the job's time limit must hold anyway. The
    uid returns to the pool only once no process of it remains, so no later job shares it with leftovers."""
    returncode = None
    if proc is not None:
        if grace_s > 0:  # the child said "end" and is exiting: let the namespace go down by itself
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if proc.poll() is None:
            proc.kill()
        try:
            returncode = proc.wait(timeout=max(0.0, until - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    done = proc is None or returncode is not None
    if done and uid is not None:
        done = sweep_uid(uid, max(0.0, until - time.monotonic()))
    # rlimit's work dir is on the host's disk, where deleting what a job wrote can take longer than any limit
    if done and time.monotonic() < until and backend != "rlimit":
        _release(uid, tmp, backend)
    else:
        threading.Thread(target=_finish_teardown, args=(proc, uid, tmp, backend), name="sandbox-teardown",
                         daemon=True).start()
    return returncode


def _finish_teardown(proc, uid: int | None, tmp: str | None, backend: str) -> None:
    """The rest of a teardown that outlasted its job: reap, sweep until no process of the uid is left, release."""
    if proc is not None:
        proc.wait()
    while uid is not None and not sweep_uid(uid, 5.0):
        time.sleep(0.5)
    _release(uid, tmp, backend)


def _release(uid: int | None, tmp: str | None, backend: str) -> None:
    if uid is not None and backend == "rlimit":
        remove_owned(uid)
    if uid is not None:
        clear_keys(uid)
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    if uid is not None:
        UIDS.give(uid)
