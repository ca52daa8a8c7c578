"""What every section shares: the strict base model (unknown fields are errors), the optimiser and schedule
fields of the trainers (``OptimConfig``), packed micro-batches (``PaddingFreeConfig``), the help strings several
sections repeat, and who a training call is for the trackers (``TrackingInfo``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


LONG_PROMPTS_HELP = ("a prompt longer than max_prompt_length: truncate keeps its last max_prompt_length tokens "
                     "(left truncation, as TRL and GRPO training always did), drop skips the row and counts it")


# SFT and reward-model training count steps from epochs unless max_steps is given. A value, not "was it set":
# a config dumped and read again (a saved run, a deployment's parameters) keeps its meaning.
MAX_STEPS_HELP = "optimiser steps; None = num_train_epochs over the rows (TRL's max_steps=-1)"
EPOCHS_HELP = "passes over the rows when max_steps is None: ceil(num_train_epochs x rows / rows per step) steps"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class OptimConfig(_Strict):
    """Optimiser and schedule fields shared by the SFT and GRPO trainers."""

    learning_rate: float = Field(1e-6, gt=0, description="AdamW peak learning rate (seed: 1e-6 to 5e-6)")
    lr_scheduler_type: Literal["constant", "constant_with_warmup", "cosine", "linear"] = Field(
        "constant_with_warmup", description="learning-rate schedule (transformers.get_scheduler): warmup rises "
        "linearly from 0, then constant, cosine or linear decay to 0; plain constant has no warmup")
    warmup_ratio: float = Field(0.0, ge=0, lt=1, description="share of the optimiser steps spent warming up "
                                "(rounded up); warmup_steps > 0 overrides it")
    warmup_steps: int = Field(0, ge=0, description="overrides warmup_ratio when > 0")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay, on matrices only (not on biases or norm "
                                "weights, as transformers' Trainer)")
    adam_beta1: float = Field(0.9, ge=0, lt=1, description="AdamW beta1: decay rate of the gradient's running mean")
    adam_beta2: float = Field(0.99, ge=0, lt=1, description="AdamW beta2: decay rate of the squared gradient's "
                              "running mean")
    adam_epsilon: float = Field(1e-8, gt=0, description="AdamW epsilon, added to the denominator")
    max_grad_norm: float = Field(1.0, gt=0, description="the gradients (summed over the ranks) are clipped to this "
                                 "global norm before each optimiser step")
    max_steps: int = Field(100, gt=0, description="steps to train; a GRPO step is one generation round "
                           "(steps_per_generation x num_iterations optimiser steps)")
    per_device_train_batch_size: int = Field(8, gt=0, description="sequences per forward/backward micro-batch")
    gradient_accumulation_steps: int = Field(1, gt=0, description="micro-batches per optimiser step (SFT, reward "
                                             "model); GRPO refuses it: its micro-batches follow from its completions")
    gradient_checkpointing: bool = Field(False, description="recompute each decoder layer's activations in backward "
                                         "(under FSDP: one checkpointed layer per FSDP group)")
    bf16: bool = Field(False, description="GPU only (fp32 on CPU): bf16 autocast; under FSDP also bf16 weights for "
                       "compute, fp32 gradient reduction and fp32 master weights (MixedPrecisionPolicy)")
    seed: int = Field(0, description="seed of the training: the order of the rows (and a mixture's draws), dropout, "
                      "fresh weights such as a reward model's score head, and GRPO's sampling; r1 run --seed sets it")
    save_steps: int = Field(50, gt=0, description="write a resumable checkpoint every N optimiser steps")
    save_total_limit: int = Field(2, gt=0, description="keep the newest N checkpoints")
    save_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="dtype of the final (committed) model: auto = the base model's (its config.json dtype, "
        "fp32 when it names none); training runs on fp32 weights and checkpoints keep them, for exact resume")
    logging_steps: int = Field(1, gt=0, description="log (metrics.jsonl, TensorBoard, progress) every N steps and at "
                               "the last; SFT logs the mean loss of the N steps, GRPO the Nth step's metrics")
    report_to: list[Literal["jsonl", "tensorboard", "wandb", "mlflow", "trackio"]] = Field(
        ["jsonl", "tensorboard"], description="where per-step metrics go (TRL's names): jsonl = output_dir/"
        "metrics.jsonl, tensorboard = output_dir/runs, wandb / mlflow / trackio = one tracker run per training call "
        "(grpo_core/trainer/trackers.py; the packages are the `tracking` extra; one missing or unreachable is a "
        "warning, never a failed run)")
    torch_num_threads: int | None = Field(None, gt=0, description="torch.set_num_threads; None leaves torch's default")
    logprob_chunk_size: int = Field(1024, gt=0, description="rows of logits turned into log-probs at once (the loss "
                                    "never holds [B, L, V] logits)")
    distributed_strategy: Literal["auto", "ddp", "fsdp"] = Field(
        "auto", description="under torchrun: fsdp = FSDP2 sharded weights, gradients and optimizer state, the model "
        "built on the meta device and loaded by rank 0; ddp = a full replica per rank + gradient all-reduce; auto = "
        "fsdp whenever more than one rank runs (ddp under use_peft; one process trains unsharded under any setting)",
    )
    fsdp_cpu_offload: bool = Field(False, description="FSDP on GPU: keep the sharded parameters, gradients and "
                                   "optimizer state in CPU memory (CPUOffloadPolicy; the optimizer steps on the CPU)")
    # --- LoRA / QLoRA (PEFT; TRL's ModelConfig names; grpo_core/trainer/lora.py) ---
    use_peft: bool = Field(False, description="train LoRA adapters on a frozen base (held in its own dtype on GPU); "
                           "the reference model is the base with the adapter disabled, the sampler gets the merged "
                           "weights after every update (checked), final/ is the merged model with final/adapter/")
    lora_r: int = Field(16, gt=0, description="LoRA rank")
    lora_alpha: int = Field(32, gt=0, description="LoRA scaling numerator: the update is lora_alpha / lora_r * B A")
    lora_dropout: float = Field(0.05, ge=0, lt=1, description="dropout on the adapters' input while training")
    lora_target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description="module names that get adapters (e.g. [q_proj, v_proj]); all-linear = every "
        "linear layer of the decoder (PEFT's name: attention and MLP projections, not lm_head)")
    load_in_4bit: bool = Field(False, description="QLoRA: the frozen base in 4-bit NF4 (bitsandbytes, CUDA only); "
                               "needs use_peft")

    @model_validator(mode="after")
    def _check_peft(self) -> "OptimConfig":
        if self.load_in_4bit and not self.use_peft:
            raise ValueError("load_in_4bit quantises the frozen base of a LoRA run (QLoRA); a 4-bit model cannot be "
                             "trained in full: set use_peft: true or drop load_in_4bit")
        if self.use_peft and self.distributed_strategy == "fsdp":
            raise ValueError("use_peft with distributed_strategy: fsdp is not supported: under LoRA the frozen base "
                             "is replicated and only the adapters' gradients are summed; set distributed_strategy: "
                             "ddp (or auto, which is ddp under use_peft)")
        if isinstance(self.lora_target_modules, list) and not self.lora_target_modules:
            raise ValueError("lora_target_modules is empty: name the modules that get adapters (e.g. [q_proj, "
                             "v_proj]) or use all-linear")
        return self


class PaddingFreeConfig(_Strict):
    """Packed, padding-free micro-batches (``grpo_core/trainer/packing.py``): the SFT and GRPO trainers' fields."""

    padding_free: bool = Field(
        False, description="pack each micro-batch's rows into one sequence without padding (TRL's name): position "
        "ids restart per row, attention stays within a row (flash-attention varlen, or per-row SDPA); the same loss "
        "and gradients as padded micro-batches for less compute when lengths vary")
    max_tokens_per_batch: int | None = Field(
        None, gt=0, description="padding_free: cut micro-batches by this many packed tokens instead of "
        "per_device_train_batch_size rows (a longer row trains alone); None = per_device_train_batch_size rows each")

    @model_validator(mode="after")
    def _check_padding_free(self) -> "PaddingFreeConfig":
        if self.max_tokens_per_batch is not None and not self.padding_free:
            raise ValueError(f"max_tokens_per_batch ({self.max_tokens_per_batch}) is the token budget of a packed "
                             "micro-batch: set padding_free: true, or remove max_tokens_per_batch")
        return self


class TrackingInfo(_Strict):
    """Who a training call is, for the experiment trackers of ``report_to`` (``grpo_core/trainer/trackers.py``):
    the pipeline passes its run, stage and lineage here; a notebook may pass nothing. Never part of a fingerprint
    (it names where results go, not what they are)."""

    project: str = Field("r1-pipeline", min_length=1, description="W&B project (WANDB_PROJECT wins when set)")
    group: str | None = Field(None, description="the pipeline run: W&B group, MLflow experiment, trackio project; "
                              "None = project")
    name: str | None = Field(None, description="the tracker run's name (the stage); None = output_dir's name")
    run_key: str | None = Field(None, description="stable across retries of one stage (run, stage, fingerprint): "
                                "the W&B run id, an MLflow tag a retry finds its run by, trackio's run name suffix")
    metadata: dict[str, Any] = Field(default_factory=dict, description="logged with the resolved config as the "
                                     "run's metadata: run, stage, version, fingerprint, parents")
    dir: str | None = Field(None, description="where tracker files go (W&B offline runs, the MLflow file store, "
                            "trackio's database); None = output_dir/trackers")
