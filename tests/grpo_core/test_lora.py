"""LoRA (use_peft): the sampler receives and holds every update (checked after each sync, a skipped sync fails the
step), the reference is the base, the committed merged model equals base + adapter, SFT and the reward model
train adapters, QLoRA is refused where bitsandbytes/CUDA are absent. Exact resume: test_trainer_resume.py."""

from __future__ import annotations

import json

import pytest
import torch
from pydantic import ValidationError
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from grpo_core.config import GRPOConfig, RewardConfig, SFTConfig
from grpo_core.models.tiny import build_tiny_model
from grpo_core.trainer import weight_sync
from grpo_core.trainer.lora import load_lora_model, merged_state_dict, reference_view
from tests.grpo_core.run_helpers import read_metrics

ROWS = [{"prompt": [{"role": "user", "content": f"{i}*{i}="}], "answer": str(i * i)} for i in range(8)]
LORA = dict(use_peft=True, lora_r=4, lora_alpha=8, lora_dropout=0.0)


def digit_fraction(completions, **kwargs):
    texts = [c[0]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=64, num_layers=2, num_heads=2)


def grpo_config(**kw) -> GRPOConfig:
    return GRPOConfig(**{**LORA, **dict(
        use_vllm=False, max_steps=3, generation_batch_size=8, num_generations=4, max_completion_length=6,
        max_prompt_length=16, per_device_train_batch_size=8, learning_rate=5e-2, beta=0.04, save_steps=10,
        report_to=["jsonl"], torch_num_threads=1), **kw})


def test_lora_grpo_sampler_holds_every_update(tiny, tmp_path, monkeypatch):
    """Each step's sync is checked against the sampler's own tensors, and the sampler really holds the trained
    (changed) weights: its probes differ from the base's after training."""
    checked: list[str] = []
    verify = weight_sync.SyncCheck.__call__

    def spy(self, backend, model, sync):
        verify(self, backend, model, sync)
        checked.append(sync)
        spy.backend, spy.names = backend, self.names

    monkeypatch.setattr(weight_sync.SyncCheck, "__call__", spy)
    from grpo_core.trainer.loop import train_grpo

    train_grpo(grpo_config(), tiny, ROWS, tmp_path, reward_funcs=[digit_fraction], resume=False)
    assert checked == ["before the first step (the policy as loaded)"] + [
        f"after step {s} (optimiser step {s})" for s in (1, 2, 3)]
    assert [m["sampler/weights_verified"] for m in read_metrics(tmp_path)] == [1.0, 1.0, 1.0]
    base = AutoModelForCausalLM.from_pretrained(tiny).state_dict()
    held = spy.backend.replica.state_dict()
    assert all(not torch.equal(held[n], base[n]) for n in spy.names)  # the updates reached the sampler


def test_a_skipped_sync_fails_the_step_naming_it(tiny, tmp_path, monkeypatch):
    push = weight_sync.push_weights
    calls = []

    def skip_second(backend, model):
        calls.append(1)
        if len(calls) != 3:  # the sync after step 2 never reaches the sampler
            push(backend, model)

    monkeypatch.setattr(weight_sync, "push_weights", skip_second)
    from grpo_core.trainer.loop import train_grpo

    with pytest.raises(weight_sync.WeightSyncError, match=r"weight sync after step 2 \(optimiser step 2\).*stale"):
        train_grpo(grpo_config(), tiny, ROWS, tmp_path, reward_funcs=[digit_fraction], resume=False)
    assert [m["step"] for m in read_metrics(tmp_path)] == [1]


def trained_adapter(tiny):
    torch.manual_seed(0)
    model = load_lora_model(tiny, SFTConfig(**LORA), torch.device("cpu")).eval()
    for name, p in model.named_parameters():
        if "lora_" in name:
            p.data.normal_(0, 0.2)  # B is zero at init: give the adapter an effect
    return model


def test_reference_view_is_the_base(tiny):
    model = trained_adapter(tiny)
    base = AutoModelForCausalLM.from_pretrained(tiny).eval()
    ids = torch.tensor([[1, 5, 9, 14, 3, 7]])
    with torch.no_grad(), reference_view(model) as ref:
        assert torch.equal(ref(ids).logits, base(ids).logits)
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits, base(ids).logits)  # the adapter is back on


