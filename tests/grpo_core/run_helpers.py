"""What the trainer tests share: a run's metrics, two runs' final weights compared bit for bit, a run in two
torchrun processes, a child run killed in the middle of a step, and a scripted sampler's turn as a rollout."""

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


def read_metrics(output_dir: Path) -> list[dict]:
    """The rows of ``output_dir/metrics.jsonl``: [] before the first; a half-written last line is left out."""
    path = Path(output_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def assert_same_final_weights(expected_dir: Path, actual_dir: Path) -> None:
    """The two runs' ``final/model.safetensors`` hold the same tensors, bit for bit."""
    from safetensors.torch import load_file

    expected = load_file(Path(expected_dir) / "final" / "model.safetensors")
    actual = load_file(Path(actual_dir) / "final" / "model.safetensors")
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), f"{name} differs"


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child run: this checkout importable, one OpenMP thread, no hub."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **extra}


def run_torchrun(script: str, *args: str, timeout: float) -> str:
    """Run ``script args`` in two torchrun processes on this machine; returns their stdout, fails with their
    stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", script, *args],
        env=child_env(), capture_output=True, text=True, timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def kill_after_line(proc: subprocess.Popen, output_dir: Path, line: int, rng: random.Random,
                    max_delay: float = 0.3) -> None:
    """SIGKILL ``proc`` at a random moment (up to ``max_delay`` s) after its metrics.jsonl has ``line`` rows."""
    deadline = time.time() + 240
    while len(read_metrics(output_dir)) < line:
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
        assert time.time() < deadline, "child made no progress"
        time.sleep(0.02)
    time.sleep(rng.uniform(0.0, max_delay))  # somewhere in the next step: generating, training or checkpointing
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the child finished before it could be killed"


def scripted_rollout(tokenizer, prompt: list[int], turn: str, request):
    """A scripted sampler's ``turn`` for ``prompt`` as the backend would return it: ending in EOS unless it ends on
    one of ``request.stop_token_ids`` (a tool call), cut to ``request.max_tokens`` (then truncated), no log-probs."""
    from grpo_core.generation.base import Rollout

    ids = tokenizer(turn, add_special_tokens=False)["input_ids"]
    ids = ids if ids[-1] in request.stop_token_ids else ids + [tokenizer.eos_token_id]
    truncated = len(ids) > request.max_tokens
    ids = ids[: request.max_tokens]
    shown = ids[:-1] if ids[-1] == tokenizer.eos_token_id else ids
    return Rollout(prompt, ids, None, truncated, tokenizer.decode(shown, skip_special_tokens=True))
