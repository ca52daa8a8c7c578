"""The trainers' configs: SFT (``SFTConfig``), GRPO (``GRPOConfig``, the seed's objective and its variants) and
reward-model training (``RewardConfig``), and whether an RL run needs a reference model (``needs_reference``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from grpo_core.config.base import EPOCHS_HELP, MAX_STEPS_HELP, OptimConfig, PaddingFreeConfig
from grpo_core.config.emergence import EmergenceConfig
from grpo_core.config.rewards import (RewardEntry, SourceMix, SourceWeight, check_shared_reward_names,
                                      normalize_reward_entry, reward_entry_name)
from grpo_core.config.sampling import GRPOSampling


class SFTConfig(OptimConfig, PaddingFreeConfig):
    """Supervised fine-tuning on (prompt, completion) pairs, loss on completion tokens only
    (``grpo_core.trainer.sft.train_sft``): the pipeline's ``cold_start_sft`` section, and the base of
    ``sft_consolidate``'s. TRL's ``SFTConfig`` names; the optimiser, schedule, checkpoint, LoRA and distributed
    fields come from ``OptimConfig``, ``padding_free`` from ``PaddingFreeConfig``.

    Example:
        ```python
        SFTConfig(learning_rate=1e-5, num_train_epochs=2, max_length=4096,
                  sources=[{"name": "gsm8k", "weight": 1.0}])
        ```
    """

    learning_rate: float = Field(1e-5, gt=0, description="AdamW peak learning rate")
    max_steps: int | None = Field(None, gt=0, description=MAX_STEPS_HELP)
    num_train_epochs: float = Field(1.0, gt=0, description=EPOCHS_HELP)
    max_length: int = Field(1024, gt=0, description="prompt + completion tokens; longer rows are truncated")
    completion_only_loss: bool = Field(True, description="loss on the completion tokens only (the prompt's get "
                                       "label -100); false trains on the prompt tokens too")
    group_by_length: bool = Field(
        True, description="cut each optimiser step's rows into micro-batches of per_device_train_batch_size after "
        "sorting them by length, so short rows are not padded to the longest: the same gradient (the loss is "
        "normalised over the step's tokens) for less compute when gradient_accumulation_steps > 1. Transformers' "
        "option of this name groups rows of similar length into the same steps instead")
    sources: list[SourceWeight] = Field(
        default_factory=list, description="a data mixture: train on the rows of these sources only, each with its "
        "share of every epoch's rows (a source smaller than its share repeats, a larger one is subsampled); empty = "
        "every row once per epoch")
    logprob_chunk_size: int = Field(
        256, gt=0, description="rows of logits turned into log-probs at once; smaller than GRPO's default because "
        "the backward of each chunk holds ~4 [rows, V] fp32 tensors (tests/benchmarks/sft_memory.py)",
    )


class GRPOConfig(OptimConfig, PaddingFreeConfig):
    """Group Relative Policy Optimisation (the seed's boxed objective and its variants): the pipeline's
    ``grpo_train`` and ``final_rl`` sections, and ``train_grpo``'s settings.

    Field names follow TRL's ``GRPOConfig``. The groups of fields: the rollouts (``sampling``, a
    ``GRPOSampling``: G, temperature, lengths, backend; ``generation_batch_size``); the objective (``beta``,
    ``epsilon``, ``epsilon_high``, ``loss_type``, ``scale_rewards``, ``importance_sampling_level``,
    ``num_iterations``, ``steps_per_generation``: ``grpo_core/trainer/loss.py``); the rewards (``reward_funcs``,
    ``reward_weights``, or a data mixture's ``sources``); DAPO's dynamic sampling; asynchronous rollouts
    (``async_*``); the sampler/trainer gap (``vllm_importance_sampling_*``); evaluation during RL and the
    reward-hacking monitor (``eval_steps``, ``monitor_reward``, ``select_checkpoint``). The optimiser, schedule,
    checkpoint, LoRA and distributed fields come from ``OptimConfig``. Defaults are the seed's hyperparameter
    table where it gives one (G 8, beta 0.001, epsilon 0.2, learning rate 1e-6, 1024 completion tokens).

    Validation refuses what would be ignored or inconsistent (``generation_batch_size`` not a multiple of G,
    ``epsilon_high < epsilon``, ``gradient_accumulation_steps`` other than 1, a repeated reward name, ...), each
    error naming the field and the fix.

    Example:
        ```python
        GRPOConfig(beta=0.0, loss_type="dapo", epsilon_high=0.28,
                   sampling={"num_generations": 16, "temperature": 1.0, "max_completion_length": 2048},
                   reward_funcs=["math_accuracy", "format"], reward_weights=[1.0, 0.1])
        ```
    """

    # --- sampling (seed: G = 8-16, max_new_tokens 1024-2048) ---
    sampling: GRPOSampling = Field(default_factory=GRPOSampling, description="rollouts: G, temperature, lengths, "
                                   "backend (the flat names of older configs are accepted, SamplingConfig.nest_flat_fields)",
                                   json_schema_extra={"trl": "flat, at GRPOConfig's top level: num_generations, "
                                                      "temperature, top_p, top_k, max_completion_length, use_vllm, "
                                                      "vllm_*"})
    generation_batch_size: int = Field(64, gt=0, description="completions generated per step (prompts x G)")
    mask_truncated_completions: bool = Field(False, description="exclude completions that hit the length cap from the loss")

    # --- objective (seed's boxed formula; see grpo_core/trainer/loss.py) ---
    beta: float = Field(0.001, ge=0, description="k3 KL coefficient; 0 means no reference model at all")
    epsilon: float = Field(0.2, gt=0, description="lower clip: ratio >= 1 - epsilon")
    epsilon_high: float | None = Field(None, gt=0, description="upper clip (DAPO clip-higher); None = epsilon")
    loss_type: Literal["grpo", "dapo", "dr_grpo", "bnpo"] = Field(
        "grpo", description="how token losses are averaged (grpo_core/trainer/loss.py): grpo = per completion, then "
        "over the G completions (the seed); dapo = over all completion tokens; dr_grpo = over G x "
        "max_completion_length (no length bias); bnpo = over the micro-batch's tokens")
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="the advantage's scale: group = (r - group mean) / group std (the seed); batch = group "
        "mean, one std over the batch; none = no std (Dr. GRPO)")
    importance_sampling_level: Literal["token", "sequence"] = Field(
        "token", description="token = one policy ratio per token (GRPO); sequence = one length-normalised ratio per "
        "completion (GSPO)")
    num_iterations: int = Field(1, ge=1, description="mu: optimisation passes over each generated batch")
    steps_per_generation: int | None = Field(None, ge=1, description="optimiser steps per generation round, each on 1/N of its completions; None = 1 (TRL counts micro-batches here)")

    # --- rewards ---
    reward_funcs: list[RewardEntry] = Field(
        ["math_accuracy", "format"], description="registered names, and {reward_model: {...}} / {judge: {...}} entries",
    )
    reward_weights: list[float] | None = Field(None, description="one weight per reward_funcs entry: the reward is "
                                               "the weighted sum of their scores; None = all 1")
    reward_timeout: float = Field(3.0, gt=0, description="seconds allowed per math answer check before it scores 0")
    reward_num_workers: int = Field(2, ge=1, description="math answer-check worker processes")

    emergence: EmergenceConfig = Field(
        default_factory=EmergenceConfig, description="phrase lists of completions/reflection_rate and the rest")
    sources: list[SourceMix] = Field(
        default_factory=list, description="a data mixture: train on the rows of these sources only, each with its "
        "share of every step's prompts and its own reward functions (then leave reward_funcs unset); empty = every "
        "row, scored by reward_funcs")

    # --- DAPO dynamic sampling ---
    dynamic_sampling: bool = Field(False, description="drop groups whose rewards are all equal and refill the batch")
    max_dynamic_sampling_rounds: int = Field(3, ge=1, description="cap on extra generation rounds per step")

    # --- asynchronous rollouts (grpo_core/trainer/async_rollouts.py) ---
    async_rollouts: bool = Field(False, description="generate the next steps' rollouts in a sampler process while step "
                                 "n trains (up to async_max_staleness steps stale, corrected by the sampler importance "
                                 "weights); under torchrun each rank runs its own sampler process")
    async_sampler_timeout: float = Field(600.0, gt=0, description="seconds the trainer waits for the sampler process "
                                         "before failing the stage (a dead sampler fails at once)")
    async_sampler_threads: int = Field(1, gt=0, description="torch threads of the sampler process")
    async_sampler_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="dtype of the transformers sampler's weights (and of the shared buffer they are pushed "
        "through); auto = the trainer's (float32), whatever the checkpoint was saved in; vLLM: its dtype when set")
    async_sampler_device: str | None = Field(
        None, description="device of the transformers sampler process, e.g. cuda:1; None = the trainer's device")
    async_max_staleness: int = Field(1, ge=1, description="async_rollouts: how many steps ahead the sampler generates "
                                     "(a step trains on rollouts up to this many optimiser steps stale; AReaL's "
                                     "max_head_offpolicyness, verl's one-step-off is 1)")
    async_reference_on_sampler: bool = Field(
        True, description="beta > 0: the sampler process computes the reference model's log-probs of its rollouts "
        "(the reference is frozen, so staleness does not change them) and the trainer keeps no reference model; "
        "false: the trainer runs the reference forward itself, as without async_rollouts",
    )

    # --- sampler/trainer gap (grpo_core/trainer/loss.py: compute_sampling_correction; TRL's names) ---
    vllm_importance_sampling_correction: bool = Field(
        True, description="weight each completion token's loss term by pi_trainer_old / pi_sampler, bounded by "
        "vllm_importance_sampling_mode; acts whenever the sampler is not the trainer's own forward (vLLM, a "
        "replica); with the transformers sampler on the trainer's module the weights are 1 and it is skipped",
    )
    vllm_importance_sampling_mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = Field(
        "token_truncate", description="token_*: one weight per token; sequence_*: one per completion (product of "
        "its token ratios); *_truncate clamps to [clip_min, clip_max], *_mask zeroes weights outside it (TRL >= 1.6 "
        "defaults to sequence_mask with clip_max 3.0; token_truncate with cap 2.0 is TRL's earlier default)",
    )
    vllm_importance_sampling_clip_max: float | None = Field(
        2.0, gt=0, description="C_max: weights above it are clamped to it (truncate) or zeroed (mask); None = no "
        "upper bound. The older name vllm_importance_sampling_cap is accepted",
    )
    vllm_importance_sampling_clip_min: float | None = Field(None, gt=0, description="C_min; None = no lower bound")

    # --- what is logged beside the metrics (TRL's names) ---
    log_completions_steps: int | None = Field(
        None, gt=0, description="every N steps (and at max_steps) log a table of the step's sampled completions: "
        "prompt, completion, each reward function's score, source (output_dir/completions.jsonl under jsonl, a "
        "table in each tracker); None = never",
        json_schema_extra={"trl": "log_completions (a flag: every logging_steps steps)"})
    eval_steps: int | None = Field(
        None, gt=0, description="every N steps evaluate the policy on a fixed held-out slice (greedy accuracy, "
        "pass@1, emergence features; grpo_core/trainer/during_rl.py), logged as eval/... in that step's row; "
        "needs held-out rows (train_grpo's eval_rows; the pipeline passes prepare_data's eval.parquet); None = never")
    eval_samples: int = Field(64, gt=0, description="held-out prompts in the fixed slice eval_steps evaluates "
                              "(the first N verifiable rows; the monitor: the first N rows of each monitored source)")

    # --- reward-hacking monitor (grpo_core/trainer/monitor.py) ---
    monitor_reward: RewardEntry | None = Field(
        None, description="eval_steps: the held-out signal the monitor scores the general sources' held-out rows by, "
        "beside their training reward (the proxy): a registered reward, {reward_model: ...} or {judge: ...} that no "
        "source trains on; None = the evaluation's rule_reward (the embedded default's generating rule), if any")
    monitor_window: int = Field(3, ge=2, description="the monitor alarms when, from the first to the last of the "
                                "last N evaluations, the proxy rose and the held-out signal fell")
    select_checkpoint: Literal["last", "heldout"] = Field(
        "last", description="the model the stage returns: last = the last step's; heldout = the evaluated checkpoint "
        "with the best held-out signal (needs eval_steps, a multiple of save_steps)")

    # --- memory (logprob_chunk_size is in OptimConfig) ---
    share_prompt_forward: bool = Field(
        True, description="run each prompt once per micro-batch for its G completions (training and reference "
        "passes); padded micro-batches only (padding_free runs each row's prompt in its row)"
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        """TRL < 1.6's ``vllm_importance_sampling_cap`` is ``vllm_importance_sampling_clip_max`` (as TRL maps it);
        sampling fields given flat (older configs, TRL's layout) go into ``sampling``."""
        data = GRPOSampling.nest_flat_fields(data)
        if isinstance(data, dict) and "vllm_importance_sampling_cap" in data:
            data = dict(data)
            cap = data.pop("vllm_importance_sampling_cap")
            if data.get("vllm_importance_sampling_clip_max", cap) != cap:
                raise ValueError(
                    "vllm_importance_sampling_cap (the older name) and vllm_importance_sampling_clip_max are both "
                    "set and differ; keep only vllm_importance_sampling_clip_max"
                )
            data["vllm_importance_sampling_clip_max"] = cap
        return data

    @field_validator("reward_funcs", mode="before")
    @classmethod
    def _reward_entries(cls, value: Any) -> Any:
        return [normalize_reward_entry(v) for v in value] if isinstance(value, list) else value

    @field_validator("monitor_reward", mode="before")
    @classmethod
    def _monitor_entry(cls, value: Any) -> Any:
        return normalize_reward_entry(value)

    @field_validator("gradient_accumulation_steps")
    @classmethod
    def _no_accumulation(cls, value: int) -> int:
        """Inherited from OptimConfig, but GRPO's micro-batches follow from the step's completions: refuse a
        value that would be ignored (TRL users bring it over)."""
        if value != 1:
            raise ValueError(
                f"gradient_accumulation_steps ({value}) does nothing in GRPO: an optimiser step trains on "
                "generation_batch_size / steps_per_generation completions, in micro-batches of "
                "per_device_train_batch_size (lower it to save memory; raise generation_batch_size for a bigger step); "
                "remove gradient_accumulation_steps")
        return value

    @model_validator(mode="after")
    def _check(self) -> "GRPOConfig":
        names = [reward_entry_name(e) for e in self.reward_funcs]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"reward_funcs names {dup} more than once; give each reward model / judge its own "
                             "`name:` (metrics are logged per name)")
        low, high = self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max
        if low is not None and high is not None and low >= high:
            raise ValueError(
                f"vllm_importance_sampling_clip_min ({low}) must be below vllm_importance_sampling_clip_max ({high})"
            )
        G = self.sampling.num_generations
        if self.generation_batch_size % G:
            raise ValueError(
                f"generation_batch_size ({self.generation_batch_size}) must be a multiple of sampling.num_generations "
                f"({G}); e.g. set generation_batch_size to {max(1, self.generation_batch_size // G) * G}"
            )
        if self.reward_weights is not None and len(self.reward_weights) != len(self.reward_funcs):
            raise ValueError(
                f"reward_weights has {len(self.reward_weights)} entries but reward_funcs has "
                f"{len(self.reward_funcs)} ({self.reward_funcs}); give one weight per reward function"
            )
        if self.sources:
            names = [s.name for s in self.sources]
            if len(set(names)) != len(names):
                raise ValueError(f"sources names a source twice ({names}); give each source once")
            check_shared_reward_names(self.sources)
        if self.loss_type == "bnpo" and self.max_tokens_per_batch is not None:
            raise ValueError(
                "loss_type='bnpo' normalises by each micro-batch's own tokens, so a token budget "
                f"(max_tokens_per_batch={self.max_tokens_per_batch}) would change the loss: remove max_tokens_per_batch "
                "(padding_free then packs micro-batches of per_device_train_batch_size rows) or pick another loss_type")
        if self.sampling.vllm_mode == "server" and self.async_rollouts:
            raise ValueError("async_rollouts runs the sampler in a process of the trainer's; sampling.vllm_mode: server "
                             "generates on a server instead: set one of async_rollouts: false or sampling.vllm_mode: "
                             "colocate")
        if self.eval_steps is not None and self.async_rollouts:
            raise ValueError("eval_steps evaluates with the trainer's sampler, which async_rollouts hands to its own "
                             "process; set async_rollouts: false or remove eval_steps (evaluate runs after the stage)")
        self._check_monitor()
        if self.epsilon_high is not None and self.epsilon_high < self.epsilon:
            raise ValueError(
                f"epsilon_high ({self.epsilon_high}) < epsilon ({self.epsilon}); clip-higher needs epsilon_high >= epsilon"
            )
        return self

    def _check_monitor(self) -> None:
        """The monitor and ``select_checkpoint: heldout`` score at ``eval_steps``; selection picks among checkpoints,
        so every evaluation must fall on one (``save_steps`` divides ``eval_steps``)."""
        if self.eval_steps is None:
            for name, unset, fix in (("monitor_reward", self.monitor_reward is None, "remove monitor_reward"),
                                     ("select_checkpoint: heldout", self.select_checkpoint != "heldout",
                                      "set select_checkpoint: last")):
                if not unset:
                    raise ValueError(f"{name} scores the held-out rows at eval_steps, which is not set; set eval_steps "
                                     f"(e.g. eval_steps: {self.save_steps}, a multiple of save_steps) or {fix}")
            return
        if self.monitor_reward is not None:
            trained = {reward_entry_name(e) for s in self.sources for e in s.reward_funcs}
            trained |= {reward_entry_name(e) for e in self.reward_funcs} if not self.sources else set()
            if reward_entry_name(self.monitor_reward) in trained:
                raise ValueError(f"monitor_reward {reward_entry_name(self.monitor_reward)!r} is also a training "
                                 "reward; the held-out signal must be one the policy is not trained on (a second "
                                 "reward model, a judge or a rule): name another reward or remove monitor_reward")
        if self.select_checkpoint == "heldout" and self.eval_steps % self.save_steps:
            raise ValueError(
                f"select_checkpoint: heldout commits an evaluated checkpoint, but eval_steps ({self.eval_steps}) is not "
                f"a multiple of save_steps ({self.save_steps}), so evaluations fall between checkpoints; set save_steps "
                f"to a divisor of eval_steps (e.g. save_steps: {self.eval_steps}) or select_checkpoint: last")

    @property
    def prompts_per_step(self) -> int:
        return self.generation_batch_size // self.sampling.num_generations


class RewardConfig(OptimConfig):
    """Reward-model training on preference pairs (TRL's ``RewardConfig``): Bradley-Terry loss
    ``-logsigmoid(r_chosen - r_rejected [- margin])`` (+ ``center_rewards_coefficient``) on an
    ``AutoModelForSequenceClassification`` with one label (``grpo_core.trainer.reward_model``). The pipeline's
    ``reward_model`` section is a subclass with the stage's own fields (``tasks.config.sections.RewardModelStageConfig``:
    ``init_from``, ``model_name_or_path``, ``min_heldout_accuracy``)."""

    learning_rate: float = Field(1e-4, gt=0, description="TRL's RewardConfig default")
    max_steps: int | None = Field(None, gt=0, description=MAX_STEPS_HELP)
    num_train_epochs: float = Field(1.0, gt=0, description=EPOCHS_HELP)
    max_length: int = Field(1024, gt=0, description="prompt + response tokens; longer ones are cut on the right (TRL)")
    center_rewards_coefficient: float | None = Field(
        None, ge=0, description="adds coef * mean((r_chosen + r_rejected)^2) (Eisenstein et al. 2023); TRL suggests 0.01",
    )
    eval_fraction: float = Field(0.1, gt=0, lt=1, description="pairs held out for eval/pair_accuracy when no "
                                 "held-out set is given")
    eval_batch_size: int = Field(32, gt=0, description="pairs per forward pass when scoring the held-out pairs",
                                 json_schema_extra={"trl": "per_device_eval_batch_size"})
    near_miss_negatives: int = Field(
        0, ge=0, description="extra training pairs per pair: (prompt, chosen, a character-level near miss of chosen) "
        "(grpo_core.data.near_miss), so the model ranks the exact answer above its typos (sorryy, word!!); 0 = off. "
        "With max_steps unset the epochs count these pairs too",
    )


def needs_reference(config: GRPOConfig) -> bool:
    """Whether an RL run needs the reference model's log-probs: exactly when the k3 KL term is on (``beta > 0``;
    ``trainer/loss.py``). They come from the trainer's own reference model, or from the sampler process under
    ``async_rollouts`` with ``async_reference_on_sampler`` (``trainer/async_rollouts.py``); with ``beta: 0`` no
    reference model is loaded anywhere."""
    return config.beta > 0.0
