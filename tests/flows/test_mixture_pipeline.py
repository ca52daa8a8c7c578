"""The data mixture end to end through real Prefect on a local store: the reward_model stage, grpo_train on one
source, final_rl over three (rule rewards for chain, the trained reward model for helpful and unsafe),
evaluation two ways, per-source metrics in the JSONL, ``r1 status --json`` and the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from tasks.storage.store import Store

CONFIG = Path(__file__).with_name("mixture-tiny.yaml")


@pytest.mark.extended
@pytest.mark.slow
def test_mixed_final_rl_end_to_end(tmp_path):
    store = str(tmp_path / "store")
    result = CliRunner().invoke(app, ["run", "-c", str(CONFIG), "--run", "mix", "--store", store])
    assert result.exit_code == 0, result.output
    status = json.loads(CliRunner().invoke(app, ["status", "mix", "--store", store, "--json"]).output)
    for stage in ("grpo_train", "final_rl"):
        metrics = status["stages"][stage]["metrics"]
        for key in ("eval/accuracy", "eval/rm_score", "eval/preferred_rate", "eval/chain/accuracy",
                    "eval/helpful/rm_score", "eval/unsafe/preferred_rate"):
            assert key in metrics, (stage, key)
    assert status["stages"]["reward_model"]["state"] == "completed"
    st = Store(store)
    history = [json.loads(line) for line in st.read_output(st.latest("mix", "final_rl"), "metrics.jsonl")
               .decode().splitlines()]
    for source, prompts in (("chain", 2.0), ("helpful", 1.0), ("unsafe", 1.0)):  # 4 prompts a step, weights 2:1:1
        assert all(f"rewards/{source}/mean" in h and h[f"mixture/{source}/prompts"] == prompts for h in history)
    assert all("rewards/rm_helpful/mean" in h and "rewards/chain_accuracy/mean" in h for h in history)
    grpo = [json.loads(line) for line in st.read_output(st.latest("mix", "grpo_train"), "metrics.jsonl")
            .decode().splitlines()]
    assert all("mixture/helpful/prompts" not in h for h in grpo)  # grpo_train: the chain source alone
    report = json.loads(Path(store, "mix", "_report", "report.json").read_text())
    rows = {(r["stage"].split()[0], r["source"], r["metric"]) for r in report["by_source"]}
    assert {("final_rl", "helpful", "reward"), ("final_rl", "unsafe", "rm_score"),
            ("grpo_train", "chain", "accuracy")} <= rows
