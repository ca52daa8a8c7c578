"""The training skeleton the SFT and GRPO trainers share; they differ only in how a step's batch is built
and in its loss.

    ctx = start_process(config)                            # torchrun group (or none), torch threads
    prepare_output_dir(output_dir, ctx, resume)             # temp folders gone; resume=False clears an old run
    seed_everything(config.seed)
    model, loaded = load_policy("sft", model_path, output_dir, config, ctx, resume=resume)
    with TrainingRun.start("sft", config, ctx, ...) as run:   # optimiser, schedule, restored state, metrics
        for step in range(run.state["step"] + 1, max_steps + 1):
            ...                                            # the trainer's batch, loss and backward
            grad_norm = optimizer_step(model, run.optimizer, run.scheduler, config.max_grad_norm, ctx)
            run.end_step(step, metrics, loss=..., lr=...)  # history, metrics.jsonl, progress, on_step, checkpoint
        run.finish(model_path)                             # output_dir/final, in save_dtype

Only rank 0 writes checkpoints, metrics and the final model, and only rank 0 calls the callbacks; every
rank joins the FSDP gathers and the barriers. ``trainer_state.json`` of a checkpoint holds at least
``step`` and ``log_history`` (the rows of ``metrics.jsonl`` so far), from which ``metrics.jsonl`` is
rewritten on resume, so it lists every step exactly once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM

from grpo_core.config import OptimConfig, TrackingInfo
from grpo_core.trainer.checkpoint import (
    LoadedCheckpoint,
    hash_own_shards,
    list_checkpoints,
    load_latest_checkpoint,
    remove_temp_checkpoints,
    reset_dir,
    save_checkpoint,
    set_rng_state,
    temp_checkpoint_dir,
    write_json,
)
from grpo_core.trainer.distributed import DistContext, all_reduce_gradients, barrier, gather_objects, init_distributed
from grpo_core.trainer.dtypes import SAVE_DTYPES, resolve_save_dtype  # noqa: F401 (re-exported)
from grpo_core.trainer.fsdp import (
    gather_model_state,
    gather_optimizer_state,
    is_sharded,
    load_full_optimizer_state,
    load_sharded_model,
)
from grpo_core.trainer.lora import ADAPTER_DIR, is_peft_model, load_lora_model, merged_state_dict, save_adapter
from grpo_core.trainer.metrics import MetricsWriter
from grpo_core.trainer.optim import build_optimizer, build_scheduler
from grpo_core.trainer.sharded_state import (
    STATE_DIR,
    all_ranks_on_one_host,
    has_sharded_state,
    load_model_state,
    load_optimizer_state,
    save_sharded_state,
)
from grpo_core.trainer.trackers import Table

# A step's values (``TrainingRun.run_steps``): averaged over the logging window, and as of the step.
StepValues = tuple[dict[str, float], dict[str, float]]

logger = logging.getLogger(__name__)

PROGRESS_LINES = 20  # a progress line every ~5% of max_steps


def start_process(config: OptimConfig) -> DistContext:
    """Join the torchrun process group (none in a single process) and set torch's thread count."""
    ctx = init_distributed()
    if config.torch_num_threads:
        torch.set_num_threads(config.torch_num_threads)
    return ctx


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def prepare_output_dir(output_dir: Path, ctx: DistContext, resume: bool) -> None:
    """Create ``output_dir`` and drop half-written temp folders; ``resume=False`` also removes an old run's
    checkpoints and final model (its later checkpoints would outrank the new run's). All ranks wait."""
    if ctx.is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
        remove_temp_checkpoints(output_dir)
        if not resume:
            old = [p for _, p in list_checkpoints(output_dir)] + [p for p in [output_dir / "final"] if p.exists()]
            if old:
                logger.warning("resume=False: removing %s from a previous run", [p.name for p in old])
            for path in old:
                shutil.rmtree(path)
    barrier(ctx)


def load_model(path: Path | str, device: torch.device) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)


def uses_fsdp(config: OptimConfig, ctx: DistContext) -> bool:
    """FSDP2 under torchrun unless ``distributed_strategy='ddp'`` (``auto`` = fsdp wherever several ranks run);
    one process has nothing to shard over; LoRA (``use_peft``) replicates its frozen base (DDP on the adapters)."""
    return config.distributed_strategy != "ddp" and ctx.enabled and not config.use_peft


