"""The sandbox attack suite, run through every backend that works on this machine, plus the
type-aware equality and the typed codec.

Each attack is one job in a parallel batch per backend (with a benign bystander job). Every case asserts:
not credited (score 0 against what a successful attack would return), the parent alive, no process of
the sandbox left behind (no process of the uids this test process used, no stray child of ours), and
finished by the time limit's wall-clock ceiling (`clock.WALL_FACTOR` limits) plus 1 s, teardown included
(`ExecResult.duration_s` is taken after it); one stopped by its limit was charged little more CPU than it.
Side-effect attacks also check their target (decoy process alive, marker files absent). The `rlimit` backend
has no filesystem or network isolation; the cases it cannot pass are strict xfails, so they document the limit
and fail loudly if that changes.
"""

from __future__ import annotations

import atexit
import math
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from functools import cache
from pathlib import Path

import psutil
import pytest

from bench.orphans import running  # one helper for the tests and the benchmark that watch processes exit
from sage.configs.schema import SandboxConfig
from sage.engines.verify.child import Opaque, decode_value, encode_value
from sage.engines.verify.clock import WALL_FACTOR
from sage.engines.verify.isolation import UIDS
from sage.engines.verify.outputs import outputs_equal, reference_outputs, score_outputs
from sage.engines.verify.sandbox import ExecResult, Job, Sandbox, available_backends

BACKENDS = available_backends()
TIMEOUT_S = 2.0
CFG = dict(timeout_s=TIMEOUT_S, cpu_s=2, memory_mb=512, max_output_bytes=1_000_000, max_procs=32, workers=8)
ROOT = Path(__file__).resolve().parents[3]
SECRET = "s3cr3t-" + secrets.token_hex(8)  # in the parent's environment and served on 127.0.0.1
UNKNOWN = "unknown-" + secrets.token_hex(8)  # expected output never shown to the sandbox
OUT_DIR = Path(tempfile.mkdtemp(prefix="sage-attack-"))  # world-writable, in the host /tmp
OUT_DIR.chmod(0o777)
atexit.register(shutil.rmtree, OUT_DIR, True)
os.environ["SAGE_SANDBOX_SECRET"] = SECRET

