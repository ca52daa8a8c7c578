"""The Prefect API the CLI's flows report to: a configured server that answers, or a temporary one of our own.

Is the configured server answering? One short probe before the CLI starts flows or registers deployments.

Prefect's client waits ``PREFECT_API_REQUEST_TIMEOUT`` (60 s) for each request and retries it 5 times
(``PREFECT_CLIENT_MAX_RETRIES``), so a server that accepts connections and never answers would keep
``r1 run`` or ``r1 deploy`` silent for many minutes. ``check_prefect_api`` sends one ``GET {api}/health``
through Prefect's own client (so its TLS and auth settings apply), with no retry, waiting at most
``R1_PREFECT_PROBE_TIMEOUT`` seconds (default 10), and fails with one line naming the URL.

Without ``PREFECT_API_URL``, ``prefect_api()`` starts the temporary server itself instead of leaving it to
Prefect's ephemeral mode, which starts it in the CLI's process group: a terminal's Ctrl-C (SIGINT to the whole
group) killed that server first, and the interrupted run then spent minutes retrying calls to it before it
could record anything. Ours runs in its own session, so the interrupt reaches only ``r1``, which can still
mark its flow runs Cancelled; it dies with ``r1`` even on SIGKILL (PR_SET_PDEATHSIG) and is stopped on exit.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional
from urllib.parse import urlsplit, urlunsplit
from flows.prefect_watch import CONFIGURED_GRACE_S, ServerWatch
from tasks.runner.launch import die_with_parent

PROBE_TIMEOUT_ENV = "R1_PREFECT_PROBE_TIMEOUT"
DEFAULT_PROBE_TIMEOUT = 10.0


class PrefectAPIUnreachable(RuntimeError):
    """The configured Prefect server did not answer; the message names its URL and what to check."""


def probe_timeout() -> float:
    raw = os.environ.get(PROBE_TIMEOUT_ENV, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_PROBE_TIMEOUT
    except ValueError:
        value = float("nan")
    if not value > 0:  # also NaN
        raise PrefectAPIUnreachable(f"{PROBE_TIMEOUT_ENV}={raw!r} is not a number of seconds > 0; unset it for "
                                    f"the default ({DEFAULT_PROBE_TIMEOUT:g})")
    return value


def _shown(url: str) -> str:
    """``url`` without any user:password part."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


def check_prefect_api(*, serverless_ok: bool = True) -> None:
    """Raise ``PrefectAPIUnreachable`` unless the server at ``PREFECT_API_URL`` answers (any HTTP status) in time.

    ``serverless_ok``: the command also works without a server (``r1 run``), so the message offers that.
    """
    import httpx
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    url = PREFECT_API_URL.value()
    if not url:
        return
    timeout = probe_timeout()
    with temporary_settings(updates={PREFECT_CLIENT_MAX_RETRIES: 0}):
        with get_client(sync_client=True, httpx_settings={"timeout": httpx.Timeout(timeout)}) as client:
            problem = client.api_healthcheck()
    where = f"the Prefect API at {_shown(url)} (PREFECT_API_URL)"
    unset = ", or unset PREFECT_API_URL to run without a server" if serverless_ok else ""
    if isinstance(problem, httpx.TimeoutException):
        raise PrefectAPIUnreachable(f"no answer from {where} within {timeout:g} s ({PROBE_TIMEOUT_ENV}); check that "
                                    f"the server is up and the URL is right{unset}")
    if isinstance(problem, httpx.TransportError):
        reason = f"{type(problem).__name__}: {problem}".splitlines()[0][:200]
        raise PrefectAPIUnreachable(f"cannot connect to {where} ({reason}); start it (prefect server start) or "
                                    f"fix the URL{unset}")
    # Any HTTP answer (even an error status) means the server is alive; Prefect reports its own errors.


