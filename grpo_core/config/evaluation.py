"""evaluate: the held-out set and the R1 protocol's benchmarks (``BENCHMARKS``, the built-in ones by name)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from grpo_core.config.base import _Strict
from grpo_core.config.data import DatasetSource
from grpo_core.config.emergence import EmergenceConfig
from grpo_core.config.rewards import RewardEntry, normalize_reward_entry
from grpo_core.config.sampling import EvalSampling


class BenchmarkSource(DatasetSource):
    """A benchmark: a hub dataset or local file (``DatasetSource`` fields), the name its metrics go under
    (``eval/{benchmark}/pass@1``) and the reward that decides correctness. Naming a built-in benchmark
    (``BENCHMARKS`` below) with only ``path`` set reads that file with the built-in's schema."""

    benchmark: str = Field(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="name in metric keys, e.g. math500")
    split: str = Field("test", description="split to read from a hub dataset or a local dataset folder")
    reward_func: str = Field("math_accuracy", description="registered reward that scores 1.0 for a correct answer")


# The built-in benchmarks (R1's evaluation sets), by name; a source naming one takes its fields it does not set.
R1_PROMPT = "{prompt}\nPlease reason step by step, and put your final answer within \\boxed{{}}."

BENCHMARKS: dict[str, BenchmarkSource] = {
    "math500": BenchmarkSource(benchmark="math500", path="HuggingFaceH4/MATH-500", split="test",
                               field_map={"prompt": "problem", "answer": "answer", "id": "unique_id"},
                               prompt_template=R1_PROMPT),
    "gsm8k": BenchmarkSource(benchmark="gsm8k", path="openai/gsm8k", name="main", split="test",
                             field_map={"prompt": "question", "answer": "answer"}, answer_format="gsm8k",
                             prompt_template=R1_PROMPT),
    "aime24": BenchmarkSource(benchmark="aime24", path="HuggingFaceH4/aime_2024", split="train",
                              field_map={"prompt": "problem", "answer": "answer", "id": "id"},
                              prompt_template=R1_PROMPT),
    "aime25": BenchmarkSource(benchmark="aime25", path="yentinglin/aime_2025", split="train",
                              field_map={"prompt": "problem", "answer": "answer", "id": "id"},
                              prompt_template=R1_PROMPT),
}


REFERENCE_METRIC = r"^(pass@[1-9][0-9]*|maj@[1-9][0-9]*|greedy)$"


