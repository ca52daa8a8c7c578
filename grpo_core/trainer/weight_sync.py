"""Push the policy's weights to the sampler after an update, and check the sampler holds them.

The most repeated complaint about LoRA in RL systems is adapters that never reach the generator (verl#7495: a
run sampled from the initial policy for two months; ROLL#436; trl#2698): nothing fails, the rewards just do
not move. So a LoRA run checks every sync: the trainer hashes a few merged tensors (``probe_names``: the first
and last adapted weight, where an update shows), asks the sampler for its hashes of the same tensors in the
dtype it holds them, and fails the step naming the sync when they differ (``WeightSyncError``). A hash is exact:
a tolerance on a probe log-prob could pass a missed small update.

Backends answer ``weights_digest(names) -> {name: (dtype, sha256)}``: the transformers replica from its
module, vLLM from its worker's parameters (unfused names only: vLLM fuses q/k/v and gate/up, so the probe
prefers ``o_proj`` / ``down_proj``).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from grpo_core.trainer.lora import MergedWeights, is_peft_model, merged_state_dict

_PREFERRED = ("o_proj", "down_proj")  # never fused by vLLM


class WeightSyncError(RuntimeError):
    """The sampler's weights are not the trainer's after a sync."""


def tensor_digest(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's bytes (contiguous, on the CPU)."""
    data = tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
    return hashlib.sha256(data.tobytes()).hexdigest()


def probe_names(model: torch.nn.Module) -> list[str]:
    """The merged tensors the check compares: the first and last adapted weight, ``o_proj``/``down_proj`` first."""
    from peft.tuners.lora import LoraLayer

    adapted = [name for name, m in model.get_base_model().named_modules() if isinstance(m, LoraLayer)]
    preferred = [n for n in adapted if n.rsplit(".", 1)[-1] in _PREFERRED] or adapted
    return sorted({f"{preferred[0]}.weight", f"{preferred[-1]}.weight"})


def push_weights(backend: Any, model: torch.nn.Module) -> None:
    """Give the sampler the policy's current weights: the merged ones for a LoRA policy."""
    backend.update_weights(MergedWeights(model) if is_peft_model(model) else model)


def verify_sync(backend: Any, model: torch.nn.Module, names: list[str], sync: str) -> None:
    """Fail with ``WeightSyncError`` (naming ``sync``, e.g. "after optimiser step 12") unless the sampler's
    copies of ``names`` hash like the trainer's merged tensors cast to the sampler's dtype."""
    digest = getattr(backend, "weights_digest", None)
    if digest is None:
        raise WeightSyncError(f"the sampler {type(backend).__name__} cannot report its weights, so the sync {sync} "
                              "cannot be checked; use the transformers or vLLM sampler (async_rollouts is not "
                              "supported with use_peft)")
    held = digest(names)
    merged = merged_state_dict(model, names)
    for name in names:
        if name not in held:
            raise WeightSyncError(f"the sampler has no tensor {name} to check the sync {sync} against (vLLM fuses "
                                  "q/k/v and gate/up projections): include o_proj or down_proj in lora_target_modules")
        dtype, got = held[name]
        want = tensor_digest(merged[name].to(getattr(torch, dtype.removeprefix("torch."))))
        if got != want:
            raise WeightSyncError(
                f"weight sync {sync}: the sampler's {name} is not the trainer's merged weight (sha256 {got[:12]} != "
                f"{want[:12]}); the sampler would generate from stale weights. The push of the merged LoRA weights "
                "did not reach the sampler (grpo_core/trainer/weight_sync.py: push_weights)")
