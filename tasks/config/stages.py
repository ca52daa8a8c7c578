"""The stage table: the one place the R1 pipeline's stages are defined, each entry carrying all about its stage.

An entry names the stage (the same in the CLI, config, store paths, Prefect task, flow and deployment names), its
task by name (``module:attribute``, imported on first use, so this module imports no task and every task module
may import it), the stages it reads, its kind, its work pool, and its config: the section type, whether the
section is optional, its seeded fields and the fields that name reward functions, whether it samples on a GPU.

Everything else follows from it: ``PipelineConfig``'s stage sections and the lists of seeded, reward and trainer
sections (``tasks/config/pipeline.py``), the stage flows (``flows/stages.py``), the pipeline's order
(``flows/r1_pipeline.py`` runs the stages in table order), upstream lookups, the CLI's help, the memory plan, the
report's rows and the deployments (``flows/deploy.py`` renders ``infra/prefect.yaml`` from it). Adding a stage is
one entry here plus its task module (a ``stage_task`` body); a new trainer kind is one entry in
``tasks.config.training_spec.TRAINERS``. ``evaluate`` is an entry too (``evaluates``): it runs after each stage that makes
a model rather than at a place in the order, so ``all_stages()`` leaves it out and ``entries()`` has it.

Readers look the table up through ``all_stages()`` / ``get_stage()`` / ``entries()`` at call time, so a test can put
a temporary entry into ``STAGES`` and see it everywhere; ``PipelineConfig`` is built from the table when
``tasks.config.pipeline`` is first imported.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Literal

from pydantic import BaseModel

from grpo_core.config import DataConfig, EvalConfig, GRPOConfig, RejectionSamplingConfig, SFTConfig
from tasks.config.sections import ConsolidateConfig, RewardModelStageConfig, reward_model_upstream
from tasks.config.training_spec import TRAINERS

# A ``tasks.config.pipeline.PipelineConfig``, which is built from this table: named here without importing it (no circle).
Config = Any

# One vocabulary: a stage's kind is its trainer's kind (tasks.config.training_spec.TRAINERS: sft, grpo, reward) or what it
# does without one (data, sampling); the memory planner (grpo_core.plan.memory) takes the same words.
Kind = Literal["data", "sft", "grpo", "reward", "sampling"]
Pool = Literal["cpu", "gpu"]


@dataclass(frozen=True)
class Stage:
    """One stage: its name, the stages whose committed outputs it reads, its kind, the work pool it runs on, and
    its config (``section``: the pydantic type of ``PipelineConfig.<key>``). The task is ``task_ref``, resolved by
    name (``module:attribute``; default ``tasks.stages.<name>:<name>``)."""

    name: str
    upstream: tuple[str, ...] | Callable[[Config], tuple[str, ...]]
    kind: Kind
    pool: Pool
    description: str
    section: type[BaseModel]
    key: str = ""  # its PipelineConfig field; "" = the stage name (prepare_data's is ``data``)
    task_ref: str = ""  # "" = tasks.stages.<name>:<name>, a ``tasks.runner.common.stage_task``: (config, run, store, inputs, force)
    optional: bool = False  # the section defaults to None and the stage runs only when the config has it
    seeded: tuple[str, ...] = ()  # the section's fields that seed it (``r1 run --seed N`` sets them)
    reward_fields: tuple[str, ...] = ()  # the section's fields that name reward functions (checked at load time)
    samples_on_gpu: bool = False  # it generates completions on its GPU (an evaluation of its model samples as it does)
    evaluates: bool = False  # evaluation: runs after each stage that makes a model, not at a place in the order

    @property
    def config_key(self) -> str:
        return self.key or self.name

    @property
    def task(self) -> Any:
        """The stage's task, imported from ``task_ref`` on first use."""
        module, _, attribute = (self.task_ref or f"tasks.stages.{self.name}:{self.name}").partition(":")
        return getattr(importlib.import_module(module), attribute)

    def section_of(self, config: Config) -> BaseModel | None:
        """The stage's config section in ``config`` (None: an optional stage the config does not run)."""
        return getattr(config, self.config_key)

    def enabled(self, config: Config) -> bool:
        """Whether ``config`` runs this stage (the pipeline skips it otherwise; status shows it as skipped)."""
        return not self.optional or self.section_of(config) is not None

    @property
    def trains(self) -> bool:
        """It runs a trainer (``tasks.config.training_spec.TRAINERS[kind]``)."""
        return self.kind in TRAINERS

    @property
    def makes_model(self) -> bool:
        """Its output holds ``model/``; it is evaluated after it commits."""
        return self.kind in ("sft", "grpo")

    @property
    def flow_name(self) -> str:
        return self.name.replace("_", "-")

    def inputs(self, config: Config) -> tuple[str, ...]:
        """The upstream stages this stage reads under ``config``."""
        return self.upstream(config) if callable(self.upstream) else self.upstream


