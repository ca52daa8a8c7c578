"""The stage table: the one place the R1 pipeline's stages are defined.

Everything else follows from it: the stage flows (``flows/stages.py``), the pipeline's order
(``flows/r1_pipeline.py`` runs the stages in table order), upstream lookups, the CLI's help, the
report's rows and the deployments (``flows/deploy.py`` renders ``infra/prefect.yaml`` from it). Adding a
stage is one entry here plus its task module (a ``stage_task`` body in ``tasks/``).

Readers look the table up through ``all_stages()`` / ``get_stage()`` at call time, so a test can put a
temporary entry into ``STAGES`` and see it everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

from tasks.cold_start_sft import cold_start_sft
from tasks.config import PipelineConfig
from tasks.final_rl import final_rl
from tasks.grpo_train import grpo_train
from tasks.prepare_data import prepare_data
from tasks.rejection_sample import rejection_sample
from tasks.reward_model import enabled as reward_model_enabled, reward_model, reward_model_upstream
from tasks.reward_model import upstream as reward_model_inputs
from tasks.sft_consolidate import sft_consolidate, upstream as consolidate_upstream

Kind = Literal["data", "sft", "rl", "sampling", "reward"]
Pool = Literal["cpu", "gpu"]


@dataclass(frozen=True)
class Stage:
    """One stage: its name (the same in the CLI, config, store paths, Prefect task, flow and deployment names),
    its task, the stages whose committed outputs it reads, what it makes, the work pool it runs on, and (an
    optional stage) when it runs."""

    name: str
    task: Any  # a ``tasks.common.stage_task``: (config, run, store, inputs, force) -> StageRef
    upstream: tuple[str, ...] | Callable[[PipelineConfig], tuple[str, ...]]
    kind: Kind
    pool: Pool
    description: str
    when: Callable[[PipelineConfig], bool] | None = None  # None: always; else the stage runs when it is true

    def enabled(self, config: PipelineConfig) -> bool:
        """Whether ``config`` runs this stage (the pipeline skips it otherwise; status shows it as skipped)."""
        return self.when is None or self.when(config)

    @property
    def makes_model(self) -> bool:
        """Its output holds ``model/``; it is evaluated after it commits."""
        return self.kind in ("sft", "rl")

    @property
    def flow_name(self) -> str:
        return self.name.replace("_", "-")

    def inputs(self, config: PipelineConfig) -> tuple[str, ...]:
        """The upstream stages this stage reads under ``config``."""
        return self.upstream(config) if callable(self.upstream) else self.upstream


STAGES: tuple[Stage, ...] = (
    Stage("prepare_data", prepare_data, (), "data", "cpu",
          "Stage 1: prompts, answers and the cold-start set, written as parquet to the store."),
    Stage("cold_start_sft", cold_start_sft, ("prepare_data",), "sft", "gpu",
          "Stage 2: SFT of the base model on long chain-of-thought samples."),
    Stage("reward_model", reward_model, reward_model_inputs, "reward", "gpu",
          "Optional (a `reward_model:` section): a reward model trained on preference pairs (Bradley-Terry).",
          when=reward_model_enabled),
    Stage("grpo_train", grpo_train,
          lambda c: ("prepare_data", "cold_start_sft") + reward_model_upstream(c.grpo_train), "rl", "gpu",
          "Stage 3: GRPO on verifiable rewards (torchrun when the pool's job sets R1_NPROC_PER_NODE > 1)."),
    Stage("rejection_sample", rejection_sample,
          lambda c: ("prepare_data", "grpo_train") + reward_model_upstream(c.rejection_sample), "sampling", "gpu",
          "Stage 4: rejection sampling from the GRPO model (vLLM where installed)."),
    Stage("sft_consolidate", sft_consolidate, consolidate_upstream, "sft", "gpu",
          "Stage 5: SFT on the rejection-sampled set."),
    Stage("final_rl", final_rl,
          lambda c: ("prepare_data", "sft_consolidate") + reward_model_upstream(c.final_rl), "rl", "gpu",
          "Stage 6: GRPO with the broader reward mix."),
)


def all_stages() -> tuple[Stage, ...]:
    """The table, in pipeline order (every stage after the stages it reads)."""
    return STAGES


def stage_names() -> list[str]:
    return [s.name for s in STAGES]


def get_stage(name: str) -> Stage:
    for s in STAGES:
        if s.name == name:
            return s
    raise UnknownStage(f"unknown stage {name!r}; stages are {', '.join(stage_names())}")


class UnknownStage(ValueError):
    """A stage name that is not in the table; the message lists the stages."""
