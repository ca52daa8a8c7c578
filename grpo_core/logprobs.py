"""Per-token log-probabilities (and entropies) of sampled tokens without the full ``[B, T, V]`` log-softmax.

GRPO needs ``log pi(o_t | q, o_<t)`` for every completion token under three models (policy, old, ref).
The naive ``model(...).logits.log_softmax(-1).gather(...)`` holds ``[B, T, V]`` logits plus an fp32
log-softmax of the same size: for a Qwen vocabulary (V = 151,936) and 4 x 1024 tokens that is 2.5 GB
each. Here the transformer body runs once to give hidden states ``[B, L, H]``; ``lm_head`` is applied to
``chunk_size`` rows at a time, each chunk's logits become fp32 log-probs via ``logsumexp`` + ``gather``
and are dropped before the next chunk. With autograd on, each chunk runs under
``torch.utils.checkpoint`` so backward recomputes one chunk's logits at a time instead of keeping them all.

Supports causal LMs whose logits are ``lm_head(decoder(...).last_hidden_state)`` (Llama, Qwen2, Mistral,
...; tied embeddings included, since ``get_output_embeddings()`` is the tied module). Models with logit
soft-capping or scaling (Gemma 2, Cohere) would need that step added to ``_chunk_logps``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint


def selective_log_softmax(logits: Tensor, index: Tensor, chunk_size: int = 1024) -> Tensor:
    """``log_softmax(logits, -1).gather(-1, index)`` in fp32, ``chunk_size`` rows at a time: ``[..., V], [...] -> [...]``."""
    flat = logits.reshape(-1, logits.shape[-1])  # [N, V]
    flat_index = index.reshape(-1)  # [N]
    out = []
    for start in range(0, flat.shape[0], chunk_size):
        rows = flat[start : start + chunk_size].float()  # [n, V], fp32 even for bf16 logits
        picked = rows.gather(-1, flat_index[start : start + chunk_size, None]).squeeze(-1)  # [n]
        out.append(picked - torch.logsumexp(rows, dim=-1))  # [n]
    return torch.cat(out).view(index.shape)


def _chunk_logps(
    hidden: Tensor, targets: Tensor, lm_head: nn.Module, temperature: float, compute_entropy: bool
) -> tuple[Tensor, Tensor]:
    logits = lm_head(hidden).float()  # [n, V], the only vocabulary-sized tensors live here
    if temperature != 1.0:
        logits.div_(temperature)  # in place: a second [n, V] copy would double the chunk's peak
    lse = torch.logsumexp(logits, dim=-1)  # [n]
    logps = logits.gather(-1, targets[:, None]).squeeze(-1) - lse  # [n]
    if not compute_entropy:
        return logps, logps.new_zeros(())
    # H = -sum p log p = lse - sum p z, with p = softmax(z)
    entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)  # [n]
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
) -> tuple[Tensor, Tensor | None]:
    """Log-probs ``[B, T]`` (fp32) of the last ``T = logits_to_keep`` tokens of ``input_ids [B, L]``, and their entropies.

    Logits are divided by ``temperature`` (the sampling temperature, as TRL) before the softmax. Left or
    right padding is fine: ``attention_mask`` goes to the model, padded positions get meaningless values to mask.
    """
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # [B, L, H]
    # Off-by-one: the hidden state at position t predicts token t+1, so the T completion tokens
    # input_ids[:, L-T:] are scored by positions L-T-1 .. L-2 (the last position predicts beyond the input).
    hidden = hidden[:, -logits_to_keep - 1 : -1, :]  # [B, T, H]
    targets = input_ids[:, -logits_to_keep:]  # [B, T]
    B, T, H = hidden.shape
    flat_hidden, flat_targets = hidden.reshape(B * T, H), targets.reshape(B * T)  # [B*T, H], [B*T]
    lm_head = model.get_output_embeddings()  # the tied embedding module when tie_word_embeddings

    needs_grad = torch.is_grad_enabled() and (
        flat_hidden.requires_grad or any(p.requires_grad for p in lm_head.parameters())
    )
    logps, entropies = [], []
    for start in range(0, B * T, chunk_size):
        rows = slice(start, start + chunk_size)
        args = (flat_hidden[rows], flat_targets[rows], lm_head, temperature, compute_entropy)
        if needs_grad:
            # backward recomputes this chunk's logits instead of storing [n, V] activations for every chunk
            chunk_logps, chunk_entropy = checkpoint(_chunk_logps, *args, use_reentrant=False)
        else:
            chunk_logps, chunk_entropy = _chunk_logps(*args)
        logps.append(chunk_logps)  # [n]
        entropies.append(chunk_entropy)  # [n] or a placeholder scalar
    per_token_logps = torch.cat(logps).view(B, T)  # [B, T]
    entropy = torch.cat(entropies).view(B, T) if compute_entropy else None  # [B, T]
    return per_token_logps, entropy
