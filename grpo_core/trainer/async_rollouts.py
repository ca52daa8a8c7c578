"""Asynchronous rollouts (``async_rollouts: true``): the rollouts of the next ``async_max_staleness`` (k) steps are
generated while step n trains (k = 1: verl's one-step-off; AReaL calls k ``max_head_offpolicyness``).

The sampler runs in its own process (``generation.process.ProcessBackend``). Schedule, per step n:

1. the first round of step n's groups is the one submitted during step n-k (or earlier, at step 1; at step 1,
   or a resume without them: generated now); DAPO's extra rounds, if any, are generated now (after every round
   in flight: the sampler answers in order);
2. the first rounds of the steps up to n+k not yet submitted are submitted to the sampler, which holds the
   weights of step n-1 (at step 1: steps 2..k+1, all with the initial weights);
3. step n trains; then the trainer waits for step n+1's rollouts (bounded by ``async_sampler_timeout``) and
   scores them (at a checkpoint step: every round in flight, so the checkpoint holds them all), keeps them in
   the trainer state, and pushes its new weights to the sampler (shared memory, written in place: no file).

So step n trains on completions ``async/staleness`` optimiser steps stale (0 at step 1, then up to k), corrected by
the sampler importance weights against the behaviour policy's log-probs (always on here: the sampler is never
the trainer's own forward). Stream positions are taken in submission order (``stream_position`` is the next
free one), so they do not depend on k's timing. The received rounds are part of the trainer state, so a
checkpoint carries them and a resumed run trains on exactly the rollouts the uninterrupted run would have.
The sampler holds its weights in the trainer's dtype on the trainer's device (``sampler_placement``;
``async_sampler_dtype`` / ``async_sampler_device`` to choose others), never in the dtype its checkpoint was saved in:
a bf16 base and a resumed run's fp32 checkpoint sample alike, which exact resume needs.
Several training ranks (torchrun): each rank starts its own sampler process (a full replica, on its own device)
and submits its own share of every round's groups (``group_request`` shards them as the synchronous sampler
does); ``score_groups`` gathers every rank's groups, so all ranks hold the same received rounds (rank 0's state
is every rank's) and N ranks train on the rollouts one process would (seeds follow the prompt, not the rank).
Every rank pushes its weights at the same point (FSDP2 gathers each tensor whole: a collective). On one CPU
machine every rank pins its sampler to the same last cores (``split_cpus`` sees each rank's whole affinity).
With k > 1 the trainer waits, each step, for one step's rollouts; the deeper queue absorbs steps whose
generation or training runs long, it does not add overlap.

Reference log-probs (``ReferenceLogps``, when ``beta > 0`` and ``async_reference_on_sampler``): the reference
model is frozen, so its log-probs of a rollout do not depend on staleness. The sampler process loads it (the
initial model, once) and computes them for every round it generates, micro-batch by micro-batch as the trainer's
``compute_batch_logps`` would; they travel with the rollouts (``Rollout.ref_logprobs``, kept in the trainer state
with them) and the trainer neither keeps a reference model nor runs its forward.

Tool calls (``sampling.tools``): a round submitted ahead is a batch of multi-turn trajectories, built where the
sampler is (``ToolRollouts``, the sampler's rollout function: the tools run in the sampler process, turn after turn
on its backend, as ``generation.trajectory.generate_trajectories`` does in the trainer's); their counts (turns,
calls, errors, per tool) come back with the rollouts, are kept in the trainer state with them, and are added to the
``tools/...`` of the step that trains on them. The rounds the trainer waits for (step 1, DAPO's extra rounds) are
built by the sampler's rollout function too (``rollouts.generate_groups``), so a reference model on the sampler
(``ReferenceLogps``) scores every trajectory whole.

Cores (``split_cpus``): on a CPU machine the sampler is pinned to the last ``async_sampler_threads`` cores this
process may use and the trainer's torch threads are capped at the cores left, so the two overlap instead of
time-sharing (on 2 cores: one each; measured by ``tests/benchmarks/async_vs_sync.py``).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import deque
from typing import Any

import torch

from grpo_core.config import GRPOConfig
from grpo_core.generation import GenerationRequest, Rollout
from grpo_core.generation.process import ProcessBackend
from grpo_core.generation.trajectory import TrajectoryStats, generate_trajectories, trajectory_counts
from grpo_core.tools import ToolSet
from grpo_core.trainer.distributed import DistContext
from grpo_core.trainer.dtypes import SAVE_DTYPES
from grpo_core.trainer.mixture import Mixture
from grpo_core.trainer.rollouts import ScoredGroups, group_request, score_groups
from grpo_core.trainer.skeleton import load_model
from grpo_core.trainer.update import build_train_batch, compute_batch_logps

logger = logging.getLogger(__name__)


def sampler_placement(config: GRPOConfig, trainer_dtype: torch.dtype, trainer_device: torch.device
                      ) -> tuple[torch.dtype, torch.device]:
    """``(dtype, device)`` of the sampler process's weights: ``async_sampler_dtype`` (auto: the trainer's weights',
    never the checkpoint's own, so a bf16 base and a resumed fp32 checkpoint sample alike) and
    ``async_sampler_device`` (None: the trainer's device; a CPU trainer's sampler is on the CPU)."""
    dtype = trainer_dtype if config.async_sampler_dtype == "auto" else SAVE_DTYPES[config.async_sampler_dtype]
    device = trainer_device if config.async_sampler_device is None else torch.device(config.async_sampler_device)
    return dtype, device


def split_cpus(sampler_threads: int, device: torch.device) -> tuple[set[int] | None, int | None]:
    """``(sampler cores, trainer threads)``: on CPU, the last ``sampler_threads`` of this process's cores for the
    sampler and at most the rest as the trainer's thread count; ``(None, None)`` on an accelerator or when there
    are too few cores to split (then both share them, as the operating system schedules)."""
    if device.type != "cpu" or not hasattr(os, "sched_getaffinity"):
        return None, None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) <= sampler_threads:
        logger.warning("async_rollouts: %d core(s) for a sampler of %d thread(s) and the trainer; they share them "
                       "(set async_sampler_threads below the core count to give each its own)", len(cores),
                       sampler_threads)
        return None, None
    sampler = set(cores[-sampler_threads:])
    trainer_threads = min(torch.get_num_threads(), len(cores) - sampler_threads)
    logger.info("async_rollouts: sampler on core(s) %s, trainer on %d thread(s) of core(s) %s", sorted(sampler),
                trainer_threads, cores[:-sampler_threads])
    return sampler, trainer_threads


class ReferenceLogps:
    """Sets ``Rollout.ref_logprobs``: the reference model's (``model_path``) log-probs of each completion token.

    Built in the trainer, used in the sampler process (``ProcessBackend(annotate=...)``): ``load()`` there loads
    the model as the trainer would (``load_model``: fp32 on ``device``, eval mode); each call pads the rollouts
    into a ``TrainBatch`` and runs ``compute_batch_logps`` (the trainer's own function, its micro-batches of
    ``per_device_train_batch_size``), so the values are those the trainer would compute (float rounding aside).
    """

    def __init__(self, model_path: str, config: GRPOConfig, pad_token_id: int, device: str = "cpu") -> None:
        self.model_path, self.config, self.pad_token_id, self.device = model_path, config, pad_token_id, device
        self.model: torch.nn.Module | None = None

    def __getstate__(self) -> dict[str, Any]:  # sent to the child before load(): never a model
        return {**self.__dict__, "model": None}

    def load(self) -> None:
        self.model = load_model(self.model_path, torch.device(self.device)).eval().requires_grad_(False)

    def __call__(self, rollouts: list[Rollout]) -> list[Rollout]:
        assert self.model is not None, "ReferenceLogps.load() first"
        if not rollouts:
            return rollouts
        batch = build_train_batch(rollouts, torch.zeros(len(rollouts)), self.pad_token_id, mask_truncated=False)
        logps = compute_batch_logps(self.model, batch, list(range(len(rollouts))), self.config,
                                    torch.device(self.device))  # [N, Tc]
        for r, row in zip(rollouts, logps):
            r.ref_logprobs = row[: len(r.completion_ids)].tolist()
        return rollouts


class ToolRollouts:
    """The sampler's rollout function with tools (``ProcessBackend(rollout=...)``): ``generate_trajectories`` on the
    sampler's own backend with the tools of ``sampling.tools``, loaded in the sampler process (``load()``) with
    ``model_path``'s tokenizer; returns the rollouts and their ``trajectory_counts``."""

    def __init__(self, tool_specs: list[str], model_path: str, max_turns: int, max_total_tokens: int) -> None:
        self.tool_specs, self.model_path = list(tool_specs), model_path
        self.max_turns, self.max_total_tokens = max_turns, max_total_tokens
        self.tools: ToolSet | None = None
        self.tokenizer: Any = None

    def __getstate__(self) -> dict[str, Any]:  # sent to the child before load(): never the tools or tokenizer
        return {**self.__dict__, "tools": None, "tokenizer": None}

    def load(self) -> None:
        from transformers import AutoTokenizer

        self.tools = ToolSet.from_specs(self.tool_specs, field="sampling.tools")
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)

    def __call__(self, backend: Any, prompt_ids: list[list[int]], request: GenerationRequest
                 ) -> tuple[list[Rollout], dict[str, Any]]:
        assert self.tools is not None, "ToolRollouts.load() first"
        self.tools.reset_stats()
        stats = TrajectoryStats()
        rollouts = generate_trajectories(backend, self.tokenizer, prompt_ids, request, self.tools,
                                         max_turns=self.max_turns, max_total_tokens=self.max_total_tokens, stats=stats)
        return rollouts, trajectory_counts(stats, self.tools)