@contextmanager
def prefect_api(on_dead: Optional[Callable[[str], None]] = None) -> Iterator[None]:
    """The Prefect API for the flows run inside: ``PREFECT_API_URL``'s server once it answers the probe, else a
    temporary server of our own (see the module docstring), stopped on exit. Either is watched
    (``flows/prefect_watch.py``): when it goes away, ``on_dead(reason)`` is called once, from the watch's thread."""
    from prefect.context import refresh_global_settings_context
    from prefect.settings import PREFECT_API_URL, temporary_settings


    if configured := PREFECT_API_URL.value():
        check_prefect_api()
        if on_dead is None:
            yield
            return
        with ServerWatch(f"the Prefect server at {_shown(configured)} (PREFECT_API_URL)", on_dead,
                         grace_s=CONFIGURED_GRACE_S):
            yield
        return
    server = start_temporary_server()
    url = f"{server.url}/api"
    # Threads without the caller's settings context (our event follower, Prefect's event and log workers) read
    # Prefect's process-global settings, made from the environment; without the URL there they would start
    # servers of their own, in our process group.
    os.environ["PREFECT_API_URL"] = url
    refresh_global_settings_context()
    watch: Optional[ServerWatch] = None
    try:
        with temporary_settings(updates={PREFECT_API_URL: url}):
            if on_dead is None:
                yield
            else:
                with ServerWatch(f"the temporary Prefect server at {url}", on_dead, proc=server.proc) as watch:
                    yield
    finally:
        if watch is None or watch.dead is None:
            drain_prefect_workers()  # logs and events still queued go to the server while it is up
        os.environ.pop("PREFECT_API_URL", None)
        refresh_global_settings_context()
        server.stop()


def drain_prefect_workers(timeout: float = 5.0) -> None:
    """Send what Prefect's log and event workers still hold, waiting at most ``timeout`` s each, and stop them
    (as Prefect's own test harness does before it stops its server); left to interpreter exit, they would
    retry a stopped server for minutes."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=timeout)


class TemporaryServer:
    """A Prefect API server process on 127.0.0.1 in its own session, as Prefect's ephemeral mode runs it."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self.proc, self.port = proc, port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, grace_s: float = 5.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _spawn_server(port: int) -> subprocess.Popen[bytes]:
    import prefect
    from prefect.settings import get_current_settings

    env = {**os.environ, **get_current_settings().to_environment_variables(exclude_unset=True),
           "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
    cmd = [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent), "--factory",
           "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
           "--log-level", "error", "--lifespan", "on"]
    return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=die_with_parent)


def start_temporary_server() -> TemporaryServer:
    """Start the server and wait (``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS``) until it answers."""
    import httpx
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS

    limit = float(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
    server = TemporaryServer(_spawn_server(port := _free_port()), port)
    deadline = time.monotonic() + limit
    try:
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                if server.proc.poll() is not None:  # e.g. the port was taken meanwhile: try another
                    server = TemporaryServer(_spawn_server(port := _free_port()), port)
                try:
                    if client.get(f"{server.url}/api/health").status_code == 200:
                        return server
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
    except BaseException:
        server.stop()
        raise
    server.stop()
    raise PrefectAPIUnreachable(f"the temporary Prefect server did not start within {limit:g} s "
                                "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS); raise it on a busy machine, "
                                "or start one (prefect server start) and set PREFECT_API_URL")


def cancel_flow_runs(tag: str, timeout: float = 5.0) -> int:
    """Mark the flow runs tagged ``tag`` that did not finish (running, or Crashed by the interrupt), and their
    unfinished task runs, Cancelled; return how many flow runs. Bounded: no retry, ``timeout`` s per request;
    a server that does not answer leaves the states as they are (a warning, not a hang)."""
    import httpx
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterTags
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings
    from prefect.states import Cancelled

    def unfinished(state: object) -> bool:
        return state is None or not state.is_final() or state.is_crashed()  # type: ignore[attr-defined]

    cancelled = Cancelled(message="interrupted (Ctrl-C / SIGINT); rerun to resume from the last checkpoint")
    try:
        with temporary_settings(updates={PREFECT_CLIENT_MAX_RETRIES: 0}):
            with get_client(sync_client=True, httpx_settings={"timeout": httpx.Timeout(timeout)}) as client:
                runs = [r for r in client.read_flow_runs(flow_run_filter=FlowRunFilter(
                    tags=FlowRunFilterTags(all_=[tag]))) if unfinished(r.state)]
                if not runs:
                    return 0
                for task_run in client.read_task_runs(flow_run_filter=FlowRunFilter(
                        id=FlowRunFilterId(any_=[r.id for r in runs]))):
                    if unfinished(task_run.state):
                        client.set_task_run_state(task_run.id, cancelled, force=True)
                for run in runs:
                    client.set_flow_run_state(run.id, cancelled, force=True)
                return len(runs)
    except (httpx.HTTPError, OSError) as e:
        import logging

        logging.getLogger(__name__).warning("could not mark the interrupted flow runs Cancelled: %s", e)
        return 0
