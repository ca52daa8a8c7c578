"""One step's rollouts: prompts from the stream, G completions each, scored by the reward functions
(``grpo_core.rewards.scoring.score_completions``, the same call evaluation and rejection sampling make).

Each rank generates and scores its whole groups (``distributed.shard`` by prompt), then every rank
receives every group (``gather_objects``), so what follows (advantages, DAPO filtering, metrics) is
the same computation whatever the number of processes.

DAPO dynamic sampling (Yu et al. 2025, sec. 3.2): groups whose G rewards are all equal carry no
advantage; they are dropped and further rounds of ``prompts_per_step`` prompts are generated until
the step has ``prompts_per_step`` informative groups or ``max_dynamic_sampling_rounds`` extra rounds
were spent. Departure: when the cap is hit the step trains on the informative groups it has (fewer
than asked) rather than padding with uninformative ones; with none at all it keeps the first round.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from grpo_core.config import GRPOConfig
from grpo_core.generation import GenerationBackend, Rollout
from grpo_core.rewards.scoring import score_completions
from grpo_core.seeds import derive_seed
from grpo_core.trainer.distributed import DistContext, gather_objects, shard
from grpo_core.trainer.loss import flat_groups
from grpo_core.trainer.mixture import Mixture
from grpo_core.trainer.prompts import encode_prompts


@dataclass
class ScoredGroups:
    positions: list[int]  # [P] stream position of each group's prompt
    rows: list[dict[str, Any]]  # [P] the dataset rows
    rollouts: list[Rollout]  # [P*G] a group's G completions contiguous
    rewards_per_func: torch.Tensor  # [P*G, R] NaN where a function returned None
    truncated: list[bool]  # [P] whether the group's prompt was cut to max_prompt_length

    def __len__(self) -> int:
        return len(self.positions)

    def select(self, groups: list[int], num_generations: int) -> "ScoredGroups":
        seqs = [g * num_generations + j for g in groups for j in range(num_generations)]
        return ScoredGroups(
            [self.positions[g] for g in groups],
            [self.rows[g] for g in groups],
            [self.rollouts[i] for i in seqs],
            self.rewards_per_func[seqs],
            [self.truncated[g] for g in groups],
        )

    def extend(self, other: "ScoredGroups") -> "ScoredGroups":
        return ScoredGroups(
            self.positions + other.positions,
            self.rows + other.rows,
            self.rollouts + other.rollouts,
            torch.cat([self.rewards_per_func, other.rewards_per_func]),
            self.truncated + other.truncated,
        )


def generate_groups(
    backend: GenerationBackend,
    tokenizer: Any,
    mixture: Mixture,
    position: int,
    num_prompts: int,
    step: int,
    config: GRPOConfig,
    ctx: DistContext,
    timings: dict[str, float],
) -> ScoredGroups:
    """Generate and score the groups of stream positions ``position .. position + num_prompts - 1``; each row
    is scored by its own source's reward functions (``mixture.routes``)."""
    prompt_ids, kwargs, truncated = group_request(tokenizer, mixture, position, num_prompts, step, config, ctx)
    start = time.perf_counter()
    rollouts = backend.generate(prompt_ids, **kwargs)
    timings["time/generate"] = timings.get("time/generate", 0.0) + time.perf_counter() - start
    return score_groups(rollouts, truncated, mixture, position, num_prompts, config, ctx, timings)


def group_request(tokenizer: Any, mixture: Mixture, position: int, num_prompts: int, step: int, config: GRPOConfig,
                  ctx: DistContext) -> tuple[list[list[int]], dict[str, Any], list[bool]]:
    """``(prompt_ids, generate keywords, truncated)`` of this rank's share of the groups at ``position``."""
    G = config.sampling.num_generations
    positions = list(range(position, position + num_prompts))
    rows = [mixture.rows[i] for i in mixture.rows_at(position, num_prompts)]
    local_positions, local_rows = shard(positions, ctx), shard(rows, ctx)
    # under long_prompts "drop" train_grpo removed the over-long rows before the stream was built (a prompt
    # skipped here would leave the step a group short), so here the policy can only truncate
    encoded = encode_prompts(tokenizer, [row["prompt"] for row in local_rows], config.sampling.max_prompt_length, "truncate")
    seeds = [derive_seed(config.seed, step, p, j) for p in local_positions for j in range(G)]
    kwargs = dict(n=G, max_tokens=config.sampling.max_completion_length, temperature=config.sampling.temperature, top_p=config.sampling.top_p,
                  top_k=config.sampling.top_k, seeds=seeds)
    return encoded.ids, kwargs, encoded.truncated


def score_groups(rollouts: list[Rollout], truncated: list[bool], mixture: Mixture, position: int, num_prompts: int,
                 config: GRPOConfig, ctx: DistContext, timings: dict[str, float]) -> ScoredGroups:
    """Score this rank's rollouts of the groups at ``position`` (each row by its source's reward functions) and
    gather every rank's groups."""
    G = config.sampling.num_generations
    positions = list(range(position, position + num_prompts))
    rows = [mixture.rows[i] for i in mixture.rows_at(position, num_prompts)]
    local_rows = shard(rows, ctx)
    start = time.perf_counter()
    rewards = score_completions(mixture.funcs, mixture.reward_names, local_rows, rollouts, G,
                                config.sampling.max_completion_length, mixture.routes(local_rows) if mixture.mixed else None)
    timings["time/reward"] = timings.get("time/reward", 0.0) + time.perf_counter() - start
    gathered = gather_objects([(rollouts, rewards, truncated)], ctx)
    all_rollouts = [r for part, _, _ in gathered for r in part]
    all_rewards = torch.cat([rw for _, rw, _ in gathered])  # [P*G, R]
    all_truncated = [t for _, _, part in gathered for t in part]  # [P]
    return ScoredGroups(positions, rows, all_rollouts, all_rewards, all_truncated)


def informative_groups(rewards: torch.Tensor, num_generations: int) -> list[int]:
    """Indices of groups whose rewards ``[P*G]`` are not flat (``loss.flat_groups``: the same test that gives a
    group 0 advantages, so a group is kept exactly when it carries an advantage)."""
    return [g for g, flat in enumerate(flat_groups(rewards, num_generations).tolist()) if not flat]


def collect_step_groups(
    generate: Callable[[int, int], ScoredGroups],
    position: int,
    config: GRPOConfig,
    combine: Callable[[ScoredGroups], torch.Tensor],
    first: ScoredGroups | None = None,
) -> tuple[ScoredGroups, ScoredGroups, int, int]:
    """``(train_groups, all_generated, new_position, rounds)``; ``generate(position, count)`` makes groups,
    ``combine(groups)`` gives their completions' combined rewards ``[P*G]``; ``first``: the first round's
    groups when already generated (asynchronous rollouts: their stream positions were taken when they were
    submitted, so ``position``, the next free one, is not advanced for them)."""
    P, G = config.prompts_per_step, config.sampling.num_generations
    if first is None:
        first = generate(position, P)
        position += P
    if not config.dynamic_sampling:
        return first, first, position, 1
    generated = first
    kept = first.select(informative_groups(combine(first), G), G)
    rounds = 1
    while len(kept) < P and rounds <= config.max_dynamic_sampling_rounds:
        more = generate(position, P)
        position += P
        rounds += 1
        generated = generated.extend(more)
        kept = kept.extend(more.select(informative_groups(combine(more), G), G))
    if len(kept) == 0:
        return first, generated, position, rounds
    return kept.select(list(range(min(P, len(kept)))), G), generated, position, rounds
