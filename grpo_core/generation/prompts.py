"""The prompt stream (a deterministic shuffle, resumable by position) and prompt encoding.

Position ``p`` of the stream is row ``permutation(seed, epoch = p // n)[p % n]``: an endless sequence
of epochs, each a fresh seeded shuffle, so a checkpoint only needs the position, and every rank and
every restart sees the same prompts. The position also names a prompt globally: completion seeds come from
``derive_seed(seed, step, position, j)`` (``grpo_core/seeds.py``), never from a rank or a batch slot.

``encode_prompts`` is the one place a prompt longer than ``max_prompt_length`` is handled: training,
evaluation and rejection sampling all call it, with the config's ``long_prompts`` policy (``truncate``:
keep the last ``max_prompt_length`` tokens, TRL's left truncation; ``drop``: skip the prompt), and report
its counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Sequence

import numpy as np

from grpo_core.rewards.base import is_conversational
from grpo_core.seeds import seeded_rng

LongPrompts = Literal["truncate", "drop"]


class PromptStream:
    def __init__(self, num_rows: int, seed: int) -> None:
        if num_rows <= 0:
            raise ValueError("no rows to stream")
        self.num_rows = num_rows
        self.seed = seed
        self._perms: dict[int, np.ndarray] = {}

    def rows_at(self, start: int, count: int) -> list[int]:
        """Row indices of stream positions ``start .. start + count - 1``."""
        return [int(self._permutation(p // self.num_rows)[p % self.num_rows]) for p in range(start, start + count)]

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            self._perms = {epoch: seeded_rng(self.seed, epoch).permutation(self.num_rows)}
        return self._perms[epoch]


def encode_prompt(tokenizer: Any, prompt: Any, max_prompt_length: int | None = None, *,
                  tools: list[dict[str, Any]] | None = None) -> list[int]:
    """Token ids of a prompt: chat messages (a list or tuple) through the chat template (with the
    generation prompt), plain text as is (no special tokens added, as TRL); left-truncated to
    ``max_prompt_length`` (None: not truncated). ``tools``: function schemas (``grpo_core.tools.ToolSet.schemas``)
    the chat template renders for the model (Qwen2.5's in its system prompt; a template that does not read them,
    the tiny model's, renders the prompt as without); a plain-text prompt carries none."""
    if isinstance(prompt, tuple):
        prompt = list(prompt)
    if is_conversational(prompt):
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False,
                                             **({"tools": tools} if tools else {}))
    elif isinstance(prompt, str):
        text = prompt
    else:
        raise TypeError(f"a prompt must be a string or a list of chat messages, got {type(prompt).__name__}")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if max_prompt_length is None:
        return ids
    return ids[-max_prompt_length:]  # keep the end: the question and the generation prompt


@dataclass
class EncodedPrompts:
    """The prompts ``encode_prompts`` kept, and what it did to the over-long ones."""

    ids: list[list[int]]  # [K] token ids of each kept prompt, in input order
    kept: list[int]  # [K] index of each kept prompt in the input
    truncated: list[bool]  # [K] whether that prompt was cut to max_prompt_length
    num_dropped: int  # prompts longer than max_prompt_length that were skipped (policy "drop")

    @property
    def num_truncated(self) -> int:
        return sum(self.truncated)

    def counts(self, prefix: str) -> dict[str, int]:
        """``{prefix}truncated`` and ``{prefix}dropped``, e.g. ``eval/prompts_`` -> ``eval/prompts_truncated``."""
        return {f"{prefix}truncated": self.num_truncated, f"{prefix}dropped": self.num_dropped}


def encode_prompts(tokenizer: Any, prompts: Sequence[Any], max_prompt_length: int | None,
                   long_prompts: LongPrompts = "truncate", *, tools: list[dict[str, Any]] | None = None
                   ) -> EncodedPrompts:
    """Encode ``prompts`` (``encode_prompt``, with the ``tools`` schemas when given) and apply the over-long
    prompt policy: ``truncate`` keeps the last ``max_prompt_length`` tokens (the question and the generation
    prompt), ``drop`` skips the prompt. ``max_prompt_length`` None: no limit."""
    if long_prompts not in ("truncate", "drop"):
        raise ValueError(f"long_prompts must be 'truncate' or 'drop', got {long_prompts!r}")
    out = EncodedPrompts([], [], [], 0)
    for i, prompt in enumerate(prompts):
        ids = encode_prompt(tokenizer, prompt, tools=tools)
        over = max_prompt_length is not None and len(ids) > max_prompt_length
        if over and long_prompts == "drop":
            out.num_dropped += 1
            continue
        out.ids.append(ids[-max_prompt_length:] if over else ids)  # type: ignore[index]
        out.kept.append(i)
        out.truncated.append(over)
    return out


def all_dropped_error(what: str, num_rows: int, max_prompt_length: int | None) -> ValueError:
    """The error when ``long_prompts: drop`` leaves nothing to work on."""
    return ValueError(
        f"{what}: all {num_rows} prompts exceeded max_prompt_length ({max_prompt_length} tokens) and were dropped "
        "(long_prompts: drop); raise max_prompt_length or set long_prompts: truncate"
    )
