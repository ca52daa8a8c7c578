"""When is r1's temporary Prefect server dead? (``flows/prefect_watch.py``)

A server process that lives and runs but does not answer is starved (two busy cores), not dead: the run goes on
through a pause far longer than the old 10 s grace. A stopped one (SIGSTOP, state T) is hung: declared dead within
seconds, and killed, so no Prefect call waits its 60 s request timeout on it. The watch here watches a stand-in
server (a child answering ``/api/health``) that can be paused while running, which the real one cannot.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from flows import prefect_watch
from flows.prefect_watch import HUNG_GRACE_S, ServerWatch

# A server that answers every GET with 200 from one thread; SIGUSR1 makes it stop answering for PAUSE_S (its one
# thread busy, as a starved server's is), while its process keeps running (state S, not T).
SERVER = """
import http.server, signal, sys, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"{}")
    def log_message(self, *a): pass
signal.signal(signal.SIGUSR1, lambda *a: time.sleep(float(sys.argv[1])))
srv = http.server.HTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"""
PAUSE_S = HUNG_GRACE_S + 6  # longer than the old grace (the run was stopped after 10 s), far below BUSY_GRACE_S


@pytest.fixture
def server(monkeypatch):
    """The stand-in server, ``PREFECT_API_URL`` naming it (as ``prefect_api`` sets it for its own server)."""
    from prefect.context import refresh_global_settings_context

    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(PAUSE_S)], stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    os.environ["PREFECT_API_URL"], before = f"http://127.0.0.1:{port}/api", os.environ.get("PREFECT_API_URL")
    refresh_global_settings_context()  # the watch's thread reads the process-global settings
    monkeypatch.setattr(prefect_watch, "give_up_on_api", lambda *a: None)  # keeps this test process's Prefect as is
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()
        if before is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = before
        refresh_global_settings_context()


def _wait(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def test_a_paused_server_resumed_within_the_grace_does_not_stop_the_run(server, capfd):
    dead: list[str] = []
    with ServerWatch("the temporary Prefect server", dead.append, proc=server):
        time.sleep(3)
        server.send_signal(signal.SIGUSR1)  # silent for PAUSE_S, then answers again
        assert not _wait(lambda: dead, PAUSE_S + 6), dead
        assert prefect_watch.process_state(server.pid) in ("S", "R")
    assert server.poll() is None  # not killed
    warned = capfd.readouterr().err
    assert "warning: the temporary Prefect server has not answered for" in warned
    assert "probably starved of CPU: the run goes on, and stops if the server stays silent for 180 s" in warned


def test_a_stopped_server_is_declared_hung_and_killed_within_seconds(server):
    dead: list[str] = []
    with ServerWatch("the temporary Prefect server", dead.append, proc=server):
        time.sleep(3)
        server.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        assert _wait(lambda: dead, HUNG_GRACE_S + 10), "no verdict on a stopped server"
        took = time.monotonic() - stopped
    assert took < HUNG_GRACE_S + 8, took
    assert dead == [f"the temporary Prefect server stopped: its process (pid {server.pid}) is stopped (state T: "
                    f"SIGSTOP or a debugger) and has not answered /health for {dead[0].split('for ')[1].split()[0]} s, "
                    "so it was killed"]
    assert server.wait(timeout=5) == -signal.SIGKILL  # killed: every Prefect call to it now fails at once