# Each attack: name -> (code, expected output of the one test input). `f` is the entry point; it is
# called once with no arguments. The placeholders below are filled in per run.
ATTACKS: dict[str, tuple[str, object]] = {
    "infinite_loop": ("def f():\n    while True:\n        pass\n    return 'PWNED'\n", "PWNED"),
    "sleep": ("import time\ndef f():\n    time.sleep(100)\n    return 'PWNED'\n", "PWNED"),
    "ignore_signals": (
        "import signal\nfor s in (signal.SIGALRM, signal.SIGTERM, signal.SIGXCPU, signal.SIGINT, signal.SIGHUP):\n"
        "    signal.signal(s, signal.SIG_IGN)\n"
        "def f():\n    while True:\n        pass\n    return 'PWNED'\n", "PWNED"),
    "memory_bomb": (
        "def f():\n    hoard = []\n    try:\n        while True:\n            hoard.append(bytearray(10**7))\n"
        "    except MemoryError:\n        pass\n"
        "    return 'PWNED' if len(hoard) > 200 else len(hoard)\n", "PWNED"),
    "fork_bomb": (
        "import os\ndef f():\n    n = 0\n    for _ in range(10000):\n        try:\n            if os.fork() == 0:\n"
        "                while True:\n                    pass\n            n += 1\n        except OSError:\n"
        "            break\n    return 'PWNED' if n > 64 else n\n", "PWNED"),
    "thread_bomb": (
        "import threading, time\ndef f():\n    n = 0\n    try:\n        for _ in range(5000):\n"
        "            threading.Thread(target=time.sleep, args=(100,), daemon=True).start()\n            n += 1\n"
        "    except Exception:\n        pass\n    return 'PWNED' if n > 200 else n\n", "PWNED"),
    "setsid_daemon": (
        "import os, time\ndef f():\n    if os.fork() == 0:\n        os.setsid()\n        if os.fork() == 0:\n"
        "            time.sleep(1.0)\n            for p in ('__OUT__/daemon-__B__', 'daemon-__B__'):\n"
        "                try:\n                    open(p, 'w').write('alive')\n                except OSError:\n"
        "                    pass\n            time.sleep(100)\n        os._exit(0)\n    return 'daemonized'\n",
        "PWNED"),
    "inode_exhaustion": (
        "import os\ndef f():\n    n = 0\n    for d in __FILL_DIRS__:\n        try:\n"
        "            while n < __MAX_FILES__:\n"
        "                os.close(os.open(os.path.join(d, 'i%d' % n), os.O_CREAT | os.O_WRONLY, 0o600))\n"
        "                n += 1\n        except OSError:\n            pass\n    while True:\n        pass\n"
        "    return 'PWNED'\n", "PWNED"),
    "print_forever": ("def f():\n    while True:\n        print('PASS ' * 200)\n", "PWNED"),
    "huge_return": ("def f():\n    return 'x' * 50_000_000\n", "x" * 10),
    "fill_disk_one_file": (
        "import signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "def f():\n    n = 0\n    try:\n        with open('big', 'wb') as fh:\n            for _ in range(64):\n"
        "                fh.write(b'0' * (1 << 20))\n                n += 1\n    except OSError:\n        pass\n"
        "    return 'PWNED' if n > 16 else n\n", "PWNED"),
    "fill_disk_many_files": (
        "import signal, os\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "def f():\n    most = 0\n    for d in __FILL_DIRS__:\n        mb = 0\n        for i in range(5):\n"
        "            try:\n                with open(os.path.join(d, 'fill%d' % i), 'wb') as fh:\n"
        "                    for _ in range(16):\n                        fh.write(b'0' * (1 << 20))\n"
        "                        mb += 1\n            except OSError:\n                pass\n"
        "        most = max(most, mb)\n"
        "    return 'PWNED' if most > 64 else most\n", "PWNED"),
    "write_outside": (
        "def f():\n    done = []\n"
        "    for p in ('__ROOT__/PWNED-__B__', '__OUT__/outside-__B__', '/usr/PWNED', '/PWNED'):\n"
        "        try:\n            open(p, 'w').write('x')\n            done.append(p)\n        except OSError:\n"
        "            pass\n    return 'PWNED' if done else done\n", "PWNED"),
    "env_secret": ("import os\ndef f():\n    return os.environ.get('SAGE_SANDBOX_SECRET')\n", SECRET),
    "proc_environ": (
        "import os, re\ndef f():\n    for pid in (__PARENT__, os.getppid(), 1):\n        try:\n"
        "            m = re.search(rb'SAGE_SANDBOX_SECRET=([^\\x00]*)', open('/proc/%d/environ' % pid, 'rb').read())\n"
        "            if m:\n                return m.group(1).decode()\n        except OSError:\n            pass\n",
        SECRET),
    "read_project_file": ("def f():\n    return open('__ROOT__/pyproject.toml').read()\n",
                          (ROOT / "pyproject.toml").read_text()),
    "connect_localhost": (
        "import socket\ndef f():\n    s = socket.create_connection(('127.0.0.1', __PORT__), timeout=1)\n"
        "    return s.recv(100).decode()\n", SECRET),
    "kill_parent": (
        "import os, signal\ndef f():\n    hit = []\n    for pid in (__PARENT__, __DECOY__, os.getppid()):\n"
        "        try:\n            os.kill(pid, signal.SIGKILL)\n            hit.append(pid)\n        except OSError:\n"
        "            pass\n    return 'PWNED' if (__PARENT__ in hit or __DECOY__ in hit) else hit\n", "PWNED"),
    "kill_all": ("import os, time\ndef f():\n    os.kill(-1, 9)\n    time.sleep(0.3)\n    return 'survived'\n",
                 "PWNED"),
    "sys_exit_at_import": ("import sys\nsys.exit(0)\ndef f():\n    return 'PWNED'\n", "PWNED"),
    "os_exit_at_import": ("import os\nos._exit(0)\ndef f():\n    return 'PWNED'\n", "PWNED"),
    "fake_pass": (
        "print('PASS'); print('All tests passed'); print('{\"status\": \"ok\", \"passed\": true}')\n"
        "def f():\n    print('__UNKNOWN_HINT__ PASS')\n    return 'wrong'\n", UNKNOWN),
    "forged_record": (
        "import os, sys\ndef f():\n    nonce = sys._getframe(1).f_locals.get('nonce') or b'0' * 32\n"
        "    for body in (b'[\"out\",0,true]', b'[\"end\"]'):\n"
        "        rec = nonce + b' ' + str(len(body)).encode() + b'\\n' + body\n        for fd in range(3, 40):\n"
        "            try:\n                os.write(fd, rec)\n                os.write(fd, b'PASS 1.0\\n')\n"
        "            except OSError:\n                pass\n    return 'wrong'\n", UNKNOWN),
    "forged_record_then_exit": (
        "import os, sys\ndef f():\n    nonce = sys._getframe(1).f_locals.get('nonce') or b'0' * 32\n"
        "    for body in (b'[\"out\",0,{\"t\":\"bool\",\"v\":true}]', b'[\"end\"]'):\n"
        "        rec = nonce + b' ' + str(len(body)).encode() + b'\\n' + body\n        for fd in range(3, 40):\n"
        "            try:\n                os.write(fd, rec)\n            except OSError:\n                pass\n"
        "    os._exit(0)\n", UNKNOWN),
    "monkeypatch_json": (
        "import json, json.encoder, builtins\n"
        "json.dumps = lambda *a, **k: '\"PWNED\"'\njson.JSONEncoder.encode = lambda self, o: '\"PWNED\"'\n"
        "json.encoder.c_make_encoder = None\njson.encoder.encode_basestring_ascii = lambda s: '\"PWNED\"'\n"
        "builtins.repr = lambda o: 'PWNED'\n"
        "def f():\n    return 'wrong'\n", UNKNOWN),
    "eq_always_true": (
        "class Liar:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
        "    def __repr__(self):\n        return repr('__UNKNOWN_HINT__')\n"
        "class LyingInt(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
        "def f():\n    return [Liar(), LyingInt(0)]\n", [UNKNOWN, 0]),
    "caller_frame_and_gc": (
        "import gc, sys\ndef f():\n    seen = []\n    fr = sys._getframe(1)\n    while fr:\n"
        "        seen += [v for v in fr.f_locals.values() if isinstance(v, (str, bytes))]\n        fr = fr.f_back\n"
        "    for o in gc.get_objects():\n        if isinstance(o, dict):\n"
        "            seen += [v for v in o.values() if isinstance(v, str) and v.startswith('unknown-')]\n"
        "    hits = [s for s in seen if isinstance(s, str) and s.startswith('unknown-')]\n"
        "    return hits[0] if hits else 'nothing'\n", UNKNOWN),
    "raise_rlimits": (
        "import resource\ndef f():\n    raised = []\n"
        "    for r in (resource.RLIMIT_CPU, resource.RLIMIT_AS, resource.RLIMIT_NPROC,\n"
        "              resource.RLIMIT_FSIZE, resource.RLIMIT_NOFILE):\n        try:\n"
        "            soft, hard = resource.getrlimit(r)\n"
        "            resource.setrlimit(r, (hard * 2 + 1000, hard * 2 + 1000))\n"
        "            raised.append(r)\n        except (ValueError, OSError):\n            pass\n"
        "    return 'PWNED' if raised else raised\n", "PWNED"),
    "ctypes": (
        "import ctypes\ndef f():\n    libc = ctypes.CDLL(None, use_errno=True)\n    ok = []\n"
        "    if libc.setuid(0) == 0:\n        ok.append('setuid')\n    if libc.kill(__DECOY__, 9) == 0:\n"
        "        ok.append('kill')\n    if libc.kill(__PARENT__, 9) == 0:\n        ok.append('kill parent')\n"
        "    if ok:\n        return 'PWNED'\n    ctypes.string_at(0)\n", "PWNED"),
    "json_py_in_workdir": (
        "import os, sys\nsrc = 'dumps = lambda *a, **k: \"PWNED\"\\nloads = lambda *a, **k: \"PWNED\"\\n'\n"
        "for d in (os.getcwd(),):\n    try:\n        open(os.path.join(d, 'json.py'), 'w').write(src)\n"
        "    except OSError:\n        pass\nsys.modules.pop('json', None)\nsys.path.insert(0, os.getcwd())\n"
        "import json\ndef f():\n    return 'wrong'\n", UNKNOWN),
    "crash_interpreter": ("import faulthandler\ndef f():\n    faulthandler._sigsegv()\n    return 'PWNED'\n", "PWNED"),
    "crash_recursion": (
        "import sys\nsys.setrecursionlimit(10**7)\ndef g(n):\n    return g(n + 1) + 1\n"
        "def f():\n    return g(0)\n", "PWNED"),
}
BYSTANDER = ("def f():\n    return sum(range(10))\n", 45)

