"""tests/benchmarks/packing.py --quick runs and prints its one JSON line with the ratios and the speed probe."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).with_name("packing.py")


def test_quick_mode_prints_the_ratios_and_the_speed_probe():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, timeout=600,
                          check=True)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("packed_speedup_sft", "packed_speedup_grpo", "packed_speedup_sft_unsorted"):
        assert out[key] > 0, key
    probe = out["speed_probe"]
    for key in ("padded_sft_tokens_per_s", "packed_sft_tokens_per_s", "padded_grpo_tokens_per_s",
                "packed_grpo_tokens_per_s", "matmul_gflops_start", "matmul_gflops_end"):
        assert probe[key] > 0, key
    assert out["rounds"] == 1 and out["max_tokens_per_batch"]["grpo"] > 0
