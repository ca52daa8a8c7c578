"""tests/benchmarks/mixture_seeds.py: the learning table's pass conditions (issue 16's must-show 1)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).with_name("mixture_seeds.py")
spec = importlib.util.spec_from_file_location("mixture_seeds", SCRIPT)
mixture_seeds = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mixture_seeds)


def stages(sft, sft_forced, grpo, grpo_forced, consolidated, final):
    return {"cold_start_sft": {"eval/accuracy": sft, "eval/accuracy_forced_reasoning": sft_forced},
            "grpo_train": {"eval/accuracy": grpo, "eval/accuracy_forced_reasoning": grpo_forced},
            "sft_consolidate": {"eval/accuracy": consolidated, "eval/accuracy_forced_reasoning": consolidated},
            "final_rl": {"eval/accuracy": final, "eval/accuracy_forced_reasoning": final}}


GOOD = [(0, 500.0, stages(0.10, 0.20, 0.80, 0.80, 0.85, 0.86)), (1, 520.0, stages(0.05, 0.10, 0.75, 0.75, 0.80, 0.80))]


def test_a_table_meeting_every_condition_passes_and_prints_each_stage():
    lines, ok = mixture_seeds.learning_table(GOOD)
    assert ok
    assert "| 0 | 10.0 (20.0) | 80.0 (80.0) | 85.0 (85.0) | 86.0 (86.0) | 500 | yes |" in lines
    assert lines[-1].startswith("final RL greedy accuracy spread across seeds: 6.0 points")


def test_each_condition_alone_fails_the_table():
    cases = {
        "GRPO under SFT + 20": (0, 500.0, stages(0.10, 0.20, 0.29, 0.80, 0.85, 0.86)),
        "forced under SFT + 5": (0, 500.0, stages(0.10, 0.20, 0.80, 0.24, 0.85, 0.86)),
        "final below GRPO": (0, 500.0, stages(0.10, 0.20, 0.80, 0.80, 0.85, 0.79)),
        "over 10 minutes": (0, 601.0, stages(0.10, 0.20, 0.80, 0.80, 0.85, 0.86)),
        "spread over 10 points": (0, 500.0, stages(0.10, 0.20, 0.95, 0.95, 0.95, 0.91)),
    }
    for name, row in cases.items():
        lines, ok = mixture_seeds.learning_table([row, GOOD[1]])
        assert not ok, name


def test_pass_at_1_table_prints_every_stage_per_seed():
    rows = [(seed, wall, {stage: {**metrics, "eval/pass@1": 0.1 * (i + 1) + 0.01 * seed}
                          for i, (stage, metrics) in enumerate(m.items())}) for seed, wall, m in GOOD]
    lines = mixture_seeds.pass_at_1_table(rows)
    assert lines[2:] == ["| 0 | 10.0 | 20.0 | 30.0 | 40.0 |", "| 1 | 11.0 | 21.0 | 31.0 | 41.0 |"]
