"""One training call (SFT or GRPO) whose checkpoints stream to the store; run in a child process or inline.

    python -m tasks.runner.worker SPEC.json      (launched by the training tasks through tasks.runner.launch; not by hand)

Why a child process: a crash (killed worker, out of memory, segfault) then ends the child, not the flow,
and the task can retry it; the retry downloads the newest complete checkpoint from the store (not from
local disk, which on another machine would not exist) and the trainer resumes from it. The trainer owns
the step history: each checkpoint carries it and ``output_dir/metrics.jsonl`` is rewritten from it on
resume, so that file holds every optimiser step exactly once even across a crash. ``tasks.runner.launch``
starts the child (``torchrun`` when the work pool asks for several processes; then only rank 0 uploads
and reports). Progress events go through a small file the parent tails, since the child's stdout is the
log (the trainers' progress lines appear there). The child's one input is a ``TrainingSpec``
(tasks/config/training_spec.py), validated once when the child reads it. The child commits its checkpoints under
its parent's fence: the lease owner's token crosses in ``R1_LEASE_OWNER`` / ``R1_LEASE_MODE``
(``tasks.storage.fence.fence_env``), so a child whose writer lost the run commits no checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from grpo_core.data.rows import read_parquet
from tasks.config.plan import check_stage_memory
from tasks.config.training_spec import TRAINERS, TrainingSpec
from tasks.runner.common import StageFailed, WorkerCrashed, configure_stage_logging, logger
from tasks.runner.launch import Nodes, StageProcessFailed, launch, record_failure, resolve_nodes, resolve_nproc_per_node
from tasks.storage.fence import fence_env, owner_from_env
from tasks.storage.lease import fenced_as
from tasks.storage.store import Store, TransientStoreError

Emit = Callable[[dict[str, Any]], None]


class StoreCheckpoints:
    """Trainer callbacks: report each step, upload each checkpoint to the store."""

    def __init__(self, store: Any, run: str, stage: str, key: str, keep: int, emit: Emit) -> None:
        self.store, self.run, self.stage, self.key, self.keep, self.emit = store, run, stage, key, keep, emit

    def on_step(self, step: int, max_steps: int, metrics: dict[str, Any]) -> None:
        self.emit({"event": "step", "step": int(step), "max_steps": int(max_steps), "metrics": _plain(metrics)})

    def on_checkpoint(self, step: int, path: Path) -> None:
        if _rank() != 0:  # one upload per checkpoint under torchrun
            return
        uri = self.store.put_checkpoint(self.run, self.stage, self.key, int(step), Path(path))
        self.store.prune_checkpoints(self.run, self.stage, self.key, self.keep, protect=best_checkpoint(Path(path)))
        self.emit({"event": "checkpoint", "step": int(step), "uri": uri})

    def on_alarm(self, alarm: dict[str, Any]) -> None:
        """The reward-hacking monitor's alarm (grpo_core/trainer/monitor.py), for the stage task to publish."""
        self.emit({**_plain(alarm), "event": "alarm"})


def best_checkpoint(path: Path) -> tuple[int, ...]:
    """The step ``select_checkpoint: heldout`` would commit, as the checkpoint at ``path`` records it (its
    ``trainer_state.json``'s ``best_checkpoint``): store pruning keeps it, and a resume fetches it too."""
    try:
        best = json.loads((Path(path) / "trainer_state.json").read_text()).get("best_checkpoint")
    except (OSError, ValueError):
        return ()
    return (int(best["step"]),) if best else ()


