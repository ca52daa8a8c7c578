"""The GRPO objective against the seed's boxed formula (loops) and each variant against a hand-computed example."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from grpo_core.trainer.loss import combine_rewards, compute_group_advantages, compute_policy_loss

torch.set_num_threads(1)


def seed_loss_literal(logp, old, ref, rewards, lengths, G, eps, beta):
    """The seed's boxed L_GRPO written term by term: -E_q[1/G sum_i 1/|o_i| sum_t (min(rho A, clip(rho) A) - beta D_KL)].

    Scalars only, python loops over prompts q, completions i and tokens t; A_i = (r_i - mu) / (sigma + 1e-4) with
    the sample std (as torch.std / TRL; the seed writes sigma without saying which).
    """
    per_prompt = []
    for q in range(len(rewards) // G):
        group = [float(r) for r in rewards[q * G : (q + 1) * G]]
        mu, sigma = statistics.mean(group), statistics.stdev(group)
        total = 0.0
        for i in range(G):
            b = q * G + i
            A = (group[i] - mu) / (sigma + 1e-4)
            inner = 0.0
            for t in range(lengths[b]):
                rho = torch.exp(logp[b, t] - old[b, t])
                surrogate = torch.minimum(rho * A, torch.clamp(rho, 1 - eps, 1 + eps) * A)
                kl = 0.0
                if beta:
                    kl = torch.exp(ref[b, t] - logp[b, t]) - (ref[b, t] - logp[b, t]) - 1  # pi_ref/pi - log(pi_ref/pi) - 1
                inner = inner + (surrogate - beta * kl)
            total = total + inner / lengths[b]
        per_prompt.append(total / G)
    return -sum(per_prompt) / len(per_prompt)


def make_batch(seed: int, P: int = 3, G: int = 4, T: int = 7):
    gen = torch.Generator().manual_seed(seed)
    B = P * G
    lengths = torch.randint(1, T + 1, (B,), generator=gen).tolist()
    mask = torch.zeros(B, T)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    logp = (-torch.rand(B, T, generator=gen, dtype=torch.float64) * 3).requires_grad_()
    old = logp.detach() + 0.3 * torch.randn(B, T, generator=gen, dtype=torch.float64)  # ratios beyond the clip
    ref = logp.detach() + 0.5 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    rewards = torch.randint(0, 3, (B,), generator=gen).to(torch.float64)
    return logp, old, ref, rewards, mask, lengths, G


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vectorised_grpo_equals_seed_formula_with_gradients(beta, seed):
    logp, old, ref, rewards, mask, lengths, G = make_batch(seed)
    expected = seed_loss_literal(logp, old, ref, rewards, lengths, G, eps=0.2, beta=beta)
    (grad_expected,) = torch.autograd.grad(expected, logp)

    advantages, _ = compute_group_advantages(rewards, G)
    loss, metrics = compute_policy_loss(
        logp, old, ref if beta else None, advantages, mask, epsilon=0.2, beta=beta, loss_type="grpo"
    )
    (grad,) = torch.autograd.grad(loss, logp)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    torch.testing.assert_close(grad, grad_expected, atol=1e-6, rtol=0)
    assert (grad[mask == 0] == 0).all()  # padding gets no gradient
    assert metrics["clip_ratio/region_mean"] > 0  # the random ratios do reach the clip


def test_on_policy_old_none_is_ratio_one_with_gradient():
    logp, _, _, rewards, mask, lengths, G = make_batch(3)
    advantages, _ = compute_group_advantages(rewards, G)
    loss, metrics = compute_policy_loss(logp, None, None, advantages, mask)
    expected = seed_loss_literal(logp, logp.detach(), None, rewards, lengths, G, eps=0.2, beta=0.0)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-9)
    (grad,) = torch.autograd.grad(loss, logp)
    # d/dlogp of -1/B * A_i/|o_i| * exp(logp - sg(logp)) = -A_i / (B |o_i|)
    lens = mask.sum(1)
    torch.testing.assert_close(grad, -(advantages / lens / len(lens)).unsqueeze(1) * mask, atol=1e-12, rtol=0)
    assert metrics["clip_ratio/region_mean"] == 0.0


# ---- hand-computed examples, one per variant --------------------------------------------------------------


def ratio_one_batch():
    """On-policy (ratio 1), A = [1, -1], lengths [1, 3] out of T = 4: per-token losses -A_i = [-1], [1, 1, 1]."""
    logp = torch.full((2, 4), -1.0, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0]], dtype=torch.float64)
    return logp, torch.tensor([1.0, -1.0], dtype=torch.float64), mask


@pytest.mark.parametrize(
    "loss_type, expected_loss, grad_row0, grad_row1",
    [
        # grpo: 1/2 (-1/1 + 3/3) = 0; grad -A_i / (G |o_i|): row0 -1/2, row1 +1/6
        ("grpo", 0.0, -0.5, 1 / 6),
        # dapo: (-1 + 3) / 4 tokens = 0.5; grad -A_i / 4
        ("dapo", 0.5, -0.25, 0.25),
        # dr_grpo: (-1 + 3) / (2 sequences * max_completion_length 4) = 0.25; grad -A_i / 8
        ("dr_grpo", 0.25, -0.125, 0.125),
        # bnpo: token mean of this batch, (-1 + 3) / 4 = 0.5
        ("bnpo", 0.5, -0.25, 0.25),
    ],
)
def test_loss_type_aggregation_hand_computed(loss_type, expected_loss, grad_row0, grad_row1):
    logp, adv, mask = ratio_one_batch()
    loss, _ = compute_policy_loss(logp, None, None, adv, mask, loss_type=loss_type, max_completion_length=4)
    assert loss.item() == pytest.approx(expected_loss, abs=1e-12)
    (grad,) = torch.autograd.grad(loss, logp)
    expected = torch.tensor([[grad_row0, 0, 0, 0], [grad_row1] * 3 + [0]], dtype=torch.float64)
    torch.testing.assert_close(grad, expected, atol=1e-12, rtol=0)


def test_clip_higher_hand_computed():
    # ratios [[1.3, 1.1], [0.7, 1.5]], A = [1, -1], eps = 0.2
    ratios = torch.tensor([[1.3, 1.1], [0.7, 1.5]], dtype=torch.float64)
    old = torch.full((2, 2), -2.0, dtype=torch.float64)
    logp = (old + ratios.log()).requires_grad_()
    adv, mask = torch.tensor([1.0, -1.0], dtype=torch.float64), torch.ones(2, 2)

    # DAPO clip-higher eps_high = 0.28: row0 min(1.3, 1.28) = 1.28, min(1.1, 1.1) = 1.1 -> mean 1.19
    #   row1 (A=-1) min(-0.7, -0.8) = -0.8, min(-1.5, -1.28) = -1.5 -> mean -1.15;  loss = -(1.19 - 1.15)/2 = -0.02
    loss, m = compute_policy_loss(logp, old, None, adv, mask, epsilon=0.2, epsilon_high=0.28)
    assert loss.item() == pytest.approx(-0.02, abs=1e-12)
    # low: ratio 0.7 < 0.8 with A<0 (1 of 4); high: 1.3 > 1.28 with A>0 (1 of 4); 1.5 with A<0 is not clipped
    assert (m["clip_ratio/low_mean"], m["clip_ratio/high_mean"], m["clip_ratio/region_mean"]) == (0.25, 0.25, 0.5)
    (grad,) = torch.autograd.grad(loss, logp)
    # clipped tokens: 0; others -(1/2)(1/2) * rho * A: row0 tok1 -0.275, row1 tok1 +0.375
    torch.testing.assert_close(grad, torch.tensor([[0.0, -0.275], [0.0, 0.375]], dtype=torch.float64), atol=1e-12, rtol=0)

    # symmetric eps_high = eps = 0.2: row0 min(1.3, 1.2) = 1.2, 1.1 -> 1.15; row1 -1.15; loss = 0
    loss_sym, _ = compute_policy_loss(logp, old, None, adv, mask, epsilon=0.2)
    assert loss_sym.item() == pytest.approx(0.0, abs=1e-12)


def test_gspo_sequence_level_hand_computed():
    # row0: log-ratios [0.1, -0.1] -> s = exp(0) = 1, A = 2 -> 2 (unclipped)
    # row1: log-ratios [0.5, 0.3, 0.1] -> s = exp(0.3) = 1.3498588, A = -1 -> min(-1.3498588, -1.2) = -1.3498588
    # loss = -(2 - 1.3498588) / 2 = -0.3250706   (token level: -(mean(2e^0.1, 2e^-0.1) - mean(e^0.5, e^0.3, e^0.1)) / 2
    #  = -(2.0100083 - 1.3679170) / 2 = -0.3210457, a different number)
    log_ratio = torch.tensor([[0.1, -0.1, 0.0], [0.5, 0.3, 0.1]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.float64)
    old = torch.full((2, 3), -1.5, dtype=torch.float64)
    logp = (old + log_ratio).requires_grad_()
    adv = torch.tensor([2.0, -1.0], dtype=torch.float64)
    loss, m = compute_policy_loss(logp, old, None, adv, mask, importance_sampling_level="sequence")
    assert loss.item() == pytest.approx(-(2 - math.exp(0.3)) / 2, abs=1e-12)
    assert loss.item() == pytest.approx(-0.3250706, abs=1e-7)
    token_loss, _ = compute_policy_loss(logp, old, None, adv, mask)
    assert token_loss.item() == pytest.approx(-0.3210457, abs=1e-7)
    # GSPO gradient: -(1/G) s_i A_i / |o_i| on every token: row0 -(1/2)(1)(2)/2 = -0.5; row1 +(1/2)e^0.3/3 = 0.2249765
    (grad,) = torch.autograd.grad(loss, logp)
    expected = torch.tensor([[-0.5, -0.5, 0.0], [math.exp(0.3) / 6] * 3], dtype=torch.float64)
    torch.testing.assert_close(grad, expected, atol=1e-12, rtol=0)
    assert m["clip_ratio/region_mean"] == 0.0  # s = 1.35 > 1.2 but A < 0: not clipped


def test_gspo_matches_paper_sequence_objective_gradient():
    """GSPO eq. (5): -1/G sum_i min(s_i A_i, clip(s_i) A_i), s_i = exp(mean_t log-ratio) with gradient through s_i."""
    logp, old, _, rewards, mask, _, G = make_batch(4)
    adv, _ = compute_group_advantages(rewards, G)
    for loss_type in ("grpo", "dapo"):
        loss, _ = compute_policy_loss(logp, old, None, adv, mask, importance_sampling_level="sequence", loss_type=loss_type)
        (grad,) = torch.autograd.grad(loss, logp)
        s = torch.exp(((logp - old) * mask).sum(1) / mask.sum(1))  # [B]
        paper = -torch.min(s * adv, torch.clamp(s, 0.8, 1.2) * adv)  # [B]
        if loss_type == "dapo":  # TRL's sequence-level dapo: the sequence term repeated on each of its tokens
            paper = paper * mask.sum(1) * len(adv) / mask.sum()
        (grad_paper,) = torch.autograd.grad(paper.mean(), logp)
        assert loss.item() == pytest.approx(paper.mean().item(), abs=1e-12)
        torch.testing.assert_close(grad, grad_paper, atol=1e-12, rtol=0)


def test_k3_kl_hand_computed():
    # pi = 0.5, pi_ref = 0.25: k3 = 0.25/0.5 - log(0.5) - 1 = 0.5 + 0.6931472 - 1 = 0.1931472
    logp = torch.tensor([[math.log(0.5)]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[math.log(0.25)]], dtype=torch.float64)
    loss, m = compute_policy_loss(logp, None, ref, torch.zeros(1, dtype=torch.float64), torch.ones(1, 1), beta=0.1)
    assert m["kl"] == pytest.approx(0.1931472, abs=1e-7)
    assert loss.item() == pytest.approx(0.01931472, abs=1e-8)  # A = 0: only beta * k3 remains
    (grad,) = torch.autograd.grad(loss, logp)
    assert grad.item() == pytest.approx(0.1 * (1 - 0.5), abs=1e-12)  # d k3 / d logp = 1 - pi_ref/pi


def test_beta_zero_needs_no_reference():
    logp, adv, mask = ratio_one_batch()
    loss, m = compute_policy_loss(logp, None, None, adv, mask, beta=0.0)
    assert torch.isfinite(loss) and m["kl"] == 0.0
    with pytest.raises(ValueError, match="ref_per_token_logps"):
        compute_policy_loss(logp, None, None, adv, mask, beta=0.1)


def test_group_advantages_hand_computed():
    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1])  # G = 4
    # group0: mean 0.25, sample std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5; group1: std 0
    adv, m = compute_group_advantages(rewards, 4, "group")
    torch.testing.assert_close(adv, torch.tensor([0.75 / 0.5001] + [-0.25 / 0.5001] * 3 + [0.0] * 4))
    assert m["frac_reward_zero_std"] == 0.5  # group1's four completions
    assert m["reward"] == pytest.approx(0.625)
    # batch std: sum of squares 5 * 0.375^2 + 3 * 0.625^2 = 1.875; sqrt(1.875 / 7) = 0.5175492
    assert m["reward_std"] == pytest.approx(0.5175492, abs=1e-6)

    adv_b, m_b = compute_group_advantages(rewards, 4, "batch")  # group mean, batch std
    torch.testing.assert_close(adv_b, torch.tensor([0.75 / 0.5176492] + [-0.25 / 0.5176492] * 3 + [0.0] * 4))
    adv_n, m_n = compute_group_advantages(rewards, 4, "none")  # Dr. GRPO: r - mean only
    torch.testing.assert_close(adv_n, torch.tensor([0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0]))
    assert m_b["frac_reward_zero_std"] == m_n["frac_reward_zero_std"] == 0.5


def test_reward_model_float_noise_is_a_flat_group_for_advantages_and_dynamic_sampling():
    """A reward model scoring one text in two batches (other padding, other kernels) gives float32 scores that
    differ by ~1e-6: that group is flat. Dynamic sampling keeps a group exactly when its advantages are non-zero,
    and it counts in frac_reward_zero_std, for every scaling."""
    from grpo_core.trainer.rollouts import informative_groups

    G = 8
    gen = torch.Generator().manual_seed(0)
    noisy = (4.998 + 2e-6 * torch.randn(G, generator=gen)).float()  # [G] one answer, scored in other batches
    real = torch.tensor([4.998, 1.2, 4.998, -0.7, 2.5, 4.998, 0.3, 1.1])  # [G] answers the model tells apart
    rewards = torch.cat([noisy, real])  # [2G]
    assert noisy.std() > 1e-8  # not exactly equal: a tolerance of 1e-8 took this group for signal
    assert informative_groups(rewards, G) == [1]
    for scale in ("group", "batch", "none"):
        adv, m = compute_group_advantages(rewards, G, scale)
        assert torch.equal(adv[:G], torch.zeros(G)) and bool((adv[G:] != 0).all()), scale
        assert m["frac_reward_zero_std"] == 0.5, scale
    kept = [g for g in range(2) if bool((compute_group_advantages(rewards, G)[0].view(2, G)[g] != 0).any())]
    assert informative_groups(rewards, G) == kept


def test_combine_rewards_weights_and_none():
    per_func = torch.tensor([[1.0, float("nan")], [0.5, 1.0]])
    # row0: 2*1 + (None -> 0) = 2; row1: 2*0.5 + 0.5*1 = 1.5
    torch.testing.assert_close(combine_rewards(per_func, torch.tensor([2.0, 0.5])), torch.tensor([2.0, 1.5]))
    torch.testing.assert_close(combine_rewards(per_func), torch.tensor([1.0, 1.5]))


# ---- micro-batches with global normalisers sum to the full-batch loss --------------------------------------


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_micro_batch_losses_sum_to_full_batch(loss_type, level):
    logp, old, ref, rewards, mask, _, G = make_batch(5, P=4, G=2)
    adv, _ = compute_group_advantages(rewards, G)
    kw = dict(beta=0.04, loss_type=loss_type, importance_sampling_level=level, max_completion_length=7)
    full, _ = compute_policy_loss(logp, old, ref, adv, mask, **kw)
    (g_full,) = torch.autograd.grad(full, logp)
    total = 0.0
    for s in (slice(0, 3), slice(3, 4), slice(4, 8)):  # uneven micro-batches with uneven token counts
        part, _ = compute_policy_loss(
            logp[s], old[s], ref[s], adv[s], mask[s], num_sequences=8, num_tokens=int(mask.sum()), **kw
        )
        total = total + part
    (g_sum,) = torch.autograd.grad(total, logp)
    assert total.item() == pytest.approx(full.item(), abs=1e-12)
    torch.testing.assert_close(g_sum, g_full, atol=1e-12, rtol=0)


def test_bnpo_micro_batches_sum_when_token_counts_match():
    # bnpo normalises by this micro-batch's tokens (TRL); with equal token counts per micro-batch the sum matches
    logp, adv, mask = ratio_one_batch()
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0]], dtype=torch.float64)
    full, _ = compute_policy_loss(logp, None, None, adv, mask, loss_type="bnpo")
    parts = [compute_policy_loss(logp[[i]], None, None, adv[[i]], mask[[i]], loss_type="bnpo", num_sequences=2)[0] for i in (0, 1)]
    # full: (-1 -1 +1 +1) / 4 = 0; parts: -1/2 * 1/2 + 1/2 * 1/2 = 0
    assert full.item() == pytest.approx(0.0) and sum(parts).item() == pytest.approx(0.0)
    assert parts[0].item() == pytest.approx(-0.5)  # (-1 - 1) / 2 tokens, times 1 of 2 sequences
