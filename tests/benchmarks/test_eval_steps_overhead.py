"""tests/benchmarks/eval_steps_overhead.py --quick: it runs with no other input and prints its one JSON line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.grpo_core.run_helpers import child_env

SCRIPT = Path(__file__).with_name("eval_steps_overhead.py")


@pytest.mark.extended
@pytest.mark.slow
def test_quick_run_prints_the_overhead_line():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick"], env=child_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line["quick"] and line["eval_at"] == [2, 4] and line["eval_samples"] == 8
    assert line["eval_s"] > 0 and line["stage_s_without"] > 0 and line["probe_s"] > 0
    assert line["added_fraction"] == pytest.approx(line["eval_s"] / line["stage_s_without"], abs=1e-3)
    assert isinstance(line["within_target"], bool) and isinstance(line["measured_fraction"], float)