class EvalConfig(_Strict):
    """evaluate: the held-out set (greedy accuracy, pass@1 over ``sampling.num_generations``, length, format and
    direct-answer rates) and the named ``benchmarks`` under the R1 paper's protocol (``grpo_core.evaluation.benchmarks``):
    ``sampling.num_generations`` samples per problem at temperature 0.6 / top-p 0.95, pass@1, pass@k and maj@k for each
    ``k``, greedy accuracy beside them."""

    sampling: EvalSampling = Field(default_factory=EvalSampling, description="n, temperature 0.6 / top-p 0.95, "
                                   "lengths, backend (flat names accepted, SamplingConfig.nest_flat_fields)")
    max_rows: int | None = Field(None, gt=0, description="evaluate on the first N held-out rows of each source")
    reward_func: str = Field("chain_accuracy", description="registered reward that scores 1.0 for a correct completion")
    source_rewards: dict[str, str] = Field(
        default_factory=dict, description="a registered reward per verifiable source, for sources reward_func does "
        "not score (e.g. {countdown: countdown_accuracy}); every metric is then also given per source")
    general_sources: list[str] = Field(
        default_factory=list, description="sources without a verifiable answer (e.g. helpful, unsafe): their held-out "
        "rows are measured by rm_reward and rule_reward, not by reward_func")
    rm_reward: RewardEntry | None = Field(None, description="the reward model (or judge) whose mean score on the "
                                          "general rows' greedy completions is eval/rm_score")
    rule_reward: str | None = Field(None, description="a reward scoring 1.0 when a general completion satisfies the "
                                    "preference rule (e.g. preference_rule): eval/preferred_rate")
    forced_reasoning: bool = Field(True, description="also measure greedy accuracy with an empty <think> banned")

    @model_validator(mode="before")
    @classmethod
    def _nest_sampling(cls, data: Any) -> Any:
        return EvalSampling.nest_flat_fields(data)

    @field_validator("rm_reward", mode="before")
    @classmethod
    def _reward_entry(cls, value: Any) -> Any:
        return normalize_reward_entry(value)

    emergence: EmergenceConfig = Field(
        default_factory=EmergenceConfig, description="phrase lists of eval/reflection_rate and the rest")
    seed: int = Field(0, description="seed of the sampled completions (each one's sampling seed derives from it); "
                      "r1 run --seed sets it")
    # --- benchmarks (R1 protocol) ---
    benchmarks: list[str | BenchmarkSource] = Field(
        default_factory=list, description="built-in names (math500, gsm8k, aime24, aime25) or sources with a "
        "benchmark name and field_map; each is scored besides the held-out set",
    )
    k: list[int] | None = Field(None, description="pass@k and maj@k for each k (1 <= k <= sampling.num_generations); "
                                "None = [sampling.num_generations]")
    limit: int | None = Field(None, gt=0, description="first N problems of each benchmark")
    reference: dict[str, dict[str, float | str]] = Field(
        default_factory=dict, description="published numbers in percent per benchmark for the report, e.g. "
        "{math500: {label: DeepSeek-R1, pass@1: 97.3}}",
    )
    bf16: bool = Field(False, description="bf16 on GPU (vLLM dtype is bf16 on GPU either way)")

    @field_validator("benchmarks", mode="before")
    @classmethod
    def _fill_builtin(cls, value: object) -> object:
        """A source naming a built-in benchmark takes the built-in's fields it does not set, here, so the saved
        config (a full dump) reads the same file the same way again."""
        if not isinstance(value, list):
            return value
        out = []
        for item in value:
            if isinstance(item, BenchmarkSource):
                item = item.model_dump(exclude_unset=True)
            if isinstance(item, dict) and item.get("benchmark") in BENCHMARKS:
                item = {**BENCHMARKS[item["benchmark"]].model_dump(), **item}
            out.append(item)
        return out

    @model_validator(mode="after")
    def _check(self) -> "EvalConfig":
        n = self.sampling.num_generations
        if self.benchmarks and n < 1:
            raise ValueError("benchmarks need sampling.num_generations >= 1 (pass@k and maj@k are over sampled "
                             "answers)")
        for k in self.k or []:
            if not 1 <= k <= max(n, 1):
                raise ValueError(f"k={k} is outside 1..sampling.num_generations ({n}); pass@k needs k <= n "
                                 f"samples: lower k or raise sampling.num_generations")
        names = [b if isinstance(b, str) else b.benchmark for b in self.benchmarks]
        if len(set(names)) != len(names):
            raise ValueError(f"benchmarks names one benchmark twice: {names}")
        for name in (b for b in self.benchmarks if isinstance(b, str)):
            if name not in BENCHMARKS:
                raise ValueError(f"unknown benchmark {name!r}; built-in: {', '.join(BENCHMARKS)}; for a file give "
                                 f"{{benchmark: NAME, path: FILE, field_map: {{prompt: COLUMN, answer: COLUMN}}}}")
        for bench, numbers in self.reference.items():
            for key, value in numbers.items():
                if key == "label":
                    if not isinstance(value, str):
                        raise ValueError(f"reference.{bench}.label must be text, got {value!r}")
                elif not re.match(REFERENCE_METRIC, key) or isinstance(value, str):
                    raise ValueError(f"reference.{bench}.{key}: use label: TEXT and numbers (percent) for "
                                     f"pass@K, maj@K or greedy, e.g. {{label: DeepSeek-R1, pass@1: 97.3}}")
        return self

    @property
    def ks(self) -> list[int]:
        """The k values of pass@k / maj@k."""
        return sorted(set(self.k)) if self.k else [max(self.sampling.num_generations, 1)]
