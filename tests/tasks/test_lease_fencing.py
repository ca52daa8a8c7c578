"""A writer that lost its run's lease commits nothing: two writers with a partition between them (a paused
proxy in front of the S3 endpoint) never both commit a stage of one run; a lease taken from under a writer
refuses its next commit; a dead writer on this host is taken over at once; SIGTERM releases the lease."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tasks.storage.lease import LEASE, LeaseHeld, LeaseLost, acquire_lease
from tasks.storage.store import MANIFEST, Store

RUN = "same"
ROOT = Path(__file__).resolve().parents[2]


def _hang_up(*conns: socket.socket) -> None:
    for conn in conns:
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class PausableProxy:
    """A TCP proxy to ``upstream`` (host, port). ``pause()`` cuts it like a network partition: bytes in either
    direction are dropped, new connections hang; ``resume()`` closes the connections that were cut (their
    bytes are lost, as in a real partition) and forwards again."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.paused = threading.Event()
        self.cut: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b, client), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, client: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if self.paused.is_set():
                    with self.lock:
                        if client not in self.cut:
                            self.cut.append(client)
                    continue  # dropped
                with self.lock:
                    if client in self.cut:
                        continue
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _hang_up(src, dst)

    def pause(self) -> None:
        self.paused.set()

    def resume(self) -> None:
        self.paused.clear()
        with self.lock:
            _hang_up(*self.cut)

    def close(self) -> None:
        self.server.close()


def _python(script: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Another writer: ``script`` in its own Python process (one process, one writer, as with ``r1``)."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def _outputs(tmp_path: Path) -> Path:
    (tmp_path / "out").mkdir(exist_ok=True)
    (tmp_path / "out" / "weights.bin").write_bytes(b"w" * 100)
    return tmp_path / "out"


def _committed(store: Store, stage: str) -> list[dict]:
    return list(store._committed(RUN, stage))


def test_two_writers_with_a_partition_between_them_never_both_commit(s3_env, s3_server, tmp_path, monkeypatch):
    """Writer A reaches S3 through a proxy; the proxy is paused (A is cut off) for longer than the lease's TTL.
    A stops by itself before its lease goes stale; B (another process) takes the run over and commits; when
    the partition heals, A's commit is refused naming the run and B."""
    host, port = s3_server.removeprefix("http://").split(":")
    proxy = PausableProxy((host, int(port)))
    monkeypatch.setenv("R1_S3_READ_TIMEOUT", "5")  # longer than the TTL: a hung heartbeat must not delay the stop
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.url)
    store_a = Store(s3_env)
    stopped: list[tuple[float, str]] = []
    lease_a = acquire_lease(store_a, RUN, ttl_s=2, heartbeat_s=0.3, settle_s=0,
                            on_lost=lambda reason: stopped.append((time.monotonic(), reason)))
    with lease_a:
        writer_a = store_a.begin(RUN, "grpo_train")
        writer_a.put_dir(_outputs(tmp_path))
        cut = time.monotonic()
        proxy.pause()
        deadline = time.monotonic() + 10
        while not stopped and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stopped, "writer A did not stop while cut off from the store"
        assert stopped[0][0] - cut < 2  # before its lease could go stale for anyone else
        assert "no heartbeat reached the store" in stopped[0][1]

        b = _python(f"""
            import time
            from pathlib import Path
            from tasks.storage.lease import acquire_lease
            from tasks.storage.store import Store
            store = Store({s3_env!r})
            deadline = time.time() + 20
            while True:  # A's lease is live for up to its TTL: wait as a rerun would
                try:
                    lease = acquire_lease(store, {RUN!r}, ttl_s=2, settle_s=0)
                    break
                except Exception:
                    if time.time() > deadline:
                        raise
                    time.sleep(0.2)
            out = Path({str(tmp_path / "b")!r}); out.mkdir(); (out / "weights.bin").write_bytes(b"b" * 100)
            w = store.begin({RUN!r}, "grpo_train"); w.put_dir(out)
            w.commit(fingerprint="b", config={{}}, parents={{}}, metrics={{}})
            print("committed", flush=True)
            time.sleep(60)  # B is still writing the run
        """, env={"AWS_ENDPOINT_URL_S3": s3_server})
        try:
            line = b.stdout.readline()
            assert line.strip() == "committed", b.stderr.read() if b.poll() is not None else line
            proxy.resume()
            with pytest.raises(LeaseLost) as err:
                writer_a.commit(fingerprint="a", config={}, parents={}, metrics={})
            msg = str(err.value)
            assert msg.startswith(f"grpo_train output {writer_a.version} refused: lost the lease on run '{RUN}' in "
                                  f"{store_a.url}: no heartbeat reached the store since ")
            assert f"pid {b.pid}" in msg and "holds it now" in msg  # the other writer, named
            monkeypatch.setenv("R1_S3_READ_TIMEOUT", "60")  # the checks below read through a healed proxy
            versions = [m["fingerprint"] for m in _committed(Store(s3_env), "grpo_train")]
            assert versions == ["b"]  # one lineage: B's
            held = json.loads(Store(s3_env).read_text(store_a.run_file(RUN, LEASE)))
            assert held["pid"] == b.pid  # A never overwrote B's lease
        finally:
            b.kill()
            b.wait()
            proxy.resume()
            proxy.close()


