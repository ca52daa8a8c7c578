"""Supervised fine-tuning on (prompt, completion) pairs: the cold-start and consolidation stages.

    python -c "from grpo_core.trainer.sft import train_sft; ..."   (the Prefect tasks call train_sft)

The loss is the mean next-token cross-entropy over completion tokens only (TRL's
``completion_only_loss``): prompt and padding positions get label -100, and so do a completion's tool turns
(the tool wrote them, not the model; ``encode_completion``). A prompt is rendered with the tokenizer's chat template
and its generation prompt (with the row's ``tools`` schemas, TRL's column, when it has them), the completion follows
and ends with EOS, the same token layout generation and GRPO see. An optimiser step averages over every completion
token of its ``per_device_train_batch_size x gradient_accumulation_steps`` rows (token-weighted, not
micro-batch-weighted), so ``group_by_length`` may cut the step's rows into micro-batches in length order
(less padding) without changing the gradient. The cross-entropy is ``-log p`` from
``grpo_core.trainer.logprobs.compute_token_logps``: the LM head runs ``logprob_chunk_size`` rows at a time, so the
``[B, L, V]`` fp32 logits never exist. ``padding_free`` packs each micro-batch's rows into one sequence instead
(``grpo_core/trainer/packing.py``; ``max_tokens_per_batch`` cuts micro-batches by packed tokens): the same loss.

Everything else is the skeleton GRPO uses (``grpo_core.trainer.skeleton``): AdamW with weight-decay
groups, the schedule, verified atomic checkpoints (``output_dir/checkpoint-{step}``, whose
``trainer_state.json`` holds the step and the logged history), ``metrics.jsonl`` rewritten on resume so
each logged step appears once, the progress line, ``output_dir/final``. The data order is a seeded
shuffle per epoch, addressed by position, so a resumed run sees exactly the batches the uninterrupted
run would have.

Under torchrun a step's rows are split over the ranks (contiguous shares, then micro-batches of
``per_device_train_batch_size``), each loss divided by the step's GLOBAL completion-token count and
the gradients summed (``distributed_strategy='fsdp'``: sharded by FSDP2), so N processes train like
one. Departure from TRL: ``per_device_train_batch_size x gradient_accumulation_steps`` is the step's
whole batch, not one rank's share.
"""

from __future__ import annotations

import functools
import json
import math
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from grpo_core.config import SFTConfig, TrackingInfo
from grpo_core.generation.prompts import PromptStream, encode_prompt
from grpo_core.generation.trajectory import tool_turn_format
from grpo_core.tools import tool_response_spans
from grpo_core.trainer.distributed import DistContext, gather_objects, micro_batches, shard
from grpo_core.trainer.fsdp import is_sharded
from grpo_core.trainer.logprobs import compute_packed_logps, compute_token_logps
from grpo_core.trainer.mixture import weighted_epoch
from grpo_core.trainer.packing import pack_rows, token_budget_batches
from grpo_core.trainer.skeleton import (
    StepValues,
    TrainingRun,
    autocast,
    load_policy,
    prepare_output_dir,
    seed_everything,
    start_process,
)

IGNORE_INDEX = -100


