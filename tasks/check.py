"""``r1 check``: a pipeline config in miniature, to run end to end in minutes before GPU hours are spent on it.

    r1 check -c configs/qwen2.5-0.5b-gsm8k.yaml

``miniature_pipeline`` keeps everything that decides whether the real run can go through and shrinks what only
decides how long it takes: every model the config names (the base, reward models, judges, teachers, a
consolidation model) becomes its own architecture at two narrow layers with its own tokenizer and chat template
(``grpo_core.models.miniature``; only config.json and tokenizer files are read); every data source keeps its loader,
schema, field map, template and split but reads ``rows`` rows; every training stage runs ``steps`` steps with
its own loss, rewards, mixture and sampling backend at short lengths. Stage for stage it is the config the user
gave, so a defect of the sources together, of a template, of a reward model's scope fails here with the message
the real run would give. ``consumption`` is what the real config will spend per stage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from grpo_core.models.miniature import build_miniature
from tasks.config.pipeline import RL_SECTIONS, TRAINER_SECTIONS, PipelineConfig, parse_config
from tasks.config.stages import all_stages

MODEL_KEYS = ("name_or_path", "model", "init_model", "model_name_or_path")  # fields that name a model to load
NOT_A_MODEL = ("reward_model",)  # `model: reward_model` names the run's own stage

TRAINING = tuple(path[0] for path in TRAINER_SECTIONS if len(path) == 1)  # the stage table's training sections
RL = RL_SECTIONS
COMPLETION_TOKENS = 24  # sampled tokens per completion in the check (training, rejection sampling, evaluation)
SFT_TOKENS = 384  # SFT sequence length in the check


def _cap(section: dict[str, Any], key: str, value: int) -> None:
    """``section[key] = min(section[key], value)``; set when absent (the default may be larger)."""
    current = section.get(key)
    section[key] = value if current is None else min(int(current), value)


def _shrink_training(name: str, section: dict[str, Any], steps: int) -> None:
    section.pop("num_train_epochs", None)
    section.update(max_steps=steps, save_steps=1, warmup_steps=0)
    _cap(section, "per_device_train_batch_size", 2)
    if name in RL:
        sampling = section.setdefault("sampling", {})
        g = min(int(sampling.get("num_generations", 8)), 4)
        prompts = 2 * max(1, len(section.get("sources") or []))  # every source gets a prompt at any weight
        sampling["num_generations"] = g
        section["generation_batch_size"] = g * prompts
        _cap(sampling, "max_completion_length", COMPLETION_TOKENS)
        if section.get("dynamic_sampling"):
            section["max_dynamic_sampling_rounds"] = 1
    else:
        section["gradient_accumulation_steps"] = 1
        _cap(section, "max_length", SFT_TOKENS)
    if name == "reward_model":  # a model of `steps` steps ranks at chance: the gate runs, at 0, and cannot fail
        section["min_heldout_accuracy"] = 0.0


def _shrink_data(data: dict[str, Any], rows: int) -> None:
    for key in ("train_sources", "eval_sources"):
        for src in data.get(key) or []:
            _cap(src, "max_rows", rows)
    for src in data.get("cold_start_sources") or []:
        kind = src.get("kind", "file")
        if kind == "traces":
            _cap(src, "limit", rows)
        elif kind == "teacher":
            _cap(src, "max_prompts", rows)
            _cap(src.setdefault("sampling", {}), "num_generations", 2)
            _cap(src["sampling"], "max_completion_length", COMPLETION_TOKENS)
        else:
            _cap(src, "max_rows", rows)
    if data.get("builtin_task", "chain") or data.get("builtin_general"):
        for key, value in (("num_train", 8 * rows), ("num_eval", rows), ("cold_start_size", 4 * rows),
                           ("pretrain_size", 4 * rows), ("general_num_train", 4 * rows), ("general_num_eval", rows),
                           ("general_cold_start_size", 2 * rows), ("general_pretrain_size", 2 * rows),
                           ("general_num_pairs", 4 * rows)):
            _cap(data, key, value)
    if isinstance(data.get("countdown"), dict):
        for key, value in (("num_train", 8 * rows), ("num_eval", rows), ("cold_start_size", 4 * rows),
                           ("pretrain_size", 4 * rows), ("transfer_num_eval", rows)):
            _cap(data["countdown"], key, value)
    if isinstance(data.get("calc"), dict):
        for key, value in (("num_train", 8 * rows), ("num_eval", rows), ("cold_start_size", 4 * rows)):
            _cap(data["calc"], key, value)
        if data["calc"].get("pretrain_size"):  # 0 stays 0: with it the base's corpus
            _cap(data["calc"], "pretrain_size", 4 * rows)


def _map_values(node: Any, field: str, change: Callable[[Any], Any]) -> Any:
    """``node`` with the value of every ``field`` key replaced by ``change(value)``."""
    if isinstance(node, dict):
        return {k: change(v) if k == field else _map_values(v, field, change) for k, v in node.items()}
    if isinstance(node, list):
        return [_map_values(v, field, change) for v in node]
    return node


def _map_models(node: Any, build: Callable[[str], str], key: str = "") -> Any:
    """``node`` with every model name under ``MODEL_KEYS`` replaced by ``build(name)``."""
    if isinstance(node, dict):
        return {k: _map_models(v, build, k) for k, v in node.items()}
    if isinstance(node, list):
        return [_map_models(v, build, key) for v in node]
    if isinstance(node, str) and key in MODEL_KEYS and node not in NOT_A_MODEL and not node.startswith("run:"):
        return build(node)
    return node


def miniature_pipeline(config: PipelineConfig, build_model: Callable[[str], str], *, rows: int = 8,
                       steps: int = 2, cuda: bool = False) -> PipelineConfig:
    """The config in miniature (module docstring); ``build_model(name) -> folder`` makes each model's stand-in.
    Without ``cuda`` a reward model or judge placed on a GPU (``device: cuda...``) runs where the rest does."""
    data = config.model_dump(mode="json", exclude_unset=True)
    data = _map_models(data, build_model)
    if not cuda:
        data = _map_values(data, "device", lambda d: None if str(d).startswith("cuda") else d)
    _shrink_data(data.setdefault("data", {}), rows)
    for name in TRAINING:
        if name != "reward_model" or config.reward_model is not None:
            _shrink_training(name, data.setdefault(name, {}), steps)
    tiny = data.get("model", {}).get("tiny") or {}
    if tiny.get("pretrain") is not None:
        _shrink_training("pretrain", tiny["pretrain"], steps)
    for judge_holder in _judges(data):
        _cap(judge_holder, "max_new_tokens", COMPLETION_TOKENS)
    rs = data.setdefault("rejection_sample", {})
    _keep_every_sample(rs)
    _cap(rs, "max_prompts", rows)
    _cap(rs.setdefault("sampling", {}), "num_generations", 2)
    _cap(rs["sampling"], "max_completion_length", COMPLETION_TOKENS)
    ev = data.setdefault("evaluate", {})
    for key, value in (("max_rows", max(2, rows // 2)), ("limit", max(2, rows // 2))):
        _cap(ev, key, value)
    ev_sampling = ev.setdefault("sampling", {})
    _cap(ev_sampling, "num_generations", 2)
    _cap(ev_sampling, "max_completion_length", COMPLETION_TOKENS)
    if ev.get("k"):
        ev["k"] = sorted({min(k, ev_sampling["num_generations"]) for k in ev["k"]})
    for src in (data.get("sft_consolidate") or {}).get("general_sources") or []:
        _cap(src, "max_rows", rows)
    return parse_config(data, "<r1 check miniature>")


def _keep_every_sample(rs: dict[str, Any]) -> None:
    """Rejection sampling in the check keeps every sample (still scored by every reward, each source by its own
    rule): a random miniature passes no answer check and never ends an answer, and consolidation needs rows."""
    low = -1e9
    rs.update(drop_truncated=False, require_format=False, readability=None, language_consistency_threshold=None,
              max_completion_tokens=None)
    if rs.get("sources"):
        for src in rs["sources"]:
            src.update(require_format=False, **({"min_score": low} if src.get("min_score") is not None
                                                else {"reward_threshold": low}))
    else:
        rs["reward_threshold"] = low


def _judges(node: Any) -> list[dict[str, Any]]:
    """Every judge entry's settings in a dumped config."""
    if isinstance(node, dict):
        own = [node] if node.get("type") == "judge" else []
        return own + [j for v in node.values() for j in _judges(v)]
    if isinstance(node, list):
        return [j for v in node for j in _judges(v)]
    return []


