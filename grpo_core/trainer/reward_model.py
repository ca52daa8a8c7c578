"""Reward-model training on preference pairs: TRL's ``RewardTrainer`` on this codebase's training skeleton.

    python -c "from grpo_core.trainer.reward_model import train_reward_model; ..."   (the reward_model stage calls it)

A row is ``{prompt, chosen, rejected[, margin][, source]}``. The model is ``AutoModelForSequenceClassification``
with ``num_labels=1`` loaded from ``model_path``: a causal LM (the tiny base model, an SFT model) gets a fresh
score head on its backbone, a reward model keeps its own. Each response is rendered with its prompt through the
chat template (``rewards.reward_model.conversation_ids``, the same rendering that scores it later), cut on the
right at ``max_length``. The loss is the Bradley-Terry negative log-likelihood TRL uses (``bradley_terry_loss``).

Everything else is the skeleton SFT and GRPO share (``grpo_core.trainer.skeleton``): AdamW and its schedule,
verified checkpoints with resume, ``metrics.jsonl``/TensorBoard, the progress line, ``output_dir/final``. The
pair order is a seeded shuffle per epoch addressed by position, as in SFT, so a resumed run sees the same
batches. After training the held-out pairs are scored: ``eval/pair_accuracy`` (share with r_chosen > r_rejected,
TRL's ``accuracy``), ``eval/loss``, ``eval/reward_margin`` and ``eval/{source}/pair_accuracy``; the final model
folder also gets ``reward_stats.json`` (mean/std of its scores on training responses), which a reward function
with ``normalize: true`` uses. ``near_miss_negatives: N`` adds up to N pairs (chosen, a character-level near miss
of chosen) per training pair (grpo_core.data.near_miss; counted as ``train/near_miss_pairs``), a defence against a
policy that finds typos of the preferred answer the model never saw ranked; ``eval/near_miss_accuracy`` (chosen
above one near miss of itself, per held-out pair) measures that weakness with the option on or off.
Departure from TRL: no distributed training beyond DDP-style gradient summing.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from grpo_core.config import RewardConfig, TrackingInfo
from grpo_core.data.near_miss import add_near_miss_negatives
from grpo_core.generation.prompts import PromptStream
from grpo_core.rewards.reward_model import REWARD_STATS_FILE, conversation_ids, pad_right, set_pad_token
from grpo_core.trainer.checkpoint import load_latest_checkpoint, write_json
from grpo_core.trainer.distributed import DistContext, gather_objects, micro_batches, shard
from grpo_core.trainer.lora import load_lora_model
from grpo_core.trainer.skeleton import (
    StepValues,
    TrainingRun,
    autocast,
    config_file,
    prepare_output_dir,
    seed_everything,
    start_process,
)

logger = logging.getLogger(__name__)

NAME = "reward"  # checkpoints hold reward_config.json
STATS_PAIRS = 512  # training pairs scored for reward_stats.json
NEAR_MISS_EVAL_SEED_OFFSET = 7919  # the held-out near misses' seed is config.seed + this, never a training one


def bradley_terry_loss(r_chosen: torch.Tensor, r_rejected: torch.Tensor, margin: torch.Tensor | None = None,
                       center_rewards_coefficient: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean Bradley-Terry NLL over pairs, as TRL's ``RewardTrainer.compute_loss``:

        loss = mean(-log sigmoid(r_chosen - r_rejected [- margin]))  [+ c * mean((r_chosen + r_rejected)^2)]

    ``r_chosen``, ``r_rejected``, ``margin``: ``[P]``. The centering term (Eisenstein et al. 2023, eq. 2) pulls
    rewards towards mean zero. Metrics: ``accuracy`` (share with r_chosen > r_rejected) and ``margin``
    (mean r_chosen - r_rejected).
    """
    diff = r_chosen - r_rejected  # [P]
    loss = -F.logsigmoid(diff - margin if margin is not None else diff).mean()
    if center_rewards_coefficient is not None:
        loss = loss + center_rewards_coefficient * torch.mean((r_chosen + r_rejected) ** 2)
    with torch.no_grad():
        metrics = {"accuracy": float((diff > 0).float().mean()), "margin": float(diff.mean())}
    return loss, metrics


