"""rejection_sample over two sources through the pipeline (issue 13, must show 3): chain kept by its rule,
helpful by the run's own reward_model stage output (an input of rejection_sample when a rule names it)."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow.parquet as pq

from flows.r1_pipeline import r1_pipeline
from tasks.config import load_config
from tasks.store import Store

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