def consumption(config: PipelineConfig, gpus: int = 1) -> list[dict[str, Any]]:
    """What the real config spends, stage by stage: optimiser steps, sequences trained, completions sampled
    (and the most tokens they can hold), the models loaded. Upper bounds where the data decides (rejection
    sampling over every training prompt when ``max_prompts`` is unset)."""

    out = []
    for stage in all_stages():
        if not stage.enabled(config):
            continue
        section = getattr(config, stage.name, None)
        row: dict[str, Any] = {"stage": stage.name, "steps": None, "sequences": None, "completions": None,
                               "max_tokens": None, "models": _models_of(section)}
        if stage.name in TRAINING and section is not None:
            row["steps"] = section.max_steps  # None: counted from num_train_epochs and the data
            if section.max_steps is None:
                pass
            elif stage.name in RL:
                rounds = section.max_dynamic_sampling_rounds + 1 if section.dynamic_sampling else 1
                row["completions"] = section.max_steps * section.generation_batch_size * rounds
                row["max_tokens"] = row["completions"] * section.sampling.max_completion_length
            else:
                row["sequences"] = (section.max_steps * section.per_device_train_batch_size
                                    * section.gradient_accumulation_steps * gpus)
        elif stage.name == "rejection_sample":
            prompts = section.max_prompts
            n = section.sampling.num_generations
            row["completions"] = prompts * n * max(1, len(section.sources)) if prompts else None
            row["max_tokens"] = row["completions"] * section.sampling.max_completion_length if prompts else None
        out.append(row)
    return out


