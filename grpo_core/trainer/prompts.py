"""The prompt stream (a deterministic shuffle, resumable by position) and prompt encoding.

Position ``p`` of the stream is row ``permutation(seed, epoch = p // n)[p % n]``: an endless sequence
of epochs, each a fresh seeded shuffle, so a checkpoint only needs the position, and every rank and
every restart sees the same prompts. The position also names a prompt globally: completion seeds are
derived from ``(seed, step, position, j)``, never from a rank or a batch slot.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from grpo_core.rewards.base import is_conversational


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
            self._perms = {epoch: np.random.default_rng([self.seed, epoch]).permutation(self.num_rows)}
        return self._perms[epoch]


def completion_seed(seed: int, step: int, position: int, j: int) -> int:
    """The sampling seed of completion ``j`` of the prompt at stream ``position`` in ``step``."""
    return int(np.random.SeedSequence([seed, step, position, j]).generate_state(1, dtype=np.uint64)[0] >> 1)


def encode_prompt(tokenizer: Any, prompt: Any, max_prompt_length: int | None = None) -> list[int]:
    """Token ids of a prompt: chat messages (a list or tuple) through the chat template (with the
    generation prompt), plain text as is (no special tokens added, as TRL); left-truncated to
    ``max_prompt_length`` (None: not truncated)."""
    if isinstance(prompt, tuple):
        prompt = list(prompt)
    if is_conversational(prompt):
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    elif isinstance(prompt, str):
        text = prompt
    else:
        raise TypeError(f"a prompt must be a string or a list of chat messages, got {type(prompt).__name__}")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if max_prompt_length is None:
        return ids
    return ids[-max_prompt_length:]  # keep the end: the question and the generation prompt
