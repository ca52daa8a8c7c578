"""Run a training stage in child processes: ``python -m ENTRY`` for one process, ``torchrun`` for several.

The task that calls ``launch`` stays a thin Prefect task: the child's stdout and stderr stream line by
line into the given (Prefect run) logger, and a failing child raises ``StageProcessFailed`` carrying the
failing rank's *own* traceback, not torchrun's ``ChildFailedError`` summary. Each rank's entry point is
wrapped in ``record_failure``, which writes the rank's traceback to ``$R1_CHILD_ERROR_DIR/rank{RANK}.json``;
when several ranks fail (the others usually die of a broken collective after the first), the earliest
failure is reported as the root cause.

How many processes: ``resolve_nproc_per_node(configured)`` takes the config's value when set, else the
work pool's job variable (``R1_NPROC_PER_NODE``, set by infra/work-pools/*.json from ``gpu_count`` or
``nproc_per_node``), else 1. On GPUs torchrun ranks use NCCL; on CPU, gloo (grpo_core.trainer.distributed).

How many nodes: ``resolve_nodes()`` reads ``R1_NNODES``, ``R1_NODE_RANK``, ``R1_RDZV_ENDPOINT`` (host:port of
node 0, where torchrun's c10d rendezvous store listens) and ``R1_RDZV_ID`` (the same on every node of one
job), set by the work pool's job template. With more than one node every node runs the stage task, which
starts ``torchrun --nnodes N --node-rank R --rdzv-backend c10d``; the c10d rendezvous numbers the nodes
itself (torchrun ignores ``--node-rank`` there), so the node whose launcher ran global rank 0 is the one
holding the trained model, and it commits (``tasks.runner.training``).

``stop_children(reason)`` ends every child this process runs now (their process groups) and makes their ``launch``
raise ``ChildStopped(reason)``, not retried: how a stage dispatched to a worker stops its training when the
pipeline it runs for lost the run's lease (``tasks.storage.lease.fenced_as``'s ``on_lost``).
"""

from __future__ import annotations

import collections
import ctypes
import functools
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

NPROC_ENV = "R1_NPROC_PER_NODE"
NNODES_ENV, NODE_RANK_ENV, RDZV_ENDPOINT_ENV, RDZV_ID_ENV = "R1_NNODES", "R1_NODE_RANK", "R1_RDZV_ENDPOINT", "R1_RDZV_ID"
ERROR_DIR_ENV = "R1_CHILD_ERROR_DIR"
# Given to every stage child unless the environment sets them (a user's value wins). OpenMP's default wait policy
# spins idle threads at 100%: a run beside another CPU job (or its own Prefect server) slowed 10x or more. CI
# runs with the same (.ci/run).
CHILD_ENV_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}
_TAIL_LINES = 60
_log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])


_RUNNING: dict[int, subprocess.Popen[str]] = {}  # pid -> a child ``launch`` waits for now
_STOPPED: dict[int, str] = {}  # pid -> why ``stop_children`` stopped it
_LOCK = threading.Lock()


class ChildStopped(RuntimeError):
    """``stop_children`` ended the child (the run's lease was lost): not retried."""


def stop_children(reason: str) -> None:
    """End every child this process's ``launch`` calls run now; each of those calls raises ``ChildStopped(reason)``."""
    with _LOCK:
        procs = list(_RUNNING.values())
        _STOPPED.update({proc.pid: reason for proc in procs})
    for proc in procs:
        _log.error("stopping %s (pid %d): %s", " ".join(map(str, proc.args[1:4])), proc.pid, reason)
        _terminate_group(proc)


class StageProcessFailed(RuntimeError):
    """A stage's child process (or one torchrun rank) failed; the message holds that rank's traceback."""

    def __init__(self, message: str, *, returncode: int, rank: int | None, child_traceback: str | None) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.rank = rank
        self.child_traceback = child_traceback


def resolve_nproc_per_node(configured: int | None = None) -> int:
    """Processes per node for a training stage: the config's value, else the pool's ``R1_NPROC_PER_NODE``, else 1."""
    if configured is not None:
        return max(1, int(configured))
    raw = os.environ.get(NPROC_ENV, "").strip()
    try:
        return max(1, int(raw)) if raw else 1
    except ValueError:
        raise ValueError(f"{NPROC_ENV}={raw!r} is not an integer (set by the work pool's job template)") from None


@dataclass(frozen=True)
class Nodes:
    """Where this launcher sits in a multi-node job (one node: the defaults)."""

    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_id: str = "r1"