# Cases the plain-rlimit backend cannot win: it has no mount, pid or network namespace.
RLIMIT_XFAIL = {
    "write_outside": "no filesystem isolation: the host's world-writable /tmp is writable",
    "read_project_file": "no filesystem isolation: world-readable project files are readable",
    "connect_localhost": "no network namespace",
    "fill_disk_many_files": "the work dir is on the host disk: only RLIMIT_FSIZE per file applies",
}


def _listener() -> int:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
                conn.sendall(SECRET.encode())
                conn.close()
            except OSError:
                return

    threading.Thread(target=serve, daemon=True).start()
    return srv.getsockname()[1]


PORT = _listener()


def _fill(code: str, backend: str, decoy: int) -> str:
    for key, value in {"__PARENT__": os.getpid(), "__DECOY__": decoy, "__ROOT__": ROOT, "__OUT__": OUT_DIR,
                       "__PORT__": PORT, "__B__": backend, "__UNKNOWN_HINT__": "unknown-",
                       # the rlimit backend shares the host's /tmp and /dev/shm: do not litter them
                       "__FILL_DIRS__": ('.',) if backend == "rlimit" else ('.', '/tmp', '/dev/shm'),
                       # ... nor its disk's inodes: there the work dir is a host directory
                       "__MAX_FILES__": 20_000 if backend == "rlimit" else 10**8}.items():
        code = code.replace(key, str(value))
    return code