def test_merged_model_outputs_equal_base_plus_adapter(tiny, tmp_path):
    from grpo_core.trainer.skeleton import save_final_model
    from transformers import AutoTokenizer
    from peft import PeftModel

    model = trained_adapter(tiny)
    save_final_model(model, AutoTokenizer.from_pretrained(tiny), tmp_path / "final", dtype=torch.float32)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "final").eval()  # a plain Hugging Face folder
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny), tmp_path / "final" / "adapter")
    ids = torch.tensor([[1, 5, 9, 14, 3, 7, 2, 11]])
    with torch.no_grad():
        expected = model(ids).logits
        torch.testing.assert_close(merged(ids).logits, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(reloaded.eval()(ids).logits, expected, atol=1e-6, rtol=1e-6)
    assert set(merged_state_dict(model)) == set(merged.state_dict())


def test_lora_sft_trains_only_adapters(tiny, tmp_path):
    from grpo_core.trainer.sft import train_sft

    rows = [{"prompt": r["prompt"], "completion": r["answer"]} for r in ROWS]
    cfg = SFTConfig(**LORA, max_steps=3, per_device_train_batch_size=4, learning_rate=5e-2, report_to=["jsonl"])
    train_sft(cfg, tiny, rows, tmp_path)
    final, base = tmp_path / "final", AutoModelForCausalLM.from_pretrained(tiny).state_dict()
    merged = AutoModelForCausalLM.from_pretrained(final).state_dict()
    assert torch.equal(merged["model.embed_tokens.weight"], base["model.embed_tokens.weight"])  # frozen, untargeted
    assert not torch.equal(merged["model.layers.0.mlp.down_proj.weight"], base["model.layers.0.mlp.down_proj.weight"])
    assert json.loads((final / "adapter" / "adapter_config.json").read_text())["r"] == 4
    assert (tmp_path / "checkpoint-3" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "checkpoint-3" / "model.safetensors").exists()  # checkpoints hold adapters only


def test_lora_reward_model_trains_its_score_head(tmp_path):
    from grpo_core.trainer.reward_model import train_reward_model

    base = build_tiny_model(tmp_path / "base", hidden_size=64, num_layers=2)
    rows = [{"prompt": f"q{i}", "chosen": "Sure. Step 1: thanks!", "rejected": "No."} for i in range(12)]
    cfg = RewardConfig(**LORA, max_steps=2, per_device_train_batch_size=4, learning_rate=1e-2, report_to=["jsonl"])
    train_reward_model(cfg, base, rows, tmp_path / "rm")
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm" / "final", num_labels=1)
    assert model.score.weight.abs().sum() > 0 and (tmp_path / "rm" / "final" / "adapter").is_dir()


def test_load_in_4bit_is_refused_without_cuda_or_bitsandbytes(tiny):
    with pytest.raises(ValidationError, match="load_in_4bit quantises the frozen base of a LoRA run"):
        GRPOConfig(load_in_4bit=True)
    with pytest.raises(ValueError, match="needs a CUDA GPU.*load_in_4bit: false"):
        load_lora_model(tiny, SFTConfig(**LORA, load_in_4bit=True), torch.device("cpu"))


@pytest.mark.vllm
def test_vllm_sampler_is_checked_by_probe_log_probs(tiny, tmp_path, monkeypatch):
    """vLLM's CPU backend repacks its linear weights (no tensor to hash): the check compares probe log-probs, and a
    skipped push is caught there too."""
    pytest.importorskip("vllm")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    push, calls = weight_sync.push_weights, []

    def skip_second(backend, model):
        calls.append(1)
        if len(calls) != 3:
            push(backend, model)

    monkeypatch.setattr(weight_sync, "push_weights", skip_second)
    from grpo_core.trainer.loop import train_grpo

    cfg = grpo_config(use_vllm=True, vllm_kv_cache_memory_bytes=16 * 2**20)
    with pytest.raises(weight_sync.WeightSyncError, match=r"weight sync after step 2 .*log-probs of the probe"):
        train_grpo(cfg, tiny, ROWS, tmp_path, reward_funcs=[digit_fraction], resume=False)
    assert [m["sampler/weights_verified"] for m in read_metrics(tmp_path)] == [1.0]  # step 1 synced and verified
