"""Configuration of the algorithm layer: one pydantic model per section, every public name re-exported here, so
``from grpo_core.config import GRPOConfig`` is the one way in.

Field names follow TRL's ``GRPOConfig``/``SFTConfig`` wherever the concept is the same
(``num_generations``, ``beta``, ``epsilon``, ``epsilon_high``, ``loss_type``, ``scale_rewards``,
``max_completion_length``, ``num_iterations``, ...), so a TRL config moves over field by field.
Unknown fields are rejected (``extra="forbid"``) so a typo never silently falls back to a default.

The pipeline composes these into ``tasks.config.pipeline.PipelineConfig``. Defaults are the seed's hyperparameter
table (G 8-16, beta 0.001-0.01, epsilon 0.1-0.2, lr 1e-6..5e-6, max_completion_length 1024-2048) where it gives one.

What is where (each module imports only the ones above it, and nothing else of grpo_core: config is the bottom
floor):

- ``base``: the strict base model, the optimiser and schedule fields (``OptimConfig``), packed micro-batches
  (``PaddingFreeConfig``), the trackers' ``TrackingInfo``, help strings several sections share;
- ``sampling``: ``SamplingConfig`` and its per-use subclasses (``GRPOSampling``, ``EvalSampling``,
  ``RejectionSampling``, ``TeacherSampling``), the tool fields three of them share (``ToolSampling``), the flat
  spellings of older configs (``SAMPLING_RENAMES``);
- ``emergence``: the phrase lists of the emergence features (``REFLECTION_PHRASES``, ``BACKTRACK_PHRASES``,
  ``EmergenceConfig``);
- ``rewards``: ``reward_funcs`` entries (``RewardModelSpec``, ``JudgeSpec``) and a mixture's sources
  (``SourceWeight``, ``SourceMix``);
- ``training``: the trainers' configs (``SFTConfig``, ``GRPOConfig``, ``RewardConfig``) and ``needs_reference``;
- ``data``: prepare_data (``DatasetSource``, the cold-start sources, ``CountdownData``, ``CalcData``, ``DataConfig``);
- ``evaluation``: evaluate (``BenchmarkSource``, ``BENCHMARKS``, ``EvalConfig``);
- ``rejection``: rejection_sample (``RejectionSource``, ``RejectionSamplingConfig``).
"""

from grpo_core.config.base import (EPOCHS_HELP, LONG_PROMPTS_HELP, MAX_STEPS_HELP, OptimConfig, PaddingFreeConfig,
                                   TrackingInfo)
from grpo_core.config.data import (CalcData, ColdStartSource, CountdownData, DataConfig, DatasetSource, FewShotExample,
                                   ReadabilityConfig, TeacherSource, TraceSource)
from grpo_core.config.emergence import BACKTRACK_PHRASES, REFLECTION_PHRASES, EmergenceConfig
from grpo_core.config.evaluation import BENCHMARKS, R1_PROMPT, REFERENCE_METRIC, BenchmarkSource, EvalConfig
from grpo_core.config.rejection import RejectionSamplingConfig, RejectionSource
from grpo_core.config.rewards import (REWARD_MODEL_STAGE, SCOPE_HELP, JudgeSpec, RewardEntry, RewardModelSpec,
                                      RewardSpec, Scope, SourceMix, SourceWeight, check_shared_reward_names,
                                      normalize_reward_entry, reward_entry_name)
from grpo_core.config.sampling import (SAMPLING_RENAMES, BatchedSampling, EvalSampling, GRPOSampling,
                                       RejectionSampling, SamplingConfig, TeacherSampling, ToolSampling)
from grpo_core.config.training import GRPOConfig, RewardConfig, SFTConfig, needs_reference

__all__ = [
    "BACKTRACK_PHRASES", "BENCHMARKS", "EPOCHS_HELP", "LONG_PROMPTS_HELP", "MAX_STEPS_HELP", "R1_PROMPT",
    "REFERENCE_METRIC", "REFLECTION_PHRASES", "REWARD_MODEL_STAGE", "SAMPLING_RENAMES", "SCOPE_HELP",
    "BatchedSampling", "BenchmarkSource", "CalcData", "ColdStartSource", "CountdownData", "DataConfig", "DatasetSource",
    "EmergenceConfig", "EvalConfig", "EvalSampling", "FewShotExample", "GRPOConfig", "GRPOSampling", "JudgeSpec",
    "OptimConfig", "PaddingFreeConfig", "ReadabilityConfig", "RejectionSampling", "RejectionSamplingConfig",
    "RejectionSource", "RewardConfig", "RewardEntry", "RewardModelSpec", "RewardSpec", "SFTConfig",
    "SamplingConfig", "Scope", "SourceMix", "SourceWeight", "TeacherSampling", "TeacherSource", "ToolSampling",
    "TraceSource", "TrackingInfo", "check_shared_reward_names", "needs_reference", "normalize_reward_entry",
    "reward_entry_name",
]
