"""The transformers rollout backend: seeds independent of batching, greedy == generate, filters."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_core.generation import Rollout, make_backend
from grpo_core.generation.base import GenerationRequest
from grpo_core.generation.hf import HFBackend, filter_logits
from grpo_core.models.tiny import build_tiny_model

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=64, num_layers=2, num_heads=4)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    return path, model, tokenizer


def _prompts(tokenizer) -> list[list[int]]:
    texts = ["7+8*3-5=", "2+2=", "9*9-1+4=", "1="]
    return [[tokenizer.bos_token_id] + tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def test_completion_depends_only_on_its_seed(tiny):
    _, model, tokenizer = tiny
    backend = HFBackend(model, tokenizer)
    prompts = _prompts(tokenizer)
    n = 3
    seeds = [1000 + i for i in range(len(prompts) * n)]
    full = backend.generate(prompts, GenerationRequest(n=n, max_tokens=12, seeds=seeds))
    assert len(full) == len(prompts) * n
    assert [r.prompt_ids for r in full] == [p for p in prompts for _ in range(n)]
    # The same completions come back from a different batch: reordered, subset, one at a time.
    order = [2, 0]
    sub = backend.generate(
        [prompts[i] for i in order], GenerationRequest(n=n, max_tokens=12,
        seeds=[seeds[i * n + j] for i in order for j in range(n)]),
    )
    expected = [full[i * n + j] for i in order for j in range(n)]
    assert [r.completion_ids for r in sub] == [r.completion_ids for r in expected]
    for a, b in zip(sub, expected):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
    single = backend.generate([prompts[3]], GenerationRequest(n=1, max_tokens=12, seeds=[seeds[3 * n + 1]]))
    assert single[0].completion_ids == full[3 * n + 1].completion_ids
    # Different seeds give different completions (a random tiny model is close to uniform over 264 tokens).
    assert len({tuple(r.completion_ids) for r in full}) == len(full)


def test_greedy_equals_transformers_generate(tiny):
    _, model, tokenizer = tiny
    backend = HFBackend(model, tokenizer)
    prompts = _prompts(tokenizer)
    ours = backend.generate(prompts, GenerationRequest(n=1, max_tokens=16, greedy=True))
    length = max(map(len, prompts))
    ids = torch.tensor([[tokenizer.pad_token_id] * (length - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (length - len(p)) + [1] * len(p) for p in prompts])
    ref = model.generate(
        input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=16,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )[:, length:]
    for r, row in zip(ours, ref.tolist()):
        assert r.completion_ids == row[: len(r.completion_ids)]
        if r.truncated:
            assert len(r.completion_ids) == 16
        else:
            assert r.completion_ids[-1] == tokenizer.eos_token_id


def test_logprobs_are_the_models_tempered_logprobs(tiny):
    _, model, tokenizer = tiny
    backend = HFBackend(model, tokenizer)
    prompt = _prompts(tokenizer)[0]
    temperature = 0.7
    (r,) = backend.generate([prompt], GenerationRequest(n=1, max_tokens=10, temperature=temperature, seeds=[5]))
    ids = torch.tensor([prompt + r.completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / temperature  # [T, V]
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r.completion_ids)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(r.logprobs), expected, atol=1e-5, rtol=0)


def test_top_k_frequencies_follow_renormalised_probs(tiny):
    _, model, tokenizer = tiny
    backend = HFBackend(model, tokenizer)
    prompt = _prompts(tokenizer)[1]
    num = 2000
    request = GenerationRequest(n=num, max_tokens=1, temperature=0.05, top_k=2, seeds=list(range(num)))
    out = backend.generate([prompt], request)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt])).logits[0, -1] / 0.05
    top = torch.topk(logits, 2)
    probs = torch.softmax(top.values, -1)
    first = [r.completion_ids[0] for r in out]
    assert set(first) <= set(top.indices.tolist())
    freq = sum(t == top.indices[0].item() for t in first) / num
    assert abs(freq - probs[0].item()) < 0.04  # 4 sigma of a binomial with n=2000 is <= 0.045


def test_filter_logits_top_p_keeps_the_nucleus():
    scores = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(filter_logits(scores, 0, 0.7))
    assert kept.tolist() == [[True, True, False, False]]
    kept = torch.isfinite(filter_logits(scores, 0, 0.1))
    assert kept.tolist() == [[True, False, False, False]]
    kept = torch.isfinite(filter_logits(scores, 3, 1.0))
    assert kept.tolist() == [[True, True, True, False]]


def test_eos_stops_and_truncation_flag(tiny):
    path, model, tokenizer = tiny
    # Make EOS the only token the model can emit after the first: a model whose lm_head favours EOS.
    backend = make_backend("hf", str(path), model=model, tokenizer=tokenizer)
    prompts = _prompts(tokenizer)[:2]
    eos = tokenizer.eos_token_id
    with torch.no_grad():
        bias = torch.zeros(model.config.vocab_size)
        bias[eos] = 1e4
        handle = model.lm_head.register_forward_hook(lambda m, i, o: o + bias)
    try:
        out = backend.generate(prompts, GenerationRequest(n=2, max_tokens=5, seeds=[1, 2, 3, 4]))
    finally:
        handle.remove()
    assert all(isinstance(r, Rollout) for r in out)
    assert all(r.completion_ids == [eos] and not r.truncated and r.text == "" for r in out)
    out = backend.generate(prompts, GenerationRequest(n=1, max_tokens=3, seeds=[7, 8]))
    for r in out:
        assert r.truncated == (eos not in r.completion_ids)
        assert len(r.completion_ids) <= 3
        assert r.text == tokenizer.decode([t for t in r.completion_ids if t != eos], skip_special_tokens=True)
