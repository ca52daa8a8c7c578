"""The process group's backend: gloo on CPU; on CUDA NCCL with a gloo group beside it, so the CPU tensors of
``fsdp_cpu_offload`` (gradient-norm all-reduce in clipping, checkpoint gathers) have a backend that takes them.

A CPU machine cannot show the NCCL-only failure itself (its 2-rank runs are gloo throughout), so this checks the
string ``init_distributed`` hands ``init_process_group`` with CUDA faked."""

from __future__ import annotations

import torch
import torch.distributed as dist

from grpo_core.trainer import distributed
from grpo_core.trainer.distributed import init_distributed, process_group_backend


def test_backend_string_per_device():
    assert process_group_backend(torch.device("cpu")) == "gloo"
    assert process_group_backend(torch.device("cuda", 0)) == "cpu:gloo,cuda:nccl"


def test_init_distributed_on_cuda_adds_gloo_beside_nccl(monkeypatch):
    calls = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: calls.append(kwargs))
    ctx = init_distributed()
    assert ctx.device == torch.device("cuda", 1) and ctx.world_size == 2
    assert calls == [{"backend": "cpu:gloo,cuda:nccl"}]
    assert distributed.dist is dist  # the module calls the patched function, not a copy
