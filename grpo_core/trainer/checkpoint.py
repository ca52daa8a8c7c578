"""Atomic, verifiable, resumable checkpoints.

Layout of ``output_dir/checkpoint-N`` (loadable with ``from_pretrained`` as is)::

    model.safetensors, config.json, generation_config.json, tokenizer files   (save_pretrained)
    optimizer.pt, scheduler.pt, rng_state.pt (python, numpy, torch, cuda)
    state/               instead of model.safetensors and optimizer.pt under FSDP: each rank's shards of both
                         (``torch.distributed.checkpoint``, see ``sharded_state.py``); not loadable by from_pretrained
    trainer_state.json   step, prompt-stream position, optimiser steps, metrics history
    grpo_config.json     the resolved trainer config (config.json is the model's; sft_config.json for SFT)
    manifest.json        sha256 of every file above; written last, it marks the checkpoint complete

Everything is written into ``.tmp-checkpoint-N``, fsynced, then renamed, so a crash leaves either a
complete checkpoint or a temp folder that is never read. On resume the newest checkpoint whose files
match their hashes and load is used; any other is reported (naming the file) and skipped.

Sharded state (``state/``, FSDP on one host) is hashed where it is written and read: at save each rank hashes the
DCP shard it wrote (``hash_own_shards``; rank 0 ``.metadata`` too) and rank 0 writes those digests into the
manifest; at resume each rank checks the shards of its rank number (modulo the process count) and the small files,
then the ranks agree (one all-gather), so a bad shard skips the checkpoint on every rank together. A 7B run's
weights and Adam state (~84 GB) are hashed once over all ranks, not once per rank.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from grpo_core.trainer.sharded_state import STATE_DIR, has_sharded_state

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_DCP_SHARD = re.compile(r"^__(\d+)_\d+\.distcp$")  # torch.distributed.checkpoint's file of rank N


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message names the file."""


@dataclass
class LoadedCheckpoint:
    path: Path
    model: torch.nn.Module
    trainer_state: dict[str, Any]
    optimizer: dict[str, Any] | None  # None: in the DCP shards under path/state (``sharded_state``)
    scheduler: dict[str, Any]
    rng: dict[str, Any]
    config: dict[str, Any]


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def hashing_rank(name: str, world_size: int) -> int | None:
    """Which rank hashes checkpoint file ``name`` (relative to the checkpoint) among ``world_size``: a DCP shard
    ``state/__{r}_{i}.distcp`` rank ``r``'s (modulo ``world_size``: N ranks' checkpoint resumed on M), the rest of
    ``state/`` rank 0's; None for the files outside it (small; every rank reads them whole, so each checks them)."""
    parts = Path(name).parts
    if len(parts) != 2 or parts[0] != STATE_DIR:
        return None
    shard = _DCP_SHARD.match(parts[1])
    return int(shard.group(1)) % world_size if shard else 0


def hash_own_shards(checkpoint: Path, rank: int, world_size: int) -> dict[str, str]:
    """sha256 of the files of ``checkpoint/state`` that ``rank`` hashes (``hashing_rank``), by relative name."""
    names = sorted(f"{STATE_DIR}/{p.name}" for p in (checkpoint / STATE_DIR).iterdir() if p.is_file())
    return {name: _sha256(checkpoint / name) for name in names if hashing_rank(name, world_size) == rank}


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, obj: Any) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def list_checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of the complete-named checkpoints, oldest first."""
    if not output_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in output_dir.iterdir() if p.is_dir() and (m := _CHECKPOINT.match(p.name))]
    return sorted(found)


def remove_temp_checkpoints(output_dir: Path) -> None:
    for p in output_dir.glob(".tmp-*"):
        shutil.rmtree(p, ignore_errors=True)


def save_checkpoint(
    output_dir: Path,
    step: int,
    *,
    model: torch.nn.Module,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    trainer_state: dict[str, Any],
    config: dict[str, Any],
    save_total_limit: int,
    model_state_dict: dict[str, torch.Tensor] | None = None,
    optimizer_state_dict: dict[str, Any] | None = None,
    config_name: str = "grpo_config.json",
    sharded_state: bool = False,
    keep_steps: tuple[int, ...] = (),
    state_digests: dict[str, str] | None = None,
) -> Path:
    """Write ``checkpoint-{step}`` atomically, then delete all but the newest ``save_total_limit`` and those of
    ``keep_steps`` (``select_checkpoint: heldout``'s best so far: ``trainer/selection.py``).

    ``model_state_dict``/``optimizer_state_dict``: full states gathered from a sharded (FSDP) model;
    default: the model's and optimizer's own. ``sharded_state``: every rank has already written its shards of
    both into ``temp_checkpoint_dir(output_dir, step)/state`` (``sharded_state.save_sharded_state``); only the
    model's config is written beside them, and ``state_digests`` (every rank's ``hash_own_shards``) are their
    hashes, so this rank does not read the other ranks' shards. ``config_name``: the file holding ``config``.
    """
    final = output_dir / f"checkpoint-{step}"
    tmp = temp_checkpoint_dir(output_dir, step)
    if sharded_state:
        model.config.save_pretrained(tmp)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(tmp)
    else:
        reset_dir(tmp)
        model.save_pretrained(tmp, safe_serialization=True, state_dict=model_state_dict)
        torch.save(optimizer_state_dict if optimizer_state_dict is not None else optimizer.state_dict(),
                   tmp / "optimizer.pt")
    tokenizer.save_pretrained(tmp)
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    torch.save(rng_state(), tmp / "rng_state.pt")
    write_json(tmp / "trainer_state.json", trainer_state)
    write_json(tmp / config_name, config)
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    for p in files:
        _fsync(p)
    given = state_digests or {}
    names = [p.relative_to(tmp).as_posix() for p in files]
    write_json(tmp / MANIFEST, {"step": step, "files": {n: given.get(n) or _sha256(tmp / n) for n in names}})
    _fsync(tmp)
    if final.exists():  # a run restarted with resume=False overwrites its old checkpoints
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync(output_dir)
    for old_step, old in list_checkpoints(output_dir)[:-save_total_limit]:
        if old_step not in keep_steps:
            shutil.rmtree(old, ignore_errors=True)
    return final


def temp_checkpoint_dir(output_dir: Path, step: int) -> Path:
    """Where ``checkpoint-{step}`` is written before its rename."""
    return output_dir / f".tmp-checkpoint-{step}"


def reset_dir(path: Path) -> None:
    """``path`` as a new empty folder (a half-written one from a killed run is removed)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


