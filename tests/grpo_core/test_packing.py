"""Packed, padding-free micro-batches (``grpo_core/trainer/packing.py``): the same numbers as padded batches.

A packed forward must give each row exactly what the row alone gives (position ids restart, attention stays in
the row), and the SFT and GRPO passes built on it the same loss and gradients as padded micro-batches, for every
GRPO loss_type, with and without a token budget. fp64 models, so the tolerances are tight (fp32 where the
GRPO loss itself computes in fp32).
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_core.config import GRPOConfig, SFTConfig
from grpo_core.models.tiny import build_tiny_model
from grpo_core.trainer.distributed import DistContext
from grpo_core.trainer.logprobs import compute_packed_logps, compute_token_logps
from grpo_core.trainer.packing import PADDING_FREE_ATTENTION, enable_padding_free, pack_rows, token_budget_batches
from grpo_core.trainer.sft import IGNORE_INDEX, _accumulate_gradients
from grpo_core.trainer.update import TrainBatch, optimise

torch.set_num_threads(1)
CPU = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
LENGTHS = [23, 4, 11, 2, 17, 7]  # mixed: a 10x spread


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request, tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp(request.param), hidden_size=32, num_layers=2, num_heads=2,
                            architecture=request.param)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa").double()
    with torch.no_grad():  # larger logits than the 0.02-std init: log-probs differ visibly across tokens
        model.get_output_embeddings().weight.mul_(20)
    return model


def _rows(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(4, 260, (n,), generator=gen) for n in LENGTHS]


@pytest.mark.parametrize("attention", [PADDING_FREE_ATTENTION, "sdpa", "eager"])
def test_packed_hidden_states_equal_each_row_alone(model, attention):
    """The packed sequence's hidden states, row by row, are the row's own: per-row SDPA (ours) and transformers'
    block-diagonal mask from the restarting position ids (sdpa, eager) alike."""
    model = copy.deepcopy(model)
    model.config._attn_implementation = attention
    rows = _rows()
    packed = pack_rows(rows, [torch.arange(1, len(r)) for r in rows])
    decoder = model.get_decoder()
    with torch.no_grad():
        hidden = decoder(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False
                         ).last_hidden_state[0]  # [S, H]
        offset = 0
        for row in rows:
            alone = decoder(input_ids=row[None, :-1], use_cache=False).last_hidden_state[0]  # [L-1, H]
            # eager's softmax runs in fp32 (transformers), hence fp32-level tolerances; a leak moves values ~1e-1
            torch.testing.assert_close(hidden[offset: offset + len(alone)], alone, rtol=1e-6, atol=1e-7)
            offset += len(alone)


def test_per_row_attention_gradients_are_the_sliced_rows_bit_for_bit():
    """padding_free_sdpa splits q/k/v into the rows (one cat in backward) instead of slicing each row out (a slice's
    backward fills a zero tensor of the whole sequence per row): the outputs and q/k/v gradients are those of SDPA
    on each slice, bit for bit, and the graph holds no per-row slice."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from grpo_core.trainer.packing import padding_free_sdpa

    class Attention(torch.nn.Module):
        is_causal = True

    module, gen = Attention(), torch.Generator().manual_seed(0)
    lengths = [int(n) for n in torch.randint(1, 30, (12,), generator=gen)]
    S = sum(lengths)
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]  # [1, S] restarting at each row
    q, k, v = (torch.randn(1, 2, S, 8, generator=gen, requires_grad=True) for _ in range(3))  # [1, h, S, d]
    weight = torch.randn(1, S, 2, 8, generator=gen)
    out, _ = padding_free_sdpa(module, q, k, v, None, position_ids=position_ids)  # [1, S, h, d]
    names, stack = set(), [out.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is not None and type(fn).__name__ not in names:
            names.add(type(fn).__name__)
            stack += [f for f, _ in fn.next_functions]
    assert "SliceBackward0" not in names and "SplitWithSizesBackward0" in names, names
    grads = torch.autograd.grad((out * weight).sum(), (q, k, v))
    bounds = [0] + torch.tensor(lengths).cumsum(0).tolist()
    ref = torch.cat([sdpa_attention_forward(module, q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], None)[0]
                     for a, b in zip(bounds[:-1], bounds[1:])], dim=1)
    assert torch.equal(out, ref)
    for got, want in zip(grads, torch.autograd.grad((ref * weight).sum(), (q, k, v))):
        assert torch.equal(got, want)


