"""The generation interface every backend implements: ``GenerationRequest`` (what a backend is asked),
``Rollout`` (what it returns) and ``GenerationBackend``, with the helpers the backends share (per-completion seeds,
EOS ids)."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.distributed.tensor import DTensor


@dataclass
class Rollout:
    prompt_ids: list[int]
    completion_ids: list[int]  # includes the EOS token when the completion stopped on one
    logprobs: list[float] | None  # one per completion token, or None when the backend has none
    truncated: bool  # hit max_tokens without EOS
    text: str  # completion decoded without the EOS token
    ref_logprobs: list[float] | None = None  # the reference model's, when the sampler computed them (async GRPO)
    # one per completion token: 1 on tokens a tool turn appended (never sampled by the model; masked out of the loss),
    # None: every token is the model's (generation/trajectory.py builds multi-turn rollouts)
    tool_mask: list[int] | None = None


@dataclass(frozen=True)
class GenerationRequest:
    """What a backend's ``generate`` is asked besides the prompts, one type for every backend (vLLM,
    transformers, the sampler process, the generation server and its clients): ``n`` completions per prompt of at
    most ``max_tokens`` tokens, sampled at ``temperature`` / ``top_p`` / ``top_k`` (``top_k`` 0: off) or, with
    ``greedy``, by argmax (the sampling fields ignored); one seed per completion (``seeds``: ``len(prompts) * n`` of
    them; None: drawn from torch's RNG, ``resolve_seeds``); ``logprobs``: also the sampled tokens' log-probs (GRPO's
    importance-sampling correction needs them; evaluation and rejection sampling do not, and on vLLM they cost
    ~15-20% of the throughput); ``stop_token_ids``: token ids that end a completion as EOS does (a multi-turn
    rollout's ``</tool_call>``), kept in ``completion_ids`` and in the text, the completion not truncated."""

    n: int
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seeds: list[int] | None = None
    greedy: bool = False
    logprobs: bool = True
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:  # a JSON list (the generation server's body) becomes the tuple
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    def seeded(self, num_prompts: int) -> GenerationRequest:
        """This request with one seed per completion of ``num_prompts`` prompts: its own (checked) or drawn."""
        return dataclasses.replace(self, seeds=resolve_seeds(self.seeds, num_prompts, self.n))

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON values (the generation server's request body, less the prompts)."""
        return {**dataclasses.asdict(self), "stop_token_ids": list(self.stop_token_ids)}


class GenerationBackend(Protocol):
    """``batches_itself`` (optional, default False): the backend schedules its own batches (vLLM), so
    evaluation and rejection sampling hand it every prompt in one call instead of fixed batches."""

    def generate(self, prompt_ids: list[list[int]], request: GenerationRequest) -> list[Rollout]:
        """``len(prompt_ids) * request.n`` rollouts, the n completions of a prompt contiguous; one seed each."""
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
    sync check, grpo_core/trainer/weight_sync.py). A sharded DTensor is refused: hash the gathered tensor."""
    if isinstance(tensor, DTensor):
        raise TypeError(f"tensor_digest of a sharded DTensor {tuple(tensor.shape)} would hash one rank's shard; gather "
                        "it first on every rank (tensor.full_tensor(), a collective) and hash the full tensor")
    data = tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
    return hashlib.sha256(data.tobytes()).hexdigest()
