"""The report's per-source section: held-out eval/{source}/... of every model stage and the RL stages'
rewards/{source}/mean at their last step."""

from __future__ import annotations

from flows.report_tables import source_rows, source_table
from tasks.storage.manifest import StageRef


def _ref(stage: str, metrics: dict) -> StageRef:
    return StageRef(run="r", stage=stage, version="v1", path=f"r/{stage}/v1", fingerprint="f", created="t",
                    metrics=metrics)


def test_source_rows_and_table():
    evaluations = {"grpo_train": _ref("evaluate/grpo_train", {"eval/accuracy": 0.7, "eval/chain/accuracy": 0.7,
                                                               "eval/helpful/preferred_rate": 0.1,
                                                               "eval/math500/pass@1": 0.2, "eval/math500/maj@4": 0.3}),
                   "final_rl": None}
    histories = {"final_rl": [{"step": 1}, {"step": 2, "rewards/chain/mean": 0.5, "rewards/chain/std": 0.1,
                                            "mixture/chain/prompts": 8.0, "rewards/helpful/mean": 0.9,
                                            "mixture/helpful/prompts": 4.0, "rewards/chain_accuracy/mean": 0.4,
                                            "rewards/chain_accuracy/std": 0.2}]}
    rows = source_rows(evaluations, histories)
    assert rows == [
        {"stage": "grpo_train (held-out)", "source": "chain", "metric": "accuracy", "value": 0.7},
        {"stage": "grpo_train (held-out)", "source": "helpful", "metric": "preferred_rate", "value": 0.1},
        {"stage": "final_rl step 2 (train samples)", "source": "chain", "metric": "reward", "value": 0.5},
        {"stage": "final_rl step 2 (train samples)", "source": "helpful", "metric": "reward", "value": 0.9},
    ]  # rewards/chain_accuracy/mean is a reward function's, not a source's; math500 is a benchmark (own table)
    table = source_table(rows + [{"stage": "s", "source": "x", "metric": "m", "value": None}])
    assert "| final_rl step 2 (train samples) | helpful | reward | 0.9 |" in table.splitlines()
    assert table.splitlines()[-1] == "| s | x | m | None |"
