"""Over-long prompts: one policy (``long_prompts``), one function (``encode_prompts``), the same token ids and
the same counts in GRPO training, evaluation and rejection sampling."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from grpo_core.config import EvalConfig, GRPOConfig, GRPOSampling, RejectionSamplingConfig
from grpo_core.evaluation.heldout import evaluate
from grpo_core.generation import make_backend
from grpo_core.generation.prompts import encode_prompt, encode_prompts
from grpo_core.models.tiny import build_tiny_model
from grpo_core.recipe.rejection import rejection_sample
import grpo_core.trainer.loop as loop
from grpo_core.trainer.loop import train_grpo

torch.set_num_threads(1)

LIMIT = 16
LONG = [{"role": "user", "content": "1+" * 30 + "1="}]  # 63 tokens through the tiny chat template
ROWS = [{"id": f"r{i}", "prompt": [{"role": "user", "content": f"{i}+{i}="}], "answer": str(2 * i)} for i in range(7)]
ROWS.insert(3, {"id": "long", "prompt": LONG, "answer": "31"})


class Recording:
    """A generation backend that records the prompt ids it is asked to continue."""

    def __init__(self, backend):
        self.backend, self.prompts = backend, []

    def generate(self, prompt_ids, request):
        self.prompts += [list(p) for p in prompt_ids]
        return self.backend.generate(prompt_ids, request)

    def update_weights(self, model):
        self.backend.update_weights(model)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=32, num_layers=2, num_heads=2)


@pytest.fixture(scope="module")
def tok(tiny):
    return AutoTokenizer.from_pretrained(tiny)


def long_ids(tok) -> list[int]:
    return encode_prompt(tok, LONG)


def train(tiny, tmp_path, monkeypatch, long_prompts, max_prompt_length=LIMIT):
    recorders = []

    def recording_backend(*args, **kwargs):
        recorders.append(Recording(make_backend(*args, **kwargs)))
        return recorders[-1]

    monkeypatch.setattr(loop, "make_backend", recording_backend)
    config = GRPOConfig(use_vllm=False, max_steps=2, generation_batch_size=8, num_generations=2,
                        max_completion_length=4, max_prompt_length=max_prompt_length, long_prompts=long_prompts,
                        per_device_train_batch_size=8, learning_rate=1e-3, beta=0.0, save_steps=100,
                        report_to=["jsonl"], reward_funcs=["format"])
    out = train_grpo(config, tiny, ROWS, tmp_path / long_prompts, resume=False)
    metrics = [json.loads(line) for line in (tmp_path / long_prompts / "metrics.jsonl").read_text().splitlines()]
    return recorders[0].prompts, metrics, out


def evaluation(tiny, tok, long_prompts, max_prompt_length=LIMIT):
    backend = Recording(make_backend("hf", str(tiny), tokenizer=tok))
    config = EvalConfig(num_samples=1, max_new_tokens=4, forced_reasoning=False, max_prompt_length=max_prompt_length,
                        long_prompts=long_prompts)
    return backend.prompts, evaluate(config, tiny, ROWS, tokenizer=tok, backend=backend, return_rows=True)


def rejection(tiny, tok, long_prompts, max_prompt_length=LIMIT):
    backend = Recording(make_backend("hf", str(tiny), tokenizer=tok))
    config = RejectionSamplingConfig(num_samples=2, max_new_tokens=4, max_prompt_length=max_prompt_length,
                                     long_prompts=long_prompts)
    kept, stats = rejection_sample(config, backend, tok, ROWS)
    return backend.prompts, stats


def test_encode_prompts_applies_the_policy(tok):
    prompts = [r["prompt"] for r in ROWS]
    full = [encode_prompt(tok, p) for p in prompts]
    cut = encode_prompts(tok, prompts, LIMIT, "truncate")
    assert cut.kept == list(range(8)) and cut.ids[3] == full[3][-LIMIT:] and cut.ids[:3] == full[:3]
    assert cut.truncated == [False] * 3 + [True] + [False] * 4
    assert cut.counts("x/") == {"x/truncated": 1, "x/dropped": 0}
    dropped = encode_prompts(tok, prompts, LIMIT, "drop")
    assert dropped.kept == [0, 1, 2, 4, 5, 6, 7] and dropped.ids == full[:3] + full[4:]
    assert dropped.counts("x/") == {"x/truncated": 0, "x/dropped": 1}
    assert encode_prompts(tok, prompts, None, "drop").ids == full  # no limit
    assert encode_prompts(tok, prompts, len(full[3]), "drop").num_dropped == 0  # exactly at the limit is kept


def test_truncate_feeds_the_same_ids_in_training_evaluation_and_rejection(tiny, tok, tmp_path, monkeypatch):
    expected = long_ids(tok)[-LIMIT:]  # the last LIMIT tokens: the question's end and the generation prompt
    assert len(long_ids(tok)) > LIMIT
    train_prompts, metrics, out = train(tiny, tmp_path, monkeypatch, "truncate")
    eval_prompts, m = evaluation(tiny, tok, "truncate")
    rs_prompts, stats = rejection(tiny, tok, "truncate")
    for name, prompts in (("train", train_prompts), ("eval", eval_prompts), ("rs", rs_prompts)):
        assert max(len(p) for p in prompts) == LIMIT, name  # nothing longer reaches the backend
        cut = [p for p in prompts if len(p) == LIMIT]  # the short prompts have 5 tokens
        assert cut and all(p == expected for p in cut), name
    # counted: 2 steps x 4 prompts = one pass over the 8 rows, the long one once
    assert sorted(m_["prompts/truncated"] for m_ in metrics) == [0.0, 1.0]
    assert all(m_["prompts/dropped"] == 0 for m_ in metrics) and "prompts/truncated" in out
    assert m["eval/prompts_truncated"] == 1 and m["eval/prompts_dropped"] == 0 and m["eval/num_rows"] == 8
    assert stats["rs/prompts_truncated"] == 1 and stats["rs/prompts_dropped"] == 0 and stats["rs/num_prompts"] == 8


def test_drop_skips_and_counts_in_training_evaluation_and_rejection(tiny, tok, tmp_path, monkeypatch):
    train_prompts, metrics, out = train(tiny, tmp_path, monkeypatch, "drop")
    eval_prompts, m = evaluation(tiny, tok, "drop")
    rs_prompts, stats = rejection(tiny, tok, "drop")
    short = {tuple(encode_prompt(tok, r["prompt"])) for r in ROWS if r["id"] != "long"}
    for name, prompts in (("train", train_prompts), ("eval", eval_prompts), ("rs", rs_prompts)):
        assert prompts and {tuple(p) for p in prompts} <= short, name  # the long prompt never reaches the backend
    assert len(train_prompts) == 8 and len({tuple(p) for p in train_prompts}) == 7  # whole groups: 2 steps x 4
    assert all(m_["prompts/dropped"] == 1 and m_["prompts/truncated"] == 0 for m_ in metrics)
    assert out["prompts/dropped"] == 1
    assert m["eval/prompts_dropped"] == 1 and m["eval/prompts_truncated"] == 0 and m["eval/num_rows"] == 7
    assert "long" not in [r["id"] for r in m["rows"]]
    assert stats["rs/prompts_dropped"] == 1 and stats["rs/prompts_truncated"] == 0 and stats["rs/num_prompts"] == 7
    assert "long" not in [p["id"] for p in stats["per_prompt"]]


def test_seeds_of_the_kept_rows_do_not_move_when_a_row_is_dropped(tiny, tok):
    """Sampling seeds follow the row id, so dropping the long row leaves every other row's samples as they were."""
    _, truncated = evaluation(tiny, tok, "truncate")
    _, dropped = evaluation(tiny, tok, "drop")
    by_id = {r["id"]: r for r in truncated["rows"]}
    for r in dropped["rows"]:
        assert r == by_id[r["id"]]


def test_everything_dropped_is_a_clear_error(tiny, tok, tmp_path, monkeypatch):
    for run in (lambda: evaluation(tiny, tok, "drop", max_prompt_length=2),
                lambda: rejection(tiny, tok, "drop", max_prompt_length=2),
                lambda: train(tiny, tmp_path, monkeypatch, "drop", max_prompt_length=2)):
        with pytest.raises(ValueError, match=r"all 8 prompts exceeded max_prompt_length \(2 tokens\)"):
            run()


def test_the_policy_is_a_config_choice():
    for cls in (GRPOConfig, EvalConfig, RejectionSamplingConfig):
        assert cls().sampling.long_prompts == "truncate" and cls().sampling.max_prompt_length == 512
        assert cls(long_prompts="drop").sampling.long_prompts == "drop"
        with pytest.raises(ValueError):
            cls(long_prompts="skip")
    assert "last max_prompt_length tokens" in GRPOSampling.model_fields["long_prompts"].description
