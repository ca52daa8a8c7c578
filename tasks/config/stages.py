"""The stage table: the one place the R1 pipeline's stages are defined, each entry carrying all about its stage.

An entry names the stage (the same in the CLI, config, store paths, Prefect task, flow and deployment names), its
body by name (``module:attribute``, imported on first use, so this module imports no body and every body module may
import it), the stages it reads, the stage whose model it starts from (``init_from``), its kind, its work pool, and
its config: the section type, whether the section is optional, its seeded fields and the fields that name reward
functions, whether it samples on a GPU. A body reads all of it from its entry (``ctx.entry``, ``ctx.section``), so
one body serves several entries: ``grpo_train`` and ``final_rl`` are one RL body (``tasks/stages/rl.py``) started
from different stages.

Everything else follows from it: ``PipelineConfig``'s stage sections and the lists of seeded, reward and trainer
sections (``tasks/config/pipeline.py``), the stage flows (``flows/stages.py``), the pipeline's order
(``flows/r1_pipeline.py`` runs the stages in table order), upstream lookups, the CLI's help, the memory plan, the
report's rows and the deployments (``flows/deploy.py`` renders ``infra/prefect.yaml`` from it). ``evaluate`` is an
entry too (``evaluates``): it runs after each stage that makes a model rather than at a place in the order, so
``all_stages()`` leaves it out and ``entries()`` has it; its inputs are its entry's (the reward model among them when
its section names it, read when there is one yet).

Adding a stage:

- an RL stage is one entry: kind ``grpo``, ``body=RL``, ``init_from`` the stage whose model it trains further (which
  is among its ``upstream``), a ``GRPOConfig`` section;
- any other stage is one entry plus its body module, ``tasks/stages/<name>.py``: a function
  ``body(ctx, parents, fp) -> StageRef`` under ``@stage_task`` (``tasks/runner/common.py``) that picks its inputs from
  ``parents`` and commits; a training stage's body hands its starting model and rows to ``train_and_commit``, which
  trains with the entry's kind and section (``tests/flows/test_stage_table.py`` adds one of each and runs them in
  ``r1 run``);
- a new trainer kind is one entry in ``tasks.config.training_spec.TRAINERS``.

An entry with ``reward_fields`` reads the reward_model stage whenever its section names that stage's model
(``model: reward_model``), with no line of its own (``Stage.inputs``).

The entries are checked as they are built: a training kind's section must be its trainer's config class (or a
subclass with stage-only fields), the stage it starts from one of its inputs; and the table when it is first read:
names unique, each stage reading only stages before it (``StageTableError`` says which entry and how to fix it).

Readers look the table up through ``all_stages()`` / ``get_stage()`` / ``entries()`` at call time, so a test can put
a temporary entry into ``STAGES`` and see it everywhere; ``PipelineConfig`` is built from the table when
``tasks.config.pipeline`` is first imported.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Literal

from pydantic import BaseModel

from grpo_core.config import REWARD_MODEL_STAGE, DataConfig, EvalConfig, GRPOConfig, RejectionSamplingConfig, SFTConfig
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
    its config (``section``: the pydantic type of ``PipelineConfig.<key>``). Its body is ``body``, resolved by name
    (``module:attribute``; default ``tasks.stages.<name>:<name>``) and made this entry's Prefect task (``task``)."""

    name: str
    upstream: tuple[str, ...] | Callable[[Config], tuple[str, ...]]
    kind: Kind
    pool: Pool
    description: str
    section: type[BaseModel]
    key: str = ""  # its PipelineConfig field; "" = the stage name (prepare_data's is ``data``)
    body: str = ""  # "" = tasks.stages.<name>:<name>, a ``tasks.runner.common.stage_task`` body (evaluation's: its task)
    init_from: str = ""  # the stage whose model it starts from (trains further, or samples); one of its upstream
    optional: bool = False  # the section defaults to None and the stage runs only when the config has it
    seeded: tuple[str, ...] = ()  # the section's fields that seed it (``r1 run --seed N`` sets them)
    reward_fields: tuple[str, ...] = ()  # the section's fields that name reward functions (checked at load time)
    samples_on_gpu: bool = False  # it generates completions on its GPU (an evaluation of its model samples as it does)
    evaluates: bool = False  # evaluation: runs after each stage that makes a model, not at a place in the order
    optional_inputs: tuple[str, ...] = ()  # inputs read when committed, left out when not yet (evaluation's reward model)

    def __post_init__(self) -> None:
        if self.trains and not issubclass(self.section, (trainer := TRAINERS[self.kind].config)):
            fits = [kind for kind, t in TRAINERS.items() if issubclass(self.section, t.config)]
            raise StageTableError(
                f"stage {self.name!r}: kind {self.kind!r} trains with {trainer.__name__}, but its section is "
                f"{self.section.__name__}; give it a {trainer.__name__} section (or a subclass of it with the stage's own "
                "fields)" + (f", or kind {' / '.join(map(repr, fits))}, whose trainer takes a {self.section.__name__}"
                             if fits else ""))
        if self.init_from and self.kind == "data":
            raise StageTableError(f"stage {self.name!r}: a data stage starts from no model; remove init_from")
        if self.init_from and not callable(self.upstream) and self.init_from not in self.upstream:
            raise StageTableError(f"stage {self.name!r} starts from {self.init_from!r}, which is not among the stages "
                                  f"it reads {self.upstream}; add {self.init_from!r} to its upstream")

    @property
    def config_key(self) -> str:
        return self.key or self.name

    @property
    def task(self) -> Any:
        """The stage's Prefect task, named after the stage: its body, imported from ``body`` on first use, made this
        entry's task (``tasks.runner.common.StageBody.task``). Evaluation's module holds its task itself: it is
        handed the model it scores, not only its inputs."""
        module, _, attribute = (self.body or f"tasks.stages.{self.name}:{self.name}").partition(":")
        found = getattr(importlib.import_module(module), attribute)
        return found.task(self) if callable(getattr(found, "task", None)) else found

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
        """The upstream stages this stage reads under ``config``: its ``upstream``, and the reward_model stage when
        its section names that stage's model as a reward (``{reward_model: {model: reward_model}}``)."""
        names = self.upstream(config) if callable(self.upstream) else self.upstream
        section = self.section_of(config)
        if self.reward_fields and section is not None and REWARD_MODEL_STAGE not in names:
            names = (*names, *reward_model_upstream(section))
        if self.init_from and self.init_from not in names:
            raise StageTableError(f"stage {self.name!r} starts from {self.init_from!r}, which is not among the stages it "
                                  f"reads {names}; make its upstream return {self.init_from!r}")
        earlier = _names_before(self)
        if unknown := [n for n in names if n not in earlier]:
            raise StageTableError(f"stage {self.name!r} reads {', '.join(map(repr, unknown))}, which is no stage before "
                                  f"it in the table (before it: {', '.join(earlier) or 'none'})")
        return names