def test_a_commit_after_the_lease_was_taken_is_refused_naming_the_other_writer(tmp_path, caplog):
    """Between two heartbeats another writer takes the run (--force-unlock elsewhere): the commit reads the
    lease first and stops."""
    store = Store(tmp_path / "store")
    lease = acquire_lease(store, RUN, heartbeat_s=3600, settle_s=0)
    try:
        writer = store.begin(RUN, "prepare_data")
        writer.put_dir(_outputs(tmp_path))
        store.write_json(store.run_file(RUN, LEASE), {"owner": "b", "host": "host-b", "pid": 4242,
                                                     "since": "2026-01-01T00:00:00Z", "expires_at": time.time() + 60})
        with caplog.at_level(logging.ERROR, logger="r1.lease"), pytest.raises(LeaseLost) as err:
            writer.commit(fingerprint="a", config={}, parents={}, metrics={})
        assert f"lost the lease on run '{RUN}'" in str(err.value) and "host-b pid 4242" in str(err.value)
        assert not (tmp_path / "store" / writer.rel / MANIFEST).exists() and _committed(store, "prepare_data") == []
        assert lease.refresh() is False  # and it does not write the lease again
        assert json.loads(store.read_text(store.run_file(RUN, LEASE)))["owner"] == "b"
    finally:
        lease.release()
    ok = store.begin(RUN, "prepare_data")  # no lease held in this process: commits are not fenced
    ok.put_dir(_outputs(tmp_path))
    ok.commit(fingerprint="c", config={}, parents={}, metrics={})


def test_a_dead_writer_on_this_host_is_taken_over_at_once(tmp_path, caplog):
    store = Store(tmp_path / "store")
    dead = _python(f"""
        from tasks.storage.lease import acquire_lease
        from tasks.storage.store import Store
        acquire_lease(Store({str(tmp_path / "store")!r}), {RUN!r}, settle_s=0)
        print("held", flush=True)
        import time; time.sleep(60)
    """)
    assert dead.stdout.readline().strip() == "held", dead.stderr.read()
    with pytest.raises(LeaseHeld, match=f"pid {dead.pid}"):  # alive: refused
        acquire_lease(store, RUN, settle_s=0)
    dead.kill()  # kill -9: nothing released
    dead.wait()
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="r1.lease"):
        lease = acquire_lease(store, RUN, settle_s=0)
    assert time.monotonic() - start < 20  # not the 60 s TTL
    assert f"pid {dead.pid}" in caplog.text and "that process is gone" in caplog.text
    assert json.loads(store.read_text(store.run_file(RUN, LEASE)))["owner"] == lease.owner
    lease.release()


def test_a_live_lease_of_another_host_or_namespace_is_not_taken(tmp_path):
    from tasks.storage.owner import this_process

    store = Store(tmp_path)
    me = this_process()
    for other in ({**me, "host": "elsewhere", "pid": 999_999_999}, {**me, "pidns": "pid:[1]", "pid": 999_999_999}):
        store.write_json(store.run_file(RUN, LEASE), {"owner": "x", **other, "expires_at": time.time() + 60})
        with pytest.raises(LeaseHeld):
            acquire_lease(store, RUN, settle_s=0)


def _cli_writer(store_dir: Path, ttl: float = 60.0) -> subprocess.Popen[str]:
    """A process holding the lease as ``r1 run`` does (flows/cli_common: ``_interruptible``, ``_lease``), with
    a fast heartbeat, 'training' until it is stopped."""
    return _python(f"""
        import sys, time
        import typer
        import tasks.storage.lease as L
        from flows.cli_common import _interruptible, _lease
        from tasks.storage.store import Store
        take = L.acquire_lease
        L.acquire_lease = lambda *a, **k: take(*a, heartbeat_s=0.2, ttl_s={ttl}, settle_s=0, **k)
        try:
            with _interruptible(), _lease(Store({str(store_dir)!r}), {RUN!r}, False):
                print("held", flush=True)
                time.sleep(60)
        except typer.Exit as e:
            sys.exit(e.exit_code)
    """)


def test_sigterm_releases_the_lease(tmp_path):
    store = Store(tmp_path)
    writer = _cli_writer(tmp_path)
    assert writer.stdout.readline().strip() == "held", writer.stderr.read()
    writer.send_signal(signal.SIGTERM)
    assert writer.wait(timeout=20) == 143
    assert "terminated (SIGTERM)" in writer.stderr.read()
    assert not store.exists(store.run_file(RUN, LEASE))


def test_a_writer_that_loses_its_lease_stops_at_once(tmp_path):
    store = Store(tmp_path)
    writer = _cli_writer(tmp_path)
    assert writer.stdout.readline().strip() == "held", writer.stderr.read()
    store.write_json(store.run_file(RUN, LEASE), {"owner": "b", "host": "host-b", "pid": 4242,
                                                 "expires_at": time.time() + 60})
    start = time.monotonic()
    assert writer.wait(timeout=40) == 1
    assert time.monotonic() - start < 20  # at its next check, not at the end of its work
    last = writer.stderr.read().strip().splitlines()[-1]
    assert last.startswith(f"error: lost the lease on run '{RUN}' in {store.url}: another writer took it: host-b "
                           "pid 4242")
    assert json.loads(store.read_text(store.run_file(RUN, LEASE)))["owner"] == "b"  # not released: not ours
