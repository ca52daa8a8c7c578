"""A data error inside the running pipeline ends ``r1 run`` with one error line and no committed output."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from flows.cli import app
from tasks.config import DEFAULT_CONFIG
from tasks.store import Store


def test_embedded_default_is_tiny_cpu():
    assert DEFAULT_CONFIG.name == "tiny-cpu.yaml" and DEFAULT_CONFIG.is_file()


def test_missing_answer_column_fails_the_run_in_one_line(tmp_path):
    data = tmp_path / "qa.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"{i}+1=", "answer": str(i + 1)}) for i in range(5)) + "\n")
    cfg = tmp_path / "bad-data.yaml"
    cfg.write_text("model: {tiny: {hidden_size: 16, num_layers: 1, num_heads: 2}}\n"
                   f"data: {{builtin_task: null, train_sources: [{{path: '{data}'}}]}}\n")
    result = CliRunner().invoke(app, ["run", "-c", str(cfg), "--run", "bad", "--store", str(tmp_path / "store")])
    assert result.exit_code == 1
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("error: DataError: ") and str(data) in last and "'prompt'" in last
    store = Store(tmp_path / "store")
    assert store.latest("bad", "prepare_data") is None and store.uncommitted("bad", "prepare_data") == []
