"""Normalised prompt rows: loaders, row-by-row validation, dedupe, decontamination, split, parquet."""

from __future__ import annotations

import csv
import json

import pytest

from grpo_core.config import DataConfig, DatasetSource
from grpo_core.data.rows import DataError, load_prompt_rows, load_sft_rows, read_parquet, write_parquet
from grpo_core.recipe.prepare import decontaminate, dedupe_rows, prepare_datasets, split_rows
from grpo_core.rewards.extract import parse_gold_answer

GSM8K_MAP = {"prompt": "question", "answer": "answer"}


def _row(i, text):
    return {"id": f"r{i}", "prompt": [{"role": "user", "content": text}], "answer": "1", "task": "t", "source": "s"}


def test_gsm8k_real_file(shared_data):
    rows, stats = load_prompt_rows(DatasetSource(path=str(shared_data / "gsm8k_test.jsonl"), field_map=GSM8K_MAP))
    assert len(rows) == 1319 and stats.rows_kept == 1319 and stats.rows_skipped == 0
    assert rows[0]["answer"] == "18"  # "... #### 18"
    assert rows[0]["prompt"][0]["content"].startswith("Janet’s ducks lay 16 eggs")
    assert all(r["answer"] and "####" not in r["answer"] for r in rows)
    assert all(r["answer"].lstrip("-").replace(".", "").isdigit() for r in rows)
    assert len({r["id"] for r in rows}) == 1319


def test_math500_real_file(shared_data, tmp_path):
    src = DatasetSource(path=str(shared_data / "math500_test.json"), answer_format="raw",
                        field_map={"prompt": "problem", "answer": "answer", "id": "unique_id"},
                        keep_columns=["difficulty"], prompt_template="{prompt}\nPut the answer in <answer></answer>.")
    rows, _ = load_prompt_rows(src)
    assert len(rows) == 500
    assert rows[0]["id"] == "test/precalculus/807.json"
    assert rows[0]["answer"] == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert rows[0]["prompt"][0]["content"].endswith("\nPut the answer in <answer></answer>.")
    assert rows[0]["difficulty"] == 2.0
    back = read_parquet(write_parquet(rows, tmp_path / "math.parquet"))
    assert back == rows
    # parquet as an input source round-trips too
    again, _ = load_prompt_rows(DatasetSource(path=str(tmp_path / "math.parquet"), answer_format="raw"))
    assert [r["prompt"] for r in again] == [r["prompt"] for r in rows]


def test_decontaminate_real_sets(shared_data):
    gsm, _ = load_prompt_rows(DatasetSource(path=str(shared_data / "gsm8k_test.jsonl"), field_map=GSM8K_MAP))
    train, evals = gsm[:300], gsm[250:400]
    kept, report = decontaminate(train, evals, ngram_size=13)
    assert report.num_removed == 50 and kept == train[:250]
    # a paraphrase keeping a 13-word run is caught; one sharing only short runs is not
    words = evals[0]["prompt"][0]["content"].split()
    leaked = _row(0, "Some intro. " + " ".join(words[:14]) + " and a different ending")
    unrelated = _row(1, " ".join(words[:5]) + " completely different words follow here in this sentence now")
    kept, report = decontaminate([leaked, unrelated], evals, ngram_size=13)
    assert kept == [unrelated] and report.num_removed == 1


def test_missing_answer_column_names_file_line_and_field(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "1+1?", "answer": "#### 2"}\n{"question": "2+2?"}\n')
    with pytest.raises(DataError) as e:
        load_prompt_rows(DatasetSource(path=str(path), field_map=GSM8K_MAP))
    msg = str(e.value)
    assert f"{path} line 2" in msg and "'answer'" in msg and "field_map" in msg and "on_error" in msg
    rows, stats = load_prompt_rows(DatasetSource(path=str(path), field_map=GSM8K_MAP), on_error="skip")
    assert [r["answer"] for r in rows] == ["2"]
    assert stats.rows_read == 2 and stats.rows_skipped == 1 and "line 2" in stats.errors[0]


