"""Per-token log-probabilities (and entropies) of sampled tokens without the full ``[B, T, V]`` log-softmax.

GRPO needs ``log pi(o_t | q, o_<t)`` for every completion token under three models (policy, old, ref).
The naive ``model(...).logits.log_softmax(-1).gather(...)`` holds ``[B, T, V]`` logits plus an fp32
log-softmax of the same size: for a Qwen vocabulary (V = 151,936) and 4 x 1024 tokens that is 2.5 GB
each. Here the transformer body runs once to give hidden states ``[B, L, H]``; ``lm_head`` is applied to
``chunk_size`` rows at a time, each chunk's logits become fp32 log-probs via ``logsumexp`` + ``gather``
and are dropped before the next chunk. With autograd on, each chunk runs under
``torch.utils.checkpoint`` so backward recomputes one chunk's logits at a time instead of keeping them all
(``checkpoint_logits``; by default only when all the step's logits would exceed ``CHECKPOINT_MIN_LOGITS``
elements: a small vocabulary gains nothing from the recompute). Entropies are a metric (no loss term
uses them): computed without autograd.

Supports causal LMs whose logits are ``lm_head(decoder(...).last_hidden_state)`` (Llama, Qwen2, Mistral,
...; tied embeddings included, since ``get_output_embeddings()`` is the tied module). Models with logit
soft-capping or scaling (Gemma 2, Cohere) would need that step added to ``_chunk_logps``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

if TYPE_CHECKING:
    from grpo_core.trainer.packing import PackedRows

CHECKPOINT_MIN_LOGITS = 2**22  # [B*T, V] elements (16 MiB in fp32) under which logits are simply kept for backward


def _chunk_logps(
    hidden: Tensor, targets: Tensor, lm_head: nn.Module, temperature: float, compute_entropy: bool
) -> tuple[Tensor, Tensor]:
    logits = lm_head(hidden)  # [n, V], the only vocabulary-sized tensors live here
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16/fp16 -> fp32, fp64 stays
    if temperature != 1.0:
        logits.div_(temperature)  # in place: a second [n, V] copy would double the chunk's peak
    lse = torch.logsumexp(logits, dim=-1)  # [n]
    logps = logits.gather(-1, targets[:, None]).squeeze(-1) - lse  # [n]
    if not compute_entropy:
        return logps, logps.new_zeros(())
    with torch.no_grad():  # a metric: no loss term uses it, so autograd keeps nothing for it
        z = logits.detach()
        # H = -sum p log p = lse - sum p z, with p = softmax(z)
        entropy = lse.detach() - (torch.softmax(z, dim=-1) * z).sum(-1)  # [n]
    return logps, entropy


def compute_token_logps(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    logits_to_keep: int,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    compute_entropy: bool = False,
    checkpoint_logits: bool | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs ``[B, T]`` (fp32) of the last ``T = logits_to_keep`` tokens of ``input_ids [B, L]``, and their entropies.

    Logits are divided by ``temperature`` (the sampling temperature, as TRL) before the softmax. Left or
    right padding is fine: ``attention_mask`` goes to the model, padded positions get meaningless values to mask.
    """
    # Off-by-one: the hidden state at position t predicts token t+1, so the T completion tokens
    # input_ids[:, L-T:] are scored by positions L-T-1 .. L-2. The last token predicts beyond the input: it is
    # not fed at all (one position less of transformer work).
    body = model.get_decoder()(input_ids=input_ids[:, :-1], attention_mask=attention_mask[:, :-1])
    hidden = body.last_hidden_state[:, -logits_to_keep:, :]  # [B, T, H]
    return _score(
        model, hidden, input_ids[:, -logits_to_keep:], temperature, chunk_size, compute_entropy, checkpoint_logits
    )


