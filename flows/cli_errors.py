"""What a failed ``r1`` command prints: one ``error:`` line that says what to do, no traceback.

Prefect logs a failure at each level it passes (the task, the stage flow, the pipeline flow), each time with the
traceback and its chained one: a data error printed ~216 lines and 4 tracebacks above the command's own ``error:``
line. ``quiet_tracebacks`` makes Prefect's console handler print such records (an exception attached, level ERROR,
a ``Finished in state ...``) as their first line, without the traceback; ``R1_TRACEBACK=1`` shows everything again.
Only the terminal changes: the Prefect API (the UI, ``prefect flow-run logs``) still gets the tracebacks.

``failure_line`` words the ``error:`` line of a failed flow: r1's own errors as they are (they name the file, field
and fix), a full disk as "free space, then rerun", a store error with "rerun"; any other exception (a bug, a
library's error) with the variable that shows its traceback. ``store_silent`` words a lease lost because the store
stopped answering its heartbeats: the endpoint, the timeouts and "rerun", not "another writer owns the run".
"""

from __future__ import annotations

import errno
import logging
import os
import re
from typing import Any

from tasks.storage.s3_settings import S3_TIMEOUT_ENV, endpoint_name
from tasks.storage.store import StoreStalled, TransientStoreError

TRACEBACK_ENV = "R1_TRACEBACK"
RESUME = "rerun the same command to resume (finished stages are reused, training resumes from its last checkpoint)"
OWN_PACKAGES = ("grpo_core", "tasks", "flows")  # their errors carry the fix in their message


def tracebacks_shown() -> bool:
    return os.environ.get(TRACEBACK_ENV, "").strip() not in ("", "0")


class FirstLineOnly(logging.Formatter):
    """Formats as ``inner`` does, but a record with an exception, of level ERROR or up, or a flow or task run's
    final state as its message's first line only, without the traceback."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if not (record.exc_info or record.exc_text or record.stack_info or record.levelno >= logging.ERROR
                or message.startswith("Finished in state ")):
            return self.inner.format(record)
        bare = logging.makeLogRecord(record.__dict__)  # a copy: the other handlers keep the traceback
        bare.exc_info, bare.exc_text, bare.stack_info = None, None, None
        bare.msg, bare.args = (message.splitlines() or [""])[0], None
        return self.inner.format(bare)


def quiet_tracebacks() -> None:
    """Wrap the formatter of Prefect's console handlers on the root logger in ``FirstLineOnly``, once; nothing
    with ``R1_TRACEBACK=1``. Other handlers (a log file, a test's capture) keep the tracebacks."""
    from prefect.logging.handlers import PrefectConsoleHandler  # heavy import: called once flows are imported

    if tracebacks_shown():
        return
    for handler in logging.getLogger().handlers:
        if isinstance(handler, PrefectConsoleHandler) and not isinstance(handler.formatter, FirstLineOnly):
            handler.setFormatter(FirstLineOnly(handler.formatter or logging.Formatter()))


def _errors(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or during, outermost first."""
    chain: list[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return chain


NO_SPACE = re.compile(r"\[Errno 28\][^\n]*|No space left on device[^\n]*")


def _no_space(exc: BaseException) -> str | None:
    """What says the disk was full (``[Errno 28] No space left on device: 'PATH'``), else None; also when the
    error came from a training child and only its message (with the child's traceback) holds it."""
    for e in _errors(exc):
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return f"[Errno 28] {e.strerror}" + (f": {e.filename!r}" if e.filename else "")
        if found := NO_SPACE.search(str(e)):
            return found.group(0).strip()[:300]
    return None


def failure_line(exc: BaseException) -> str:
    """The ``error:`` line's text for a flow that failed with ``exc`` (one line)."""
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    if full := _no_space(exc):
        return (f"a disk is full ({full}): free space there (or point R1_WORKDIR / --store at a bigger disk), "
                f"then {RESUME}")
    if isinstance(exc, (TransientStoreError, StoreStalled)):  # the store failed or went silent; not a lost lease
        return f"{text}; once the store answers, {RESUME}"
    if type(exc).__module__.split(".")[0] in OWN_PACKAGES or tracebacks_shown():
        return text
    return f"{text} ({TRACEBACK_ENV}=1 shows the traceback)"


def store_silent(store: Any, reason: str) -> str:
    """The lease's ``reason`` for a loss by silence (no heartbeat reached the store), with the store's endpoint,
    the time limit of one store operation, and what to do."""
    if str(getattr(store, "protocol", "")).startswith("s3"):
        env = S3_TIMEOUT_ENV["read"][0]
        where = (f"S3 endpoint {endpoint_name()} for {store.url} did not answer the lease's heartbeats (each store "
                 f"operation waits at most {store.timeouts['read']:g} s, {env})")
        check = "check AWS_ENDPOINT_URL_S3 and the network"
    else:
        where, check = f"the store {store.url} did not answer the lease's heartbeats", "check that disk or mount"
    return f"{reason}; {where}: the run stopped so that no other writer overlaps it: {check}, then {RESUME}"
