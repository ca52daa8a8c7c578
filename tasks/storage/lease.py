"""One writer per run: a lease file ``{root}/{run}/_run/lease.json`` in the store.

``r1 run`` and ``r1 stage`` take the run's lease before any stage starts, refresh it from a heartbeat thread
while they run and delete it when they end (failure and Ctrl-C included)::

    {"owner": "<random token>", "host": ..., "pid": ..., "since": ISO time, "heartbeat": ISO time,
     "heartbeat_at": epoch s, "expires_at": epoch s (heartbeat + ttl)}

A second writer fails with ``LeaseHeld``, which names the holder. A lease whose ``expires_at`` has passed
(its writer died without releasing it) is taken over with a warning, and so at once is one whose writer ran
on this host and is gone (``tasks/storage/owner.py``: pid, pid namespace, start time); ``force=True``
(``--force-unlock``) takes any lease. Expiry compares the clocks of two machines: keep them NTP-synced, or
the TTL well above their skew.

Fencing: while this process holds the lease, every commit to the run (a stage's manifest, a checkpoint's
``_COMPLETE``; ``tasks/storage/store.py``'s fence) first reads the lease back and is refused with ``LeaseLost``,
naming the run and the other holder, when it is no longer ours. The heartbeat gives the lease up by itself
(``on_lost``: the ``r1`` commands stop at once) when it sees another owner, or when no heartbeat has reached
the store for ``ttl - GUARD`` (from then on another writer may take the run over).

No atomic create-if-absent on S3, so taking a lease is: read; if free, write ours; wait ``settle_s``; read
back and proceed only if the owner is still us (the last write wins, the loser sees it and fails). The race
left: writer B reads "free" before A writes, then stalls longer than ``settle_s`` before its own write lands
after A's read-back; both proceed. A heartbeat that finds another owner in the file logs an error and stops
refreshing (it never overwrites a lease it lost) and stops its writer.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import secrets
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from tasks.storage.owner import process_gone, this_process
from tasks.storage.fence import clear_fence, set_fence
from tasks.storage.store import Store, StoreError

LEASE = "lease.json"
TTL_S = 60.0  # a lease not refreshed for this long is stale
HEARTBEAT_S = 15.0  # refresh interval: several heartbeats per TTL
SETTLE_S = 0.25  # wait between writing a lease and reading it back (narrows the S3 race, see above)
GUARD = 1 / 6  # of the TTL: a writer stops this long before others may take its unrefreshed lease over

log = logging.getLogger("r1.lease")


_HELD: dict[tuple[str, str], str] = {}  # (store url, run) -> owner token of the lease this process holds


class LeaseHeld(StoreError):
    """Another live writer holds the run's lease. Not retried."""


