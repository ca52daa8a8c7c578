"""A 2-rank FSDP load never holds more than one full copy of the model per machine (plus about one tensor per
rank in flight): ``fsdp_load_memory.py --quick``, its small preset (~48M parameters, 182 MiB in fp32)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.extended]

SCRIPT = Path(__file__).with_name("fsdp_load_memory.py")
ROOT = Path(__file__).resolve().parents[2]
SLACK_MIB = 40  # allocator and gloo buffers; the small preset's layer is 15 MiB


def test_two_rank_load_holds_one_copy_per_machine() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    full, largest = result["full_copy_mib"], result["largest_tensor_mib"]
    for rank in result["ranks"]:  # its half, plus a tensor in flight; a full copy per rank would be twice that
        assert rank["load_peak_mib"] <= full / 2 + largest + SLACK_MIB, rank
    assert result["sum_load_peak_mib"] <= full + 2 * largest + 2 * SLACK_MIB, result
