"""LoRA / QLoRA (PEFT) for every trainer: adapters on a frozen base, their merged weights, the committed folder.

    model = load_lora_model("Qwen/Qwen2.5-7B", config, device)             # fresh adapters (use_peft: true)
    model = load_lora_model(base, config, device, adapter=checkpoint_dir)   # a checkpoint's adapters, trainable
    merged_state_dict(model)                                                # {HF name: W + alpha/r B A}

Names are TRL's ``ModelConfig`` ones (``use_peft``, ``lora_r``, ``lora_alpha``, ``lora_dropout``,
``lora_target_modules``, ``load_in_4bit``). What LoRA changes elsewhere, and why:

- The base stays frozen in its own dtype on GPU (bf16 for Qwen; fp32 on CPU, where bf16 matmuls are slow) and only
  the adapters (fp32, PEFT's ``autocast_adapter_dtype``) get gradients and AdamW state, which is what lets a 7B
  run fit on one GPU (``grpo_core/plan/memory.py`` counts it so).
- The reference model of the KL term is the same module with the adapter disabled (``reference_view``): no
  second copy of the weights.
- Checkpoints hold the adapters (``adapter_model.safetensors``, ``adapter_config.json``), not the base: a resume
  rebuilds the base from ``model_path`` and loads them trainable. The base is never modified (merged weights
  are computed beside it, not merged in place: merge/unmerge in floating point would drift the frozen base and
  break bit-exact resume).
- The sampler gets the merged weights (``MergedWeights``; ``grpo_core/trainer/weight_sync.py`` pushes them and
  checks the sampler holds them), and ``final/`` is the merged model as a plain Hugging Face folder with the
  adapter beside it in ``final/adapter/``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch

from grpo_core.config import OptimConfig
from grpo_core.generation.base import GenerationRequest, tensor_digest
from grpo_core.trainer.dtypes import resolve_save_dtype

ADAPTER_DIR = "adapter"  # final/adapter: the trained adapter beside the merged model
ADAPTER = "default"  # PEFT's adapter name
_DROP = (".lora_A.", ".lora_B.", ".lora_embedding_A.", ".lora_embedding_B.", ".lora_magnitude_vector.",
         ".original_module.")


def is_peft_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a PEFT model (adapters on a frozen base)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def check_4bit_available(device: torch.device) -> None:
    """``load_in_4bit`` needs bitsandbytes and a CUDA device; refuse with how to fix it otherwise."""
    if device.type != "cuda":
        raise ValueError(f"load_in_4bit (QLoRA) quantises the base with bitsandbytes, which needs a CUDA GPU; this "
                         f"process trains on {device}: set load_in_4bit: false (LoRA on the unquantised base)")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ValueError("load_in_4bit (QLoRA) needs the bitsandbytes package, which is not installed: "
                         "pip install bitsandbytes, or set load_in_4bit: false")


def base_dtype(model_path: str | Path, device: torch.device) -> torch.dtype:
    """The frozen base's dtype: the model's own (config.json) on GPU, fp32 on CPU."""
    if device.type != "cuda":
        return torch.float32
    return resolve_save_dtype("auto", model_path)


def lora_config(config: OptimConfig, task_type: str) -> Any:
    """PEFT's ``LoraConfig`` from the trainer config (``task_type``: CAUSAL_LM, or SEQ_CLS for a reward model,
    whose fresh score head PEFT trains in full as a ``modules_to_save``)."""
    from peft import LoraConfig

    return LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=config.lora_target_modules, task_type=task_type, bias="none")


def load_lora_model(model_path: str | Path, config: OptimConfig, device: torch.device, *,
                    adapter: str | Path | None = None, task_type: str = "CAUSAL_LM",
                    load_base: Any = None) -> torch.nn.Module:
    """The base at ``model_path`` (frozen, ``base_dtype``; 4-bit NF4 under ``load_in_4bit``) with trainable
    adapters: fresh ones (PEFT's init: A random, B zero, so the first forward is the base's), or ``adapter``'s
    (a checkpoint folder). ``load_base(path, **kwargs)``: the base's loader (default: a causal LM); in train
    mode, with gradient checkpointing when configured."""
    from peft import PeftModel, get_peft_model

    if load_base is None:
        from transformers import AutoModelForCausalLM

        load_base = AutoModelForCausalLM.from_pretrained
    kwargs: dict[str, Any] = {"dtype": base_dtype(model_path, device)}
    if config.load_in_4bit:
        check_4bit_available(device)
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=kwargs["dtype"])
        kwargs["device_map"] = {"": device}
    base = load_base(model_path, **kwargs)
    if not config.load_in_4bit:
        base = base.to(device)
    if config.gradient_checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if adapter is not None:
        model = PeftModel.from_pretrained(base, str(adapter), is_trainable=True)
    else:
        model = get_peft_model(base, lora_config(config, task_type))
    return model.train()


class reference_view:
    """``with reference_view(model) as ref:`` the policy with its adapter disabled, i.e. the frozen base: the
    reference model of the KL term without a second copy (TRL does the same under PEFT)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._ctx: Any = None

    def __enter__(self) -> torch.nn.Module:
        self._ctx = self.model.disable_adapter()
        self._ctx.__enter__()
        return self.model

    def __exit__(self, *exc: Any) -> None:
        self._ctx.__exit__(*exc)