class LeaseLost(StoreError):
    """This writer no longer holds the run's lease: it must not commit anything to the run. Not retried."""


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

    def __init__(self, store: Store, run: str, *, ttl_s: float = TTL_S, heartbeat_s: float = HEARTBEAT_S,
                 on_lost: Callable[[str], None] | None = None) -> None:
        self.store, self.run, self.ttl_s, self.heartbeat_s = store, run, ttl_s, heartbeat_s
        self.path = store.run_file(run, LEASE)
        self.owner = secrets.token_hex(8)
        self.since = _iso(time.time())
        self.lost = False
        self.lost_reason = ""
        self.on_lost = on_lost  # called once, from the heartbeat thread, when the lease is lost
        self.valid_until = 0.0  # our last successful write + TTL - guard: after it, assume another writer took over
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def record(self) -> dict[str, Any]:
        now = time.time()
        return {"owner": self.owner, **this_process(), "since": self.since, "heartbeat": _iso(now),
                "heartbeat_at": now, "expires_at": now + self.ttl_s, "run": self.run}

    def _write(self) -> None:
        record = self.record()
        self.store.write_json(self.path, record)
        self.valid_until = record["heartbeat_at"] + self.ttl_s * (1 - GUARD)

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
        self.refuse_if_held(force=force, quiet=False)
        self._write()
        time.sleep(settle_s)
        now_held = self.read()
        if not now_held or now_held.get("owner") != self.owner:  # another writer's lease landed after ours
            raise LeaseHeld(self._held_message(now_held or {}))
        set_fence(self.store.url, self.run, self.ensure_held)
        _HELD[(self.store.url, self.run)] = self.owner
        return self

    def refuse_if_held(self, *, force: bool = False, quiet: bool = True) -> None:
        """Raise ``LeaseHeld`` naming the holder when another live writer holds the lease (what ``acquire`` checks
        first; called alone, it lets a command refuse in a second, before it starts anything slow). A lease that
        ``acquire`` would take over (expired, its process gone, ``force``) passes; ``quiet``: without the
        warnings ``acquire`` logs when it takes one over."""
        holder = self.read()
        if holder is None or holder.get("owner") == self.owner:
            return
        if force:
            taking = f"--force-unlock: taking the lease on run {self.run} from {describe(holder)}"
        elif _expires_at(holder) < time.time():
            taking = (f"taking over the stale lease on run {self.run} ("
                      f"{describe(holder) if holder else f'unreadable {self.store.uri(self.path)}'}; expired "
                      f"{_iso(_expires_at(holder)) if holder else '?'})")
        elif process_gone(holder):
            taking = f"taking over the lease on run {self.run} from {describe(holder)}: that process is gone (same host)"
        else:
            raise LeaseHeld(self._held_message(holder))
        if not quiet:
            log.warning("%s", taking)

    def _held_message(self, holder: dict[str, Any]) -> str:
        return (f"run {self.run!r} in {self.store.url} is being written by {describe(holder)}; wait for it to "
                f"finish (or until {_iso(_expires_at(holder))}, when its lease goes stale), or, "
                f"if that process is gone, rerun with --force-unlock")

    def refresh(self) -> bool:
        """Write a new heartbeat; False (and no write) when the lease is lost: another writer's is in the store,
        or ours was not refreshed in time (``valid_until`` passed: another writer may be taking it now)."""
        if self.lost:
            return False
        if time.time() > self.valid_until:
            self._lose_unrefreshed()
            return False
        holder = self.read()
        if holder and holder.get("owner") != self.owner:
            self._lose(f"another writer took it: {describe(holder)} (--force-unlock or a stale take-over)")
            return False
        self._write()
        return True

    def _lose_unrefreshed(self) -> None:
        last = self.valid_until - self.ttl_s * (1 - GUARD)
        self._lose(f"no heartbeat reached the store since {_iso(last)} (a lease goes stale after {self.ttl_s:g} s), "
                   "so another writer may be taking the run over")

    def _lose(self, reason: str) -> None:
        """Give the lease up for good: no more heartbeats, no more commits, and tell the writer to stop."""
        with self._lock:
            if self.lost:
                return
            self.lost, self.lost_reason = True, f"lost the lease on run {self.run!r} in {self.store.url}: {reason}"
        log.error("%s; this process stops writing to the run", self.lost_reason)
        if self.on_lost is not None:
            self.on_lost(self.lost_reason)

    def ensure_held(self, what: str = "a commit") -> None:
        """The fence before ``what`` (a commit to the run): raise ``LeaseLost``, naming the run and the lease's
        holder now, unless the lease in the store is still ours and was refreshed in time."""
        try:
            held = self.read()
        except StoreError as e:
            if not self.lost:
                raise LeaseLost(f"{what} to run {self.run!r} refused: cannot read the run's lease to check this "
                                f"writer still holds it ({e})") from None
            held = None
        if not self.lost:
            if not held or held.get("owner") != self.owner:
                self._lose(f"another writer took it: {describe(held)}" if held else
                           f"its lease file {self.store.uri(self.path)} was removed or damaged")
            elif time.time() > self.valid_until:  # not refreshed in time: another writer may be taking it now
                self._lose_unrefreshed()
        if self.lost:
            now = describe(held) if held and held.get("owner") != self.owner else ""
            other = f"; {now} holds it now" if now and now not in self.lost_reason else ""
            raise LeaseLost(f"{what} refused: {self.lost_reason}{other}; this writer stops (`r1 status "
                            f"{self.run}` shows what the other writer committed)")

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                if not self.refresh():
                    return
            except StoreError as e:  # a missed heartbeat is not fatal if the next one gets through in time
                log.warning("lease heartbeat for run %s failed: %s", self.run, e)

    def _watch(self) -> None:
        """Lose the lease when ``valid_until`` passes without a refresh, even while a heartbeat's store call
        hangs (each is bounded, but by R1_S3_READ_TIMEOUT, not by the lease)."""
        while not self._stop.wait(max(0.05, self.valid_until - time.time())):
            if self.lost:
                return
            if time.time() > self.valid_until:
                self._lose_unrefreshed()
                return

    def release(self) -> None:
        """Stop the heartbeat and delete the lease if it is still ours."""
        self._stop.set()
        clear_fence(self.store.url, self.run, self.ensure_held)
        if _HELD.get((self.store.url, self.run)) == self.owner:
            del _HELD[(self.store.url, self.run)]
        if self.lost:  # nothing of ours to delete; a heartbeat still in a store call writes nothing more
            return
        for thread in self._threads:  # a heartbeat write must not land after the delete below
            if thread is not threading.current_thread():
                thread.join(timeout=10)
        try:
            holder = self.read()
        except StoreError as e:
            log.warning("could not release the lease on run %s: %s", self.run, e)
            return
        if holder and holder.get("owner") == self.owner:
            self.store.remove_run_file(self.run, LEASE)

    def __enter__(self) -> "RunLease":
        self._threads = [threading.Thread(target=fn, name=f"lease-{self.run}-{fn.__name__}", daemon=True)
                         for fn in (self._beat, self._watch)]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def acquire_lease(store: Store, run: str, *, force: bool = False, ttl_s: float = TTL_S,
                  heartbeat_s: float = HEARTBEAT_S, settle_s: float = SETTLE_S,
                  on_lost: Callable[[str], None] | None = None) -> RunLease:
    """Take the lease on ``run`` (see the module docstring); enter the result to keep it alive. ``on_lost``
    (the reason) is how the heartbeat stops the writer when the lease is lost."""
    return RunLease(store, run, ttl_s=ttl_s, heartbeat_s=heartbeat_s, on_lost=on_lost).acquire(force=force,
                                                                                               settle_s=settle_s)


