"""Bad input fails fast with one clear message naming what and where, and commits nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from grpo_core.data.rows import DataError
from tasks.config.pipeline import ConfigError, PipelineConfig, load_config
from tasks.config.stages import get_stage
from tasks.storage.store import Store

prepare_data = get_stage("prepare_data").task

ROOT = Path(__file__).resolve().parents[2]


def _data_config(path: Path, **data) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "model": {"tiny": {"hidden_size": 16, "num_layers": 1, "num_heads": 2}},
        "data": {"builtin_task": None, "train_sources": [{"path": str(path)}], "eval_fraction": 0.3, **data},
    })


def _nothing_committed(store_dir: Path) -> None:
    store = Store(store_dir)
    assert store.latest("bad", "prepare_data") is None
    assert store.uncommitted("bad", "prepare_data") == []  # the failed stage left no partial output either


def test_missing_answer_column_names_file_row_and_field(tmp_path):
    src = tmp_path / "qa.jsonl"
    src.write_text("\n".join(json.dumps({"prompt": f"{i}+1=", "solution": str(i + 1)}) for i in range(4)) + "\n")
    with pytest.raises(DataError) as err:
        prepare_data.fn(_data_config(src), "bad", str(tmp_path / "store"))
    msg = str(err.value)
    assert str(src) in msg and "'answer'" in msg and "line 1" in msg
    _nothing_committed(tmp_path / "store")


def test_malformed_jsonl_line_names_the_line(tmp_path):
    src = tmp_path / "qa.jsonl"
    src.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": \n{"prompt": "3+3=", "answer": "6"}\n')
    with pytest.raises(DataError, match=r"line 2") as err:
        prepare_data.fn(_data_config(src), "bad", str(tmp_path / "store"))
    assert str(src) in str(err.value)
    _nothing_committed(tmp_path / "store")


def test_bad_rows_can_be_skipped_and_counted(tmp_path):
    src = tmp_path / "qa.jsonl"
    good = [json.dumps({"prompt": f"what is {i} plus {i}?", "answer": str(2 * i)}) for i in range(6)]
    src.write_text("\n".join(good[:3] + ["{not json", json.dumps({"prompt": "x"})] + good[3:]) + "\n")
    ref = prepare_data.fn(_data_config(src, on_error="skip"), "ok", str(tmp_path / "store"))
    manifest = Store(tmp_path / "store").manifest(ref)
    assert ref.metrics["data/num_train"] + ref.metrics["data/num_eval"] == 6
    assert manifest["data_stats"]["sources"][f"train:{src}"]["rows_skipped"] == 2


def test_non_utf8_byte_names_file_and_line_and_commits_nothing(tmp_path):
    src = tmp_path / "qa.jsonl"
    good = [json.dumps({"prompt": f"what is {i} plus {i}?", "answer": str(2 * i)}).encode() for i in range(6)]
    src.write_bytes(b"\n".join(good[:3] + [b'{"prompt": "caf\xe9 plus 1?", "answer": "1"}'] + good[3:]) + b"\n")
    with pytest.raises(DataError) as err:
        prepare_data.fn(_data_config(src), "bad", str(tmp_path / "store"))
    assert str(err.value).startswith(f"{src} line 4: byte 0xe9 is not UTF-8; re-save the file as UTF-8")
    _nothing_committed(tmp_path / "store")
    ref = prepare_data.fn(_data_config(src, on_error="skip"), "ok", str(tmp_path / "store"))
    assert ref.metrics["data/num_train"] + ref.metrics["data/num_eval"] == 6
    assert Store(tmp_path / "store").manifest(ref)["data_stats"]["sources"][f"train:{src}"]["rows_skipped"] == 1


def test_empty_data_file_says_so_not_eval_fraction(tmp_path):
    src = tmp_path / "qa.jsonl"
    src.write_text("")
    with pytest.raises(DataError) as err:
        prepare_data.fn(_data_config(src), "bad", str(tmp_path / "store"))
    assert str(err.value) == f"{src}: the file is empty (no rows); fill it or remove it from the data sources"
    _nothing_committed(tmp_path / "store")


def test_every_row_skipped_says_so_not_eval_fraction(tmp_path):
    src = tmp_path / "qa.jsonl"
    src.write_bytes(b'{"prompt": "caf\xe9?", "answer": "1"}\n{"prompt": "x"}\n')
    with pytest.raises(DataError) as err:
        prepare_data.fn(_data_config(src, on_error="skip"), "bad", str(tmp_path / "store"))
    assert str(err.value).startswith("no training rows left: every row was skipped as bad (on_error: skip)")
    _nothing_committed(tmp_path / "store")


@pytest.mark.parametrize("stage, field, value, expect", [
    ("grpo_train", "bogus_field", "1", "unknown field"),
    ("grpo_train", "beta", "-0.5", "Input should be greater than or equal to 0 (got -0.5)"),
    ("cold_start_sft", "learning_rate", "0", "Input should be greater than 0 (got 0)"),
])
def test_config_errors_name_yaml_path_and_line(tmp_path, stage, field, value, expect):
    path = tmp_path / "bad.yaml"
    path.write_text(f"# a config\nmodel: {{tiny: {{}}}}\n{stage}:\n  {field}: {value}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}:4: {stage}.{field}: {expect}"


def test_every_committed_config_parses():
    names = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
    assert {"tiny-cpu.yaml", "qwen2.5-0.5b-gsm8k.yaml", "qwen2.5-7b-math.yaml", "ci-tiny.yaml"} <= set(names)
    for name in names:
        cfg = load_config(ROOT / "configs" / name)
        assert cfg.grpo_train.reward_funcs and cfg.evaluate.reward_func


def test_cli_bad_config_is_one_line_and_commits_nothing(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model: {tiny: {}}\ngrpo_train:\n  num_generations: 1\n")
    result = CliRunner().invoke(app, ["run", "-c", str(path), "--store", str(tmp_path / "store"), "--run", "bad"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "grpo_train.sampling.num_generations" in lines[0]
    assert "Traceback" not in result.output
    assert not (tmp_path / "store" / "bad").exists()


def test_cli_unreachable_store_is_one_line(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    result = CliRunner().invoke(app, ["status", "x", "--store", "s3://r1-bucket/runs"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [result.output.strip()]
    assert "error: cannot reach S3 endpoint http://127.0.0.1:9" in result.output


REGISTERED = ("calc_accuracy, chain_accuracy, chain_format, code_execution, countdown_accuracy, format, language_consistency, "
              "math_accuracy, overlong_penalty, preference_rule (register your own with grpo_core.rewards.register_reward('name'))")


def test_unknown_reward_names_its_yaml_line_and_the_registered_names(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model: {tiny: {}}\ngrpo_train:\n  reward_funcs:\n    - chain_accuracy\n    - mth_accuracy\n"
                    "evaluate:\n  reward_func: acuracy\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (
        f"{path}:5: grpo_train.reward_funcs.1: unknown reward function 'mth_accuracy'; registered: {REGISTERED}; "
        f"{path}:7: evaluate.reward_func: unknown reward function 'acuracy'; registered: {REGISTERED}")


@pytest.mark.parametrize("section, field, value", [
    ("final_rl", "reward_funcs", ["chain_accuracy", "nope"]),
    ("rejection_sample", "reward_func", "nope"),
])
def test_unknown_reward_is_refused_however_the_config_arrives(section, field, value):
    """A deployment run validates the config it is given without the YAML loader: the check holds there too."""
    with pytest.raises(ValueError, match=rf"{section}\.{field}(\.1)?: unknown reward function 'nope'; registered: "):
        PipelineConfig.model_validate({"model": {"tiny": {}}, section: {field: value}})


@pytest.fixture
def no_pipeline(monkeypatch):
    """The CLI must refuse before it starts the pipeline (and Prefect); if it gets there, fail at once."""
    import flows.r1_pipeline

    def started(**_):
        raise AssertionError("the pipeline started")

    monkeypatch.setattr(flows.r1_pipeline, "r1_pipeline", started)


def test_cli_unknown_reward_fails_before_anything_runs(tmp_path, no_pipeline):
    path = tmp_path / "bad.yaml"
    path.write_text("model: {tiny: {}}\nfinal_rl:\n  reward_funcs: [chain_accuracy, chain_formt]\n")
    result = CliRunner().invoke(app, ["run", "-c", str(path), "--store", str(tmp_path / "store"), "--run", "bad"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"error: {path}:3: final_rl.reward_funcs.1: unknown reward function 'chain_formt'; registered: {REGISTERED}"]
    assert not (tmp_path / "store").exists()  # refused before the store was opened, let alone a stage


# ---- gold answers no reward can grade, and sources that repeat one prompt (issue 33, finding 6)

def _rows(path: Path, answers: list) -> Path:
    path.write_text("\n".join(json.dumps({"prompt": f"What is {i} + {i}?", "answer": a}) for i, a in enumerate(answers))
                    + "\n")
    return path


@pytest.mark.parametrize("bad, expect", [
    ("The total is #### ", "parses to an empty answer"),
    (["3", "4"], "is a JSON list, not one answer"),
    ("the red one is bigger", "reads as free text"),
])
def test_gold_answer_no_reward_can_grade_names_the_line_and_commits_nothing(tmp_path, bad, expect):
    src = _rows(tmp_path / "qa.jsonl", ["#### 2", "4", bad, "\\text{Evelyn}", "$\\frac{1}{2}$"])
    with pytest.raises(DataError) as err:
        prepare_data.fn(_data_config(src), "bad", str(tmp_path / "store"))
    msg = str(err.value)
    assert f"{src} line 3" in msg and "field 'answer'" in msg and expect in msg, msg
    _nothing_committed(tmp_path / "store")


def test_ungradable_gold_answers_can_be_skipped_and_counted(tmp_path):
    src = _rows(tmp_path / "qa.jsonl", ["#### 2", "#### ", ["1"], "4", "a sentence of plain words", "10", "12", "14"])
    ref = prepare_data.fn(_data_config(src, on_error="skip"), "skip", str(tmp_path / "store"))
    stats = ref.metrics
    assert stats["data/num_train"] + stats["data/num_eval"] == 5


def test_free_text_answers_are_fine_for_sources_that_are_not_math(tmp_path):
    src = _rows(tmp_path / "qa.jsonl", [f"answer number {i} in words" for i in range(6)])
    cfg = _data_config(src)
    cfg.data.train_sources[0].task = "trivia"
    ref = prepare_data.fn(cfg, "trivia", str(tmp_path / "store"))
    assert ref.metrics["data/num_train"] + ref.metrics["data/num_eval"] == 6


def test_deduplication_that_removes_most_rows_warns_with_counts(tmp_path, caplog):
    src = tmp_path / "qa.jsonl"
    src.write_text("\n".join(json.dumps({"prompt": "What is 2 + 2?", "answer": "4"}) for _ in range(80)) + "\n"
                   + "\n".join(json.dumps({"prompt": f"What is {i} + 1?", "answer": str(i + 1)}) for i in range(4)) + "\n")
    with caplog.at_level("WARNING", logger="grpo_core.recipe.prepare"):
        prepare_data.fn(_data_config(src), "dupes", str(tmp_path / "store"))
    warned = [r.getMessage() for r in caplog.records if "deduplication removed" in r.getMessage()]
    assert warned == ["deduplication removed 79 of 84 train rows (94%): the sources repeat prompts; 5 distinct "
                      "prompts are left"]
