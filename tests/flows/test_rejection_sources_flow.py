"""rejection_sample over two sources through the pipeline (issue 13, must show 3): chain kept by its rule,
helpful by the run's own reward_model stage output (an input of rejection_sample when a rule names it). Then
sft_consolidate counts the helpful answers as general, not reasoning (issue 26): labelled so in the set as it is,
and at reasoning_to_general 3 with a general chat source, reasoning : all general rows = 3 within one row."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow.parquet as pq

from flows.r1_pipeline import r1_pipeline
from flows.stages import stage_flow
from tasks.config.pipeline import load_config
from tasks.storage.store import Store

CONFIG = Path(__file__).with_name("mixture-tiny.yaml")


def test_rejection_sample_keeps_each_source_by_its_rule(tmp_path, monkeypatch):
    monkeypatch.setenv("R1_WORKDIR", str(tmp_path / "work"))
    config = load_config(CONFIG)
    rs = config.rejection_sample.model_dump(exclude={"reward_threshold", "reward_func", "sources"}, exclude_unset=True)
    rs["sources"] = [  # the untrained tiny model is never correct: chain passes everything (threshold 0)
        {"name": "chain", "reward_func": "chain_accuracy", "reward_threshold": 0.0},
        {"name": "helpful", "reward_func": {"reward_model": {"model": "reward_model", "scope": "full"}},
         "min_score": -1.0e9, "keep_per_prompt": 1},
    ]
    config = config.model_copy(update={"rejection_sample": type(config.rejection_sample).model_validate(rs)})
    r1_pipeline(config=config, run_name="rs", store=str(tmp_path / "store"))  # consolidation trains on both
    store = Store(str(tmp_path / "store"))
    ref = store.latest("rs", "rejection_sample")
    assert "reward_model" in store.manifest(ref)["parents"]
    metrics = ref.metrics
    assert metrics["rs/chain/num_prompts"] == 8 and metrics["rs/helpful/num_prompts"] == 8  # max_prompts each
    assert metrics["rs/helpful/num_kept"] == 8  # k=1 per prompt; every score is above -1e9
    assert metrics["rs/chain/num_kept"] >= 8 and metrics["rs/prompts_unlisted"] > 0  # unsafe is not listed
    sources = pq.read_table(io.BytesIO(store.read_output(ref, "samples.parquet"))).column("source").to_pylist()
    assert sources.count("helpful") == 8 and sources.count("chain") == metrics["rs/chain/num_kept"]

    # sft_consolidate (no general_sources: the set as it is, cold_start_mix 0.5 of helpful/unsafe rows)
    sft = store.latest("rs", "sft_consolidate")
    rows = pq.read_table(io.BytesIO(store.read_output(sft, "sft_rows.parquet"))).to_pylist()
    counts = {s: sum(r["source"] == s for r in rows) for s in {r["source"] for r in rows}}
    assert set(counts) == {"reasoning", "general:helpful", "general:unsafe"}
    assert counts["reasoning"] == metrics["rs/chain/num_kept"]  # the helpful answers are not reasoning
    assert counts["general:helpful"] + counts["general:unsafe"] == 8 + sft.metrics["data/num_mixed_cold_start"]
    assert not any(_prompt(r).startswith(("echo ", "hack ")) for r in rows if r["source"] == "reasoning")
    assert sft.metrics["data/num_rows/reasoning"] == counts["reasoning"]

    # with a general chat source at 3:1, every general row counts: helpful answers, cold-start and chat rows
    chat = tmp_path / "chat.jsonl"
    chat.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Say {i}."},
                                                     {"role": "assistant", "content": f"{i}."}]}) + "\n"
                            for i in range(40)))
    section = type(config.sft_consolidate).model_validate({
        **config.sft_consolidate.model_dump(exclude_unset=True), "reasoning_to_general": 3.0,
        "general_sources": [{"path": str(chat), "field_map": {"messages": "messages"}}]})
    stage_flow("sft_consolidate")(run="rs", config=config.model_copy(update={"sft_consolidate": section}),
                                  store=str(tmp_path / "store"))
    mixed = store.latest("rs", "sft_consolidate")
    rows = pq.read_table(io.BytesIO(store.read_output(mixed, "sft_rows.parquet"))).to_pylist()
    reasoning = sum(r["source"] == "reasoning" for r in rows)
    general = sum(r["source"].startswith("general:") for r in rows)
    assert reasoning == metrics["rs/chain/num_kept"] and abs(general - reasoning / 3.0) <= 0.5  # was 32 : 11
    assert len(rows) == reasoning + general and mixed.metrics["data/num_rows/reasoning"] == reasoning
    assert sum(v for k, v in mixed.metrics.items() if k.startswith("data/num_rows/general:")) == general


def _prompt(row):
    return row["prompt"][-1]["content"]
