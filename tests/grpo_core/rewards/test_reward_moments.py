"""A reward model's running moments (``normalize: true`` without ``reward_stats.json``) under several trainer
processes: each rank scores its share of a step, and the moments merge every rank's scores, so two gloo processes
map the same completions to the same rewards as one process (``trainer.loop.build_mixture``, ``score_groups``).
A mixture puts one step's reward-model rows all on rank 0: rank 1 still joins the merge (called with no rows)."""

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
from grpo_core.generation.base import Rollout
from grpo_core.models.tiny import build_tiny_model
from grpo_core.trainer.distributed import DistContext

G = 2
# (stream position, prompts). A step's 4 positions are 3 of source a (the reward model) then 1 of b: the first
# step gives rank 0 two a rows and rank 1 an a and a b row; the second (positions 7, 8: b, then the next block's
# first a) gives rank 0 none of a's rows.
STEPS = ((0, 4), (7, 2))


def tiny_reward_model(root: Path) -> Path:
    """A random-init sequence classifier (num_labels=1) with the tiny tokenizer: scores that differ by text."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    lm = build_tiny_model(root / "lm", hidden_size=32, num_layers=1, num_heads=2)
    config = AutoConfig.from_pretrained(lm, num_labels=1)
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(root / "rm")
    AutoTokenizer.from_pretrained(lm).save_pretrained(root / "rm")
    return root / "rm"


def score_steps(rm: str, ctx: DistContext) -> dict:
    """Each step's gathered rewards ``[P*G, R]`` and the reward model's moments after them."""
    from grpo_core.config import GRPOConfig
    from grpo_core.trainer.distributed import shard
    from grpo_core.trainer.loop import build_mixture
    from grpo_core.trainer.rollouts import score_groups

    normalised = {"reward_model": {"model": rm, "scope": "full", "normalize": True}}
    config = GRPOConfig(use_vllm=False, generation_batch_size=4 * G, num_generations=G, max_completion_length=8,
                        sources=[{"name": "a", "weight": 3.0, "reward_funcs": [normalised]},
                                 {"name": "b", "weight": 1.0, "reward_funcs": ["format"]}])
    rows = [{"prompt": f"question {i}", "source": src} for src in "ab" for i in range(4)]
    mixture = build_mixture(config, rows, None, ctx)
    out: dict = {"rewards": []}
    for position, count in STEPS:
        local = shard(list(range(position, position + count)), ctx)
        rollouts = [Rollout([1], [5, 6], None, truncated=False, text=f"answer {p * 7 % 5} take {j}" * (1 + j))
                    for p in local for j in range(G)]
        groups = score_groups(rollouts, [False] * len(local), mixture, position, count, config, ctx, {})
        out["rewards"].append(groups.rewards_per_func.tolist())
    out["moments"] = mixture.funcs[0].moments.state_dict()
    return out


def rank_main(rank: int, world: int, port: int, rm: str, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        seen = score_steps(rm, DistContext(rank=rank, world_size=world, local_rank=rank, device=torch.device("cpu")))
    except Exception as exc:  # the report says where the rank failed
        seen = {"crash": f"{type(exc).__name__}: {exc}"}
    finally:
        dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(seen))


def test_two_processes_normalise_reward_model_scores_as_one(tmp_path):
    rm = tiny_reward_model(tmp_path)
    one = score_steps(str(rm), DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu")))
    ranks = mp.start_processes(rank_main, args=(2, server_process.free_port("127.0.0.1"), str(rm), str(tmp_path)),
                               nprocs=2, join=False, start_method="spawn")
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
    assert one["moments"]["count"] == (3 + 1) * G  # source a's rows of the two steps, G completions each
    first = torch.tensor(one["rewards"][0])[:, 0]  # [P*G] the reward model's column of step 1
    assert first[: 3 * G].std() > 0.1 and first[3 * G :].isnan().all()  # a's rows scored and normalised; b's not
    for rank in range(2):
        for got, want in zip(seen[rank]["rewards"], one["rewards"]):
            torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=1e-9, rtol=0, equal_nan=True)
        for key, value in one["moments"].items():
            assert seen[rank]["moments"][key] == pytest.approx(value, abs=1e-9), key
