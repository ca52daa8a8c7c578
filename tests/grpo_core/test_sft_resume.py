"""Exact resume: an SFT run SIGKILLed at arbitrary points and resumed ends bit-identical to one that never stopped.

The child process is this file run as a script:

    python tests/grpo_core/test_sft_resume.py MODEL_DIR OUTPUT_DIR
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import torch

from tests.grpo_core.run_helpers import assert_same_final_weights, child_env, kill_after_line, read_metrics

MAX_STEPS = 8


def rows() -> list[dict]:
    from grpo_core.data.synthetic import make_chain_rows, make_cold_start_rows

    return make_cold_start_rows(make_chain_rows(12, seed=2), direct_fraction=0.5, seed=2)


def resume_config():
    from grpo_core.config import SFTConfig

    # State that crosses steps: Adam moments with weight decay, warmup + cosine, the data stream's epochs
    # (8 steps x 4 rows of 12 rows).
    return SFTConfig(
        max_steps=MAX_STEPS, per_device_train_batch_size=2, gradient_accumulation_steps=2, learning_rate=3e-3,
        lr_scheduler_type="cosine", warmup_steps=2, weight_decay=0.01, save_steps=2, save_total_limit=2,
        logging_steps=1, seed=7, report_to=["jsonl"], torch_num_threads=1,
    )


class SlowSteps:
    """Gives the parent time to kill the child in the middle of a run; does not touch any state."""

    def on_step(self, step: int, max_steps: int, metrics: dict) -> None:
        time.sleep(0.3)


def run_child(model_dir: str, output_dir: str) -> None:
    from grpo_core.trainer.sft import train_sft

    train_sft(resume_config(), model_dir, rows(), output_dir, callbacks=[SlowSteps()])


def _spawn(model_dir: Path, output_dir: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, str(model_dir), str(output_dir)], env=child_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_sigkill_resume_is_bit_identical(tmp_path):
    from grpo_core.trainer.sft import train_sft
    from grpo_core.models.tiny import build_tiny_model

    torch.set_num_threads(1)
    model_dir = build_tiny_model(tmp_path / "tiny", hidden_size=64, num_layers=2, num_heads=2)
    reference = tmp_path / "uninterrupted"
    train_sft(resume_config(), model_dir, rows(), reference, resume=False)

    killed = tmp_path / "killed"
    rng = random.Random()
    for line in (3, 6):  # SIGKILL twice, at arbitrary points after step 3 and after step 6
        kill_after_line(_spawn(model_dir, killed), killed, line, rng, max_delay=0.4)
        assert not (killed / "final").exists()
    out = train_sft(resume_config(), model_dir, rows(), killed)  # resume=True
    assert out["train/steps"] == MAX_STEPS

    assert_same_final_weights(reference, killed)
    ref_metrics, got = read_metrics(reference), read_metrics(killed)
    assert [m["step"] for m in got] == list(range(1, MAX_STEPS + 1))  # every step exactly once
    for a, b in zip(ref_metrics, got):
        for key in ("train/loss", "train/grad_norm", "train/learning_rate", "train/num_tokens"):
            assert a[key] == b[key], (a["step"], key)


if __name__ == "__main__":
    run_child(*sys.argv[1:3])
