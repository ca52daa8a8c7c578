"""SFT on two processes under torchrun (gloo), ddp and fsdp, trains like one process with the same step batch;
under fsdp the two processes are also killed after checkpoint-2 and resumed from it.

The two-process runs are this file under torchrun:

    torchrun --standalone --nproc_per_node 2 tests/grpo_core/test_sft_distributed.py MODEL_DIR OUTPUT_DIR STRATEGY [crash|resume]
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def rows() -> list[dict]:
    from grpo_core.data.synthetic import make_chain_rows, make_cold_start_rows

    return make_cold_start_rows(make_chain_rows(10, seed=1), direct_fraction=0.3, seed=1)


def config(strategy: str):
    from grpo_core.config import SFTConfig

    # 5 rows per step: rank 0 takes 3 micro-batches of 1, rank 1 two (plus an FSDP filler to stay in lockstep).
    return SFTConfig(
        max_steps=5, per_device_train_batch_size=1, gradient_accumulation_steps=5, learning_rate=3e-3,
        lr_scheduler_type="cosine", warmup_steps=1, weight_decay=0.01, save_steps=2, seed=3, report_to=["jsonl"],
        torch_num_threads=1, distributed_strategy=strategy, logprob_chunk_size=16,
    )


class CrashAfterCheckpoint2:
    """Rank 0's callback: die once checkpoint-2 is written (torchrun then stops rank 1)."""

    def on_checkpoint(self, step: int, path: Path) -> None:
        if step == 2:
            raise RuntimeError("crash after checkpoint-2")


def run(model_dir: str, output_dir: str, strategy: str, phase: str = "") -> None:
    from grpo_core.trainer.sft import train_sft

    callbacks = [CrashAfterCheckpoint2()] if phase == "crash" else []
    train_sft(config(strategy), model_dir, rows(), output_dir, resume=phase == "resume", callbacks=callbacks)


def _metrics(output_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> tuple[Path, Path]:
    from grpo_core.models.tiny import build_tiny_model

    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("sft-dist")
    model_dir = build_tiny_model(tmp / "tiny", hidden_size=32, num_layers=2, num_heads=2)
    run(str(model_dir), str(tmp / "one"), "ddp")
    return model_dir, tmp / "one"


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", pytest.param("fsdp", marks=pytest.mark.extended)])  # FSDP in CI: test_trainer_fsdp
def test_two_processes_give_the_loss_curve_of_one(one_process, tmp_path, strategy):
    from safetensors.torch import load_file

    model_dir, one_dir = one_process
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", __file__,
                str(model_dir), str(tmp_path / "two"), strategy]
    if strategy == "fsdp":
        crashed = subprocess.run([*torchrun, "crash"], env=env, capture_output=True, text=True, timeout=300)
        assert crashed.returncode != 0 and "crash after checkpoint-2" in crashed.stderr, crashed.stderr[-4000:]
        assert [json.loads(line)["step"] for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()] == [1, 2]
        proc = subprocess.run([*torchrun, "resume"], env=env, capture_output=True, text=True, timeout=300)
        assert "checkpoint-2 at step 2" in proc.stderr, proc.stderr[-4000:]  # the skeleton's "resumed from" line
    else:
        proc = subprocess.run(torchrun, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]

    one, two = _metrics(one_dir), _metrics(tmp_path / "two")
    print(strategy, "max |loss diff| over", len(one), "steps:", max(abs(a["train/loss"] - b["train/loss"]) for a, b in zip(one, two)))
    assert [m["step"] for m in two] == [1, 2, 3, 4, 5]  # rank 0 alone writes metrics; a resumed step once
    for a, b in zip(one, two):
        assert a["train/num_tokens"] == b["train/num_tokens"]  # the global count, on every rank
        assert abs(a["train/loss"] - b["train/loss"]) < 1e-5, (a["step"], a["train/loss"], b["train/loss"])
        assert abs(a["train/grad_norm"] - b["train/grad_norm"]) < 1e-5 * max(1.0, a["train/grad_norm"])
    assert len({m["train/loss"] for m in one}) > 1  # the curve moves, so agreement is not trivial
    w1 = load_file(one_dir / "final" / "model.safetensors")
    w2 = load_file(tmp_path / "two" / "final" / "model.safetensors")
    assert w1.keys() == w2.keys()
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], atol=1e-4, rtol=0)
    assert sorted(p.name for p in (tmp_path / "two").glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-5"]


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    run(*sys.argv[1:])