def test_malformed_jsonl_lines(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"prompt": "a", "answer": "1"}\n\n{"prompt": "b", "answer": \n[1, 2]\n{"prompt": "c", "answer": 3}\n')
    with pytest.raises(DataError, match=r"broken.jsonl line 3: malformed JSON"):
        load_prompt_rows(DatasetSource(path=str(path)))
    rows, stats = load_prompt_rows(DatasetSource(path=str(path)), on_error="skip")
    assert [r["answer"] for r in rows] == ["1", "3"]  # a number answer becomes its text
    assert stats.rows_skipped == 2 and stats.rows_read == 4
    assert "line 3" in stats.errors[0] and "line 4" in stats.errors[1]


GOOD = [json.dumps({"prompt": f"what is {i} plus {i}?", "answer": str(2 * i)}).encode() for i in range(4)]
FIX = "re-save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8) or fix the row"
LATIN1 = {  # a latin-1 "é" (0xe9) in the third row; each file's raised message and kept answers when skipped
    "d.jsonl": (b"\n".join([*GOOD[:2], b'{"prompt": "caf\xe9?", "answer": "1"}', *GOOD[2:]]) + b"\n",
                "line 3", ["0", "2", "4", "6"]),
    "d.json": (b"[\n" + b",\n".join([*GOOD[:2], b'{"prompt": "caf\xe9 \xe9?", "answer": "1"}',
                                      b'{"prompt": "x\xff?", "answer": "1"}', *GOOD[2:]]) + b"\n]\n",
               "row 3 (line 4)", ["0", "2", "4", "6"]),
    "d.csv": (b"prompt,answer\nwhat is 1?,1\ncaf\xe9?,2\nwhat is 3?,3\n", "line 3", ["1", "3"]),
}


@pytest.mark.parametrize("name", sorted(LATIN1))
def test_non_utf8_byte_names_file_and_line_and_can_be_skipped(tmp_path, name):
    data, where, kept = LATIN1[name]
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(DataError) as e:
        load_prompt_rows(DatasetSource(path=str(path)))
    assert str(e.value) == (f"{path} {where}: byte 0xe9 is not UTF-8; {FIX}. "
                            "Or set on_error: skip to skip and count bad rows.")
    rows, stats = load_prompt_rows(DatasetSource(path=str(path)), on_error="skip")
    assert [r["answer"] for r in rows] == kept
    assert stats.rows_skipped == (2 if name == "d.json" else 1)
    assert stats.errors[0] == f"{path} {where}: byte 0xe9 is not UTF-8; {FIX}"
    if name == "d.json":  # the next bad row is found at its own line, after a row with two bad bytes
        assert stats.errors[1] == f"{path} row 4 (line 5): byte 0xff is not UTF-8; {FIX}"


def test_non_utf8_csv_header_cannot_be_skipped(tmp_path):
    path = tmp_path / "h.csv"
    path.write_bytes(b"pr\xe9mpt,answer\nwhat is 1?,1\n")
    for on_error in ("raise", "skip"):
        with pytest.raises(DataError) as e:
            load_prompt_rows(DatasetSource(path=str(path)), on_error=on_error)
        assert str(e.value) == (f"{path} line 1: byte 0xe9 is not UTF-8; "
                                "re-save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8) or fix the header")


@pytest.mark.parametrize("name, content", [("e.jsonl", b""), ("blank.jsonl", b"\n  \n"), ("e.json", b""),
                                           ("list.json", b"[]"), ("e.csv", b"prompt,answer\n"), ("e.parquet", None)])
def test_empty_file_says_it_is_empty(tmp_path, name, content):
    path = tmp_path / name
    if content is None:
        write_parquet([], path)
    else:
        path.write_bytes(content)
    for on_error in ("raise", "skip"):
        with pytest.raises(DataError) as e:
            load_prompt_rows(DatasetSource(path=str(path)), on_error=on_error)
        assert str(e.value) == f"{path}: the file is empty (no rows); fill it or remove it from the data sources"


def test_csv_and_bad_prompt_type(tmp_path):
    path = tmp_path / "d.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["q", "a"])
        w.writerow(["multi\nline question", "5"])
        w.writerow(["", "6"])
    with pytest.raises(DataError, match=r"d.csv line 4: field 'prompt' \(column 'q'\)"):
        load_prompt_rows(DatasetSource(path=str(path), field_map={"prompt": "q", "answer": "a"}))
    bad = tmp_path / "b.json"
    bad.write_text(json.dumps({"data": [{"prompt": 5, "answer": "1"}]}))
    with pytest.raises(DataError, match=r"b.json row 1: field 'prompt' .* must be a string or a list of chat messages"):
        load_prompt_rows(DatasetSource(path=str(bad)))


def test_datasets_code_path_on_local_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    folder = tmp_path / "my_dataset"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps({"question": f"q{i}", "answer": f"x #### {i}"}) + "\n" for i in range(5)))
    rows, _ = load_prompt_rows(DatasetSource(path=str(folder), split="train", field_map=GSM8K_MAP))
    assert [r["answer"] for r in rows] == ["0", "1", "2", "3", "4"]
    with pytest.raises(DataError, match="cannot load dataset"):
        load_prompt_rows(DatasetSource(path=str(folder), split="validation", field_map=GSM8K_MAP))


