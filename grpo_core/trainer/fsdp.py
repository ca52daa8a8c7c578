"""FSDP2 (``fully_shard``) for the GRPO trainer: sharded weights, gradients and optimizer state.

Selected by ``GRPOConfig.distributed_strategy="fsdp"`` under torchrun; the ``ddp`` path keeps whole
replicas and all-reduces gradients (``distributed.all_reduce_gradients``). Works with NCCL on GPUs
and with gloo on CPU (the tests run it on CPU).

Sharding: one FSDP group per decoder layer and a root group on the whole causal LM holding what is
left (embeddings, final norm, ``lm_head``; tied embeddings stay one parameter). FSDP2 unshards a
group in its module's forward pre-hook, but ``grpo_core.logprobs.compute_token_logps`` calls the
decoder and ``lm_head`` directly and never runs the root's ``forward``. So:
  - a dummy forward through the root at setup makes it FSDP's root (lazy init happens in the first
    FSDP forward to run; a layer running first would become a root of its own and never reshard);
  - a forward pre-hook on the decoder calls ``root.unshard()``; the root never reshards after
    forward, so the ``lm_head`` chunks that follow (and their recomputation in backward) see full
    weights; the root's end-of-backward callback reduce-scatters its gradients and reshards it.
    A forward without backward (no-grad log-probs) must be followed by ``model.reshard()``: while
    unsharded, ``model.parameters()`` yields the gathered copies, not the parameters the optimizer steps.
Gradient reduction is a plain SUM (divide factor 1): each micro-batch loss is already divided by
the global sequence/token totals, so the summed gradient is the single-process full-batch gradient,
as on the ``ddp`` path. Every forward is a collective, so every rank must run the same number of
micro-batches (``distributed.micro_batches(lockstep=True)`` pads with empty ones).

Checkpoints keep the single-process file format, so a checkpoint resumes under either strategy and
any process count: full weights gathered to rank 0 for ``save_pretrained``, and the optimizer state
in ``torch.optim.Optimizer.state_dict()``'s own layout (integer parameter ids) with full tensors.
Departure from torch.distributed.checkpoint's ``get_optimizer_state_dict``: that keys by parameter
name, which the ``ddp`` path's ``optimizer.load_state_dict`` cannot read.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from grpo_core.generation import GenerationBackend, Rollout
from grpo_core.trainer.distributed import DistContext


def is_sharded(model: nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def shard_model(model: nn.Module, ctx: DistContext, *, bf16: bool = False) -> nn.Module:
    """Apply FSDP2 in place (layers, then the root) over all ``ctx.world_size`` ranks; returns ``model``.

    ``bf16`` (GPU only) all-gathers bf16 weights for compute and reduces gradients in fp32.
    """
    decoder = model.get_decoder()
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"fsdp: {type(decoder).__name__} has no .layers to shard; use distributed_strategy='ddp'")
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    mp = MixedPrecisionPolicy()
    if bf16 and ctx.device.type == "cuda":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # SUM: losses are already divided by global totals
            module.set_force_sum_reduction_for_comms(True)  # no PreMulSum (gloo lacks it)
    decoder.register_forward_pre_hook(lambda *_: model.unshard())  # no-op when already unsharded
    with torch.no_grad():  # make the root FSDP's root: the first FSDP forward to run decides
        model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=ctx.device))
    model.reshard()  # back to sharded parameters, which model.parameters() (and so the optimizer) must see
    return model


def gather_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full CPU state dict on rank 0 (``{}`` elsewhere); every rank must call it.

    Tied parameters (e.g. ``lm_head.weight`` = ``embed_tokens.weight``) share one tensor again, as in
    the unsharded model, so ``save_pretrained`` writes the file a single process writes.
    """
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    first: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if name in state and first.setdefault(id(param), name) != name:
            state[name] = state[first[id(param)]]
    return state


def gather_optimizer_state(optimizer: torch.optim.Optimizer, ctx: DistContext) -> dict[str, Any] | None:
    """``optimizer.state_dict()`` with every sharded tensor gathered, on rank 0 (``None`` elsewhere)."""
    packed = optimizer.state_dict()
    state: dict[int, dict[str, Any]] = {}
    for index in sorted(packed["state"]):  # the same order on every rank: each gather is a collective
        entry = {}
        for key, value in packed["state"][index].items():
            if isinstance(value, DTensor):
                value = value.full_tensor()
            entry[key] = value.detach().cpu().clone() if isinstance(value, torch.Tensor) else value
        state[index] = entry
    return {"state": state, "param_groups": packed["param_groups"]} if ctx.is_main else None


def load_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """Load a full (single-process layout) optimizer state into an optimizer over sharded parameters."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state: dict[int, dict[str, Any]] = {}
    for index, entry in saved["state"].items():
        param = params[int(index)]
        state[index] = {key: _shard_like(value, param) for key, value in entry.items()}
    optimizer.load_state_dict({"state": state, "param_groups": saved["param_groups"]})


def _shard_like(value: Any, param: torch.Tensor) -> Any:
    if isinstance(param, DTensor) and isinstance(value, torch.Tensor) and value.shape == param.shape:
        # every rank read the full tensor from the checkpoint: slice locally, no communication
        return distribute_tensor(value.to(param.device), param.device_mesh, param.placements, src_data_rank=None)
    return value  # e.g. Adam's scalar step


@torch.no_grad()
def copy_full_weights(sharded: nn.Module, target: nn.Module) -> None:
    """Copy the sharded model's weights into an unsharded replica, one gathered tensor at a time (all ranks)."""
    target_state = target.state_dict()
    for name, tensor in sharded.state_dict().items():
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        target_state[name].copy_(full)


class ReplicaBackend:
    """A generation backend sampling from a full replica, refreshed from the shards after each update.

    The transformers backend normally samples with the trainer's own module; under FSDP that would
    make every decoding step a collective, and ranks stop decoding at different steps. A replica
    (one full copy per rank, as a colocated vLLM engine holds) decodes independently.
    """

    def __init__(self, backend: GenerationBackend, replica: nn.Module) -> None:
        self.backend = backend
        self.replica = replica

    def generate(self, prompt_ids: list[list[int]], **kwargs: Any) -> list[Rollout]:
        return self.backend.generate(prompt_ids, **kwargs)

    def update_weights(self, model: nn.Module) -> None:
        copy_full_weights(model, self.replica)
