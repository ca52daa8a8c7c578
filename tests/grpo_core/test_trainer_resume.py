"""Exact resume: a GRPO run SIGKILLed at arbitrary points and resumed ends bit-identical to one that never stopped.

The child process is this file run as a script:

    python tests/grpo_core/test_trainer_resume.py MODEL_DIR OUTPUT_DIR BACKEND [EVAL_STEPS]    (BACKEND: hf, vllm, hf-lora)

With ``EVAL_STEPS`` the run also evaluates a held-out slice every that many steps (GRPO's eval_steps): the
evaluation must not move the training's RNG or state, so resume stays exact and the eval rows match too.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.grpo_core.run_helpers import assert_same_final_weights, child_env, kill_after_line, read_metrics

MAX_STEPS = 8
ROWS = [{"prompt": [{"role": "user", "content": f"{i}*{i}="}], "answer": str(i * i)} for i in range(12)]
HELD_OUT = [{"prompt": [{"role": "user", "content": f"{i}*3="}], "answer": str(i * 3)} for i in range(4)]


def digit_fraction(completions, **kwargs):
    texts = [c[0]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]


def resume_config(backend: str, eval_steps: int | None = None):
    from grpo_core.config import GRPOConfig

    # Everything that carries state across steps is on: the reference model (beta), old log-probs and
    # two optimiser steps per generation (Adam moments), warmup + cosine (scheduler), clip-higher.
    lora = dict(use_peft=True, lora_r=4, lora_alpha=8, lora_dropout=0.1) if backend.endswith("-lora") else {}
    return GRPOConfig(
        **lora, use_vllm=backend.startswith("vllm"), max_steps=MAX_STEPS, generation_batch_size=12, num_generations=4,
        max_completion_length=8, max_prompt_length=16, per_device_train_batch_size=5, learning_rate=5e-3,
        beta=0.04, num_iterations=2, steps_per_generation=2, epsilon_high=0.28, lr_scheduler_type="cosine",
        warmup_steps=2, weight_decay=0.01, save_steps=2, save_total_limit=2, seed=7, report_to=["jsonl"],
        torch_num_threads=1, vllm_kv_cache_memory_bytes=16 * 2**20, eval_steps=eval_steps, eval_samples=4,
    )


class SlowSteps:
    """Gives the parent time to kill the child in the middle of a run; does not touch any state."""

    def on_step(self, step: int, max_steps: int, metrics: dict) -> None:
        time.sleep(0.2)


def train(model_dir, output_dir, backend: str, eval_steps: int | None, **kwargs) -> None:
    from grpo_core.config import EvalConfig
    from grpo_core.trainer.loop import train_grpo

    heldout = {"eval_rows": HELD_OUT, "eval_config": EvalConfig(reward_func="math_accuracy")} if eval_steps else {}
    train_grpo(resume_config(backend, eval_steps), model_dir, ROWS, output_dir, reward_funcs=[digit_fraction],
               **heldout, **kwargs)


def run_child(model_dir: str, output_dir: str, backend: str, eval_steps: str = "") -> None:
    train(model_dir, output_dir, backend, int(eval_steps) if eval_steps else None, callbacks=[SlowSteps()])


def _spawn(model_dir: Path, output_dir: Path, backend: str, eval_steps: int | None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, __file__, str(model_dir), str(output_dir), backend, str(eval_steps or "")],
        env=child_env(VLLM_ENABLE_V1_MULTIPROCESSING="0"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def _resume_is_exact(tmp_path: Path, backend: str, eval_steps: int | None = None) -> None:
    from grpo_core.models.tiny import build_tiny_model

    torch.set_num_threads(1)
    model_dir = build_tiny_model(tmp_path / "tiny", hidden_size=64, num_layers=2, num_heads=2)
    reference = tmp_path / "uninterrupted"
    train(model_dir, reference, backend, eval_steps, resume=False)

    killed = tmp_path / "killed"
    rng = random.Random()
    for line in (2, 5):  # SIGKILL twice, at arbitrary points after step 2 and after step 5
        kill_after_line(_spawn(model_dir, killed, backend, eval_steps), killed, line, rng)
        assert not (killed / "final").exists()
    train(model_dir, killed, backend, eval_steps)  # resume=True

    assert_same_final_weights(reference, killed)
    ref_metrics, got = read_metrics(reference), read_metrics(killed)
    assert [m["step"] for m in got] == list(range(1, MAX_STEPS + 1))  # every step exactly once
    for a, b in zip(ref_metrics, got):
        for key in ("loss", "reward", "grad_norm", "kl", "learning_rate", "completions/mean_length"):
            assert a[key] == b[key], (a["step"], key)
        held_out = sorted(k for k in a if k.startswith("eval/"))
        assert held_out == sorted(k for k in b if k.startswith("eval/"))
        assert all(a[k] == b[k] or a[k] != a[k] for k in held_out), a["step"]  # NaN (no reflecting sample) allowed
    if eval_steps:
        assert [m["step"] for m in got if "eval/accuracy" in m] == list(range(eval_steps, MAX_STEPS + 1, eval_steps))


@pytest.mark.extended
def test_sigkill_resume_is_bit_identical_hf(tmp_path):
    _resume_is_exact(tmp_path, "hf")


def test_sigkill_resume_is_bit_identical_with_eval_steps_hf(tmp_path):
    _resume_is_exact(tmp_path, "hf", eval_steps=3)


def test_sigkill_resume_is_bit_identical_lora(tmp_path):
    """use_peft: the checkpoints hold adapters (the base is rebuilt from the model), dropout on the adapters draws
    from the restored RNG, the reference is the adapter-disabled policy; the merged final model is bit-identical."""
    _resume_is_exact(tmp_path, "hf-lora")
    assert (tmp_path / "killed" / "final" / "adapter" / "adapter_model.safetensors").is_file()


@pytest.mark.extended
@pytest.mark.vllm
@pytest.mark.slow
def test_sigkill_resume_is_bit_identical_vllm(tmp_path):
    pytest.importorskip("vllm")
    _resume_is_exact(tmp_path, "vllm")


if __name__ == "__main__":
    run_child(*sys.argv[1:5])
