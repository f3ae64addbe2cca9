"""No job can reach another: every honest job's result in a batch equals its result when run alone, whatever
the jobs beside it do.

Hostile neighbours return a right answer after trying to change what later jobs of their slot (or of their
pooled uid) inherit or see: the zygote's limits, priority, scheduling, affinity and I/O priority, the scheduler
autogroup, the shared dirs' mode, times and extended attributes, the IPC namespace's settings, kernel keys, sockets
left in the network namespace. Honest jobs fork, open
files, write in /work, and one observer reports all of that state as a job sees it. Each batch interleaves
hostile and honest jobs on two workers, so warm slots are reused after hostile jobs.
"""

from __future__ import annotations

import platform

import pytest

from sage.configs.schema import SandboxConfig
from sage.engines.verify.child import _seccomp_program
from sage.engines.verify.sandbox import Job, Sandbox, available_backends

BACKENDS = available_backends()
X86 = platform.machine() == "x86_64"
RIGHT = "    return sorted(x)[::-1]\n"

HOSTILE = {
    "prlimit_zygote": "import resource\ndef f(x):\n    for r in (resource.RLIMIT_NPROC, resource.RLIMIT_NOFILE):\n"
                      "        try:\n            resource.prlimit(1, r, (3, 3))\n        except OSError:\n"
                      "            pass\n" + RIGHT,
    "prlimit_every_pid": "import os, resource\ndef f(x):\n    for p in os.listdir('/proc'):\n"
                         "        if p.isdigit() and int(p) != os.getpid():\n            try:\n"
                         "                resource.prlimit(int(p), resource.RLIMIT_AS, (1 << 22, 1 << 22))\n"
                         "            except OSError:\n                pass\n" + RIGHT,
    "nice_user": "import os\ndef f(x):\n"
                 "    for which, who in ((os.PRIO_USER, 0), (os.PRIO_PGRP, 0), (os.PRIO_PROCESS, 1)):\n"
                 "        try:\n            os.setpriority(which, who, 19)\n        except OSError:\n"
                 "            pass\n" + RIGHT,
    "affinity_and_policy": "import os\ndef f(x):\n    try:\n        os.sched_setaffinity(1, {0})\n"
                           "    except OSError:\n        pass\n    try:\n"
                           "        os.sched_setscheduler(1, os.SCHED_IDLE, os.sched_param(0))\n"
                           "    except OSError:\n        pass\n" + RIGHT,
    "ioprio_user": "import ctypes\ndef f(x):\n    libc = ctypes.CDLL(None)\n"
                   "    libc.syscall(251, 3, 0, (3 << 13) | 7)  # ioprio_set(IOPRIO_WHO_USER, 0, idle)\n" + RIGHT,
    "shared_dirs": "import os\ndef f(x):\n    for d in ('/work', '/tmp'):\n"
                   "        for act in (lambda: os.chmod(d, 0),\n"
                   "                    lambda: os.utime(d, (1, 1)),\n"
                   "                    lambda: os.setxattr(d, 'user.mark', b'1')):\n"
                   "            try:\n                act()\n"
                   "            except OSError:\n                pass\n" + RIGHT,
    "ipc_sysctl": "def f(x):\n    for name in ('shmmni', 'msgmni', 'sem'):\n        try:\n"
                  "            value = '7' if name != 'sem' else '1 2 3 4'\n"
                  "            open('/proc/sys/kernel/' + name, 'w').write(value)\n"
                  "        except OSError:\n            pass\n" + RIGHT,
    "kernel_key": "import ctypes\ndef f(x):\n    libc = ctypes.CDLL(None)\n"
                  "    for ring in (-4, -5, -3):  # user, user session, session keyring\n"
                  "        libc.syscall(248, b'user', b'planted', b'v', 1, ctypes.c_int(ring))\n" + RIGHT,
    "hostname": "import ctypes\ndef f(x):\n    ctypes.CDLL(None).sethostname(b'pwned', 5)\n" + RIGHT,
    "autogroup": "import ctypes\ndef f(x):\n"
                 "    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # dumpable: /proc/self is ours\n"
                 "    try:\n        open('/proc/self/autogroup', 'w').write('19')\n    except OSError:\n"
                 "        pass\n" + RIGHT,
    "time_wait": "import socket\ndef f(x):\n    try:\n        srv = socket.socket()\n"
                 "        srv.bind(('127.0.0.1', 40001))\n        srv.listen()\n"
                 "        cli = socket.create_connection(('127.0.0.1', 40001))\n        conn, _ = srv.accept()\n"
                 "        conn.close()  # the side that closes first keeps the port in TIME_WAIT\n"
                 "        cli.close()\n        srv.close()\n    except OSError:\n        pass\n" + RIGHT,
}
if not X86:  # the raw syscall numbers above are x86_64's
    HOSTILE = {k: v for k, v in HOSTILE.items() if k not in ("ioprio_user", "kernel_key")}

