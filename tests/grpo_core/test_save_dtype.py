"""The final (committed) model keeps the base model's dtype (``save_dtype: auto``) or the one configured, while
checkpoints keep the fp32 training weights for exact resume (grpo_core/trainer/skeleton.py)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from grpo_core.config import GRPOConfig, SFTConfig
from grpo_core.data.synthetic import make_chain_rows, make_cold_start_rows
from grpo_core.models.tiny import build_tiny_model
from grpo_core.trainer.loop import train_grpo
from grpo_core.trainer.sft import train_sft
from grpo_core.trainer.skeleton import resolve_save_dtype

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def bf16_base(tmp_path_factory):
    """The tiny model saved in bf16, as a hub snapshot of a real model is."""
    fp32 = build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=32, num_layers=1, num_heads=2)
    out = tmp_path_factory.mktemp("bf16")
    AutoModelForCausalLM.from_pretrained(fp32, dtype=torch.bfloat16).save_pretrained(out)
    for file in fp32.glob("*token*"):  # tokenizer files
        (out / file.name).write_bytes(file.read_bytes())
    (out / "chat_template.jinja").write_bytes((fp32 / "chat_template.jinja").read_bytes())
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    return out


def _train(base, out, **kw):
    rows = make_cold_start_rows(make_chain_rows(4, seed=0), direct_fraction=0.0)
    cfg = SFTConfig(learning_rate=1e-3, max_steps=2, per_device_train_batch_size=2, save_steps=1,
                    report_to=["jsonl"], **kw)
    train_sft(cfg, base, rows, out)
    return out / "final"


def _dtypes(folder):
    return {t.dtype for t in load_file(folder / "model.safetensors").values()}


def test_bf16_base_commits_bf16_and_float32_on_request(bf16_base, tmp_path):
    auto = _train(bf16_base, tmp_path / "auto")
    assert _dtypes(auto) == {torch.bfloat16}
    assert json.loads((auto / "config.json").read_text())["dtype"] == "bfloat16"
    assert _dtypes(tmp_path / "auto" / "checkpoint-2") == {torch.float32}  # resume keeps full precision

    fp32 = _train(bf16_base, tmp_path / "fp32", save_dtype="float32")
    assert _dtypes(fp32) == {torch.float32}
    assert json.loads((fp32 / "config.json").read_text())["dtype"] == "float32"
    # the same training (same seed), only written in another dtype; tied embeddings load back whole
    a = AutoModelForCausalLM.from_pretrained(auto).state_dict()
    b = AutoModelForCausalLM.from_pretrained(fp32).state_dict()
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name].to(torch.bfloat16), rtol=0, atol=0, msg=name)


def test_grpo_commits_the_base_dtype(bf16_base, tmp_path):
    rows = [{"prompt": r["prompt"]} for r in make_chain_rows(4, seed=0)]
    cfg = GRPOConfig(use_vllm=False, max_steps=1, generation_batch_size=4, num_generations=2, max_prompt_length=64,
                     max_completion_length=4, per_device_train_batch_size=4, report_to=["jsonl"], reward_funcs=["format"])
    train_grpo(cfg, bf16_base, rows, tmp_path, resume=False)
    assert _dtypes(tmp_path / "final") == {torch.bfloat16}
    assert json.loads((tmp_path / "final" / "config.json").read_text())["dtype"] == "bfloat16"


def test_save_dtype_auto_reads_either_config_key(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "torch_dtype": "float16"}))
    assert resolve_save_dtype("auto", tmp_path) is torch.float16  # older files name it torch_dtype
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    assert resolve_save_dtype("auto", tmp_path) is torch.float32  # none named: the trainer's fp32
    assert resolve_save_dtype("bfloat16", tmp_path) is torch.bfloat16