def _reward_model_inputs(config: Config) -> tuple[str, ...]:
    """prepare_data (pairs, base model), and cold_start_sft when the backbone is the SFT model."""
    section = config.reward_model
    from_stage = section is not None and section.model_name_or_path is None and section.init_from != "base"
    return ("prepare_data", section.init_from) if from_stage else ("prepare_data",)


def _consolidate_inputs(config: Config) -> tuple[str, ...]:
    """The rows, the rejection-sampled set, and the stage whose model it starts from (only that one)."""
    init = config.sft_consolidate.init_from
    return ("prepare_data", "rejection_sample") + (() if init in ("base", "model") else (init,))


SEED = ("seed",)
RL = "tasks.stages.rl:rl"  # the body of every RL stage: GRPO from the model of the stage its entry's init_from names

STAGES: tuple[Stage, ...] = (
    Stage("prepare_data", (), "data", "cpu",
          "Stage 1: prompts, answers and the cold-start set, written as parquet to the store.",
          DataConfig, key="data", seeded=SEED),
    Stage("cold_start_sft", ("prepare_data",), "sft", "gpu",
          "Stage 2: SFT of the base model on long chain-of-thought samples.", SFTConfig, seeded=SEED),
    Stage("reward_model", _reward_model_inputs, "reward", "gpu",
          "Optional (a `reward_model:` section): a reward model trained on preference pairs (Bradley-Terry).",
          RewardModelStageConfig, optional=True, seeded=SEED),
    Stage("grpo_train", ("prepare_data", "cold_start_sft"), "grpo", "gpu",
          "Stage 3: GRPO on verifiable rewards (torchrun when the pool's job sets R1_NPROC_PER_NODE > 1).",
          GRPOConfig, body=RL, init_from="cold_start_sft", seeded=SEED, reward_fields=("reward_funcs",),
          samples_on_gpu=True),
    Stage("rejection_sample", ("prepare_data", "grpo_train"), "sampling", "gpu",
          "Stage 4: rejection sampling from the GRPO model (vLLM where installed).", RejectionSamplingConfig,
          init_from="grpo_train", seeded=SEED, reward_fields=("reward_func",), samples_on_gpu=True),
    Stage("sft_consolidate", _consolidate_inputs, "sft", "gpu", "Stage 5: SFT on the rejection-sampled set.",
          ConsolidateConfig, seeded=SEED),
    Stage("final_rl", ("prepare_data", "sft_consolidate"), "grpo", "gpu", "Stage 6: GRPO with the broader reward mix.",
          GRPOConfig, body=RL, init_from="sft_consolidate", seeded=SEED, reward_fields=("reward_funcs",),
          samples_on_gpu=True),
    Stage("evaluate", ("prepare_data",), "sampling", "gpu",
          "After each stage that makes a model: held-out accuracy and benchmarks, committed as evaluate/<stage>.",
          EvalConfig, seeded=SEED, reward_fields=("reward_func", "rm_reward", "rule_reward"), samples_on_gpu=True,
          evaluates=True, optional_inputs=(REWARD_MODEL_STAGE,)),
)
_CHECKED: tuple[Stage, ...] = ()  # the table check_table last passed


