"""Process-group plumbing for data-parallel training (torchrun), and the single-process no-op case.

Work split in GRPO: a step's prompts are sharded over ranks whole (a group never straddles two ranks),
each rank generates and scores its groups, and ``gather_objects`` gives every rank the whole step's
rollouts, so advantages, dynamic sampling and metrics are computed identically everywhere. Training
then shards the sequences again (SFT shards a step's rows the same way); gradients are summed with ``all_reduce_gradients`` (or, with
``distributed_strategy='fsdp'``, reduce-scattered by FSDP2: see ``trainer/fsdp.py``).

Departure from the usual DDP wrapper: ``grpo_core.trainer.logprobs.compute_token_logps`` runs the decoder and
the (chunked) LM head as separate calls, which a ``DistributedDataParallel`` wrapper never sees, so the
gradient sync is done explicitly after accumulation: one flattened SUM all-reduce per step (DDP
averages; with the loss already divided by global totals a sum gives the full-batch gradient).
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def process_group_backend(device: torch.device) -> str:
    """``init_process_group``'s backend: gloo on CPU; on CUDA, NCCL for CUDA tensors and gloo beside it for CPU ones.

    CPU tensors meet collectives on GPU machines too: ``fsdp_cpu_offload`` keeps gradient shards as CPU DTensors,
    so gradient clipping all-reduces their norms on the CPU, and checkpoint gathers and DCP's plan exchange run on
    CPU tensors; an NCCL-only group fails there (pytorch#148532; torchtune#1977 adds the gloo group the same way).
    """
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def init_distributed() -> DistContext:
    """Join the torchrun process group when ``WORLD_SIZE`` > 1 (``process_group_backend``: gloo on CPU; NCCL with a
    gloo group beside it on CUDA)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend=process_group_backend(device))
        atexit.register(_destroy_process_group)  # at exit, a live gloo group can abort the process (SIGABRT)
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def _destroy_process_group() -> None:
    """Tear the default group down before the interpreter does: left to exit, gloo's threads can be destroyed
    while joinable (``terminate called without an active exception``), failing a rank that finished."""
    if dist.is_initialized():
        dist.destroy_process_group()


def shard(items: list[Any], ctx: DistContext) -> list[Any]:
    """This rank's contiguous share of ``items`` (sizes differ by at most one)."""
    n, w = len(items), ctx.world_size
    start = ctx.rank * (n // w) + min(ctx.rank, n % w)
    return items[start : start + n // w + (1 if ctx.rank < n % w else 0)]


def gather_objects(local: list[Any], ctx: DistContext) -> list[Any]:
    """Concatenate every rank's list in rank order (the inverse of ``shard``)."""
    if not ctx.enabled:
        return list(local)
    parts: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(parts, local)
    return [x for part in parts for x in part]


def all_reduce_gradients(model: torch.nn.Module, ctx: DistContext) -> None:
    """Sum the gradients of every rank in place (one flattened buffer)."""
    if not ctx.enabled:
        return
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:  # a rank that saw no sequence still joins the collective
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])  # [num_params]
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
        offset += p.numel()


def micro_batches(idx: list[int], size: int, lockstep: DistContext | None = None) -> list[list[int]]:
    """``idx`` in slices of ``size``; with a ``lockstep`` context, padded with empty slices to the most any rank has.

    Sharded weights (FSDP) make every forward a collective, so each rank must run as many as the others.
    """
    return pad_lockstep([idx[start : start + size] for start in range(0, len(idx), size)], lockstep)


def pad_lockstep(batches: list[list[int]], lockstep: DistContext | None) -> list[list[int]]:
    """``batches`` with empty micro-batches appended up to the most any rank has (FSDP: every forward is a collective)."""
    if lockstep is not None and lockstep.enabled:
        count = torch.tensor([len(batches)], device=lockstep.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        batches = batches + [[] for _ in range(int(count) - len(batches))]
    return batches


def barrier(ctx: DistContext) -> None:
    if ctx.enabled:
        dist.barrier()
