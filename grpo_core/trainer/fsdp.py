"""FSDP2 (``fully_shard``) for the SFT and GRPO trainers: sharded weights, gradients and optimizer state.

Used under torchrun unless ``distributed_strategy="ddp"`` (``auto``, the default, and ``fsdp``); the ``ddp``
path keeps whole replicas and all-reduces gradients (``distributed.all_reduce_gradients``). Works with
NCCL on GPUs and with gloo on CPU (the tests run it on CPU).

Loading (``load_sharded_model``): the model is built on the meta device, sharded, given empty local shards,
then filled one tensor at a time: rank 0 reads it from the safetensors files (plain reads, no mmap:
``trainer.weights``) and scatters each rank its rows; buffers no file holds (rotary ``inv_freq``) are
computed by transformers' own ``_init_weights``. No rank ever holds the full model.

Sharding: one FSDP group per decoder layer and a root group on the whole causal LM holding what is
left (embeddings, final norm, ``lm_head``; tied embeddings stay one parameter). FSDP2 unshards a
group in its module's forward pre-hook, but ``grpo_core.trainer.logprobs.compute_token_logps`` calls the
decoder and ``lm_head`` directly and never runs the root's ``forward``. So:
  - the root's lazy init runs at setup, making it FSDP's root (it would otherwise run in the first FSDP
    forward, and a layer running first would become a root of its own and never reshard);
  - a forward pre-hook on the decoder calls ``root.unshard()``; the root never reshards after
    forward, so the ``lm_head`` chunks that follow (and their recomputation in backward) see full
    weights; the root's end-of-backward callback reduce-scatters its gradients and reshards it.
    A forward without backward (no-grad log-probs) must be followed by ``model.reshard()``: while
    unsharded, ``model.parameters()`` yields the gathered copies, not the parameters the optimizer steps.
Gradient reduction is a plain SUM (divide factor 1): each micro-batch loss is already divided by
the global sequence/token totals, so the summed gradient is the single-process full-batch gradient,
as on the ``ddp`` path. Every forward is a collective, so every rank must run the same number of
micro-batches (``distributed.micro_batches(lockstep=True)`` pads with empty ones).

Checkpoints on one host are sharded (``trainer/sharded_state.py``: each rank writes and reads its own shards
with torch.distributed.checkpoint, which reshards to any process count, one unsharded process included). Across
hosts, where each rank's ``output_dir`` is its own disk, they keep the single-process file format: full weights
gathered to rank 0 for ``save_pretrained``, and the optimizer state in ``torch.optim.Optimizer.state_dict()``'s
own layout (integer parameter ids) with full tensors (``gather_optimizer_state``); a single-process checkpoint
resumes under FSDP through ``load_full_optimizer_state``. ``output_dir/final`` is always gathered.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from transformers import AutoConfig, AutoModelForCausalLM

from grpo_core.generation import GenerationBackend, GenerationRequest, Rollout
from grpo_core.trainer.distributed import DistContext
from grpo_core.trainer.sharded_state import load_model_state
from grpo_core.trainer.weights import TensorEntry, index_weights, read_tensor

logger = logging.getLogger(__name__)


def is_sharded(model: nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def shard_model(model: nn.Module, ctx: DistContext, *, bf16: bool = False, cpu_offload: bool = False) -> nn.Module:
    """Apply FSDP2 in place (layers, then the root) over all ``ctx.world_size`` ranks; returns ``model``.

    ``bf16`` (GPU only) all-gathers bf16 weights for compute and reduces gradients in fp32; the sharded
    parameters the optimizer steps stay fp32 (master weights). ``cpu_offload`` (GPU only) keeps the sharded
    parameters, gradients and so the optimizer state in CPU memory (``CPUOffloadPolicy``).
    """
    _fully_shard(model, ctx, bf16=bf16, cpu_offload=cpu_offload)
    return _make_root(model, ctx)


def load_sharded_model(path: str | Path, ctx: DistContext, *, bf16: bool = False, cpu_offload: bool = False,
                       gradient_checkpointing: bool = False, trainable: bool = True,
                       state_dir: Path | None = None) -> nn.Module:
    """``AutoModelForCausalLM`` from ``path``, built on the meta device, sharded, then filled tensor by tensor.

    Rank 0 reads each tensor from the safetensors files (``trainer.weights``), every rank receives it by
    broadcast and keeps its own shard; so a process holds its shards plus one full tensor at a time, and a
    machine never more than one full copy. Weights are fp32 whatever the file's dtype (master weights).
    ``state_dir``: a sharded checkpoint's DCP folder instead (``path`` gives the config): each rank reads its slices.
    """
    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train(trainable).requires_grad_(trainable)
    _fully_shard(model, ctx, bf16=bf16, cpu_offload=cpu_offload)
    model.to_empty(device=_shard_device(ctx, cpu_offload))
    with torch.no_grad():
        for module in model.modules():  # non-persistent buffers (rotary inv_freq) are in no file: compute them
            if any(name in module._non_persistent_buffers_set for name, _ in module.named_buffers(recurse=False)):
                model._init_weights(module)
        if cpu_offload and ctx.device.type == "cuda":  # FSDP offloads parameters only; buffers compute on the GPU
            for module in model.modules():
                for name, buffer in module.named_buffers(recurse=False):
                    module._buffers[name] = buffer.to(ctx.device)
        if state_dir is None:
            _load_weights(model, path, ctx)
    model = _make_root(model, ctx)
    if state_dir is not None:
        load_model_state(model, state_dir)
    return model


def _shard_device(ctx: DistContext, cpu_offload: bool) -> torch.device:
    return torch.device("cpu") if cpu_offload else ctx.device


def _fully_shard(model: nn.Module, ctx: DistContext, *, bf16: bool, cpu_offload: bool) -> None:
    decoder = model.get_decoder()
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"fsdp: {type(decoder).__name__} has no .layers to shard; use distributed_strategy='ddp'")
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    on_gpu = ctx.device.type == "cuda"
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 and on_gpu \
        else MixedPrecisionPolicy()
    offload = CPUOffloadPolicy(pin_memory=True) if cpu_offload and on_gpu else OffloadPolicy()
    if cpu_offload and not on_gpu:
        logger.info("fsdp_cpu_offload: training on the CPU already; nothing to offload")
    for layer in layers:  # one group per decoder layer: with gradient checkpointing, one recomputed layer each
        fully_shard(layer, mesh=mesh, mp_policy=mp, offload_policy=offload)
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=offload)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # SUM: losses are already divided by global totals
            module.set_force_sum_reduction_for_comms(True)  # no PreMulSum (gloo lacks it)
    decoder.register_forward_pre_hook(lambda *_: model.unshard())  # no-op when already unsharded


def _make_root(model: nn.Module, ctx: DistContext) -> nn.Module:
    """Make the causal LM FSDP's root now, as its first forward would (private API: a dummy forward instead
    would all-gather the root's weights, a full embedding per rank, just to set a flag)."""
    model._get_fsdp_state()._lazy_init()
    return model


