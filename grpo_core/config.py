"""Configuration of the algorithm layer: one pydantic model per trainer.

Field names follow TRL's ``GRPOConfig``/``SFTConfig`` wherever the concept is the same
(``num_generations``, ``beta``, ``epsilon``, ``epsilon_high``, ``loss_type``, ``scale_rewards``,
``max_completion_length``, ``num_iterations``, ...), so a TRL config moves over field by field.
Unknown fields are rejected (``extra="forbid"``) so a typo never silently falls back to a default.

Defaults are the seed's hyperparameter table (G 8-16, beta 0.001-0.01, epsilon 0.1-0.2,
lr 1e-6..5e-6, max_new_tokens 1024-2048) where it gives one.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class OptimConfig(_Strict):
    """Optimiser and schedule fields shared by the SFT and GRPO trainers."""

    learning_rate: float = Field(1e-6, gt=0, description="AdamW peak learning rate (seed: 1e-6 to 5e-6)")
    lr_scheduler_type: Literal["constant", "constant_with_warmup", "cosine", "linear"] = "constant_with_warmup"
    warmup_ratio: float = Field(0.0, ge=0, lt=1)
    warmup_steps: int = Field(0, ge=0, description="overrides warmup_ratio when > 0")
    weight_decay: float = Field(0.0, ge=0)
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    adam_beta2: float = Field(0.99, ge=0, lt=1)
    adam_epsilon: float = Field(1e-8, gt=0)
    max_grad_norm: float = Field(1.0, gt=0)
    max_steps: int = Field(100, gt=0)
    per_device_train_batch_size: int = Field(8, gt=0, description="sequences per forward/backward micro-batch")
    gradient_accumulation_steps: int = Field(1, gt=0)
    gradient_checkpointing: bool = False
    bf16: bool = Field(False, description="bf16 autocast on GPU; ignored (fp32) on CPU")
    seed: int = 0
    save_steps: int = Field(50, gt=0, description="write a resumable checkpoint every N optimiser steps")
    save_total_limit: int = Field(2, gt=0, description="keep the newest N checkpoints")
    logging_steps: int = Field(1, gt=0)
    report_to: list[Literal["jsonl", "tensorboard"]] = ["jsonl", "tensorboard"]
    torch_num_threads: int | None = Field(None, gt=0, description="torch.set_num_threads; None leaves torch's default")


class SFTConfig(OptimConfig):
    """Supervised fine-tuning on (prompt, completion) pairs, loss on completion tokens only."""

    learning_rate: float = Field(1e-5, gt=0)
    num_train_epochs: float = Field(1.0, gt=0, description="used when max_steps is not set explicitly")
    max_length: int = Field(1024, gt=0, description="prompt + completion tokens; longer rows are truncated")
    completion_only_loss: bool = True


class GRPOConfig(OptimConfig):
    """Group Relative Policy Optimisation (the seed's boxed objective and its variants)."""

    # --- sampling (seed: G = 8-16, max_new_tokens 1024-2048) ---
    num_generations: int = Field(8, ge=2, description="G: completions sampled per prompt")
    generation_batch_size: int = Field(64, gt=0, description="completions generated per step (prompts x G)")
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0, description="0 disables top-k")
    max_prompt_length: int = Field(512, gt=0, description="prompts are left-truncated to this many tokens")
    max_completion_length: int = Field(1024, gt=0)
    mask_truncated_completions: bool = Field(False, description="exclude completions that hit the length cap from the loss")

    # --- objective (seed's boxed formula; see grpo_core/loss.py) ---
    beta: float = Field(0.001, ge=0, description="k3 KL coefficient; 0 means no reference model at all")
    epsilon: float = Field(0.2, gt=0, description="lower clip: ratio >= 1 - epsilon")
    epsilon_high: float | None = Field(None, gt=0, description="upper clip (DAPO clip-higher); None = epsilon")
    loss_type: Literal["grpo", "dapo", "dr_grpo", "bnpo"] = "grpo"
    scale_rewards: Literal["group", "batch", "none"] = "group"
    importance_sampling_level: Literal["token", "sequence"] = "token"
    num_iterations: int = Field(1, ge=1, description="mu: optimisation passes over each generated batch")
    steps_per_generation: int | None = Field(None, ge=1, description="optimiser steps per generation round; None = gradient_accumulation_steps")

    # --- rewards ---
    reward_funcs: list[str] = ["math_accuracy", "format"]
    reward_weights: list[float] | None = None
    reward_timeout: float = Field(5.0, gt=0, description="seconds allowed per reward check before it scores 0")
    reward_num_workers: int = Field(2, ge=1)

    # --- DAPO dynamic sampling ---
    dynamic_sampling: bool = Field(False, description="drop groups whose rewards are all equal and refill the batch")
    max_dynamic_sampling_rounds: int = Field(3, ge=1, description="cap on extra generation rounds per step")

    # --- generation backend ---
    use_vllm: bool | None = Field(None, description="None: vLLM when importable, else transformers generate")
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    vllm_tensor_parallel_size: int = Field(1, ge=1)
    vllm_kv_cache_memory_bytes: int | None = Field(None, gt=0, description="fixed KV cache size (needed on CPU)")

    # --- memory ---
    logprob_chunk_size: int = Field(1024, gt=0, description="rows of logits turned into log-probs at once")

    @model_validator(mode="after")
    def _check(self) -> "GRPOConfig":
        if self.generation_batch_size % self.num_generations:
            raise ValueError(
                f"generation_batch_size ({self.generation_batch_size}) must be a multiple of num_generations "
                f"({self.num_generations}); e.g. set generation_batch_size to "
                f"{max(1, self.generation_batch_size // self.num_generations) * self.num_generations}"
            )
        if self.reward_weights is not None and len(self.reward_weights) != len(self.reward_funcs):
            raise ValueError(
                f"reward_weights has {len(self.reward_weights)} entries but reward_funcs has "
                f"{len(self.reward_funcs)} ({self.reward_funcs}); give one weight per reward function"
            )
        if self.epsilon_high is not None and self.epsilon_high < self.epsilon:
            raise ValueError(
                f"epsilon_high ({self.epsilon_high}) < epsilon ({self.epsilon}); clip-higher needs epsilon_high >= epsilon"
            )
        return self

    @property
    def prompts_per_step(self) -> int:
        return self.generation_batch_size // self.num_generations

    @property
    def clip_eps_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high
