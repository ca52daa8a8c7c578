"""Exact resume: an SFT run SIGKILLed at arbitrary points and resumed ends bit-identical to one that never stopped.

The child process is this file run as a script:

    python tests/grpo_core/test_sft_resume.py MODEL_DIR OUTPUT_DIR
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
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


def _metrics(output_dir: Path) -> list[dict]:
    path = output_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _kill_after_line(model_dir: Path, output_dir: Path, line: int, rng: random.Random) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, __file__, str(model_dir), str(output_dir)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while len(_metrics(output_dir)) < line:
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert time.time() < deadline, "child made no progress"
        time.sleep(0.02)
    time.sleep(rng.uniform(0.0, 0.4))  # somewhere in the next step: training or checkpointing
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the child finished before it could be killed"


def test_sigkill_resume_is_bit_identical(tmp_path):
    from safetensors.torch import load_file

    from grpo_core.trainer.sft import train_sft
    from grpo_core.models.tiny import build_tiny_model

    torch.set_num_threads(1)
    model_dir = build_tiny_model(tmp_path / "tiny", hidden_size=64, num_layers=2, num_heads=2)
    reference = tmp_path / "uninterrupted"
    train_sft(resume_config(), model_dir, rows(), reference, resume=False)

    killed = tmp_path / "killed"
    rng = random.Random()
    for line in (3, 6):  # SIGKILL twice, at arbitrary points after step 3 and after step 6
        _kill_after_line(model_dir, killed, line, rng)
        assert not (killed / "final").exists()
    out = train_sft(resume_config(), model_dir, rows(), killed)  # resume=True
    assert out["train/steps"] == MAX_STEPS

    expected, actual = load_file(reference / "final" / "model.safetensors"), load_file(killed / "final" / "model.safetensors")
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), f"{name} differs after resume"
    ref_metrics, got = _metrics(reference), _metrics(killed)
    assert [m["step"] for m in got] == list(range(1, MAX_STEPS + 1))  # every step exactly once
    for a, b in zip(ref_metrics, got):
        for key in ("train/loss", "train/grad_norm", "train/learning_rate", "train/num_tokens"):
            assert a[key] == b[key], (a["step"], key)


if __name__ == "__main__":
    run_child(*sys.argv[1:3])
