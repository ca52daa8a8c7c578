"""Cold-start SFT: completion-only labels, the chunked loss is the full-logits cross-entropy, a tiny model
overfits, a crashed run resumes bit for bit, a corrupt checkpoint is skipped."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from grpo_core.config import SFTConfig
from grpo_core.data.synthetic import make_chain_rows, make_cold_start_rows
from grpo_core.generation.prompts import PromptStream
from grpo_core.models.tiny import build_tiny_model
from grpo_core.trainer.checkpoint import list_checkpoints, verify_checkpoint
from grpo_core.trainer.sft import IGNORE_INDEX, collate, completion_token_loss, encode_sft_row, train_sft

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


def full_logits_loss(model, batch):
    """The previous SFT loss, from the whole [B, L, V] logits: summed cross-entropy over label tokens."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # [B, L, V]
    # position t predicts token t+1: drop the last logit and the first label
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), batch["labels"][:, 1:].reshape(-1),
        ignore_index=IGNORE_INDEX, reduction="sum",
    )


@pytest.mark.parametrize("checkpoint_logits", [False, True])
def test_chunked_loss_is_the_full_logits_cross_entropy(tiny, rows, checkpoint_logits):
    from transformers import AutoModelForCausalLM

    tok = AutoTokenizer.from_pretrained(tiny)
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float64)
    examples = [encode_sft_row(tok, r, 256) for r in rows[:3]]
    ids, labels = examples[1]
    cut = len(labels) - 5
    examples[1] = (ids, [IGNORE_INDEX] * cut + labels[cut:])  # rows start their labels at different columns
    batch = collate(examples, tok.pad_token_id)
    num_tokens = int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())

    expected = full_logits_loss(model, batch) / num_tokens
    expected.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    loss, metrics = completion_token_loss(model, batch["input_ids"], batch["attention_mask"], batch["labels"],
                                          num_tokens=num_tokens, chunk_size=7, checkpoint_logits=checkpoint_logits)
    loss.backward()
    assert metrics["tokens"] == num_tokens
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=0)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, want[name], rtol=1e-9, atol=1e-12, msg=name)


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
    assert json.loads((final / "sft_config.json").read_text())["learning_rate"] == 3e-3
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
                  per_device_train_batch_size=2, gradient_accumulation_steps=2, weight_decay=0.1, warmup_steps=1)
    train_sft(cfg, tiny, rows, tmp_path / "straight")
    crash = _Crash(at=5)
    with pytest.raises(KeyboardInterrupt):
        train_sft(cfg, tiny, rows, tmp_path / "crashed", callbacks=[crash])
    assert crash.checkpoints == [(2, "checkpoint-2"), (4, "checkpoint-4")]
    assert [p.name for _, p in list_checkpoints(tmp_path / "crashed")] == ["checkpoint-2", "checkpoint-4"]
    state = json.loads((tmp_path / "crashed" / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["step"] == 4 and [m["step"] for m in state["log_history"]] == [1, 2, 3, 4]
    assert {"sft_config.json", "optimizer.pt", "rng_state.pt"} <= set(verify_checkpoint(tmp_path / "crashed" / "checkpoint-4")["files"])
    out = train_sft(cfg, tiny, rows, tmp_path / "crashed")
    assert out["train/steps"] == 6
    a = load_file(tmp_path / "straight" / "final" / "model.safetensors")
    b = load_file(tmp_path / "crashed" / "final" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k  # bit for bit
    straight = (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()
    crashed = (tmp_path / "crashed" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in crashed] == [1, 2, 3, 4, 5, 6]  # step 5 logged before the crash is replaced
    drop_time = lambda lines: [{k: v for k, v in json.loads(x).items() if k != "train/elapsed_s"} for x in lines]
    assert drop_time(crashed) == drop_time(straight)


def test_logging_steps_window_survives_a_resume(tiny, rows, tmp_path):
    cfg = _config(max_steps=6, save_steps=3, logging_steps=2)
    train_sft(cfg, tiny, rows, tmp_path / "straight")
    with pytest.raises(KeyboardInterrupt):
        train_sft(cfg, tiny, rows, tmp_path / "crashed", callbacks=[_Crash(at=4)])
    train_sft(cfg, tiny, rows, tmp_path / "crashed")
    straight = [json.loads(x) for x in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    crashed = [json.loads(x) for x in (tmp_path / "crashed" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in crashed] == [2, 4, 6]
    assert [m["train/loss"] for m in crashed] == [m["train/loss"] for m in straight]  # step 4 averages 3 and 4


def test_corrupt_checkpoint_is_skipped_naming_the_file(tiny, rows, tmp_path, caplog):
    cfg = _config(max_steps=4, save_steps=2, save_total_limit=3)
    train_sft(cfg, tiny, rows, tmp_path)
    bad = tmp_path / "checkpoint-4" / "model.safetensors"
    bad.write_bytes(bad.read_bytes()[:-10] + b"x" * 10)
    with caplog.at_level(logging.INFO):
        out = train_sft(cfg.model_copy(update={"max_steps": 5}), tiny, rows, tmp_path)
    assert "checkpoint-4/model.safetensors is corrupt" in caplog.text
    assert "resumed from" in caplog.text and "checkpoint-2 at step 2" in caplog.text
    assert out["train/steps"] == 5
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4, 5]


def test_progress_line(tiny, rows, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="grpo_core.trainer.skeleton"):
        train_sft(_config(max_steps=40), tiny, rows, tmp_path)
    lines = [m for m in caplog.messages if m.startswith("sft step ")]
    steps = [int(m.split()[2].split("/")[0]) for m in lines]
    assert steps == [1] + list(range(2, 41, 2))  # first, every 5% (2 of 40 steps), last
    assert lines[-1].startswith("sft step 40/40 (100%) loss ") and " lr 0.003 elapsed " in lines[-1]
    assert "ETA 0s" in lines[-1] and "reward" not in lines[-1]


def test_epochs_when_max_steps_not_set(tiny, rows, tmp_path):
    cfg = SFTConfig(num_train_epochs=2, per_device_train_batch_size=4, report_to=[], learning_rate=1e-3)
    assert train_sft(cfg, tiny, rows, tmp_path)["train/steps"] == 4  # 2 epochs x 8 rows / 4
    with pytest.raises(ValueError, match="no rows"):
        train_sft(cfg, tiny, [], tmp_path)


def test_group_by_length_pads_less_for_the_same_gradient(tiny, tmp_path, monkeypatch):
    """Micro-batches cut from the step's rows in length order: fewer padded positions, the same update (the loss
    is normalised over the step's tokens, so only float summation order differs)."""
    import grpo_core.trainer.sft as sft

    mixed = make_cold_start_rows(make_chain_rows(24, seed=3), direct_fraction=0.5, seed=3)  # short and long rows
    counters, weights = {}, {}
    real_collate = sft.collate
    for grouped in (False, True):
        counters[grouped] = 0

        def counting_collate(examples, pad_token_id, _key=grouped):  # the [B, L] positions each forward runs
            batch = real_collate(examples, pad_token_id)
            counters[_key] += batch["input_ids"].numel()
            return batch

        monkeypatch.setattr(sft, "collate", counting_collate)
        cfg = _config(max_steps=3, per_device_train_batch_size=2, gradient_accumulation_steps=4,
                      group_by_length=grouped)
        train_sft(cfg, tiny, mixed, tmp_path / str(grouped))
        weights[grouped] = load_file(tmp_path / str(grouped) / "final" / "model.safetensors")
    assert counters[True] < 0.9 * counters[False], counters
    for name in weights[False]:
        torch.testing.assert_close(weights[True][name], weights[False][name], atol=1e-5, rtol=1e-4)