def _hub_layout_folder(folder, answers, mtime_ns):
    """A folder laid out as a hub data set (README.md configs, a parquet shard), its shard's mtime set: a rebuild
    that keeps names, layout and times (copied with copy2, or made by the same script at a fixed time)."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    (folder / "data").mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text("---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n"
                                      "    path: data/train-*\n---\n")
    shard = folder / "data" / "train-00000-of-00001.parquet"
    pq.write_table(pa.table({"question": [f"q{i}" for i in range(3)], "answer": [f"x #### {a}" for a in answers]}), shard)
    os.utime(shard, ns=(mtime_ns, mtime_ns))


def test_a_rebuilt_local_folder_reads_its_new_rows(tmp_path, monkeypatch):
    """The ``datasets`` cache keys a local folder by its name and layout, not its content or place: read through it, a
    folder rebuilt in place, or another folder of the same name, came back with the first folder's rows."""
    import datasets

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    src = lambda folder: DatasetSource(path=str(folder), name="default", split="train", field_map=GSM8K_MAP)  # noqa: E731
    answers = lambda folder: [r["answer"] for r in load_prompt_rows(src(folder))[0]]  # noqa: E731
    first = tmp_path / "a" / "open-r1--set"
    _hub_layout_folder(first, [1, 2, 3], 10**18)
    assert answers(first) == ["1", "2", "3"]
    _hub_layout_folder(first, [4, 5, 6], 10**18)  # rebuilt in place
    assert answers(first) == ["4", "5", "6"]
    other = tmp_path / "b" / "open-r1--set"  # same name, another directory
    _hub_layout_folder(other, [7, 8, 9], 2 * 10**18)
    assert answers(other) == ["7", "8", "9"]
    assert answers(first) == ["4", "5", "6"]
    assert not any((tmp_path / "cache").iterdir())  # each read's own cache folder is gone


def test_sft_rows_need_completion(tmp_path):
    path = tmp_path / "traces.jsonl"
    path.write_text('{"q": "1+1", "trace": "<think>1+1=2</think><answer>2</answer>"}\n{"q": "2+2"}\n')
    src = DatasetSource(path=str(path), field_map={"prompt": "q", "completion": "trace"})
    with pytest.raises(DataError, match="line 2: field 'completion'"):
        load_sft_rows(src)
    rows, stats = load_sft_rows(src, on_error="skip")
    assert rows == [{"prompt": [{"role": "user", "content": "1+1"}], "completion": "<think>1+1=2</think><answer>2</answer>"}]