def _our_uids() -> set[int]:
    return set(UIDS._locks)


def _sandbox_processes() -> list[int]:
    uids = _our_uids()
    found = []
    for p in psutil.process_iter(["uids", "status"]):
        try:
            if p.info["uids"] and p.info["uids"].real in uids and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        except psutil.Error:
            continue
    return found


@cache
def _decoy() -> subprocess.Popen:
    """A root-owned bystander process the attacks try to kill (one for the whole module)."""
    proc = subprocess.Popen(["sleep", "600"])
    atexit.register(proc.kill)
    return proc


@cache
def run_backend(backend: str) -> dict:
    decoy = _decoy()
    names = list(ATTACKS)
    jobs = [Job(_fill(ATTACKS[n][0], backend, decoy.pid), "f", [[]]) for n in names]
    jobs.append(Job(BYSTANDER[0], "f", [[]]))
    # what ran before the batch (a session's Prefect server, started by an earlier test) is no attack's leftover
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    start = time.monotonic()
    results = Sandbox(SandboxConfig(backend=backend, **CFG)).execute(jobs)
    batch_s = time.monotonic() - start
    time.sleep(1.5)  # give a surviving daemon time to write its marker
    return {"results": dict(zip(names + ["bystander"], results)), "decoy": decoy, "batch_s": batch_s,
            "leftover": _sandbox_processes(),
            "children": [pid for pid, cmd in running(psutil.Process().children(recursive=True)) if pid != decoy.pid
                         and pid not in before and "sage.engines.verify.mathcheck" not in " ".join(cmd)]}


