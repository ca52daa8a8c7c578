"""The GRPO objective: group-relative advantages and the clipped surrogate with a k3 KL penalty.

The GRPO loss as DeepSeekMath (Shao et al. 2024, eq. 3) and DeepSeek-R1 (2025, sec. 2.2.1) state it:

    L(theta) = -E_q [ 1/G sum_i 1/|o_i| sum_t ( min(rho_it A_i, clip(rho_it, 1-eps, 1+eps) A_i) - beta D_KL^(i,t) ) ]
    rho_it   = pi_theta(o_it | q, o_i<t) / pi_old(o_it | q, o_i<t)
    D_KL^(i,t) = pi_ref/pi_theta - log(pi_ref/pi_theta) - 1            (Schulman's k3 estimator)
    A_i      = (r_i - mean(r_1..r_G)) / std(r_1..r_G)

``loss_type="grpo"`` with the defaults is exactly that formula (``tests/grpo_core/test_loss.py`` checks it
against a loop-by-loop transcription). Switches for the variants practice has moved to, named as in TRL:

- ``epsilon_high`` > ``epsilon``: DAPO's clip-higher (Yu et al. 2025, eq. 10), an asymmetric clip range.
- ``loss_type``: ``dapo`` divides by the number of completion tokens (DAPO's token-level loss),
  ``dr_grpo`` by ``num_sequences * max_completion_length`` (Liu et al. 2025, "Dr. GRPO"), ``bnpo`` by the
  tokens of this micro-batch (TRL's batch-normalised variant).
- ``scale_rewards="none"``: Dr. GRPO drops the std from the advantage; ``"batch"``: one std for the batch.
- ``importance_sampling_level="sequence"``: GSPO (Zheng et al. 2025): one length-normalised ratio
  ``s_i = exp(mean_t(logp - logp_old))`` per sequence, in GSPO-token's stop-gradient form.

Sampler/trainer gap (TRL's ``vllm_importance_sampling_correction``; Yao et al. 2025, "Your efficient RL
framework secretly brings you off-policy RL training"): completions come from a sampler (vLLM, another
precision, stale weights) whose probabilities ``pi_sampler`` differ from the trainer's ``pi_old``. Each
token's policy term is multiplied by the truncated importance weight ``w = min(pi_old / pi_sampler, C)``
(``compute_sampling_correction``, passed to ``compute_policy_loss`` as ``importance_sampling_ratio``);
the KL term is not weighted, as in TRL.

Departures from the paper formula: the std gets ``+ eps`` (1e-4, as TRL) so constant-reward groups give
0 advantages instead of NaN; a group whose reward std is below that same ``eps`` is flat (``flat_groups``): its
advantages are 0, it counts in ``frac_reward_zero_std`` and DAPO dynamic sampling drops it, so float noise (a
reward model scoring the same text in two batches differs by ~1e-6) is not amplified into a signal;
``|o_i|`` is clamped to >= 1 so an empty completion contributes 0.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import Tensor

ScaleRewards = Literal["group", "batch", "none"]
LossType = Literal["grpo", "dapo", "dr_grpo", "bnpo"]
ImportanceSamplingLevel = Literal["token", "sequence"]
SamplingCorrectionMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
ADVANTAGE_EPS = 1e-4  # added to the group std (TRL); a group whose std is below it carries no advantage


def combine_rewards(rewards_per_func: Tensor, weights: Tensor | None = None) -> Tensor:
    """Weighted sum of several reward functions' scores: ``[B, R] -> [B]``.

    NaN marks a function that returned None for that completion (TRL's contract) and counts as 0 (``nansum``,
    as TRL does); a row where every function returned None therefore scores 0.
    """
    if weights is None:
        weights = torch.ones(rewards_per_func.shape[1], dtype=rewards_per_func.dtype)
    weights = weights.to(rewards_per_func)  # [R], or [B, R]: each row's own weights (a data mixture by source)
    return torch.nansum(rewards_per_func * (weights if weights.dim() == 2 else weights.unsqueeze(0)), dim=1)  # [B]


def flat_groups(rewards: Tensor, num_generations: int, eps: float = ADVANTAGE_EPS) -> Tensor:
    """``[P]`` whether each group of rewards ``[P*G]`` is flat: its std is below ``eps``, the advantage's own
    epsilon, so its differences are below the scale the advantage resolves (float noise, not signal)."""
    return rewards.view(-1, num_generations).std(dim=1) < eps  # [P], unbiased std as torch.std / TRL


def compute_group_advantages(
    rewards: Tensor, num_generations: int, scale_rewards: ScaleRewards = "group", eps: float = ADVANTAGE_EPS
) -> tuple[Tensor, dict[str, float]]:
    """Seed: ``A_i = (r_i - mean_group) / (std_group + eps)``; rewards ``[B]`` with each prompt's G completions contiguous.

    ``scale_rewards``: ``group`` (seed), ``batch`` (group mean, one std over the whole batch), ``none``
    (Dr. GRPO: no std). A flat group (``flat_groups``: std below ``eps``) gets 0 advantages whatever the
    scaling; ``frac_reward_zero_std`` is the share of completions in flat groups (no gradient from them).
    """
    grouped = rewards.view(-1, num_generations)  # [P, G]
    mean = grouped.mean(dim=1).repeat_interleave(num_generations)  # [B]
    group_std = grouped.std(dim=1).repeat_interleave(num_generations)  # [B], unbiased as torch.std / TRL
    flat = flat_groups(rewards, num_generations, eps).repeat_interleave(num_generations)  # [B]
    advantages = (rewards - mean).masked_fill(flat, 0.0)  # [B]
    if scale_rewards == "group":
        advantages = advantages / (group_std + eps)
    elif scale_rewards == "batch":
        advantages = advantages / (rewards.std() + eps)
    elif scale_rewards != "none":
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}")
    metrics = {
        "reward": rewards.mean().item(),
        "reward_std": rewards.std().item() if rewards.numel() > 1 else 0.0,
        "frac_reward_zero_std": flat.float().mean().item(),
    }
    return advantages, metrics


def compute_policy_loss(
    per_token_logps: Tensor,
    old_per_token_logps: Tensor | None,
    ref_per_token_logps: Tensor | None,
    advantages: Tensor,
    completion_mask: Tensor,
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    beta: float = 0.0,
    loss_type: LossType = "grpo",
    importance_sampling_level: ImportanceSamplingLevel = "token",
    max_completion_length: int | None = None,
    num_sequences: int | None = None,
    num_tokens: int | None = None,
    importance_sampling_ratio: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The clipped GRPO surrogate plus ``beta`` * k3 KL, aggregated by ``loss_type``; returns ``(loss, metrics)``.

    Tensors are ``[B, T]`` over completion tokens (``advantages`` is ``[B]``). ``old_per_token_logps=None``
    means on-policy (one optimisation pass): the ratio is 1 in value but the gradient still flows.
    ``num_sequences`` / ``num_tokens`` are the totals of the whole optimiser step (all micro-batches and
    ranks), so that summing the micro-batch losses gives the full-batch loss; by default this batch's own.
    ``importance_sampling_ratio`` (``[B, T]`` or ``[B, 1]``, no gradient): the sampler correction's weights
    (``compute_sampling_correction``), multiplying each token's policy term before the KL term is added.
    Metrics are floats over this batch; ``kl`` is 0.0 when ``beta == 0`` (nothing is computed).
    """
    mask = completion_mask.to(per_token_logps.dtype)  # [B, T]
    seq_lens = mask.sum(dim=1).clamp(min=1.0)  # [B], |o_i|
    num_sequences = per_token_logps.shape[0] if num_sequences is None else num_sequences
    num_tokens = mask.sum().clamp(min=1.0) if num_tokens is None else num_tokens
    eps_high = epsilon if epsilon_high is None else epsilon_high  # DAPO clip-higher when eps_high > eps
    if old_per_token_logps is None:
        old_per_token_logps = per_token_logps.detach()
    adv = advantages.unsqueeze(1)  # [B, 1]

    log_ratio = per_token_logps - old_per_token_logps  # [B, T]
    if importance_sampling_level == "sequence":
        # GSPO eq. (7)/(13): s_i = exp(1/|o_i| sum_t log_ratio); GSPO-token's form s_it = sg[s_i] * pi_t / sg[pi_t]
        # has the value s_i on every token and the sequence-level gradient s_i A_i / |o_i| sum_t grad log pi_t.
        log_seq = (log_ratio * mask).sum(dim=1, keepdim=True) / seq_lens.unsqueeze(1)  # [B, 1]
        log_ratio = log_seq.detach() + per_token_logps - per_token_logps.detach()  # [B, T]
    elif importance_sampling_level != "token":
        raise ValueError(f"importance_sampling_level must be 'token' or 'sequence', got {importance_sampling_level!r}")
    ratio = torch.exp(log_ratio)  # [B, T], seed's rho_it
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + eps_high)  # [B, T]
    per_token_loss = -torch.min(ratio * adv, clipped * adv)  # [B, T], seed: min(rho A, clip(rho) A)
    if importance_sampling_ratio is not None:  # TRL: w * policy term, KL unweighted
        per_token_loss = per_token_loss * importance_sampling_ratio.detach()  # [B, T]

    if beta != 0.0:
        if ref_per_token_logps is None:
            raise ValueError("beta != 0 needs ref_per_token_logps (or set beta=0 to train without a reference model)")
        delta = ref_per_token_logps - per_token_logps  # [B, T], log(pi_ref / pi_theta)
        per_token_kl = torch.exp(delta) - delta - 1  # [B, T], seed's D_KL: Schulman's k3, >= 0
        per_token_loss = per_token_loss + beta * per_token_kl  # seed: - beta D_KL inside the negated objective

    token_sum = per_token_loss * mask  # [B, T]
    if loss_type == "grpo":  # seed: 1/G sum_i 1/|o_i| sum_t
        loss = (token_sum.sum(dim=1) / seq_lens).sum() / num_sequences
    elif loss_type == "dapo":  # DAPO eq. (12): 1/sum_i |o_i| sum_i sum_t
        loss = token_sum.sum() / num_tokens
    elif loss_type == "dr_grpo":  # Dr. GRPO: a constant 1/(G * max_completion_length), no length bias
        if max_completion_length is None:
            raise ValueError("loss_type='dr_grpo' needs max_completion_length")
        loss = token_sum.sum() / (num_sequences * max_completion_length)
    elif loss_type == "bnpo":  # TRL: token mean of this micro-batch, scaled down by the number of micro-batches
        loss = token_sum.sum() / mask.sum().clamp(min=1.0) * (per_token_logps.shape[0] / num_sequences)
    else:
        raise ValueError(f"loss_type must be 'grpo', 'dapo', 'dr_grpo' or 'bnpo', got {loss_type!r}")

    with torch.no_grad():  # TRL's metrics: token means over completion tokens (sequence means for GSPO)
        def masked_mean(x: Tensor) -> float:
            return ((x * mask).sum() / mask.sum().clamp(min=1.0)).item()

        is_low = (ratio < 1 - epsilon) & (adv < 0)  # [B, T], the clip binds from below
        is_high = (ratio > 1 + eps_high) & (adv > 0)  # [B, T], the clip binds from above
        clip_mean = masked_mean if importance_sampling_level == "token" else lambda x: x[:, 0].mean().item()
        metrics = {
            "kl": masked_mean(per_token_kl) if beta != 0.0 else 0.0,
            "clip_ratio/low_mean": clip_mean(is_low.float()),
            "clip_ratio/high_mean": clip_mean(is_high.float()),
            "clip_ratio/region_mean": clip_mean((is_low | is_high).float()),
        }
    return loss, metrics


