"""tests/benchmarks/tool_seeds.py: the control config and the verdict of must-show 2 (issue 43)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))

import tool_seeds  # noqa: E402


def test_the_control_has_no_tool_anywhere_and_is_otherwise_the_config():
    raw = yaml.safe_load(tool_seeds.CONFIG.read_text())
    control = tool_seeds.without_tools(raw)
    for name in tool_seeds.SAMPLING_SECTIONS:
        assert raw[name]["sampling"]["tools"] == ["calculator"]  # the shipped config samples with the calculator
        assert "tools" not in control[name]["sampling"] and "max_turns" not in control[name]["sampling"]
        rest = {k: v for k, v in raw[name]["sampling"].items() if k not in ("tools", "max_turns")}
        assert control[name]["sampling"] == rest
    assert {k: v for k, v in control.items() if k not in tool_seeds.SAMPLING_SECTIONS} == \
        {k: v for k, v in raw.items() if k not in tool_seeds.SAMPLING_SECTIONS}  # the base, data, cold start alike
    from tasks.config.pipeline import parse_config

    assert parse_config(control).grpo_train.sampling.tools == []  # a valid pipeline config


def _run(cold_rate, rate, cold_greedy, greedy, control_greedy=None):
    metrics = {
        "cold_start_sft": {"eval/accuracy": cold_greedy, "eval/pass@1": 0.0, "eval/tools/call_rate": 0.0,
                           "eval/tools/call_rate_sampled": cold_rate},
        "grpo_train": {"eval/accuracy": greedy, "eval/pass@1": 0.0, "eval/tools/call_rate": 1.0,
                       "eval/tools/call_rate_sampled": rate, "eval/tools/calls_per_response_sampled": rate,
                       "eval/tools/error_rate_sampled": 0.0},
        "final_rl": {"eval/accuracy": greedy, "eval/pass@1": 0.0},
    }
    tools = {"eval": metrics, "wall_s": 1.0, "probe_s_per_step": 0.1}
    control = None if control_greedy is None else {
        "eval": {s: {"eval/accuracy": control_greedy} for s in tool_seeds.STAGES}, "wall_s": 1.0}
    return tools, control


def test_a_seed_passes_on_every_bar_of_must_show_2_and_fails_on_each_alone():
    assert tool_seeds.seed_row(0, *_run(0.10, 0.94, 0.30, 0.99, 0.30))["passes"]
    assert not tool_seeds.seed_row(0, *_run(0.10, 0.45, 0.30, 0.99, 0.30))["passes"]  # under 50%
    assert not tool_seeds.seed_row(0, *_run(0.20, 0.94, 0.30, 0.99, 0.30))["passes"]  # 4.7x the cold start
    assert not tool_seeds.seed_row(0, *_run(0.10, 0.94, 0.30, 0.49, 0.30))["passes"]  # +19 points only
    assert not tool_seeds.seed_row(0, *_run(0.10, 0.94, 0.30, 0.99, 0.85))["passes"]  # +14 over the control
    assert tool_seeds.seed_row(0, *_run(0.10, 0.94, 0.30, 0.99))["passes"]  # no control run: that bar unread
