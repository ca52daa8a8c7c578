"""Packed, padding-free micro-batches: rows of several lengths as one sequence, attention kept within each row.

A padded micro-batch runs every row to its longest row's length; R1 traces vary tenfold in length, so most of
that work is padding. Packed (TRL's ``padding_free``), the micro-batch's rows are concatenated into one sequence
``[1, S]`` (``S`` = the sum of their lengths, no padding) with ``position_ids`` restarting at 0 on each row, and
no attention mask. Transformers reads the restarts as row boundaries (``masking_utils.find_packed_sequence_indices``):

- ``flash_attention_2/3``: varlen kernels with ``cu_seqlens`` from the position ids (GPU, no extra code here);
- ``sdpa``/``eager``: transformers would build a dense ``[S, S]`` block-diagonal mask, whose attention costs
  ``S^2 = (sum_i L_i)^2`` instead of the padded batch's ``B * max_i L_i^2``, i.e. more than padding saves. So
  ``enable_padding_free`` swaps in ``padding_free_sdpa`` (registered with transformers' ``AttentionInterface``):
  causal SDPA on each row's part (``torch.split``: one cat in backward, not a zero-filled sequence per row),
  ``sum_i L_i^2``. Calls with a mask, a batch or a cache go to plain SDPA with
  transformers' own mask, so the model behaves exactly as before everywhere else (generation, padded passes);
- anything else (flex attention, ...): transformers' block-diagonal mask from the position ids.

Only the batching of the forward changes: log-probs are scattered back into the padded ``[b, T]`` layout the
losses take, so every loss normaliser is the one of the padded path. ``max_tokens_per_batch`` cuts a step's rows
into micro-batches by a token budget (``token_budget_batches``) instead of ``per_device_train_batch_size`` rows.
Not for models with sliding-window or non-causal attention masks under SDPA (those calls keep the dense mask).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from grpo_core.trainer.distributed import DistContext, pad_lockstep

PADDING_FREE_ATTENTION = "padding_free_sdpa"
_SWAPPED = ("sdpa", "eager")  # implementations whose packed mask would be dense [S, S]


@dataclass
class PackedRows:
    """Rows concatenated into one sequence, and which of its positions are scored (the loss's tokens)."""

    input_ids: Tensor  # [1, S] each row without its last token (it predicts nothing), rows back to back
    position_ids: Tensor  # [1, S] 0..L_i-1 per row: the restarts mark the row boundaries
    score_index: Tensor  # [K] positions in S whose next token is scored
    targets: Tensor  # [K] the tokens they predict
    rows: Tensor  # [K] the row of each scored token
    cols: Tensor  # [K] its column in the row's scored tokens (the padded layout's column)

    def to(self, device: torch.device | str) -> "PackedRows":
        return PackedRows(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))

    def unpack(self, values: Tensor, num_rows: int, num_cols: int) -> Tensor:
        """``[K]`` per-scored-token values -> the padded layout ``[num_rows, num_cols]``, 0 elsewhere (differentiable)."""
        out = values.new_zeros((num_rows, num_cols))  # [b, T]
        return out.index_put((self.rows, self.cols), values)  # [b, T]


def pack_rows(rows: list[Tensor], scored: list[Tensor]) -> PackedRows:
    """Pack 1-D token rows; ``scored[i]`` holds the indices ``t >= 1`` of row ``i``'s tokens to score.

    Token ``t`` of a row is predicted by the hidden state at ``t - 1`` (the off-by-one shift), so each row feeds
    ``row[:-1]`` and its scored token ``t`` is read at packed position ``offset_i + t - 1``.
    """
    ids, positions, index, targets, row_of, col_of = [], [], [], [], [], []
    offset = 0
    for i, (row, t) in enumerate(zip(rows, scored)):
        fed = row[:-1]  # [L_i - 1]
        ids.append(fed)
        positions.append(torch.arange(len(fed)))
        index.append(t + offset - 1)
        targets.append(row[t])
        row_of.append(torch.full((len(t),), i, dtype=torch.long))
        col_of.append(torch.arange(len(t)))
        offset += len(fed)
    cat = lambda parts: torch.cat(parts).long()  # noqa: E731
    return PackedRows(cat(ids)[None], cat(positions)[None], cat(index), cat(targets), cat(row_of), cat(col_of))


def token_budget_batches(idx: list[int], lengths: list[int], max_tokens: int,
                         lockstep: DistContext | None = None) -> list[list[int]]:
    """``idx`` cut in order into micro-batches of at most ``max_tokens`` packed tokens (``lengths[k]`` for ``idx[k]``).

    A row longer than the budget goes alone. With a ``lockstep`` context (FSDP) the list is padded with empty
    micro-batches to the most any rank has, as ``distributed.micro_batches`` does.
    """
    batches: list[list[int]] = []
    tokens = 0
    for i, n in zip(idx, lengths):
        if batches and batches[-1] and tokens + n <= max_tokens:
            batches[-1].append(i)
            tokens += n
        else:
            batches.append([i])
            tokens = n
    return pad_lockstep(batches, lockstep)


def enable_padding_free(model: nn.Module) -> None:
    """Make ``model``'s SDPA/eager attention split packed sequences per row (idempotent; see the module docstring).

    The swap stays on the model, so backward recomputation (gradient checkpointing) sees the same kernel.
    """
    config = model.config
    if config._attn_implementation in _SWAPPED:
        config._attn_implementation = PADDING_FREE_ATTENTION


def _row_starts(position_ids: Tensor) -> list[int]:
    """Where a new row begins in a packed ``[1, S]`` sequence: positions that do not continue the previous one."""
    pos = position_ids[0]  # [S]
    return [0] + (torch.nonzero(torch.diff(pos) != 1).flatten() + 1).tolist()  # diff [S-1] is 1 inside a row


def padding_free_sdpa(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                      position_ids: Tensor | None = None, **kwargs) -> tuple[Tensor, None]:
    """Causal SDPA within each row of a packed ``[1, h, S, d]`` sequence; any other call is plain SDPA."""
    S = query.shape[2]
    if attention_mask is None and position_ids is not None and query.shape[0] == 1 and key.shape[2] == S > 1:
        starts = _row_starts(position_ids)
        if len(starts) > 1:
            sizes = [b - a for a, b in zip(starts, starts[1:] + [S])]
            # split, not slicing: a slice's backward writes its gradient into a zero tensor of the whole sequence,
            # one per row (rows x S x h x d of fills and adds a layer); split's backward is one cat, the same values
            outs = [sdpa_attention_forward(module, q, k, v, None, **kwargs)[0]  # [1, L_i, h, d]
                    for q, k, v in zip(query.split(sizes, dim=2), key.split(sizes, dim=2), value.split(sizes, dim=2))]
            return torch.cat(outs, dim=1), None  # [1, S, h, d]
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def padding_free_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                      attention_mask: Tensor | None = None, local_size: int | None = None, **kwargs) -> Tensor | None:
    """No mask for one unpadded, uncached causal sequence (packed or not: the kernel cuts at the restarts);
    transformers' SDPA mask otherwise (padding, a cache, sliding windows)."""
    if batch_size == 1 and attention_mask is None and local_size is None and q_length == kv_length \
            and not q_offset and not kv_offset:
        return None
    return sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, attention_mask=attention_mask,
                     local_size=local_size, **kwargs)


AttentionInterface.register(PADDING_FREE_ATTENTION, padding_free_sdpa)
AttentionMaskInterface.register(PADDING_FREE_ATTENTION, padding_free_mask)