def compute_sampling_correction(
    old_per_token_logps: Tensor,
    sampling_per_token_logps: Tensor,
    completion_mask: Tensor,
    *,
    mode: SamplingCorrectionMode = "token_truncate",
    clip_min: float | None = None,
    clip_max: float | None = 2.0,
) -> tuple[Tensor, dict[str, float]]:
    """Importance weights ``pi_old / pi_sampler`` for the sampler/trainer gap, bounded by ``mode``; ``(weights, metrics)``.

    ``old_per_token_logps`` are the trainer's log-probs of the sampled tokens before the update,
    ``sampling_per_token_logps`` the sampler's, both ``[B, T]``. As TRL's ``vllm_importance_sampling_mode``:
    ``token_*`` gives one weight per token ``[B, T]``; ``sequence_*`` one per sequence ``[B, 1]``, the
    product of its token ratios (``exp(sum_t diff)``, not length-normalised). ``*_truncate`` clamps to
    ``[clip_min, clip_max]`` (Ionides' truncated IS: ``min(w, C)`` with the default ``clip_min=None``);
    ``*_mask`` sets weights outside the range to 0. Equal log-probs give weights of exactly 1.

    Metrics (TRL's names): ``sampling/sampling_logp_difference/{mean,max}`` of ``|old - sampler|`` over
    completion tokens, ``sampling/importance_sampling_ratio/{min,mean,max}`` over completion tokens
    (token modes) or sequences (sequence modes); 0.0 for an empty batch.
    """
    mask = completion_mask.to(old_per_token_logps.dtype)  # [B, T]
    diff = (old_per_token_logps - sampling_per_token_logps) * mask  # [B, T], log(pi_old / pi_sampler), 0 on padding
    granularity, bound = mode.split("_") if mode.count("_") == 1 else ("", "")
    if granularity == "sequence":
        diff = diff.sum(dim=1, keepdim=True)  # [B, 1], log prod_t pi_old / pi_sampler
    elif granularity != "token" or bound not in ("truncate", "mask"):
        raise ValueError("vllm_importance_sampling_mode must be 'token_truncate', 'token_mask', "
                         f"'sequence_truncate' or 'sequence_mask', got {mode!r}")
    weights = torch.exp(diff)  # [B, T] or [B, 1]
    if bound == "truncate":
        if clip_min is not None or clip_max is not None:
            weights = torch.clamp(weights, min=clip_min, max=clip_max)
    else:
        low = -math.inf if clip_min is None else clip_min
        high = math.inf if clip_max is None else clip_max
        weights = weights.masked_fill((weights < low) | (weights > high), 0.0)

    with torch.no_grad():
        on = mask.bool()  # [B, T]
        gap = (old_per_token_logps - sampling_per_token_logps).abs()[on]  # [tokens]
        flat = weights[on] if granularity == "token" else weights[:, 0]  # [tokens] or [B]

        def stat(x: Tensor, fn: Any) -> float:
            return float(fn(x)) if x.numel() else 0.0

        metrics = {
            "sampling/sampling_logp_difference/mean": stat(gap, torch.mean),
            "sampling/sampling_logp_difference/max": stat(gap, torch.max),
            "sampling/importance_sampling_ratio/min": stat(flat, torch.min),
            "sampling/importance_sampling_ratio/mean": stat(flat, torch.mean),
            "sampling/importance_sampling_ratio/max": stat(flat, torch.max),
        }
    return weights, metrics