def load_trained_model(path: Path | str, config: OptimConfig, ctx: DistContext, *, trainable: bool = True
                       ) -> torch.nn.Module:
    """The model at ``path`` as the trainer runs it: FSDP-sharded (built on the meta device, filled from
    rank 0's reads) under ``uses_fsdp``, else a full replica on ``ctx.device``; in train mode with gradient
    checkpointing (when configured) if ``trainable``, else frozen in eval mode (the reference model)."""
    checkpointing = config.gradient_checkpointing and trainable
    state_dir = Path(path) / STATE_DIR if has_sharded_state(path) else None  # a sharded (DCP) checkpoint
    if uses_fsdp(config, ctx):
        return load_sharded_model(path, ctx, bf16=config.bf16, cpu_offload=config.fsdp_cpu_offload,
                                  gradient_checkpointing=checkpointing, trainable=trainable, state_dir=state_dir)
    if state_dir is not None:  # unsharded: built from the config, every tensor read whole from the shards
        from transformers import AutoConfig

        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32).to(ctx.device)
        load_model_state(model, state_dir)
    else:
        model = load_model(path, ctx.device)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train(trainable).requires_grad_(trainable)


def config_file(name: str) -> str:
    """The checkpoint file holding trainer ``name``'s resolved config: ``grpo_config.json``, ``sft_config.json``."""
    return f"{name}_config.json"


def load_policy(
    name: str, model_path: str | Path, output_dir: Path, config: OptimConfig, ctx: DistContext, *, resume: bool
) -> tuple[torch.nn.Module, LoadedCheckpoint | None]:
    """The model trainer ``name`` trains, from the newest usable checkpoint (when resuming) or ``model_path``;
    in train mode, with gradient checkpointing when configured, FSDP-sharded under ``uses_fsdp`` (``load_trained_model``)."""
    if config.distributed_strategy == "fsdp" and not uses_fsdp(config, ctx):
        logger.info("distributed_strategy='fsdp' in a single process: training unsharded")
    load = lambda p: load_trained_model(p, config, ctx)  # noqa: E731
    if config.use_peft:  # a checkpoint holds the adapters: the base comes from model_path (trainer/lora.py)
        load = lambda p: load_lora_model(model_path, config, ctx.device, adapter=p)  # noqa: E731
    loaded = load_latest_checkpoint(output_dir, load, config_file(name)) if resume else None
    if loaded:
        return loaded.model, loaded
    model = load_lora_model(model_path, config, ctx.device) if config.use_peft else load(model_path)
    return model, None