def compute_completion_logps(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    prompt_index: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    compute_entropy: bool = False,
    checkpoint_logits: bool | None = None,
) -> tuple[Tensor, Tensor | None]:
    """``compute_token_logps`` for completions that share prompts: each prompt runs through the model once.

    ``prompt_ids``/``prompt_mask`` ``[P, Lp]`` (left-padded) are the distinct prompts, ``prompt_index [B]`` names
    the prompt of each completion row of ``completion_ids``/``completion_mask`` ``[B, T]`` (right-padded). GRPO's
    G completions of one prompt would otherwise run the same prompt positions G times, forward and backward;
    here the prompts' keys/values (with their autograd history) are gathered per row and the completions attend
    to them as a cache, so gradients from all G rows flow back into one prompt pass. Same values as
    ``compute_token_logps`` on ``cat([prompt, completion])`` (the same positions and masks), up to float rounding.
    Needs a model that takes ``past_key_values`` in training mode (not with gradient checkpointing).
    """
    from transformers import DynamicCache

    decoder = model.get_decoder()
    cache = DynamicCache(config=model.config)
    prompt_out = decoder(input_ids=prompt_ids, attention_mask=prompt_mask, past_key_values=cache, use_cache=True)
    for layer in cache.layers:  # [P, h, Lp, d] -> [B, h, Lp, d], differentiable
        layer.keys, layer.values = layer.keys.index_select(0, prompt_index), layer.values.index_select(0, prompt_index)
    first = prompt_out.last_hidden_state[:, -1:, :].index_select(0, prompt_index)  # [B, 1, H] predicts token 0
    lp, t = prompt_ids.shape[1], completion_ids.shape[1]
    if t > 1:
        mask = torch.cat([prompt_mask.index_select(0, prompt_index), completion_mask[:, :-1]], 1)  # [B, Lp+T-1]
        positions = torch.arange(lp, lp + t - 1, device=completion_ids.device).expand(completion_ids.shape[0], -1)
        rest = decoder(
            input_ids=completion_ids[:, :-1], attention_mask=mask, position_ids=positions,
            past_key_values=cache, use_cache=True,
        ).last_hidden_state  # [B, T-1, H]
        hidden = torch.cat([first, rest], 1)  # [B, T, H]
    else:
        hidden = first
    return _score(model, hidden, completion_ids, temperature, chunk_size, compute_entropy, checkpoint_logits)


def compute_packed_logps(
    model: nn.Module,
    packed: "PackedRows",
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    compute_entropy: bool = False,
    checkpoint_logits: bool | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropies) ``[K]`` of the scored tokens of a packed sequence (``trainer.packing.pack_rows``,
    on the model's device).

    One forward over ``[1, S]`` with ``position_ids`` restarting per row and no attention mask (attention kept
    within each row, see ``trainer/packing.py``); only the ``K`` scored positions go through the LM head.
    """
    # heavy import (transformers' attention registries): only packed batches need it
    from grpo_core.trainer.packing import enable_padding_free

    enable_padding_free(model)
    body = model.get_decoder()(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False)
    hidden = body.last_hidden_state[0].index_select(0, packed.score_index)  # [K, H]
    return _score_flat(model, hidden, packed.targets, temperature, chunk_size, compute_entropy, checkpoint_logits)


def _score(
    model: nn.Module, hidden: Tensor, targets: Tensor, temperature: float, chunk_size: int, compute_entropy: bool,
    checkpoint_logits: bool | None,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropies) ``[B, T]`` of ``targets [B, T]`` from the hidden states ``[B, T, H]`` predicting them."""
    B, T, H = hidden.shape
    logps, entropy = _score_flat(model, hidden.reshape(B * T, H), targets.reshape(B * T), temperature, chunk_size,
                                 compute_entropy, checkpoint_logits)  # [B*T]
    return logps.view(B, T), entropy.view(B, T) if entropy is not None else None


def _score_flat(
    model: nn.Module, flat_hidden: Tensor, flat_targets: Tensor, temperature: float, chunk_size: int,
    compute_entropy: bool, checkpoint_logits: bool | None,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropies) ``[N]`` of ``flat_targets [N]`` from the hidden states ``[N, H]`` predicting them."""
    n = flat_hidden.shape[0]
    lm_head = model.get_output_embeddings()  # the tied embedding module when tie_word_embeddings

    needs_grad = torch.is_grad_enabled() and (
        flat_hidden.requires_grad or any(p.requires_grad for p in lm_head.parameters())
    )
    if checkpoint_logits is None:  # only where keeping every chunk's logits for backward would cost real memory
        checkpoint_logits = n * lm_head.weight.shape[0] > CHECKPOINT_MIN_LOGITS  # weight [V, H]
    logps, entropies = [], []
    for start in range(0, n, chunk_size):
        rows = slice(start, start + chunk_size)
        args = (flat_hidden[rows], flat_targets[rows], lm_head, temperature, compute_entropy)
        if needs_grad and checkpoint_logits:
            # backward recomputes this chunk's logits instead of storing [n, V] activations for every chunk
            chunk_logps, chunk_entropy = checkpoint(_chunk_logps, *args, use_reentrant=False)
        else:
            chunk_logps, chunk_entropy = _chunk_logps(*args)
        logps.append(chunk_logps)  # [n]
        entropies.append(chunk_entropy)  # [n] or a placeholder scalar
    if not logps:  # nothing scored (an empty packed micro-batch)
        empty = flat_hidden.new_zeros((0,), dtype=torch.float32) + flat_hidden.sum() * 0  # keeps the graph for backward
        return empty, empty.detach() if compute_entropy else None
    per_token_logps = torch.cat(logps)  # [N]
    entropy = torch.cat(entropies) if compute_entropy else None  # [N]
    return per_token_logps, entropy
