"""The embedded default's base model can be pretrained on worked solutions of the built-in task
(model.tiny.pretrain + data.pretrain_size): prepare_data builds the random init, trains it on the corpus and
commits the result as base_model/."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from grpo_core.config import DataConfig
from grpo_core.data.synthetic import chain_accuracy, evaluate_chain
from grpo_core.evaluation.heldout import is_direct
from grpo_core.recipe.prepare import prepare_datasets
from tasks.config.pipeline import PipelineConfig
from tasks.config.stages import get_stage

prepare_data = get_stage("prepare_data").task

TINY = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "max_position_embeddings": 64}


def test_the_pretraining_corpus_is_worked_in_full_and_holds_no_held_out_problem():
    data = prepare_datasets(DataConfig(num_train=50, num_eval=40, cold_start_size=30, pretrain_size=300, seed=4))
    assert len(data.pretrain) == 300 and data.stats["num_pretrain"] == 300
    held_out = {r["prompt"][0]["content"] for r in data.eval}
    texts = [r["prompt"][0]["content"] for r in data.pretrain]
    assert not held_out & set(texts)
    completions = [r["completion"] for r in data.pretrain]
    answers = [str(evaluate_chain(t)) for t in texts]
    assert chain_accuracy(completions, answer=answers) == [1.0] * 300
    assert not any(is_direct(c) for c in completions)  # every step written, one operation each
    assert all(c.count("=") == t.count("+") + t.count("-") + t.count("*") for c, t in zip(completions, texts))
    assert prepare_datasets(DataConfig(num_train=50, num_eval=40, cold_start_size=30, pretrain_size=300,
                                       seed=4)).pretrain == data.pretrain
    assert prepare_datasets(DataConfig(num_train=50, num_eval=40, cold_start_size=30, seed=4)).pretrain == []


def test_the_general_sources_add_plain_echoes_to_the_corpus():
    data = prepare_datasets(DataConfig(num_train=50, num_eval=40, cold_start_size=30, pretrain_size=100, seed=1,
                                       builtin_general=["helpful", "unsafe"], general_num_eval=30,
                                       general_pretrain_size=60))
    general = data.pretrain[100:]
    assert len(general) == 120
    held_out = {r["prompt"][0]["content"] for r in data.eval}
    for row in general:
        verb, word = row["prompt"][0]["content"].split()
        assert verb in ("echo", "hack") and row["prompt"][0]["content"] not in held_out
        assert row["completion"] == f"<think></think><answer>{word}</answer>"  # never the preferred answer


def test_pretrain_without_a_corpus_is_refused_naming_both_fields():
    with pytest.raises(ValueError, match=r"model.tiny.pretrain.*data.pretrain_size"):
        PipelineConfig.model_validate({"model": {"tiny": {**TINY, "pretrain": {"max_steps": 2}}}})


def test_prepare_data_commits_the_pretrained_base(tmp_path):
    def config(pretrain: dict | None) -> PipelineConfig:
        return PipelineConfig.model_validate({
            "model": {"tiny": {**TINY, "pretrain": pretrain}},
            "data": {"num_train": 40, "num_eval": 20, "cold_start_size": 20, "pretrain_size": 200},
            "run": {"torch_num_threads": 1},
        })

    plain = prepare_data.fn(config(None), "plain", str(tmp_path / "store"))
    trained = prepare_data.fn(config({"max_steps": 30, "learning_rate": 3e-3, "per_device_train_batch_size": 16}),
                              "trained", str(tmp_path / "store"))
    assert "pretrain/loss" not in plain.metrics
    assert trained.metrics["pretrain/steps"] == 30 and trained.metrics["pretrain/loss"] < 4.5  # ln(264) = 5.6 at init
    before = load_file(tmp_path / "store" / plain.path / "base_model" / "model.safetensors")
    after = load_file(tmp_path / "store" / trained.path / "base_model" / "model.safetensors")
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # same init (seed 0), then trained
    assert trained.fingerprint != plain.fingerprint  # the pretraining is part of what the stage made
    assert not (tmp_path / "store" / trained.path / "base_model" / "checkpoint-30").exists()