def _load_weights(model: nn.Module, path: str | Path, ctx: DistContext) -> None:
    """Fill every parameter and persistent buffer from ``path``: rank 0 reads, all ranks keep their shard."""
    aliases: dict[int, list[str]] = {}  # tied weights: one parameter, several names (any one may be in the file)
    for name, param in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(param), []).append(name)
    targets = [(aliases[id(p)], p) for _, p in model.named_parameters()]
    targets += [([name], b) for name, b in model.named_buffers() if _is_persistent(model, name)]
    sources, problem = _match_files(path, targets) if ctx.is_main else ([], None)
    verdict = [problem]
    dist.broadcast_object_list(verdict, src=0)  # every rank raises, rather than waiting on a broadcast forever
    if verdict[0]:
        raise ValueError(verdict[0])
    for i, (_, target) in enumerate(targets):
        full = read_tensor(sources[i]).to(device=ctx.device) if ctx.is_main else None  # one tensor at a time
        if isinstance(target, DTensor) and target.placements == (Shard(0),):
            _scatter_rows(full, target.to_local(), target.shape, ctx)
        else:  # a buffer: every rank keeps it whole
            if full is None:
                full = torch.empty(target.shape, dtype=target.dtype, device=ctx.device)
            dist.broadcast(full, src=0)
            target.copy_(full)
        del full


def _scatter_rows(full: torch.Tensor | None, local: torch.Tensor, shape: torch.Size, ctx: DistContext) -> None:
    """Rank 0's ``full`` tensor in ``torch.chunk`` row blocks (FSDP2's ``Shard(0)``), block r to rank r's ``local``."""
    rows = -(-shape[0] // ctx.world_size)  # ceil: scatter needs equal sizes, so the last blocks are padded
    out = torch.empty((rows, *shape[1:]), dtype=local.dtype, device=ctx.device)
    blocks = None
    if full is not None:
        blocks = [_pad_rows(b.to(local.dtype), rows) for b in torch.chunk(full, ctx.world_size, dim=0)]
        blocks += [torch.zeros_like(out)] * (ctx.world_size - len(blocks))  # fewer rows than ranks
    dist.scatter(out, blocks, src=0)
    local.copy_(out[: local.shape[0]])


def _pad_rows(block: torch.Tensor, rows: int) -> torch.Tensor:
    if block.shape[0] == rows:
        return block.contiguous()
    return torch.cat([block, block.new_zeros((rows - block.shape[0], *block.shape[1:]))])


def _match_files(path: str | Path, targets: list[tuple[list[str], torch.Tensor]]) -> tuple[list[TensorEntry], str | None]:
    """The file entry of each target (by any of its names), or the first mismatch as a message."""
    entries = index_weights(path)
    sources = []
    for names, target in targets:
        found = [entries[n] for n in names if n in entries]
        if not found:
            return [], (f"{path}: no tensor named {' or '.join(names)} in its safetensors files; "
                        "is it a checkpoint of this model architecture?")
        if found[0].shape != tuple(target.shape):
            return [], (f"{path}: {names[0]} has shape {found[0].shape} in the file, the model expects "
                        f"{tuple(target.shape)}; does config.json belong to these weights?")
        sources.append(found[0])
    return sources, None


def _is_persistent(model: nn.Module, name: str) -> bool:
    owner, _, leaf = name.rpartition(".")
    return leaf not in model.get_submodule(owner)._non_persistent_buffers_set


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


def load_full_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
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

    def generate(self, prompt_ids: list[list[int]], request: GenerationRequest) -> list[Rollout]:
        return self.backend.generate(prompt_ids, request)

    def update_weights(self, model: nn.Module) -> None:
        copy_full_weights(model, self.replica)
