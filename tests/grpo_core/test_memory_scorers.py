"""The reward models and judges a stage loads, in the memory plan: their size, the GPU they land on, the term."""

from __future__ import annotations

import pytest
from transformers import AutoModelForSequenceClassification, Qwen3Config

from grpo_core.config import GRPOConfig, RejectionSamplingConfig
from grpo_core.plan.memory import CUDA_CONTEXT_BYTES, KNOWN_SHAPES, GiB, Hardware, ModelShape, plan_sampling, plan_training
from grpo_core.plan.scorers import Scorer, place_scorers

SKYWORK = KNOWN_SHAPES["Skywork/Skywork-Reward-V2-Qwen3-0.6B"]


@pytest.mark.parametrize("tied", [True, False])
def test_a_reward_model_is_its_backbone_and_a_score_head(tied):
    config = Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=tied, num_labels=1)
    model = AutoModelForSequenceClassification.from_config(config)  # Qwen3ForSequenceClassification: no lm_head
    scorer = Scorer("rm", "reward_model", ModelShape.from_config(config), batch_size=1, max_length=1)
    assert scorer.num_params == sum(p.numel() for p in model.parameters())


def test_skywork_reward_v2_qwen3_0_6b_in_fp32():
    # Qwen3-0.6B's model card: 0.6B parameters, 0.44B of them outside the (tied) embedding
    assert SKYWORK.num_params / 1e9 == pytest.approx(0.596, abs=0.001)
    assert (SKYWORK.num_params - 151936 * 1024) / 1e9 == pytest.approx(0.44, abs=0.005)
    scorer = Scorer("rm", "reward_model", SKYWORK, batch_size=16, max_length=1024)
    assert scorer.weight_bytes == 4 * (SKYWORK.num_params + 1024)  # float32, as RewardModelReward loads it
    # one layer's widest point: 16 x 1024 tokens x (4 x 1024 + 4 x 3072) fp32 = 1 GiB
    assert scorer.work_bytes == 16 * 1024 * (4 * 1024 + 4 * 3072) * 4 == GiB


def two_rms(device=None):
    return [Scorer(n, "reward_model", SKYWORK, 16, 1024, device=device) for n in ("rm_helpful", "rm_harmless")]


def test_every_rank_puts_its_copies_on_the_last_gpu():
    loads = place_scorers(two_rms(), processes=8, gpus=8, resident=True)
    assert list(loads) == [7]
    last = loads[7]
    assert last.copies == 16 and last.weights == 16 * two_rms()[0].weight_bytes
    assert last.work == 8 * GiB and last.contexts == 7  # ranks score together; 7 of them are guests on GPU 7
    assert last.label(True) == "rm_helpful+rm_harmless 16 x 2.22 GiB (2 from each of 8 processes)"
    own = place_scorers(two_rms("cuda"), processes=8, gpus=8, resident=True)  # the rank's current device
    assert sorted(own) == list(range(8)) and all(v.copies == 2 and v.contexts == 0 for v in own.values())
    assert place_scorers(two_rms("cpu"), processes=8, gpus=8, resident=True) == {}


def test_sampling_holds_one_at_a_time():
    loads = place_scorers(two_rms(), processes=1, gpus=1, resident=False)
    assert loads[0].copies == 1 and loads[0].weights == two_rms()[0].weight_bytes
    assert loads[0].label(False) == "rm_helpful|rm_harmless 1 x 2.22 GiB (one at a time)"


RS = RejectionSamplingConfig(use_vllm=True, vllm_gpu_memory_utilization=0.3, max_prompt_length=512,
                              max_new_tokens=768)
RL = GRPOConfig(use_vllm=True, bf16=True, gradient_checkpointing=True, vllm_gpu_memory_utilization=0.3,
                max_prompt_length=512, max_completion_length=768, generation_batch_size=64, per_device_train_batch_size=8,
                beta=0.001)


def test_an_rl_stage_counts_its_reward_models_in_both_phases():
    shape, hw = KNOWN_SHAPES["Qwen/Qwen2.5-0.5B-Instruct"], Hardware(1, 40 * GiB)
    bare = plan_training("final_rl", "grpo", RL, shape, hw)
    plan = plan_training("final_rl", "grpo", RL, shape, hw, two_rms())
    added = 2 * two_rms()[0].weight_bytes + GiB
    assert plan.components["reward models"] == 2 * two_rms()[0].weight_bytes and plan.components["scoring"] == GiB
    assert plan.train_peak - bare.train_peak == added and plan.generation_peak - bare.generation_peak == added
    assert plan.train_peak / GiB == pytest.approx(32.9, abs=0.05)  # a real run: ~33 GiB of 40 (27.5 planned before)
    assert "reward models: rm_helpful+rm_harmless 2 x 2.22 GiB on GPU 0 (the last visible)" in plan.table()


def test_eight_ranks_stack_on_the_last_gpu_and_the_plan_names_the_fix():
    from grpo_core.plan.memory import plan_stage

    shape, hw = KNOWN_SHAPES["Qwen/Qwen2.5-7B"], Hardware(8, 80 * GiB)
    config = RL.model_copy(update={"distributed_strategy": "fsdp", "per_device_train_batch_size": 4})
    bare = plan_training("final_rl", "grpo", config, shape, hw)
    plan = plan_stage("final_rl", "grpo", config, shape, hw, two_rms())
    assert plan.train_peak - bare.train_peak == 16 * two_rms()[0].weight_bytes + 8 * GiB + 7 * CUDA_CONTEXT_BYTES
    assert not plan.fits and plan.suggestions[-1].startswith("device: cuda in each reward model")
    assert plan_training("final_rl", "grpo", config, shape, hw, two_rms("cuda")).fits


def test_a_sampling_stage_on_several_gpus_puts_them_on_the_last_alone():
    shape = KNOWN_SHAPES["Qwen/Qwen2.5-7B"]
    plan = plan_sampling("rejection_sample", RS, shape, Hardware(8, 80 * GiB), two_rms())
    assert "reward models" not in plan.components  # GPU 0 holds the engine only
    assert plan.elsewhere == {"GPU 7 (reward models)": two_rms()[0].weight_bytes + GiB + CUDA_CONTEXT_BYTES}
    one = plan_sampling("rejection_sample", RS, shape, Hardware(1, 80 * GiB), two_rms())
    assert one.components["reward models"] == two_rms()[0].weight_bytes and not one.elsewhere
    tiny = plan_sampling("rejection_sample", RS, shape, Hardware(8, 3 * GiB), two_rms())
    assert not tiny.fits and tiny.peak == max(tiny.elsewhere.values())


def test_a_judge_adds_its_kv_cache_and_logits():
    shape = KNOWN_SHAPES["Qwen/Qwen2.5-1.5B-Instruct"]
    judge = Scorer("judge", "judge", shape, batch_size=8, max_length=2048, max_new_tokens=128)
    forward = 8 * 2048 * (4 * 1536 + 4 * 8960) * 4
    cache = 8 * (2048 + 128) * shape.kv_bytes_per_token * 2
    assert judge.work_bytes == forward + cache + 2 * 8 * 151936 * 4
    assert judge.num_params == shape.num_params  # a causal LM with its head