def _reward_model_inputs(config: Config) -> tuple[str, ...]:
    """prepare_data (pairs, base model), and cold_start_sft when the backbone is the SFT model."""
    section = config.reward_model
    from_sft = section is not None and section.model_name_or_path is None and section.init_from == "cold_start_sft"
    return ("prepare_data", "cold_start_sft") if from_sft else ("prepare_data",)


def _consolidate_inputs(config: Config) -> tuple[str, ...]:
    """The rows, the rejection-sampled set, and the stage whose model it starts from (only that one)."""
    init = config.sft_consolidate.init_from
    return ("prepare_data", "rejection_sample") + (() if init in ("base", "model") else (init,))


SEED = ("seed",)

STAGES: tuple[Stage, ...] = (
    Stage("prepare_data", (), "data", "cpu",
          "Stage 1: prompts, answers and the cold-start set, written as parquet to the store.",
          DataConfig, key="data", seeded=SEED),
    Stage("cold_start_sft", ("prepare_data",), "sft", "gpu",
          "Stage 2: SFT of the base model on long chain-of-thought samples.", SFTConfig, seeded=SEED),
    Stage("reward_model", _reward_model_inputs, "reward", "gpu",
          "Optional (a `reward_model:` section): a reward model trained on preference pairs (Bradley-Terry).",
          RewardModelStageConfig, optional=True, seeded=SEED),
    Stage("grpo_train", lambda c: ("prepare_data", "cold_start_sft") + reward_model_upstream(c.grpo_train), "grpo",
          "gpu", "Stage 3: GRPO on verifiable rewards (torchrun when the pool's job sets R1_NPROC_PER_NODE > 1).",
          GRPOConfig, seeded=SEED, reward_fields=("reward_funcs",), samples_on_gpu=True),
    Stage("rejection_sample", lambda c: ("prepare_data", "grpo_train") + reward_model_upstream(c.rejection_sample),
          "sampling", "gpu", "Stage 4: rejection sampling from the GRPO model (vLLM where installed).",
          RejectionSamplingConfig, seeded=SEED, reward_fields=("reward_func",), samples_on_gpu=True),
    Stage("sft_consolidate", _consolidate_inputs, "sft", "gpu", "Stage 5: SFT on the rejection-sampled set.",
          ConsolidateConfig, seeded=SEED),
    Stage("final_rl", lambda c: ("prepare_data", "sft_consolidate") + reward_model_upstream(c.final_rl), "grpo", "gpu",
          "Stage 6: GRPO with the broader reward mix.", GRPOConfig, seeded=SEED, reward_fields=("reward_funcs",),
          samples_on_gpu=True),
    Stage("evaluate", ("prepare_data",), "sampling", "gpu",
          "After each stage that makes a model: held-out accuracy and benchmarks, committed as evaluate/<stage>.",
          EvalConfig, seeded=SEED, reward_fields=("reward_func", "rm_reward", "rule_reward"), samples_on_gpu=True,
          evaluates=True),
)


def entries() -> tuple[Stage, ...]:
    """Every entry, evaluation included: what the pipeline config is built from."""
    return STAGES


def all_stages() -> tuple[Stage, ...]:
    """The pipeline's stages, in order (every stage after the stages it reads); evaluation is not among them."""
    return tuple(s for s in STAGES if not s.evaluates)


def evaluation() -> Stage:
    """The entry of evaluation (``tasks/stages/evaluate.py``), which runs after each stage that makes a model."""
    return next(s for s in STAGES if s.evaluates)


def stage_names() -> list[str]:
    return [s.name for s in all_stages()]


def get_stage(name: str) -> Stage:
    for s in all_stages():
        if s.name == name:
            return s
    raise UnknownStage(f"unknown stage {name!r}; stages are {', '.join(stage_names())}")


class UnknownStage(ValueError):
    """A stage name that is not in the table; the message lists the stages."""
