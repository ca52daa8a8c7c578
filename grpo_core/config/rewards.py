"""Rewards in a config: a ``reward_funcs`` entry (a registered name, a reward model or a judge, in process or
served), and a data mixture's sources with their shares and their own reward functions."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Union
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from grpo_core.config.base import _Strict


# --- rewards that are models: a sequence-classification reward model and a generative judge ---

Scope = Literal["summary", "full"]
SCOPE_HELP = ("what the reward sees of a completion: summary = the text after the last </think> (R1 judged "
              "helpfulness on it; without </think> an empty answer, counted as rewards/{name}/no_summary), full = "
              "the whole response, reasoning included (R1 judged harmlessness on it)")
REWARD_MODEL_STAGE = "reward_model"  # `model: reward_model` names the run's committed reward_model stage output


class _ServedSpec(_Strict):
    """Where a reward model or judge runs: in this process (no ``url``), or behind an OpenAI-compatible server
    (``url``; grpo_core.rewards.served) such as ``vllm serve``, so a judge larger than the trainer's GPU runs
    elsewhere. The key is read from the environment variable ``api_key_env`` names, never written in a config."""

    url: str | None = Field(None, description="base URL of an OpenAI-compatible server (vllm serve), e.g. "
                            "http://judge-host:8000; `model` then names the served model (--served-model-name)")
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="name of the "
                                    "environment variable holding the server's API key (sent as a Bearer token)")
    max_failed_calls: int | None = Field(3, gt=0, description="with url: stop the run when this many calls in a "
                                         "row got no answer from the server; None = never, only count errors")

    @field_validator("url")
    @classmethod
    def _plain_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"url must be http://host:port or https://host (the server's root), got {url!r}")
        if parts.username or parts.password or parts.query:
            raise ValueError("url must not carry credentials or a query: it is written to manifests and logs; put "
                             "the key in an environment variable and name it in api_key_env")
        return url.rstrip("/").removesuffix("/v1")  # routes (/v1/chat/completions, /classify) are added to it

    @model_validator(mode="after")
    def _key_needs_url(self) -> "_ServedSpec":
        if self.api_key_env is not None and self.url is None:
            raise ValueError("api_key_env is the key of a server: set url too (or drop api_key_env)")
        return self


class RewardModelSpec(_ServedSpec):
    """A ``reward_funcs`` entry ``{reward_model: {model: ..., scope: ...}}``: an
    ``AutoModelForSequenceClassification`` (num_labels=1) scoring (prompt, response) through its chat template
    (grpo_core.rewards.reward_model), or the same model served by vLLM's ``/classify`` route (``url``)."""

    type: Literal["reward_model"] = Field("reward_model", description="the entry's kind, from its YAML key "
                                          "({reward_model: {...}})")
    model: str = Field(..., min_length=1, description="'reward_model' (the run's reward_model stage output), "
                       "or a local folder / hub name of a sequence-classification checkpoint; with url, the served "
                       "model's name")
    name: str = Field("reward_model", min_length=1, description="metric name: rewards/{name}/mean, ...")
    scope: Scope = Field("summary", description=SCOPE_HELP)
    normalize: bool = Field(False, description="(score - mean) / std with the model's reward_stats.json "
                            "(written by the reward_model stage), else running statistics of the scores so far")
    batch_size: int = Field(16, gt=0, description="sequences per forward pass; with url, requests in flight")
    max_length: int = Field(1024, gt=0, description="tokens of prompt + response; longer ones are cut on the right (TRL)")
    device: str | None = Field(None, description="e.g. cuda:1; None = the last visible GPU, else the CPU")
    timeout: float = Field(60.0, gt=0, description="seconds per call; rows not scored by then score None (counted)")
    reward_clip_range: tuple[float, float] | None = Field(
        None, description="[lo, hi]: each score (after normalize) clamped into it, as OpenRLHF's --reward_clip_range, "
        "so a policy gains nothing by pushing the model past hi (counted as rewards/{name}/clipped); None = off",
    )

    ensemble: list[str] = Field(
        default_factory=list, description="further reward models (folders / hub names) scored beside `model`: the "
        "reward is mean - ensemble_k x std of the normalised scores of all of them (a conservative ensemble, Coste "
        "et al. 2023), so an answer the models disagree on earns less; [] = `model` alone",
    )
    ensemble_k: float | None = Field(None, ge=0, description="with ensemble: how many standard deviations (across "
                                     "the models) to take off their mean; 0 = the plain mean; None = 1.0")

    @model_validator(mode="after")
    def _ensemble_in_process(self) -> "RewardModelSpec":
        if not self.ensemble:
            if self.ensemble_k is not None:  # a value, not "was it set": a dumped config reads back the same
                raise ValueError("ensemble_k weighs the spread across an ensemble: list the further reward models in "
                                 "`ensemble: [PATH, ...]`, or drop ensemble_k")
            return self
        if self.url is not None:
            raise ValueError("ensemble: the members are loaded in this process; drop url (or drop ensemble)")
        if not self.normalize:
            raise ValueError("ensemble: set normalize: true; each member's raw score has its own offset and scale, "
                             "so their mean and spread only mean something after each is normalised")
        if REWARD_MODEL_STAGE in self.ensemble:
            raise ValueError(f"ensemble: {REWARD_MODEL_STAGE!r} names the reward_model stage's one model, which "
                             "`model` already names; list other reward-model folders (trained with other seeds or "
                             "data) or drop ensemble")
        return self

    @field_validator("reward_clip_range", mode="before")
    @classmethod
    def _clip_range_is_a_pair(cls, value: Any) -> Any:
        if value is not None and (isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__")
                                  or len(value) != 2):
            raise ValueError(f"reward_clip_range is a pair [lo, hi], got {value!r}; for a symmetric clip at x write "
                             "[-x, x], or null for no clip")
        return value

    @field_validator("reward_clip_range")
    @classmethod
    def _ordered_clip_range(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        if value is not None and not (math.isfinite(value[0]) and math.isfinite(value[1]) and value[0] < value[1]):
            raise ValueError(f"reward_clip_range must be [lo, hi] with finite lo < hi, got {list(value)}; e.g. "
                             "[-3.0, 3.0] with normalize: true (scores in standard deviations), or null for no clip")
        return value


class JudgeSpec(_ServedSpec):
    """A ``reward_funcs`` entry ``{judge: {model: ..., rubric: ...}}``: an instruction model prompted with a
    rubric whose written score is parsed (grpo_core.rewards.judge), in process or over chat completions (``url``)."""

    type: Literal["judge"] = Field("judge", description="the entry's kind, from its YAML key ({judge: {...}})")
    model: str = Field(..., min_length=1, description="local folder or hub name of an instruction (chat) model; "
                       "with url, the served model's name")
    name: str = Field("judge", min_length=1, description="metric name: rewards/{name}/mean, ...")
    rubric: Literal["helpfulness", "harmlessness"] = Field(
        "helpfulness", description="what the judge rates (grpo_core.rewards.judge.RUBRICS, after R1 sec. 2.3.4): "
        "helpfulness = a direct, correct, useful answer; harmlessness = no harmful content, a safe refusal of a "
        "harmful request")
    scope: Scope = Field("summary", description=SCOPE_HELP)
    max_new_tokens: int = Field(128, gt=0, description="tokens the judge may write for its verdict (greedy; with "
                                "url the request's max_tokens)")
    batch_size: int = Field(8, gt=0, description="verdicts per generate call; with url, requests in flight")
    max_length: int = Field(2048, gt=0, description="judge prompt tokens; a longer response keeps its start and end")
    device: str | None = Field(None, description="e.g. cuda:1; None = the last visible GPU, else the CPU")
    timeout: float = Field(120.0, gt=0, description="seconds per call; rows not judged by then score None (counted)")
    max_unparsed: int | None = Field(
        64, gt=0, description="fail the run when the first N judge outputs all fail to parse (a judge that never "
        "writes a score); None = never fail, only count rewards/{name}/unparsed",
    )


RewardSpec = Annotated[Union[RewardModelSpec, JudgeSpec], Field(discriminator="type")]
RewardEntry = Union[str, RewardSpec]  # a registered reward's name, or a reward model / judge


def reward_entry_name(entry: Any) -> str:
    """The metric name of a ``reward_funcs`` entry: the registered name, or the spec's ``name``."""
    return entry if isinstance(entry, str) else getattr(entry, "name", None) or getattr(entry, "__name__", "reward")


def normalize_reward_entry(value: Any) -> Any:
    """``{reward_model: {...}}`` / ``{judge: {...}}`` (the YAML form) -> ``{type: ..., ...}``; else unchanged."""
    if isinstance(value, dict) and "type" not in value:
        if len(value) == 1 and next(iter(value)) in ("reward_model", "judge"):
            kind, body = next(iter(value.items()))
            if isinstance(body, str):  # {reward_model: PATH}
                body = {"model": body}
            if not isinstance(body, dict):
                raise ValueError(f"{kind}: expected a mapping such as {{model: PATH, scope: summary}}, got {body!r}")
            return {"type": kind, **body}
        raise ValueError(f"a reward_funcs entry is a registered reward's name, {{reward_model: {{model: ...}}}} or "
                         f"{{judge: {{model: ...}}}}; got a mapping with keys {sorted(value)}")
    return value


class SourceWeight(_Strict):
    """One source of an SFT data mixture: its rows (``source`` column = ``name``) and its share of each epoch."""

    name: str = Field(..., min_length=1, description="the rows' source column, e.g. chain, helpful, gsm8k.jsonl")
    weight: float = Field(1.0, description="share of the rows of each epoch / the prompts of each step "
                          "(normalised over the sources); > 0")

    @model_validator(mode="after")
    def _check_weight(self) -> "SourceWeight":
        if not self.weight > 0:
            raise ValueError(f"source {self.name!r} has weight {self.weight}; a weight is the source's share of each "
                             "step's prompts and must be > 0 (remove the source to leave it out)")
        return self


class SourceMix(SourceWeight):
    """One source of a GRPO data mixture: its rows (those whose ``source`` column is ``name``), its share of the
    prompts of every step, and the reward functions that score its rows (and only its rows)."""

    reward_funcs: list[RewardEntry] = Field(default_factory=list, description="reward functions scoring this "
                                            "source's rows: registered names, {reward_model: ...}, {judge: ...}")
    reward_weights: list[float] | None = Field(None, description="one weight per reward function; None = all 1")

    @field_validator("reward_funcs", mode="before")
    @classmethod
    def _reward_entries(cls, value: Any) -> Any:
        return [normalize_reward_entry(v) for v in value] if isinstance(value, list) else value

    @model_validator(mode="after")
    def _check(self) -> "SourceMix":
        if not self.reward_funcs:
            raise ValueError(f"source {self.name!r} has no reward function; give it reward_funcs: [...] (e.g. "
                             "[chain_accuracy] for a verifiable source, a reward model for a general one)")
        if self.reward_weights is not None and len(self.reward_weights) != len(self.reward_funcs):
            raise ValueError(f"source {self.name!r}: reward_weights has {len(self.reward_weights)} entries but "
                             f"reward_funcs has {len(self.reward_funcs)}; give one weight per reward function")
        return self


def check_shared_reward_names(sources: list[SourceMix]) -> None:
    """Refuse two sources' reward entries that share a metric name but differ (model, scope, normalize, ...).

    Within a mixture a name is one reward function: one reward column, one set of ``rewards/{name}/...`` metrics
    and event counts, and the same entry named by two sources is loaded once and shared (one reward model in
    memory). Two different entries under one name would otherwise collapse into the first one's model and scope."""
    seen: dict[str, tuple[str, Any]] = {}
    for source in sources:
        for entry in source.reward_funcs:
            name = reward_entry_name(entry)
            if name not in seen:
                seen[name] = (source.name, entry)
                continue
            first_source, first = seen[name]
            if _entry_fields(first) == _entry_fields(entry):
                continue
            a, b = _entry_fields(first), _entry_fields(entry)
            diff = ", ".join(f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
            raise ValueError(
                f"sources {first_source!r} and {source.name!r} both name a reward {name!r} but the entries differ "
                f"({diff}); within a mixture a name is one reward function (one reward column, one set of "
                f"rewards/{name}/ metrics; an entry repeated exactly is shared). Give one of them its own `name:`, "
                f"e.g. name: {name}_{source.name}")


def _entry_fields(entry: Any) -> dict[str, Any]:
    """A reward entry as comparable fields: a registered name, or a spec's fields."""
    return {"registered": entry} if isinstance(entry, str) else entry.model_dump()
