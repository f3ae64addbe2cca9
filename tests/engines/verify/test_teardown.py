"""A job's teardown holds its deadline even when the kernel takes long to end its processes: the caller gets
its result by then, the rest of the teardown finishes in the background, and the job's uid is not handed to
another job until no process of it remains.

The slow process is a real one: a process of the job's uid that alone holds a mount namespace with a tmpfs of
300,000 files (no inode cap), so its exit has to tear all of them down, as an inode-exhausting candidate's
did before the sandbox's tmpfs mounts capped inodes."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

import psutil
import pytest

from sage.engines.verify.isolation import IS_ROOT, UIDS, teardown

FILES = 300_000
HOLD = ('mount -t tmpfs -o size=1g,nr_inodes=0 sage-test "$0" && cd "$0" && /usr/bin/python3 -c "'
        'import os\nfor i in range({n}):\n    os.close(os.open(str(i), os.O_CREAT | os.O_WRONLY, 0o600))\n'
        '" && cd / && exec setpriv --reuid={uid} --regid={uid} --clear-groups sleep 600')


def _processes_of(uid: int) -> list[int]:
    return [p.pid for p in psutil.process_iter(["uids", "status"])
            if p.info["uids"] and p.info["uids"].real == uid and p.info["status"] != psutil.STATUS_ZOMBIE]


def test_teardown_returns_by_its_deadline_and_keeps_a_busy_uid_out_of_the_pool():
    if not IS_ROOT or not all(shutil.which(t) for t in ("setpriv", "unshare", "mount")):
        pytest.skip("dedicated sandbox uids and tmpfs mounts need root, setpriv, unshare and mount")
    uid = UIDS.take()
    scratch = tempfile.mkdtemp(prefix="sage-teardown-")
    holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
                               HOLD.format(n=FILES, uid=uid), scratch], start_new_session=True)
    try:
        end = time.monotonic() + 120
        while not _processes_of(uid) and holder.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        assert _processes_of(uid), "the slow-exiting process did not start"
        start = time.monotonic()
        assert teardown(None, uid, scratch, "unshare", start + 0.1) is None
        took = time.monotonic() - start
        assert took <= 0.1 + 0.5, took
        assert _processes_of(uid), "the kernel finished the teardown in time: nothing was left to test"
        assert uid not in UIDS._free and os.path.isdir(scratch)  # released only once the uid is clear
        end = time.monotonic() + 60
        while uid not in UIDS._free and time.monotonic() < end:
            time.sleep(0.05)
        assert uid in UIDS._free and not os.path.exists(scratch)
        assert not _processes_of(uid)
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()
