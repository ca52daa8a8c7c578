"""Load-time config checks (issue 33, finding 7): what PyYAML or pydantic let through, or caught only once a
stage had started, is refused by ``load_config`` with the file and YAML line."""

from __future__ import annotations

import json

import pytest

from tasks.config.pipeline import ConfigError, load_config


def _load(tmp_path, text: str):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path, lambda: load_config(path)


def test_duplicate_key_names_both_lines(tmp_path):
    path, load = _load(tmp_path, "model: {tiny: {}}\ngrpo_train:\n  beta: 0.04\n  learning_rate: 1.0e-5\n"
                                 "  beta: 0.4\n")
    with pytest.raises(ConfigError) as err:
        load()
    msg = str(err.value)
    assert msg.startswith(f"{path}:5:3: ") and "duplicate key 'beta'" in msg
    assert "first at line 3, again at line 5" in msg


def test_duplicate_section_names_both_lines(tmp_path):
    path, load = _load(tmp_path, "model: {tiny: {}}\ngrpo_train: {beta: 0.1}\nevaluate: {}\ngrpo_train: {beta: 0.2}\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'grpo_train' \(first at line 2, again at line 4\)"):
        load()


def test_merge_keys_may_still_be_overridden(tmp_path):
    _, load = _load(tmp_path, "model: {tiny: {}}\nx-rl: &rl {beta: 0.1, learning_rate: 1.0e-5}\n"
                              "grpo_train: {<<: *rl, beta: 0.2}\n")
    with pytest.raises(ConfigError, match="x-rl: unknown field"):  # past the YAML reader: the merge was accepted
        load()


def test_tab_names_line_column_and_what_is_wrong(tmp_path):
    path, load = _load(tmp_path, "model: {tiny: {}}\ngrpo_train:\n\tbeta: 0.04\n")
    with pytest.raises(ConfigError) as err:
        load()
    msg = str(err.value)
    assert msg.startswith(f"{path}:3:1: not valid YAML: ") and "'\\t'" in msg and "not tabs" in msg


def test_syntax_error_names_line_and_column(tmp_path):
    path, load = _load(tmp_path, "model: {tiny: {}}\ngrpo_train:\n  beta: [0.04\n  learning_rate: 1\n")
    with pytest.raises(ConfigError) as err:
        load()
    assert str(err.value).startswith(f"{path}:4:")  # where the parser found the unclosed list


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n# and another\n"])
def test_empty_config_is_an_error_not_the_defaults(tmp_path, text):
    path, load = _load(tmp_path, text)
    with pytest.raises(ConfigError, match=rf"^{path}: the config file is empty"):
        load()


def test_hidden_size_not_divisible_by_num_heads_names_the_line(tmp_path):
    path, load = _load(tmp_path, "model:\n  tiny:\n    hidden_size: 30\n    num_heads: 4\n")
    with pytest.raises(ConfigError) as err:
        load()
    assert str(err.value).startswith(f"{path}:4: model.tiny.num_heads: ")
    assert "hidden_size (30) must be divisible by num_heads (4)" in str(err.value)


def test_default_num_heads_is_checked_too(tmp_path):
    path, load = _load(tmp_path, "model:\n  tiny:\n    hidden_size: 30\n")
    with pytest.raises(ConfigError, match=rf"^{path}:2: model.tiny.num_heads: .*\(30\).*\(4\)"):
        load()


TINY_128 = "model:\n  tiny: {hidden_size: 16, num_layers: 1, num_heads: 2, max_position_embeddings: 128}\n"


@pytest.mark.parametrize("section, body, line, expect", [
    ("evaluate", "  max_new_tokens: 500\n", 4, "sampling.max_completion_length (500)"),
    ("grpo_train", "  sampling:\n    max_prompt_length: 100\n    max_completion_length: 200\n", 6,
     "sampling.max_completion_length (200)"),
    ("rejection_sample", "  max_prompt_length: 120\n  max_new_tokens: 140\n", 5,
     "sampling.max_completion_length (140)"),
])
def test_lengths_past_the_tiny_models_positions_name_the_line(tmp_path, section, body, line, expect):
    path, load = _load(tmp_path, TINY_128 + f"{section}:\n{body}")
    with pytest.raises(ConfigError) as err:
        load()
    msg = str(err.value)
    assert msg.startswith(f"{path}:{line}: {section}.sampling.max_completion_length: "), msg
    assert expect in msg and "model.tiny.max_position_embeddings (128)" in msg


def test_lengths_within_the_positions_load(tmp_path):
    _, load = _load(tmp_path, TINY_128 + "evaluate:\n  max_prompt_length: 64\n  max_new_tokens: 64\n")
    assert load().evaluate.sampling.max_completion_length == 64


def test_real_model_positions_from_a_local_config_json(tmp_path):
    model = tmp_path / "base"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
    path, load = _load(tmp_path, f"model:\n  name_or_path: {model}\nevaluate:\n  max_new_tokens: 300\n")
    with pytest.raises(ConfigError, match=rf"^{path}:4: evaluate.sampling.max_completion_length: .*\(300\).*{model}/config.json"):
        load()
    (model / "config.json").write_text("{not json")  # unreadable: no check, the stage finds out
    assert load().evaluate.sampling.max_completion_length == 300


# ---- relative data paths (issue 33, finding 6): read from the config file's folder, not the working folder

def _config_with_source(folder, path: str):
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "run.yaml"
    config.write_text("model: {tiny: {}}\ndata:\n  train_sources:\n"
                      f"    - {{path: {path}, field_map: {{prompt: question, answer: answer}}}}\n")
    return config


def test_relative_data_path_is_read_beside_the_config_file(tmp_path, monkeypatch):
    configs = tmp_path / "proj" / "configs"
    (configs / "data").mkdir(parents=True)
    (configs / "data" / "train.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    config = _config_with_source(configs, "data/train.jsonl")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "data").mkdir()
    (elsewhere / "data" / "train.jsonl").write_text("not the one\n")  # the working folder's file of that name
    monkeypatch.chdir(elsewhere)
    loaded = load_config(config)
    assert loaded.data.train_sources[0].path == str((configs / "data" / "train.jsonl").resolve())


def test_missing_data_file_is_named_as_a_file_not_a_hub_dataset(tmp_path, monkeypatch):
    from grpo_core.recipe.prepare import prepare_datasets
    from grpo_core.data.rows import DataError

    config = _config_with_source(tmp_path / "configs", "data/train.jsonl")  # beside neither the YAML nor the cwd
    monkeypatch.chdir(tmp_path)
    loaded = load_config(config)
    assert loaded.data.train_sources[0].path == "data/train.jsonl"  # left as written (a worker may hold it)
    with pytest.raises(DataError) as err:
        prepare_datasets(loaded.data)
    msg = str(err.value)
    assert msg.startswith("data/train.jsonl: no such file or folder") and "cannot load dataset" not in msg
    assert str(tmp_path / "data" / "train.jsonl") in msg and "config file's folder" in msg


def test_hub_names_stay_hub_names(tmp_path):
    config = _config_with_source(tmp_path, "openai/gsm8k")
    assert load_config(config).data.train_sources[0].path == "openai/gsm8k"
