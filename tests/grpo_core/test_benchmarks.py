"""Benchmarks by name: loading each schema from local files, and the R1-protocol numbers on scripted samples."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from grpo_core.config import BENCHMARKS, BenchmarkSource, EvalConfig, R1_PROMPT
from grpo_core.data.rows import DataError, write_parquet
from grpo_core.evaluation.benchmarks import evaluate_benchmark, load_benchmark, resolve_benchmark
from grpo_core.generation import Rollout
from grpo_core.generation.prompts import encode_prompt
from grpo_core.models.tiny import build_tiny_model

torch.set_num_threads(1)

AIME_ROWS = [  # the hub datasets' columns: id, problem, solution, answer, url, year
    {"id": 60, "problem": "Every morning Aya goes for a $9$-kilometer-long walk ...", "solution": "...",
     "answer": "204", "url": "https://artofproblemsolving.com/wiki/index.php/2024_AIME_I_Problems/Problem_1",
     "year": "2024"},
    {"id": 61, "problem": "There exist real numbers $x$ and $y$ ...", "solution": "...", "answer": "025",
     "url": "https://artofproblemsolving.com/wiki/index.php/2024_AIME_I_Problems/Problem_2", "year": "2024"},
]


def _user_text(row):
    return row["prompt"][-1]["content"]


def test_hub_ids_and_fields_are_named():
    assert BENCHMARKS["math500"].path == "HuggingFaceH4/MATH-500" and BENCHMARKS["math500"].field_map["prompt"] == "problem"
    assert (BENCHMARKS["gsm8k"].path, BENCHMARKS["gsm8k"].name, BENCHMARKS["gsm8k"].split) == ("openai/gsm8k", "main", "test")
    assert BENCHMARKS["aime24"].path == "HuggingFaceH4/aime_2024"
    assert BENCHMARKS["aime25"].path == "yentinglin/aime_2025"


def test_math500_local_copy(shared_data):
    rows = load_benchmark(BenchmarkSource(benchmark="math500", path=str(shared_data / "math500_test.json")))
    assert len(rows) == 500
    assert rows[0]["answer"] == "\\left( 3, \\frac{\\pi}{2} \\right)" and rows[0]["id"] == "test/precalculus/807.json"
    assert _user_text(rows[0]).startswith("Convert the point $(0,3)$")
    assert _user_text(rows[0]).endswith("put your final answer within \\boxed{}.")
    assert len(load_benchmark(BenchmarkSource(benchmark="math500", path=str(shared_data / "math500_test.json")),
                              limit=5)) == 5


def test_gsm8k_local_copy(shared_data):
    rows = load_benchmark(BenchmarkSource(benchmark="gsm8k", path=str(shared_data / "gsm8k_test.jsonl")), limit=3)
    assert [r["answer"] for r in rows] == ["18", "3", "70000"]  # the text after '####'
    assert _user_text(rows[0]).startswith("Janet")


@pytest.mark.parametrize("name, suffix", [("aime24", ".jsonl"), ("aime25", ".parquet")])
def test_aime_schemas_from_local_files(tmp_path, name, suffix):
    path = tmp_path / f"{name}{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in AIME_ROWS))
    else:
        write_parquet(AIME_ROWS, path)
    rows = load_benchmark(BenchmarkSource(benchmark=name, path=str(path)))
    assert [(r["id"], r["answer"]) for r in rows] == [("60", "204"), ("61", "025")]
    assert _user_text(rows[0]) == R1_PROMPT.format(prompt=AIME_ROWS[0]["problem"])


def test_any_local_file_with_a_field_map(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps([{"q": "What is 2+2?", "a": "4"}, {"q": "What is 3*3?", "a": "9"}]))
    src = BenchmarkSource(benchmark="mine", path=str(path), field_map={"prompt": "q", "answer": "a"})
    assert resolve_benchmark(src) == src  # not a built-in: taken as given
    rows = load_benchmark(src)
    assert [(_user_text(r), r["answer"]) for r in rows] == [("What is 2+2?", "4"), ("What is 3*3?", "9")]
    bad = BenchmarkSource(benchmark="mine", path=str(path))  # default field_map: prompt/answer columns
    with pytest.raises(DataError, match=r"mine.json row 1: field 'prompt' \(column 'prompt'\) is missing"):
        load_benchmark(bad)


def test_hub_loading_names_the_dataset_when_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DataError, match="HuggingFaceH4/aime_2024"):
        load_benchmark("aime24")


def test_config_checks():
    with pytest.raises(ValueError, match="unknown benchmark 'math5000'"):
        EvalConfig(benchmarks=["math5000"])
    with pytest.raises(ValueError, match="k=8 is outside 1..sampling.num_generations"):
        EvalConfig(benchmarks=["math500"], num_samples=4, k=[1, 8])
    with pytest.raises(ValueError, match="reference.math500.pass1"):
        EvalConfig(reference={"math500": {"pass1": 97.3}})
    cfg = EvalConfig(benchmarks=["math500", {"benchmark": "x", "path": "x.jsonl"}], num_samples=4,
                     reference={"math500": {"label": "DeepSeek-R1", "pass@1": 97.3}})
    assert cfg.ks == [4] and (cfg.sampling.temperature, cfg.sampling.top_p) == (0.6, 0.95)  # R1 protocol defaults


class ScriptedBackend:
    """Fixed completions per prompt: ``greedy[i]`` and ``sampled[i][j]``."""

    def __init__(self, tok, prompts, greedy, sampled):
        self.tok, self.prompts, self.greedy, self.sampled = tok, prompts, greedy, sampled

    def _rollout(self, prompt, text):
        return Rollout(prompt, self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id],
                       None, False, text)

    def generate(self, prompt_ids, request):
        n, greedy = request.n, request.greedy
        out = []
        for p in prompt_ids:
            i = self.prompts.index(p)
            out += [self._rollout(p, self.greedy[i])] if greedy else [self._rollout(p, t) for t in self.sampled[i][:n]]
        return out

    def update_weights(self, model):
        pass


def test_protocol_numbers_by_hand(tmp_path):
    tok = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "tiny", hidden_size=32, num_layers=1, num_heads=2))
    rows = [{"id": "half", "prompt": [{"role": "user", "content": "Half of one?"}], "answer": "\\frac{1}{2}"},
            {"id": "ten", "prompt": [{"role": "user", "content": "Five plus five?"}], "answer": "10"}]
    sampled = [
        # 0.5, 1/2 and 2/4 are one answer (math-verify), 3 votes beat "2"; by string "2" would win the tie
        ["\\boxed{2}", "\\boxed{0.5}", "\\boxed{\\frac{1}{2}}", "\\boxed{\\frac{2}{4}}"],
        # 11 x2 vs 10 x2: the tie goes to 11 (first seen), so maj@4 = 0; blocks of 2: [11, 10] -> 11, [10, 11] -> 10
        ["\\boxed{11}", "\\boxed{10}", "\\boxed{10}", "\\boxed{11}"],
    ]
    greedy = ["\\boxed{1/2}", "no answer here"]
    backend = ScriptedBackend(tok, [encode_prompt(tok, r["prompt"]) for r in rows], greedy, sampled)
    cfg = EvalConfig(num_samples=4, k=[1, 2, 4], batch_size=8, benchmarks=[])
    metrics, results = evaluate_benchmark(backend, tok, rows, cfg)
    assert metrics["pass@1"] == pytest.approx((3 / 4 + 2 / 4) / 2)
    assert metrics["pass@2"] == pytest.approx(((1 - 0 / 6) + (1 - 1 / 6)) / 2)  # c=3: C(1,2)=0; c=2: C(2,2)/C(4,2)
    assert metrics["pass@4"] == 1.0
    assert results[0]["maj@4"] == 1.0 and results[1]["maj@4"] == 0.0
    assert results[1]["maj@2"] == 0.5  # [11, 10] tie -> 11 wrong; [10, 11] tie -> 10 right
    assert metrics["maj@1"] == metrics["pass@1"]
    assert metrics["greedy"] == 0.5 and [r["greedy_correct"] for r in results] == [True, False]
    assert results[0]["extracted"] == ["2", "0.5", "\\frac{1}{2}", "\\frac{2}{4}"]
    assert metrics["num_rows"] == 2.0


def test_a_local_copy_of_a_builtin_keeps_its_schema_through_a_saved_config():
    cfg = EvalConfig(benchmarks=[{"benchmark": "gsm8k", "path": "/data/gsm8k_test.jsonl"}])
    again = EvalConfig.model_validate(cfg.model_dump(mode="json"))  # what the store saves and a stage reads back
    for c in (cfg, again):
        src = c.benchmarks[0]
        assert (src.path, src.field_map, src.answer_format) == ("/data/gsm8k_test.jsonl",
                                                               {"prompt": "question", "answer": "answer"}, "gsm8k")
        assert resolve_benchmark(src) == src


def test_per_source_only_when_there_are_several():
    from grpo_core.evaluation.benchmarks import per_source

    rows = [{"source": "a", "pass@1": 1.0, "greedy_correct": True}, {"source": "a", "pass@1": 0.5, "greedy_correct": False},
            {"source": "b", "pass@1": 0.0, "greedy_correct": False}]
    assert per_source(rows) == {"a/pass@1": 0.75, "a/greedy": 0.5, "b/pass@1": 0.0, "b/greedy": 0.0}
    assert per_source(rows[:2]) == {}
