"""The generation interface both backends implement: ``Rollout`` (what a backend returns) and
``GenerationBackend``, with the helpers the backends share (per-completion seeds, EOS ids)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass
class Rollout:
    prompt_ids: list[int]
    completion_ids: list[int]  # includes the EOS token when the completion stopped on one
    logprobs: list[float] | None  # one per completion token, or None when the backend has none
    truncated: bool  # hit max_tokens without EOS
    text: str  # completion decoded without the EOS token
    ref_logprobs: list[float] | None = None  # the reference model's, when the sampler computed them (async GRPO)


class GenerationBackend(Protocol):
    """``batches_itself`` (optional, default False): the backend schedules its own batches (vLLM), so
    evaluation and rejection sampling hand it every prompt in one call instead of fixed batches."""

    def generate(
        self,
        prompt_ids: list[list[int]],
        *,
        n: int,
        max_tokens: int,
        temperature: float,
        top_p: float,
        top_k: int,
        seeds: list[int] | None,
        greedy: bool = False,
        logprobs: bool = True,
    ) -> list[Rollout]:
        """``len(prompt_ids) * n`` rollouts, the n completions of a prompt contiguous; one seed each. ``logprobs``:
        also the sampled tokens' log-probs (GRPO's importance-sampling correction needs them; evaluation and
        rejection sampling do not, and on vLLM they cost ~15-20% of the throughput)."""
        ...

    def update_weights(self, model: torch.nn.Module) -> None:
        """Make the next ``generate`` use ``model``'s current weights."""
        ...


def release_memory(backend: Any) -> None:
    """Let a backend that can (vLLM under sleep mode) free its device memory while the trainer runs."""
    sleep = getattr(backend, "sleep", None)
    if sleep is not None:
        sleep()


def resolve_seeds(seeds: list[int] | None, num_prompts: int, n: int) -> list[int]:
    """One seed per completion: the caller's (checked), or drawn from torch's RNG (the trainer's stream)."""
    num = num_prompts * n
    if seeds is None:
        return torch.randint(0, 2**62, (num,)).tolist()
    if len(seeds) != num:
        raise ValueError(f"seeds has {len(seeds)} entries; need one per completion ({num_prompts} x {n})")
    return list(seeds)


def merge_eos_ids(generation_eos: Any, tokenizer: Any, where: str) -> list[int]:
    """The generation config's EOS id(s), then the tokenizer's, without repeats; ``where`` names the model
    in the error when there is none."""
    ids: list[int] = []
    for value in (generation_eos, getattr(tokenizer, "eos_token_id", None)):
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is not None and int(v) not in ids:
                ids.append(int(v))
    if not ids:
        raise ValueError(f"no EOS token id for {where}: set tokenizer.eos_token_id or generation_config.eos_token_id")
    return ids


def tensor_digest(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's bytes (contiguous, on the CPU): how a sampler reports the weights it holds (the LoRA
    sync check, grpo_core/trainer/weight_sync.py)."""
    data = tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
    return hashlib.sha256(data.tobytes()).hexdigest()
