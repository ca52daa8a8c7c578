"""``lora_memory.py --quick`` runs and reports its ratios: LoRA (frozen base, adapters only trained) peaks well below
full fine-tuning, which holds gradients and AdamW state for every weight."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.extended]

SCRIPT = Path(__file__).with_name("lora_memory.py")
ROOT = Path(__file__).resolve().parents[2]


def test_lora_memory_quick_reports_its_ratios() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--device", "cpu", "--threads", "1"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"lora_peak_ratio", "lora_step_ratio", "matmul_gflops", "full", "lora"} <= set(result)
    assert result["lora"]["trainable"] < result["full"]["trainable"] / 10
    assert 0 < result["lora_peak_ratio"] < 0.8, result  # no gradients or AdamW state for the frozen base
    assert result["lora_step_ratio"] > 0 and result["matmul_gflops"] > 0
