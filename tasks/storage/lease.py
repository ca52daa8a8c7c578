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

Fencing (``tasks/storage/fence.py``, ``tasks/storage/commit.py``): every commit to the run (a stage's manifest, a
checkpoint's ``_COMPLETE``, a run file such as ``lineage.json``) reads the lease before and after its write and is
refused (``LeaseLost``, naming the run and the other holder), its write undone, when the lease is no longer ours.
That holds in every process that writes for the holder: the training child and follower nodes get the owner's
token (``fence.fence_env``) and check the lease as the holder does (``fenced_as``, mode ``holder``); a stage
dispatched to a worker gets it as a flow parameter (mode ``dispatched``) and also watches the lease, stopping its
child (``on_lost``) within a heartbeat of a takeover. The check compares owner tokens, never ETags, so the holder's
own heartbeat never fails it. The heartbeat gives the lease up by itself (``on_lost``: the ``r1`` commands stop at
once) when it sees another owner, or when no heartbeat has reached the store for ``ttl - GUARD`` (from then on
another writer may take the run over); a commit's write is bounded by that same time.

Every write of the lease is a compare-and-swap on the tag last read or written (``Store.write_if``: S3
``If-None-Match: *`` to take a free lease, ``If-Match`` on its ETag otherwise; locally under a lock): of two writers
taking a lease at once one wins, and a heartbeat (or one given up on that lands minutes later) can never overwrite
another writer's lease. ``settle_s`` and the read-back after taking a lease are kept for stores whose conditional
writes are not honoured.
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
from tasks.storage.fence import DISPATCHED, HOLDER, Check, clear_fence, set_fence
from tasks.storage.store import Store, StoreError, WriteConflict

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


def _valid_until(holder: dict[str, Any]) -> float:
    """Until when the lease's writer may commit: its last heartbeat plus ``ttl - GUARD``."""
    try:
        beat = float(holder.get("heartbeat_at", 0))
    except (TypeError, ValueError):
        return 0.0
    return beat + (_expires_at(holder) - beat) * (1 - GUARD)


def _parse(data: bytes) -> dict[str, Any]:
    """A lease file's record; ``{}`` when it is unreadable (damaged)."""
    try:
        holder = json.loads(data)
        return holder if isinstance(holder, dict) and "owner" in holder else {}
    except ValueError:
        return {}


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
        self.tag: str | None = None  # the lease file's tag as we last read or wrote it (compare-and-swap)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def record(self) -> dict[str, Any]:
        now = time.time()
        return {"owner": self.owner, **this_process(), "since": self.since, "heartbeat": _iso(now),
                "heartbeat_at": now, "expires_at": now + self.ttl_s, "run": self.run}

    def _write(self, tag: str | None) -> None:
        """Write a fresh record if the lease file's tag is still ``tag`` (None: no file); ``WriteConflict`` if not."""
        record = self.record()
        data = json.dumps(record, indent=2, sort_keys=True).encode()
        self.tag = self.store.write_if(self.path, data, tag)
        self.valid_until = record["heartbeat_at"] + self.ttl_s * (1 - GUARD)

    def read_tagged(self) -> tuple[dict[str, Any] | None, str | None]:
        """(the lease in the store, its tag): (None, None) when there is none; ``{}`` when it is damaged."""
        try:
            data, tag = self.store.read_tagged(self.path)
        except FileNotFoundError:
            return None, None
        return _parse(data), tag

    def read(self) -> dict[str, Any] | None:
        """The lease in the store: None when there is none; ``{}`` when it is unreadable (damaged)."""
        return self.read_tagged()[0]

    def acquire(self, *, force: bool = False, settle_s: float = SETTLE_S) -> "RunLease":
        """Take the lease, or raise ``LeaseHeld`` naming the live holder."""
        holder, tag = self.refuse_if_held(force=force, quiet=False)
        try:
            self._write(tag)
        except WriteConflict:  # another writer's lease landed between our read and our write
            raise LeaseHeld(self._held_message(self.read() or {})) from None
        time.sleep(settle_s)
        now_held, self.tag = self.read_tagged()
        if not now_held or now_held.get("owner") != self.owner:  # a store that does not honour conditional writes
            raise LeaseHeld(self._held_message(now_held or {}))
        set_fence(self.store.url, self.run, self.ensure_held, self.owner, HOLDER)
        _HELD[(self.store.url, self.run)] = self.owner
        return self

    def refuse_if_held(self, *, force: bool = False,
                       quiet: bool = True) -> tuple[dict[str, Any] | None, str | None]:
        """Raise ``LeaseHeld`` naming the holder when another live writer holds the lease (what ``acquire`` checks
        first; called alone, it lets a command refuse in a second, before it starts anything slow). A lease that
        ``acquire`` would take over (expired, its process gone, ``force``) passes; ``quiet``: without the
        warnings ``acquire`` logs when it takes one over. Returns the lease read and its tag."""
        holder, tag = self.read_tagged()
        if holder is None or holder.get("owner") == self.owner:
            return holder, tag
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
        return holder, tag

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
        for _ in range(2):
            try:
                self._write(self.tag)  # compare-and-swap: never over another writer's lease
                return True
            except WriteConflict:
                holder, tag = self.read_tagged()
                if not holder or holder.get("owner") != self.owner:
                    self._lose(f"another writer took it: {describe(holder)} (--force-unlock or a stale take-over)"
                               if holder else f"its lease file {self.store.uri(self.path)} was removed or damaged")
                    return False
                self.tag = tag  # still ours: a heartbeat of ours given up on landed since; swap on its tag
        log.warning("lease heartbeat for run %s: the lease file kept changing under it; trying again", self.run)
        return True  # not refreshed: ``valid_until`` stands, and the watch ends the lease if this goes on

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

    def ensure_held(self, what: str = "a commit") -> float:
        """The fence before ``what`` (a commit to the run): raise ``LeaseLost``, naming the run and the lease's
        holder now, unless the lease in the store is still ours (its owner token: our own heartbeat rewriting the
        file never fails this) and was refreshed in time. Returns until when it is surely ours."""
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
        return self.valid_until

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
            holder, tag = self.read_tagged()
            if holder and holder.get("owner") == self.owner and tag is not None and self.store.remove_if(self.path, tag):
                self.store.remove_run_file(self.run, LEASE)  # gone already; removes the folders it leaves empty
        except StoreError as e:
            log.warning("could not release the lease on run %s: %s", self.run, e)

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


def owner_check(store: Store, run: str, owner: str, mode: str) -> Check:
    """The fence of a process that commits to ``run`` for the writer whose lease token is ``owner`` without
    holding the lease itself. ``holder`` (a training child, a follower node): the lease must be in the store,
    ``owner``'s and refreshed in time. ``dispatched`` (a stage a pipeline sent to a worker): refused while another
    live writer holds the run; a free or expired lease lets the commit through (no other writer is at work: a
    ``prefect flow-run retry`` after the pipeline ended)."""

    def check(what: str) -> float | None:
        try:
            holder = RunLease(store, run).read()
        except StoreError as e:
            raise LeaseLost(f"{what} to run {run!r} refused: cannot read the run's lease to check the writer this "
                            f"process writes for still holds it ({e})") from None
        ours = bool(holder) and holder.get("owner") == owner  # type: ignore[union-attr]
        if mode == HOLDER and not ours:
            now = f"the run is now written by {describe(holder)}" if holder else "its lease was released or removed"
            raise LeaseLost(f"{what} to run {run!r} refused: {now}, not by the writer that started this process; "
                            "this process stops and commits nothing")
        if mode == HOLDER and time.time() > _valid_until(holder):  # type: ignore[arg-type]
            raise LeaseLost(f"{what} to run {run!r} refused: the lease of the writer that started this process was "
                            f"not refreshed since {holder.get('heartbeat', '?')}, so another writer may be taking "  # type: ignore[union-attr]
                            "the run over; this process stops and commits nothing")
        if holder and not ours and _expires_at(holder) >= time.time():
            raise LeaseLost(f"{what} to run {run!r} refused: the run is now written by {describe(holder)}, not by "
                            "the pipeline that dispatched this stage; this stage stops and commits nothing")
        return _valid_until(holder) if ours else None  # type: ignore[arg-type]

    return check


@contextmanager
def fenced_as(store: Store, run: str, owner: str, *, mode: str = DISPATCHED,
              on_lost: Callable[[str], None] | None = None, watch_s: float = HEARTBEAT_S) -> Iterator[None]:
    """Fence this process's commits to ``run`` on behalf of the writer whose lease token is ``owner``
    (``owner_check``). ``on_lost``: also read the lease every ``watch_s`` and call ``on_lost(reason)`` once when a
    commit would be refused (a dispatched stage stops its training child with it)."""
    if held_owner(store, run):  # this process holds the lease itself: its own fence (``ensure_held``) is stricter
        yield
        return
    check = owner_check(store, run, owner, mode)
    set_fence(store.url, run, check, owner, mode)
    stop = threading.Event()
    if on_lost is not None:
        threading.Thread(target=_watch_lease, args=(check, run, on_lost, stop, watch_s), daemon=True,
                         name=f"lease-watch-{run}").start()
    try:
        yield
    finally:
        stop.set()
        clear_fence(store.url, run, check)


def _watch_lease(check: Check, run: str, on_lost: Callable[[str], None], stop: threading.Event,
                 every_s: float) -> None:
    while not stop.wait(every_s):
        try:
            check("the stage's next commit")
        except LeaseLost as e:
            log.error("%s", e)
            on_lost(str(e))
            return
        except StoreError as e:  # a missed look is not fatal: the commits check again themselves
            log.warning("could not read the lease of run %s: %s", run, e)