def autocast(config: OptimConfig, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast on GPU when ``config.bf16``; fp32 otherwise (CPU always)."""
    if config.bf16 and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def optimizer_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, max_grad_norm: float, ctx: DistContext
) -> float:
    """Sum the ranks' gradients, clip them to ``max_grad_norm``, step optimiser and schedule; the grad norm.

    Losses are divided by global totals, so the summed gradient is the full-batch gradient; FSDP has
    already reduce-scattered (summed) during backward.
    """
    if not is_sharded(model):
        all_reduce_gradients(model, ctx)
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    if isinstance(grad_norm, DTensor):  # FSDP: the norm over all shards, replicated
        grad_norm = grad_norm.full_tensor()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return float(grad_norm)


class ProgressLog:
    """A human-readable INFO line: the first step this process runs, every ~5% of ``max_steps``, the last step.

    ``grpo step 40/100 (40%) loss 0.0123 reward 0.512 lr 5e-05 elapsed 62s ETA 93s``; ETA extrapolates
    this process's own pace (a resumed run does not count the steps it skipped).
    """

    def __init__(self, name: str, max_steps: int, start_step: int) -> None:
        self.name, self.max_steps, self.first = name, max_steps, start_step + 1
        self.every = max(1, math.ceil(max_steps / PROGRESS_LINES))
        self.started = time.monotonic()

    def due(self, step: int) -> bool:
        return step == self.first or step % self.every == 0 or step == self.max_steps

    def update(self, step: int, **values: float) -> None:
        if not self.due(step):
            return
        elapsed = time.monotonic() - self.started
        eta = elapsed / (step - self.first + 1) * (self.max_steps - step)
        fields = " ".join(f"{k} {v:.3g}" for k, v in values.items())
        logger.info("%s step %d/%d (%d%%) %s elapsed %.0fs ETA %.0fs", self.name, step, self.max_steps,
                    100 * step // self.max_steps, fields, elapsed, eta)


def protected_steps(trainer_state: dict[str, Any]) -> tuple[int, ...]:
    """Checkpoints pruning must keep: ``best_checkpoint``, the step ``select_checkpoint: heldout`` would return
    (``trainer/selection.py``; the store's pruning reads it from the checkpoint's ``trainer_state.json``)."""
    best = trainer_state.get("best_checkpoint")
    return (int(best["step"]),) if best else ()


def call_callbacks(callbacks: list[Any], method: str, *args: Any) -> None:
    for cb in callbacks:
        fn = getattr(cb, method, None)
        if fn is not None:
            fn(*args)


class TrainingRun:
    """One trainer invocation's shared state and bookkeeping: optimiser, schedule, ``state`` (saved as
    ``trainer_state.json``), metrics writer, progress line and callbacks. Build it with ``start``."""

    def __init__(self, name: str, config: OptimConfig, ctx: DistContext, output_dir: Path, model: torch.nn.Module,
                 tokenizer: Any, optimizer: torch.optim.Optimizer, scheduler: Any, state: dict[str, Any],
                 max_steps: int, callbacks: list[Any], tracking: TrackingInfo | None = None) -> None:
        self.name, self.config, self.ctx, self.output_dir = name, config, ctx, output_dir
        self.model, self.tokenizer, self.optimizer, self.scheduler = model, tokenizer, optimizer, scheduler
        self.state, self.max_steps, self.callbacks = state, max_steps, callbacks
        self.config_json = config.model_dump(mode="json")
        self.writer = (MetricsWriter(output_dir, config.report_to, state["log_history"], state["step"],
                                     config=self.config_json, tracking=tracking) if ctx.is_main else None)
        self.progress = ProgressLog(name, max_steps, state["step"])

    @classmethod
    def start(cls, name: str, config: OptimConfig, ctx: DistContext, output_dir: Path, model: torch.nn.Module,
              tokenizer: Any, loaded: LoadedCheckpoint | None, *, max_steps: int, optimizer_steps: int,
              state: dict[str, Any], callbacks: list[Any] | None = None, tracking: TrackingInfo | None = None
              ) -> "TrainingRun":
        """Optimiser and schedule (over ``optimizer_steps``), restored with ``state`` and the RNGs from ``loaded``.

        ``state`` is the fresh run's trainer state; it must hold ``step`` (0) and ``log_history`` ([]).
        ``tracking``: who this run is for the trackers of ``report_to`` (``trainer/trackers.py``).
        """
        optimizer = build_optimizer(model, config)
        scheduler = build_scheduler(optimizer, config, optimizer_steps)
        if loaded:
            if loaded.optimizer is None:  # a sharded checkpoint: each rank reads its own slices
                load_optimizer_state(model, optimizer, loaded.path / STATE_DIR)
            elif is_sharded(model):  # a single-process (or multi-host) checkpoint: every rank reads it whole
                load_full_optimizer_state(optimizer, loaded.optimizer)
            else:
                optimizer.load_state_dict(loaded.optimizer)
            scheduler.load_state_dict(loaded.scheduler)
            set_rng_state(loaded.rng)
            state = loaded.trainer_state
            changed = sorted(k for k, v in config.model_dump(mode="json").items() if loaded.config.get(k) != v)
            if changed:
                logger.warning("resuming %s with a changed config: %s", loaded.path, changed)
            logger.info("resumed from %s at step %d", loaded.path, state["step"])
        return cls(name, config, ctx, output_dir, model, tokenizer, optimizer, scheduler, state, max_steps,
                   list(callbacks or []), tracking)

    def end_step(self, step: int, metrics: dict[str, Any] | None, **progress: float) -> None:
        """Close ``step``: log ``metrics`` (None: not a logging step), the progress line (``progress``: its
        fields), ``on_step``; then the checkpoint when due (every ``save_steps`` and at ``max_steps``)."""
        self.state["step"] = step
        if metrics is not None:
            self.state["log_history"].append({"step": step, **metrics})
        if self.ctx.is_main:
            if metrics is not None:
                self.writer.write(step, metrics)
            self.progress.update(step, **progress)
            if metrics is not None:
                call_callbacks(self.callbacks, "on_step", step, self.max_steps, metrics)
        if self.saves_at(step):
            self.save_checkpoint(step)

    def run_steps(self, items: list[Any], stream: Any, step_fn: Callable[[list[Any]], StepValues], *, what: str,
                  window: str, started: float, last_metrics: Callable[[], dict[str, float]] | None = None) -> None:
        """The step loop SFT and reward-model training share, from the step after ``state["step"]`` to
        ``max_steps``: each step's rows are the next ``per_device_train_batch_size x gradient_accumulation_steps``
        of ``items`` in the seeded ``stream`` (``PromptStream``: addressed by position, so a resumed run sees the
        same batches); ``step_fn(rows)`` runs the forward and backward passes and returns the step's values: those
        averaged over the logging window (``train/loss`` first; kept in ``state[window]``, so they survive a resume)
        and those reported as of the logging step. Then the optimiser step; every ``logging_steps`` and at the
        last step the metrics (the averages, ``train/grad_norm``, ``train/learning_rate``, the current values,
        ``train/elapsed_s`` since ``started``, and at the last step ``last_metrics()``). A non-finite loss raises
        FloatingPointError naming ``what`` (not worth a retry)."""
        config, state = self.config, self.state
        per_step = config.per_device_train_batch_size * config.gradient_accumulation_steps
        for step in range(state["step"] + 1, self.max_steps + 1):
            averaged, current = step_fn([items[i] for i in stream.rows_at((step - 1) * per_step, per_step)])
            loss = averaged["train/loss"]
            if not math.isfinite(loss):
                raise FloatingPointError(f"non-finite {what} loss {loss} at step {step}; lower learning_rate")
            grad_norm = optimizer_step(self.model, self.optimizer, self.scheduler, config.max_grad_norm, self.ctx)
            learning_rate = self.scheduler.get_last_lr()[0]
            values = list(averaged.values())
            state[window].append(values[0] if len(values) == 1 else values)  # one value: a plain float
            metrics = None
            if step % config.logging_steps == 0 or step == self.max_steps:
                rows = [w if isinstance(w, list) else [w] for w in state[window]]
                metrics = {name: sum(r[j] for r in rows) / len(rows) for j, name in enumerate(averaged)}
                metrics.update({"train/grad_norm": grad_norm, "train/learning_rate": learning_rate, **current,
                                "train/elapsed_s": time.time() - started})
                if step == self.max_steps and last_metrics is not None:
                    metrics.update(last_metrics())
                state[window] = []
            self.end_step(step, metrics, loss=loss, lr=learning_rate)

    def log_table(self, step: int, table: Table) -> None:
        """A completion table at ``step`` (rank 0 writes it: ``completions.jsonl`` and the trackers)."""
        if self.ctx.is_main:
            self.writer.write_table(step, table)

    def saves_at(self, step: int) -> bool:
        """Whether ``end_step(step)`` writes a checkpoint (every ``save_steps`` and at ``max_steps``)."""
        return step % self.config.save_steps == 0 or step == self.max_steps

    def save_checkpoint(self, step: int) -> None:
        """Rank 0 writes ``checkpoint-{step}``; under FSDP every rank first writes its shards of weights and
        optimizer state into it and hashes them for the manifest (on one host: ``sharded_state``), or joins the
        gathers (across hosts)."""
        full_model, full_optim, digests = None, None, None
        sharded = is_sharded(self.model) and all_ranks_on_one_host(self.ctx.world_size)
        if sharded:
            folder = temp_checkpoint_dir(self.output_dir, step)
            if self.ctx.is_main:
                reset_dir(folder)
            barrier(self.ctx)
            save_sharded_state(self.model, self.optimizer, folder / STATE_DIR)
            own = hash_own_shards(folder, self.ctx.rank, self.ctx.world_size)  # the shard this rank just wrote
            digests = {name: d for part in gather_objects([own], self.ctx) for name, d in part.items()}
        elif is_sharded(self.model):  # every rank joins the gathers; rank 0 writes
            full_model, full_optim = gather_model_state(self.model), gather_optimizer_state(self.optimizer, self.ctx)
        if self.ctx.is_main:
            path = save_checkpoint(
                self.output_dir, step, model=self.model, tokenizer=self.tokenizer, optimizer=self.optimizer,
                scheduler=self.scheduler, trainer_state=self.state, config=self.config_json,
                save_total_limit=self.config.save_total_limit, model_state_dict=full_model,
                optimizer_state_dict=full_optim, config_name=config_file(self.name), sharded_state=sharded,
                keep_steps=protected_steps(self.state), state_digests=digests,
            )
            call_callbacks(self.callbacks, "on_checkpoint", step, path)
        barrier(self.ctx)

    def finish(self, base_model: Path | str) -> Path:
        """Save ``output_dir/final`` with the resolved config (rank 0; every rank joins the FSDP gather) in
        ``config.save_dtype`` (auto: ``base_model``'s dtype, ``resolve_save_dtype``); its path."""
        final = self.output_dir / "final"
        full_model = gather_model_state(self.model) if is_sharded(self.model) else None
        if self.ctx.is_main:
            dtype = resolve_save_dtype(self.config.save_dtype, base_model)
            save_final_model(self.model, self.tokenizer, final, state_dict=full_model,
                             json_files={config_file(self.name): self.config_json}, dtype=dtype)
        barrier(self.ctx)
        return final

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    def __enter__(self) -> "TrainingRun":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def save_final_model(model: torch.nn.Module, tokenizer: Any, path: Path, state_dict: dict[str, torch.Tensor] | None = None,
                     json_files: dict[str, Any] | None = None, dtype: torch.dtype | None = None) -> None:
    """``save_pretrained`` model (or ``state_dict``, gathered from shards), tokenizer and ``json_files``
    (name -> object, e.g. the resolved trainer config) into ``path``, atomically; floating-point tensors in
    ``dtype`` when given (config.json's ``dtype`` says so), the model itself left as it is."""
    tmp = path.with_name(f".tmp-{path.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    adapted = None
    if is_peft_model(model):  # LoRA: the merged model as a plain folder, the adapter beside it (trainer/lora.py)
        adapted, model, state_dict = model, model.get_base_model(), merged_state_dict(model)
        dtype = dtype or torch.float32  # merged tensors are fp32 whatever the frozen base's dtype
    recast = dtype is not None and (dtype != model.dtype or adapted is not None)
    if recast:
        state_dict = cast_state_dict(model.state_dict() if state_dict is None else state_dict, dtype)
    model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
    if recast:  # save_pretrained writes the module's dtype (fp32), not the tensors'
        config = json.loads((tmp / "config.json").read_text())
        name = str(dtype).removeprefix("torch.")
        config.update({key: name for key in ("dtype", "torch_dtype") if key in config} or {"dtype": name})
        write_json(tmp / "config.json", config)
    tokenizer.save_pretrained(tmp)
    if adapted is not None:
        save_adapter(adapted, tmp / ADAPTER_DIR)
    for name, obj in (json_files or {}).items():
        write_json(tmp / name, obj)
    if path.exists():
        shutil.rmtree(path)
    os.rename(tmp, path)


def cast_state_dict(state_dict: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``state_dict`` with its floating-point tensors in ``dtype``; names sharing one tensor (tied weights) share
    the cast copy too, so ``save_pretrained`` still sees them as tied."""
    cast: dict[int, torch.Tensor] = {}
    out = {}
    for name, tensor in state_dict.items():
        if tensor.is_floating_point() and tensor.dtype != dtype:
            if id(tensor) not in cast:
                cast[id(tensor)] = tensor.detach().to(dtype)
            tensor = cast[id(tensor)]
        out[name] = tensor
    return out