def test_parse_gold_answer():
    assert parse_gold_answer("so 3 + 4 = 7\n#### 1,234") == "1234"
    assert parse_gold_answer("x \\boxed{1} then \\boxed{\\frac{1}{2}} end", "boxed") == "\\frac{1}{2}"
    assert parse_gold_answer("so \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"  # auto unwraps a box too
    assert parse_gold_answer(" 42 ", "auto") == "42" and parse_gold_answer("$5$") == "5"
    assert parse_gold_answer("#### 5, 6") == "5, 6"  # only thousands separators are dropped
    assert parse_gold_answer(" \\boxed{1,000} ", "raw") == "\\boxed{1,000}"
    for gold in ("#### 1,234", "\\boxed{$7$}", "(1,2)", "\\left( 3, \\frac{\\pi}{2} \\right)"):
        once = parse_gold_answer(gold)
        assert parse_gold_answer(once) == once  # math_accuracy re-parses prepared rows: a no-op
    with pytest.raises(ValueError, match="####"):
        parse_gold_answer("no marker", "gsm8k")
    with pytest.raises(ValueError, match="boxed"):
        parse_gold_answer("\\boxed{unclosed", "boxed")


def test_dedupe_and_split_are_deterministic():
    rows = [_row(i, f"Question number {i}") for i in range(100)]
    dup = [_row(200, "question   NUMBER 3"), _row(201, "Question number 4\n")]
    kept, removed = dedupe_rows(rows + dup)
    assert removed == 2 and kept == rows
    train, test = split_rows(rows, eval_fraction=0.1, seed=1)
    assert len(test) == 10 and len(train) == 90
    assert not {r["id"] for r in train} & {r["id"] for r in test}
    assert split_rows(list(reversed(rows)), eval_fraction=0.1, seed=1) == (train, test)  # order-independent
    assert split_rows(rows, eval_fraction=0.1, seed=2)[1] != test
    with pytest.raises(DataError):
        split_rows(rows[:1], eval_fraction=0.5)


def test_prepare_builtin_and_sources(shared_data):
    cfg = DataConfig(num_train=300, num_eval=50, cold_start_size=100, seed=3)
    out = prepare_datasets(cfg)
    assert len(out.train) == 300 and len(out.eval) == 50 and len(out.cold_start) == 100
    eval_prompts = {r["prompt"][0]["content"] for r in out.eval}
    assert not eval_prompts & {r["prompt"][0]["content"] for r in out.train + out.cold_start}
    assert prepare_datasets(cfg).train == out.train
    gsm = DatasetSource(path=str(shared_data / "gsm8k_test.jsonl"), field_map=GSM8K_MAP, max_rows=200)
    out = prepare_datasets(DataConfig(builtin_task=None, train_sources=[gsm, gsm], eval_fraction=0.1))
    assert out.stats["train_duplicates"] == 200  # the second copy
    assert len(out.eval) == 20 and len(out.train) == 180


TEMPLATE = ("{prompt}\nThink step by step inside <think></think>, then give the final number inside "
            "<answer></answer>, and check your work once more before you answer.")


def _question_file(path, questions):
    path.write_text("".join(json.dumps({"question": q, "answer": f"#### {i}"}) + "\n" for i, q in enumerate(questions)))
    return str(path)


def _questions(start, n):
    return [f"Tom has {i} apples and buys {i + 3} more from shop number {i * 7}. How many now?" for i in range(start, start + n)]


def test_decontamination_compares_prompts_before_their_template(tmp_path):
    """A template shared by train and eval sources puts the same 13-grams in every prompt: compared after it,
    every training row would be dropped (the GPU configs lost all of GSM8K so)."""
    src = {"field_map": GSM8K_MAP, "prompt_template": TEMPLATE, "source": "gsm8k"}
    config = DataConfig(builtin_task=None, train_sources=[{"path": _question_file(tmp_path / "train.jsonl",
                        _questions(0, 20)), **src}], eval_sources=[{"path": _question_file(
                        tmp_path / "test.jsonl", _questions(100, 10)), **src}])
    data = prepare_datasets(config)
    assert len(data.train) == 20 and data.stats["train_contaminated"] == 0
    assert data.train[0]["prompt"][0]["content"].endswith("before you answer.")  # trained with the template
    assert all("_raw_prompt" not in r for r in (*data.train, *data.eval))  # the compared text is never written
    # a real overlap is still caught, reported per source with one shared n-gram
    leaked = _questions(0, 18) + _questions(100, 2)
    config = config.model_copy(update={"train_sources": [config.train_sources[0].model_copy(
        update={"path": _question_file(tmp_path / "leaky.jsonl", leaked)})]})
    data = prepare_datasets(config)
    assert data.stats["train_contaminated"] == 2
    report = data.stats["train_contaminated_by_source"]["gsm8k"]
    assert report["removed"] == 2 and report["of"] == 20 and "apples" in report["example_ngram"]


def test_source_losing_most_rows_to_decontamination_fails_naming_it(tmp_path):
    train = _question_file(tmp_path / "train.jsonl", _questions(0, 10))
    evals = _question_file(tmp_path / "test.jsonl", _questions(0, 6) + _questions(50, 4))
    config = DataConfig(builtin_task=None, train_sources=[{"path": train, "field_map": GSM8K_MAP, "source": "gsm"}],
                        eval_sources=[{"path": evals, "field_map": GSM8K_MAP, "source": "gsm"}])
    with pytest.raises(DataError) as e:
        prepare_datasets(config)
    msg = str(e.value)
    assert "6 of 10 train rows of source 'gsm'" in msg and "max_contaminated_fraction 0.5" in msg
    assert "e.g. 'tom has" in msg and "data.ngram_size" in msg
    assert len(prepare_datasets(config.model_copy(update={"max_contaminated_fraction": 0.6})).train) == 4