def _dense_weight(layer: Any) -> torch.Tensor:
    """A LoRA layer's base weight as a dense tensor (4-bit weights dequantised)."""
    weight = layer.get_base_layer().weight
    if hasattr(weight, "quant_state"):  # bitsandbytes Params4bit
        from peft.utils.integrations import dequantize_bnb_weight

        return dequantize_bnb_weight(weight, state=weight.quant_state)
    return weight


@torch.no_grad()
def merged_state_dict(model: torch.nn.Module, names: list[str] | None = None) -> dict[str, torch.Tensor]:
    """The merged model's tensors in the base model's Hugging Face names (what ``from_pretrained`` and vLLM read):
    ``W + lora_alpha / lora_r * B A`` for every adapted layer (fp32), trained ``modules_to_save`` copies in place
    of the originals, the rest as held. The model is not modified. ``names``: only these (the sync probe)."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    lora_layers = {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
    out: dict[str, torch.Tensor] = {}
    for key, tensor in base.state_dict().items():
        if any(part in key for part in _DROP):
            continue
        key = key.replace(f".modules_to_save.{ADAPTER}.", ".")
        if ".base_layer." in key:
            owner, _, leaf = key.partition(".base_layer.")
            if leaf.startswith("weight."):  # 4-bit quantisation state (absmax, quant_map, ...)
                continue
            key = f"{owner}.{leaf}"
            if names is not None and key not in names:
                continue
            if leaf == "weight":
                layer = lora_layers[owner]
                delta = layer.get_delta_weight(ADAPTER) if ADAPTER in layer.lora_A else 0.0
                tensor = _dense_weight(layer).float() + delta  # [out, in]
        elif names is not None and key not in names:
            continue
        out[key] = tensor
    return out


class MergedWeights(torch.nn.Module):
    """A module whose ``state_dict`` is ``model``'s merged weights: what the samplers' ``update_weights`` and
    ``safetensors.save_model`` read, so every backend receives plain Hugging Face tensors."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self._peft = [model]  # a list: not registered as a submodule

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return merged_state_dict(self._peft[0])


def save_adapter(model: torch.nn.Module, path: Path) -> None:
    """The adapter (``adapter_model.safetensors`` + ``adapter_config.json``) into ``path``."""
    model.save_pretrained(str(path), safe_serialization=True)


class MergedReplica:
    """The transformers sampler of a LoRA run: a plain copy of the base model that holds the merged weights.

    The trainer's own module cannot sample as the merged model (its adapters have dropout in train mode, and the
    sampler must hold exactly what the weight sync sent); the copy costs one model in memory, as vLLM's does."""

    def __init__(self, backend: Any, replica: torch.nn.Module) -> None:
        self.backend, self.replica = backend, replica

    def generate(self, prompt_ids: list[list[int]], request: GenerationRequest) -> Any:
        return self.backend.generate(prompt_ids, request)

    @torch.no_grad()
    def update_weights(self, model: torch.nn.Module) -> None:
        state = model.state_dict()
        own = self.replica.state_dict()
        for name, tensor in state.items():
            own[name].copy_(tensor)

    def weights_digest(self, names: list[str]) -> dict[str, tuple[str, str]]:
        own = self.replica.state_dict()
        return {n: (str(own[n].dtype), tensor_digest(own[n])) for n in names if n in own}