def test_packed_logps_equal_the_padded_pass(model):
    """compute_packed_logps on mixed lengths = compute_token_logps on the right-padded batch, per scored token."""
    rows = _rows(1)
    length = max(len(r) for r in rows)
    input_ids = torch.zeros(len(rows), length, dtype=torch.long)  # [B, L] right-padded
    mask = torch.zeros_like(input_ids)
    for i, r in enumerate(rows):
        input_ids[i, : len(r)], mask[i, : len(r)] = r, 1
    padded, _ = compute_token_logps(model, input_ids, mask, length - 1)  # [B, L-1] scores tokens 1..L-1
    packed = pack_rows(rows, [torch.arange(1, len(r)) for r in rows])
    logps, _ = compute_packed_logps(model, packed)  # [K]
    got = packed.unpack(logps, len(rows), length - 1)  # [B, L-1]
    torch.testing.assert_close(got, padded * mask[:, 1:], rtol=1e-9, atol=1e-10)


def test_the_swap_leaves_padded_and_cached_calls_alone(model):
    """enable_padding_free stays on the model: padded batches and generation with a cache must see the masks
    transformers builds for them, as before the swap."""
    plain, swapped = copy.deepcopy(model), copy.deepcopy(model)
    plain.config._attn_implementation = "sdpa"
    enable_padding_free(swapped)
    assert swapped.config._attn_implementation == PADDING_FREE_ATTENTION
    rows = _rows(4)[:3]
    length = max(len(r) for r in rows)
    input_ids = torch.zeros(3, length, dtype=torch.long)  # [B, L] left-padded, as the samplers pad prompts
    mask = torch.zeros_like(input_ids)
    for i, r in enumerate(rows):
        input_ids[i, length - len(r):], mask[i, length - len(r):] = r, 1
    with torch.no_grad():
        want, got = (m(input_ids=input_ids, attention_mask=mask).logits for m in (plain, swapped))
        torch.testing.assert_close(got * mask[..., None], want * mask[..., None], rtol=1e-9, atol=1e-9)
        kwargs = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
        torch.testing.assert_close(swapped.generate(input_ids, **kwargs), plain.generate(input_ids, **kwargs))


def test_token_budget_batches_keep_order_and_budget():
    assert token_budget_batches([5, 6, 7, 8, 9], [3, 4, 10, 2, 2], 7) == [[5, 6], [7], [8, 9]]  # 10 > 7 alone
    assert token_budget_batches([], [], 7) == []


def test_max_tokens_per_batch_needs_padding_free_and_not_bnpo():
    with pytest.raises(ValueError, match="set padding_free: true"):
        SFTConfig(max_tokens_per_batch=64)
    with pytest.raises(ValueError, match="bnpo"):
        GRPOConfig(padding_free=True, max_tokens_per_batch=64, loss_type="bnpo")
    assert GRPOConfig(padding_free=True, loss_type="bnpo").max_tokens_per_batch is None


# --- SFT: _accumulate_gradients padded vs packed ---


def _sft_rows() -> list[tuple[list[int], list[int]]]:
    out = []
    for i, row in enumerate(_rows(2)):
        prompt = 1 + i % 3  # label -100 on the prompt tokens
        ids = row.tolist()
        out.append((ids, [IGNORE_INDEX] * prompt + ids[prompt:]))
    return out


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("packing", [dict(padding_free=True), dict(padding_free=True, max_tokens_per_batch=24)])
def test_sft_packed_loss_and_gradients_equal_padded(model, packing, packed_calls):
    results = []
    for extra in ({}, packing):
        m = copy.deepcopy(model)
        config = SFTConfig(per_device_train_batch_size=2, group_by_length=False, report_to=[], **extra)
        loss, tokens = _accumulate_gradients(m, _sft_rows(), 0, config, CPU)
        results.append((loss, tokens, _grads(m)))
        assert bool(packed_calls) == bool(extra)  # the padded run packs nothing
    (loss, tokens, grads), (packed_loss, packed_tokens, packed_grads) = results
    # fed lengths 22, 3, 10, 1, 16, 6: 3 micro-batches of 2 rows, or by the 24-token budget [22] [3 10 1] [16 6]
    assert packed_calls == ([2, 2, 2] if "max_tokens_per_batch" not in packing else [1, 3, 2])
    assert tokens == packed_tokens and loss == pytest.approx(packed_loss, rel=1e-10)
    assert grads.keys() == packed_grads.keys() and grads
    for name in grads:
        torch.testing.assert_close(packed_grads[name], grads[name], rtol=1e-7, atol=1e-10)


# --- GRPO: optimise() padded vs packed, old and reference passes included ---


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps each step's gradients, to compare the passes' gradients update by update."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.recorded: list[list[torch.Tensor]] = []

    def step(self, closure=None):
        self.recorded.append([p.grad.clone() for g in self.param_groups for p in g["params"] if p.grad is not None])
        return super().step(closure)


