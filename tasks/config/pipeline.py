"""The pipeline's configuration: one section per stage, composed into ``PipelineConfig``, read from YAML.

    r1 run -c configs/qwen2.5-0.5b-gsm8k.yaml      (the CLI and the pipeline deployment call ``load_config``)

The algorithm configs (``SFTConfig``, ``GRPOConfig``, ``DataConfig``, ``EvalConfig``,
``RejectionSamplingConfig``) live in ``grpo_core.config``; this module adds what only the pipeline knows:
the base model, the consolidation stage's starting point, how stages execute (``RunSettings``), and the
YAML loader whose errors name the file, line and field (reward names are checked against the registry
there), and the checks the CLI makes on a run's name and store URL before anything runs. ``DEFAULT_CONFIG``
is the embedded default that ``r1 run`` and the ``r1-pipeline`` deployment use when given no config.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, create_model, field_validator,
                      model_validator)

from grpo_core.config import (
    REWARD_MODEL_STAGE,
    DataConfig,
    JudgeSpec,
    RewardModelSpec,
    SAMPLING_RENAMES,
    SamplingConfig,
    SFTConfig,
    TeacherSampling,
    TeacherSource,
)
from grpo_core.rewards import reward_names
from tasks.config.limits import position_problems
from tasks.config.paths import resolve_data_paths
from tasks.config.sections import ConsolidateConfig, RewardModelStageConfig  # noqa: F401 - the stage sections' home
from tasks.config.stages import Stage, entries
from tasks.config.tool_specs import tool_problems
from tasks.config.yaml_file import YAMLProblem, read_config_yaml

_UNION_TAGS = ("file", "traces", "teacher")  # data.cold_start_sources' kinds (grpo_core.config.ColdStartSource)
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TinyModelConfig(_Strict):
    """The embedded default's model, built by prepare_data: random init (grpo_core.models.tiny.build_tiny_model), then
    optionally pretrained on worked solutions of the built-in task, as a real base model is pretrained before
    the R1 recipe starts (grpo_core.recipe.pretrain.pretrain_tiny_model)."""

    seed: int = Field(0, description="seed of the random init (build_tiny_model): the same seed and sizes give the "
                      "same weights; r1 run --seed sets it")
    hidden_size: int = Field(128, gt=0, description="width of the decoder (its MLP is 3 x hidden_size); a multiple "
                             "of num_heads")
    num_layers: int = Field(4, gt=0, description="decoder layers")
    num_heads: int = Field(4, gt=0, validate_default=True, description="attention heads (as many key/value heads); "
                           "must divide hidden_size")
    max_position_embeddings: int = Field(256, gt=0, description="positions of the model and its tokenizer's "
                                         "model_max_length: each generating section's sampling.max_completion_length "
                                         "must fit in it (checked at load, tasks/config/limits.py)")
    tool_tokens: bool = Field(
        False, description="the tokenizer also has <tool_call> </tool_call> <tool_response> </tool_response> as "
        "single tokens and a chat template with a tool role (build_tiny_model(tool_tokens=True)): what multi-turn "
        "tool rollouts (grpo_train.sampling.tools) need; false keeps the default vocabulary and weights")
    pretrain: SFTConfig | None = Field(
        None, description="pretraining of the built model on data.pretrain_size worked solutions (one operation a "
        "step; no held-out problem); None: the base model is the random init")

    @field_validator("num_heads")
    @classmethod
    def _check_heads(cls, value: int, info: ValidationInfo) -> int:
        # Checked here, on the field (its YAML line), not 12 s into prepare_data by build_tiny_model.
        hidden = info.data.get("hidden_size")
        if hidden is not None and hidden % value:
            raise ValueError(f"hidden_size ({hidden}) must be divisible by num_heads ({value}): each head gets "
                             f"hidden_size / num_heads dimensions; pick a num_heads that divides hidden_size")
        return value

    def architecture(self) -> dict[str, Any]:
        """The keyword arguments of ``build_tiny_model``."""
        return self.model_dump(exclude={"pretrain"})


class ModelConfig(_Strict):
    """The base model: a local folder / hub name, or a tiny model built by prepare_data."""

    name_or_path: str | None = Field(None, min_length=1, description="e.g. Qwen/Qwen2.5-0.5B or /models/base")
    tiny: TinyModelConfig | None = Field(
        None, description="the embedded default's tiny model, built (and optionally pretrained) by prepare_data; set "
        "exactly one of name_or_path and tiny")

    @model_validator(mode="after")
    def _check(self) -> "ModelConfig":
        if (self.name_or_path is None) == (self.tiny is None):
            raise ValueError("set exactly one of model.name_or_path (a real model) and model.tiny (the embedded default)")
        return self


class RunSettings(_Strict):
    """How stages execute (not part of any stage's fingerprint)."""

    isolation: Literal["subprocess", "inline"] = Field(
        "subprocess", description="training stages in a child process (a crash is retried) or in the flow's process"
    )
    retries: int = Field(2, ge=0, description="task retries after a crash or storage error (never after a code error)")
    retry_delay_seconds: float = Field(2.0, ge=0, description="seconds between a failed try of a stage and its retry")
    keep_checkpoints: int = Field(2, ge=1, description="newest store checkpoints kept per training stage")
    torch_num_threads: int | None = Field(
        None, gt=0, description="torch.set_num_threads in every stage (the flow's process and the training children); "
        "None leaves torch's default. The one home of the setting: a stage section's own is moved here, with a warning")
    tracking_dir: str | None = Field(
        None, min_length=1, description="where the trackers of a training section's report_to (wandb, mlflow, "
        "trackio) write, for every stage of every run (W&B offline runs, the MLflow file store, trackio's database); "
        "None = the stage's own trainer folder, committed with the stage as its trackers/ output")


class PipelineSections(_Strict):
    """The whole R1 recipe's checks and seeds; ``PipelineConfig`` adds one field per stage of the table to it."""

    @model_validator(mode="before")
    @classmethod
    def _threads_in_run(cls, data: Any) -> Any:
        """``torch_num_threads`` belongs to ``run`` (how stages execute, not in any fingerprint); a training
        section's own (every section inherits the trainer's field) is moved there with a warning."""
        return move_section_threads(data) if isinstance(data, dict) else data

    @model_validator(mode="before")
    @classmethod
    def _sampling_nested(cls, data: Any) -> Any:
        """The sampling fields a section gives flat go into its ``sampling`` here, where the section's place in the
        file is known, so an older name's warning names it (``nest_section_sampling``)."""
        return nest_section_sampling(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _check_pretrain(self) -> "PipelineConfig":
        data = self.data
        corpus = data.pretrain_size > 0 if data.builtin_task == "chain" else any(
            task is not None and task.pretrain_size > 0 for task in (data.countdown, data.calc))
        if self.model.tiny is not None and self.model.tiny.pretrain is not None and not corpus:
            raise ValueError("model.tiny.pretrain needs a pretraining corpus: set data.builtin_task: chain and "
                             "data.pretrain_size > 0 (without the chain task: data.calc.pretrain_size or "
                             "data.countdown.pretrain_size > 0), or remove model.tiny.pretrain")
        return self

    @model_validator(mode="after")
    def _check_countdown_eval(self) -> "PipelineConfig":
        """The countdown sources are scored by their own reward in evaluation: under the default reward (a chain's
        answer check) every completion would score 0 and the tables would read as a model that learnt nothing."""
        countdown = self.data.countdown
        wanted = ["countdown"] + (["countdown_transfer"] if countdown and countdown.transfer_num_eval else [])
        missing = [s for s in wanted if s not in self.evaluate.source_rewards] if countdown is not None else []
        if missing:
            raise ValueError(f"data.countdown builds held-out rows of source(s) {missing} that evaluate.source_rewards "
                             f"does not score: add {', '.join(f'{s}: countdown_accuracy' for s in missing)} under "
                             "evaluate.source_rewards")
        return self

    @model_validator(mode="after")
    def _check_rewards(self) -> "PipelineConfig":
        # Names resolve here, not in the stage that first scores (after two stages have committed).
        # grpo_core's own configs do not check: there a notebook may pass the functions themselves.
        problems = unknown_rewards(self)
        if problems:
            raise UnknownReward(problems)
        for section in RL_SECTIONS:
            cfg = getattr(self, section)
            # A saved run config (every field written out) carries the defaults back: only values differ
            default_funcs = type(cfg).model_fields["reward_funcs"].get_default(call_default_factory=True)
            if cfg.sources and (cfg.reward_funcs != default_funcs or cfg.reward_weights is not None):
                raise ValueError(f"{section}: with sources, each source names its own reward_funcs; remove "
                                 f"{section}.reward_funcs / reward_weights")
        return self

    def seeds(self) -> dict[str, int]:
        """Every seed of the pipeline by its dotted field path: the tiny model's init (``model.tiny.seed``), the
        data (``data.seed``, and each teacher cold-start source's sampling), and each stage section that samples,
        shuffles or initialises (the tiny model's pretraining; the stage table's ``seeded`` fields, the optional
        ``reward_model``'s when the config runs it). ``run`` has no randomness.

        Returns:
            ``{dotted field path: seed}``, e.g. ``{"model.tiny.seed": 0, "data.seed": 0, "grpo_train.seed": 0}``.
        """
        out = {"model.tiny.seed": self.model.tiny.seed} if self.model.tiny is not None else {}
        if self.model.tiny is not None and self.model.tiny.pretrain is not None:
            out["model.tiny.pretrain.seed"] = self.model.tiny.pretrain.seed
        for stage in entries():  # table order: data, then each stage's, evaluation's last
            section = stage.section_of(self)
            out.update({f"{stage.config_key}.{name}": getattr(section, name) for name in stage.seeded
                        if section is not None})
            if isinstance(section, DataConfig):  # a teacher cold-start source samples with its own seed
                out.update({f"{stage.config_key}.cold_start_sources.{j}.seed": src.seed
                            for j, src in enumerate(section.cold_start_sources) if isinstance(src, TeacherSource)})
        return out

    def with_seed(self, seed: int) -> "PipelineConfig":
        """A copy with every field ``seeds()`` lists set to ``seed`` (``r1 run --seed N``). Each stage's seed is in
        its fingerprint, so no committed output of another seed is reused.

        Args:
            seed: the value every seed field gets.

        Returns:
            A deep copy of this config; this one is unchanged.
        """
        out = self.model_copy(deep=True)
        for path in self.seeds():
            *parents, name = path.split(".")
            owner: Any = out
            for part in parents:
                owner = owner[int(part)] if part.isdigit() else getattr(owner, part)
            setattr(owner, name, seed)  # validate_assignment: the same checks as a YAML value
        return out


def _stage_field(stage: Stage) -> tuple[Any, Any]:
    """``PipelineConfig``'s field for ``stage``: its section type, defaulting to the type's defaults (an optional
    stage's to None: absent = not run)."""
    if stage.optional:
        return stage.section | None, Field(None, description=f"optional stage {stage.name}; absent = not run")
    return stage.section, Field(default_factory=stage.section,
                                description=f"the {stage.name} stage's settings. {stage.description}")


# The pipeline config: the base model, one section per entry of the stage table (tasks/config/stages.py), in table order,
# and how stages execute. Built from the table, so a stage's section is declared once, on its entry.
PipelineConfig = create_model(
    "PipelineConfig", __base__=PipelineSections, __module__=__name__,
    __doc__="The whole R1 recipe: one section per stage, named as the stages are everywhere (tasks/config/stages.py).",
    model=(ModelConfig, Field(default_factory=lambda: ModelConfig(tiny=TinyModelConfig()),
                              description="the base model: a local folder or hub name (name_or_path), or the tiny "
                              "model prepare_data builds (tiny, the embedded default)")),
    **{stage.config_key: _stage_field(stage) for stage in entries()},
    run=(RunSettings, Field(default_factory=RunSettings, description="how stages execute: isolation, retries, "
                            "checkpoints kept, threads, tracker files; part of no stage's fingerprint")),
)
"""The whole R1 recipe's config: ``model`` (the base model), one section per entry of the stage table
(``tasks/config/stages.py``), in table order and named as the stages are everywhere (``data`` for prepare_data,
``cold_start_sft``, ``reward_model`` (optional: absent = not run), ``grpo_train``, ``rejection_sample``,
``sft_consolidate``, ``final_rl``, ``evaluate``), and ``run`` (``RunSettings``: how stages execute, in no
fingerprint). A pydantic model built from the table with ``create_model`` on ``PipelineSections``, which holds its
checks and ``seeds()`` / ``with_seed()``; read one from YAML with ``load_config``."""

# What the table says about sections, as the lists the checks below walk
RL_SECTIONS = tuple(s.config_key for s in entries() if s.kind == "grpo")  # sources name their own reward_funcs
# Where a trainer config sits in a pipeline config (each inherits grpo_core.config.OptimConfig.torch_num_threads).
TRAINER_SECTIONS = (*((s.config_key,) for s in entries() if s.trains), ("model", "tiny", "pretrain"))
# The stage sections with a ``seed`` field (training order and init, sampling seeds, data mixing).
SEEDED_SECTIONS = tuple(s.config_key for s in entries() if s.seeded and s.kind != "data")
# The config fields that name registered reward functions (grpo_core.rewards.register_reward).
REWARD_FIELDS = tuple((s.config_key, name) for s in entries() for name in s.reward_fields)


def move_section_threads(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a raw pipeline config) with every trainer section's ``torch_num_threads`` moved to ``run``: a
    deprecated alias, warned about; sections and ``run`` that disagree are refused, naming the fields."""
    data, moved = dict(data), {}
    for path in TRAINER_SECTIONS:
        owner = data
        for key in path[:-1]:  # copy the mappings on the way, so the caller's dict is not changed
            if not isinstance(owner.get(key), dict):
                break
            owner[key] = owner = dict(owner[key])
        else:
            section = owner.get(path[-1])
            if isinstance(section, BaseModel) and section.torch_num_threads is not None:
                moved[".".join(path)] = section.torch_num_threads
                owner[path[-1]] = section.model_copy(update={"torch_num_threads": None})
            elif isinstance(section, dict) and section.get("torch_num_threads") is not None:
                moved[".".join(path)] = section["torch_num_threads"]
                owner[path[-1]] = {k: v for k, v in section.items() if k != "torch_num_threads"}
    if not moved:
        return data
    run = data.get("run")
    run = run.model_dump(exclude_unset=True) if isinstance(run, BaseModel) else dict(run or {})
    values = {**moved, **({"run": run["torch_num_threads"]} if run.get("torch_num_threads") is not None else {})}
    fields = ", ".join(f"{where}.torch_num_threads: {v}" for where, v in values.items())
    if len(set(values.values())) > 1:
        raise ValueError(f"{fields}: threads are one run setting for every stage; set run.torch_num_threads once and "
                         "remove torch_num_threads from the stage sections")
    warnings.warn(f"{', '.join(f'{where}.torch_num_threads' for where in moved)}: deprecated, threads are a run "
                  f"setting; write run.torch_num_threads: {next(iter(moved.values()))} (it applies to every stage) "
                  "and remove it from the sections", FutureWarning, stacklevel=2)
    data["run"] = {**run, "torch_num_threads": next(iter(values.values()))}
    return data


def nest_section_sampling(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a raw pipeline config) with the sampling fields that each generating section, and each teacher
    cold-start source, writes flat moved into its ``sampling`` (``SamplingConfig.nest_flat_fields``); an older
    name warns naming its place: ``rejection_sample.num_samples is now rejection_sample.sampling.num_generations``.
    A mapping whose flat and nested keys disagree stays as written: its own validator refuses it, at its place."""

    def nested(cls: type[SamplingConfig], mapping: Any, where: str) -> Any:
        try:
            return cls.nest_flat_fields(mapping, where=where)
        except ValueError:
            return mapping

    data = dict(data)
    for stage in entries():
        section, field = data.get(stage.config_key), stage.section.model_fields.get("sampling")
        if isinstance(section, dict) and field is not None:
            data[stage.config_key] = nested(field.annotation, section, stage.config_key)
        sources = section.get("cold_start_sources") if isinstance(section, dict) else None
        if isinstance(sources, list):
            data[stage.config_key] = {**section, "cold_start_sources": [
                nested(TeacherSampling, src, f"{stage.config_key}.cold_start_sources.{j}")
                if isinstance(src, dict) and src.get("kind") == "teacher" else src for j, src in enumerate(sources)]}
    return data


class UnknownReward(ValueError):
    """Reward names the registry does not know; ``problems`` holds (field location, message) pairs."""

    def __init__(self, problems: list[tuple[tuple, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{'.'.join(map(str, loc))}: {msg}" for loc, msg in problems))


def reward_entries(config: "PipelineConfig") -> list[tuple[tuple, Any]]:
    """``(location, entry)`` for every reward entry the stages use: each section's reward fields, or each of its
    sources' (a mixture's sources replace the section's ``reward_funcs``)."""
    named, entries_ = [], []
    for section, field in REWARD_FIELDS:
        cfg = getattr(config, section)
        sources = getattr(cfg, "sources", None) or [] if cfg is not None else []
        if cfg is not None and not (field == "reward_funcs" and sources):
            named.append(((section, field), getattr(cfg, field)))
        named += [((section, "sources", j, field), getattr(src, field)) for j, src in enumerate(sources)
                  if hasattr(src, field)]
    for where, value in named:
        if value is None:  # an optional reward left unset
            continue
        for i, entry in (enumerate(value) if isinstance(value, list) else [(None, value)]):
            entries_.append((where if i is None else (*where, i), entry))
    return entries_


def unknown_rewards(config: "PipelineConfig") -> list[tuple[tuple, str]]:
    """(location, message) for every ``reward_funcs`` entry in ``config`` that cannot be used: a name that is not
    registered, a reward model that names a stage the config does not run or a path that is not one."""
    problems = [(where, msg) for where, entry in reward_entries(config)
                if (msg := reward_entry_problem(entry, config))]
    for i, bench in enumerate(config.evaluate.benchmarks):
        if not isinstance(bench, str) and (msg := reward_entry_problem(bench.reward_func, config)):
            problems.append((("evaluate", "benchmarks", i, "reward_func"), msg))
    return problems


def summary_scope_warnings(config: "PipelineConfig") -> list[tuple[tuple, str]]:
    """(location, message) for each ``{reward_model: {model: reward_model, scope: summary}}`` entry while
    ``data.builtin_general`` makes the stage's pairs: those pairs are whole responses
    (``<think>...</think><answer>...</answer>``), so the summary alone is text of a shape the model never saw. In
    the embedded default its helpful score went flat (spread 0.06 over a step's samples) and final RL learnt to
    refuse helpful prompts (issue 28); ``scope: full`` scores what it was trained on."""
    if not config.data.builtin_general:
        return []
    return [((*where, "reward_model", "scope"),
             f"summary scores only the text after </think>, but the reward_model stage trains on "
             f"data.builtin_general's pairs as whole responses (<think>...</think><answer>...</answer>); its score of "
             f"a summary alone can be flat, giving final RL no signal: use scope: full")
            for where, entry in reward_entries(config)
            if isinstance(entry, RewardModelSpec) and entry.model == REWARD_MODEL_STAGE and entry.url is None
            and entry.scope == "summary"]


def reward_entry_problem(entry: Any, config: "PipelineConfig") -> str | None:
    """Why a ``reward_funcs`` entry cannot be used under ``config`` (None when it can), before anything runs."""

    if isinstance(entry, str):
        if entry in reward_names():
            return None
        return (f"unknown reward function {entry!r}; registered: {', '.join(reward_names())} "
                "(register your own with grpo_core.rewards.register_reward('name'))")
    if isinstance(entry, (RewardModelSpec, JudgeSpec)) and entry.url is not None:
        return None  # `model` names what the server serves; nothing local to check
    if isinstance(entry, RewardModelSpec) and entry.model == REWARD_MODEL_STAGE:
        if config.reward_model is None:
            return ("model: reward_model names the reward_model stage, which this config does not run; add a "
                    "`reward_model:` section (it trains on prepare_data's preference pairs) or give a path")
        return _ensemble_problem(entry)
    if isinstance(entry, (RewardModelSpec, JudgeSpec)) and _looks_local(entry.model):
        if problem := _local_model_problem(entry, entry.model, "model"):
            return problem
    return _ensemble_problem(entry) if isinstance(entry, RewardModelSpec) else None


def _ensemble_problem(entry: RewardModelSpec) -> str | None:
    """Why one of an entry's ``ensemble`` models cannot be loaded (None when all can, or the list is empty)."""
    for i, member in enumerate(entry.ensemble):
        if _looks_local(member) and (problem := _local_model_problem(entry, member, f"ensemble[{i}]")):
            return problem
    return None


def _local_model_problem(entry: RewardModelSpec | JudgeSpec, path: str, field: str) -> str | None:
    """A local folder that is missing, or (for a reward model) not a sequence classifier."""
    if not Path(path).expanduser().exists():
        return f"{entry.type} {entry.name}: {field} {path!r}: no such folder"
    if isinstance(entry, RewardModelSpec):
        # heavy import (torch): only a config with a reward model folder reads it
        from grpo_core.rewards.reward_model import NotARewardModel, check_sequence_classifier

        try:
            check_sequence_classifier(Path(path).expanduser())
        except NotARewardModel as e:
            return f"{field}: {e}" if field != "model" else str(e)
    return None


def _looks_local(name: str) -> bool:
    """A local path rather than a hub name (``org/model``): absolute, relative with a dot, home, or existing."""
    return name.startswith(("/", ".", "~")) or Path(name).exists()


def _is_union_branch(loc: tuple, i: int) -> bool:
    """Whether ``loc[i]`` names a branch of a union rather than a field: a ``reward_funcs`` entry (a name or a
    ``{reward_model: ...}`` / ``{judge: ...}`` spec) is reported by pydantic at ``...0.tagged-union[...].reward_model.
    scope``; the user wrote ``...0.reward_model.scope`` (kept: the YAML key) with no ``tagged-union[...]``."""
    return isinstance(loc[i], str) and loc[i].startswith("tagged-union[")


def _union_branch_errors(errors: list[dict]) -> list[dict]:
    """``errors`` without the plain-string branch's "Input should be a valid string" of a ``reward_funcs`` entry
    that is a mapping: the user wrote a spec, so the spec's own error is the one to read."""
    spec_entries = {err["loc"][:i] for err in errors for i in range(len(err["loc"]))
                    if _is_union_branch(err["loc"], i)}
    return [err for err in errors if not (err["loc"] and err["loc"][-1] == "str" and err["loc"][:-1] in spec_entries
                                          and isinstance(err.get("input"), dict))]


class ConfigError(ValueError):
    """A config file that does not validate; the message names each bad field by its YAML path and line."""


def parse_config(data: dict, source: str = "<config>", lines: dict[tuple, int] | None = None) -> PipelineConfig:
    """Validate a mapping as a ``PipelineConfig``; errors read ``file:line: grpo_train.beta: Input should be ...``.
    The lengths that generate are checked against the base model's positions here too (``tasks.config.limits``),
    the RL sections' tools are loaded (``tasks.config.tool_specs``), and a ``scope: summary`` reward-model entry
    whose pairs are whole responses is warned about.

    Args:
        data: the config as a mapping (a parsed YAML file, or a saved run's config).
        source: the name errors give the config (its file path).
        lines: ``{field path: line}`` of the YAML file, so that errors name the line (None: no lines).

    Returns:
        The validated config.

    Raises:
        ConfigError: every field that does not validate (unknown fields, out-of-range values, unregistered
            reward names, lengths past the model's positions, tools that do not load), one ``file:line: field:
            problem`` each.
    """

    try:
        config = PipelineConfig.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in _union_branch_errors(e.errors()):
            unknown = err.get("ctx", {}).get("error")
            if isinstance(unknown, UnknownReward):  # one line per name, at its own YAML line
                problems += [f"{source}{_at(lines, loc)}: {'.'.join(map(str, loc))}: {msg}"
                             for loc, msg in unknown.problems]
                continue
            loc = tuple(p for i, p in enumerate(err["loc"])  # without the tag pydantic puts after a union's index
                        if not (i and isinstance(err["loc"][i - 1], int) and p in _UNION_TAGS)
                        and not _is_union_branch(err["loc"], i))
            where = ".".join(str(p) for p in loc) or "(top level)"
            line = _nearest_line(lines or {}, loc)
            got = "" if err["type"] == "extra_forbidden" else f" (got {err.get('input')!r})"
            msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
            problems.append(f"{source}{f':{line}' if line else ''}: {where}: {msg}{got}")
        raise ConfigError("; ".join(problems)) from None
    # lengths against the model's positions (tasks/config/limits.py), tools that do not load (tool_specs.py)
    problems = position_problems(config) + tool_problems(config)
    if problems:
        raise ConfigError("; ".join(f"{source}{_at(lines, loc)}: {'.'.join(map(str, loc))}: {msg}"
                                    for loc, msg in problems))
    for loc, msg in summary_scope_warnings(config):
        warnings.warn(f"{source}{_at(lines, loc)}: {'.'.join(map(str, loc))}: {msg}", UserWarning, stacklevel=2)
    return config


def load_config(path: str | Path | None = None) -> PipelineConfig:
    """Read a YAML pipeline config; every problem names the field's YAML path and line (a syntax error its column
    too; duplicate keys and an empty file are errors: tasks/config/yaml_file.py). Relative data paths are read
    from the YAML's folder (tasks/config/paths.py).

    Example:
        ```python
        from tasks.config.pipeline import load_config

        config = load_config("configs/qwen2.5-0.5b-gsm8k.yaml")
        config.grpo_train.beta          # a GRPOConfig field
        config.with_seed(1).seeds()     # every seed field set to 1, as `r1 run --seed 1` does
        ```

    Args:
        path: the YAML file; None = ``DEFAULT_CONFIG``, the embedded default (``configs/tiny-cpu.yaml``).

    Returns:
        The validated ``PipelineConfig``.

    Raises:
        ConfigError: the file cannot be read, is not valid YAML, or does not validate (``parse_config``).
    """

    path = Path(path) if path is not None else DEFAULT_CONFIG
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e.strerror or e}") from None
    try:
        data, lines = read_config_yaml(path, text)
    except YAMLProblem as e:
        raise ConfigError(str(e)) from None
    resolve_data_paths(data, path.parent)  # relative data paths: beside the YAML (tasks/config/paths.py)
    return parse_config(data, str(path), lines)


def _at(lines: dict[tuple, int] | None, loc: tuple) -> str:
    line = _nearest_line(lines or {}, loc)
    return f":{line}" if line else ""


def _nearest_line(lines: dict[tuple, int], loc: tuple) -> int | None:
    if "sampling" in loc and loc not in lines:  # a sampling field written flat (SamplingConfig.nest_flat_fields)
        i = loc.index("sampling")
        rest = loc[i + 1:]
        older = {new: old for old, new in SAMPLING_RENAMES.items()}
        for flat in (loc[:i] + rest, loc[:i] + (older.get(rest[0], rest[0]),) + rest[1:]) if rest else ():
            if flat in lines:
                return lines[flat]
    for n in range(len(loc), 0, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return None


# ---------------------------------------------------------------- the other inputs of a run: its name and store

STORE_SCHEMES = "a local folder, file:///path, or s3://bucket[/prefix]"


def check_run_name(name: str) -> str:
    """A run name is one path segment of the store: refuse what would escape it or collide with its internals."""
    problem = (
        "is empty" if not name.strip() else
        "contains a path separator" if "/" in name or "\\" in name else
        "contains '..'" if ".." in name else
        "starts with '_' or '.' (names the store keeps for itself)" if name.startswith(("_", ".")) else
        "contains a control character" if any(ord(c) < 32 for c in name) else None
    )
    if problem:
        raise ConfigError(f"run name {name!r} {problem}; use letters, digits, '-', '_' and '.', e.g. --run exp-1")
    return name


def check_store_url(url: str) -> str:
    """A store root the Store supports (a local folder, ``file://``, ``s3://bucket[/prefix]``), before any I/O."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        if not url.strip():
            raise ConfigError(f"store URL is empty; use {STORE_SCHEMES}")
        if re.match(r"[A-Za-z][A-Za-z0-9+.-]+:", url):  # s3:/bucket, s3:bucket: a typo, not a folder to create
            raise ConfigError(f"store URL {url!r} looks like a URL missing '://'; use {STORE_SCHEMES}")
        return url  # a local path
    if scheme in ("file", "local"):
        if not rest.strip("/"):
            raise ConfigError(f"store URL {url!r} names no folder; use file:///absolute/path or a plain path")
        return url
    if scheme in ("s3", "s3a"):
        bucket = rest.split("/", 1)[0]
        if not bucket or any(c.isspace() for c in bucket):
            raise ConfigError(f"store URL {url!r} names no bucket; use s3://bucket or s3://bucket/prefix")
        return url
    raise ConfigError(f"store URL {url!r}: scheme {scheme + '://'!r} is not supported; use {STORE_SCHEMES}")
