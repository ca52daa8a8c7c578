"""Supervised fine-tuning on (prompt, completion) pairs: the cold-start and consolidation stages.

    python -c "from grpo_core.sft import train_sft; ..."   (the Prefect tasks call train_sft)

The loss is the mean next-token cross-entropy over completion tokens only (TRL's
``completion_only_loss``): prompt and padding positions get label -100. A prompt is rendered with the
tokenizer's chat template and its generation prompt, the completion follows and ends with EOS, the
same token layout generation and GRPO see. An optimiser step averages over every completion token of
its ``gradient_accumulation_steps`` micro-batches (token-weighted, not micro-batch-weighted).

Checkpoints (``output_dir/checkpoint-{step}``) hold the model (``save_pretrained``), tokenizer,
optimiser and scheduler state and the step; each is written to a temp folder and renamed into
place, so a crash never leaves a half checkpoint. The data order is a seeded shuffle per epoch,
addressed by position, so a resumed run sees exactly the batches the uninterrupted run would have.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, get_scheduler

from grpo_core.config import SFTConfig
from grpo_core.trainer.prompts import PromptStream, encode_prompt

IGNORE_INDEX = -100


def encode_sft_row(tokenizer: Any, row: dict[str, Any], max_length: int, completion_only_loss: bool = True
                   ) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` of one row; labels are -100 on prompt tokens; right-truncated."""
    prompt_ids = encode_prompt(tokenizer, row["prompt"])
    completion_ids = tokenizer(row["completion"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    input_ids = (prompt_ids + completion_ids)[:max_length]
    prompt_labels = [IGNORE_INDEX] * len(prompt_ids) if completion_only_loss else list(prompt_ids)
    labels = (prompt_labels + completion_ids)[:max_length]
    return input_ids, labels


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


def completion_token_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Summed cross-entropy over label tokens (the caller divides by the step's total label count)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # [B, L, V]
    # position t predicts token t+1: drop the last logit and the first label
    shift_logits = logits[:, :-1].float()  # [B, L-1, V]
    shift_labels = batch["labels"][:, 1:]  # [B, L-1]
    return torch.nn.functional.cross_entropy(
        shift_logits.reshape(-1, shift_logits.shape[-1]), shift_labels.reshape(-1),
        ignore_index=IGNORE_INDEX, reduction="sum",
    )


def resolve_max_steps(config: SFTConfig, num_rows: int) -> int:
    """``max_steps`` when set explicitly, else ``num_train_epochs`` over the data."""
    if "max_steps" in config.model_fields_set:
        return config.max_steps
    per_step = config.per_device_train_batch_size * config.gradient_accumulation_steps
    return max(1, math.ceil(config.num_train_epochs * num_rows / per_step))


def train_sft(config: SFTConfig, model_path: str | Path, rows: list[dict[str, Any]], output_dir: str | Path, *,
              resume: bool = True, callbacks: list[Any] | None = None) -> dict[str, Any]:
    """Fine-tune ``model_path`` on ``rows`` ``{prompt, completion}``; final model in ``output_dir/final``.

    Returns final metrics: ``train/loss`` (mean of the last logging window), ``train/steps``,
    ``train/runtime_s``, ``final_path``. Raises FloatingPointError on a non-finite loss (not worth retrying).
    """
    if not rows:
        raise ValueError("train_sft got no rows; the SFT data set is empty")
    if config.torch_num_threads:
        torch.set_num_threads(config.torch_num_threads)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    callbacks = callbacks or []
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(config.seed)

    last = latest_checkpoint(output_dir) if resume else None
    load_from = last or Path(model_path)
    tokenizer = AutoTokenizer.from_pretrained(load_from)
    model = AutoModelForCausalLM.from_pretrained(load_from, dtype=torch.float32).to(device)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    encoded = [encode_sft_row(tokenizer, r, config.max_length, config.completion_only_loss) for r in rows]
    max_steps = resolve_max_steps(config, len(encoded))
    per_step = config.per_device_train_batch_size * config.gradient_accumulation_steps
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay,
                                  betas=(config.adam_beta1, config.adam_beta2), eps=config.adam_epsilon)
    warmup = config.warmup_steps or int(config.warmup_ratio * max_steps)
    scheduler = get_scheduler(config.lr_scheduler_type, optimizer, num_warmup_steps=warmup, num_training_steps=max_steps)
    step = 0
    if last is not None:
        state = torch.load(last / "training_state.pt", weights_only=False)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step = state["step"]
    metrics_path = output_dir / "metrics.jsonl"
    _truncate_metrics(metrics_path, step)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if config.bf16 and device.type == "cuda"
                else torch.autocast("cpu", enabled=False))

    start_time, window, last_loss = time.time(), [], float("nan")
    writer = _tensorboard_writer(output_dir) if "tensorboard" in config.report_to else None
    stream = PromptStream(len(encoded), config.seed)
    while step < max_steps:
        indices = stream.rows_at(step * per_step, per_step)
        micro = [indices[i: i + config.per_device_train_batch_size]
                 for i in range(0, per_step, config.per_device_train_batch_size)]
        batches = [collate([encoded[i] for i in m], pad_id) for m in micro]
        total_tokens = sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in batches)
        loss_total = 0.0
        for b in batches:
            b = {k: v.to(device) for k, v in b.items()}
            with autocast:
                loss_sum = completion_token_loss(model, b)
            loss = loss_sum / max(total_tokens, 1)  # token-weighted mean over the whole step
            loss.backward()
            loss_total += float(loss.detach())
        if not math.isfinite(loss_total):
            raise FloatingPointError(f"non-finite SFT loss {loss_total} at step {step + 1}; lower learning_rate")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        window.append(loss_total)
        if step % config.logging_steps == 0 or step == max_steps:
            metrics = {"step": step, "train/loss": sum(window) / len(window), "train/grad_norm": grad_norm,
                       "train/learning_rate": scheduler.get_last_lr()[0], "train/num_tokens": total_tokens,
                       "train/elapsed_s": time.time() - start_time}
            if "jsonl" in config.report_to:
                with metrics_path.open("a") as f:
                    f.write(json.dumps(metrics) + "\n")
            if writer is not None:
                for k, v in metrics.items():
                    writer.add_scalar(k, v, step)
            for cb in callbacks:
                if hasattr(cb, "on_step"):
                    cb.on_step(step, max_steps, metrics)
            last_loss, window = metrics["train/loss"], []
        if step % config.save_steps == 0 and step < max_steps:
            path = save_checkpoint(model, tokenizer, optimizer, scheduler, step, config, output_dir)
            for cb in callbacks:
                if hasattr(cb, "on_checkpoint"):
                    cb.on_checkpoint(step, path)

    if writer is not None:
        writer.close()
    final = output_dir / "final"
    _atomic_save(final, lambda tmp: _save_model(model, tokenizer, config, tmp))
    return {"train/loss": last_loss, "train/steps": step,
            "train/runtime_s": time.time() - start_time, "final_path": str(final)}


