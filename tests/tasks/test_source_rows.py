"""An RL stage whose mixture names a source prepare_data left without rows fails before loading anything, naming
prepare_data's cause (decontamination, with the shared n-gram) rather than only "no training rows"."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from grpo_core.config import GRPOConfig
from tasks.runner.common import StageFailed
from tasks.stages.rl import check_source_rows
from tasks.storage.store import Store


def _prepare_data_ref(store, stats, metrics):
    with store.begin("r", "prepare_data") as writer:
        return writer.commit(fingerprint="fp", config={}, parents={}, metrics=metrics, extra={"data_stats": stats})


def _section(*names):
    return GRPOConfig(generation_batch_size=8 * len(names), num_generations=8,
                      sources=[{"name": n, "weight": 1.0, "reward_funcs": ["math_accuracy"]} for n in names])


def test_missing_source_names_decontamination_and_the_shared_ngram(tmp_path):
    store = Store(str(tmp_path / "store"))
    ref = _prepare_data_ref(store, {
        "ngram_size": 13, "train_by_source": {"ultrafeedback": 8},
        "train_contaminated_by_source": {"gsm8k": {"removed": 24, "of": 24, "example_ngram": "think step by step"}},
    }, {"data/ultrafeedback/num_train": 8.0})
    ctx = SimpleNamespace(store=store, stage="grpo_train")
    with pytest.raises(StageFailed) as e:
        check_source_rows(ctx, _section("gsm8k", "ultrafeedback"), ref)
    msg = str(e.value)
    assert "source 'gsm8k'" in msg and "decontamination dropped all 24" in msg and "'think step by step'" in msg
    with pytest.raises(StageFailed) as e:  # a name no data source has: the names that exist
        check_source_rows(ctx, _section("gsm8", "ultrafeedback"), ref)
    assert "wrote no rows with this source (the train sources are: ultrafeedback)" in str(e.value)
    check_source_rows(ctx, _section("ultrafeedback"), ref)  # every source has rows: nothing to say
