"""One writer per run: a lease file ``{root}/{run}/_run/lease.json`` in the store.

``r1 run`` and ``r1 stage`` take the run's lease before any stage starts, refresh it from a heartbeat thread
while they run and delete it when they end (failure and Ctrl-C included)::

    {"owner": "<random token>", "host": ..., "pid": ..., "since": ISO time, "heartbeat": ISO time,
     "heartbeat_at": epoch s, "expires_at": epoch s (heartbeat + ttl)}

A second writer fails with ``LeaseHeld``, which names the holder. A lease whose ``expires_at`` has passed
(its writer died without releasing it) is taken over with a warning; ``force=True`` (``--force-unlock``)
takes any lease. Expiry compares the clocks of two machines: keep them NTP-synced, or the TTL well above
their skew.

No atomic create-if-absent on S3, so taking a lease is: read; if free, write ours; wait ``settle_s``; read
back and proceed only if the owner is still us (the last write wins, the loser sees it and fails). The race
left: writer B reads "free" before A writes, then stalls longer than ``settle_s`` before its own write lands
after A's read-back; both proceed. A heartbeat that finds another owner in the file logs an error and stops
refreshing (it never overwrites a lease it lost), so such a double writer is at least reported.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import secrets
import socket
import threading
import time
from typing import Any

from tasks.store import Store, StoreError

LEASE = "lease.json"
TTL_S = 60.0  # a lease not refreshed for this long is stale
HEARTBEAT_S = 15.0  # refresh interval: several heartbeats per TTL
SETTLE_S = 0.25  # wait between writing a lease and reading it back (narrows the S3 race, see above)

log = logging.getLogger("r1.lease")


class LeaseHeld(StoreError):
    """Another live writer holds the run's lease. Not retried."""


def _iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _expires_at(holder: dict[str, Any]) -> float:
    try:
        return float(holder.get("expires_at", 0))
    except (TypeError, ValueError):
        return 0.0  # a damaged expiry: stale


def describe(holder: dict[str, Any]) -> str:
    """Who holds a lease, for people: host, pid, since when, last heartbeat."""
    return (f"{holder.get('host', '?')} pid {holder.get('pid', '?')} (since {holder.get('since', '?')}, "
            f"last heartbeat {holder.get('heartbeat', '?')})")


class RunLease:
    """The lease this process holds on one run; use as a context manager (heartbeat in, release out)."""

    def __init__(self, store: Store, run: str, *, ttl_s: float = TTL_S, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.store, self.run, self.ttl_s, self.heartbeat_s = store, run, ttl_s, heartbeat_s
        self.path = store.run_file(run, LEASE)
        self.owner = secrets.token_hex(8)
        self.since = _iso(time.time())
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def record(self) -> dict[str, Any]:
        now = time.time()
        return {"owner": self.owner, "host": socket.gethostname(), "pid": os.getpid(), "since": self.since,
                "heartbeat": _iso(now), "heartbeat_at": now, "expires_at": now + self.ttl_s, "run": self.run}

    def read(self) -> dict[str, Any] | None:
        """The lease in the store: None when there is none; ``{}`` when it is unreadable (damaged)."""
        try:
            text = self.store.read_text(self.path)
        except FileNotFoundError:
            return None
        try:
            holder = json.loads(text)
            return holder if isinstance(holder, dict) and "owner" in holder else {}
        except ValueError:
            return {}

    def acquire(self, *, force: bool = False, settle_s: float = SETTLE_S) -> "RunLease":
        """Take the lease, or raise ``LeaseHeld`` naming the live holder."""
        where = self.store.uri(self.path)
        holder = self.read()
        if holder is not None and holder.get("owner") != self.owner:
            if force:
                log.warning("--force-unlock: taking the lease on run %s from %s", self.run, describe(holder))
            elif _expires_at(holder) < time.time():
                log.warning("taking over the stale lease on run %s (%s; expired %s)", self.run,
                            describe(holder) if holder else f"unreadable {where}",
                            _iso(_expires_at(holder)) if holder else "?")
            else:
                raise LeaseHeld(self._held_message(holder))
        self.store.write_json(self.path, self.record())
        time.sleep(settle_s)
        now_held = self.read()
        if not now_held or now_held.get("owner") != self.owner:  # another writer's lease landed after ours
            raise LeaseHeld(self._held_message(now_held or {}))
        return self

    def _held_message(self, holder: dict[str, Any]) -> str:
        return (f"run {self.run!r} in {self.store.url} is being written by {describe(holder)}; wait for it to "
                f"finish (or until {_iso(_expires_at(holder))}, when its lease goes stale), or, "
                f"if that process is gone, rerun with --force-unlock")

    def refresh(self) -> bool:
        """Write a new heartbeat; False (and no write) when the lease now belongs to another writer."""
        holder = self.read()
        if holder and holder.get("owner") != self.owner:
            if not self.lost:
                log.error("lost the lease on run %s to %s: another writer took it (--force-unlock or a stale "
                          "take-over); this process no longer refreshes it", self.run, describe(holder))
            self.lost = True
            return False
        self.store.write_json(self.path, self.record())
        return True

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                if not self.refresh():
                    return
            except StoreError as e:  # a missed heartbeat is not fatal: the next one may get through
                log.warning("lease heartbeat for run %s failed: %s", self.run, e)

    def release(self) -> None:
        """Stop the heartbeat and delete the lease if it is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        try:
            holder = self.read()
        except StoreError as e:
            log.warning("could not release the lease on run %s: %s", self.run, e)
            return
        if holder and holder.get("owner") == self.owner:
            self.store.remove_run_file(self.run, LEASE)

    def __enter__(self) -> "RunLease":
        self._thread = threading.Thread(target=self._beat, name=f"lease-{self.run}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def acquire_lease(store: Store, run: str, *, force: bool = False, ttl_s: float = TTL_S,
                  heartbeat_s: float = HEARTBEAT_S, settle_s: float = SETTLE_S) -> RunLease:
    """Take the lease on ``run`` (see the module docstring); enter the result to keep it alive."""
    return RunLease(store, run, ttl_s=ttl_s, heartbeat_s=heartbeat_s).acquire(force=force, settle_s=settle_s)
