"""The trainer's config crosses to the training child as one typed spec (tasks.config.training_spec): what the user set
arrives as set, so ``num_train_epochs`` without ``max_steps`` trains that many epochs through the pipeline; run
settings (threads) have one home; fields a stage would ignore are refused or honoured."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from grpo_core.config import DataConfig, GRPOConfig, SFTConfig
from grpo_core.data.rows import write_parquet
from grpo_core.models.tiny import build_tiny_model
from grpo_core.recipe.prepare import prepare_datasets
from grpo_core.trainer.sft import resolve_max_steps
from tasks.config.pipeline import TRAINER_SECTIONS, ConfigError, PipelineConfig, load_config, parse_config
from tasks.config.training_spec import TrainingSpec, trainer_config
from tasks.config.stages import get_stage
from tasks.runner.common import fingerprint, resolve_reward_models
from tasks.storage.store import Store

ROOT = Path(__file__).resolve().parents[2]
TINY = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "max_position_embeddings": 64}
COLD_START_ROWS, BATCH, EPOCHS = 24, 8, 2
KINDS = {"cold_start_sft": "sft", "reward_model": "reward", "grpo_train": "grpo", "sft_consolidate": "sft",
         "final_rl": "grpo"}


def spec_of(kind: str, config) -> TrainingSpec:
    return TrainingSpec(kind=kind, config=config, model_path="m", rows_path="rows.parquet", output_dir="out",
                        store="store", run="r", stage="s", key="k")


def commit_prepare_data(store: Store, run: str, tmp: Path):
    """A prepare_data output as the stage writes it: the tiny base model and ``COLD_START_ROWS`` cold-start rows."""
    out = tmp / "prep"
    build_tiny_model(out / "base_model", **TINY)
    rows = prepare_datasets(DataConfig(num_train=20, num_eval=10, cold_start_size=COLD_START_ROWS, seed=0)).cold_start
    write_parquet(rows, out / "cold_start.parquet")
    with store.begin(run, "prepare_data") as writer:
        writer.put_dir(out)
        return writer.commit(fingerprint="test", config={}, parents={}, metrics={})


def test_num_train_epochs_without_max_steps_trains_that_many_epochs_in_the_child(tmp_path):
    """The subprocess path (the spec written to JSON and read by ``python -m tasks.runner.worker``): 2 epochs of 24 rows
    in steps of 8 rows are 6 steps, not max_steps' default."""
    config = PipelineConfig.model_validate({
        "model": {"tiny": TINY},
        "cold_start_sft": {"num_train_epochs": EPOCHS, "per_device_train_batch_size": BATCH, "max_length": 64,
                           "learning_rate": 1e-3, "report_to": ["jsonl"], "save_steps": 1000},
        "run": {"isolation": "subprocess", "torch_num_threads": 1, "retries": 0},
    })
    store = Store(tmp_path / "store")
    data = commit_prepare_data(store, "r", tmp_path)
    ref = get_stage("cold_start_sft").task.fn(config, "r", str(tmp_path / "store"), {"prepare_data": data})
    steps = EPOCHS * COLD_START_ROWS // BATCH
    assert ref.metrics["train/steps"] == steps
    manifest = store.manifest(ref)
    assert manifest["training"]["steps_logged"] == steps
    assert [json.loads(line)["step"] for line in store.read_output(ref, "metrics.jsonl").decode().splitlines()] \
        == list(range(1, steps + 1))


def test_the_spec_carries_the_fields_the_section_set_and_the_child_reads_them_as_set():
    config = PipelineConfig.model_validate({
        "model": {"tiny": TINY},
        "sft_consolidate": {"init_from": "grpo_train", "learning_rate": 3e-4, "num_train_epochs": EPOCHS},
        "run": {"torch_num_threads": 3},
    })
    trainer = trainer_config("sft", config.sft_consolidate, torch_num_threads=config.run.torch_num_threads)
    wire = spec_of("sft", trainer).model_dump_json()
    # the stage-only field (init_from) stays behind, no default is written out, the run's threads are added
    assert json.loads(wire)["config"] == {"learning_rate": 3e-4, "num_train_epochs": EPOCHS, "torch_num_threads": 3}
    child = TrainingSpec.model_validate_json(wire)
    assert type(child.config) is SFTConfig and child.config == trainer
    assert child.config.model_fields_set == {"learning_rate", "num_train_epochs", "torch_num_threads"}
    assert resolve_max_steps(child.config, COLD_START_ROWS) == EPOCHS * COLD_START_ROWS // SFTConfig().per_device_train_batch_size


def test_epochs_survive_a_full_dump_and_change_the_fingerprint():
    """A saved run config (``r1 stage`` reads it back) or a deployment's parameters are full dumps: max_steps left
    out is a value (None), so the step count is still the epochs', and the fingerprint tells the two apart."""
    config = PipelineConfig.model_validate({"model": {"tiny": TINY}, "cold_start_sft": {"num_train_epochs": EPOCHS}})
    saved = PipelineConfig.model_validate(config.model_dump(mode="json"))
    assert resolve_max_steps(saved.cold_start_sft, 80) == EPOCHS * 80 // 8
    explicit = SFTConfig(num_train_epochs=EPOCHS, max_steps=100)  # the value the pipeline used to train for
    assert resolve_max_steps(explicit, 80) == explicit.max_steps
    assert fingerprint("cold_start_sft", saved.cold_start_sft, {}) != fingerprint("cold_start_sft", explicit, {})


