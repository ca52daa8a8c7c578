"""Exact resume from sharded (DCP) checkpoints: a 2-rank FSDP run on CPU (gloo) SIGKILLed mid-run and resumed ends
bit-identical to the same 2-rank run uninterrupted, and follows the one-process loss curve.

Bit-identical is against 2 ranks: one process sums the micro-batch gradients in another order (float rounding),
so against it the curve agrees within 1e-5, as in test_trainer_fsdp.py. ``fsdp_cpu_offload`` is on: on CPU it is a
no-op (training is on the CPU already), so this runs clip and checkpoint with the setting but cannot show the
NCCL-only failure it causes on GPUs (test_distributed_backend.py checks the gloo group beside NCCL).

The two-process run is this file under torchrun:

    torchrun --standalone --nproc_per_node 2 tests/grpo_core/test_trainer_fsdp_resume.py MODEL_DIR OUTPUT_DIR
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from tests.grpo_core.run_helpers import assert_same_final_weights, child_env, read_metrics, run_torchrun

pytestmark = [pytest.mark.slow, pytest.mark.extended]

MAX_STEPS = 6
ROWS = [{"prompt": [{"role": "user", "content": f"{i}+{i % 4}="}], "answer": str(i + i % 4)} for i in range(12)]


def digit_fraction(completions, **kwargs):
    texts = [c[0]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]


def config(strategy: str):
    from grpo_core.config import GRPOConfig

    # What carries state across steps: Adam moments (two optimiser steps per generation), warmup + cosine,
    # the reference model (beta), clip-higher.
    return GRPOConfig(
        use_vllm=False, max_steps=MAX_STEPS, generation_batch_size=8, num_generations=4, max_completion_length=8,
        max_prompt_length=16, per_device_train_batch_size=2, learning_rate=5e-3, beta=0.04, num_iterations=2,
        epsilon_high=0.28, lr_scheduler_type="cosine", warmup_steps=2, weight_decay=0.01, save_steps=2,
        save_total_limit=2, seed=5, report_to=["jsonl"], torch_num_threads=1, distributed_strategy=strategy,
        fsdp_cpu_offload=strategy == "fsdp",
    )


class SlowSteps:
    """Gives the parent time to kill the run in the middle; touches no state."""

    def on_step(self, step: int, max_steps: int, metrics: dict) -> None:
        time.sleep(0.3)


def run(model_dir: str, output_dir: str, strategy: str, resume: bool) -> None:
    from grpo_core.trainer.loop import train_grpo

    train_grpo(config(strategy), model_dir, ROWS, output_dir, reward_funcs=[digit_fraction], resume=resume,
               callbacks=[SlowSteps()])


def _kill_torchrun_after_line(model_dir: Path, output_dir: Path, line: int) -> None:
    """Start the 2-rank run, SIGKILL torchrun and both ranks at a random moment after metrics.jsonl has ``line`` rows
    (torchrun starts each rank in a session of its own: killing torchrun's group alone leaves them running)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", __file__,
         str(model_dir), str(output_dir)],
        env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    deadline = time.time() + 300
    while len(read_metrics(output_dir)) < line:
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
        assert time.time() < deadline, "the 2-rank run made no progress"
        time.sleep(0.02)
    time.sleep(random.uniform(0.0, 0.6))  # in the next step: generating, training or writing shards
    ranks = psutil.Process(proc.pid).children(recursive=True)
    assert len(ranks) >= 2, ranks
    proc.kill()
    for rank in ranks:
        rank.kill()
    proc.wait()
    psutil.wait_procs(ranks, timeout=30)


def _values(row: dict) -> dict:
    """A metrics row without its wall-clock fields."""
    return {k: v for k, v in row.items() if not k.startswith("time/") and k != "tokens_per_second"}


def test_fsdp_killed_and_resumed_from_sharded_checkpoints_is_exact(tmp_path):
    from grpo_core.models.tiny import build_tiny_model

    torch.set_num_threads(1)
    model_dir = build_tiny_model(tmp_path / "tiny", hidden_size=32, num_layers=2, num_heads=2)
    reference, killed = tmp_path / "uninterrupted", tmp_path / "killed"
    run_torchrun(__file__, str(model_dir), str(reference), "fresh", timeout=400)

    _kill_torchrun_after_line(model_dir, killed, 3)
    assert not (killed / "final").exists()
    assert (killed / "checkpoint-2" / "state" / ".metadata").is_file()  # the shards it resumes from
    run_torchrun(__file__, str(model_dir), str(killed), timeout=400)

    assert_same_final_weights(reference, killed)
    rows = read_metrics(killed)
    assert [m["step"] for m in rows] == list(range(1, MAX_STEPS + 1))  # none lost, none twice
    assert [_values(m) for m in rows] == [_values(m) for m in read_metrics(reference)]

    run(str(model_dir), str(tmp_path / "one"), "ddp", resume=False)  # one unsharded process
    for a, b in zip(read_metrics(tmp_path / "one"), rows, strict=True):
        assert a["reward"] == b["reward"]
        assert abs(a["loss"] - b["loss"]) < 1e-5, (a["step"], a["loss"], b["loss"])
        assert abs(a["grad_norm"] - b["grad_norm"]) < 1e-5 * max(1.0, a["grad_norm"])


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2], "fsdp", resume=len(sys.argv) < 4)  # "fresh": resume=False
