"""A watchdog on the Prefect API a command's flows report to: when the server goes away, stop the command.

Without it, a temporary server killed mid-run (OOM killer, a stray ``kill``) left the run going on blind: each
Prefect API call from the flow and task engines (states, progress artifacts) retried for ~60 s
(``PREFECT_CLIENT_MAX_RETRIES`` 5, exponential back-off), so GRPO crawled ~500x slower, the log filled with
``Error logging to API``, and a Ctrl-C then spent minutes retrying the server to record the interruption.

``ServerWatch`` polls the server process (ours) every ``poll_s`` and ``GET /api/health`` every ``health_s``. When is a
server that does not answer dead? Ours (the temporary server, ``proc`` given):
- its process gone: dead at once;
- its process stopped (state T: SIGSTOP, a debugger) and silent for ``hung_grace_s`` (10 s): hung. Nothing answers
  until someone resumes it, and each Prefect call to it would wait its full ``PREFECT_API_REQUEST_TIMEOUT`` (60 s)
  as the run unwinds (a stopped server took 140 s to stop the run, silent meanwhile), so the watch kills it: every
  call then fails at once and the run stops within seconds (``tests/flows/test_server_dies.py``: under 30 s);
- its process alive and running but silent: starved, not dead (a server on two cores beside training answers
  seconds late). A ``warning:`` line after ``hung_grace_s``; dead only past ``grace_s`` (``BUSY_GRACE_S``, 180 s),
  far above such a stall, and then killed as a hung one is.
A configured server (no process of ours) is dead after ``grace_s`` (``CONFIGURED_GRACE_S``) without an answer.
Once dead, the watch makes Prefect give up on the server (``give_up_on_api``: no more retries, API logs dropped and
counted, no ``Error logging to API`` noise) and calls ``on_dead(reason)`` once; the ``r1`` commands stop there as on
Ctrl-C (``flows/cli_common.py``).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Optional

POLL_S = 0.5  # how often the server process is checked (cheap: a waitpid)
HEALTH_S = 2.0  # how often /api/health is asked, each with this timeout
HUNG_GRACE_S = 10.0  # our own server's process stopped (state T) and silent this long: hung (it answers in ms)
BUSY_GRACE_S = 180.0  # our own server's process running but silent this long: dead (a starved one answers sooner)
CONFIGURED_GRACE_S = 60.0  # a configured server may restart or be briefly unreachable; Prefect retries ~60 s too


class ServerWatch:
    """Watch the Prefect API that ``PREFECT_API_URL`` names where this is made, and ``proc`` when that is our own
    server process; ``what`` names the server in the message (its URL without credentials)."""

    def __init__(self, what: str, on_dead: Callable[[str], None], *, proc: Optional[subprocess.Popen[bytes]] = None,
                 grace_s: float = BUSY_GRACE_S, hung_grace_s: float = HUNG_GRACE_S, poll_s: float = POLL_S,
                 health_s: float = HEALTH_S) -> None:
        self.what, self.on_dead, self.proc = what, on_dead, proc
        self.grace_s, self.hung_grace_s, self.poll_s, self.health_s = grace_s, hung_grace_s, poll_s, health_s
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
        warned = False
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
                    last_answer, warned = time.monotonic(), False
                    continue
                silent, pid = time.monotonic() - last_answer, self.proc.pid if self.proc is not None else None
                if pid is not None and silent > self.hung_grace_s and process_state(pid) in STOPPED_STATES:
                    return self._died(f"its process (pid {pid}) is stopped (state T: SIGSTOP or a debugger) and has "
                                      f"not answered /health for {silent:.0f} s, so it was killed")
                if silent > self.grace_s:
                    reason = f"{type(problem).__name__}: {problem}".splitlines()[0][:160]
                    return self._died(f"no answer to /health for {self.grace_s:g} s ({reason})"
                                      + (", so it was killed" if self.proc is not None else ""))
                if pid is not None and silent > self.hung_grace_s and not warned and not self._stop.is_set():
                    warned = True
                    print(f"warning: {self.what} has not answered for {silent:.0f} s; its process (pid {pid}) is "
                          f"running, probably starved of CPU: the run goes on, and stops if the server stays silent "
                          f"for {self.grace_s:g} s", file=sys.stderr, flush=True)

    def _died(self, why: str) -> None:
        if self._stop.is_set():  # the command is stopping the server itself
            return
        if self.proc is not None and self.proc.poll() is None:
            # Hung, not gone: every Prefect call to it would wait its full request timeout (60 s) as the run
            # unwinds. Killed, each fails at once.
            self.proc.kill()
        self.dead = f"{self.what} stopped: {why}"
        give_up_on_api(self._settings)
        logging.getLogger(__name__).debug("%s", self.dead)
        self.on_dead(self.dead)


STOPPED_STATES = ("T", "t")  # /proc/PID/stat: stopped by a signal, stopped by a tracer


def process_state(pid: int) -> str:
    """The process's state letter from ``/proc/{pid}/stat`` (R, S, D, T, t, Z, ...); "" where it cannot be read
    (gone, or no /proc: then a silent server gets the long grace)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]  # the name in parentheses may hold spaces
    except (OSError, IndexError):
        return ""


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
