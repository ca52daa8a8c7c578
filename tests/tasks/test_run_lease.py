"""One writer per run: the lease in the store (taken, refused to a second writer, stale taken over, forced,
refreshed, released), on a local folder and on S3."""

from __future__ import annotations

import json
import logging
import os
import socket
import time

import pytest

from tasks.storage.lease import LEASE, LeaseHeld, RunLease, acquire_lease
from tasks.storage.store import Store, WriteConflict

RUN = "same"


def lease_file(store: Store) -> dict:
    return json.loads(store.read_text(store.run_file(RUN, LEASE)))


def test_a_second_writer_is_refused_with_the_holder_named(tmp_path):
    store = Store(tmp_path)
    first = acquire_lease(store, RUN, settle_s=0)
    held = lease_file(store)
    assert (held["owner"], held["host"], held["pid"]) == (first.owner, socket.gethostname(), os.getpid())
    with pytest.raises(LeaseHeld) as err:
        acquire_lease(store, RUN, settle_s=0)
    msg = str(err.value)
    assert f"{socket.gethostname()} pid {os.getpid()} (since {first.since}" in msg and "--force-unlock" in msg
    assert lease_file(store) == held  # the refused writer wrote nothing


def test_a_stale_lease_is_taken_over_with_a_warning(tmp_path, caplog):
    store = Store(tmp_path)
    store.write_json(store.run_file(RUN, LEASE), {"owner": "dead", "host": "gone-host", "pid": 4242,
                                                 "since": "2026-01-01T00:00:00Z", "expires_at": time.time() - 1})
    with caplog.at_level(logging.WARNING, logger="r1.lease"):
        lease = acquire_lease(store, RUN, settle_s=0)
    assert lease_file(store)["owner"] == lease.owner
    assert "taking over the stale lease" in caplog.text and "gone-host pid 4242" in caplog.text


def test_a_damaged_lease_is_taken_over(tmp_path):
    store = Store(tmp_path)
    (tmp_path / RUN / "_run").mkdir(parents=True)
    (tmp_path / RUN / "_run" / LEASE).write_text('{"owner": "x", "ho')
    lease = acquire_lease(store, RUN, settle_s=0)
    assert lease_file(store)["owner"] == lease.owner


def test_force_takes_a_live_lease_and_the_loser_stops_refreshing(tmp_path, caplog):
    store = Store(tmp_path)
    first = acquire_lease(store, RUN, settle_s=0)
    second = acquire_lease(store, RUN, force=True, settle_s=0)
    with caplog.at_level(logging.ERROR, logger="r1.lease"):
        assert first.refresh() is False
    assert "lost the lease" in caplog.text and lease_file(store)["owner"] == second.owner
    first.release()  # releasing a lost lease leaves the new holder's alone
    assert lease_file(store)["owner"] == second.owner


def test_a_write_that_lands_after_ours_wins(tmp_path, monkeypatch):
    """On a store that does not honour conditional writes, the writer reads its lease back and yields to a later
    write."""
    store = Store(tmp_path)
    write_if = store.write_if

    def racing_write(path, data, tag, **kw):  # another writer's lease lands right after ours, unconditionally
        out = write_if(path, data, tag, **kw)
        store.write_json(path, {**json.loads(data), "owner": "other", "host": "racer", "pid": 7})
        return out

    monkeypatch.setattr(store, "write_if", racing_write)
    with pytest.raises(LeaseHeld, match="racer pid 7"):
        acquire_lease(store, RUN, settle_s=0)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_of_two_writers_that_both_read_a_free_lease_one_takes_it(where, tmp_path, request, monkeypatch):
    """Taking a lease is a compare-and-swap (create-if-absent): writer B read "free" before A wrote, and its own
    write is refused however long it took, instead of both proceeding."""
    store = Store(request.getfixturevalue("s3_env") if where == "s3" else tmp_path)
    b = RunLease(store, RUN)
    holder, tag = b.refuse_if_held()  # B: free
    assert holder is None and tag is None
    a = acquire_lease(store, RUN, settle_s=0)  # A takes it meanwhile
    with pytest.raises(WriteConflict):
        b._write(tag)
    assert lease_file(store)["owner"] == a.owner
    monkeypatch.setattr(RunLease, "refuse_if_held", lambda self, **kw: (None, None))  # B decides on its stale read
    with pytest.raises(LeaseHeld, match=f"pid {os.getpid()}"):
        b.acquire(settle_s=0)
    assert lease_file(store)["owner"] == a.owner


def test_heartbeat_refreshes_and_release_removes_the_run_folder(tmp_path):
    store = Store(tmp_path)
    with acquire_lease(store, RUN, heartbeat_s=0.05, settle_s=0) as lease:
        before = lease_file(store)["heartbeat_at"]
        deadline = time.monotonic() + 5
        while lease_file(store)["heartbeat_at"] == before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lease_file(store)["heartbeat_at"] > before and lease_file(store)["owner"] == lease.owner
    assert not store.exists(store.run_file(RUN, LEASE)) and store.runs() == []


def test_lease_on_s3(s3_env):
    store = Store(s3_env)
    with acquire_lease(store, RUN, settle_s=0):
        with pytest.raises(LeaseHeld, match=f"pid {os.getpid()}"):
            acquire_lease(store, RUN, settle_s=0)
    assert not store.exists(store.run_file(RUN, LEASE))
    acquire_lease(store, RUN, settle_s=0).release()