def _cases():
    for backend in BACKENDS:
        for name in ATTACKS:
            marks = [pytest.mark.xfail(strict=True, reason=RLIMIT_XFAIL[name])] \
                if backend == "rlimit" and name in RLIMIT_XFAIL else []
            yield pytest.param(backend, name, id=f"{backend}-{name}", marks=marks)


def test_some_backend_available():
    assert BACKENDS, "no sandbox backend works here"
    assert BACKENDS[0] == Sandbox(SandboxConfig()).backend


@pytest.mark.parametrize("backend,name", list(_cases()))
def test_attack(backend, name):
    run = run_backend(backend)
    res: ExecResult = run["results"][name]
    expected = ATTACKS[name][1]
    score, passed = score_outputs([expected], res)
    assert score == 0.0 and passed == [False], (res.status, res.outputs, res.errors)
    assert res.backend == backend
    # the kill lands within a second of the ceiling; on a loaded 2-core machine scheduling alone has delayed a kill
    # by 0.58 s (2.58 s at a 2 s wall-clock limit in a full test run)
    assert res.duration_s <= WALL_FACTOR * TIMEOUT_S + 1.0, res.duration_s
    if res.cpu_s is not None:  # stopped by its time limit: charged at most a little more CPU than the limit
        assert res.cpu_s <= TIMEOUT_S + 0.5, res.cpu_s
    assert psutil.pid_exists(os.getpid())
    assert run["decoy"].poll() is None, "decoy process was killed"
    assert not run["leftover"], f"sandbox processes left behind: {run['leftover']}"
    assert not run["children"], f"stray child processes: {run['children']}"
    _check_side_effects(name, res, backend)