HONEST = {
    "sort": "def f(x):\n" + RIGHT,
    "fork": "import os\ndef f(x):\n    r, w = os.pipe()\n    pids = []\n    for i in range(8):\n"
            "        pid = os.fork()\n        if pid == 0:\n            os.write(w, b'x')\n            os._exit(0)\n"
            "        pids.append(pid)\n    for pid in pids:\n        os.waitpid(pid, 0)\n"
            "    return [len(os.read(r, 64)), sorted(x)]\n",
    "files": "import os, tempfile\ndef f(x):\n    fs = [tempfile.TemporaryFile() for _ in range(20)]\n"
             "    open('out.txt', 'w').write(str(x))\n    text = open('out.txt').read()\n"
             "    os.remove('out.txt')\n    return [len(fs), text]\n",
    "memory": "def f(x):\n    block = bytearray(200 << 20)\n    return [len(block), x]\n",
    "observer": "import os, resource\ndef f(x):\n"
                "    def read(p):\n        try:\n            return open(p).read()\n        except OSError as e:\n"
                "            return type(e).__name__\n"
                "    dirs = {}\n    for d in ('/work', '/tmp'):\n        if not os.path.isdir(d):\n"
                "            continue\n        st = os.stat(d)\n"
                "        dirs[d] = [oct(st.st_mode), st.st_uid, int(st.st_atime) == 1 or int(st.st_mtime) == 1,\n"
                "                   sorted(os.listxattr(d))]\n"
                "    return [sorted((n, resource.getrlimit(getattr(resource, n))) for n in dir(resource)\n"
                "                   if n.startswith('RLIMIT_')),\n"
                "            os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0),\n"
                "            sorted(os.sched_getaffinity(0)), dirs,\n"
                "            [k for k in read('/proc/keys').splitlines() if k.split()[7:8] != ['keyring']],\n"
                "            os.uname().nodename, read('/proc/self/autogroup').split()[-1:],\n"
                "            [read('/proc/sys/kernel/' + n) for n in ('shmmni', 'msgmni', 'sem')],\n"
                "            {'net': [len(read('/proc/net/' + n).splitlines())\n"
                "                     for n in ('tcp', 'tcp6', 'udp', 'unix')]}]\n",
}
ARGS = [[[3, 1, 2]]]


def _private(backend: str, outputs: list) -> list:
    """What the job's result should not share with other jobs: on rlimit, which has no network namespace, the
    host's sockets are everyone's, so the observer's socket counts are left out."""
    if backend == "rlimit" and outputs and type(outputs[0]) is list and outputs[0] and type(outputs[0][-1]) is dict:
        return [outputs[0][:-1]]
    return outputs


def _sandbox(backend: str, workers: int) -> Sandbox:
    return Sandbox(SandboxConfig(backend=backend, workers=workers, timeout_s=10, memory_mb=512))


@pytest.fixture(scope="module", params=BACKENDS)
def alone(request):
    """Each honest job's result run alone, on a fresh sandbox (one job: a one-job child)."""
    backend = request.param
    results = {name: _sandbox(backend, 1).execute([Job(code, "f", ARGS)])[0] for name, code in HONEST.items()}
    for name, res in results.items():
        assert res.status == "ok", (backend, name, res.status, res.errors, res.stderr[-500:])
    return backend, {name: res.outputs for name, res in results.items()}


