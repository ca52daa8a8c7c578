"""A time bound on one store operation as a whole, retries included.

Why not botocore's timeouts alone: they bound each socket read of each request, and botocore's attempts
times s3fs's own tries multiply them (``R1_S3_READ_TIMEOUT=60`` gave no error in 11 minutes against an
endpoint that accepts connections and never answers; 5 s gave one after 153 s). Here the operation runs on
a daemon thread and the caller waits at most ``limit_s`` for it; a transfer (``Progress``) gets ``limit_s``
per stretch without a finished block instead, so a big upload takes as long as bytes keep moving.

A call given up on is not cancelled (a thread cannot be): it ends when its own timeouts fire, in the
background, and its result is dropped. A write given up on may still land later, so a caller that must not leave
one behind passes ``on_abandoned``: it runs in that thread once the call ends (result or error), only when the caller
gave up, and undoes the write (``tasks/storage/store.py``'s fenced commits delete what they wrote; the lease's
heartbeat needs none: it is a compare-and-swap that cannot land over another writer's lease).
"""

from __future__ import annotations

import contextvars
import threading
import time
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class Stalled(Exception):
    """The operation gave no result (and, for a transfer, no progress) within the limit."""


class Progress:
    """Bytes moving in a transfer: each ``tick`` (any arguments, so it can be an fsspec callback's hook)
    restarts the stall clock."""

    def __init__(self) -> None:
        self.at = time.monotonic()

    def tick(self, *_: Any, **__: Any) -> None:
        self.at = time.monotonic()


def call_within(limit_s: float, fn: Callable[[], T], progress: Progress | None = None,
                on_abandoned: Callable[[], None] | None = None) -> T:
    """``fn()``'s result or exception; ``Stalled`` once ``limit_s`` passes with no result (with ``progress``:
    once ``limit_s`` passes since its last tick). ``on_abandoned``: run in ``fn``'s thread when ``fn`` ends after
    the caller gave up (whatever it returned or raised: a request that timed out may still have landed)."""
    done = threading.Event()
    out: dict[str, Any] = {}
    ctx = contextvars.copy_context()
    lock = threading.Lock()  # orders "fn ended" against "the caller gave up": exactly one of them wins

    def run() -> None:
        try:
            out["value"] = ctx.run(fn)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out["error"] = e
        finally:
            with lock:
                done.set()
                abandoned = out.get("abandoned", False)
        if abandoned and on_abandoned is not None:
            try:
                ctx.run(on_abandoned)
            except BaseException:  # noqa: BLE001 - nobody is waiting; the undo logs its own failure
                pass

    start = time.monotonic()
    threading.Thread(target=run, name="r1-store-op", daemon=True).start()
    while True:
        last = max(start, progress.at) if progress is not None else start
        remaining = last + limit_s - time.monotonic()
        if remaining <= 0:
            with lock:
                if not done.is_set():
                    out["abandoned"] = True
                    raise Stalled(f"no result within {limit_s:g} s")
            break
        if done.wait(remaining):
            break
    if "error" in out:
        raise out["error"]
    return out["value"]