def _models_of(section: Any) -> list[str]:
    """The reward models and judges a stage section loads, by name (its policy/reference come from upstream)."""
    if section is None:
        return []
    dumped = section.model_dump(mode="json")
    names: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") in ("reward_model", "judge") and node.get("model"):
                names.append(f"{node['type']} {node.get('name') or node['model']} ({node['model']})")
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(dumped)
    return sorted(set(names))


def format_consumption(rows: list[dict[str, Any]]) -> str:
    def n(v: Any) -> str:
        return "-" if v is None else f"{v:,}"

    lines = [f"{'stage':<18}{'steps':>8}{'sequences':>12}{'completions':>13}{'max tokens':>14}  models loaded"]
    for r in rows:
        lines.append(f"{r['stage']:<18}{n(r['steps']):>8}{n(r['sequences']):>12}{n(r['completions']):>13}"
                     f"{n(r['max_tokens']):>14}  {'; '.join(r['models']) or '-'}")
    return "\n".join(lines)


def build_miniatures(workdir: Path) -> Callable[[str], str]:
    """``build(name) -> folder``: each distinct model built once under ``workdir`` (grpo_core.models.miniature)."""

    built: dict[str, str] = {}

    def build(name: str) -> str:
        if name not in built:
            dest = workdir / "models" / f"{len(built):02d}-{Path(name).name}"
            try:
                built[name] = str(build_miniature(name, dest))
            except (OSError, ValueError) as e:
                raise MiniatureError(f"cannot read model {name!r} (config.json and tokenizer): "
                                     f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; the real run "
                                     "would fail to load it too: fix the name, or download it (huggingface-cli "
                                     "download NAME) where HF_HUB_OFFLINE is set") from None
        return built[name]

    return build


class MiniatureError(RuntimeError):
    """A model the config names whose config or tokenizer cannot be read."""