def test_a_spec_holds_its_own_trainer_config_only():
    with pytest.raises(ValidationError, match="a grpo spec takes a GRPOConfig, got a SFTConfig"):
        spec_of("grpo", SFTConfig())
    with pytest.raises(ValidationError, match="num_generations"):  # a dict is validated as the kind's config
        spec_of("grpo", {"num_generations": 1})


def test_naming_the_reward_model_stage_keeps_the_set_fields():
    section = GRPOConfig(learning_rate=1e-5, reward_funcs=["format", {"reward_model": {"model": "reward_model"}}])
    ctx = SimpleNamespace(stage="final_rl", fetch=lambda ref, name: Path("/fetched/rm"))
    resolved = resolve_reward_models(ctx, section, {"reward_model": object()})
    assert resolved.reward_funcs[1].model == "/fetched/rm" and section.reward_funcs[1].model == "reward_model"
    assert resolved.model_fields_set == {"learning_rate", "reward_funcs"}
    wire = json.loads(spec_of("grpo", trainer_config("grpo", resolved, torch_num_threads=None)).model_dump_json())
    assert set(wire["config"]) == {"learning_rate", "reward_funcs"}


def test_the_embedded_default_runs_every_trainer_on_the_run_threads():
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the shipped configs use the one home
        config = load_config(ROOT / "configs" / "tiny-cpu.yaml")
    assert config.run.torch_num_threads == 2
    assert config.model.tiny.pretrain.torch_num_threads is None  # prepare_data trains it in the stage's process
    for name, kind in KINDS.items():
        section = getattr(config, name)
        assert section.torch_num_threads is None, name
        assert trainer_config(kind, section, torch_num_threads=config.run.torch_num_threads).torch_num_threads == 2
    assert {path[0] for path in TRAINER_SECTIONS} >= set(KINDS)


def test_a_section_torch_num_threads_moves_to_run_with_a_warning():
    with pytest.warns(FutureWarning, match=r"grpo_train.torch_num_threads, model.tiny.pretrain.torch_num_threads: "
                                           r"deprecated.*run.torch_num_threads: 2"):
        config = parse_config({"model": {"tiny": {**TINY, "pretrain": {"max_steps": 2, "torch_num_threads": 2}}},
                               "data": {"pretrain_size": 10}, "grpo_train": {"torch_num_threads": 2}})
    assert config.run.torch_num_threads == 2
    assert config.grpo_train.torch_num_threads is None and config.model.tiny.pretrain.torch_num_threads is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # a saved run config (a full dump) reads back quietly
        assert PipelineConfig.model_validate(config.model_dump(mode="json")) == config
    with pytest.raises(ConfigError, match=r"c.yaml: \(top level\): .*grpo_train.torch_num_threads: 2, "
                                          r"run.torch_num_threads: 1: threads are one run setting"):
        parse_config({"grpo_train": {"torch_num_threads": 2}, "run": {"torch_num_threads": 1}}, "c.yaml")


def test_grpo_refuses_gradient_accumulation_steps_naming_section_and_what_to_set(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: {tiny: {}}\ncold_start_sft:\n  gradient_accumulation_steps: 4\n"
                    "final_rl:\n  gradient_accumulation_steps: 4\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert message.startswith(f"{path}:5: final_rl.gradient_accumulation_steps: Value error, "
                              "gradient_accumulation_steps (4) does nothing in GRPO")
    assert "per_device_train_batch_size" in message and "cold_start_sft" not in message  # SFT accumulates


def test_the_heldout_scoring_and_tracking_lineage_cross_to_the_child_intact():
    from grpo_core.config import TrackingInfo

    config = load_config(ROOT / "configs" / "tiny-cpu.yaml")  # evaluate names the reward_model stage's model
    grpo = trainer_config("grpo", config.grpo_train.model_copy(update={"eval_steps": 25}), torch_num_threads=1)
    scoring = config.evaluate.model_copy(update={"rm_reward": None, "benchmarks": []})  # tasks.runner.training.heldout_inputs
    tracking = TrackingInfo(group="r", name="grpo_train", run_key="r-grpo_train-abc",
                            metadata={"run": "r", "parents": {"prepare_data": {"version": "v1"}}})
    spec = spec_of("grpo", grpo).model_copy(update={"eval_rows_path": "eval.parquet", "eval_config": scoring,
                                                    "tracking": tracking})
    child = TrainingSpec.model_validate_json(spec.model_dump_json())
    assert child.config.eval_steps == 25 and child.eval_config == scoring and child.tracking == tracking
    assert child.eval_config.general_sources == ["helpful", "unsafe"]  # the slice leaves the general rows out