def _grpo_batch() -> TrainBatch:
    """3 prompts (lengths 5, 2, 8, left-padded) x G=2, completions of 1-20 tokens, sampler log-probs set."""
    gen = torch.Generator().manual_seed(3)
    prompt_lens, completion_lens = [5, 5, 2, 2, 8, 8], [20, 3, 1, 12, 7, 16]
    lp, tc = max(prompt_lens), max(completion_lens)
    prompts = [torch.randint(4, 260, (n,), generator=gen) for n in prompt_lens[::2]]
    prompt_ids, prompt_mask = torch.zeros(6, lp, dtype=torch.long), torch.zeros(6, lp, dtype=torch.long)
    completion_ids, completion_mask = torch.zeros(6, tc, dtype=torch.long), torch.zeros(6, tc, dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompt_lens, completion_lens)):
        prompt_ids[i, lp - p:], prompt_mask[i, lp - p:] = prompts[i // 2], 1
        completion_ids[i, :c], completion_mask[i, :c] = torch.randint(4, 260, (c,), generator=gen), 1
    sampling = (-1.0 - torch.rand(6, tc, generator=gen, dtype=torch.float64)) * completion_mask  # [6, tc]
    advantages = torch.tensor([1.0, -1.0, 0.7, -0.7, -0.3, 0.3], dtype=torch.float64)
    return TrainBatch(prompt_ids, prompt_mask, completion_ids, completion_mask, completion_mask.clone(), advantages,
                      sampling)


@pytest.fixture
def packed_calls(monkeypatch):
    """Counts the packed forwards, so a test sees that its packed run took the packed path."""
    import grpo_core.trainer.sft as sft
    import grpo_core.trainer.update as update

    calls = []

    def counting(*args, **kwargs):
        calls.append(args[1].rows.max().item() + 1)  # rows in the packed micro-batch
        return compute_packed_logps(*args, **kwargs)

    monkeypatch.setattr(update, "compute_packed_logps", counting)
    monkeypatch.setattr(sft, "compute_packed_logps", counting)
    return calls


def _optimise(model, ref_model, config: GRPOConfig) -> tuple[dict, list[list[torch.Tensor]]]:
    model = copy.deepcopy(model)
    optimizer = RecordingSGD(model.parameters(), lr=0.5)  # large enough that the second pass's ratios move off 1
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    metrics = optimise(model, ref_model, optimizer, scheduler, _grpo_batch(), config, CPU, sampling_correction=True)
    return metrics, optimizer.recorded


GRPO_CASES = [dict(loss_type="grpo"), dict(loss_type="dapo"), dict(loss_type="dr_grpo"), dict(loss_type="bnpo"),
              dict(loss_type="grpo", importance_sampling_level="sequence")]


@pytest.mark.parametrize("case", GRPO_CASES, ids=lambda c: "-".join(map(str, c.values())))
@pytest.mark.parametrize("budget", [None, 30])
def test_grpo_packed_loss_and_gradients_equal_padded(model, case, budget, packed_calls):
    """Two passes (num_iterations=2: old log-probs), beta > 0 (reference pass), the sampler correction: every
    forward packed, the same step loss and gradients as the padded passes (which share each prompt's forward)."""
    if budget is not None and case["loss_type"] == "bnpo":
        pytest.skip("bnpo refuses a token budget (GRPOConfig)")
    ref_model = copy.deepcopy(model)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in ref_model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    base = dict(num_generations=2, generation_batch_size=6, per_device_train_batch_size=2, max_completion_length=20,
                beta=0.04, epsilon=0.05, num_iterations=2, max_grad_norm=1e9, **case)
    padded, padded_grads = _optimise(model, ref_model, GRPOConfig(**base))
    assert not packed_calls
    packed, packed_grads = _optimise(model, ref_model, GRPOConfig(**base, padding_free=True,
                                                                  max_tokens_per_batch=budget))
    # old, reference and 2 training passes, each over the micro-batches: 3 of 2 rows, or by the 30-token budget
    # (fed lengths 24, 7, 2, 13, 14, 23 -> [24] [7 2 13] [14] [23])
    assert packed_calls == ([2, 2, 2] if budget is None else [1, 3, 1, 1]) * 4
    # the loss runs in fp32 (update.py: logps.float()), so fp32 tolerances from here on
    assert packed["loss"] == pytest.approx(padded["loss"], rel=1e-5, abs=1e-8)
    assert packed["kl"] == pytest.approx(padded["kl"], rel=1e-5) and padded["kl"] > 0
    assert len(packed_grads) == len(padded_grads) == 2
    for update_packed, update_padded in zip(packed_grads, padded_grads):
        for got, want in zip(update_packed, update_padded, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-8)