def load_reward_backbone(path: str | Path, device: torch.device) -> torch.nn.Module:
    """``AutoModelForSequenceClassification`` with one output from ``path`` (a fresh score head on a causal LM)."""
    return AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=torch.float32).to(device)


def _backbone_loader(path: str | Path, **kwargs: Any) -> torch.nn.Module:
    """``load_lora_model``'s base loader for a reward model: the sequence classifier with one output."""
    return AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, **kwargs)


def encode_pairs(tokenizer: Any, rows: list[dict[str, Any]], max_length: int) -> list[dict[str, Any]]:
    """``{chosen_ids, rejected_ids, margin, source}`` per row; a row missing a field fails naming it."""
    out = []
    for i, row in enumerate(rows):
        missing = [k for k in ("prompt", "chosen", "rejected") if row.get(k) is None]
        if missing:
            raise ValueError(f"preference row {i}: missing {missing}; a pair needs prompt, chosen and rejected")
        margin = row.get("margin")
        out.append({"chosen_ids": conversation_ids(tokenizer, row["prompt"], str(row["chosen"]), max_length),
                    "rejected_ids": conversation_ids(tokenizer, row["prompt"], str(row["rejected"]), max_length),
                    "margin": float(margin) if margin is not None and not _isnan(margin) else None,
                    "source": str(row.get("source") or "")})
    return out


def _isnan(x: Any) -> bool:
    return isinstance(x, float) and math.isnan(x)


def split_pairs(rows: list[dict[str, Any]], eval_fraction: float, seed: int
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held-out): a seeded ``eval_fraction`` of the rows held out (at least one, when there are two)."""
    idx = list(range(len(rows)))
    random.Random(seed).shuffle(idx)
    n_eval = min(len(rows) - 1, max(1, round(eval_fraction * len(rows)))) if len(rows) > 1 else 0
    held = set(idx[:n_eval])
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]


def pair_rewards(model: torch.nn.Module, pairs: list[dict[str, Any]], pad_token_id: int, device: torch.device
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(r_chosen [P], r_rejected [P])``: chosen and rejected in one forward, as TRL concatenates them."""
    batch = pad_right([p["chosen_ids"] for p in pairs] + [p["rejected_ids"] for p in pairs], pad_token_id)
    logits = model(**{k: v.to(device) for k, v in batch.items()}, use_cache=False).logits[:, 0]  # [2P]
    return logits[: len(pairs)], logits[len(pairs):]


def margins(pairs: list[dict[str, Any]], device: torch.device) -> torch.Tensor | None:
    """``[P]`` margins when every pair has one (TRL applies a margin column to all rows or none)."""
    if not pairs or any(p["margin"] is None for p in pairs):
        return None
    return torch.tensor([p["margin"] for p in pairs], dtype=torch.float32, device=device)


@torch.no_grad()
def evaluate_pairs(model: torch.nn.Module, pairs: list[dict[str, Any]], pad_token_id: int, device: torch.device,
                   batch_size: int) -> dict[str, float]:
    """``eval/pair_accuracy``, ``eval/loss``, ``eval/reward_margin`` and ``eval/{source}/pair_accuracy``."""
    was_training = model.training
    model.eval()
    diffs, losses, by_source = [], [], defaultdict(list)
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start: start + batch_size]
        r_c, r_r = pair_rewards(model, chunk, pad_token_id, device)
        m = margins(chunk, device)
        diff = (r_c - r_r).float().cpu()  # [P]
        diffs += diff.tolist()
        losses += (-F.logsigmoid((r_c - r_r - m) if m is not None else (r_c - r_r))).float().cpu().tolist()
        for p, d in zip(chunk, diff.tolist()):
            if p["source"]:
                by_source[p["source"]].append(d > 0)
    model.train(was_training)
    if not diffs:
        return {}
    out = {"eval/pair_accuracy": sum(d > 0 for d in diffs) / len(diffs), "eval/loss": sum(losses) / len(losses),
           "eval/reward_margin": sum(diffs) / len(diffs), "eval/num_pairs": float(len(diffs))}
    out.update({f"eval/{s}/pair_accuracy": sum(v) / len(v) for s, v in sorted(by_source.items())})
    return out