class NextRollouts:
    """The sampler process and the first rounds of the coming steps: in flight (submitted, in order) or received.

    Each round is submitted with the sampler's weights at that moment, whose policy version (optimiser steps
    taken) is recorded with it: a step's staleness is its policy version minus its rollouts' version.
    """

    def __init__(self, backend: ProcessBackend, tokenizer: Any, mixture: Mixture, config: GRPOConfig,
                 ctx: DistContext, *, tools: ToolSet | None = None) -> None:
        self.backend, self.tokenizer, self.mixture, self.config, self.ctx = backend, tokenizer, mixture, config, ctx
        self.tools = tools  # sampling.tools: the rounds are the sampler's ToolRollouts (prompts with the schemas)
        self._in_flight: deque[tuple[int, int, list[bool], int]] = deque()  # (step, position, truncated, version)
        # step -> (first round's groups, version, with tools the sampler's trajectory_counts of them, else None)
        self.received: dict[int, tuple[ScoredGroups, int, dict[str, Any] | None]] = {}

    def planned(self, step: int) -> bool:
        return step in self.received or any(s == step for s, *_ in self._in_flight)

    def submit(self, position: int, step: int, version: int) -> None:
        """Start generating the first round of ``step`` (stream ``position``) with the sampler's current weights
        (policy ``version``)."""
        prompt_ids, request, truncated = group_request(self.tokenizer, self.mixture, position,
                                                      self.config.prompts_per_step, step, self.config, self.ctx,
                                                      tools=self.tools)
        self.backend.submit(prompt_ids, request, rollout=self.tools is not None)
        self._in_flight.append((step, position, truncated, version))

    def collect(self, timings: dict[str, float], until: int | None = None) -> None:
        """Wait for the rounds in flight (those of steps up to ``until``; all when None) and score them."""
        while self._in_flight and (until is None or self._in_flight[0][0] <= until):
            step, position, truncated, version = self._in_flight.popleft()
            start = time.perf_counter()
            rollouts = self.backend.result()
            timings["time/wait_sampler"] = timings.get("time/wait_sampler", 0.0) + time.perf_counter() - start
            for key, value in self.backend.last_timings.items():  # the sampler's own seconds, beside the training
                timings[f"time/sampler_{key}"] = timings.get(f"time/sampler_{key}", 0.0) + value
            groups = score_groups(rollouts, truncated, self.mixture, position, self.config.prompts_per_step,
                                  self.config, self.ctx, timings)
            self.received[step] = (groups, version, self.backend.last_extra)

    def take(self, step: int) -> tuple[ScoredGroups, int, dict[str, Any] | None] | None:
        return self.received.pop(step, None)

    def to_state(self) -> list[dict[str, Any]]:
        """The received rounds, JSON-able for ``trainer_state.json`` (call ``collect()`` first: a checkpoint
        must hold every round generated with weights older than itself)."""
        assert not self._in_flight, "to_state() with rounds in flight: collect() first"
        return [{"step": s, "version": v, **groups_to_state(g), **({"tool_counts": c} if c is not None else {})}
                for s, (g, v, c) in sorted(self.received.items())]

    def load_state(self, saved: list[dict[str, Any]]) -> None:
        if not isinstance(saved, list):
            raise ValueError("this checkpoint's next_rollouts were saved by an older async_rollouts (one dict, before "
                             "async_max_staleness); resume it with that version or start the stage again (resume=False)")
        self.received = {int(d["step"]): (groups_from_state(d, self.mixture), int(d["version"]), d.get("tool_counts"))
                         for d in saved}


