"""One step's rollouts: prompts from the stream, G completions each, scored by the reward functions
(``grpo_core.rewards.scoring.score_completions``, the same call evaluation and rejection sampling make).

Each rank generates and scores its whole groups (``distributed.shard`` by prompt), then every rank
receives every group (``gather_objects``), so what follows (advantages, DAPO filtering, metrics) is
the same computation whatever the number of processes.

With ``sampling.tools`` a completion is a multi-turn trajectory (``generation/trajectory.py``): the model's turns
and the tool turns that answer its calls, scored on its whole text (the final answer after the last tool turn,
``calc_accuracy``), its tool tokens in the sequence but out of the loss (``update.build_train_batch``).

DAPO dynamic sampling (Yu et al. 2025, sec. 3.2): groups whose G rewards are flat (``loss.flat_groups``)
carry no advantage; they are dropped and further rounds are generated until the step has
``prompts_per_step`` informative groups or ``max_dynamic_sampling_rounds`` extra rounds were spent.
With a data mixture each source refills its own quota (its share of the step): a source near its
ceiling is not replaced by another source's groups. Departure: when the cap is hit the step trains on
the informative groups it has (fewer than asked) rather than padding with uninformative ones; with none
at all it keeps the first round.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from grpo_core.config import GRPOConfig
from grpo_core.generation import GenerationBackend, GenerationRequest, Rollout
from grpo_core.generation.prompts import encode_prompts
from grpo_core.generation.trajectory import TrajectoryStats, add_trajectory_counts, generate_trajectories
from grpo_core.rewards.scoring import score_completions
from grpo_core.seeds import derive_seed
from grpo_core.tools import ToolSet
from grpo_core.trainer.distributed import DistContext, gather_objects, shard
from grpo_core.trainer.loss import flat_groups
from grpo_core.trainer.mixture import Mixture


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
    *,
    tools: ToolSet | None = None,
    stats: TrajectoryStats | None = None,
) -> ScoredGroups:
    """Generate and score the groups of stream positions ``position .. position + num_prompts - 1``; each row
    is scored by its own source's reward functions (``mixture.routes``). ``tools`` (``sampling.tools``): multi-turn
    rollouts whose tool calls ``tools`` answers (``generate_trajectories``; ``stats`` gets their counts), of at most
    ``sampling.max_turns`` model turns and ``max_completion_length`` tokens in all, tool turns included, so a
    trajectory fits the context a single-turn completion does."""
    prompt_ids, request, truncated = group_request(tokenizer, mixture, position, num_prompts, step, config, ctx,
                                                   tools=tools)
    start = time.perf_counter()
    if tools is None:
        rollouts = backend.generate(prompt_ids, request)
    elif getattr(backend, "has_rollout", False):  # async_rollouts: the sampler process builds the trajectories
        rollouts, counts = backend.generate_rollout(prompt_ids, request)  # type: ignore[attr-defined]
        add_trajectory_counts(counts, stats, tools)
    else:
        rollouts = generate_trajectories(backend, tokenizer, prompt_ids, request, tools,
                                         max_turns=config.sampling.max_turns,
                                         max_total_tokens=config.sampling.max_completion_length, stats=stats)
    timings["time/generate"] = timings.get("time/generate", 0.0) + time.perf_counter() - start
    return score_groups(rollouts, truncated, mixture, position, num_prompts, config, ctx, timings)


def group_request(tokenizer: Any, mixture: Mixture, position: int, num_prompts: int, step: int, config: GRPOConfig,
                  ctx: DistContext, *, tools: ToolSet | None = None
                  ) -> tuple[list[list[int]], GenerationRequest, list[bool]]:
    """``(prompt_ids, the generate request, truncated)`` of this rank's share of the groups at ``position``; chat
    prompts carry the ``tools``' schemas when given."""
    G = config.sampling.num_generations
    positions = list(range(position, position + num_prompts))
    rows = [mixture.rows[i] for i in mixture.rows_at(position, num_prompts)]
    local_positions, local_rows = shard(positions, ctx), shard(rows, ctx)
    # under long_prompts "drop" train_grpo removed the over-long rows before the stream was built (a prompt
    # skipped here would leave the step a group short), so here the policy can only truncate
    encoded = encode_prompts(tokenizer, [row["prompt"] for row in local_rows], config.sampling.max_prompt_length,
                             "truncate", tools=tools.schemas() if tools is not None else None)
    seeds = [derive_seed(config.seed, step, p, j) for p in local_positions for j in range(G)]
    s = config.sampling
    request = GenerationRequest(n=G, max_tokens=s.max_completion_length, temperature=s.temperature, top_p=s.top_p,
                                top_k=s.top_k, seeds=seeds)
    return encoded.ids, request, encoded.truncated


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


