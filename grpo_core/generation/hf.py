"""Rollouts with plain transformers: batched sampling with a KV cache on the trainer's own module.

The fallback backend where vLLM is absent. Prompts are left-padded and prefilled once each; the
cache is then repeated ``n`` times (``batch_repeat_interleave``) so the G completions of a prompt
share one prefill. Rows that emit EOS (or one of the request's ``stop_token_ids``, kept in the completion and
its text) leave the batch (``batch_select_indices``) once they are a quarter of it, so a step costs the live
rows (plus a few finished ones) only.

Seeds: each completion owns a ``torch.Generator`` seeded with its seed and draws its
``max_tokens`` uniforms up front; a token is picked by inverse CDF over the filtered distribution
in vocabulary order. A completion's tokens therefore depend on its seed and the weights only, not
on batch composition, row order or process count (up to float rounding of the logits).
Greedy mode takes the argmax, which matches ``generate(do_sample=False)``.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from grpo_core.generation.base import GenerationRequest, Rollout, merge_eos_ids


class HFBackend:
    """Sample from ``model`` (a transformers causal LM) with ``tokenizer`` for pad/EOS ids and text."""

    batches_itself = False  # one padded batch per call: its memory grows with the batch, so callers chunk

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        autocast_dtype: torch.dtype | None = None,
        eos_token_ids: list[int] | None = None,
    ) -> None:
        self.model = _unwrap(model)
        self.tokenizer = tokenizer
        self.autocast_dtype = autocast_dtype
        self.eos_token_ids = eos_token_ids if eos_token_ids is not None else _eos_ids(self.model, tokenizer)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = pad if pad is not None else self.eos_token_ids[0]

    def update_weights(self, model: torch.nn.Module) -> None:
        # The backend samples with the trainer's module itself: nothing to copy.
        self.model = _unwrap(model)

    def generate(self, prompt_ids: list[list[int]], request: GenerationRequest) -> list[Rollout]:
        # request.logprobs is moot: the log-probs come with the scores this sampler computes anyway
        r = request.seeded(len(prompt_ids))
        n = r.n
        if not prompt_ids:
            return []
        model = self.model
        was_training = model.training
        model.eval()  # no dropout, and gradient checkpointing would switch the cache off
        device = next(model.parameters()).device
        autocast = (
            torch.autocast(device.type, dtype=self.autocast_dtype) if self.autocast_dtype else contextlib.nullcontext()
        )
        try:
            with torch.inference_mode(), autocast:
                tokens, logps = self._sample(
                    prompt_ids, n, r.max_tokens, r.temperature, r.top_p, r.top_k, r.seeds, r.greedy, device,
                    stop_ids=self.eos_token_ids + [t for t in r.stop_token_ids if t not in self.eos_token_ids],
                )
        finally:
            model.train(was_training)
        eos, stops = set(self.eos_token_ids), set(r.stop_token_ids)
        rollouts = []
        for i, (ids, lps) in enumerate(zip(tokens, logps)):
            on_eos = bool(ids) and ids[-1] in eos
            text_ids = ids[:-1] if on_eos else ids  # a stop token (``</tool_call>``) stays in the text
            text = self.tokenizer.decode(text_ids, skip_special_tokens=True) if self.tokenizer is not None else ""
            stopped = on_eos or (bool(ids) and ids[-1] in stops)
            rollouts.append(Rollout(list(prompt_ids[i // n]), ids, lps, truncated=not stopped, text=text))
        return rollouts

    def _sample(
        self,
        prompt_ids: list[list[int]],
        n: int,
        max_tokens: int,
        temperature: float,
        top_p: float,
        top_k: int,
        seeds: list[int],
        greedy: bool,
        device: torch.device,
        stop_ids: list[int],
    ) -> tuple[list[list[int]], list[list[float]]]:
        num_prompts, length = len(prompt_ids), max(len(p) for p in prompt_ids)
        input_ids = torch.full((num_prompts, length), self.pad_token_id, dtype=torch.long)  # [P, L]
        attention_mask = torch.zeros((num_prompts, length), dtype=torch.long)  # [P, L]
        for i, ids in enumerate(prompt_ids):
            if ids:
                input_ids[i, length - len(ids) :] = torch.tensor(ids)
                attention_mask[i, length - len(ids) :] = 1
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        # Positions count real tokens only, as generate() does for left padding.
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [P, L]
        cache = DynamicCache()  # layers that grow in place: no copy of the whole cache per token
        cache.layer_class_to_replicate = functools.partial(PreallocatedLayer, room=max_tokens)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        cache = out.past_key_values
        logits = out.logits[:, -1].float()  # [P, V]
        next_pos = position_ids[:, -1:] + 1  # [P, 1]
        if n > 1:  # one prefill per prompt, then n copies of its cache
            cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, 0)  # [N, V]
            attention_mask = attention_mask.repeat_interleave(n, 0)  # [N, L]
            next_pos = next_pos.repeat_interleave(n, 0)  # [N, 1]
        num = num_prompts * n
        uniforms = None
        if not greedy:  # all of a completion's randomness, drawn from its own generator
            uniforms = torch.stack(
                [torch.rand(max_tokens, generator=torch.Generator().manual_seed(int(s))) for s in seeds]
            ).to(device)  # [N, max_tokens]
        stop = torch.tensor(stop_ids, device=device)  # EOS and the request's stop tokens
        active = torch.arange(num, device=device)  # row -> completion index
        finished = torch.zeros(num, dtype=torch.bool, device=device)  # rows kept in the batch after their stop
        tokens: list[list[int]] = [[] for _ in range(num)]
        logps: list[list[float]] = [[] for _ in range(num)]
        for t in range(max_tokens):
            scores = logits / temperature  # [A, V]
            logp_all = torch.log_softmax(scores, -1)  # [A, V] reported log-probs: before top-k/top-p
            if greedy:
                tok = logits.argmax(-1)  # [A]
            else:
                probs = torch.softmax(filter_logits(scores, top_k, top_p), -1)  # [A, V]
                cdf = probs.cumsum(-1)  # [A, V]
                target = uniforms[active, t : t + 1] * cdf[:, -1:]  # [A, 1]
                tok = torch.searchsorted(cdf, target, right=True)[:, 0].clamp(max=cdf.shape[-1] - 1)  # [A]
            tok_logp = logp_all.gather(-1, tok[:, None])[:, 0]  # [A]
            for c, tk, lp, gone in zip(active.tolist(), tok.tolist(), tok_logp.tolist(), finished.tolist()):
                if not gone:
                    tokens[c].append(tk)
                    logps[c].append(lp)
            finished = finished | torch.isin(tok, stop)
            if t == max_tokens - 1 or bool(finished.all()):
                break
            # Finished rows leave the batch and the cache once they are a quarter of it: compacting copies
            # the whole cache, a finished row costs one row of compute per token until then.
            if 4 * int(finished.sum()) >= len(active):
                idx = (~finished).nonzero()[:, 0]
                cache.batch_select_indices(idx)
                attention_mask, next_pos, tok = attention_mask[idx], next_pos[idx], tok[idx]
                active, finished = active[idx], finished[idx]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(active), 1))], -1)  # [A, L+t+1]
            out = self.model(
                input_ids=tok[:, None],
                attention_mask=attention_mask,
                position_ids=next_pos,
                past_key_values=cache,
                use_cache=True,
            )
            cache = out.past_key_values
            logits = out.logits[:, -1].float()  # [A, V]
            next_pos = next_pos + 1
        return tokens, logps


class PreallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` that writes new keys/values into a buffer with ``room`` spare positions.

    ``DynamicLayer`` concatenates (copies the whole cache) on every token: at 64 rows x 40 positions the
    profiler put ~40% of a rollout's CPU time in those copies (a rollout got ~10% faster without them).
    Here a token costs one slice write; ``keys``/``values`` are
    views of the filled part, so everything that reads them (attention, masks, ``get_seq_length``) is unchanged.
    Beyond the room the buffer doubles.
    """

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room
        self._k: torch.Tensor | None = None  # [B, H, capacity, D]
        self._v: torch.Tensor | None = None
        self._len = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        if self._k is None or self._len + new > self._k.shape[-2]:
            self._grow(max(self._len + new + self.room, 2 * self._len), key_states, value_states)
        self._k[..., self._len : self._len + new, :] = key_states
        self._v[..., self._len : self._len + new, :] = value_states
        self._len += new
        self.keys, self.values = self._k[..., : self._len, :], self._v[..., : self._len, :]
        return self.keys, self.values

    def _grow(self, capacity: int, like: torch.Tensor, like_v: torch.Tensor) -> None:
        k = like.new_empty((*like.shape[:-2], capacity, like.shape[-1]))  # [B, H, capacity, D]
        v = like_v.new_empty((*like_v.shape[:-2], capacity, like_v.shape[-1]))
        if self._k is not None:
            k[..., : self._len, :] = self._k[..., : self._len, :]
            v[..., : self._len, :] = self._v[..., : self._len, :]
        self._k, self._v = k, v

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self._len:
            self._k = self._k.repeat_interleave(repeats, dim=0)
            self._v = self._v.repeat_interleave(repeats, dim=0)
            self.keys, self.values = self._k[..., : self._len, :], self._v[..., : self._len, :]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self._len:
            self._k, self._v = self._k[indices, ...], self._v[indices, ...]
            self.keys, self.values = self._k[..., : self._len, :], self._v[..., : self._len, :]


def filter_logits(scores: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k and outside the top-p nucleus to -inf (as transformers' warpers)."""
    vocab = scores.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(scores, top_k, dim=-1).values[:, -1:]  # [A, 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)  # [A, V]
        cum = sorted_scores.softmax(-1).cumsum(-1)  # [A, V]
        drop_sorted = cum <= 1 - top_p
        drop_sorted[:, -1] = False  # always keep the most likely token
        drop = drop_sorted.scatter(1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if hasattr(model, "module") and isinstance(model.module, torch.nn.Module) else model


def _eos_ids(model: torch.nn.Module, tokenizer: Any) -> list[int]:
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return merge_eos_ids(gen_eos, tokenizer, type(model).__name__)
