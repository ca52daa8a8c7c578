"""Status follows the run's current lineage, not the newest outputs (issue 33, finding 5).

Config A -> B -> A on one run reuses A's outputs; status, the report's stage list and the next ``r1 stage``'s
inputs must then be A's, although B's are newer. After an upstream stage is rebuilt, the stages built on its old
output are flagged stale until they are rebuilt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from flows.run_status import latest_refs, stage_status
from flows.stages import stage_flow
from tasks.config.pipeline import load_config
from tasks.storage.store import Store

ROOT = Path(__file__).resolve().parents[2]
RUN = "lineage"


@pytest.fixture
def configs(tmp_path) -> tuple[Path, Path]:
    """Two short ci-tiny configs that differ only in the data seed (so every stage's fingerprint differs)."""
    raw = yaml.safe_load((ROOT / "configs" / "ci-tiny.yaml").read_text())
    raw["data"].update(num_train=16, num_eval=4, cold_start_size=16)
    raw["cold_start_sft"].update(max_steps=1, per_device_train_batch_size=4)
    raw["evaluate"]["sampling"].update(max_completion_length=8)
    raw["evaluate"].update(max_rows=4)
    paths = []
    for name, seed in (("a", 1), ("b", 2)):
        raw["data"]["seed"] = seed
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(raw))
        paths.append(path)
    return paths[0], paths[1]


def _stage(runner: CliRunner, store: str, stage: str, config: Path | None = None) -> None:
    args = ["stage", stage, "--run", RUN, "--store", store, *(["-c", str(config)] if config else [])]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output


def test_status_follows_the_current_lineage_and_flags_stale_stages(configs, tmp_path):
    a, b = configs
    store, runner = str(tmp_path / "store"), CliRunner()
    st = Store(store)

    _stage(runner, store, "prepare_data", a)
    data_a = st.latest(RUN, "prepare_data")
    _stage(runner, store, "prepare_data", b)
    data_b = st.latest(RUN, "prepare_data")
    assert data_b.version != data_a.version
    stage_flow("prepare_data")(run=RUN, config=load_config(a), store=store, force=False)  # A again, as `r1 run` does
    current = latest_refs(st, RUN)["prepare_data"]
    assert current.version == data_a.version  # A's committed output reused: older than B's, and the current one
    assert st.latest(RUN, "prepare_data").version == data_b.version

    _stage(runner, store, "cold_start_sft", a)  # built on the current data (A's)
    sft = st.latest(RUN, "cold_start_sft")
    assert st.manifest(sft)["parents"]["prepare_data"]["version"] == current.version
    status = stage_status(st, RUN)["stages"]
    assert status["prepare_data"]["path"] == current.path
    assert status["cold_start_sft"]["state"] == "completed"

    _stage(runner, store, "prepare_data", b)  # the upstream stage moves on: the SFT model was built on A's data
    data_b = st.latest(RUN, "prepare_data")  # `r1 stage` rebuilds (forced): a newer output of config B
    status = stage_status(st, RUN)["stages"]
    assert status["prepare_data"]["path"] == data_b.path
    assert status["cold_start_sft"]["state"] == "stale"
    assert status["cold_start_sft"]["stale_upstream"] == ["prepare_data"]
    shown = runner.invoke(app, ["status", RUN, "--store", store])
    assert shown.exit_code == 0, shown.output
    assert "stale: cold_start_sft was built on an earlier prepare_data output" in shown.output
    as_json = json.loads(runner.invoke(app, ["status", RUN, "--json", "--store", store]).output)
    assert as_json["stages"]["cold_start_sft"]["state"] == "stale"

    _stage(runner, store, "cold_start_sft")  # rebuilt on the current data: no longer stale
    status = stage_status(st, RUN)["stages"]
    assert status["cold_start_sft"]["state"] == "completed"
    rebuilt = latest_refs(st, RUN)["cold_start_sft"]
    assert st.manifest(rebuilt)["parents"]["prepare_data"]["version"] == data_b.version


CHAIN = {"prepare_data": (), "cold_start_sft": ("prepare_data",), "grpo_train": ("prepare_data", "cold_start_sft"),
         "rejection_sample": ("prepare_data", "grpo_train"), "sft_consolidate": ("rejection_sample",),
         "final_rl": ("prepare_data", "sft_consolidate")}  # each stage's parents, as the stage table has them


def _commit(st: Store, stage: str, parents: dict, tag: str):
    """A committed output of ``stage`` built on ``parents`` (no files: status reads manifests only), made current."""
    from tasks.storage import lineage

    with st.begin(RUN, stage) as writer:
        ref = writer.commit(fingerprint=f"{stage}-{tag}", config={}, parents=parents, metrics={})
    lineage.record(st, ref)
    return ref


def test_a_rerun_grandparent_marks_every_stage_built_on_it_stale(tmp_path):
    """grpo_train reruns; rejection_sample (its child), sft_consolidate and final_rl (built on rejection_sample's
    and then sft_consolidate's output, both still current) are all stale: their ancestry holds the old GRPO model."""
    st, store = Store(tmp_path / "store"), str(tmp_path / "store")
    refs: dict = {}
    for stage, parents in CHAIN.items():
        refs[stage] = _commit(st, stage, {p: refs[p] for p in parents}, "a")
    assert {stage_status(st, RUN)["stages"][s]["state"] for s in CHAIN} == {"completed"}

    _commit(st, "grpo_train", {p: refs[p] for p in CHAIN["grpo_train"]}, "b")  # `r1 stage grpo_train` rebuilt it
    status = stage_status(st, RUN)["stages"]
    assert [s for s in CHAIN if status[s]["state"] == "stale"] == ["rejection_sample", "sft_consolidate", "final_rl"]
    assert status["final_rl"]["stale_upstream"] == status["sft_consolidate"]["stale_upstream"] == ["grpo_train"]
    shown = CliRunner().invoke(app, ["status", RUN, "--store", store])
    assert shown.exit_code == 0, shown.output
    assert "stale: final_rl was built on an earlier grpo_train output" in shown.output

    grpo = st.latest(RUN, "grpo_train")
    rs = _commit(st, "rejection_sample", {"prepare_data": refs["prepare_data"], "grpo_train": grpo}, "b")
    status = stage_status(st, RUN)["stages"]  # rejection_sample rebuilt: the two below it still stand on the old one
    assert [s for s in CHAIN if status[s]["state"] == "stale"] == ["sft_consolidate", "final_rl"]
    assert status["final_rl"]["stale_upstream"] == ["grpo_train", "rejection_sample"]
    sft = _commit(st, "sft_consolidate", {"rejection_sample": rs}, "b")
    _commit(st, "final_rl", {"prepare_data": refs["prepare_data"], "sft_consolidate": sft}, "b")
    assert {stage_status(st, RUN)["stages"][s]["state"] for s in CHAIN} == {"completed"}