@dataclass
class StepGroups:
    """What ``collect_step_groups`` gathered for one step."""

    train: ScoredGroups  # the groups trained on
    generated: ScoredGroups  # every group generated, the dropped ones included
    position: int  # the next free prompt-stream position
    rounds: int  # generation rounds spent
    informative: int  # groups of ``train`` that carry an advantage (0 when the step fell back to a flat round)
    short: list[int]  # [S] per source: groups its quota still lacked after the last round (dynamic sampling)


def source_at(position: int, quotas: Sequence[int]) -> int:
    """The source of stream ``position`` in the mixture layout: of each block of ``sum(quotas)`` positions the
    first ``quotas[0]`` are source 0's, the next ``quotas[1]`` source 1's, ... (``trainer/mixture.py``)."""
    offset = position % sum(quotas)
    for s, n in enumerate(quotas):
        if offset < n:
            return s
        offset -= n
    raise AssertionError("unreachable: offset < sum(quotas)")


def refill_slices(block: int, quotas: Sequence[int], have: Sequence[int]) -> list[tuple[int, int]]:
    """``(position, count)`` ranges of block ``block`` (its first position) that belong to the sources still
    short of their quota, adjacent ranges merged (one generate call each)."""
    out: list[tuple[int, int]] = []
    offset = 0
    for n, h in zip(quotas, have):
        if h < n:
            if out and out[-1][0] + out[-1][1] == block + offset:
                out[-1] = (out[-1][0], out[-1][1] + n)
            else:
                out.append((block + offset, n))
        offset += n
    return out


def collect_step_groups(
    generate: Callable[[int, int], ScoredGroups],
    position: int,
    config: GRPOConfig,
    combine: Callable[[ScoredGroups], torch.Tensor],
    first: ScoredGroups | None = None,
    quotas: Sequence[int] | None = None,
) -> StepGroups:
    """The step's groups (``StepGroups``); ``generate(position, count)`` makes groups, ``combine(groups)`` gives
    their completions' combined rewards ``[P*G]``; ``first``: the first round's groups when already generated
    (asynchronous rollouts: their stream positions were taken when they were submitted, so ``position``, the
    next free one, is not advanced for them); ``quotas``: groups per step of each source in the mixture layout
    (``Mixture.counts``; None: one source of all ``prompts_per_step``).

    Dynamic sampling fills each source's quota with its own informative groups: a refill round generates, of the
    next block of positions, only the slices of the sources still short, and a source's informative groups past
    its quota are dropped. A source still short after ``max_dynamic_sampling_rounds`` trains on what it has;
    another source's groups never take its place (the step keeps the configured mixture, ``short`` says by how
    much a source missed it)."""
    P, G = config.prompts_per_step, config.sampling.num_generations
    quotas = list(quotas or [P])
    if sum(quotas) != P or position % P:
        raise ValueError(f"quotas {quotas} must sum to prompts_per_step ({P}) and position {position} start a "
                         "block of it (the mixture layout)")
    if first is None:
        first = generate(position, P)
        position += P
    informative = informative_groups(combine(first), G)
    if not config.dynamic_sampling:
        return StepGroups(first, first, position, 1, len(informative), [0] * len(quotas))
    have = [0] * len(quotas)

    def take(groups: ScoredGroups, informative: list[int]) -> ScoredGroups:
        """``groups``' informative groups of the sources with room left, in generation order."""
        chosen = []
        for g in informative:
            s = source_at(groups.positions[g], quotas)
            if have[s] < quotas[s]:
                have[s] += 1
                chosen.append(g)
        return groups.select(chosen, G)

    generated, kept, rounds = first, take(first, informative), 1
    while have != quotas and rounds <= config.max_dynamic_sampling_rounds:
        for start, count in refill_slices(position, quotas, have):
            more = generate(start, count)
            generated, kept = generated.extend(more), kept.extend(take(more, informative_groups(combine(more), G)))
        position += P
        rounds += 1
    short = [n - h for n, h in zip(quotas, have)]
    if len(kept) == 0:  # nothing carried an advantage: the first round, whose loss is the KL term alone
        return StepGroups(first, generated, position, rounds, 0, short)
    return StepGroups(kept, generated, position, rounds, len(kept), short)
