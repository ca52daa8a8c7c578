"""``r1 plan`` on the committed configs, and the same check failing a GPU stage before it starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from grpo_core.config import GRPOConfig, SFTConfig
from grpo_core.models.tiny import build_tiny_model
from grpo_core.plan.memory import GiB
from tasks.config.pipeline import load_config
from tasks.config.plan import StageMemoryError, check_stage_memory, config_hardware, plan_pipeline

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))
SEVEN_B = str(Path(__file__).resolve().parents[2] / "configs" / "qwen2.5-7b-math.yaml")


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_fits_the_hardware_its_header_names(path):
    hw = config_hardware(path)
    plans = plan_pipeline(load_config(path), hw)
    from tasks.config.stages import all_stages

    config = load_config(path)
    runs = [s.name for s in all_stages() if s.pool == "gpu" and s.enabled(config)]  # the optional reward_model too
    # evaluation runs after each stage that makes a model, on its GPUs: one more row
    assert [p.stage for p in plans] == runs + ["evaluate"] and {"cold_start_sft", "grpo_train", "final_rl"} <= set(runs)
    assert [p.stage for p in plans if not p.fits] == [], "\n\n".join(p.table() for p in plans)


def test_plan_7b_on_eight_gpus_fits():
    result = CliRunner().invoke(app, ["plan", "-c", SEVEN_B, "--gpus", "8", "--gpu-memory", "80"])
    assert result.exit_code == 0, result.output
    assert result.output.count("fits                  yes") == 6 and "every GPU stage fits 8x 80 GiB" in result.output


def test_plan_7b_on_one_gpu_names_the_first_stage_and_the_fix():
    result = CliRunner().invoke(app, ["plan", "-c", SEVEN_B, "--gpus", "1", "--gpu-memory", "80"])
    assert result.exit_code == 1
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("error: stage cold_start_sft needs ") and "80.0 GiB available" in last
    assert "4 GPUs" in last  # FSDP over 4 x 80 GiB holds the 7B SFT state


def test_plan_7b_lora_on_one_gpu_fits():
    """use_peft: a frozen bf16 base, adapters with their gradients and AdamW state, no reference copy."""
    result = CliRunner().invoke(app, ["plan", "-c", SEVEN_B.replace("math.yaml", "math-lora.yaml"), "--gpus", "1",
                                      "--gpu-memory", "80"])
    assert result.exit_code == 0, result.output
    assert "every GPU stage fits 1x 80 GiB" in result.output and "reference                  0.00 GiB" in result.output


def test_a_model_the_planner_cannot_size_is_one_error_line(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: {name_or_path: someone/unknown-model}\n")
    result = CliRunner().invoke(app, ["plan", "-c", str(cfg)])
    assert result.exit_code == 1 and "someone/unknown-model" in result.output and "config.json" in result.output


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=64, num_layers=2, num_heads=2)


def test_stage_check_fails_fast_with_the_plan_message(model_path):
    config = SFTConfig(per_device_train_batch_size=64, max_length=1024)
    plan = check_stage_memory("cold_start_sft", "sft", config, model_path, gpus=1, free=8 * GiB, total=8 * GiB)
    assert plan.fits
    # 1 GiB CUDA context + 0.88 GiB of fp32 activations (64 x 1024 tokens x 2 layers x 1792 elements); checkpointing
    # keeps 0.47 GiB of them, bf16 and batch 32 0.44 GiB each
    with pytest.raises(StageMemoryError, match=r"^stage cold_start_sft needs 1\.9 GiB per device, 1\.6 GiB available"
                                               r" .*: gradient_checkpointing: true; bf16: true; per_device_train_batch_size: 32$"):
        check_stage_memory("cold_start_sft", "sft", config, model_path, gpus=1, free=int(1.6 * GiB), total=8 * GiB)


def test_worker_checks_before_training(model_path, tmp_path, monkeypatch):
    """The training worker plans the stage on CUDA before it reads a row; a 'GPU' of 64 MiB fails it."""
    import torch

    from tasks.runner import worker as _worker
    from tasks.config.training_spec import TrainingSpec

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (64 * 2**20, 64 * 2**20))
    spec = TrainingSpec(kind="grpo", config=GRPOConfig(use_vllm=False, generation_batch_size=8, num_generations=4),
                        model_path=str(model_path), rows_path=str(tmp_path / "absent.parquet"),
                        output_dir=str(tmp_path / "o"), store=str(tmp_path / "store"), run="r", stage="grpo_train",
                        key="k")
    with pytest.raises(StageMemoryError, match="stage grpo_train needs"):
        _worker.execute(spec, lambda event: None)


HALF_B = str(Path(__file__).resolve().parents[2] / "configs" / "qwen2.5-0.5b-gsm8k.yaml")


def test_plan_of_the_0_5b_config_lists_its_reward_models():
    """final_rl loads Skywork-Reward-V2-Qwen3-0.6B twice (two names: two RewardModelReward copies), in fp32, on the
    one GPU: a real run used ~33 of 40 GiB where the plan without them said 27.5."""
    result = CliRunner().invoke(app, ["plan", "-c", HALF_B, "--gpus", "1", "--gpu-memory", "40"])
    assert result.exit_code == 0, result.output
    final_rl = result.output.split("final_rl (")[1].split("\n\n")[0]
    assert "reward models: rm_helpful+rm_harmless 2 x 2.22 GiB on GPU 0 (the last visible)" in final_rl
    assert "reward models              4.44 GiB" in final_rl and "peak (training)           32.89 GiB" in final_rl
    rejection = result.output.split("rejection_sample (")[1].split("\n\n")[0]
    assert "rm_helpful|rm_harmless 1 x 2.22 GiB (one at a time)" in rejection
    evaluate = result.output.split("evaluate (")[1].split("\n\n")[0]
    assert "reward models: rm 1 x 2.22 GiB" in evaluate
    eight = CliRunner().invoke(app, ["plan", "-c", HALF_B, "--gpus", "8", "--gpu-memory", "40"])
    assert "2 x 2.22 GiB on GPU 7 (the last visible)" not in eight.output  # 8 ranks: 16 copies there
    assert "rm_helpful+rm_harmless 16 x 2.22 GiB (2 from each of 8 processes) on GPU 7 (the last visible)" in eight.output


def test_the_run_s_reward_model_is_the_base_model_under_a_score_head():
    from grpo_core.plan.memory import Hardware
    from tasks.config.plan import config_shape_of, model_shape, section_scorers

    config = load_config(Path(HALF_B).parent / "tiny-cpu.yaml")  # final_rl: {reward_model: {model: reward_model}} x 2
    base = model_shape(config)
    scorers = section_scorers(config.final_rl, "grpo", config_shape_of(config, base, "final_rl"))
    assert [(s.name, s.shape) for s in scorers] == [("rm_helpful", base), ("rm_harmless", base)]
    plan = next(p for p in plan_pipeline(config, Hardware(1, 4 * GiB, device="cpu")) if p.stage == "final_rl")
    assert plan.components["reward models"] == 2 * scorers[0].weight_bytes > 0


def test_rejection_sampling_check_counts_its_reward_model(tmp_path):
    from transformers import Qwen3Config

    from grpo_core.config import RejectionSamplingConfig

    rm = tmp_path / "rm"
    Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                architectures=["Qwen3ForSequenceClassification"]).save_pretrained(rm)
    section = RejectionSamplingConfig(sources=[{"name": "general", "reward_func": {"reward_model": {"model": str(rm)}},
                                                "min_score": 0.0}], sampling={"use_vllm": False, "batch_size": 8})
    tiny = build_tiny_model(tmp_path / "tiny", hidden_size=64, num_layers=2, num_heads=2)
    plan = check_stage_memory("rejection_sample", "sampling", section, tiny, gpus=1, free=8 * GiB, total=8 * GiB)
    assert plan.components["reward models"] == 4 * (596049920 + 1024)  # read from the folder's config.json
    # 2.22 GiB of fp32 weights + 1 GiB scoring + 1 GiB CUDA context + the tiny model
    with pytest.raises(StageMemoryError, match=r"stage rejection_sample needs 4\.2 GiB"):
        check_stage_memory("rejection_sample", "sampling", section, tiny, gpus=1, free=3 * GiB, total=8 * GiB)
