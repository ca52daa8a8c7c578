"""Sharded (DCP) checkpoints hashed where they are written and read (``trainer/checkpoint.py``): two gloo FSDP ranks
save a checkpoint and resume from it; each rank hashes its own shard (rank 0 never reads rank 1's at save, neither
rank reads the other's at resume), and a corrupt shard that only rank 1 checks makes both ranks skip the checkpoint."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from grpo_core.generation import server_process
from grpo_core.models.tiny import build_tiny_model


def rank_main(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    """Save checkpoint-1 from a sharded model, resume from it, then (rank 1's shard corrupted) resume again; the
    files each phase hashed and what the last resume loaded go to ``out/rank{r}.json``."""
    from transformers import AutoTokenizer

    from grpo_core.config import GRPOConfig
    from grpo_core.trainer import checkpoint
    from grpo_core.trainer.distributed import DistContext
    from grpo_core.trainer.skeleton import TrainingRun, load_policy

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ctx = DistContext(rank=rank, world_size=world, local_rank=rank, device=torch.device("cpu"))
    hashed: list[str] = []
    sha256 = checkpoint._sha256
    checkpoint._sha256 = lambda path: (hashed.append(Path(path).as_posix()), sha256(path))[1]
    seen: dict = {}
    output = Path(out) / "run"
    try:
        config = GRPOConfig(use_vllm=False, distributed_strategy="fsdp", report_to=[], torch_num_threads=1)
        model, _ = load_policy("grpo", model_dir, output, config, ctx, resume=False)
        run = TrainingRun.start("grpo", config, ctx, output, model, AutoTokenizer.from_pretrained(model_dir), None,
                                max_steps=1, optimizer_steps=1, state={"step": 0, "log_history": []})
        run.save_checkpoint(1)
        seen["save"], hashed[:] = list(hashed), []
        _, loaded = load_policy("grpo", model_dir, output, config, ctx, resume=True)
        seen["resume"], seen["resumed"], hashed[:] = list(hashed), loaded is not None, []
        dist.barrier()
        if rank == 0:  # one flipped byte in the shard only rank 1 checks
            shard = output / "checkpoint-1" / "state" / "__1_0.distcp"
            data = bytearray(shard.read_bytes())
            data[len(data) // 2] ^= 0xFF
            shard.write_bytes(bytes(data))
        dist.barrier()
        _, loaded = load_policy("grpo", model_dir, output, config, ctx, resume=True)
        seen["corrupt_resumed"] = loaded is not None
    except Exception as exc:  # the report says where the rank failed
        seen["crash"] = f"{type(exc).__name__}: {exc}"
    finally:
        Path(out, f"rank{rank}.json").write_text(json.dumps(seen))
        dist.destroy_process_group()


def state_files(paths: list[str]) -> set[str]:
    """The ``state/`` files among hashed paths, by name."""
    return {Path(p).name for p in paths if Path(p).parent.name == "state"}


def test_each_rank_hashes_its_own_shards_at_save_and_resume(tmp_path):
    model_dir = build_tiny_model(tmp_path / "tiny", hidden_size=32, num_layers=2, num_heads=2)
    ranks = mp.start_processes(rank_main, args=(2, server_process.free_port("127.0.0.1"), str(model_dir),
                                                str(tmp_path)), nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + 240  # start-up on a busy machine; a rank left in a collective is a failure
    try:
        while not ranks.join(timeout=2):
            if time.monotonic() > deadline:
                pytest.fail("a process was still running after 240 s: " + ", ".join(
                    f"rank {r}: {'done' if (tmp_path / f'rank{r}.json').exists() else 'waiting'}" for r in range(2)))
    finally:
        for process in ranks.processes:
            if process.is_alive():
                process.kill()
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert "crash" not in seen[0] and "crash" not in seen[1], seen
    manifest = json.loads((tmp_path / "run" / "checkpoint-1" / "manifest.json").read_text())["files"]
    assert {n for n in manifest if n.startswith("state/")} == {"state/.metadata", "state/__0_0.distcp",
                                                                "state/__1_0.distcp"}
    # save: each rank its own shard (rank 0 also the metadata); the manifest lists all three
    assert state_files(seen[0]["save"]) == {".metadata", "__0_0.distcp"}
    assert state_files(seen[1]["save"]) == {"__1_0.distcp"}
    assert any(Path(p).name == "trainer_state.json" for p in seen[0]["save"]) and len(seen[1]["save"]) == 1
    # resume: the same split, and both ranks check the small files they read whole
    assert state_files(seen[0]["resume"]) == {".metadata", "__0_0.distcp"}
    assert state_files(seen[1]["resume"]) == {"__1_0.distcp"}
    assert all(any(Path(p).name == "trainer_state.json" for p in seen[r]["resume"]) for r in range(2))
    assert seen[0]["resumed"] and seen[1]["resumed"]
    # a shard only rank 1 checks is corrupt: both ranks skip the checkpoint (neither loads it, none waits)
    assert not seen[0]["corrupt_resumed"] and not seen[1]["corrupt_resumed"]
