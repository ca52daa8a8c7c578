"""sft_consolidate as R1 (issue 13, must show 4): the committed SFT set mixes rejection-sampled reasoning with a
general chat source at the configured ratio (counts by source within one row), and a different base model named
by ``init_from: model`` is what trains.

    python -m pytest -q tests/flows/test_consolidation_mix.py
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow.parquet as pq

from flows.r1_pipeline import r1_pipeline
from grpo_core.models.tiny import build_tiny_model
from tasks.config.pipeline import load_config
from tasks.storage.manifest import StageRef
from tasks.storage.store import Store

ROOT = Path(__file__).resolve().parents[2]


def test_consolidation_mixes_general_data_at_the_ratio_into_another_base(tmp_path, monkeypatch):
    monkeypatch.setenv("R1_WORKDIR", str(tmp_path / "work"))
    chat = tmp_path / "ultrachat.jsonl"  # HuggingFaceH4/ultrachat_200k's columns
    chat.write_text("".join(json.dumps({"prompt": f"Say {i}.", "prompt_id": str(i), "messages": [
        {"role": "user", "content": f"Say {i}."}, {"role": "assistant", "content": f"{i}."}]}) + "\n" for i in range(40)))
    other_base = build_tiny_model(tmp_path / "other_base", hidden_size=48, num_layers=1, num_heads=2,
                                  max_position_embeddings=128)
    config = load_config(ROOT / "configs" / "ci-tiny.yaml")
    section = config.sft_consolidate.model_copy(update={"init_from": "model", "init_model": str(other_base),
                                                         "cold_start_mix": 0.0, "reasoning_to_general": 3.0})
    section = type(section).model_validate({**section.model_dump(), "general_sources": [
        {"path": str(chat), "split": "train_sft", "field_map": {"messages": "messages"}}]})
    config = config.model_copy(update={"sft_consolidate": section})
    out = r1_pipeline(config=config, run_name="mix", store=str(tmp_path / "store"))  # final_rl then starts from it
    store = Store(str(tmp_path / "store"))
    ref = StageRef.from_dict(out["stages"]["sft_consolidate"])
    rows = pq.read_table(io.BytesIO(store.read_output(ref, "sft_rows.parquet"))).to_pylist()
    counts = {s: sum(r["source"] == s for r in rows) for s in {r["source"] for r in rows}}
    reasoning, general = counts["reasoning"], counts[f"general:{chat}"]
    assert reasoning == 8  # rejection_sample keeps 1 of 2 samples for each of 8 prompts (ci-tiny accepts all)
    assert abs(general - reasoning / 3.0) <= 0.5 and set(counts) == {"reasoning", f"general:{chat}"}
    manifest = store.manifest(ref)
    assert manifest["metrics"]["data/num_rows/reasoning"] == reasoning
    assert "rejection_sample" in manifest["parents"] and "grpo_train" not in manifest["parents"]
    model_files = {k for k in manifest["files"] if k.startswith("model/")}
    assert "model/config.json" in model_files
    assert json.loads(store.read_output(ref, "model/config.json"))["hidden_size"] == 48  # the other base trained
