"""A pool of killable worker processes that runs a check function on untrusted input within a deadline.

Why processes: math-verify's own timeout is ``signal.alarm`` (main thread only, and it cannot interrupt
C code such as GMP computing ``9^{9^9}``), so the only hard bound is a parent-side deadline and SIGKILL.

- Workers are persistent (started lazily, reused) and come from a ``forkserver`` context whose server
  preloads the check's module, so a replacement for a killed worker is ready in milliseconds, not the
  seconds SymPy takes to import. Each worker caps its address space (``RLIMIT_AS``) against memory bombs.
- ``VerifierPool.map(items)`` spreads ``fn(*item)`` over the workers. Each item's deadline starts when it is
  handed to a ready worker; a worker past the deadline is SIGKILLed and replaced and its item reports
  ``"timeout"``. Worst case for a batch: ``ceil(len(items) / num_workers) * timeout`` plus start-up.
- Inside a worker a soft ``setitimer`` alarm (a ``BaseException`` so library ``except Exception`` blocks do
  not swallow it) usually ends a slow Python-level check cleanly, which saves a respawn.
- Results are plain picklable values (the check returns floats); parsed objects never cross the pipe and are
  never ``str()``-ed or logged (printing a parsed ``9^{9^9}`` hangs).
- A process that cannot have children (a daemonic ``multiprocessing.Pool`` worker, which is where
  ``datasets.map(num_proc=N)`` runs a reward) checks in-process instead, each item under its own bound: a
  ``setitimer`` alarm in the main thread, else a watchdog thread that abandons a check past its deadline.
  Weaker than SIGKILL (a check stuck in C code ends late, and no memory cap applies), but it never raises.
- ``close()`` runs at exit (``atexit``), and workers are daemonic, so pytest and training scripts never hang.
"""

from __future__ import annotations

import atexit
import io
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from multiprocessing import context as mp_context, forkserver, popen_forkserver, reduction, spawn, util
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Literal, Sequence

Status = Literal["ok", "timeout", "error"]
STARTUP_TIMEOUT_S = 120.0  # a worker that is not ready by then is replaced (slow shared CI machines)
_KILL_GRACE_S = 0.25  # parent deadline = timeout + grace, so the worker's soft alarm gets the first chance


@dataclass(frozen=True)
class Outcome:
    status: Status
    value: Any = None  # fn's return value when status == "ok"
    error: str = ""  # exception class name (never its message: it may embed a huge expression)


class _SoftTimeout(BaseException):
    """Raised by the worker's own alarm; BaseException so ``except Exception`` in libraries lets it through."""


def can_start_workers() -> bool:
    """False in a daemonic process (``multiprocessing`` or ``multiprocess`` pool workers): Python forbids it
    children (``AssertionError: daemonic processes are not allowed to have children``)."""
    for name in ("multiprocessing", "multiprocess"):  # datasets.map(num_proc=N) runs on multiprocess
        module = sys.modules.get(name)
        if module is not None and module.current_process().daemon:
            return False
    return True


def _call_with_alarm(fn: Callable[..., Any], args: tuple[Any, ...], timeout: float) -> Outcome:
    """``fn(*args)`` in this (main) thread, interrupted by SIGALRM after ``timeout`` s; the caller's own
    handler and pending timer are restored afterwards."""

    def on_alarm(signum: int, frame: Any) -> None:
        raise _SoftTimeout()

    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    start = time.monotonic()
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        try:
            return Outcome("ok", fn(*args))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _SoftTimeout:
        return Outcome("timeout")
    except BaseException as e:  # noqa: BLE001 - any failure of untrusted input scores as an error
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return Outcome("error", error=type(e).__name__)
    finally:
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay > 0:  # the caller's timer keeps running from where it was
            signal.setitimer(signal.ITIMER_REAL, max(old_delay - (time.monotonic() - start), 1e-3), old_interval)


def _call_with_watchdog(fn: Callable[..., Any], args: tuple[Any, ...], timeout: float) -> Outcome:
    """``fn(*args)`` in a daemon thread, given up on (left to finish in the background) after ``timeout`` s."""
    box: list[Outcome] = []

    def target() -> None:
        try:
            box.append(Outcome("ok", fn(*args)))
        except BaseException as e:  # noqa: BLE001
            box.append(Outcome("error", error=type(e).__name__))

    thread = threading.Thread(target=target, name="verifier-check", daemon=True)
    thread.start()
    thread.join(timeout)
    return box[0] if box else Outcome("timeout")


def call_in_process(fn: Callable[..., Any], args: tuple[Any, ...], timeout: float) -> Outcome:
    """``fn(*args)`` in this process within ``timeout`` s; never raises because of ``args``."""
    if threading.current_thread() is threading.main_thread():
        return _call_with_alarm(fn, args, timeout)
    return _call_with_watchdog(fn, args, timeout)


