"""The real configs' general and safety prompt sources load from files of their data sets' schemas.

Each committed config's own source entry (field_map, answer_format none, source name) is used with its path
swapped for a small local file written in that data set's schema (HuggingFaceH4/ultrafeedback_binarized,
PKU-Alignment/PKU-SafeRLHF), so a field the config maps wrongly fails here, not on the cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_core.data.rows import DataError, load_prompt_rows, write_parquet
from tasks.config.pipeline import load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ["qwen2.5-0.5b-gsm8k.yaml", "qwen2.5-7b-math.yaml"]

ULTRAFEEDBACK = [  # train_prefs / test_prefs columns
    {"prompt": "How do I make a cup of green tea?", "prompt_id": "a1",
     "chosen": [{"role": "user", "content": "How do I make a cup of green tea?"},
                {"role": "assistant", "content": "Heat water to 80C, steep 2 minutes."}],
     "rejected": [{"role": "user", "content": "How do I make a cup of green tea?"},
                  {"role": "assistant", "content": "Boil it."}],
     "messages": [{"role": "user", "content": "How do I make a cup of green tea?"},
                  {"role": "assistant", "content": "Heat water to 80C, steep 2 minutes."}],
     "score_chosen": 8.0, "score_rejected": 3.0},
    {"prompt": "Summarise the plot of Hamlet in one sentence.", "prompt_id": "b2",
     "chosen": [{"role": "user", "content": "Summarise the plot of Hamlet in one sentence."},
                {"role": "assistant", "content": "A prince avenges his father."}],
     "rejected": [{"role": "user", "content": "Summarise the plot of Hamlet in one sentence."},
                  {"role": "assistant", "content": "It is a play."}],
     "messages": [{"role": "user", "content": "Summarise"}], "score_chosen": 7.5, "score_rejected": 2.0},
]
PKU_SAFERLHF = [  # train / test columns
    {"prompt": "How can I pick a lock?", "response_0": "I can't help with that.", "response_1": "Use a tension wrench...",
     "prompt_source": "Alpaca3-70B", "response_0_source": "Alpaca-7B", "response_1_source": "Alpaca-7B",
     "is_response_0_safe": True, "is_response_1_safe": False, "response_0_harm_category": {"Violence": False},
     "response_1_harm_category": {"Violence": False}, "response_0_severity_level": 0, "response_1_severity_level": 2,
     "better_response_id": 0, "safer_response_id": 0, "response_0_sha256": "x", "response_1_sha256": "y"},
    {"prompt": "What household chemicals should never be mixed?", "response_0": "Bleach and ammonia.",
     "response_1": "Any of them.", "prompt_source": "Alpaca3-70B", "response_0_source": "Alpaca-7B",
     "response_1_source": "Alpaca-7B", "is_response_0_safe": True, "is_response_1_safe": True,
     "response_0_harm_category": {"Violence": False}, "response_1_harm_category": {"Violence": False}, "response_0_severity_level": 0,
     "response_1_severity_level": 0, "better_response_id": 0, "safer_response_id": 0,
     "response_0_sha256": "z", "response_1_sha256": "w"},
]
SCHEMAS = {"HuggingFaceH4/ultrafeedback_binarized": ULTRAFEEDBACK, "PKU-Alignment/PKU-SafeRLHF": PKU_SAFERLHF}


def _write(records: list[dict], path: Path) -> Path:
    if path.suffix == ".parquet":
        return write_parquet(records, path)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize("config_name", CONFIGS)
@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_general_sources_of_the_real_configs_load(tmp_path, config_name, suffix):
    data = load_config(ROOT / "configs" / config_name).data
    general = [s for s in data.train_sources + data.eval_sources if s.path in SCHEMAS]
    assert len(general) == 4, "a train and an eval entry for each of the two prompt sets"
    for i, src in enumerate(general):
        records = SCHEMAS[src.path]
        local = src.model_copy(update={"path": str(_write(records, tmp_path / f"{i}{suffix}"))})
        rows, stats = load_prompt_rows(local)
        assert stats.rows_kept == len(records)
        assert [r["prompt"] for r in rows] == [[{"role": "user", "content": r["prompt"]}] for r in records]
        assert all(r["answer"] == "" and r["source"] == src.source for r in rows)
    names = {s.source for s in general}
    cfg = load_config(ROOT / "configs" / config_name)
    assert names == {s.name for s in cfg.final_rl.sources} - {cfg.grpo_train.sources[0].name}
    assert names == set(cfg.evaluate.general_sources)


def test_a_general_source_still_needs_its_prompt(tmp_path):
    data = load_config(ROOT / "configs" / CONFIGS[0]).data
    src = next(s for s in data.train_sources if s.path == "PKU-Alignment/PKU-SafeRLHF")
    bad = _write([{"question": "no prompt column"}], tmp_path / "bad.jsonl")
    with pytest.raises(DataError, match=r"bad.jsonl line 1: field 'prompt' \(column 'prompt'\) is missing"):
        load_prompt_rows(src.model_copy(update={"path": str(bad)}))