def check_table(stages: tuple[Stage, ...]) -> tuple[Stage, ...]:
    """``stages`` when they make a table (else a ``StageTableError`` naming the entry): names unique, each stage's
    upstream (its fixed one; a function's names are checked by ``Stage.inputs``) and optional inputs among the
    stages before it, at most one evaluation."""
    for i, stage in enumerate(stages):
        earlier = [s.name for s in stages[:i]]
        if stage.name in earlier:
            raise StageTableError(f"stage {stage.name!r} is in the table twice; give the second entry its own name")
        named = (*(() if callable(stage.upstream) else stage.upstream), *stage.optional_inputs)
        if unknown := [n for n in named if n not in earlier]:
            raise StageTableError(f"stage {stage.name!r} reads {', '.join(map(repr, unknown))}, which is no stage before "
                                  f"it in the table (before it: {', '.join(earlier) or 'none'}); fix the name or move "
                                  "the entry after the stages it reads")
    if sum(s.evaluates for s in stages) > 1:
        raise StageTableError("the table has more than one evaluation entry (evaluates=True); keep one")
    return stages


def entries() -> tuple[Stage, ...]:
    """Every entry, evaluation included: what the pipeline config is built from (the table checked on first read)."""
    global _CHECKED
    if STAGES is not _CHECKED:
        _CHECKED = check_table(STAGES)
    return STAGES


def _names_before(stage: Stage) -> list[str]:
    names = [s.name for s in entries()]
    return names[:names.index(stage.name)] if stage.name in names else names


def all_stages() -> tuple[Stage, ...]:
    """The pipeline's stages, in order (every stage after the stages it reads); evaluation is not among them."""
    return tuple(s for s in entries() if not s.evaluates)


def evaluation() -> Stage:
    """The entry of evaluation (``tasks/stages/evaluate.py``), which runs after each stage that makes a model."""
    return next(s for s in entries() if s.evaluates)


def stage_names() -> list[str]:
    return [s.name for s in all_stages()]


def get_stage(name: str) -> Stage:
    for s in all_stages():
        if s.name == name:
            return s
    raise UnknownStage(f"unknown stage {name!r}; stages are {', '.join(stage_names())}")


def get_entry(name: str) -> Stage:
    """Any entry by name, evaluation's included."""
    if name == evaluation().name:
        return evaluation()
    return get_stage(name)


class UnknownStage(ValueError):
    """A stage name that is not in the table; the message lists the stages."""


class StageTableError(ValueError):
    """An entry that does not fit the table (a section its trainer cannot take, an input that is no earlier stage);
    the message names the entry and what to change."""