def _worker_main(
    conn: Connection, fn: Callable[..., Any], memory_limit: int | None, warmup: tuple[Any, ...] | None
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    logging.disable(logging.CRITICAL)  # libraries log inputs on failure; formatting them can hang
    if memory_limit:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))

    def on_alarm(signum: int, frame: Any) -> None:
        raise _SoftTimeout()

    signal.signal(signal.SIGALRM, on_alarm)
    if warmup is not None:  # first calls build parser caches (~0.4 s, seconds under load): not on a deadline
        try:
            signal.setitimer(signal.ITIMER_REAL, STARTUP_TIMEOUT_S / 2)
            fn(*warmup)
        except BaseException:  # noqa: BLE001
            pass
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    conn.send(("ready",))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        idx, args, timeout = msg
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout)
            try:
                reply = (idx, "ok", fn(*args), "")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _SoftTimeout:
            reply = (idx, "timeout", None, "")
        except BaseException as e:  # noqa: BLE001 - any failure of untrusted input scores as an error
            reply = (idx, "error", None, type(e).__name__)
        try:
            conn.send(reply)
        except Exception:  # noqa: BLE001 - e.g. an unpicklable result
            conn.send((idx, "error", None, "UnpicklableResult"))


class _NoMainPopen(popen_forkserver.Popen):
    """forkserver launch that does not re-run the parent's ``__main__`` in the worker.

    Stock multiprocessing re-imports the main script in every child, which breaks (or re-runs) training
    scripts and notebooks without an ``if __name__ == "__main__"`` guard. The worker needs only ``fn``'s
    module, so the main-module keys are dropped from the preparation data; otherwise this is
    ``popen_forkserver.Popen._launch`` as in CPython 3.10-3.12.
    """

    def _launch(self, process_obj: Any) -> None:
        prep_data = spawn.get_preparation_data(process_obj._name)
        prep_data.pop("init_main_from_name", None)
        prep_data.pop("init_main_from_path", None)
        buf = io.BytesIO()
        mp_context.set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            mp_context.set_spawning_popen(None)
        self.sentinel, w = forkserver.connect_to_new_process(self._fds)
        _parent_w = os.dup(w)
        self.finalizer = util.Finalize(self, util.close_fds, (_parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class _WorkerProcess(mp_context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> _NoMainPopen:
        return _NoMainPopen(process_obj)


class _Worker:
    def __init__(
        self, ctx: Any, fn: Callable[..., Any], memory_limit: int | None, warmup: tuple[Any, ...] | None
    ) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        # The _launch override is checked against CPython 3.10-3.13; elsewhere use the stock process (which
        # needs the usual ``if __name__ == "__main__"`` guard in the calling script).
        patched = ctx.get_start_method() == "forkserver" and (3, 10) <= sys.version_info[:2] < (3, 14)
        process_cls = _WorkerProcess if patched else ctx.Process
        self.proc = process_cls(target=_worker_main, args=(child, fn, memory_limit, warmup), daemon=True)
        self.proc.start()
        child.close()
        self.started = time.monotonic()
        self.ready = False
        self.task: tuple[int, float] | None = None  # (item index, deadline)

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()  # SIGKILL: the check may be stuck in C code that ignores signals
        self.proc.join(timeout=5)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.proc.join(timeout=0.5)
        self.kill()


class VerifierPool:
    """Run ``fn(*item)`` for many items in killable worker processes, each within ``timeout`` seconds.

    ``fn`` must be a module-level function (it is pickled by reference) returning a small picklable value.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        num_workers: int = 2,
        timeout: float = 5.0,
        memory_limit_mb: int | None = 4096,
        start_method: str = "forkserver",
        preload: Sequence[str] = (),
        warmup: tuple[Any, ...] | None = None,
    ) -> None:
        if num_workers < 1 or timeout <= 0:
            raise ValueError(f"need num_workers >= 1 and timeout > 0, got {num_workers}, {timeout}")
        self.fn, self.num_workers, self.timeout = fn, num_workers, float(timeout)
        self.warmup = warmup  # fn(*warmup) runs once in each new worker before it takes work
        self.memory_limit = memory_limit_mb * 2**20 if memory_limit_mb else None
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            self._ctx.set_forkserver_preload([fn.__module__, *preload])
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.stats = {"timeouts": 0, "errors": 0, "restarts": 0, "in_process": 0}
        self._warm_pid: int | None = None  # the process whose in-process checks have run the warm-up
        self._no_workers_pid: int | None = None  # a process where starting workers failed
        _LIVE_POOLS.add(self)

    def map(self, items: Sequence[tuple[Any, ...]], timeout: float | None = None) -> list[Outcome]:
        """One ``Outcome`` per item, in order; never raises because of an item. In a process that cannot
        start workers (``can_start_workers``), or when starting them fails, the items run in-process."""
        if not items:
            return []
        timeout = self.timeout if timeout is None else float(timeout)
        with self._lock:
            if self._no_workers_pid != os.getpid() and can_start_workers():
                try:
                    return self._map(items, timeout)
                except Exception:  # noqa: BLE001 - e.g. a forkserver inherited through fork: ChildProcessError
                    self._no_workers_pid = os.getpid()  # do not try again in this process
                    for w in self._workers:
                        try:
                            w.kill()
                        except Exception:  # noqa: BLE001
                            pass
                    self._workers = []
            return self._map_in_process(items, timeout)

    def close(self) -> None:
        with self._lock:
            if os.getpid() == self._pid:
                for w in self._workers:
                    w.stop()
            self._workers = []

    # -- internals -------------------------------------------------------------------------------------

    def _map_in_process(self, items: Sequence[tuple[Any, ...]], timeout: float) -> list[Outcome]:
        if self._warm_pid != os.getpid() and self.warmup is not None:  # builds caches, as a worker's warm-up
            call_in_process(self.fn, self.warmup, STARTUP_TIMEOUT_S / 2)
            self._warm_pid = os.getpid()
        outcomes = [call_in_process(self.fn, tuple(item), timeout) for item in items]
        for out in outcomes:
            if out.status != "ok":
                self.stats[out.status + "s"] += 1
        self.stats["in_process"] += len(items)
        return outcomes

    def _spawn(self) -> _Worker:
        return _Worker(self._ctx, self.fn, self.memory_limit, self.warmup)

    def _replace(self, w: _Worker) -> None:
        w.kill()
        self._workers[self._workers.index(w)] = self._spawn()
        self.stats["restarts"] += 1

    def _map(self, items: Sequence[tuple[Any, ...]], timeout: float) -> list[Outcome]:
        if os.getpid() != self._pid:  # inherited through fork: the parent's workers are not ours
            self._workers, self._pid = [], os.getpid()
        for w in [w for w in self._workers if not w.proc.is_alive()]:
            self._replace(w)
        while len(self._workers) < self.num_workers:
            self._workers.append(self._spawn())

        results: list[Outcome | None] = [None] * len(items)
        pending = deque(range(len(items)))
        failed_starts = 0
        while pending or any(w.task for w in self._workers):
            for w in self._workers:  # hand out work to idle, ready workers
                if w.ready and w.task is None and pending:
                    idx = pending.popleft()
                    try:
                        w.conn.send((idx, tuple(items[idx]), timeout))
                        w.task = (idx, time.monotonic() + timeout + _KILL_GRACE_S)
                    except (OSError, ValueError):
                        pending.appendleft(idx)
                        self._replace(w)
            now = time.monotonic()
            deadlines = [w.task[1] for w in self._workers if w.task]
            deadlines += [w.started + STARTUP_TIMEOUT_S for w in self._workers if not w.ready]
            wait_s = max(0.0, min(deadlines) - now) if deadlines else 0.0
            for conn in wait([w.conn for w in self._workers], timeout=wait_s):
                w = next(x for x in self._workers if x.conn is conn)
                try:
                    msg = conn.recv()
                except (EOFError, OSError):  # died: crash, OOM kill, segfault
                    if w.task:
                        results[w.task[0]] = Outcome("error", error="WorkerDied")
                        self.stats["errors"] += 1
                    else:
                        failed_starts += 1
                    self._replace(w)
                    continue
                if msg[0] == "ready":
                    w.ready, failed_starts = True, 0
                    continue
                idx, status, value, error = msg
                results[idx] = Outcome(status, value, error)
                w.task = None
                if status != "ok":
                    self.stats[status + "s"] += 1
                if status == "timeout":  # interrupted mid-computation: do not trust its state again
                    self._replace(w)
            now = time.monotonic()
            for w in list(self._workers):
                if w.task and now >= w.task[1]:  # hard deadline: SIGKILL and replace
                    results[w.task[0]] = Outcome("timeout")
                    self.stats["timeouts"] += 1
                    self._replace(w)
                elif not w.ready and now >= w.started + STARTUP_TIMEOUT_S:
                    failed_starts += 1
                    self._replace(w)
            if failed_starts >= 3 * self.num_workers and not any(w.ready for w in self._workers):
                for idx in pending:  # workers cannot start at all: report, do not hang
                    results[idx] = Outcome("error", error="WorkerStartFailed")
                    self.stats["errors"] += 1
                pending.clear()
        return [r if r is not None else Outcome("error", error="Lost") for r in results]


_LIVE_POOLS: "weakref.WeakSet[VerifierPool]" = weakref.WeakSet()


@atexit.register
def _close_all_pools() -> None:
    for pool in list(_LIVE_POOLS):
        pool.close()
