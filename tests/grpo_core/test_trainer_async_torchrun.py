"""``async_rollouts`` under torchrun: one process trains (the sampler process starts from inside the rank); two
processes (gloo, FSDP) each run a sampler process for their own share of the groups and give the curve of one
process."""

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

pytestmark = [pytest.mark.slow, pytest.mark.extended]

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = '''
import sys
from pathlib import Path

from grpo_core.config import GRPOConfig
from grpo_core.trainer.loop import train_grpo


def digit_fraction(completions, **kwargs):
    texts = [c[0]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]


if __name__ == "__main__":  # the sampler process is a multiprocessing spawn: it re-imports this file
    rows = [{"prompt": [{"role": "user", "content": f"{i}+{i}="}]} for i in range(16)]
    config = GRPOConfig(use_vllm=False, async_rollouts=sys.argv[3] == "async", async_sampler_timeout=120, max_steps=3,
                        generation_batch_size=8, num_generations=4, max_completion_length=6, max_prompt_length=32,
                        per_device_train_batch_size=8, beta=0.04, save_steps=100, report_to=["jsonl"],
                        torch_num_threads=1, seed=0)
    train_grpo(config, sys.argv[1], rows, Path(sys.argv[2]), reward_funcs=[digit_fraction], resume=False)
'''


def torchrun(nproc: int, tmp_path: Path, model: Path, mode: str = "async", out: str = "out"
             ) -> subprocess.CompletedProcess:
    script = tmp_path / "train_async.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                           str(script), str(model), str(tmp_path / out), mode],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=32, num_layers=2, num_heads=2)


def read(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_two_torchrun_processes_give_the_curve_of_one(tmp_path, tiny_path):
    """Each rank's sampler generates its share of every round (seeds follow the prompt, not the rank) and
    ``score_groups`` gathers them, so two ranks train on the rollouts one process does: the same rewards and,
    to float rounding of the FSDP reductions, the same losses. Step 1 (staleness 0) is the synchronous run's."""
    runs = {}
    for nproc, mode in ((2, "async"), (1, "async"), (1, "sync")):
        out = f"{mode}{nproc}"
        proc = torchrun(nproc, tmp_path, tiny_path, mode, out)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs[out] = read(tmp_path / out)
    two, one, sync = runs["async2"], runs["async1"], runs["sync1"]
    assert [m["async/staleness"] for m in two] == [m["async/staleness"] for m in one] == [0.0, 1.0, 1.0]
    for a, b in zip(one, two):
        assert a["reward"] == b["reward"], a["step"]
        assert abs(a["loss"] - b["loss"]) < 1e-5, (a["step"], a["loss"], b["loss"])
        assert abs(a["kl"] - b["kl"]) < 1e-6 + 1e-4 * abs(a["kl"]), (a["step"], a["kl"], b["kl"])
    assert len({m["loss"] for m in one}) > 1  # the curve moves, so agreement is not trivial
    assert two[0]["reward"] == sync[0]["reward"] and abs(two[0]["loss"] - sync[0]["loss"]) < 1e-5
    assert (tmp_path / "async2" / "final").is_dir() and (tmp_path / "async1" / "final").is_dir()
