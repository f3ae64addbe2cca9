"""The Prefect API a `sage` command reports to.

With `PREFECT_API_URL` set, the user's own server, which keeps the runs' history. Without it, a private temporary
server for this process (`prefect server start` on a free local port, no UI, no background services, no
telemetry), whose Prefect home (its database) is a temporary folder removed when it stops: a private server's runs
never reach `~/.prefect/prefect.db`, so a later `prefect server start` of the user's lists none of them. It is
started in its own session so that the terminal's Ctrl-C reaches only `sage`, which then records the interruption
through the still-running API and stops the server itself; and with a parent-death signal, so the server dies with
`sage` even when `sage` is killed outright. (Prefect's own temporary server shares the terminal's process group:
Ctrl-C killed it first, and the flow then retried the dead API for minutes.) The private server serves no UI, so
it needs no `PREFECT_UI_API_URL`.

A configured server is asked for its health before any work (`check_api`, a 3 s timeout): one that is not up
is `PrefectUnreachable`, one sentence with the fix, not the Prefect client's retries and a long traceback.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sage.engines.verify.isolation import die_with_parent

STARTUP_TIMEOUT_S = 120.0
HEALTH_TIMEOUT_S = 3.0
STARTING = "starting a private Prefect server (10-40 s; set PREFECT_API_URL to use a running one)..."


class PrefectUnreachable(RuntimeError):
    """`PREFECT_API_URL` names a Prefect API that does not answer; the message says which and what to do."""


def configured_api() -> str | None:
    """The Prefect API URL the user configured (environment or Prefect profile), or None."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def check_api(url: str | None = None, timeout_s: float = HEALTH_TIMEOUT_S) -> None:
    """Raise PrefectUnreachable unless the Prefect API at `url` (default: the configured one; nothing to check
    without one) answers its health check within `timeout_s`."""
    import httpx

    url = url or configured_api()
    if not url:
        return
    health = f"{url.rstrip('/')}/health"
    try:
        response = httpx.get(health, timeout=timeout_s)
        problem = None if response.status_code == 200 else f"answered HTTP {response.status_code}"
    except httpx.HTTPError as e:
        problem = f"did not answer ({type(e).__name__})"
    except ValueError as e:  # not a URL httpx can request
        problem = f"is not a usable URL ({e})"
    if problem:
        raise PrefectUnreachable(
            f"cannot reach the Prefect API at {url}: {health} {problem}; start that server (`prefect server "
            f"start`), or unset PREFECT_API_URL to let sage start its own private server")


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
def prefect_api(say: Callable[[str], object] | None = None) -> Iterator[str]:
    """The API URL flows in this block report to: the configured one (PrefectUnreachable when it does not
    answer), else a private server's; `say` is told when a private server starts (it takes seconds)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    configured = configured_api()
    if configured:
        check_api(configured)
        yield configured
        return
    if say is not None:
        say(STARTING)
    port = _free_port()
    home = tempfile.mkdtemp(prefix="sage-prefect-")  # its database and settings: gone with it
    env = {**os.environ, "PREFECT_HOME": home, "PREFECT_SERVER_UI_ENABLED": "false", "PREFECT_UI_ENABLED": "false",
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
        shutil.rmtree(home, ignore_errors=True)


def cancel_interrupted(flow_run_ids: set, message: str) -> int:
    """Mark the flow runs `flow_run_ids` and their task runs that Prefect recorded as Crashed when a signal stopped
    them (it records any KeyboardInterrupt so) as Cancelled with `message`, so the UI says a user stopped them;
    returns how many it marked. Best effort: an API that does not answer leaves them Crashed."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.states import Cancelled

    if not flow_run_ids:
        return 0
    marked = 0
    try:
        with get_client(sync_client=True) as client:
            mine = FlowRunFilter(id=FlowRunFilterId(any_=list(flow_run_ids)))
            runs = [(client.set_flow_run_state, r) for r in client.read_flow_runs(flow_run_filter=mine)]
            runs += [(client.set_task_run_state, r) for r in client.read_task_runs(flow_run_filter=mine)]
            for set_state, run in runs:
                if run.state is not None and run.state.is_crashed():
                    set_state(run.id, Cancelled(message=message), force=True)
                    marked += 1
    except Exception:  # the server went away meanwhile: the runs stay Crashed, nothing else is lost
        return marked
    return marked
