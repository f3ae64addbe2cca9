"""Warm slots: the jobs of one `execute` call share a zygote only while nothing a job did is left over.

Each job reports the start time of its pid namespace's pid 1 (the slot's zygote), so the tests see whether a
job ran in the same slot as the one before it. A job that leaves a file, a process or a SysV shared memory
segment gets its slot replaced, and the next job sees none of it; clean jobs keep their slot.
"""

from __future__ import annotations

import pytest

from sage.configs.schema import SandboxConfig
from sage.engines.verify.sandbox import Job, Sandbox, available_backends

BACKENDS = [b for b in available_backends() if b != "rlimit"]
ZYGOTE = "def zygote():\n    return open('/proc/1/stat').read().rsplit(')', 1)[1].split()[19]\n"
CLEAN = ZYGOTE + "def f():\n    return (zygote(), sorted(__import__('os').listdir('/tmp')))\n"
LEAVE_FILE = ZYGOTE + "def f():\n    open('/tmp/left-behind', 'w').write('x')\n    return (zygote(), [])\n"
LEAVE_PROCESS = ZYGOTE + ("import os, time\ndef f():\n    if os.fork() == 0:\n        os.setsid()\n"
                          "        time.sleep(60)\n        os._exit(0)\n    return (zygote(), [])\n")
LEAVE_SHM = ZYGOTE + ("import ctypes\ndef f():\n    libc = ctypes.CDLL(None, use_errno=True)\n"
                      "    assert libc.shmget(4242, 4096, 0o1666) >= 0, ctypes.get_errno()\n"
                      "    return (zygote(), [])\n")
LEAVE_MTIME = ZYGOTE + ("import os\ndef f():\n    open('/tmp/gone', 'w').close()\n    os.remove('/tmp/gone')\n"
                        "    return (zygote(), [])\n")  # nothing left, but /tmp's mtime tells a job ran here
SEE_SHM = ZYGOTE + ("import ctypes\ndef f():\n    libc = ctypes.CDLL(None)\n"
                    "    return (zygote(), [] if libc.shmget(4242, 0, 0o666) < 0 else ['shm'])\n")
SEE_PROCESSES = ZYGOTE + ("import os\ndef f():\n    return (zygote(), sorted(p for p in os.listdir('/proc') "
                          "if p.isdigit() and int(p) not in (1, os.getpid())))\n")
MQUEUE = ("import ctypes\ndef f():\n    rt = ctypes.CDLL('librt.so.1', use_errno=True)\n"
          "    return rt.mq_open(b'/sage-left', 0o100 | 2, 0o600, None)\n")


def _run(backend: str, codes: list[str]) -> list:
    results = Sandbox(SandboxConfig(backend=backend, workers=1, timeout_s=10)).execute(
        [Job(code, "f", [[]]) for code in codes])
    assert all(r.status == "ok" for r in results), [(r.status, r.errors, r.stderr[-300:]) for r in results]
    return [r.outputs[0] for r in results]


@pytest.mark.parametrize("backend", BACKENDS)
def test_clean_jobs_share_a_slot(backend):
    outs = _run(backend, [CLEAN] * 4)
    assert len({zygote for zygote, _ in outs}) == 1
    assert all(files == [] for _, files in outs)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("leave,see", [(LEAVE_FILE, CLEAN), (LEAVE_PROCESS, SEE_PROCESSES), (LEAVE_SHM, SEE_SHM),
                                       (LEAVE_MTIME, CLEAN)], ids=["file", "process", "sysv_shm", "mtime"])
def test_a_job_that_leaves_something_gets_its_slot_replaced(backend, leave, see):
    (before, _), (after, seen), (again, _) = _run(backend, [leave, see, CLEAN])
    assert after != before, "the next job ran in the slot that was left dirty"
    assert seen == [], seen
    assert again == after  # and the fresh slot is kept while clean


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_posix_message_queue(backend):
    """POSIX message queues would outlive a job in its slot's IPC namespace unseen: RLIMIT_MSGQUEUE is 0."""
    res = Sandbox(SandboxConfig(backend=backend, workers=1)).execute([Job(MQUEUE, "f", [[]])])[0]
    assert res.status == "ok" and res.outputs == [-1], (res.status, res.outputs, res.errors)


@pytest.mark.parametrize("backend", BACKENDS)
def test_jobs_of_one_slot_draw_different_random_numbers(backend):
    """The zygote imports `random` for every job; each job still starts from a seed of its own, so a reference
    solution that draws random numbers is found nondeterministic when it runs twice in one slot."""
    code = ZYGOTE + "import random\ndef f():\n    return (zygote(), [random.random()])\n"
    outs = _run(backend, [code] * 3)
    assert len({z for z, _ in outs}) == 1, "the jobs should share one warm slot"
    assert len({draws[0] for _, draws in outs}) == 3