def _save_model(model: torch.nn.Module, tokenizer: Any, config: SFTConfig, path: Path) -> None:
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    (path / "sft_config.json").write_text(config.model_dump_json(indent=2))


def save_checkpoint(model: torch.nn.Module, tokenizer: Any, optimizer: torch.optim.Optimizer, scheduler: Any,
                    step: int, config: SFTConfig, output_dir: Path) -> Path:
    """``output_dir/checkpoint-{step}``, written atomically; prunes beyond ``save_total_limit``."""
    def write(tmp: Path) -> None:
        _save_model(model, tokenizer, config, tmp)
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "step": step},
                   tmp / "training_state.pt")

    path = _atomic_save(output_dir / f"checkpoint-{step}", write)
    for old in list_checkpoints(output_dir)[: -config.save_total_limit]:
        shutil.rmtree(old, ignore_errors=True)
    return path


def _atomic_save(path: Path, write: Any) -> Path:
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)
    return path


def list_checkpoints(output_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    found = [(int(m.group(1)), p) for p in Path(output_dir).glob("checkpoint-*")
             if (m := re.fullmatch(r"checkpoint-(\d+)", p.name)) and (p / "training_state.pt").exists()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(output_dir: Path) -> Path | None:
    found = list_checkpoints(output_dir)
    return found[-1] if found else None


def _tensorboard_writer(output_dir: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is optional
        return None
    return SummaryWriter(log_dir=str(output_dir / "tensorboard"))


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop logged steps after ``step`` (a resumed run logs them again)."""
    if not path.exists():
        return
    keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    path.write_text("".join(line + "\n" for line in keep))
