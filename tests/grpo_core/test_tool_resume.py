"""Exact resume with tool rollouts (issue 43): a GRPO run whose rollouts are multi-turn trajectories, SIGKILLed at
arbitrary points and resumed, ends bit-identical to one that never stopped (every turn's seed, the tool turns and
their masks come back the same).

The child process is this file run as a script: ``python tests/grpo_core/test_tool_resume.py MODEL_DIR OUTPUT_DIR``.
The tiny model is random but nudged to write the tool tags (``tool_calling_model``): about half its trajectories call
the calculator, which answers each call with an error turn (a random model writes no JSON), and the model goes on in
a later turn with that turn's own seed; the test checks that the run holds such turns.
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the child: this checkout importable

from tests.grpo_core.run_helpers import assert_same_final_weights, child_env, kill_after_line, read_metrics  # noqa: E402
from tests.grpo_core.test_trainer_resume import ROWS, SlowSteps, digit_fraction  # noqa: E402

MAX_STEPS = 6


def tool_config(asynchronous: bool = False):
    from grpo_core.config import GRPOConfig

    # State across steps as in test_trainer_resume (reference model, Adam moments, warmup + cosine), and the tools
    return GRPOConfig(
        max_steps=MAX_STEPS, generation_batch_size=12, per_device_train_batch_size=6, learning_rate=5e-3, beta=0.04,
        num_iterations=2, steps_per_generation=2, lr_scheduler_type="cosine", warmup_steps=2, save_steps=2,
        save_total_limit=2, seed=11, report_to=["jsonl"], torch_num_threads=1,
        sampling={"num_generations": 4, "max_prompt_length": 16, "max_completion_length": 200, "use_vllm": False,
                  "tools": ["calculator"], "max_turns": 3},
        **({"async_rollouts": True, "async_sampler_threads": 1} if asynchronous else {}))


def tool_calling_model(path: Path) -> Path:
    """A random tiny model with the tool tokens whose ``<tool_call>`` and ``</tool_call>`` are likely (a few percent a
    token): every input embedding carries a constant in dimension 0 and only the two tags' output rows read it (the
    head untied from the embeddings)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_core.models.tiny import build_tiny_model
    from grpo_core.tools import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

    path = build_tiny_model(path, hidden_size=64, num_layers=2, num_heads=2, max_position_embeddings=256,
                            tool_tokens=True)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    with torch.no_grad():
        model.get_input_embeddings().weight[:, 0] = 10.0
        model.lm_head.weight[:, 0] = 0.0
        for tag in (TOOL_CALL_OPEN, TOOL_CALL_CLOSE):
            model.lm_head.weight[tokenizer.convert_tokens_to_ids(tag), 0] = 0.3
    model.save_pretrained(path)
    return path


def train(model_dir, output_dir, asynchronous: bool = False, **kwargs) -> None:
    from grpo_core.trainer.loop import train_grpo

    train_grpo(tool_config(asynchronous), model_dir, ROWS, output_dir, reward_funcs=[digit_fraction], **kwargs)


@pytest.mark.slow
def test_the_sampler_process_builds_the_trajectories_the_trainer_would(tmp_path):
    """async_rollouts with tools: a round the sampler process makes (ProcessBackend(rollout=ToolRollouts)) holds the
    trajectories generate_trajectories gives in the trainer's process for the same weights and seeds, tool turns,
    masks and log-probs alike, and its counts come back with them."""
    import dataclasses

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_core.generation.base import GenerationRequest
    from grpo_core.generation.hf import HFBackend
    from grpo_core.generation.process import ProcessBackend
    from grpo_core.generation.trajectory import TrajectoryStats, generate_trajectories
    from grpo_core.tools import ToolSet
    from grpo_core.trainer.async_rollouts import ToolRollouts

    torch.set_num_threads(1)
    model_dir = tool_calling_model(tmp_path / "tiny")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in ("12+30=", "7*6=", "99-1=")]
    request = GenerationRequest(n=4, max_tokens=40, temperature=1.0, seeds=list(range(500, 512)))
    tools, stats = ToolSet.from_specs(["calculator"]), TrajectoryStats()
    want = generate_trajectories(HFBackend(model, tokenizer), tokenizer, prompts, request, tools, max_turns=3,
                                 max_total_tokens=120, stats=stats)
    sampler = ProcessBackend("hf", str(model_dir), rollout=ToolRollouts(["calculator"], str(model_dir), 3, 120))
    try:
        sampler.submit(prompts, request, rollout=True)
        got = sampler.result()
        counts = (TrajectoryStats(**sampler.last_extra["trajectories"]), sampler.last_extra["tools"])
        single = sampler.generate(prompts, request)  # a plain request: one turn each, no tools
    finally:
        sampler.close()
    assert sum(stats.tool_calls) >= 3 and max(stats.turns) >= 2, stats  # tool turns, and turns after them
    for a, b in zip(got, want):
        assert (a.completion_ids, a.tool_mask, a.truncated, a.text) == (b.completion_ids, b.tool_mask, b.truncated,
                                                                       b.text)
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-6, rtol=0)
    assert dataclasses.asdict(counts[0]) == {**dataclasses.asdict(stats), "tool_seconds": counts[0].tool_seconds}
    assert counts[1]["tools/calls"] == sum(stats.tool_calls) == counts[1]["tools/calculator/calls"] + \
        counts[1]["tools/malformed"] + counts[1]["tools/unknown"]
    assert all(r.tool_mask is None for r in single) and sampler.last_extra is None


@pytest.mark.extended
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sigkill_resume_with_tool_rollouts_is_bit_identical(tmp_path, mode):
    """async: the rounds made ahead are trajectories the sampler process builds (its tools, its counts): the counts
    are kept in the checkpoint with the rollouts, so a resumed run logs the uninterrupted run's tools/... too."""
    torch.set_num_threads(1)
    asynchronous = mode == "async"
    model_dir = tool_calling_model(tmp_path / "tiny")
    reference = tmp_path / "uninterrupted"
    train(model_dir, reference, asynchronous, resume=False)

    killed = tmp_path / "killed"
    rng = random.Random()
    for line in (1, 3):  # SIGKILL twice, somewhere after step 1 and after step 3
        proc = subprocess.Popen([sys.executable, __file__, str(model_dir), str(killed), mode], env=child_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        kill_after_line(proc, killed, line, rng)
        assert not (killed / "final").exists()
    train(model_dir, killed, asynchronous)  # resume=True

    assert_same_final_weights(reference, killed)
    ref_metrics, got = read_metrics(reference), read_metrics(killed)
    assert [m["step"] for m in got] == list(range(1, MAX_STEPS + 1))  # every step exactly once
    # the run held tool turns, and model turns after them
    assert min(m["tools/calls_mean"] for m in ref_metrics) > 0 and max(m["tools/turns_mean"] for m in ref_metrics) > 1
    for a, b in zip(ref_metrics, got):
        for key in ("loss", "reward", "grad_norm", "kl", "completions/mean_length", "completions/mean_model_length",
                    "tools/calls_mean", "tools/turns_mean", "tools/error_rate", "tools/budget_cut_frac"):
            assert a[key] == b[key], (a["step"], key)


if __name__ == "__main__":
    model, output, mode = sys.argv[1:4]
    train(model, output, mode == "async", callbacks=[SlowSteps()])