def held_owner(store: Store, run: str) -> str | None:
    """The owner token of the lease this process holds on ``run`` (None when it holds none): what the pipeline
    hands to the stages it dispatches to other processes (``fenced_as``)."""
    return _HELD.get((store.url, run))


@contextmanager
def fenced_as(store: Store, run: str, owner: str) -> Iterator[None]:
    """Fence this process's commits to ``run`` on behalf of the writer whose lease token is ``owner``: a stage that
    a pipeline dispatched to a worker (``--dispatch deployments``) holds no lease itself, so before each commit it
    reads the run's lease and refuses (``LeaseLost``) when another live writer holds it. A free or expired lease
    lets the commit through: no other writer is at work (a ``prefect flow-run retry`` after the pipeline ended)."""
    if held_owner(store, run):  # this process holds the lease itself: its own fence (``ensure_held``) is stricter
        yield
        return

    def check(what: str) -> None:
        holder = RunLease(store, run).read()
        if holder and holder.get("owner") != owner and _expires_at(holder) >= time.time():
            raise LeaseLost(f"{what} to run {run!r} refused: the run is now written by {describe(holder)}, not by "
                            "the pipeline that dispatched this stage; this stage stops and commits nothing")

    set_fence(store.url, run, check)
    try:
        yield
    finally:
        clear_fence(store.url, run, check)
