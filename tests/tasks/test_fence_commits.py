"""Commits cannot land after the lease is lost: a write given up on (a stalled endpoint) and a heartbeat that lands
late are harmless after another writer took the run; ``lineage.json`` is fenced, and a write that lands while the
run is taken is undone; a healthy writer's own heartbeat never fails its lease check (issue 45)."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from tasks.storage import lineage
from tasks.storage.lease import LEASE, LeaseLost, acquire_lease
from tasks.storage.manifest import StageRef
from tasks.storage.store import MANIFEST, Store, StoreError

RUN = "same"


class HoldingProxy:
    """A TCP proxy to ``upstream`` that, once a request holding ``arm(marker)``'s bytes passes (e.g. the PUT of the
    lease), holds every byte sent upstream from then on, on every connection, and delivers it all on ``release()``
    (even for connections the client gave up on): an endpoint that stalls and later processes what it was sent."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.lock = threading.Lock()
        self.marker: bytes | None = None
        self.held = threading.Event()
        self.pending: list[tuple[socket.socket, list[bytes], list[bool]]] = []  # (upstream, bytes, [client closed])
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, marker: bytes) -> None:
        self.marker = marker

    def release(self) -> None:
        with self.lock:
            self.held.clear()
            self.marker = None
            for up, chunks, closed in self.pending:
                try:
                    for chunk in chunks:
                        up.sendall(chunk)
                    if closed[0]:
                        up.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                chunks.clear()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            up = socket.create_connection(self.upstream)
            entry: tuple[socket.socket, list[bytes], list[bool]] = (up, [], [False])
            with self.lock:
                self.pending.append(entry)
            threading.Thread(target=self._to_upstream, args=(client, entry), daemon=True).start()
            threading.Thread(target=self._to_client, args=(up, client), daemon=True).start()

    def _to_upstream(self, client: socket.socket, entry: tuple[socket.socket, list[bytes], list[bool]]) -> None:
        up, chunks, closed = entry
        try:
            while data := client.recv(65536):
                with self.lock:
                    if self.marker is not None and data.startswith(b"PUT ") and self.marker in data:
                        self.held.set()
                    if self.held.is_set():
                        chunks.append(data)
                        continue
                up.sendall(data)
        except OSError:
            pass
        with self.lock:
            closed[0] = True
            if not self.held.is_set():
                try:
                    up.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

    def _to_client(self, up: socket.socket, client: socket.socket) -> None:
        try:
            while data := up.recv(65536):
                client.sendall(data)
        except OSError:
            pass
        finally:
            for s in (client, up):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.release()
        self.server.close()


@pytest.fixture
def proxied(s3_env, s3_server, monkeypatch):
    """(writer A's store, through a HoldingProxy; the proxy; a store that reaches the endpoint directly)."""
    host, port = s3_server.removeprefix("http://").split(":")
    proxy = HoldingProxy((host, int(port)))
    monkeypatch.setenv("R1_S3_READ_TIMEOUT", "5")  # longer than the TTL: the lease, not the bound, ends a write
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.url)
    store_a = Store(s3_env)
    store_a.exists(store_a.path(RUN))  # s3fs makes its client at the first call: through the proxy
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server)
    direct = Store(s3_env)
    yield store_a, proxy, direct
    proxy.close()


def _lease(store: Store) -> dict:
    return json.loads(store.read_text(store.run_file(RUN, LEASE)))


def _take_over(direct: Store, stale: dict) -> None:
    """Writer B takes the run over once A's lease went stale (as ``acquire`` does, here by a plain write)."""
    while time.time() <= stale["expires_at"]:
        time.sleep(0.05)
    direct.write_json(direct.run_file(RUN, LEASE), {"owner": "b", "host": "host-b", "pid": 4242,
                                                   "heartbeat_at": time.time(), "expires_at": time.time() + 60})


