"""The short road: ``python -m grpo_core.train CONFIG.yaml`` trains a model from one YAML, no Prefect, no store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpo_core.models.tiny import build_tiny_model
from grpo_core.train import main

ROOT = Path(__file__).resolve().parents[2]


def write_config(tmp_path: Path, **overrides) -> Path:
    rows = [{"question": f"{i}+{i}=", "answer": str(2 * i)} for i in range(8)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {
        "model": str(tmp_path / "tiny"),
        "train_file": str(tmp_path / "train.jsonl"),
        "output_dir": str(tmp_path / "run"),
        "data": {"field_map": {"prompt": "question", "answer": "answer"}},
        "grpo": {"max_steps": 2, "use_vllm": False, "generation_batch_size": 8, "num_generations": 4,
                 "max_completion_length": 8, "max_prompt_length": 32, "per_device_train_batch_size": 8,
                 "beta": 0.0, "reward_funcs": ["math_accuracy", "format"], "report_to": ["jsonl"],
                 "torch_num_threads": 1},
    }
    config.update(overrides)
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_short_road_trains_a_model_that_loads(tmp_path):
    build_tiny_model(tmp_path / "tiny", hidden_size=32, num_layers=2, num_heads=2)
    config = write_config(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "grpo_core.train", str(config)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trained 2 steps" in proc.stdout
    assert "prefect" not in proc.stderr.lower()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final")
    assert model.config.num_hidden_layers == 2


@pytest.mark.parametrize("overrides, field", [
    ({"grpo": {"beta": -1.0}}, "grpo.beta"),
    ({"grpo": {"not_a_field": 1}}, "grpo.not_a_field"),
    ({"data": {"answer_format": "roman"}}, "data.answer_format"),
    ({"data": {"path": "x.jsonl"}}, "data.path"),
    ({"modle": "x"}, "modle"),
    ({"model": "/no/such/model"}, "model"),
    ({"train_file": "/no/such/rows.jsonl"}, "train_file"),
])
def test_a_bad_field_is_named_before_any_model_loads(tmp_path, capsys, overrides, field):
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text("{}")  # enough to pass the folder check: nothing loads
    config = write_config(tmp_path, **overrides)
    assert main([str(config)]) == 2
    err = capsys.readouterr().err
    assert f"{config}: {field}" in err, err
    assert not (tmp_path / "run").exists()
