"""Cold-start SFT: completion-only labels, a tiny model overfits, a crashed run resumes exactly."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from grpo_core.config import SFTConfig
from grpo_core.sft import IGNORE_INDEX, collate, encode_sft_row, list_checkpoints, train_sft
from grpo_core.synthetic import make_chain_rows, make_cold_start_rows
from grpo_core.tiny import build_tiny_model
from grpo_core.trainer.prompts import PromptStream

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=64, num_layers=2, num_heads=2)


@pytest.fixture(scope="module")
def rows():
    return make_cold_start_rows(make_chain_rows(8, seed=0), direct_fraction=0.0)


def _config(**kw):
    base = dict(learning_rate=3e-3, max_steps=40, per_device_train_batch_size=4, save_steps=1000,
                report_to=["jsonl"], lr_scheduler_type="constant", logging_steps=1)
    return SFTConfig(**{**base, **kw})


def test_labels_mask_the_prompt(tiny, rows):
    tok = AutoTokenizer.from_pretrained(tiny)
    ids, labels = encode_sft_row(tok, rows[0], max_length=256)
    prompt = rows[0]["prompt"][0]["content"]
    n_prompt = 1 + len(prompt)  # <bos> + one token per character
    assert labels[:n_prompt] == [IGNORE_INDEX] * n_prompt
    assert labels[n_prompt:] == ids[n_prompt:]
    assert tok.decode(ids[n_prompt:]) == rows[0]["completion"] + "<eos>"
    ids_t, labels_t = encode_sft_row(tok, rows[0], max_length=10)
    assert len(ids_t) == len(labels_t) == 10
    batch = collate([encode_sft_row(tok, r, 256) for r in rows[:3]], tok.pad_token_id)
    assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape
    assert ((batch["attention_mask"] == 0) <= (batch["labels"] == IGNORE_INDEX)).all()  # padding has no loss
    _, full = encode_sft_row(tok, rows[0], 256, completion_only_loss=False)
    assert IGNORE_INDEX not in full


def test_data_order_is_a_seeded_shuffle_per_epoch():
    first = PromptStream(10, seed=1).rows_at(0, 10)
    assert sorted(first) == list(range(10))
    assert PromptStream(10, seed=1).rows_at(3, 4) == first[3:7]
    assert sorted(PromptStream(10, seed=1).rows_at(10, 10)) == list(range(10))
    assert PromptStream(10, seed=2).rows_at(0, 10) != first


def test_tiny_model_overfits(tiny, rows, tmp_path):
    out = train_sft(_config(), tiny, rows, tmp_path)
    log = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in log] == list(range(1, 41))
    assert log[0]["train/loss"] > 4.0  # ~ln(264) at random init
    assert out["train/loss"] < 0.5 * log[0]["train/loss"] and log[-1]["train/loss"] < 1.5
    final = tmp_path / "final"
    assert (final / "model.safetensors").exists() and (final / "tokenizer.json").exists()
    assert out["final_path"] == str(final) and out["train/steps"] == 40


class _Crash:
    def __init__(self, at):
        self.at, self.checkpoints = at, []

    def on_checkpoint(self, step, path):
        self.checkpoints.append((step, path.name))

    def on_step(self, step, max_steps, metrics):
        if step == self.at:
            raise KeyboardInterrupt("simulated crash")


def test_resume_continues_exactly(tiny, rows, tmp_path):
    cfg = _config(max_steps=6, save_steps=2, save_total_limit=2, lr_scheduler_type="linear",
                  per_device_train_batch_size=2, gradient_accumulation_steps=2)
    train_sft(cfg, tiny, rows, tmp_path / "straight")
    crash = _Crash(at=5)
    with pytest.raises(KeyboardInterrupt):
        train_sft(cfg, tiny, rows, tmp_path / "crashed", callbacks=[crash])
    assert crash.checkpoints == [(2, "checkpoint-2"), (4, "checkpoint-4")]
    assert [p.name for p in list_checkpoints(tmp_path / "crashed")] == ["checkpoint-2", "checkpoint-4"]
    out = train_sft(cfg, tiny, rows, tmp_path / "crashed")
    assert out["train/steps"] == 6
    a = load_file(tmp_path / "straight" / "final" / "model.safetensors")
    b = load_file(tmp_path / "crashed" / "final" / "model.safetensors")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)
    steps = [json.loads(x)["step"] for x in (tmp_path / "crashed" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]  # step 5 logged before the crash is replaced, not repeated


def test_epochs_when_max_steps_not_set(tiny, rows, tmp_path):
    cfg = SFTConfig(num_train_epochs=2, per_device_train_batch_size=4, report_to=[], learning_rate=1e-3)
    assert train_sft(cfg, tiny, rows, tmp_path)["train/steps"] == 4  # 2 epochs x 8 rows / 4
    with pytest.raises(ValueError, match="no rows"):
        train_sft(cfg, tiny, [], tmp_path)
