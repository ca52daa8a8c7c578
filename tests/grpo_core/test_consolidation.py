"""Consolidation mix (R1 sec. 2.3.3): reasoning and general rows at the configured ratio, within one row."""

from __future__ import annotations

import json

import pytest

from grpo_core.config import DatasetSource
from grpo_core.data.rows import DataError
from grpo_core.recipe.consolidation import general_source_names, label_rows, load_general_rows, mix_by_ratio


def _rows(n, tag):
    return [{"prompt": [{"role": "user", "content": f"{tag} {i}"}], "completion": f"{tag} answer {i}"} for i in range(n)]


@pytest.mark.parametrize("n_reasoning,n_general,ratio", [(12, 100, 3.0), (13, 100, 3.0), (7, 100, 2.5), (30, 4, 3.0),
                                                         (10, 100, 0.5)])
def test_counts_by_source_match_the_ratio_within_one_row(n_reasoning, n_general, ratio):
    rows, counts = mix_by_ratio(_rows(n_reasoning, "r"), {"chat.jsonl": _rows(n_general, "g")}, ratio, seed=1)
    r, g = counts["reasoning"], counts.get("general:chat.jsonl", 0)
    assert len(rows) == r + g and abs(g - r / ratio) <= 0.5 + 1e-9
    if n_general >= round(n_reasoning / ratio):
        assert r == n_reasoning  # every reasoning row kept when there is general data enough
    else:
        assert g == n_general and r == round(n_general * ratio)  # all general rows, reasoning sampled down
    assert sum(row["source"] == "reasoning" for row in rows) == r


def test_mix_is_seeded_and_draws_from_every_general_source():
    general = {"a": _rows(50, "a"), "b": _rows(50, "b")}
    one, counts = mix_by_ratio(_rows(60, "r"), general, 3.0, seed=0)
    again, _ = mix_by_ratio(_rows(60, "r"), general, 3.0, seed=0)
    assert one == again and counts["general:a"] + counts["general:b"] == 20 and counts["general:a"] > 0 < counts["general:b"]


def test_rejection_sampled_general_answers_count_as_general_at_ratio_three():
    # rejection_sample's output at real scale: gsm8k checked by its answer, ultrafeedback kept by a reward model
    rs = [{**r, "source": "gsm8k"} for r in _rows(30, "math")] + [{**r, "source": "ultrafeedback"}
                                                                   for r in _rows(40, "uf")]
    train = [{"source": "gsm8k", "answer": "42"}, {"source": "ultrafeedback", "answer": ""}]
    assert general_source_names(train) == {"ultrafeedback"}
    rows, counts = mix_by_ratio(rs, {"ultrachat": _rows(100, "chat")}, 3.0, seed=0,
                                general_row_sources=general_source_names(train))
    general = sum(n for source, n in counts.items() if source.startswith("general:"))
    assert counts["reasoning"] == 30 and general == 10  # every general row counted: 30 : 10 = 3
    assert set(counts) <= {"reasoning", "general:ultrafeedback", "general:ultrachat"}
    assert all(row["completion"].startswith("math") for row in rows if row["source"] == "reasoning")
    assert all(row["completion"].startswith("uf") for row in rows if row["source"] == "general:ultrafeedback")
    # more general answers than the ratio allows: the general pool is sampled down, every reasoning row kept
    _, counts = mix_by_ratio(rs, {}, 3.0, general_row_sources={"ultrafeedback"})
    assert counts == {"reasoning": 30, "general:ultrafeedback": 10}


def test_rows_with_no_or_a_reasoning_source_are_reasoning():
    rows = [{**_rows(1, "a")[0]}, {**_rows(1, "b")[0], "source": "chain"}, {**_rows(1, "c")[0], "source": "helpful"}]
    assert [r["source"] for r in label_rows(rows, {"helpful"})] == ["reasoning", "reasoning", "general:helpful"]


def test_chat_rows_become_prompt_and_last_assistant_turn(tmp_path):
    path = tmp_path / "ultrachat.jsonl"  # HuggingFaceH4/ultrachat_200k's columns: prompt, prompt_id, messages
    convo = [{"role": "user", "content": "Write a haiku."}, {"role": "assistant", "content": "Old pond..."},
             {"role": "user", "content": "Another."}, {"role": "assistant", "content": "Autumn moon..."}]
    lines = [{"prompt": "Write a haiku.", "prompt_id": "x1", "messages": convo},
             {"prompt": "Hi", "prompt_id": "x2", "messages": [{"role": "user", "content": "Hi"}]}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    src = DatasetSource(path=str(path), split="train_sft", field_map={"messages": "messages"})
    with pytest.raises(DataError, match=r"ultrachat.jsonl line 2: field 'messages' \(column 'messages'\) has no assistant"):
        load_general_rows(src)
    rows = load_general_rows(src, on_error="skip")
    assert rows == [{"prompt": convo[:3], "completion": "Autumn moon..."}]
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"q": "Capital of France?", "a": "Paris."}) + "\n")
    assert load_general_rows(DatasetSource(path=str(plain), field_map={"prompt": "q", "completion": "a"})) == [
        {"prompt": [{"role": "user", "content": "Capital of France?"}], "completion": "Paris."}]
