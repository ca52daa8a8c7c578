"""A watchdog on the Prefect API a command's flows report to: when the server goes away, stop the command.

Without it, a temporary server killed mid-run (OOM killer, a stray ``kill``) left the run going on blind: each
Prefect API call from the flow and task engines (states, progress artifacts) retried for ~60 s
(``PREFECT_CLIENT_MAX_RETRIES`` 5, exponential back-off), so GRPO crawled ~500x slower, the log filled with
``Error logging to API``, and a Ctrl-C then spent minutes retrying the server to record the interruption.

``ServerWatch`` polls the server process (ours) every ``poll_s`` and ``GET /api/health`` every ``health_s``; the
process gone, or no answer for ``grace_s`` in a row, is the server's death. It then makes Prefect give up on the
server (``give_up_on_api``: no more retries, API logs dropped and counted, no ``Error logging to API`` noise) and
calls ``on_dead(reason)`` once; the ``r1`` commands stop there as on Ctrl-C (``flows/cli_common.py``).
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from typing import Any, Callable, Optional

POLL_S = 0.5  # how often the server process is checked (cheap: a waitpid)
HEALTH_S = 2.0  # how often /api/health is asked, each with this timeout
TEMPORARY_GRACE_S = 10.0  # our own server not answering this long: hung (it answers in ms when alive)
CONFIGURED_GRACE_S = 60.0  # a configured server may restart or be briefly unreachable; Prefect retries ~60 s too


class ServerWatch:
    """Watch the Prefect API that ``PREFECT_API_URL`` names where this is made, and ``proc`` when that is our own
    server process; ``what`` names the server in the message (its URL without credentials)."""

    def __init__(self, what: str, on_dead: Callable[[str], None], *, proc: Optional[subprocess.Popen[bytes]] = None,
                 grace_s: float = TEMPORARY_GRACE_S, poll_s: float = POLL_S, health_s: float = HEALTH_S) -> None:
        self.what, self.on_dead, self.proc = what, on_dead, proc
        self.grace_s, self.poll_s, self.health_s = grace_s, poll_s, health_s
        self.dead: Optional[str] = None  # why the server is considered gone, once it is
        from prefect.context import SettingsContext

        self._settings = SettingsContext.get()  # the settings the command's flows run in: made where they run
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prefect-server-watch", daemon=True)

    def __enter__(self) -> "ServerWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=self.health_s + 1)

    def _run(self) -> None:
        import httpx
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

        last_answer = last_ask = time.monotonic()
        # Prefect's own client, so a configured server's TLS and auth settings apply; one try per probe
        with temporary_settings(updates={PREFECT_CLIENT_MAX_RETRIES: 0}), \
                get_client(sync_client=True, httpx_settings={"timeout": httpx.Timeout(self.health_s)}) as client:
            while not self._stop.wait(self.poll_s):
                if self.proc is not None and (code := self.proc.poll()) is not None:
                    return self._died(f"its process exited (exit code {code})")
                if time.monotonic() - last_ask < self.health_s:
                    continue
                last_ask = time.monotonic()
                problem = client.api_healthcheck()  # None, or the exception; any HTTP answer means alive
                if problem is None or not isinstance(problem, httpx.TransportError):
                    last_answer = time.monotonic()
                elif time.monotonic() - last_answer > self.grace_s and not self._stop.is_set():
                    reason = f"{type(problem).__name__}: {problem}".splitlines()[0][:160]
                    return self._died(f"no answer to /health for {self.grace_s:g} s ({reason})")

    def _died(self, why: str) -> None:
        if self._stop.is_set():  # the command is stopping the server itself
            return
        self.dead = f"{self.what} stopped: {why}"
        give_up_on_api(self._settings)
        logging.getLogger(__name__).debug("%s", self.dead)
        self.on_dead(self.dead)


DROPPED_LOGS = [0]  # log records Prefect would have sent to the API after it was given up on


def give_up_on_api(entered: Any = None) -> None:
    """Make every Prefect API call fail at once instead of retrying a server that is gone (each call would retry
    for ~60 s, and the engines make one per state change as the run unwinds), and drop, counted, the logs
    Prefect would send to it. Prefect's own log goes quiet: what it would say now (crash reports whose state
    cannot be recorded, ``ConnectError`` tracebacks from each engine as the run unwinds, its log and event
    workers' failures) is the one fact the command's ``error:`` line states."""
    from prefect.context import GLOBAL_SETTINGS_CONTEXT, SettingsContext
    from prefect.logging.handlers import set_api_log_sink

    # Settings are read on each request (``PREFECT_CLIENT_MAX_RETRIES.value()``) from the context in effect: this
    # thread's, the process-global one (Prefect's worker threads) and ``entered``, the command's flows' one.
    contexts = {id(c): c for c in (SettingsContext.get(), GLOBAL_SETTINGS_CONTEXT, entered) if c is not None}
    for ctx in contexts.values():
        ctx.settings.client.max_retries = 0
    set_api_log_sink(lambda log: DROPPED_LOGS.__setitem__(0, DROPPED_LOGS[0] + 1))
    logging.raiseExceptions = False  # the log worker prints ``Error logging to API`` only when this is set
    for name in ["prefect", *logging.root.manager.loggerDict]:  # some have their own level or skip the level check
        if name == "prefect" or name.startswith("prefect."):
            logging.getLogger(name).disabled = True
