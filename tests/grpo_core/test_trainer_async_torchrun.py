"""``async_rollouts`` under torchrun: one process trains (the sampler process starts from inside the rank);
two processes fail before any model loads, with a message that says what to change."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from grpo_core.models.tiny import build_tiny_model

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = '''
import sys
from pathlib import Path

from grpo_core.config import GRPOConfig
from grpo_core.trainer import train_grpo


def digit_fraction(completions, **kwargs):
    texts = [c[0]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]


if __name__ == "__main__":  # the sampler process is a multiprocessing spawn: it re-imports this file
    rows = [{"prompt": [{"role": "user", "content": f"{i}+{i}="}]} for i in range(16)]
    config = GRPOConfig(use_vllm=False, async_rollouts=True, async_sampler_timeout=120, max_steps=3,
                        generation_batch_size=8, num_generations=4, max_completion_length=6, max_prompt_length=32,
                        per_device_train_batch_size=8, beta=0.0, save_steps=100, report_to=["jsonl"],
                        torch_num_threads=1, seed=0)
    train_grpo(config, sys.argv[1], rows, Path(sys.argv[2]), reward_funcs=[digit_fraction], resume=False)
'''


def torchrun(nproc: int, tmp_path: Path, model: Path) -> subprocess.CompletedProcess:
    script = tmp_path / "train_async.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                           str(script), str(model), str(tmp_path / "out")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=32, num_layers=2, num_heads=2)


def test_one_torchrun_process_trains_with_its_sampler_process(tmp_path, tiny_path):
    proc = torchrun(1, tmp_path, tiny_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [m["async/staleness"] for m in metrics] == [0.0, 1.0, 1.0]
    assert (tmp_path / "out" / "final").is_dir()


def test_two_torchrun_processes_fail_fast_naming_the_fix(tmp_path, tiny_path):
    start = time.monotonic()
    proc = torchrun(2, tmp_path, tiny_path)
    took = time.monotonic() - start
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "async_rollouts runs in one training process for now, and this is rank" in output, output[-3000:]
    assert "R1_NPROC_PER_NODE=1" in output and "async_rollouts: false" in output
    assert not (tmp_path / "out" / "metrics.jsonl").exists()  # no step ran
    print(f"failed after {took:.1f} s")