@pytest.mark.parametrize("hostile", sorted(HOSTILE))
def test_honest_jobs_are_untouched_by_their_neighbours(alone, hostile):
    backend, expected = alone
    hostile_job = (None, Job(HOSTILE[hostile], "f", ARGS))
    honest = [(name, Job(code, "f", ARGS)) for name, code in HONEST.items()]
    batch = [hostile_job, *honest, *honest, hostile_job, *honest]  # slots reused after each hostile job
    results = _sandbox(backend, 2).execute([job for _, job in batch])
    for (name, _), res in zip(batch, results):
        if name is None:
            assert res.outputs == [[3, 2, 1]], (res.status, res.errors)  # the neighbour itself passes
        else:
            assert (res.status, _private(backend, res.outputs)) == ("ok", _private(backend, expected[name])), \
                (backend, hostile, name, res.errors)


@pytest.mark.parametrize("own_pid", [None, 4242])
def test_the_seccomp_program_jumps_stay_inside_it(own_pid):
    """Every jump of the filter lands on an instruction of the program, and every path ends in a return."""
    for machine in ("x86_64", "aarch64"):
        program = _seccomp_program(machine, own_pid)
        assert program is not None
        for i, (code, jt, jf, _) in enumerate(program):
            if code in (0x15, 0x35):
                assert i + 1 + max(jt, jf) < len(program)
        assert program[-1][0] == 0x06
    assert _seccomp_program("sparc") is None


@pytest.mark.skipif(not X86, reason="raw x86_64 syscall numbers")
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_filter_denies_keys_and_other_processes_but_not_the_job_itself(backend):
    code = ("import ctypes, os, resource\ndef f():\n    libc = ctypes.CDLL(None, use_errno=True)\n"
            "    key = libc.syscall(248, b'user', b'k', b'v', 1, ctypes.c_int(-4))\n"
            "    err = ctypes.get_errno()\n"
            "    resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))\n"
            "    os.setpriority(os.PRIO_PROCESS, 0, 5)\n    os.sched_setaffinity(0, os.sched_getaffinity(0))\n"
            "    os.setpriority(os.PRIO_PROCESS, os.getpid(), 5)\n"
            "    os.sched_setaffinity(os.getpid(), os.sched_getaffinity(0))\n"
            "    def allowed(pid):\n        try:\n            os.setpriority(os.PRIO_PROCESS, pid, 6)\n"
            "            return 'allowed'\n        except PermissionError:\n            return 'denied'\n"
            "    child = os.fork()\n    if child == 0:\n        os._exit(0)\n"
            "    other = [allowed(child), allowed(1)]\n    os.waitpid(child, 0)\n"
            "    return [key, err, resource.getrlimit(resource.RLIMIT_NOFILE), os.getpriority(os.PRIO_PROCESS, 0), "
            "other]\n")
    res = _sandbox(backend, 1).execute([Job(code, "f", [[]])])[0]
    assert res.status == "ok", (res.errors, res.stderr[-500:])
    # EPERM for the key; its own settings do change, by 0 or by its own pid; in a pid namespace its own child's
    # too, never pid 1 (a slot's zygote); without one (rlimit) no other process's
    child = "denied" if backend == "rlimit" else "allowed"
    assert res.outputs[0] == [-1, 1, (32, 32), 5, [child, "denied"]]


def test_the_work_dir_is_not_the_jobs_to_change():
    """/work is root-owned and sticky like /tmp on every backend with a private root."""
    for backend in [b for b in BACKENDS if b != "rlimit"]:
        res = _sandbox(backend, 1).execute([Job("import os\ndef f():\n    st = os.stat('/work')\n"
                                                "    return [oct(st.st_mode & 0o7777), st.st_uid == os.getuid()]\n",
                                                "f", [[]])])[0]
        assert res.outputs[0] == ["0o1777", False], (backend, res.outputs, res.errors)