def verify_checkpoint(path: Path, rank: int = 0, world_size: int = 1) -> dict[str, Any]:
    """The manifest, after checking the sha256 of every listed file that ``rank`` of ``world_size`` hashes
    (``hashing_rank``: all of them in one process); ``CheckpointError`` names the bad file."""
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"{manifest_path} is missing: the checkpoint was not completed")
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
    except (ValueError, KeyError) as e:
        raise CheckpointError(f"{manifest_path} is unreadable: {e}") from e
    for name, digest in files.items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{file} is missing")
        if hashing_rank(name, world_size) not in (None, rank):  # another rank's shard: it checks that one
            continue
        if _sha256(file) != digest:
            raise CheckpointError(f"{file} is corrupt: its sha256 does not match {MANIFEST}")
    return manifest


def _load(file: Path, reader: Callable[[Path], Any]) -> Any:
    try:
        return reader(file)
    except Exception as e:  # any reader failure means this file, not the code, is bad
        raise CheckpointError(f"{file} is unreadable: {type(e).__name__}: {e}") from e


def verify_shares(path: Path) -> None:
    """``verify_checkpoint`` on every rank: of a sharded checkpoint each rank checks its share and all learn the
    first problem any rank found (every rank on one host reads the same folder, so all call this together); of a
    gathered one, which every rank reads whole, each checks all of it."""
    if not (has_sharded_state(path) and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        verify_checkpoint(path)
        return
    problem = None
    try:
        verify_checkpoint(path, dist.get_rank(), dist.get_world_size())
    except CheckpointError as e:
        problem = str(e)
    problems: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(problems, problem)  # every rank skips a checkpoint that any rank found bad
    if found := next((p for p in problems if p), None):
        raise CheckpointError(found)


def load_checkpoint(path: Path, load_model: Callable[[Path], torch.nn.Module],
                    config_name: str = "grpo_config.json") -> LoadedCheckpoint:
    verify_shares(path)
    sharded = has_sharded_state(path)  # the optimizer's shards are read once the optimizer exists
    return LoadedCheckpoint(
        path=path,
        model=_load(path / (STATE_DIR if sharded else "model.safetensors"), lambda _: load_model(path)),
        trainer_state=_load(path / "trainer_state.json", lambda f: json.loads(f.read_text())),
        optimizer=None if sharded else _load(path / "optimizer.pt",
                                             lambda f: torch.load(f, map_location="cpu", weights_only=True)),
        scheduler=_load(path / "scheduler.pt", lambda f: torch.load(f, map_location="cpu", weights_only=True)),
        rng=_load(path / "rng_state.pt", lambda f: torch.load(f, map_location="cpu", weights_only=False)),
        config=_load(path / config_name, lambda f: json.loads(f.read_text())),
    )


def load_latest_checkpoint(output_dir: Path, load_model: Callable[[Path], torch.nn.Module],
                           config_name: str = "grpo_config.json") -> LoadedCheckpoint | None:
    """The newest usable checkpoint; unusable ones are logged as errors (naming the file) and skipped."""
    for step, path in reversed(list_checkpoints(output_dir)):
        try:
            return load_checkpoint(path, load_model, config_name)
        except CheckpointError as e:
            logger.error("cannot resume from checkpoint-%d: %s; falling back to the previous checkpoint", step, e)
    return None
