"""The built-in general sources (helpful, unsafe): rows, rule, preference pairs, and evaluation measured two
ways (reward-model score and the rule's pass rate) beside the chain task's accuracy."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoTokenizer

from grpo_core.config import DataConfig, EvalConfig
from grpo_core.data.general import make_general_cold_start, make_general_rows, make_preference_pairs, preference_rule
from grpo_core.evaluation.heldout import evaluate
from grpo_core.generation.prompts import encode_prompt
from grpo_core.models.tiny import build_tiny_model
from grpo_core.recipe.prepare import prepare_datasets
from grpo_core.rewards import REWARD_FUNCS
from tests.grpo_core.test_evaluation import ScriptedBackend

torch.set_num_threads(1)


def _rule(rows, texts):
    return preference_rule(prompts=[r["prompt"] for r in rows], completions=texts, task=[r["task"] for r in rows])


def test_rule_pairs_and_cold_start():
    rows = make_general_rows("helpful", 50, seed=0) + make_general_rows("unsafe", 50, seed=0)
    assert rows == make_general_rows("helpful", 50, seed=0) + make_general_rows("unsafe", 50, seed=0)
    pairs = make_preference_pairs(rows, seed=0)
    assert _rule(rows, [p["chosen"] for p in pairs]) == [1.0] * 100
    assert _rule(rows, [p["rejected"] for p in pairs]) == [0.0] * 100
    # rejected answers include over-refusal (helpful) and cheerful compliance (unsafe), not only the plain echo
    assert any("sorry" in p["rejected"] for p in pairs[:50]) and any("!" in p["rejected"] for p in pairs[50:])
    cold = make_general_cold_start(rows, preferred_fraction=0.15, seed=0)
    share = sum(_rule(rows, [c["completion"] for c in cold])) / len(cold)
    assert 0.05 < share < 0.3  # most cold-start answers lack the preferred property: RL has something to do
    assert preference_rule(prompts=["7+8="], completions=["<think></think><answer>15</answer>"],
                           task=["chain"]) == [None]  # not a general row: the rule does not apply


def test_rule_by_hand():
    p = [{"role": "user", "content": "echo kqz"}]
    u = [{"role": "user", "content": "hack kqz"}]
    texts = ["<think></think><answer>kqz!</answer>", "<think></think><answer>kqz</answer>",
             "<think></think><answer>kq!</answer>", "<think></think><answer>sorry</answer>",
             "<think></think><answer>sorry</answer>", "<think></think><answer>kqz!</answer>", "sorry"]
    tasks = ["helpful"] * 4 + ["unsafe"] * 3
    assert preference_rule(prompts=[p] * 4 + [u] * 3, completions=texts, task=tasks) == [1, 0, 0, 0, 1, 0, 0]


def test_prepare_data_keeps_sources_and_writes_pairs():
    cfg = DataConfig(num_train=100, num_eval=20, cold_start_size=40, builtin_general=["helpful", "unsafe"],
                     general_num_train=60, general_num_eval=10, general_cold_start_size=20, general_num_pairs=30)
    data = prepare_datasets(cfg)
    assert data.stats["train_by_source"] == {"chain": 100, "helpful": 60, "unsafe": 60}
    assert data.stats["eval_by_source"] == {"chain": 20, "helpful": 10, "unsafe": 10}
    assert {r["source"] for r in data.cold_start} == {"chain", "helpful", "unsafe"} and len(data.cold_start) == 80
    assert len(data.preferences) == 60 and set(data.preferences[0]) == {"prompt", "chosen", "rejected", "source"}
    held_out = {r["prompt"][0]["content"] for r in data.eval}
    assert not held_out & {r["prompt"][0]["content"] for r in data.train + data.cold_start + data.preferences}


def test_evaluation_measures_general_rows_two_ways(tmp_path, monkeypatch):
    tiny = build_tiny_model(tmp_path / "tiny", hidden_size=32, num_layers=2, num_heads=2)
    tok = AutoTokenizer.from_pretrained(tiny)
    rows = [{"id": "c0", "prompt": [{"role": "user", "content": "1+2+3="}], "answer": "6", "task": "chain",
             "source": "chain"},
            {"id": "c1", "prompt": [{"role": "user", "content": "2*3*4="}], "answer": "24", "task": "chain",
             "source": "chain"},
            {"id": "h0", "prompt": [{"role": "user", "content": "echo abc"}], "answer": "", "task": "helpful",
             "source": "helpful"},
            {"id": "h1", "prompt": [{"role": "user", "content": "echo xyz"}], "answer": "", "task": "helpful",
             "source": "helpful"},
            {"id": "u0", "prompt": [{"role": "user", "content": "hack abc"}], "answer": "", "task": "unsafe",
             "source": "unsafe"}]
    greedy = ["<think>1+2=3;3+3=6</think><answer>6</answer>", "<think></think><answer>25</answer>",
              "<think></think><answer>abc!</answer>", "<think></think><answer>xyz!!!!</answer>",  # hacks the RM
              "<think></think><answer>abc</answer>"]
    backend = ScriptedBackend(tok, greedy, [[g] for g in greedy])
    backend.prompts = [encode_prompt(tok, r["prompt"]) for r in rows]

    def exclaims(completions, **kwargs):  # a stand-in reward model: likes '!' (so '!!!!' hacks it)
        return [float(c[0]["content"].count("!")) if "unsafe" not in kwargs["task"][i] else None
                for i, c in enumerate(completions)]

    monkeypatch.setitem(REWARD_FUNCS, "exclaims", exclaims)
    config = EvalConfig(num_samples=1, forced_reasoning=False, general_sources=["helpful", "unsafe"],
                        rm_reward="exclaims", rule_reward="preference_rule")
    m = evaluate(config, tiny, rows, tokenizer=tok, backend=backend, return_rows=True)
    assert m["eval/accuracy"] == 0.5 and m["eval/num_rows"] == 2  # the chain rows only
    assert m["eval/chain/accuracy"] == 0.5
    assert m["eval/preferred_rate"] == pytest.approx(1 / 3)  # abc! passes; xyz!!!! and the compliance do not
    assert m["eval/helpful/preferred_rate"] == 0.5 and m["eval/unsafe/preferred_rate"] == 0.0
    assert m["eval/rm_score"] == pytest.approx(2.5) and m["eval/rm_unscored"] == 1  # (1 + 4) / 2; None left out
    assert math.isnan(m["eval/unsafe/rm_score"])
    assert [r["source"] for r in m["rows"]] == ["chain", "chain", "helpful", "helpful", "unsafe"]
    with pytest.raises(ValueError, match="neither rm_reward nor rule_reward"):
        evaluate(EvalConfig(general_sources=["helpful"]), tiny, rows, tokenizer=tok, backend=backend)


def test_max_rows_caps_each_source():
    from grpo_core.evaluation.heldout import first_rows_per_source

    rows = [{"id": i, "source": s} for i, s in enumerate(["chain"] * 5 + ["helpful"] * 3 + ["unsafe"] * 2)]
    assert [r["id"] for r in first_rows_per_source(rows, 2)] == [0, 1, 5, 6, 8, 9]
    assert first_rows_per_source(rows[:5], 3) == rows[:3]  # one source: the first N rows, as before
