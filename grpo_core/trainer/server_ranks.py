"""Several trainer processes on one generation server (``sampling.vllm_mode: server`` under torchrun).

TRL's layout ("one GPU generates, the others train"): only rank 0 talks to the server. Each step every rank hands
rank 0 its share of the prompts (with their per-completion seeds), rank 0 sends them in one request (the server's
engine batches them together) and gives each rank back its own completions; completions are seeded by position,
so they are the ones a single process would get. A weight push is rank 0's too: every rank walks the policy's
state (under FSDP gathering a full tensor is a collective each rank joins), rank 0 sends it; after each tensor rank 0
tells the others whether its push still stands, so a push that fails mid-way stops every rank at the same tensor.
The weight-sync check's answers (probe log-probs, digests) come from rank 0's client to every rank, so all ranks
check the same; under FSDP each rank hashes the full tensors (``weight_sync.policy_tensors`` gathers them).

A failure on rank 0 (server gone, timeout, an error answer) reaches every rank as the same ``VLLMServerError``
instead of leaving the others waiting in a collective.

Placement: a server the stage starts on ``vllm_server_devices`` shares nothing with the trainers when those GPUs
are left out of theirs (N trainer processes per node on GPUs 0..N-1); ``warn_server_placement`` says when a trainer
or a reward model without a ``device`` (the last visible GPU) would sit on the server's GPU.
"""

from __future__ import annotations

import logging
import os
import dataclasses
from typing import Any, Callable

import torch
import torch.distributed as dist

from grpo_core.config import GRPOConfig, JudgeSpec, RewardModelSpec
from grpo_core.generation.base import GenerationRequest, Rollout
from grpo_core.generation.server_client import ServerBackend, VLLMServerError, WeightPush
from grpo_core.generation.vllm_backend import full_state_items
from grpo_core.trainer.distributed import DistContext

logger = logging.getLogger(__name__)


class RankZeroServer:
    """The sampler of every trainer process under server mode with ``ctx.world_size`` > 1; ``client`` is rank 0's
    ``ServerBackend`` (None on the other ranks). Every method is collective: all ranks call it together.
    ``client`` on rank 0 is also what rank-0-only work (held-out evaluation during RL) samples from
    (``local_sampler``)."""

    batches_itself = True

    def __init__(self, connect: Callable[[], ServerBackend], ctx: DistContext) -> None:
        """``connect`` (called on rank 0 only): the client, connected to the server or having started it."""
        self.client: ServerBackend | None = None
        self.ctx = ctx

        def start() -> torch.dtype:
            self.client = connect()
            return self.client.dtype

        self.dtype = self._on_main(start, "connecting to the generation server")

    def generate(self, prompt_ids: list[list[int]], request: GenerationRequest) -> list[Rollout]:
        """This rank's ``len(prompt_ids) * n`` rollouts, from one request rank 0 makes for every rank's prompts."""
        request = request.seeded(len(prompt_ids))
        n = request.n
        parts: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(parts, (prompt_ids, request.seeds))  # rank order; small next to the completions

        def ask() -> list[list[Rollout]]:
            assert self.client is not None
            every = self.client.generate([p for ids, _ in parts for p in ids], dataclasses.replace(
                request, seeds=[s for _, rank_seeds in parts for s in rank_seeds]))
            out, start = [], 0
            for ids, _ in parts:  # back into each rank's share, in the order it asked
                out.append(every[start : start + len(ids) * n])
                start += len(ids) * n
            return out

        return self._on_main(ask, f"generating {sum(len(s) for _, s in parts)} completions", scatter=True)

    def update_weights(self, model: torch.nn.Module) -> None:
        """Rank 0 sends ``model``'s weights; every rank walks the state together (under FSDP each tensor's gather is
        a collective), and after each tensor all learn whether rank 0's push still stands, so a push that fails
        mid-way stops every rank at the same tensor: none is left in a gather rank 0 never joins."""
        doing = "pushing the policy's weights"
        push: WeightPush | None = None
        failure: Exception | None = None

        def start() -> None:
            nonlocal push
            assert self.client is not None
            push = self.client.start_push()

        self._on_main(start, doing)
        for name, tensor in full_state_items(model):  # FSDP: full_tensor() is a collective; other ranks drop it
            if push is not None:
                try:
                    push.add(name, tensor)
                except Exception as exc:  # every rank stops below, then all fail in _on_main
                    failure = exc
            if self._rank_zero_failed(failure is not None):
                break

        def finish() -> None:
            if failure is not None:
                raise failure
            assert push is not None
            push.finish()

        self._on_main(finish, doing)

    def reset_prefix_cache(self) -> None:
        self._on_main(lambda: self.client.reset_prefix_cache(), "resetting the prefix cache")

    def probe_logprobs(self, token_ids: list[int]) -> list[float]:
        return self._on_main(lambda: self.client.probe_logprobs(token_ids), "probing log-probs (weight-sync check)")

    def weights_digest(self, names: list[str]) -> dict[str, tuple[str, str]]:
        return self._on_main(lambda: self.client.weights_digest(names), "hashing weights (weight-sync check)")

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    def _rank_zero_failed(self, failed: bool) -> bool:
        """Rank 0's ``failed`` on every rank (one small broadcast)."""
        flag = torch.tensor([int(failed)], device=self.ctx.device)
        dist.broadcast(flag, src=0)
        return bool(flag.item())

    def _on_main(self, call: Callable[[], Any] | None, doing: str, *, scatter: bool = False) -> Any:
        """``call()`` on rank 0, its result on every rank (``scatter``: element ``r`` of it on rank ``r``); an
        exception on rank 0 raised there as it is and on every other rank as ``VLLMServerError``."""
        outcome: Any = None
        failure: Exception | None = None
        if self.ctx.is_main:
            assert call is not None
            try:
                outcome = ("ok", call())
            except Exception as exc:  # every rank must leave the collective below, then fail the same way
                failure, outcome = exc, ("error", f"{type(exc).__name__}: {exc}")
        if scatter:
            mine: list[Any] = [None]
            items = ([(outcome[0], part) for part in outcome[1]] if outcome[0] == "ok"
                     else [outcome] * self.ctx.world_size) if self.ctx.is_main else None
            dist.scatter_object_list(mine, items, src=0)
            outcome = mine[0]
        else:
            box = [outcome]
            dist.broadcast_object_list(box, src=0)
            outcome = box[0]
        status, value = outcome
        if status == "ok":
            return value
        if failure is not None:
            raise failure
        raise VLLMServerError(f"rank 0 failed while {doing} for every trainer process: {value}")