def _check_side_effects(name: str, res: ExecResult, backend: str) -> None:
    if name == "setsid_daemon":
        assert not (OUT_DIR / f"daemon-{backend}").exists()
    if name == "write_outside":
        assert not (ROOT / f"PWNED-{backend}").exists() and not (OUT_DIR / f"outside-{backend}").exists()
        assert not Path("/PWNED").exists() and not Path("/usr/PWNED").exists()
    if name in ("infinite_loop", "sleep", "ignore_signals", "inode_exhaustion"):
        assert res.status == "timeout"
    if name in ("print_forever", "huge_return"):
        assert res.status == "output_limit"
    if name in ("sys_exit_at_import",):
        assert res.status == "error" and res.errors[0].startswith("SystemExit")
    if name in ("os_exit_at_import", "crash_interpreter"):
        assert res.status == "crashed"
    if name == "crash_recursion":  # 3.11 recursion is heap-bound: a crash, the memory cap or the deadline
        assert res.status in ("crashed", "memory", "timeout")
    if name in ("monkeypatch_json", "json_py_in_workdir", "fake_pass"):
        assert res.status == "ok" and res.outputs == ["wrong"]  # the child's own encoder was untouched
    if name == "eq_always_true" and res.status != "timeout":  # a loaded machine may not finish it: it scores 0 all
        # the same: the object is only its repr, the int subclass its int value, its `__eq__` never called
        liar, lying_int = res.outputs[0]
        assert isinstance(liar, Opaque) and type(lying_int) is int and lying_int == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_bystander_and_batch(backend):
    run = run_backend(backend)
    res = run["results"]["bystander"]
    assert res.status == "ok" and score_outputs([BYSTANDER[1]], res) == (1.0, [True])
    # timeouts ran in parallel: the batch took far less than the sum of its limits
    assert run["batch_s"] < TIMEOUT_S * len(ATTACKS) / 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_nondeterministic_reference_is_rejected(backend):
    sandbox = Sandbox(SandboxConfig(backend=backend, timeout_s=5, workers=4))
    jobs = [Job("import random\ndef f(x):\n    return x + random.random()\n", "f", [[1], [2]]),
            Job("import time\ndef f(x):\n    return time.time_ns() + x\n", "f", [[1]]),
            Job("def f(x):\n    return [x, x * 2]\n", "f", [[1], [3]])]
    refs = reference_outputs(sandbox, jobs)
    assert refs[0] is None and refs[1] is None
    assert refs[2] == [[1, 2], [3, 6]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_partial_credit_and_errors(backend):
    sandbox = Sandbox(SandboxConfig(backend=backend, timeout_s=5))
    res = sandbox.execute([Job("def f(x):\n    return 10 // x\n", "f", [[1], [0], [5], [3]])])[0]
    assert res.status == "error"
    assert res.errors[1].startswith("ZeroDivisionError") and res.outputs[1] is None
    score, passed = score_outputs([10, 0, 2, 4], res)
    assert passed == [True, False, True, False] and score == 0.5


# ------------------------------------------------------------------------------------------ equality


@pytest.mark.parametrize("expected,actual,equal", [
    (1, 1, True), (1, 2, False), (True, 1, False), (1, True, False), (False, 0, False), (True, True, True),
    (0.1 + 0.2, 0.3, True), (1.0, 1.0000001, True), (1e9, 1e9 + 1, True), (1.0, 1.01, False), (2, 2.0, True),
    (0.0, 1e-7, True), (float("nan"), float("nan"), True), (float("nan"), 1.0, False),
    (float("inf"), float("inf"), True), (float("inf"), -float("inf"), False),
    ((1, 2), [1, 2], True), ([1, [2, (3,)]], (1, (2, [3])), True), ([1, 2], [2, 1], False), ([1], [1, 1], False),
    ({1, 2}, {2, 1}, True), ({1.0, 2.0}, {2.0000000001, 1}, True), ({1, 2}, [1, 2], False),
    ({"a": 1, 2: [1.0]}, {2: (1,), "a": 1}, True), ({"a": 1}, {"a": True}, False), ({"a": 1}, {"b": 1}, False),
    ("abc", "abc", True), ("abc", "ABC", False), ("1", 1, False), (None, None, True), (None, 0, False),
    ([None], [0], False), (b"x", b"x", True), (b"x", "x", False), (1 + 2j, complex(1, 2.0000000001), True),
    (2**100, 2**100, True), (2**100, 2**100 + 1, False), (Opaque("A", "1"), Opaque("A", "1"), False),
    (1, Opaque("int", "1"), False),
])
def test_outputs_equal(expected, actual, equal):
    assert outputs_equal(expected, actual) is equal


@pytest.mark.parametrize("value", [
    None, True, 0, -5, 2**80, -(2**70), 1.5, float("inf"), "ü\n\"", [1, [2]], (1, (2, [3])), {1, 2},
    frozenset({"a"}), {"k": (1, 2), 3: None, (1, 2): [True]}, b"\x00\xff", 1 - 2j, [], (), {},
])
def test_codec_round_trip(value):
    import json

    back = decode_value(json.loads(json.dumps(encode_value(value))))
    assert outputs_equal(value, back) and type(back) is type(value) or isinstance(value, frozenset)


def test_codec_nan_and_opaque():
    import json

    assert math.isnan(decode_value(json.loads(json.dumps(encode_value(float("nan"))))))
    assert isinstance(decode_value(json.loads(json.dumps(encode_value(object())))), Opaque)


def test_score_outputs_counts_missing_and_errors():
    res = ExecResult([1, None, 3], [None, "timeout", None], "timeout", "rlimit", 0.1, "", "")
    assert score_outputs([1, None, 4, 5], res) == (0.25, [True, False, False, False])
    assert score_outputs([], res)[0] == 0.0


def test_execute_from_a_thread_and_budget_is_shared():
    sandbox = Sandbox(SandboxConfig(timeout_s=10, max_output_bytes=100_000))
    out = []
    job = Job("def f(n):\n    return 'y' * n\n", "f", [[10], [60_000], [60_000], [5]])
    t = threading.Thread(target=lambda: out.extend(sandbox.execute([job, job])))
    t.start()
    t.join(60)
    assert len(out) == 2
    for res in out:
        # the output budget covers the whole job: the second big value is refused, later small ones too
        assert res.outputs[:2] == ["y" * 10, "y" * 60_000] and res.outputs[2] is None
        assert res.errors[2].startswith("OutputLimit") and res.status == "output_limit"
