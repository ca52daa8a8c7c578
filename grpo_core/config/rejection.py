"""rejection_sample (R1 sec. 2.3.3): n samples per prompt, the correct ones that pass the filters kept, a rule
per source (verifiable, or scored by a reward model or judge)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from grpo_core.config.base import _Strict
from grpo_core.config.data import ReadabilityConfig
from grpo_core.config.rewards import RewardEntry, normalize_reward_entry
from grpo_core.config.sampling import RejectionSampling


class RejectionSource(_Strict):
    """One source's rule in rejection sampling (R1 sec. 2.3.3: rule-checked where a rule applies, a generative
    reward model's judgement elsewhere). The rows whose ``source`` column is ``name`` are sampled and kept by:

    - verifiable (no ``min_score``): ``reward_func`` scores >= ``reward_threshold`` (e.g. ``math_accuracy``);
    - scored (``min_score`` set): ``reward_func`` (a reward model or judge, e.g. ``{reward_model: {model:
      reward_model}}``) scores >= ``min_score``, the best ``keep_per_prompt`` per prompt by score."""

    name: str = Field(..., min_length=1, description="the rows' source column, e.g. chain, helpful, gsm8k")
    reward_func: RewardEntry = Field(..., description="a registered reward's name, {reward_model: {...}} or {judge: {...}}")
    reward_threshold: float | None = Field(None, description="verifiable: the pass mark; None = the section's")
    min_score: float | None = Field(None, description="scored: keep samples scoring at least this, best first")
    keep_per_prompt: int | None = Field(None, ge=1, description="k for this source; None = the section's")
    require_format: bool | None = Field(None, description="None = the section's (general answers may have no <think>)")

    @field_validator("reward_func", mode="before")
    @classmethod
    def _reward_entry(cls, value: Any) -> Any:
        return normalize_reward_entry(value)

    @model_validator(mode="after")
    def _check_rule(self) -> "RejectionSource":
        scored = not isinstance(self.reward_func, str)
        if scored and self.min_score is None:
            raise ValueError(f"source {self.name!r}: a reward model or judge gives a score, not a verdict; give "
                             "min_score (keep samples scoring at least this, best keep_per_prompt per prompt)")
        if self.min_score is not None and self.reward_threshold is not None:
            raise ValueError(f"source {self.name!r}: set reward_threshold (verifiable: pass/fail) or min_score "
                             "(scored: best k above it), not both")
        return self


class RejectionSamplingConfig(_Strict):
    """rejection_sample: n samples per prompt, keep correct ones that pass the filters, at most k per prompt."""

    sampling: RejectionSampling = Field(default_factory=RejectionSampling, description="n, temperature, lengths "
                                        "and its own backend (flat names accepted, SamplingConfig.nest_flat_fields)")
    keep_per_prompt: int = Field(1, ge=1, description="k: at most this many kept per prompt")
    max_prompts: int | None = Field(None, gt=0, description="sample from the first N training prompts (with "
                                    "sources: the first N of each source)")
    reward_func: str = Field("chain_accuracy", description="registered reward; a sample is correct when it scores >= reward_threshold")
    reward_threshold: float = Field(1.0, description="the pass mark of reward_func")
    require_format: bool = Field(True, description="keep only completions that pass the registered `format` reward "
                                 "(non-empty <think>, then <answer> or a final \\boxed{})")
    max_completion_tokens: int | None = Field(None, gt=0, description="drop longer completions")
    language_consistency_threshold: float | None = Field(
        None, ge=0, le=1, description="drop completions whose language_consistency reward is below this"
    )
    drop_truncated: bool = Field(True, description="drop completions that hit the length cap before stopping "
                                 "(counted as rs/rejected/truncated)")
    readability: ReadabilityConfig | None = Field(
        None, description="R1's readability filters (mixed language, long paragraphs, code blocks, truncated, "
        "overlong); None = off; each drop is counted as rs/rejected/{filter}")
    bf16: bool = Field(False, description="transformers sampler on GPU: bf16 autocast (vLLM's dtype is bf16 on GPU "
                       "either way)")
    seed: int = Field(0, description="seed of the samples (each completion's sampling seed derives from it); r1 "
                      "run --seed sets it")
    sources: list[RejectionSource] = Field(
        default_factory=list, description="per-source rules (verifiable: reward_func passes; scored: min_score, best "
        "k); only the listed sources' rows are sampled; empty = every row by reward_func")

    @model_validator(mode="before")
    @classmethod
    def _nest_sampling(cls, data: Any) -> Any:
        return RejectionSampling.nest_flat_fields(data)

    @model_validator(mode="after")
    def _check_sources(self) -> "RejectionSamplingConfig":
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"rejection_sample.sources names a source twice: {names}; give each source one rule")
        # Values, not fields set: a saved run config writes every field out, defaults included
        defaults = {f: type(self).model_fields[f].default for f in ("reward_func", "reward_threshold")}
        if self.sources and any(getattr(self, f) != d for f, d in defaults.items()):
            raise ValueError("rejection_sample: with sources, each source names its own reward_func (and "
                             "reward_threshold); remove rejection_sample.reward_func / reward_threshold")
        return self
