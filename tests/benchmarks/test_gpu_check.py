"""tests/benchmarks/gpu_check.py: the parts that run without a GPU (builder, FLOP arithmetic, the no-GPU exit)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).with_name("gpu_check.py")
spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)


def test_mfu_arithmetic_by_hand():
    # Qwen2.5-0.5B (494,032,768 params), 100k tokens, policy fwd+bwd (6P) + reference forward (2P) per token.
    flops = gpu_check.train_flops(494_032_768, 100_000, forward_only_passes=1)
    assert flops == 8 * 494_032_768 * 100_000 == 395_226_214_400_000
    assert gpu_check.mfu(flops, 1.0, 989.0) == pytest.approx(0.399622, abs=1e-6)
    assert gpu_check.mfu(flops, 2.0, 989.0) == pytest.approx(0.199811, abs=1e-6)
    assert gpu_check.peak_tflops_for("NVIDIA H200")[0] == 989.0
    assert gpu_check.peak_tflops_for("NVIDIA A100-SXM4-80GB")[0] == 312.0


def test_tokenizer_padded_to_vocab_round_trips():
    tok = gpu_check.build_tokenizer(1000)
    assert len(tok) == 1000
    assert tok.convert_tokens_to_ids(["<think>", "</think>", "<answer>", "</answer>"]) == [996, 997, 998, 999]
    text = "<think>7+8=15;\n15*3 = 45</think><answer>40</answer>"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    prompt = tok.apply_chat_template([{"role": "user", "content": "7+8*3-5="}], add_generation_prompt=True, tokenize=False)
    assert tok(prompt, add_special_tokens=False)["input_ids"][0] == tok.bos_token_id
    assert len(tok.decode([700])) == 2  # a two-byte filler token decodes to two characters
    with pytest.raises(ValueError, match="vocab_size 100"):
        gpu_check.build_tokenizer(100)


def test_model_builder_shape_at_tiny_size(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path, params = gpu_check.build_model_dir(tmp_path, hidden=32, layers=1, heads=2, kv_heads=1,
                                             intermediate=64, vocab=600)
    config = AutoConfig.from_pretrained(path)
    assert (config.model_type, config.hidden_size, config.num_key_value_heads, config.vocab_size) == ("qwen2", 32, 1, 600)
    assert config.tie_word_embeddings
    # embed 600*32; q 32*32+32, k,v 32*16+16 each, o 32*32, MLP 3*32*64, 2 RMSNorms 32 each; final norm 32
    assert params == 600 * 32 + (1056 + 2 * 528 + 1024 + 6144 + 64) + 32 == 28_576
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert len(AutoTokenizer.from_pretrained(path)) == 600


def test_sft_fsdp_child_runs_on_cpu_at_tiny_size():
    """The FSDP2 SFT timing (sharded load, checkpointed layers, chunked loss, AdamW) on a gloo group of one."""
    import json
    import os

    env = {**os.environ, "PYTHONPATH": str(SCRIPT.parents[2]), "MASTER_PORT": "29547"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--sft-fsdp-only", "--hidden", "32", "--layers", "2",
                           "--heads", "2", "--kv-heads", "1", "--intermediate", "64", "--vocab", "600",
                           "--sft-steps", "3", "--sft-micro-batch", "2", "--sft-seq-len", "16"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["steps"] == 3 and out["tokens_per_step"] == 32 and out["step_s"] > 0
    assert out["master_weights_dtype"] == ["torch.float32"]
    assert 5.0 < out["loss"] < 8.0  # ~ln(600) for a random model: the loss covers every token
    assert out["dcp"]["loss_after_load_equal"] is True and out["dcp"]["size_gib"] > 0  # sharded checkpoint restored
    plan = out["plan"]  # the planner's prediction for the same settings (no measurement on a CPU)
    assert plan["planned_gib"] > 0 and plan["planned_components_gib"]["weights"] > 0 and "measured_gib" not in plan


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown where no GPU is visible")
def test_without_gpu_exits_at_once_with_a_message():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--steps", "1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "no CUDA GPU visible" in proc.stderr


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_smoke_one_step():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--steps", "1", "--prompts", "4", "--max-completion-length", "64"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json

    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["steps_run"] == 1 and out["model"]["params"] > 400e6
    assert 0 < out["mfu"] < 1 and out["peak_gpu_memory_gib"] > 0
