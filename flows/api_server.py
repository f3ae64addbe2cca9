"""The Prefect API a `sage` command reports to.

With `PREFECT_API_URL` set, the user's own server. Without it, a private temporary server for this process
(`prefect server start` on a free local port, no UI, no background services), started in its own session so
that the terminal's Ctrl-C reaches only `sage`, which then records the interruption through the still-running
API and stops the server itself; and with a parent-death signal, so the server dies with `sage` even when `sage`
is killed outright. (Prefect's own temporary server shares the terminal's process group: Ctrl-C killed it first,
and the flow then retried the dead API for minutes.)
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from sage.engines.verify.isolation import die_with_parent

STARTUP_TIMEOUT_S = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(proc: subprocess.Popen, url: str) -> None:
    import httpx

    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the temporary Prefect server exited with code {proc.returncode} before it was ready")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the temporary Prefect server did not answer within {STARTUP_TIMEOUT_S:.0f} s")


def _drain_prefect_services(timeout_s: float = 5.0) -> None:
    """Send the logs and events Prefect still queues while the server is up. Left to interpreter exit, Prefect's
    queue services would retry the stopped server for half a minute."""
    from prefect._internal.concurrency.services import QueueService

    QueueService.drain_all(timeout=timeout_s, at_exit=False)


@contextmanager
def prefect_api() -> Iterator[str]:
    """The API URL flows in this block report to: the configured one, else a private server's."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    configured = PREFECT_API_URL.value()
    if configured:
        yield configured
        return
    port = _free_port()
    env = {**os.environ, "PREFECT_SERVER_UI_ENABLED": "false", "PREFECT_UI_ENABLED": "false",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                             str(port), "--no-services"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=die_with_parent)
    url = f"http://127.0.0.1:{port}/api"
    old = os.environ.get("PREFECT_API_URL")
    try:
        _wait_healthy(proc, url)
        os.environ["PREFECT_API_URL"] = url  # for processes this one starts (the trainer, Ray workers)
        with temporary_settings(updates={PREFECT_API_URL: url}):
            yield url
    finally:
        if old is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = old
        _drain_prefect_services()
        proc.terminate()
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
