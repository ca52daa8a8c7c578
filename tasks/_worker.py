"""One training call (SFT or GRPO) whose checkpoints stream to the store; run in a child process or inline.

    python -m tasks._worker SPEC.json      (launched by the training tasks through tasks.launch; not by hand)

Why a child process: a crash (killed worker, out of memory, segfault) then ends the child, not the flow,
and the task can retry it; the retry downloads the newest complete checkpoint from the store (not from
local disk, which on another machine would not exist) and the trainer resumes from it. The trainer owns
the step history: each checkpoint carries it and ``output_dir/metrics.jsonl`` is rewritten from it on
resume, so that file holds every optimiser step exactly once even across a crash. ``tasks.launch``
starts the child (``torchrun`` when the work pool asks for several processes; then only rank 0 uploads
and reports). Progress events go through a small file the parent tails, since the child's stdout is the
log (the trainers' progress lines appear there).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable

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
        self.store.prune_checkpoints(self.run, self.stage, self.key, self.keep)
        self.emit({"event": "checkpoint", "step": int(step), "uri": uri})


def _plain(metrics: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in (metrics or {}).items():
        if hasattr(v, "item"):
            v = v.item()
        if isinstance(v, (int, float, str, bool)) or v is None:
            out[k] = v
    return out


def fetch_checkpoint(spec: dict[str, Any], emit: Emit) -> int:
    """Download the store's newest complete checkpoint for this stage and key into ``output_dir``
    (once, in the launching process, before any rank starts); returns its step, 0 when there is none."""
    from tasks.store import Store

    store = Store(spec["store"], check=False)
    found = store.latest_checkpoint(spec["run"], spec["stage"], spec["key"])
    if found is None:
        return 0
    step, uri = found
    store.get_checkpoint(uri, Path(spec["output_dir"]) / f"checkpoint-{step}")  # checked against _COMPLETE
    emit({"event": "resume", "step": step, "uri": uri})
    return step


def execute(spec: dict[str, Any], emit: Emit) -> dict[str, Any]:
    """Train (``kind``: grpo, sft or reward) from ``model_path`` or the newest checkpoint in ``output_dir``
    (the trainer writes ``output_dir/metrics.jsonl``)."""
    from grpo_core.config import GRPOConfig, SFTConfig
    from grpo_core.data import read_parquet
    from tasks.store import Store

    out = Path(spec["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    store = Store(spec["store"], check=False)
    callbacks = [StoreCheckpoints(store, spec["run"], spec["stage"], spec["key"], int(spec.get("keep", 2)), emit)]
    rows = read_parquet(Path(spec["rows_path"]))
    if spec["kind"] == "grpo":
        from grpo_core.trainer import train_grpo

        metrics = train_grpo(GRPOConfig.model_validate(spec["config"]), spec["model_path"], rows, out,
                             resume=True, callbacks=callbacks)
    elif spec["kind"] == "reward":
        from grpo_core.config import RewardConfig
        from grpo_core.reward_model import train_reward_model

        eval_rows = read_parquet(Path(spec["eval_rows_path"])) if spec.get("eval_rows_path") else None
        metrics = train_reward_model(RewardConfig.model_validate(spec["config"]), spec["model_path"], rows, out,
                                     eval_rows=eval_rows, resume=True, callbacks=callbacks)
    else:
        from grpo_core.sft import train_sft

        metrics = train_sft(SFTConfig.model_validate(spec["config"]), spec["model_path"], rows, out,
                            resume=True, callbacks=callbacks)
    return {"metrics": _plain(metrics or {}), "resumed_from": int(spec.get("resumed_from", 0))}


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def run_training(spec: dict[str, Any], *, isolation: str, on_event: Emit) -> dict[str, Any]:
    """Run ``execute`` inline, or in child processes through ``tasks.launch`` (torchrun when the work pool
    asks for several); a child that dies without a Python error raises ``WorkerCrashed`` (retried)."""
    from tasks.launch import StageProcessFailed, launch, resolve_nproc_per_node
    from tasks.common import StageFailed, WorkerCrashed, logger
    from tasks.store import TransientStoreError

    spec = {**spec, "resumed_from": fetch_checkpoint(spec, on_event)}
    if isolation == "inline":
        return execute(spec, on_event)
    work = Path(spec["output_dir"]).parent
    work.mkdir(parents=True, exist_ok=True)  # absent when there was no checkpoint to fetch
    spec = {**spec, "events_path": str(work / "events.jsonl"), "result_path": str(work / "result.json")}
    Path(spec["events_path"]).write_text("")
    spec_path = work / "worker-spec.json"
    spec_path.write_text(json.dumps(spec))
    root = str(Path(__file__).resolve().parents[1])
    env = {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
    follower = _EventFollower(Path(spec["events_path"]), on_event)
    follower.start()
    nproc = resolve_nproc_per_node(None)
    try:
        launch("tasks._worker", [str(spec_path)], nproc_per_node=nproc, logger=logger(), env=env, cwd=root)
    except StageProcessFailed as e:
        if e.child_traceback is None:
            raise WorkerCrashed(f"{spec['stage']} worker process died: {e}") from None
        if "TransientStoreError" in str(e).splitlines()[0]:
            raise TransientStoreError(str(e)) from None
        raise StageFailed(str(e)) from None
    finally:
        follower.stop()
    return json.loads(Path(spec["result_path"]).read_text())


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
    from tasks.common import configure_stage_logging
    from tasks.launch import record_failure

    configure_stage_logging()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)  # the trainers' progress lines

    @record_failure
    def run() -> None:
        spec = json.loads(Path(spec_path).read_text())
        rank0 = _rank() == 0
        lock = threading.Lock()

        def emit(event: dict[str, Any]) -> None:
            if rank0:
                with lock, open(spec["events_path"], "a") as f:
                    f.write(json.dumps(event, default=str) + "\n")

        result = execute(spec, emit)
        if rank0:
            Path(spec["result_path"]).write_text(json.dumps(result, default=str))

    run()


if __name__ == "__main__":
    _child_main(sys.argv[1])
