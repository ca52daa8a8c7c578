"""Shared fixtures. Real data sets are read from ../shared/data (never copied into the repo)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# What the README's test line needs on a fresh machine, set here rather than by whoever runs it: no hub
# (no internet), no Prefect analytics, a generous Prefect start-up and quiet OpenMP spinning on 2 cores.
# Once a flow test has routed the trainers' logger into Prefect, trainer tests outside any flow run would
# warn on every line that there is no run to send it to: they need not.
for _name, _value in (("HF_HUB_OFFLINE", "1"), ("PREFECT_SERVER_ANALYTICS_ENABLED", "false"),
                      ("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300"), ("OMP_WAIT_POLICY", "PASSIVE"),
                      ("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")):
    os.environ.setdefault(_name, _value)

# pytest runs in two worker processes (pyproject's addopts, pytest-xdist): each gets its own stage work folder
# and Prefect home, so that runs with the same name in the two, or two temporary Prefect servers, never share
# files. Tests that need another place set their own.
_PRIVATE = tempfile.mkdtemp(prefix=f"r1-tests-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-")
atexit.register(shutil.rmtree, _PRIVATE, ignore_errors=True)
os.environ.setdefault("R1_WORKDIR", os.path.join(_PRIVATE, "work"))
os.environ.setdefault("PREFECT_HOME", os.path.join(_PRIVATE, "prefect-home"))
os.environ.setdefault("R1_HASH_CACHE", os.path.join(_PRIVATE, "hashes"))  # tasks/storage/file_hashes.py

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("R1_SHARED_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data sets not found at {SHARED_DATA} (set R1_SHARED_DATA to the folder)")
    return SHARED_DATA


def start_moto_server() -> tuple[str, "subprocess.Popen[bytes]"]:
    """A moto S3 server on 127.0.0.1 (as s3fs's own tests use), started and answering: (endpoint URL, process).

    It runs as a child process, not a thread: moto's in-process server imports flask, whose module-level
    proxies make vLLM's kernel scan (``vllm.triton_utils.dispatcher``) fail in the same process; and a test can
    SIGSTOP it to stall the endpoint.
    """
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=2)
            return url, proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto server did not start on {url}")
            time.sleep(0.2)


@pytest.fixture(scope="session")
def s3_server():
    """The session's moto S3 server (``start_moto_server``); yields its endpoint URL."""
    url, proc = start_moto_server()
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def own_s3_server():
    """A moto S3 server of this test's own, ``(url, process)``, so the test can SIGSTOP it (a stalled endpoint);
    resumed and stopped at the end."""
    import signal

    url, proc = start_moto_server()
    yield url, proc
    proc.send_signal(signal.SIGCONT)
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def moto_auth(s3_server):
    """``moto_auth(n)``: the moto server checks credentials after n more requests (its reset-auth API);
    checking is switched off again after the test."""
    import urllib.request

    def set_auth(free_requests: int) -> None:
        body = str(free_requests).encode()  # moto reads the body as one number
        req = urllib.request.Request(f"{s3_server}/moto-api/reset-auth", data=body, method="POST",
                                     headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(req, timeout=10).read()

    yield set_auth
    set_auth(10**9)


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """AWS_* variables pointing s3fs/boto3 at the moto server, and a fresh bucket ``r1-test``; yields its URL."""
    import uuid

    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing-secret-never-logged")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    bucket = f"r1-test-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=bucket)
    yield f"s3://{bucket}/runs"


@pytest.fixture
def black_hole():
    """A TCP server on 127.0.0.1 (a free port) that accepts connections and never sends a byte; yields
    ``(url, accepted)`` where ``accepted`` lists the connections it took. Closed at the end of the test."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0), backlog=64)
    server.settimeout(0.2)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, name="black-hole", daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}", accepted
    stop.set()
    thread.join(5)
    server.close()
    for conn in accepted:
        conn.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files with a ``slow`` test run first. ``--dist loadfile`` hands the two workers whole files in queue order,
    and xdist's default queue puts files with the most tests first, so the one-test files of minutes (the config
    checks, the kill-and-resume runs) ran last, one worker busy and the other idle. With
    ``--no-loadscope-reorder`` (pyproject's addopts) the queue is this order: slow files first, the many short
    ones after fill both workers to the end (longest-first scheduling)."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: each file keeps its own order


@pytest.fixture
def private_tmpdir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short, empty temporary folder that this process and its children use for the test (``TMPDIR``,
    ``tempfile.tempdir`` and multiprocessing's cached folder), to assert that nothing is written there.

    Short: multiprocessing puts its AF_UNIX sockets there (forkserver, file-descriptor passing), whose paths may
    not pass 107 bytes, and an xdist worker's ``tmp_path`` is longer. multiprocessing caches its folder for the
    whole process, so the cache is reset and restored too, and the listener that passes file descriptors (started
    in the folder) is stopped: a later test in the same worker must inherit neither."""
    from multiprocessing import process, resource_sharer

    folder = Path(tempfile.mkdtemp(prefix="r1t-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setitem(process.current_process()._config, "tempdir", None)
    yield folder
    resource_sharer.stop()  # the next use starts a listener in the folder of its time
    # The folder stays: multiprocessing removes its own pymp-* folder in it at exit and reports it if gone.
