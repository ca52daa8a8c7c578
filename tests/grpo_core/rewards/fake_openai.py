"""A small OpenAI-compatible server in a thread (``http.server``) for the served reward tests: it answers
``/v1/chat/completions`` with a fixed verdict and ``/classify`` with a fixed score, records what it was sent, can
fail its first N requests with a status, and counts the requests in flight at once."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Behaviour:
    verdict: str = "The answer is helpful.\nRating: [[7]]"
    score: float = 1.5
    fail_first: int = 0  # the first N requests answer fail_status
    fail_status: int = 503
    fail_body: str = '{"error": "overloaded"}'
    delay_s: float = 0.0
    requests: list[dict[str, Any]] = field(default_factory=list)  # {"path", "headers", "body"} per request
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class FakeOpenAI:
    """``with FakeOpenAI() as server: server.url, server.behaviour``."""

    def __init__(self) -> None:
        self.behaviour = Behaviour()
        behaviour = self.behaviour

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with behaviour.lock:
                    behaviour.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                    failing = len(behaviour.requests) <= behaviour.fail_first
                    behaviour.in_flight += 1
                    behaviour.max_in_flight = max(behaviour.max_in_flight, behaviour.in_flight)
                try:
                    time.sleep(behaviour.delay_s)
                    if failing:
                        status, payload = behaviour.fail_status, behaviour.fail_body.encode()
                    elif self.path == "/v1/chat/completions":
                        status, payload = 200, json.dumps({"choices": [{"index": 0, "finish_reason": "stop", "message": {
                            "role": "assistant", "content": behaviour.verdict}}]}).encode()
                    elif self.path == "/classify":
                        status, payload = 200, json.dumps({"data": [{"index": 0, "label": "LABEL_0", "num_classes": 1,
                                                                     "probs": [behaviour.score]}]}).encode()
                    else:
                        status, payload = 404, b'{"detail": "Not Found"}'
                finally:
                    # Out of flight before the answer leaves: a client that gets it may send its next request at
                    # once, and that request must not find this one still counted.
                    with behaviour.lock:
                        behaviour.in_flight -= 1
                self.answer(status, payload)

            def answer(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeOpenAI":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def closed_port_url() -> str:
    """The URL of a local port nothing listens on (a stopped server): connections are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
