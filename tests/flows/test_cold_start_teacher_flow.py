"""Teacher cold start through the stages (issue 13, must show 1): prepare_data samples chains of thought from a
local teacher model, verifies them with the chain reward, filters them for readability and commits them with
per-filter counts in its manifest; cold_start_sft trains on them.

    python -m pytest -q tests/flows/test_cold_start_teacher_flow.py

The teacher is a tiny model fine-tuned for a few seconds on the chain task's worked solutions (it stands in for
a finished embedded-default model: some samples right, some wrong).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from flows.stages import stage_flow
from grpo_core.config import SFTConfig
from grpo_core.data.synthetic import chain_accuracy, make_chain_rows, make_cold_start_rows
from grpo_core.models.tiny import build_tiny_model
from grpo_core.trainer.sft import train_sft
from tasks.config.pipeline import load_config
from tasks.storage.manifest import StageRef
from tasks.storage.store import Store

ROOT = Path(__file__).resolve().parents[2]


def _teacher(tmp_path: Path, prompts: list[dict]) -> str:
    torch.set_num_threads(1)
    base = build_tiny_model(tmp_path / "teacher_base", hidden_size=64, num_layers=2, num_heads=2)
    return train_sft(SFTConfig(learning_rate=3e-3, max_steps=60, per_device_train_batch_size=8, save_steps=1000,
                               report_to=["jsonl"], lr_scheduler_type="constant"),
                     base, make_cold_start_rows(prompts, direct_fraction=0.0), tmp_path / "teacher")["final_path"]


def _config(tmp_path: Path, prompts: list[dict], teacher: str):
    prompt_file = tmp_path / "teacher_prompts.jsonl"
    prompt_file.write_text("".join(json.dumps({"prompt": r["prompt"][0]["content"], "answer": r["answer"]}) + "\n"
                                   for r in prompts))
    config = load_config(ROOT / "configs" / "ci-tiny.yaml")
    data = config.data.model_validate({**config.data.model_dump(), "cold_start_size": 0, "decontaminate": False,
                                       "cold_start_sources": [{
        "kind": "teacher", "model": teacher, "prompts": {"path": str(prompt_file), "task": "chain"},
        "sampling": {"num_generations": 4, "max_completion_length": 40, "temperature": 1.0, "top_p": 1.0},
        "keep_per_prompt": 2, "reward_func": "chain_accuracy", "readability": {"max_chars": 50}}]})
    return config.model_copy(update={"data": data})


def test_a_teacher_can_be_another_runs_committed_model(tmp_path, monkeypatch):
    """``model: run:RUN/STAGE`` (R1-Zero-style outputs as the teacher): the run's committed model is fetched,
    becomes a parent of prepare_data (so a newer teacher output is a new fingerprint), and rows and stats name
    the reference; a reference to nothing fails naming the field and the fix."""
    monkeypatch.setenv("R1_WORKDIR", str(tmp_path / "work"))
    prompts = make_chain_rows(8, seed=0)
    teacher = _teacher(tmp_path, prompts)
    store_url = str(tmp_path / "store")
    store = Store(store_url)
    missing = _config(tmp_path, prompts, "run:zero/grpo_train")
    with pytest.raises(Exception, match=r"cold_start_sources\[0\].model 'run:zero/grpo_train'.*run that stage first"):
        stage_flow("prepare_data")(run="teach", config=missing, store=store_url)
    writer = store.begin("zero", "grpo_train")
    writer.put_dir(Path(teacher), "model")
    zero = writer.commit(fingerprint="f", config={}, parents={}, metrics={})
    prep = StageRef.from_dict(stage_flow("prepare_data")(run="teach", config=missing, store=store_url))
    manifest = store.manifest(prep)
    assert manifest["parents"]["teacher:run:zero/grpo_train"]["version"] == zero.version
    stats = manifest["data_stats"]["sources"]["cold_start:teacher:run:zero/grpo_train"]
    rows = pq.read_table(io.BytesIO(store.read_output(prep, "cold_start.parquet"))).to_pylist()
    assert stats["samples"] == 32 and stats["kept"] == len(rows) > 0
    assert {r["source"] for r in rows} == {"teacher:run:zero/grpo_train"}
    writer = store.begin("zero", "grpo_train")  # a newer teacher output: prepare_data is not reused
    writer.put_dir(Path(teacher), "model")
    writer.commit(fingerprint="g", config={}, parents={}, metrics={})
    again = StageRef.from_dict(stage_flow("prepare_data")(run="teach", config=missing, store=store_url))
    assert again.version != prep.version and again.fingerprint != prep.fingerprint


def test_prepare_data_commits_verified_teacher_traces_and_cold_start_sft_trains(tmp_path, monkeypatch):
    monkeypatch.setenv("R1_WORKDIR", str(tmp_path / "work"))
    prompts = make_chain_rows(8, seed=0)
    teacher = _teacher(tmp_path, prompts)
    config = _config(tmp_path, prompts, teacher)
    store_url = str(tmp_path / "store")
    prep = StageRef.from_dict(stage_flow("prepare_data")(run="teach", config=config, store=store_url))
    store = Store(store_url)
    manifest = store.manifest(prep)
    stats = manifest["data_stats"]["sources"][f"cold_start:teacher:{teacher}"]
    rejected = {k: v for k, v in stats.items() if k.startswith("rejected/")}
    assert stats["samples"] == 32 == stats["kept"] + stats["unverified"] + stats["duplicate"] + stats["over_limit"] + sum(
        rejected.values())
    assert stats["kept"] > 0 and stats["unverified"] > 0 and rejected["rejected/overlong"] > 0, stats
    rows = pq.read_table(io.BytesIO(store.read_output(prep, "cold_start.parquet"))).to_pylist()
    assert len(rows) == stats["kept"] == manifest["metrics"]["data/num_cold_start"]
    answers = {r["prompt"][0]["content"]: r["answer"] for r in prompts}
    assert chain_accuracy([r["completion"] for r in rows], [answers[r["prompt"][0]["content"]] for r in rows]) == [1.0] * len(rows)
    assert all(len(r["completion"]) <= 50 for r in rows)
    sft = StageRef.from_dict(stage_flow("cold_start_sft")(run="teach", config=config, store=store_url))
    assert store.manifest(sft)["metrics"]["train/steps"] == config.cold_start_sft.max_steps
