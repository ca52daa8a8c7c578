"""The memory planner's arithmetic against parameter counts of real models and hand-computed cases."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from grpo_core.config import GRPOConfig, SFTConfig
from grpo_core.plan.memory import (
    CUDA_CONTEXT_BYTES,
    GiB,
    KNOWN_SHAPES,
    Hardware,
    ModelShape,
    activation_bytes,
    logprob_chunk_bytes,
    model_state_bytes,
    plan_stage,
    plan_training,
    resolve_model_shape,
)

# A shape small enough to count by hand: h 8, i 16, 2 layers, 2 heads of 4, 1 KV head, vocab 10, tied, Qwen2 biases.
SMALL = ModelShape(hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1, vocab_size=10, tie_word_embeddings=True)
# per layer: q 8*8+8, k 8*4+4, v 8*4+4, o 8*8, MLP 3*8*16, norms 2*8 = 72+36+36+64+384+16 = 608
# root: embedding 10*8 (tied) + final norm 8 = 88; total 88 + 2*608 = 1304
SMALL_PARAMS = 1304


def test_hand_counted_parameters():
    assert SMALL.layer_params == 608 and SMALL.root_params == 88 and SMALL.num_params == SMALL_PARAMS


@pytest.mark.parametrize("cls, bias", [(Qwen2Config, True), (LlamaConfig, False)])
def test_parameter_count_matches_an_instantiated_model(cls, bias):
    config = cls(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(config)
    shape = ModelShape.from_config(config)
    assert shape.attention_bias is bias
    assert shape.num_params == sum(p.numel() for p in model.parameters())


# Model cards (huggingface.co/Qwen/Qwen2.5-*): "Number of Parameters" 0.49B, 1.54B, 3.09B, 7.61B, 14.7B, 32.5B.
@pytest.mark.parametrize("name, billions", [("Qwen/Qwen2.5-0.5B", 0.49), ("Qwen/Qwen2.5-1.5B", 1.54),
                                            ("Qwen/Qwen2.5-3B", 3.09), ("Qwen/Qwen2.5-7B", 7.61),
                                            ("Qwen/Qwen2.5-14B", 14.7), ("Qwen/Qwen2.5-32B", 32.5)])
def test_known_shapes_give_the_published_sizes(name, billions):
    assert KNOWN_SHAPES[name].num_params / 1e9 == pytest.approx(billions, rel=0.01)


def test_local_folder_wins_over_the_table_and_unknown_names_say_what_to_do(tmp_path):
    Qwen2Config(vocab_size=10, hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, tie_word_embeddings=True).save_pretrained(tmp_path)
    assert resolve_model_shape(str(tmp_path)).num_params == SMALL_PARAMS
    with pytest.raises(ValueError, match="config.json"):
        resolve_model_shape("someone/unknown-model")


def test_model_state_single_ddp_fsdp_by_hand():
    p = SMALL_PARAMS
    tied = 2 * 10 * 8  # the tied embedding's two [V, h] backward temporaries
    assert model_state_bytes(SMALL, "single", 1, device="cpu", reference=True) == {
        "weights": 4 * p, "gradients": 4 * p + 4 * tied, "optimizer": 8 * p, "reference": 4 * p}
    ddp = model_state_bytes(SMALL, "ddp", 2, device="cuda", bf16=True)
    assert ddp == {"weights": 6 * p, "gradients": 8 * p, "optimizer": 8 * p, "reference": 0}  # bf16 casts, flat buffer
    # FSDP over 4 GPUs, bf16: shard 326 params; unsharded bf16 root (88) + 2 layers (1216) for compute
    fsdp = model_state_bytes(SMALL, "fsdp", 4, device="cuda", bf16=True, reference=True)
    assert fsdp == {"weights": 4 * 326 + 2 * (88 + 1216), "gradients": 4 * 326 + 2 * (88 + tied),
                    "optimizer": 8 * 326 + 4 * 326, "reference": 4 * 326}
    cpu = model_state_bytes(SMALL, "fsdp", 4, device="cpu")  # fp32; single-tensor AdamW: largest shard 80/4
    assert cpu["optimizer"] == 8 * 326 + 4 * 20 and cpu["weights"] == 4 * 326 + 4 * (88 + 1216)
    off = model_state_bytes(SMALL, "fsdp", 4, device="cuda", bf16=True, offload=True)
    assert off["optimizer"] == 0 and off["weights"] == 2 * (88 + 1216)


def test_lora_state_by_hand():
    # SMALL: h=8, heads 2 (head_dim 4, q 8), kv 1 head (4), i=16, 2 layers. Rank 2 on q_proj (8->8) and
    # down_proj (16->8): 2 x (16 + 24) = 80 adapter params per layer, 160 in all.
    from grpo_core.plan.memory import lora_state_bytes

    p, a = SMALL_PARAMS, 160
    assert SMALL.lora_params(2, ["q_proj", "down_proj"]) == a
    assert SMALL.lora_params(1, "all-linear") == 2 * (16 + 12 + 12 + 16 + 24 + 24 + 24)  # q k v o gate up down
    bf16_base = dataclasses.replace(SMALL, dtype_bytes=2)
    one = lora_state_bytes(bf16_base, "single", r=2, target_modules=["q_proj", "down_proj"], device="cuda")
    assert one == {"weights": 2 * p + 4 * a, "gradients": 4 * a, "optimizer": 8 * a, "reference": 0}
    cpu = lora_state_bytes(bf16_base, "ddp", r=2, target_modules=["q_proj", "down_proj"], device="cpu")
    assert cpu == {"weights": 4 * p + 4 * a, "gradients": 8 * a, "optimizer": 8 * a, "reference": 0}  # fp32 on CPU


def test_activations_and_logprob_chunks_by_hand():
    # per layer and token: 12*8 + 4*4 + 4*16 = 176 elements; 2 rows x 5 tokens, bf16 on GPU
    assert activation_bytes(SMALL, 2, 5, bf16=True, checkpointing=False) == 2 * 10 * 176 * 2
    assert activation_bytes(SMALL, 2, 5, bf16=True, checkpointing=True) == 2 * 10 * 8 * 2 + 10 * 176 * 2
    assert activation_bytes(SMALL, 2, 5, bf16=True, checkpointing=False, device="cpu") == 2 * 10 * 176 * 4
    assert logprob_chunk_bytes(SMALL, 1024, 6) == 4 * 6 * 10 * 4  # fewer rows than a chunk


def with_sampling(config: GRPOConfig, **update) -> GRPOConfig:
    return config.model_copy(update={"sampling": config.sampling.model_copy(update=update)})


def test_vllm_share_and_sleep_mode():
    shape = KNOWN_SHAPES["Qwen/Qwen2.5-7B"]
    hw = Hardware(gpus=8, gpu_memory=80 * GiB)
    config = GRPOConfig(use_vllm=True, bf16=True, gradient_checkpointing=True, distributed_strategy="fsdp",
                        vllm_gpu_memory_utilization=0.25, max_prompt_length=512, max_completion_length=512)
    awake = plan_training("grpo_train", "grpo", config, shape, hw)
    assert awake.components["generation"] == int(0.25 * 80 * GiB)
    asleep = plan_training("grpo_train", "grpo", with_sampling(config, vllm_enable_sleep_mode=True), shape, hw)
    assert asleep.components["generation (asleep)"] == 0
    assert awake.train_peak - asleep.train_peak == int(0.25 * 80 * GiB)
    state = sum(asleep.components[k] for k in ("weights", "optimizer", "reference"))
    assert asleep.generation_peak == state + int(0.25 * 80 * GiB) + CUDA_CONTEXT_BYTES
    small = plan_training("grpo_train", "grpo", with_sampling(config, vllm_gpu_memory_utilization=0.15), shape, hw)
    assert not small.fits and "cannot hold one" in small.problems[0]  # 12 GiB < 14.2 GiB of bf16 weights


def test_tensor_parallel_splits_vllm_weights():
    shape = KNOWN_SHAPES["Qwen/Qwen2.5-7B"]
    config = GRPOConfig(use_vllm=True, vllm_gpu_memory_utilization=0.15, vllm_tensor_parallel_size=2,
                        distributed_strategy="fsdp", bf16=True, gradient_checkpointing=True,
                        max_prompt_length=512, max_completion_length=512)
    assert not plan_training("grpo_train", "grpo", config, shape, Hardware(8, 80 * GiB)).problems


def test_a_plan_that_does_not_fit_names_the_settings_that_would():
    shape = KNOWN_SHAPES["Qwen/Qwen2.5-7B"]
    config = SFTConfig(bf16=True, per_device_train_batch_size=4, max_length=4096, distributed_strategy="ddp")  # no checkpointing
    plan = plan_stage("cold_start_sft", "sft", config, shape, Hardware(8, 80 * GiB))
    assert not plan.fits
    assert "distributed_strategy: fsdp" not in plan.suggestions  # sharding alone leaves ~100 GiB of activations
    assert any(s.startswith("together: ") for s in plan.suggestions)
    sharded = plan_stage("cold_start_sft", "sft", config.model_copy(update={"gradient_checkpointing": True}),
                         shape, Hardware(8, 80 * GiB))
    assert "distributed_strategy: fsdp" in sharded.suggestions
    message = sharded.failure_message()
    assert message.startswith("stage cold_start_sft needs ") and "80.0 GiB available" in message


def test_one_process_is_never_sharded():
    plan = plan_training("cold_start_sft", "sft", SFTConfig(distributed_strategy="fsdp"), SMALL, Hardware(1, GiB))
    assert plan.strategy == "single" and plan.components["gradients"] == 4 * SMALL_PARAMS + 4 * 2 * 10 * 8


def test_more_gpus_shrink_the_fsdp_state():
    shape = KNOWN_SHAPES["Qwen/Qwen2.5-14B"]
    config = SFTConfig(distributed_strategy="fsdp", bf16=True, gradient_checkpointing=True)
    peaks = [plan_training("s", "sft", config, shape, Hardware(n, 80 * GiB)).peak for n in (2, 4, 8)]
    assert peaks[0] > peaks[1] > peaks[2]
    assert peaks[0] - peaks[1] > 20 * GiB  # 16 bytes of state per parameter: 14.8e9 * 16 / 4 ~ 55 GiB less


def test_sleep_mode_reaches_the_engine_options_and_needs_vllm():
    from pydantic import ValidationError

    from grpo_core.generation import backend_options

    config = GRPOConfig(use_vllm=True, vllm_enable_sleep_mode=True)
    assert backend_options(config.sampling, "vllm", torch.device("cpu"), seed=0)["enable_sleep_mode"] is True
    assert backend_options(GRPOConfig(use_vllm=True).sampling, "vllm", torch.device("cpu"), seed=0)[
        "enable_sleep_mode"] is False
    with pytest.raises(ValidationError, match="vllm_enable_sleep_mode .* use_vllm is false"):
        GRPOConfig(use_vllm=False, vllm_enable_sleep_mode=True)


def test_the_reference_model_is_planned_exactly_when_the_kl_term_needs_it():
    """One rule (config.needs_reference): beta > 0 holds a reference model as large as the fp32 weights; beta 0,
    or an SFT stage, holds none."""
    hw = Hardware(1, 80 * GiB)
    plan = lambda beta: plan_training("grpo_train", "grpo", GRPOConfig(beta=beta, use_vllm=False), SMALL, hw)  # noqa: E731
    assert plan(0.04).components["reference"] == 4 * SMALL_PARAMS
    assert plan(0.0).components["reference"] == 0
    assert plan_training("s", "sft", SFTConfig(), SMALL, hw).components["reference"] == 0


def test_a_packed_micro_batch_plans_its_token_budget():
    """padding_free with max_tokens_per_batch: activations of the budget's tokens (or one full row when longer),
    not per_device_train_batch_size padded rows."""
    shape, hw = KNOWN_SHAPES["Qwen/Qwen2.5-7B"], Hardware(gpus=8, gpu_memory=80 * GiB)
    base = dict(bf16=True, gradient_checkpointing=True, per_device_train_batch_size=8, max_length=4096)
    padded = plan_training("cold_start_sft", "sft", SFTConfig(**base), shape, hw)
    packed = plan_training("cold_start_sft", "sft", SFTConfig(**base, padding_free=True, max_tokens_per_batch=8192),
                           shape, hw)
    assert padded.components["activations"] == activation_bytes(shape, 8, 4096, bf16=True, checkpointing=True)
    assert packed.components["activations"] == activation_bytes(shape, 1, 8192, bf16=True, checkpointing=True)
    short = plan_training("cold_start_sft", "sft", SFTConfig(**base, padding_free=True, max_tokens_per_batch=1024),
                          shape, hw)  # a 4096-token row still trains alone
    assert short.components["activations"] == activation_bytes(shape, 1, 4096, bf16=True, checkpointing=True)


def test_a_generation_server_holds_the_engine_on_its_own_device():
    """sampling.vllm_mode: server: the trainer's GPUs hold no engine or KV cache; the server's share is its own line."""
    shape = KNOWN_SHAPES["Qwen/Qwen2.5-7B"]
    hw = Hardware(gpus=7, gpu_memory=80 * GiB)
    config = GRPOConfig(use_vllm=True, bf16=True, gradient_checkpointing=True, distributed_strategy="fsdp",
                        vllm_gpu_memory_utilization=0.25, max_prompt_length=512, max_completion_length=512)
    colocated = plan_training("grpo_train", "grpo", config, shape, hw)
    served = plan_training("grpo_train", "grpo", with_sampling(config, vllm_mode="server", vllm_server_devices="7"),
                           shape, hw)
    assert served.components["generation (server)"] == 0 and "generation" not in served.components
    assert colocated.train_peak - served.train_peak == int(0.25 * 80 * GiB)
    assert colocated.generation_peak - served.generation_peak == int(0.25 * 80 * GiB)
    assert served.elsewhere == {"vLLM server": int(0.25 * 80 * GiB)}
    assert "vLLM server" in served.table() and "(7), none on the trainer's" in served.table()
    tight = with_sampling(config, vllm_gpu_memory_utilization=0.7)  # the engine's 56 GiB beside the trainer: too much
    assert not plan_stage("grpo_train", "grpo", tight, shape, hw).fits
    assert plan_stage("grpo_train", "grpo", with_sampling(tight, vllm_mode="server", vllm_server_devices="7"), shape,
                      hw).fits
    assert not plan_stage("grpo_train", "grpo", with_sampling(tight, vllm_mode="server"), shape, hw).fits  # on GPU 0


def test_the_plan_splits_the_machine_between_the_server_and_the_trainers():
    """``--gpus 8`` with the server on GPU 7: seven trainer processes share the model state (FSDP over 7), the
    server's engine is its own line; without ``vllm_server_devices`` a started server lands on the trainers' first
    GPU, so its engine counts on the planned device."""
    shape = KNOWN_SHAPES["Qwen/Qwen2.5-7B"]
    config = GRPOConfig(use_vllm=True, bf16=True, gradient_checkpointing=True, distributed_strategy="fsdp",
                        vllm_gpu_memory_utilization=0.25, max_prompt_length=512, max_completion_length=512)
    eight, seven = Hardware(gpus=8, gpu_memory=80 * GiB), Hardware(gpus=7, gpu_memory=80 * GiB)
    split = plan_training("grpo_train", "grpo", with_sampling(config, vllm_mode="server", vllm_server_devices="7"),
                          shape, eight)
    beside = plan_training("grpo_train", "grpo", with_sampling(config, vllm_mode="server", vllm_server_devices="7"),
                           shape, seven)  # GPU 7 beyond a 7-GPU count: another device, nothing taken
    assert split.hardware.gpus == 7 and split.components == beside.components
    assert split.elsewhere == beside.elsewhere == {"vLLM server": int(0.25 * 80 * GiB)}
    assert "split: GPU 7 of 8 for the server, 7 for trainer processes (the work pool's nproc_per_node: 7)" in split.table()
    assert "split:" not in beside.table()
    shared = plan_training("grpo_train", "grpo", with_sampling(config, vllm_mode="server"), shape, eight)
    colocated = plan_training("grpo_train", "grpo", config, shape, eight)
    assert shared.hardware.gpus == 8 and shared.elsewhere == {}
    assert shared.components["generation (server, this GPU)"] == colocated.components["generation"]
    assert shared.train_peak == colocated.train_peak and "beside trainer rank 0" in shared.table()
    url = plan_training("grpo_train", "grpo", with_sampling(config, vllm_mode="server",
                                                           vllm_server_base_url="http://gen:8000"), shape, eight)
    assert url.hardware.gpus == 8 and "vLLM server" in url.elsewhere  # a running server: none of this machine's