def _wait(cond, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def test_a_heartbeat_that_lands_after_a_takeover_does_not_overwrite_the_new_owner(proxied):
    store_a, proxy, direct = proxied
    lost = threading.Event()
    lease_a = acquire_lease(store_a, RUN, ttl_s=3, heartbeat_s=0.3, settle_s=0, on_lost=lambda reason: lost.set())
    with lease_a:
        proxy.arm(LEASE.encode())  # A's next heartbeat PUT stalls in the endpoint
        assert proxy.held.wait(5), "no heartbeat was sent"
        assert lost.wait(5)  # A stops before its lease can go stale for anyone else
        _take_over(direct, _lease(direct))  # A's last heartbeat, stale after its TTL
        proxy.release()  # the endpoint answers again and processes A's heartbeat
        time.sleep(3)  # its tries (R1_S3_READ_TIMEOUT each) end
        assert _lease(direct)["owner"] == "b"


def _outputs(tmp_path: Path) -> Path:
    (tmp_path / "out").mkdir(exist_ok=True)
    (tmp_path / "out" / "weights.bin").write_bytes(b"w" * 100)
    return tmp_path / "out"


def test_a_commit_given_up_on_cannot_land_after_a_takeover(proxied, tmp_path):
    store_a, proxy, direct = proxied
    lost = threading.Event()
    with acquire_lease(store_a, RUN, ttl_s=3, heartbeat_s=0.3, settle_s=0, on_lost=lambda reason: lost.set()):
        writer = store_a.begin(RUN, "grpo_train")
        writer.put_dir(_outputs(tmp_path))
        proxy.arm(MANIFEST.encode())  # the manifest's PUT stalls in the endpoint, and everything after it
        start = time.monotonic()
        with pytest.raises(StoreError):
            writer.commit(fingerprint="a", config={}, parents={}, metrics={})
        gave_up_after = time.monotonic() - start
        assert lost.wait(5)
        _take_over(direct, _lease(direct))  # A's last heartbeat, stale after its TTL
        proxy.release()  # the endpoint processes A's manifest now, after B took the run
        manifest = direct.path(writer.rel, MANIFEST)
        assert _wait(lambda: not direct.exists(manifest), 20), "the abandoned commit stayed in the store"
        time.sleep(2)
        assert not direct.exists(manifest) and direct.latest(RUN, "grpo_train") is None
        assert _lease(direct)["owner"] == "b"
        assert gave_up_after < 4.5  # within the time the lease had left (<= 2.5 s), not R1_S3_READ_TIMEOUT (5 s)


def _ref(store: Store, stage: str, version: str) -> StageRef:
    return StageRef(run=RUN, stage=stage, version=version, path=f"{RUN}/{stage}/{version}", fingerprint="f",
                    created="", store_url=store.url)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_lineage_is_fenced(where, tmp_path, request):
    store = Store(request.getfixturevalue("s3_env") if where == "s3" else tmp_path)
    lease = acquire_lease(store, RUN, heartbeat_s=3600, settle_s=0)
    try:
        lineage.record(store, _ref(store, "grpo_train", "v1"))
        store.write_json(store.run_file(RUN, LEASE), {"owner": "b", "host": "host-b", "pid": 4242,
                                                     "expires_at": time.time() + 60})  # taken: --force-unlock
        with pytest.raises(LeaseLost, match="host-b pid 4242"):
            lineage.record(store, _ref(store, "grpo_train", "v2"))
        assert lineage.read(store, RUN)["stages"]["grpo_train"]["version"] == "v1"
    finally:
        lease.release()


def test_a_lineage_write_that_lands_while_the_run_is_taken_is_undone(tmp_path, monkeypatch):
    """The takeover lands between the fence's first check and the write: the check after the write sees it and
    puts the previous lineage back."""
    store = Store(tmp_path)
    lease = acquire_lease(store, RUN, heartbeat_s=3600, settle_s=0)
    try:
        lineage.record(store, _ref(store, "grpo_train", "v1"))
        write_if = store.write_if

        def taken_meanwhile(path, data, tag, **kw):
            out = write_if(path, data, tag, **kw)
            if path.endswith(lineage.LINEAGE):
                store.write_json(store.run_file(RUN, LEASE), {"owner": "b", "host": "host-b", "pid": 4242,
                                                             "expires_at": time.time() + 60})
            return out

        monkeypatch.setattr(store, "write_if", taken_meanwhile)
        with pytest.raises(LeaseLost, match="host-b pid 4242"):
            lineage.record(store, _ref(store, "grpo_train", "v2"))
        assert lineage.read(store, RUN)["stages"]["grpo_train"]["version"] == "v1"
    finally:
        lease.release()


def test_healthy_writers_with_a_fast_heartbeat_never_fail_their_own_lease(s3_env):
    """20 writers on S3, each checking its fence and committing while its heartbeat rewrites the lease every 20 ms
    (issue 45: 1 run in 8 failed with ``LeaseLost ... FileExpired``, every run with a fast heartbeat)."""
    store = Store(s3_env)
    failures, counts = [], []
    for n in range(20):
        run = f"healthy-{n}"
        with acquire_lease(store, run, ttl_s=10, heartbeat_s=0.02, settle_s=0,
                           on_lost=lambda reason: failures.append(reason)) as lease:
            deadline = time.monotonic() + 1.0
            checks = 0
            try:
                while time.monotonic() < deadline:
                    lease.ensure_held()
                    checks += 1
                store.write_run_file(run, "progress.json", {"checks": checks})
            except StoreError as e:
                failures.append(f"{run}: {e}")
            counts.append(checks)
    assert failures == []
    assert min(counts) > 3  # each writer checked its lease many times over its heartbeats
