"""Server mode under FSDP (``trainer/server_ranks.py`` with a sharded policy), two gloo processes against the server's
real HTTP layer on a fake engine: the weight-sync check hashes the full tensors (a sampler that answers digests, as
vLLM on a GPU does), and a push that fails mid-way ends every rank with the server's error instead of leaving one
inside an FSDP gather rank 0 never joins."""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from grpo_core.generation import server_process
from grpo_core.generation.base import tensor_digest
from grpo_core.generation.serve import build_app
from grpo_core.models.tiny import build_tiny_model
from tests.grpo_core.test_vllm_server import FakeEngine, Served

FAIL_WAIT = 30  # s: the bound for every rank to fail after a push breaks


class DigestEngine(FakeEngine):
    """A sampler that reports the hash of each tensor it holds (vLLM on a GPU)."""

    def weights_digest(self, names):
        return {n: (str(self.state[n].dtype), tensor_digest(self.state[n])) for n in names if n in self.state}


def rank_main(rank: int, world: int, port: int, url: str, model_dir: str, scenario: str, out: str) -> None:
    """One FSDP trainer process; what it saw goes to ``out/rank{r}.json``. ``digest``: push, check, change one
    element of rank 1's shard of a probed weight, check again. ``failed_push``: push into a server that refuses the
    second chunk."""
    from transformers import AutoModelForCausalLM

    from grpo_core.generation.server_client import ServerBackend
    from grpo_core.trainer.distributed import DistContext
    from grpo_core.trainer.fsdp import shard_model
    from grpo_core.trainer.server_ranks import RankZeroServer
    from grpo_core.trainer.weight_sync import SyncCheck, push_weights

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    ctx = DistContext(rank=rank, world_size=world, local_rank=rank, device=torch.device("cpu"))
    seen: dict = {}
    try:
        model = shard_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), ctx)
        backend = RankZeroServer(lambda: ServerBackend(url, timeout=10, chunk_bytes=4096), ctx)
        check = SyncCheck(model)
        seen["names"] = check.names
        if scenario == "digest":
            push_weights(backend, model)
            try:
                check(backend, model, "after the push")
                seen["first"] = "verified"
            except Exception as exc:
                seen["first"] = f"{type(exc).__name__}: {exc}"
            with torch.no_grad():  # the trainer moves a weight the sampler never gets: only rank 1's rows
                if rank == 1:
                    model.get_parameter(check.names[0]).to_local()[0, 0] += 1.0
            try:
                check(backend, model, "after a missed push")
                seen["second"] = "verified"
            except Exception as exc:
                seen["second"] = f"{type(exc).__name__}: {exc}"
        else:
            start = time.monotonic()
            try:
                backend.update_weights(model)
                seen["error"] = None
            except Exception as exc:
                seen["error"] = f"{type(exc).__name__}: {exc}"
            seen["seconds"] = time.monotonic() - start
        backend.close()
    except Exception as exc:  # the report says where the rank failed
        seen["crash"] = f"{type(exc).__name__}: {exc}"
    finally:
        Path(out, f"rank{rank}.json").write_text(json.dumps(seen))
        dist.destroy_process_group()


def run_ranks(tmp_path: Path, served: Served, scenario: str) -> list[dict]:
    model_dir = build_tiny_model(tmp_path / "tiny", hidden_size=32, num_layers=2, num_heads=2)
    ranks = mp.start_processes(rank_main, args=(2, server_process.free_port("127.0.0.1"), served.url, str(model_dir),
                                                scenario, str(tmp_path)), nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + 240  # start-up on a busy machine; a rank left in a collective is a failure
    try:
        while not ranks.join(timeout=2):
            if time.monotonic() > deadline:
                pytest.fail("a trainer process was still running after 240 s: " + ", ".join(
                    f"rank {r}: {'done' if (tmp_path / f'rank{r}.json').exists() else 'waiting'}" for r in range(2)))
    finally:
        for process in ranks.processes:
            if process.is_alive():
                process.kill()
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def test_fsdp_digest_check_hashes_the_full_tensors(tmp_path):
    engine = DigestEngine()
    served = Served(engine)
    try:
        seen = run_ranks(tmp_path, served, "digest")
    finally:
        served.stop()
    assert "crash" not in seen[0] and "crash" not in seen[1], seen
    assert engine.pushes == 1 and set(seen[0]["names"]) <= set(engine.state)
    assert seen[0]["first"] == seen[1]["first"] == "verified"
    # one element of rank 1's shard changed: a shard's hash on rank 0 would still match; the full tensor's does not
    for rank in range(2):
        assert seen[rank]["second"].startswith("WeightSyncError: weight sync after a missed push: the sampler's "
                                               f"{seen[0]['names'][0]} is not the trainer's"), seen[rank]


def test_fsdp_push_failing_midway_fails_every_rank_with_the_servers_error(tmp_path):
    from fastapi.responses import JSONResponse

    engine = DigestEngine()
    app = build_app(engine)
    chunks = []

    @app.middleware("http")
    async def refuse_second_chunk(request, call_next):
        if request.url.path == "/update_weights/chunk":
            chunks.append(1)
            if len(chunks) == 2:
                return JSONResponse({"detail": "disk full on the server"}, status_code=500)
        return await call_next(request)

    served = Served(engine, app=app)
    try:
        seen = run_ranks(tmp_path, served, "failed_push")
    finally:
        served.stop()
    assert "crash" not in seen[0] and "crash" not in seen[1], seen
    assert engine.pushes == 0 and len(chunks) == 2  # rank 0 stopped at the refused chunk
    assert seen[0]["error"].startswith("VLLMServerError: the vLLM server at") and "HTTP 500" in seen[0]["error"]
    assert seen[1]["error"].startswith("VLLMServerError: rank 0 failed while pushing the policy's weights for every "
                                       "trainer process: VLLMServerError: ")
    assert "HTTP 500" in seen[1]["error"] and "disk full on the server" in seen[1]["error"]
    assert seen[0]["seconds"] < FAIL_WAIT and seen[1]["seconds"] < FAIL_WAIT, seen
