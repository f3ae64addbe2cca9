"""Jobs that change the kernel settings their warm slot's namespaces share: honest neighbours' results still equal
their results alone.

A slot's pid, IPC, network and UTS namespaces outlive each job; their settings live under /proc/sys (pid_max,
the IPC limits, the message queue limits, the network's). In a bwrap slot the job's uid is root of the user
namespace that owns them, so the kernel lets it write them; the sandbox binds /proc/sys read-only on every
backend instead (`isolation.command`, `child._enter_root`). Each hostile job returns the right answer after its
attempt; the batches interleave hostile and honest jobs on two workers, so slots are reused after them.
"""

from __future__ import annotations

import pytest

from sage.configs.schema import SandboxConfig
from sage.engines.verify.sandbox import Job, Sandbox, available_backends

AVAILABLE = available_backends()
BACKENDS = [pytest.param(b, marks=pytest.mark.skipif(b not in AVAILABLE, reason=f"{b} does not run jobs here "
                                                                                  "(not installed, or not root)"))
            for b in ("bwrap", "unshare")]
RIGHT = "    return sorted(x)[::-1]\n"
# Writes `text` to every file under each of `bases` that opens for writing (pid_max's 301 is its lowest value).
WRITE_ALL = ("import os\ndef write_all(bases, text):\n    for base in bases:\n"
             "        for root, _, files in os.walk(base):\n            for name in files:\n"
             "                try:\n                    with open(os.path.join(root, name), 'w') as f:\n"
             "                        f.write(text)\n                except OSError:\n                    pass\n")

HOSTILE = {
    # lower the pid namespace's pid_max, then use up the pids below it (leaving no process: the slot stays warm)
    "pid_max": "import os\ndef f(x):\n    try:\n        open('/proc/sys/kernel/pid_max', 'w').write('301')\n"
               "    except OSError:\n        pass\n    for _ in range(400):\n        pid = os.fork()\n"
               "        if pid == 0:\n            os._exit(0)\n        os.waitpid(pid, 0)\n" + RIGHT,
    # every file of /proc/sys, by its own path and through the job's root
    "every_sysctl": WRITE_ALL + "def f(x):\n    for text in ('301', '1', '0'):\n"
                    "        write_all(('/proc/sys', '/proc/self/root/proc/sys', '/proc/thread-self/root/proc/sys'), "
                    "text)\n" + RIGHT,
    # a user and mount namespace of the job's own: uncover /proc/sys, remount it writable, mount a proc of its own
    "nested_namespaces": WRITE_ALL + "import ctypes\ndef f(x):\n    libc = ctypes.CDLL(None, use_errno=True)\n"
                         "    uid, gid = os.getuid(), os.getgid()\n"
                         "    if libc.unshare(0x10000000 | 0x00020000) == 0:  # CLONE_NEWUSER | CLONE_NEWNS\n"
                         "        for path, text in (('/proc/self/setgroups', 'deny'),\n"
                         "                           ('/proc/self/uid_map', f'0 {uid} 1'),\n"
                         "                           ('/proc/self/gid_map', f'0 {gid} 1')):\n"
                         "            try:\n                open(path, 'w').write(text)\n"
                         "            except OSError:\n                pass\n"
                         "        libc.umount2(b'/proc/sys', 2)  # MNT_DETACH\n"
                         "        libc.mount(None, b'/proc/sys', None, 32 | 4096, None)  # MS_REMOUNT | MS_BIND\n"
                         "        libc.mount(b'proc', b'/work', b'proc', 0, None)\n"
                         "        write_all(('/proc/sys', '/work/sys'), '301')\n"
                         "        libc.umount2(b'/work', 2)\n" + RIGHT,
}

HONEST = {
    "sort": "def f(x):\n" + RIGHT,
    "processes": "import os\ndef f(x):\n    pids = []\n    for _ in range(20):\n        pid = os.fork()\n"
                 "        if pid == 0:\n            os._exit(0)\n        pids.append(pid)\n"
                 "    return [sum(os.waitpid(p, 0)[1] == 0 for p in pids), sorted(x)]\n",
    "threads": "import threading\ndef f(x):\n    out = []\n"
               "    ts = [threading.Thread(target=out.append, args=(i,)) for i in range(20)]\n"
               "    for t in ts:\n        t.start()\n    for t in ts:\n        t.join()\n"
               "    return [sorted(out) == list(range(20)), sorted(x)]\n",
    # the namespaces' settings as a job reads them, and which files of /proc/sys it could open for writing
    "observer": "import os\ndef f(x):\n    writable = []\n    for root, _, files in os.walk('/proc/sys'):\n"
                "        for name in files:\n            try:\n"
                "                os.close(os.open(os.path.join(root, name), os.O_WRONLY))\n"
                "                writable.append(name)\n            except OSError:\n                pass\n"
                "    names = ['kernel/' + n for n in ('pid_max', 'threads-max', 'shmmax', 'shmall', 'shmmni',\n"
                "             'msgmax', 'msgmnb', 'msgmni', 'sem', 'hostname', 'domainname')]\n"
                "    names += ['fs/mqueue/' + n for n in sorted(os.listdir('/proc/sys/fs/mqueue'))]\n"
                "    names += ['net/ipv4/' + n for n in ('ip_local_port_range', 'ping_group_range', 'ip_forward',\n"
                "                                        'tcp_syncookies')]\n"
                "    names += ['net/core/somaxconn']\n"
                "    return [writable, {n: open('/proc/sys/' + n).read() for n in names}]\n",
}
ARGS = [[[3, 1, 2]]]


def _sandbox(backend: str, workers: int) -> Sandbox:
    return Sandbox(SandboxConfig(backend=backend, workers=workers, timeout_s=20, memory_mb=512))


@pytest.fixture(scope="module", params=BACKENDS)
def alone(request):
    """Each honest job's result run alone, on a fresh sandbox (one job: a one-job child)."""
    backend = request.param
    results = {name: _sandbox(backend, 1).execute([Job(code, "f", ARGS)])[0] for name, code in HONEST.items()}
    for name, res in results.items():
        assert res.status == "ok", (backend, name, res.status, res.errors, res.stderr[-500:])
    assert results["observer"].outputs[0][0] == [], "a file of /proc/sys opens for writing"
    return backend, {name: res.outputs for name, res in results.items()}


@pytest.mark.parametrize("hostile", sorted(HOSTILE))
def test_honest_neighbours_of_a_kernel_settings_attack_are_untouched(alone, hostile):
    backend, expected = alone
    hostile_job = (None, Job(HOSTILE[hostile], "f", ARGS))
    honest = [(name, Job(code, "f", ARGS)) for name, code in HONEST.items()]
    batch = [hostile_job, *honest, hostile_job, *honest, *honest]  # slots reused after each hostile job
    results = _sandbox(backend, 2).execute([job for _, job in batch])
    for (name, _), res in zip(batch, results):
        if name is None:
            assert res.outputs == [[3, 2, 1]], (res.status, res.errors)  # the neighbour itself passes
        else:
            assert (res.status, res.outputs) == ("ok", expected[name]), (backend, hostile, name, res.errors)