def _plain(metrics: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in (metrics or {}).items():
        if hasattr(v, "item"):
            v = v.item()
        if isinstance(v, (int, float, str, bool)) or v is None:
            out[k] = v
    return out


def fetch_checkpoint(spec: TrainingSpec, emit: Emit) -> int:
    """Download the store's newest complete checkpoint for this stage and key into ``output_dir``
    (once, in the launching process, before any rank starts); returns its step, 0 when there is none."""

    store = Store(spec.store, check=False)
    found = store.latest_checkpoint(spec.run, spec.stage, spec.key)
    if found is None:
        return 0
    step, uri = found
    local = store.get_checkpoint(uri, Path(spec.output_dir) / f"checkpoint-{step}")  # checked against _COMPLETE
    for best in best_checkpoint(local):  # select_checkpoint: heldout may commit this earlier checkpoint
        if best != step and (best_uri := store.checkpoint_uri(spec.run, spec.stage, spec.key, best)) is not None:
            store.get_checkpoint(best_uri, Path(spec.output_dir) / f"checkpoint-{best}")
    emit({"event": "resume", "step": step, "uri": uri})
    return step


def execute(spec: TrainingSpec, emit: Emit) -> dict[str, Any]:
    """Train with ``spec.kind``'s trainer (``tasks.config.training_spec.TRAINERS``) from ``model_path`` or the newest
    checkpoint in ``output_dir`` (the trainer writes ``output_dir/metrics.jsonl``)."""

    out = Path(spec.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    store = Store(spec.store, check=False)
    callbacks = [StoreCheckpoints(store, spec.run, spec.stage, spec.key, spec.keep, emit)]
    # On CUDA: fail before loading anything when the plan does not fit (tasks/config/plan.py; `r1 plan` prints it)
    check_stage_memory(spec.stage, spec.kind, spec.config, spec.model_path)
    rows = read_parquet(Path(spec.rows_path))
    extra: dict[str, Any] = {"tracking": spec.tracking}
    if spec.eval_rows_path:
        extra["eval_rows"] = read_parquet(Path(spec.eval_rows_path))
    if spec.eval_config is not None:
        extra["eval_config"] = spec.eval_config
    train = TRAINERS[spec.kind].train_function()
    metrics = train(spec.config, spec.model_path, rows, out, resume=True, callbacks=callbacks, **extra)
    return {"metrics": _plain(metrics or {}), "resumed_from": spec.resumed_from}


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def run_training(spec: TrainingSpec, *, isolation: str, on_event: Emit,
                 inputs: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Run ``execute`` inline, or in child processes through ``tasks.runner.launch`` (torchrun when the work pool
    asks for several processes or nodes); a child that dies without a Python error raises ``WorkerCrashed``
    (retried). With several nodes this is node 0: it leaves ``spec`` and ``inputs`` (spec key -> the store
    output and name it was fetched from) in the store for the other nodes (``tasks.runner.follower``), the spec as
    the child reads it."""

    spec = spec.model_copy(update={"resumed_from": fetch_checkpoint(spec, on_event)})
    nodes = resolve_nodes(default_rdzv_id=f"{spec.run}-{spec.stage}-{spec.key[:12]}")
    if nodes.nnodes > 1 and (isolation == "inline" or nodes.node_rank != 0):
        raise StageFailed(f"{spec.stage}: R1_NNODES={nodes.nnodes} needs run.isolation: subprocess, and the "
                          f"stage task on node 0 only (this is node {nodes.node_rank}); start the other nodes "
                          "with python -m tasks.runner.follower")
    if isolation == "inline":
        return execute(spec, on_event)
    if nodes.nnodes == 1:
        result = launch_training(spec, on_event)
        if result is None:
            raise StageFailed(f"{spec.stage}: the training child exited cleanly but wrote no result")
        return result
    store = Store(spec.store, check=False)
    handover = {"spec": spec.model_dump(mode="json"), "inputs": inputs or {},  # the set fields, as the child reads them
                "fence": fence_env(store.url, spec.run)}  # the followers' ranks commit under this writer's lease
    store.write_json(store.node_spec_path(nodes.rdzv_id), handover)
    try:
        result = launch_training(spec, on_event, nodes=nodes)
    finally:
        store.remove(store.node_spec_path(nodes.rdzv_id))
    if result is None:
        raise StageFailed(
            f"{spec.stage}: global rank 0 (which writes the trained model) ran on another node. torchrun's c10d "
            "rendezvous numbers nodes by host name (FQDN), not by --node-rank: give node 0 the host name that "
            "sorts first (an indexed Job's pod <job>-0 does)")
    return result


def launch_training(spec: TrainingSpec, on_event: Emit, *, nodes: Any = None) -> dict[str, Any] | None:
    """``execute`` in child processes (``python -m`` or torchrun) with events relayed to ``on_event``; the
    result, or None when global rank 0 ran on another node (it alone writes the result)."""

    nodes = nodes or Nodes()
    work = Path(spec.output_dir).parent
    work.mkdir(parents=True, exist_ok=True)  # absent when there was no checkpoint to fetch
    events, result = work / "events.jsonl", work / "result.json"
    spec = spec.model_copy(update={"events_path": str(events), "result_path": str(result)})
    events.write_text("")
    spec_path = work / "worker-spec.json"
    spec_path.write_text(spec.model_dump_json())
    root = str(Path(__file__).resolve().parents[2])  # the checkout this code runs from
    env = {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p),
           **fence_env(Store(spec.store, check=False).url, spec.run)}  # the child's commits: under our fence
    follower = _EventFollower(events, on_event)
    follower.start()
    if nodes.nnodes > 1:
        logger().info(f"{spec.stage}: node {nodes.node_rank} of {nodes.nnodes}, rendezvous {nodes.rdzv_endpoint}")
    try:
        launch("tasks.runner.worker", [str(spec_path)], nproc_per_node=resolve_nproc_per_node(None), nodes=nodes,
               logger=logger(), env=env, cwd=root)
    except StageProcessFailed as e:
        if e.child_traceback is None:
            raise WorkerCrashed(f"{spec.stage} worker process died: {e}") from None
        if "TransientStoreError" in str(e).splitlines()[0]:
            raise TransientStoreError(str(e)) from None
        if "SamplerCrashed" in str(e).splitlines()[0]:  # async_rollouts' sampler process died or stalled: a crash
            raise WorkerCrashed(f"{spec.stage}: {e}") from None
        raise StageFailed(str(e)) from None
    finally:
        follower.stop()
    return json.loads(result.read_text()) if result.exists() else None


class _EventFollower(threading.Thread):
    """Tails the child's events file and hands each event to ``on_event`` in this process."""

    def __init__(self, path: Path, on_event: Emit) -> None:
        super().__init__(daemon=True)
        self.path, self.on_event, self.done, self.offset = path, on_event, threading.Event(), 0

    def run(self) -> None:
        while not self.done.wait(0.5):
            self.drain()

    def drain(self) -> None:
        with open(self.path) as f:
            f.seek(self.offset)
            while (line := f.readline()).endswith("\n"):
                self.offset = f.tell()
                try:
                    self.on_event(json.loads(line))
                except Exception:  # noqa: BLE001 - a progress update must never break training
                    pass

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=5)
        self.drain()


def _child_main(spec_path: str) -> None:
    configure_stage_logging()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)  # the trainers' progress lines

    @record_failure
    def run() -> None:
        spec = TrainingSpec.model_validate_json(Path(spec_path).read_text())  # the trainer config's one validation
        rank0 = _rank() == 0
        lock = threading.Lock()

        def emit(event: dict[str, Any]) -> None:
            if rank0:
                with lock, open(str(spec.events_path), "a") as f:
                    f.write(json.dumps(event, default=str) + "\n")

        fence = owner_from_env()  # the lease owner this process commits for (set by launch_training)
        if fence is None:
            result = execute(spec, emit)
        else:
            with fenced_as(Store(spec.store, check=False), spec.run, fence[0], mode=fence[1]):
                result = execute(spec, emit)
        if rank0:
            Path(str(spec.result_path)).write_text(json.dumps(result, default=str))

    run()


if __name__ == "__main__":
    if sys.argv[1:2] in (["-h"], ["--help"]) or len(sys.argv) != 2:
        print(__doc__, file=sys.stdout if len(sys.argv) == 2 else sys.stderr)
        sys.exit(0 if len(sys.argv) == 2 else 2)
    _child_main(sys.argv[1])
