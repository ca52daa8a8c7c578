"""The tiny model and tokenizer load through the Auto classes and round-trip text exactly."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_core.models.tiny import build_tiny_model, count_parameters

torch.set_num_threads(1)

TEXTS = [
    "7+8*3-5=<think>7+8=15;15*3=45;45-5=40</think><answer>40</answer>",
    "Natalia sold clips to 48  of her friends.\nThen\ttwice as many: (48/2)=24, so 48+24=72.\n#### 72",
    "café é ü 漢字 \\frac{1}{2} $x^2$ <answer>\\boxed{3}</answer>",
    "  leading and trailing spaces  \n\n",
]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny_dir(request, tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp(request.param), architecture=request.param)


def test_round_trip_through_auto_tokenizer(tiny_dir):
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    for text in TEXTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
        assert tok.decode(ids, skip_special_tokens=True) == text  # the tags survive skipping specials


def test_tags_and_specials_are_single_tokens(tiny_dir):
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    for tag in ["<think>", "</think>", "<answer>", "</answer>", "<bos>", "<eos>", "<pad>"]:
        assert len(tok(tag, add_special_tokens=False)["input_ids"]) == 1, tag
    assert tok.eos_token == "<eos>" and tok.pad_token == "<pad>" and tok.bos_token == "<bos>"
    assert len({tok.eos_token_id, tok.pad_token_id, tok.bos_token_id, tok.unk_token_id}) == 4
    # the task alphabet is one token per character
    assert len(tok("7+8*3-5=", add_special_tokens=False)["input_ids"]) == 8


def test_chat_template_renders_plain_task_text(tiny_dir):
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    messages = [{"role": "user", "content": "7+8*3-5="}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<bos>7+8*3-5="
    enc = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)  # a dict in transformers 5
    assert enc["input_ids"] == [tok.bos_token_id] + tok("7+8*3-5=", add_special_tokens=False)["input_ids"]
    full = tok.apply_chat_template(messages + [{"role": "assistant", "content": "<think></think><answer>40</answer>"}], tokenize=False)
    assert full == "<bos>7+8*3-5=<think></think><answer>40</answer><eos>"


def test_model_loads_and_runs(tiny_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    assert 0.8e6 < count_parameters(model) < 1.0e6
    assert model.config.eos_token_id == tok.eos_token_id
    ids = torch.tensor([tok.apply_chat_template([{"role": "user", "content": "1+2="}], add_generation_prompt=True)["input_ids"]])
    logits = model(ids).logits  # [1, T, V]
    assert logits.shape == (1, ids.shape[1], len(tok))
    assert torch.isfinite(logits).all()
    out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] <= ids.shape[1] + 4


def test_deterministic_by_seed(tmp_path):
    a = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "a", seed=3, num_layers=1))
    b = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "b", seed=3, num_layers=1))
    c = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "c", seed=4, num_layers=1))
    wa, wb, wc = (m.model.embed_tokens.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_bad_shape_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="divisible"):
        build_tiny_model(tmp_path, hidden_size=130, num_heads=4)
