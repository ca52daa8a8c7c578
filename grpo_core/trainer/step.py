"""One GRPO step as named calls: ``generate``, ``score``, ``advantages``, ``optimise``, ``log``, ``evaluate`` (every
``eval_steps``), ``log_completions`` and ``save``.

``GRPOSteps`` holds what every step uses (the policy, the sampler, the mixture, the training run) so that
``train_grpo``'s loop reads as the algorithm: one call per phase, in the order they run. The order is part
of the contract: completions are seeded by ``(seed, step, position, j)`` and the sampler answers its rounds in
the order they were submitted, so a resumed or distributed run repeats the same computation bit for bit.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from grpo_core.config import EvalConfig, GRPOConfig
from grpo_core.generation import GenerationBackend, release_memory
from grpo_core.generation.trajectory import TrajectoryStats, add_trajectory_counts
from grpo_core.rewards import pop_reward_stats
from grpo_core.rewards.scoring import load_reward_states, passes, reward_states
from grpo_core.tools import ToolSet
from grpo_core.trainer.async_rollouts import NextRollouts
from grpo_core.trainer.distributed import DistContext, gather_objects
from grpo_core.trainer.during_rl import evaluate_during_rl
from grpo_core.trainer.loss import combine_rewards, compute_group_advantages
from grpo_core.trainer.metrics import (completion_metrics, completion_table, reward_metrics,
                                      source_completion_metrics, tool_metrics)
from grpo_core.trainer.mixture import (
    Mixture,
    per_source_scale,
    source_group_metrics,
    source_labels,
    source_reward_metrics,
)
from grpo_core.trainer.monitor import best_evaluation
from grpo_core.trainer.rollouts import ScoredGroups, collect_step_groups, generate_groups
from grpo_core.trainer.server_ranks import local_sampler
from grpo_core.trainer.skeleton import TrainingRun, call_callbacks
from grpo_core.trainer.update import build_train_batch, optimise
import grpo_core.trainer.weight_sync as weight_sync

logger = logging.getLogger(__name__)


@dataclass
class StepRollouts:
    """What ``GRPOSteps.generate`` made for one step."""

    groups: ScoredGroups  # the groups trained on (DAPO dynamic sampling: the informative ones)
    generated: ScoredGroups  # every group generated this step, the dropped ones included (its metrics)
    position: int  # the next free prompt-stream position after this step
    rounds: int  # generation rounds spent (dynamic sampling)
    staleness: int  # async_rollouts: optimiser steps between the sampler's weights and this step's policy
    informative: int  # groups trained on that carry an advantage
    short: list[int]  # [S] per source: groups its quota lacked (dynamic sampling, ``collect_step_groups``)


@dataclass
class StepRewards:
    """Each completion's rewards combined over the reward functions, with its own source's weights."""

    generated: torch.Tensor  # [P*G] of StepRollouts.generated
    train: torch.Tensor  # [N] of StepRollouts.groups


@dataclass
class HeldOut:
    """What ``eval_steps`` evaluates: the fixed held-out slice and how it is scored (``during_rl.py``)."""

    config: EvalConfig
    rows: list[dict[str, Any]]
    monitor: Any = None  # evaluation.monitor.RewardMonitor: the proxy beside a held-out signal, per general source


class GRPOSteps:
    """The phases of a GRPO step, on the objects ``train_grpo`` set up once."""

    def __init__(self, config: GRPOConfig, ctx: DistContext, run: TrainingRun, model: torch.nn.Module,
                 ref_model: torch.nn.Module | None, tokenizer: Any, mixture: Mixture, backend: GenerationBackend,
                 next_rollouts: NextRollouts | None, *, sampling_correction: bool, num_dropped: int,
                 heldout: HeldOut | None = None, tools: ToolSet | None = None) -> None:
        self.config, self.ctx, self.run = config, ctx, run
        self.tools, self.trajectory_stats = tools, TrajectoryStats()  # sampling.tools: multi-turn rollouts
        self.model, self.ref_model, self.tokenizer = model, ref_model, tokenizer
        self.mixture, self.backend, self.next_rollouts = mixture, backend, next_rollouts
        self.sampling_correction, self.num_dropped, self.heldout = sampling_correction, num_dropped, heldout
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.num_updates = (config.steps_per_generation or 1) * config.num_iterations  # optimiser steps per step
        # LoRA (merged weights), a generation server (weights over HTTP), a sleeping engine (level 2 discards them)
        checked = weight_sync.checks_every_sync(model, config.sampling.vllm_mode, backend)
        self.sync_check = weight_sync.SyncCheck(model) if checked else None
        if self.sync_check is not None:  # the sampler was built from the base / runs apart: give it the policy
            self.sync_weights("before the first step (the policy as loaded)")
        self.warned_short: set[str | None] = set()
        self._restore_reward_state()
        pop_reward_stats()  # counts from before this run (another stage or run in this process) are not step 1's

    def _restore_reward_state(self) -> None:
        """A resumed run's reward functions get back their state (a reward model's running moments under
        ``normalize``, merged over every rank: ``reward_model.share_moments``), each rank its saved copy: the same
        score maps to the same reward as in the uninterrupted run."""
        saved = self.run.state.get("reward_state")
        if not saved:
            return
        if len(saved) != self.ctx.world_size:
            logger.warning("the checkpoint holds the reward functions' state of %d processes, this run has %d: each "
                           "starts from rank 0's", len(saved), self.ctx.world_size)
        load_reward_states(self.mixture.funcs, saved[self.ctx.rank] if len(saved) == self.ctx.world_size else saved[0])

    def generate(self, step: int, timings: dict[str, float]) -> StepRollouts:
        """The step's groups: ``prompts_per_step`` prompts x ``num_generations`` completions, each scored by its
        source's reward functions (more rounds under DAPO dynamic sampling); under ``async_rollouts`` the first
        round was generated earlier, and the rounds of the steps ahead are submitted here."""
        if self.tools is not None:  # the step's tool counts start at 0 (every round of the step adds to them)
            self.tools.reset_stats()
            self.trajectory_stats = TrajectoryStats()
        planned = self.next_rollouts.take(step) if self.next_rollouts is not None else None  # async: made earlier
        if planned is not None and planned[2] is not None:  # the sampler ran the tools for this round: the step's too
            add_trajectory_counts(planned[2], self.trajectory_stats, self.tools)
        first, staleness = (planned[0], step - 1 - planned[1]) if planned else (None, 0)
        generate_round = functools.partial(self._generate_round, step=step, timings=timings)
        collected = collect_step_groups(generate_round, self.run.state["stream_position"], self.config, self._combine,
                                        first=first, quotas=self.mixture.counts)
        self._warn_short(step, collected.short)
        position = collected.position
        if self.next_rollouts is not None:
            position = self._submit_ahead(step, position)
        release_memory(self.backend)  # vllm_enable_sleep_mode: the engine sleeps until update_weights wakes it
        return StepRollouts(collected.train, collected.generated, position, collected.rounds, staleness,
                            collected.informative, collected.short)

    def _warn_short(self, step: int, short: list[int]) -> None:
        """Warn the first time a source of a mixture misses its quota (``mixture/{source}/short`` counts it each step)."""
        if not self.mixture.mixed:
            return
        for name, missing, quota in zip(self.mixture.names, short, self.mixture.counts):
            if missing and name not in self.warned_short:
                self.warned_short.add(name)
                logger.warning("step %d: source %r trained %d of its %d groups a step: the rest were flat after %d "
                               "extra rounds (max_dynamic_sampling_rounds); other sources do not fill its share, "
                               "mixture/%s/short counts what it misses each step", step, name, quota - missing, quota,
                               self.config.max_dynamic_sampling_rounds, name)

    def _generate_round(self, position: int, count: int, *, step: int, timings: dict[str, float]) -> ScoredGroups:
        """One round of ``count`` groups from stream ``position`` (``collect_step_groups`` asks for each)."""
        if self.next_rollouts is not None:  # the sampler answers in order: the rounds in flight first
            self.next_rollouts.collect(timings)
        return generate_groups(self.backend, self.tokenizer, self.mixture, position, count, step, self.config,
                               self.ctx, timings, tools=self.tools, stats=self.trajectory_stats)

    def _submit_ahead(self, step: int, position: int) -> int:
        """Submit the first rounds of the steps up to ``async_max_staleness`` ahead, with the weights the sampler
        holds (step - 1's); returns the next free stream position."""
        assert self.next_rollouts is not None
        last = min(step + self.config.async_max_staleness, self.config.max_steps)
        for ahead in range(step + 1, last + 1):
            if not self.next_rollouts.planned(ahead):
                self.next_rollouts.submit(position, ahead, version=step - 1)
                position += self.config.prompts_per_step
        return position

    def _combine(self, groups: ScoredGroups) -> torch.Tensor:
        """``[P*G]`` each completion's rewards combined with its own source's weights."""
        return combine_rewards(groups.rewards_per_func, self.mixture.row_weights(groups.rows, self.config.sampling.num_generations))

    def score(self, rollouts: StepRollouts) -> StepRewards:
        """The combined rewards of every generated completion and of those trained on."""
        return StepRewards(self._combine(rollouts.generated), self._combine(rollouts.groups))

    def advantages(self, rollouts: StepRollouts, rewards: StepRewards) -> tuple[torch.Tensor, dict[str, float]]:
        """``(advantages [N], group metrics)``: group-relative advantages of the trained completions (one std per
        source under ``scale_rewards: batch`` with a mixture); the metrics are over every generated group."""
        G = self.config.sampling.num_generations
        _, group_metrics = compute_group_advantages(rewards.generated, G, self.config.scale_rewards)
        if self.mixture.mixed and self.config.scale_rewards == "batch":  # one std per source, not one over the mix
            centred, _ = compute_group_advantages(rewards.train, G, "none")
            labels = source_labels(rollouts.groups.rows, G)  # [N]
            return per_source_scale(centred, rewards.train, labels), group_metrics  # [N]
        advantages, _ = compute_group_advantages(rewards.train, G, self.config.scale_rewards)
        return advantages, group_metrics

    def optimise(self, step: int, rollouts: StepRollouts, advantages: torch.Tensor,
                 timings: dict[str, float]) -> dict[str, float]:
        """The step's optimiser steps on its groups, then the sampler gets the new weights; returns the update's
        metrics (``timings["time/train"]``: these seconds)."""
        batch = build_train_batch(rollouts.groups.rollouts, advantages, self.pad_token_id,
                                  self.config.mask_truncated_completions)
        start = time.perf_counter()
        metrics = optimise(self.model, self.ref_model, self.run.optimizer, self.run.scheduler, batch, self.config,
                           self.ctx, sampling_correction=self.sampling_correction)
        if self.next_rollouts is not None:  # the next step's round; at a checkpoint every round in flight
            saves = self.run.saves_at(step)
            self.next_rollouts.collect(timings, until=None if saves else step + 1)
            if saves:
                self.run.state["next_rollouts"] = self.next_rollouts.to_state()
        optimizer_steps = self.run.state["optimizer_steps"] + self.num_updates
        self.sync_weights(f"after step {step} (optimiser step {optimizer_steps})")  # the next step samples from the updated policy
        timings["time/train"] = time.perf_counter() - start
        return metrics

    def sync_weights(self, sync: str) -> None:
        """Push the policy's weights to the sampler; under LoRA (merged weights), a generation server (sent over
        HTTP) or vLLM sleep mode (woken and reloaded) check it holds them, failing the step with a message naming
        ``sync`` when it does not (``trainer/weight_sync.py``)."""
        weight_sync.push_weights(self.backend, self.model)
        if self.sync_check is not None:
            self.sync_check(self.backend, self.model, sync)

    def log(self, rollouts: StepRollouts, rewards: StepRewards, group_metrics: dict[str, float],
            update_metrics: dict[str, float], timings: dict[str, float], start: float) -> dict[str, Any]:
        """The step's metrics row (``start``: when the step began): rewards, completions, the update, timings."""
        end = time.perf_counter()
        config, generated, G = self.config, rollouts.generated, self.config.sampling.num_generations
        num_tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for r in generated.rollouts)
        labels = source_labels(generated.rows, G)
        prompts = [row.get("prompt") for row in generated.rows for _ in range(G)]  # [P*G]: the checking numbers read them
        correct = self._correct(generated)
        single = len(set(labels)) < 2  # one source: its checking numbers are the step's own keys
        metrics = {
            **group_metrics,
            **reward_metrics(generated.rewards_per_func, self.mixture.reward_names),
            **source_reward_metrics(rewards.generated, labels, G),
            **source_group_metrics(rollouts.groups.rows, self.mixture.names,
                                   rollouts.short if config.dynamic_sampling else None,
                                   fell_back=config.dynamic_sampling and rollouts.informative == 0),
            **self._reward_events(),
            **self._tool_metrics(),
            **completion_metrics(generated.rollouts, config.emergence.reflection_phrases,
                                 config.emergence.backtrack_phrases, prompts=prompts if single else None,
                                 correct=correct),
            **source_completion_metrics(generated.rollouts, labels, config.emergence.reflection_phrases,
                                        config.emergence.backtrack_phrases, prompts=prompts, correct=correct),
            "prompts/truncated": float(sum(generated.truncated)),
            "prompts/dropped": float(self.num_dropped),
            **update_metrics,
            "time/generate": timings.get("time/generate", 0.0),
            "time/reward": timings.get("time/reward", 0.0),
            "time/train": timings["time/train"],
            "time/step": end - start,
            **({"sampler/weights_verified": 1.0} if self.sync_check is not None else {}),  # else the step would have failed
            "tokens_per_second": num_tokens / (end - start),
        }
        if config.async_rollouts:
            metrics["async/staleness"] = float(rollouts.staleness)
            metrics["time/wait_sampler"] = timings.get("time/wait_sampler", 0.0)
            metrics["time/sampler_generate"] = timings.get("time/sampler_generate", 0.0)
            metrics["time/sampler_reference"] = timings.get("time/sampler_annotate", 0.0)
        if config.dynamic_sampling:
            metrics["dynamic_sampling/rounds"] = float(rollouts.rounds)
            metrics["dynamic_sampling/kept_groups"] = float(rollouts.informative)
        return metrics

    def _tool_metrics(self) -> dict[str, float]:
        """``tools/...`` of the step's trajectories on every rank (``metrics.tool_metrics``); {} without tools."""
        if self.tools is None:
            return {}
        return tool_metrics(gather_objects([(self.trajectory_stats, self.tools.stats())], self.ctx))

    def _correct(self, generated: ScoredGroups) -> list[bool]:
        """``[P*G]`` whether each completion passes its source's first reward function (``scoring.passes``: >= 1; a
        verifiable source's accuracy reward; NaN, no score, never passes): ``completions/{source}/accuracy``."""
        G = self.config.sampling.num_generations
        first = self.mixture.member.float().argmax(dim=1)  # [S] each source's first reward column
        cols = torch.tensor([int(first[self.mixture.source_index(r)]) for r in generated.rows],
                            dtype=torch.long).repeat_interleave(G)  # [P*G]
        if not len(cols) or not generated.rewards_per_func.shape[1]:
            return [False] * len(cols)
        return passes(generated.rewards_per_func[torch.arange(len(cols)), cols])  # [P*G]

    def evaluates_at(self, step: int) -> bool:
        return self.heldout is not None and step % (self.config.eval_steps or 1) == 0

    def evaluate(self, step: int) -> dict[str, float]:
        """``eval/...`` of the policy after ``step`` on the held-out slice, every ``eval_steps`` (rank 0 only; the
        sampler holds the updated weights); {} on other steps and ranks."""
        if not self.evaluates_at(step) or not self.ctx.is_main:
            return {}
        assert self.heldout is not None

        metrics = evaluate_during_rl(self.heldout.config, local_sampler(self.backend), self.tokenizer, self.heldout.rows)
        logger.info("step %d held-out accuracy %.3f pass@1 %.3f (%.1fs)", step, metrics.get("eval/accuracy", math.nan),
                    metrics.get("eval/pass@1", math.nan), metrics["time/eval"])
        if self.heldout.monitor is not None:
            metrics.update(self._monitor(step))
        return metrics

    def _monitor(self, step: int) -> dict[str, float]:
        """The reward-hacking monitor's numbers at ``step`` (``monitor.py``): each alarm is a warning and an
        ``on_alarm`` callback (the pipeline turns it into a Prefect event); under ``select_checkpoint: heldout``
        the best evaluated step so far is kept in the trainer state (its checkpoint is never pruned)."""

        history = self.run.state["log_history"]
        metrics, alarms = self.heldout.monitor.evaluate(local_sampler(self.backend), self.tokenizer, step, history)
        for alarm in alarms:
            logger.warning("step %d: %s (over the last %d evaluations, monitor_window)", step, alarm.message(),
                           self.config.monitor_window)
            call_callbacks(self.run.callbacks, "on_alarm", alarm.to_dict())
        if self.config.select_checkpoint == "heldout":
            best = best_evaluation([*history, {"step": step, **metrics}])
            if best is not None:
                self.run.state["best_checkpoint"] = {"step": best[0], "heldout": best[1]}
        return metrics

    def log_completions(self, step: int, rollouts: StepRollouts, rewards: StepRewards) -> None:
        """Every ``log_completions_steps`` (and at ``max_steps``): the step's generated completions as a table
        (rank 0's groups), to ``completions.jsonl`` and the trackers."""
        every = self.config.log_completions_steps
        if every is None or not (step % every == 0 or step == self.config.max_steps):
            return
        generated = rollouts.generated
        self.run.log_table(step, completion_table(generated.rollouts, generated.rows, generated.rewards_per_func,
                                                  self.mixture.reward_names, rewards.generated,
                                                  self.config.sampling.num_generations, self.tokenizer))

    def _reward_events(self) -> dict[str, float]:
        """The reward functions' event counts (timeouts, parse failures, ...) summed over every rank."""
        counts: dict[str, float] = {}
        for part in gather_objects([pop_reward_stats()], self.ctx):
            for k, v in part.items():
                counts[k] = counts.get(k, 0.0) + v
        return counts

    def save(self, step: int, rollouts: StepRollouts, metrics: dict[str, Any]) -> None:
        """Close the step: advance the stream and optimiser counters, log the row on logging steps, checkpoint
        when due (``TrainingRun.end_step``)."""
        state = self.run.state
        state["stream_position"] = rollouts.position
        state["optimizer_steps"] += self.num_updates
        if self.run.saves_at(step):  # every rank's reward state (each scores its own share of the groups)
            state["reward_state"] = gather_objects([reward_states(self.mixture.funcs)], self.ctx)
        logger.debug("step %d/%d reward %.3f loss %.4f (%.2fs)", step, self.config.max_steps,
                     metrics["reward"], metrics["loss"], metrics["time/step"])
        logged = step % self.config.logging_steps == 0 or step == self.config.max_steps or self.evaluates_at(step)
        self.run.end_step(step, metrics if logged else None, loss=metrics["loss"], reward=metrics["reward"],
                          lr=metrics["learning_rate"])