def _env_int(name: str, env: Mapping[str, str], default: int) -> int:
    raw = env.get(name, "").strip()
    try:
        return int(raw) if raw else default
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer (set by the work pool's job template)") from None


def resolve_nodes(env: Mapping[str, str] | None = None, *, default_rdzv_id: str = "r1") -> Nodes:
    """The node layout from the work pool's job variables (``R1_NNODES`` ...); one node when unset."""
    env = os.environ if env is None else env
    nnodes, node_rank = _env_int(NNODES_ENV, env, 1), _env_int(NODE_RANK_ENV, env, 0)
    endpoint = env.get(RDZV_ENDPOINT_ENV, "").strip() or None
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise ValueError(f"{NODE_RANK_ENV}={node_rank} with {NNODES_ENV}={nnodes}: the node rank must be in "
                         f"0..{nnodes - 1}")
    if nnodes > 1 and (endpoint is None or ":" not in endpoint):
        raise ValueError(f"{NNODES_ENV}={nnodes} needs {RDZV_ENDPOINT_ENV}=HOST:PORT, the address of node 0's "
                         f"rendezvous (got {endpoint!r}); set the work pool's rdzv_endpoint job variable")
    return Nodes(nnodes, node_rank, endpoint, env.get(RDZV_ID_ENV, "").strip() or default_rdzv_id)


def build_command(module: str, args: Sequence[str], nproc_per_node: int, *, log_dir: Path,
                  nodes: Nodes = Nodes()) -> list[str]:
    """The child's argv: plain ``python -m`` for one process, ``torch.distributed.run`` (torchrun) for more."""
    if nproc_per_node <= 1 and nodes.nnodes == 1:
        return [sys.executable, "-m", module, *args]
    if nodes.nnodes == 1:  # --standalone: a private rendezvous on a free port
        where = ["--standalone"]
    else:  # c10d: the store listens at node 0's endpoint; ranks are numbered when all nodes have joined
        where = [f"--nnodes={nodes.nnodes}", f"--node-rank={nodes.node_rank}", "--rdzv-backend=c10d",
                 f"--rdzv-endpoint={nodes.rdzv_endpoint}", f"--rdzv-id={nodes.rdzv_id}"]
    # --tee 3: every line also reaches our pipe, prefixed "[default<rank>]:". The same interpreter as ours, so
    # the child sees the same packages.
    return [sys.executable, "-m", "torch.distributed.run", *where, f"--nproc-per-node={nproc_per_node}",
            "--tee=3", f"--log-dir={log_dir}", "-m", module, *args]


def record_failure(fn: F) -> F:
    """Decorate a child's entry point: an exception writes this rank's traceback where ``launch`` reads it."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if os.environ.get(ERROR_DIR_ENV):  # started by ``launch``
            die_with_parent()
        try:
            return fn(*args, **kwargs)
        except BaseException as e:
            error_dir = os.environ.get(ERROR_DIR_ENV)
            if error_dir and not (isinstance(e, SystemExit) and e.code in (0, None)):
                rank = int(os.environ.get("RANK", "0"))
                record = {"rank": rank, "time": time.time(), "error": f"{type(e).__name__}: {e}",
                          "traceback": traceback.format_exc()}
                tmp = Path(error_dir) / f".rank{rank}.json.tmp"
                tmp.write_text(json.dumps(record))
                tmp.replace(Path(error_dir) / f"rank{rank}.json")
            raise

    return wrapper  # type: ignore[return-value]


def _load_prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None  # not Linux: the process group is still terminated when the task is cancelled


_PRCTL = _load_prctl()  # looked up once: between fork and exec only the C call itself may run


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies, so a killed worker leaves no trainer behind.

    Called between fork and exec for the direct child, and again by each torchrun rank (whose parent is the
    torchrun agent), so the chain task -> agent -> ranks unwinds when the worker is killed."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def launch(
    module: str,
    args: Sequence[str] = (),
    *,
    nproc_per_node: int = 1,
    nodes: Nodes = Nodes(),
    logger: logging.Logger | logging.LoggerAdapter | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> None:
    """Run ``module`` as a child (torchrun when ``nproc_per_node`` or ``nodes.nnodes`` > 1), stream its output,
    raise on failure."""
    logger = logger or _log
    with tempfile.TemporaryDirectory(prefix="r1-launch-") as tmp:
        error_dir = Path(tmp) / "errors"
        error_dir.mkdir()
        cmd = build_command(module, args, nproc_per_node, log_dir=Path(tmp) / "torchrun-logs", nodes=nodes)
        child_env = {**CHILD_ENV_DEFAULTS, **os.environ, **(env or {}), ERROR_DIR_ENV: str(error_dir),
                     "PYTHONUNBUFFERED": "1"}
        logger.info("launching %s", " ".join(cmd[1:] if cmd[2] == "torch.distributed.run" else cmd))
        tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                env=child_env, cwd=cwd, start_new_session=True, preexec_fn=die_with_parent)
        with _LOCK:
            _RUNNING[proc.pid] = proc
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip("\n")
                tail.append(line)
                logger.info("%s", line)
            returncode = proc.wait()
        except BaseException:  # cancelled, timed out or interrupted: take the whole process group down
            _terminate_group(proc)
            raise
        finally:
            with _LOCK:
                _RUNNING.pop(proc.pid, None)
                stopped = _STOPPED.pop(proc.pid, None)
        if stopped is not None:
            raise ChildStopped(f"{module} stopped: {stopped}")
        if returncode != 0:
            raise _failure(module, returncode, error_dir, list(tail), logger)


def _terminate_group(proc: subprocess.Popen[str], grace_s: float = 10.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _failure(module: str, returncode: int, error_dir: Path, tail: list[str],
             logger: logging.Logger | logging.LoggerAdapter) -> StageProcessFailed:
    records = [json.loads(p.read_text()) for p in error_dir.glob("rank*.json")]
    if records:
        first = min(records, key=lambda r: r["time"])  # the root cause; later ranks die of the broken collective
        others = sorted(r["rank"] for r in records if r is not first)
        also = f" (ranks {others} failed after it)" if others else ""
        message = (f"{module} failed in rank {first['rank']}{also}: {first['error']}\n"
                   f"--- traceback of rank {first['rank']} ---\n{first['traceback']}")
        logger.error("%s", message)
        return StageProcessFailed(message, returncode=returncode, rank=first["rank"],
                                  child_traceback=first["traceback"])
    # No record: the child was killed (OOM killer, signal) or died before reaching its entry point.
    how = f"killed by {signal.Signals(-returncode).name}" if returncode < 0 else f"exit code {returncode}"
    message = f"{module} failed ({how}) without a Python traceback; last output:\n" + "\n".join(tail[-20:])
    logger.error("%s", message)
    return StageProcessFailed(message, returncode=returncode, rank=None, child_traceback=None)