@torch.no_grad()
def response_stats(model: torch.nn.Module, pairs: list[dict[str, Any]], pad_token_id: int, device: torch.device,
                   batch_size: int) -> dict[str, float]:
    """Mean and std of the model's scores on the responses of ``pairs`` (chosen and rejected)."""
    model.eval()
    scores: list[float] = []
    for start in range(0, len(pairs), batch_size):
        r_c, r_r = pair_rewards(model, pairs[start: start + batch_size], pad_token_id, device)
        scores += r_c.float().cpu().tolist() + r_r.float().cpu().tolist()
    mean = sum(scores) / len(scores)
    std = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))
    return {"mean": mean, "std": std, "num_responses": len(scores)}


def resolve_max_steps(config: RewardConfig, num_pairs: int) -> int:
    """``max_steps`` when given (not None), else ``num_train_epochs`` over the pairs."""
    if config.max_steps is not None:
        return config.max_steps
    per_step = config.per_device_train_batch_size * config.gradient_accumulation_steps
    return max(1, math.ceil(config.num_train_epochs * num_pairs / per_step))


def train_reward_model(config: RewardConfig, model_path: str | Path, rows: list[dict[str, Any]],
                       output_dir: str | Path, *, eval_rows: list[dict[str, Any]] | None = None,
                       resume: bool = True, callbacks: list[Any] | None = None,
                       tracking: TrackingInfo | None = None) -> dict[str, Any]:
    """Train a reward model on ``rows`` ``{prompt, chosen, rejected[, margin][, source]}``; the model (with
    ``reward_stats.json``) in ``output_dir/final``. ``eval_rows`` None: ``eval_fraction`` of ``rows`` held out.

    Returns the held-out metrics, ``train/loss``, ``train/accuracy``, ``train/steps``, ``train/runtime_s`` and
    ``final_path``. Raises FloatingPointError on a non-finite loss.
    """
    if not rows:
        raise ValueError("train_reward_model got no preference pairs; the preferences set is empty")
    started = time.time()
    if eval_rows is None:
        rows, eval_rows = split_pairs(rows, config.eval_fraction, config.seed)
    rows, num_near_miss = add_near_miss_negatives(rows, config.near_miss_negatives, config.seed)  # training pairs only
    if num_near_miss:
        logger.info("near_miss_negatives=%d: added %d near-miss pairs to %d preference pairs",
                    config.near_miss_negatives, num_near_miss, len(rows) - num_near_miss)
    ctx = start_process(config)
    output_dir = Path(output_dir)
    prepare_output_dir(output_dir, ctx, resume)
    seed_everything(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    load = lambda p: load_reward_backbone(p, ctx.device)  # noqa: E731
    if config.use_peft:  # LoRA on the backbone, the fresh score head trained in full (trainer/lora.py)
        load = lambda p: load_lora_model(model_path, config, ctx.device, adapter=p, task_type="SEQ_CLS",  # noqa: E731
                                         load_base=_backbone_loader)
    loaded = load_latest_checkpoint(output_dir, load, config_file(NAME)) if resume else None
    if loaded:
        model = loaded.model
    elif config.use_peft:
        model = load_lora_model(model_path, config, ctx.device, task_type="SEQ_CLS", load_base=_backbone_loader)
    else:
        model = load(model_path)
    pad_id = set_pad_token(model, tokenizer)
    model.train()
    if config.gradient_checkpointing and not config.use_peft:  # load_lora_model turned it on for the base
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    train_pairs = encode_pairs(tokenizer, rows, config.max_length)
    eval_pairs = encode_pairs(tokenizer, eval_rows, config.max_length)
    # One near miss of each held-out chosen answer (a seed no training pair uses): whether the model ranks the
    # exact answer above its typos, measured whether near_miss_negatives is on or off.
    near_miss_eval = encode_pairs(tokenizer, held_out_near_misses(eval_rows, config.seed), config.max_length)
    max_steps = resolve_max_steps(config, len(train_pairs))
    initial = {"step": 0, "log_history": [], "window": []}  # (loss, accuracy) of the steps since the last log

    def step_fn(batch: list[dict[str, Any]]) -> StepValues:
        loss, accuracy = _accumulate_gradients(model, batch, pad_id, config, ctx)
        return {"train/loss": loss, "train/accuracy": accuracy}, {}

    def last_metrics() -> dict[str, float]:
        return {**_evaluate(model, eval_pairs, near_miss_eval, pad_id, ctx.device, config),
                "train/near_miss_pairs": float(num_near_miss)}

    with TrainingRun.start(NAME, config, ctx, output_dir, model, tokenizer, loaded, max_steps=max_steps,
                           optimizer_steps=max_steps, state=initial, callbacks=callbacks, tracking=tracking) as run:
        state = run.state
        run.run_steps(train_pairs, PromptStream(len(train_pairs), config.seed), step_fn, what="reward-model",
                      window="window", started=started, last_metrics=last_metrics)
        final = run.finish(model_path)
    history = state["log_history"]
    result = {k: v for k, v in (history[-1] if history else {}).items() if k.startswith(("eval/", "train/"))}
    if not any(k.startswith("eval/") for k in result):  # resumed after the last step: score the held-out set again
        result.update(_evaluate(model, eval_pairs, near_miss_eval, pad_id, ctx.device, config))
    if ctx.is_main:
        write_json(final / REWARD_STATS_FILE, response_stats(model, train_pairs[:STATS_PAIRS], pad_id, ctx.device,
                                                             config.eval_batch_size))
    result.update({"train/steps": state["step"], "train/runtime_s": time.time() - started, "final_path": str(final),
                   "train/near_miss_pairs": float(num_near_miss)})
    return result


def held_out_near_misses(eval_rows: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """One pair (chosen, a near miss of chosen) per held-out row, from a seed the training near misses do not use."""
    pairs, _ = add_near_miss_negatives(eval_rows, 1, seed + NEAR_MISS_EVAL_SEED_OFFSET)
    return pairs[len(eval_rows):]


def _evaluate(model: torch.nn.Module, eval_pairs: list[dict[str, Any]], near_miss_eval: list[dict[str, Any]],
              pad_id: int, device: torch.device, config: RewardConfig) -> dict[str, float]:
    """``evaluate_pairs`` on the held-out pairs, and its pair accuracies on their near misses as
    ``eval/near_miss_accuracy`` and ``eval/{source}/near_miss_accuracy``."""
    out = evaluate_pairs(model, eval_pairs, pad_id, device, config.eval_batch_size)
    near = evaluate_pairs(model, near_miss_eval, pad_id, device, config.eval_batch_size)
    out.update({k.replace("pair_accuracy", "near_miss_accuracy"): v for k, v in near.items()
                if k.endswith("pair_accuracy")})
    return out


def _accumulate_gradients(model: torch.nn.Module, pairs: list[dict[str, Any]], pad_id: int, config: RewardConfig,
                          ctx: DistContext) -> tuple[float, float]:
    """Backward over this rank's share of a step's pairs, each micro-batch's mean loss weighted by its share of
    the step's pairs (so the summed gradient is the step's mean); returns the step's loss and pair accuracy."""
    total = len(pairs)
    local_loss, local_correct = 0.0, 0.0
    for mb in micro_batches(shard(list(range(total)), ctx), config.per_device_train_batch_size):
        chunk = [pairs[i] for i in mb]
        with autocast(config, ctx.device):
            r_c, r_r = pair_rewards(model, chunk, pad_id, ctx.device)
            loss, m = bradley_terry_loss(r_c.float(), r_r.float(), margins(chunk, ctx.device),
                                         config.center_rewards_coefficient)
        loss = loss * (len(chunk) / total)
        loss.backward()
        local_loss += float(loss.detach())
        local_correct += m["accuracy"] * len(chunk)
    gathered = gather_objects([(local_loss, local_correct)], ctx)
    return sum(g[0] for g in gathered), sum(g[1] for g in gathered) / total