def encode_sft_row(tokenizer: Any, row: dict[str, Any], max_length: int, completion_only_loss: bool = True
                   ) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` of one row; labels are -100 on prompt tokens and on the completion's tool turns
    (``encode_completion``); right-truncated. A row's ``tools`` (TRL's column: the function schemas, a list or its
    JSON text, as rejection sampling writes them) go to the chat template with the prompt, as they did when the
    completion was sampled."""
    prompt_ids = encode_prompt(tokenizer, row["prompt"], tools=row_tools(row))
    completion_ids, completion_labels = encode_completion(tokenizer, row["completion"])
    eos = [tokenizer.eos_token_id]
    input_ids = (prompt_ids + completion_ids + eos)[:max_length]
    prompt_labels = [IGNORE_INDEX] * len(prompt_ids) if completion_only_loss else list(prompt_ids)
    labels = (prompt_labels + completion_labels + eos)[:max_length]
    return input_ids, labels


def row_tools(row: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A row's ``tools`` column: None when absent or empty, the schemas when a list, parsed when JSON text."""
    tools = row.get("tools")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools) if tools.strip() else None
        except json.JSONDecodeError as e:
            raise ValueError(f"row {row.get('id', '?')}: its tools field is not JSON ({e}); write the tools' function "
                             "schemas as a list (or its JSON text), as rejection sampling does") from None
    return list(tools) if tools else None


@functools.lru_cache(maxsize=8)
def _tool_turn(tokenizer: Any) -> tuple[str, str]:
    return tool_turn_format(tokenizer)


def encode_completion(tokenizer: Any, text: str) -> tuple[list[int], list[int]]:
    """``(ids, labels)`` of a completion (no EOS). A completion with tool turns is tokenized piece by piece, model
    text and tool text in turn, so each turn's edges are token edges, as in a multi-turn rollout (its tool turns are
    tokenized on their own, ``generation/trajectory.py``); the tool turns' labels are -100, so SFT trains on the
    model's turns only, as GRPO's loss does. Without tool turns: the whole text at once, labels = ids.

    A tool turn is what the chat template writes around a tool result (``tool_turn_format``: Qwen2.5's
    ``<|im_end|>\\n<|im_start|>user\\n<tool_response>\\n...\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n``,
    as a kept trajectory's text holds it), else, in a trace written without it, ``<tool_response>...</tool_response>``
    (``grpo_core.tools.tool_response_spans``)."""
    spans = tool_response_spans(text, *_tool_turn(tokenizer)) or tool_response_spans(text)
    if not spans:
        whole = tokenizer(text, add_special_tokens=False)["input_ids"]
        return whole, list(whole)
    ids: list[int] = []
    labels: list[int] = []
    position = 0
    for start, end in [*spans, (len(text), len(text))]:
        for piece, tool in ((text[position:start], False), (text[start:end], True)):
            if piece:
                piece_ids = tokenizer(piece, add_special_tokens=False)["input_ids"]
                ids += piece_ids
                labels += [IGNORE_INDEX] * len(piece_ids) if tool else piece_ids
        position = end
    return ids, labels


def collate(examples: list[tuple[list[int], list[int]]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a micro-batch: input_ids/attention_mask/labels ``[B, L]``."""
    length = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), length), pad_token_id, dtype=torch.long)  # [B, L]
    labels = torch.full((len(examples), length), IGNORE_INDEX, dtype=torch.long)  # [B, L]
    attention_mask = torch.zeros((len(examples), length), dtype=torch.long)  # [B, L]
    for i, (ids, lab) in enumerate(examples):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, : len(lab)] = torch.tensor(lab)
        attention_mask[i, : len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def completion_token_loss(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    labels: torch.Tensor,
    *,
    num_tokens: int,
    chunk_size: int = 1024,
    checkpoint_logits: bool | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Cross-entropy summed over the label tokens of ``[B, L]`` rows, divided by ``num_tokens`` (the step's total).

    ``labels`` is ``input_ids`` with -100 where there is no loss (``encode_sft_row``). Only positions from the
    first label column on go through the LM head, ``chunk_size`` rows at a time (``compute_token_logps``).
    Returns ``(loss, {"tokens": label tokens in this micro-batch})``.
    """
    # Off-by-one: position t predicts token t+1, so label column t+1 is scored by position t.
    mask = labels[:, 1:] != IGNORE_INDEX  # [B, L-1]
    first = int(mask.any(0).float().argmax())  # the first column with a label in any row (0 when none)
    logps, _ = compute_token_logps(model, input_ids, attention_mask, mask.shape[1] - first,
                                   chunk_size=chunk_size, checkpoint_logits=checkpoint_logits)  # [B, T]
    mask = mask[:, first:]  # [B, T]
    loss = -(logps * mask).sum() / num_tokens
    return loss, {"tokens": float(mask.sum())}


def packed_completion_token_loss(
    model: torch.nn.Module,
    examples: list[tuple[list[int], list[int]]],
    device: torch.device,
    *,
    num_tokens: int,
    chunk_size: int = 1024,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``completion_token_loss`` of ``(input_ids, labels)`` rows packed into one sequence (``padding_free``).

    The same sum of ``-log p`` over label tokens divided by ``num_tokens``; only label positions reach the LM head.
    """
    rows = [torch.tensor(ids) for ids, _ in examples]
    # Off-by-one: token t (t >= 1) is scored when labels[t] is set; pack_rows reads it at position t - 1.
    scored = [torch.nonzero(torch.tensor(labels[1:]) != IGNORE_INDEX).flatten() + 1 for _, labels in examples]
    packed = pack_rows(rows, scored).to(device)
    logps, _ = compute_packed_logps(model, packed, chunk_size=chunk_size)  # [K]
    return -logps.sum() / num_tokens, {"tokens": float(logps.numel())}


def count_label_tokens(labels: list[int]) -> int:
    """Tokens a row's loss covers: its labels after the shift (the first token is never predicted)."""
    return sum(label != IGNORE_INDEX for label in labels[1:])


def resolve_max_steps(config: SFTConfig, num_rows: int) -> int:
    """``max_steps`` when given (not None), else ``num_train_epochs`` over the data."""
    if config.max_steps is not None:
        return config.max_steps
    per_step = config.per_device_train_batch_size * config.gradient_accumulation_steps
    return max(1, math.ceil(config.num_train_epochs * num_rows / per_step))


def train_sft(config: SFTConfig, model_path: str | Path, rows: list[dict[str, Any]], output_dir: str | Path, *,
              resume: bool = True, callbacks: list[Any] | None = None,
              tracking: TrackingInfo | None = None) -> dict[str, Any]:
    """Fine-tune ``model_path`` on ``rows`` ``{prompt, completion}``; final model in ``output_dir/final``.

    Returns final metrics: ``train/loss`` (mean of the last logging window), ``train/steps``,
    ``train/runtime_s``, ``final_path``. Raises FloatingPointError on a non-finite loss (not worth retrying).
    """
    if not rows:
        raise ValueError("train_sft got no rows; the SFT data set is empty")
    started = time.time()
    ctx = start_process(config)
    output_dir = Path(output_dir)
    prepare_output_dir(output_dir, ctx, resume)
    seed_everything(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model, loaded = load_policy("sft", model_path, output_dir, config, ctx, resume=resume)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if config.sources:  # a data mixture: each source's share of every epoch (trainer.mixture.weighted_epoch)

        rows = weighted_epoch(rows, config.sources, config.seed)
    encoded = [encode_sft_row(tokenizer, r, config.max_length, config.completion_only_loss) for r in rows]
    max_steps = resolve_max_steps(config, len(encoded))
    initial = {"step": 0, "log_history": [], "loss_window": []}  # losses of the steps since the last logged one

    def step_fn(batch: list[tuple[list[int], list[int]]]) -> StepValues:
        loss, num_tokens = _accumulate_gradients(model, batch, pad_id, config, ctx)
        return {"train/loss": loss}, {"train/num_tokens": num_tokens}

    with TrainingRun.start("sft", config, ctx, output_dir, model, tokenizer, loaded, max_steps=max_steps,
                           optimizer_steps=max_steps, state=initial, callbacks=callbacks, tracking=tracking) as run:
        state = run.state
        run.run_steps(encoded, PromptStream(len(encoded), config.seed), step_fn, what="SFT", window="loss_window",
                      started=started)
        final = run.finish(model_path)
    last_loss = state["log_history"][-1]["train/loss"] if state["log_history"] else float("nan")
    return {"train/loss": last_loss, "train/steps": state["step"], "train/runtime_s": time.time() - started,
            "final_path": str(final)}


def _accumulate_gradients(model: torch.nn.Module, rows: list[tuple[list[int], list[int]]], pad_id: int,
                          config: SFTConfig, ctx: DistContext) -> tuple[float, int]:
    """Backward over this rank's share of a step's ``rows``; returns the step's loss (all ranks) and label tokens."""
    num_tokens = sum(count_label_tokens(labels) for _, labels in rows)  # global: every rank has every row
    sharded = is_sharded(model)
    local_loss = 0.0
    local = shard(list(range(len(rows))), ctx)  # this rank's contiguous share, in stream order
    if config.group_by_length:  # shortest first: each micro-batch pads to its own longest row
        local = sorted(local, key=lambda i: len(rows[i][0]))
    lockstep = ctx if sharded else None
    if config.padding_free and config.max_tokens_per_batch is not None:
        batches = token_budget_batches(local, [len(rows[i][0]) - 1 for i in local], config.max_tokens_per_batch,
                                       lockstep)
    else:
        batches = micro_batches(local, config.per_device_train_batch_size, lockstep)
    for mb in batches:
        examples = [rows[i] for i in mb or [0]]  # [] = FSDP filler: run, add 0
        with autocast(config, ctx.device):
            if config.padding_free:
                loss, _ = packed_completion_token_loss(model, examples, ctx.device, num_tokens=max(num_tokens, 1),
                                                       chunk_size=config.logprob_chunk_size)
            else:
                batch = {k: v.to(ctx.device) for k, v in collate(examples, pad_id).items()}
                loss, _ = completion_token_loss(model, batch["input_ids"], batch["attention_mask"], batch["labels"],
                                                num_tokens=max(num_tokens, 1), chunk_size=config.logprob_chunk_size)
        if not mb:  # every forward of a sharded model is a collective: join it, contribute nothing
            (loss * 0.0).backward()
            continue
        loss.backward()
        local_loss += float(loss.detach())
    return sum(gather_objects([local_loss], ctx)), num_tokens