def groups_to_state(groups: ScoredGroups) -> dict[str, Any]:
    """A JSON-able form of ``groups`` for ``trainer_state.json`` (rows are re-read from the stream)."""
    rewards = [[None if math.isnan(v) else v for v in row] for row in groups.rewards_per_func.tolist()]
    return {
        "positions": groups.positions,
        "rollouts": [[r.prompt_ids, r.completion_ids, r.logprobs, r.truncated, r.text, r.ref_logprobs, r.tool_mask]
                     for r in groups.rollouts],
        "rewards_per_func": rewards,
        "truncated": groups.truncated,
    }


def groups_from_state(saved: dict[str, Any], mixture: Mixture) -> ScoredGroups:
    positions = saved["positions"]
    rows = [mixture.rows[i] for i in mixture.rows_at(positions[0], len(positions))]
    # the fields after text (ref_logprobs, tool_mask) in Rollout's order; older states saved fewer of them
    rollouts = [Rollout(list(p), list(c), lp, bool(t), text, *rest) for p, c, lp, t, text, *rest in saved["rollouts"]]
    rewards = torch.tensor([[math.nan if v is None else v for v in row] for row in saved["rewards_per_func"]])
    return ScoredGroups(list(positions), rows, rollouts, rewards, list(saved["truncated"]))