def local_sampler(backend: Any) -> Any:
    """What rank 0 alone may sample from: the server's client under ``RankZeroServer`` (whose ``generate`` every
    rank must call together), else ``backend`` itself."""
    return backend.client if isinstance(backend, RankZeroServer) else backend


# ---------------------------------------------------------------- where a stage-started server sits among the GPUs

def visible_gpus() -> list[int]:
    """The physical GPU ids this process may use, in CUDA's order (``CUDA_VISIBLE_DEVICES``, else every GPU the
    driver reports)."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is not None:
        return [int(d) for d in raw.split(",") if d.strip().isdigit()]
    return list(range(torch.cuda.device_count()))


def local_world_size(ctx: DistContext) -> int:
    """Trainer processes on this node (torchrun's ``LOCAL_WORLD_SIZE``)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world_size))


def server_devices(config: GRPOConfig, ctx: DistContext) -> set[int]:
    """The physical GPU ids of the generation server this stage starts (``GRPOSampling.started_server_gpus``);
    empty on CPU."""
    return set(config.sampling.started_server_gpus) if ctx.device.type == "cuda" else set()


def server_gpus_shared(config: GRPOConfig, ctx: DistContext) -> list[int]:
    """The server's GPUs that this node's trainer processes also use (local rank r: the r-th visible GPU)."""
    return sorted(set(visible_gpus()[: local_world_size(ctx)]) & server_devices(config, ctx))


def scorers_on_server_gpu(config: GRPOConfig, ctx: DistContext) -> list[str]:
    """The reward models and judges (by name) that would load onto the server's GPU: those without a ``device`` go
    to the last visible GPU (``rewards.reward_model.resolve_device``)."""
    gpus = visible_gpus()
    if not gpus or gpus[-1] not in server_devices(config, ctx):
        return []
    entries = [e for s in config.sources for e in s.reward_funcs] if config.sources else list(config.reward_funcs or [])
    return [e.name for e in entries if isinstance(e, (RewardModelSpec, JudgeSpec)) and e.url is None
            and e.device is None]


def warn_server_placement(config: GRPOConfig, ctx: DistContext) -> None:
    """Warn when a stage-started server's GPUs (``vllm_server_devices``) are also a trainer's or the default reward
    models' (the last visible GPU): it runs only where memory holds both."""
    if shared := server_gpus_shared(config, ctx):
        logger.warning(
            "sampling.vllm_server_devices %r gives the generation server GPU %s, which this node's trainer processes "
            "also use (%d, on GPUs %s): both must fit in its memory. For one GPU that generates and others that "
            "train, start one trainer process fewer per node (the work pool's nproc_per_node)",
            config.sampling.vllm_server_devices, ", ".join(map(str, shared)), local_world_size(ctx),
            ", ".join(map(str, visible_gpus()[: local_world_size(ctx)])))
    if scorers := scorers_on_server_gpu(config, ctx):
        logger.warning(
            "reward scorers %s would load onto the last visible GPU (%d), which sampling.vllm_server_devices gives the "
            "generation server; set device (e.g. device: cuda:%d) in their entries", ", ".join(scorers), visible_gpus()[-1],
            local_world_size(ctx) - 1)
