"""prepare_data's fingerprint holds what its data files hold (issue 33, finding 4): a file edited in place, same
run and config, is a new output; an unchanged file is reused."""

from __future__ import annotations

import json
import os
from pathlib import Path

from grpo_core.data.rows import read_parquet
from tasks.config.pipeline import PipelineConfig
from tasks.config.stages import get_stage
from tasks.storage.data_inputs import cached_revision, data_inputs
from tasks.storage.manifest import StageRef
from tasks.storage.store import Store

prepare_data = get_stage("prepare_data").task


def _config(train: Path, eval_dir: Path | None = None) -> PipelineConfig:
    data = {"builtin_task": None, "train_sources": [{"path": str(train)}], "eval_fraction": 0.3, "decontaminate": False}
    if eval_dir is not None:
        data["eval_sources"] = [{"path": str(eval_dir)}]
    return PipelineConfig.model_validate({"model": {"tiny": {"hidden_size": 16, "num_layers": 1, "num_heads": 2}},
                                          "data": data})


def _write(path: Path, answer: int) -> None:
    path.write_text("".join(json.dumps({"prompt": f"what is {i} plus {i}?", "answer": str(2 * i + answer)}) + "\n"
                            for i in range(8)))


def _built(result) -> StageRef:
    """A built output (a StageRef); a reused one comes back as a Prefect ``Cached`` state instead."""
    assert isinstance(result, StageRef), f"prepare_data reused its committed output: {result}"
    return result


def test_edited_train_file_reruns_prepare_data_and_unchanged_is_reused(tmp_path):
    src, store = tmp_path / "qa.jsonl", str(tmp_path / "store")
    _write(src, 0)
    first = _built(prepare_data.fn(_config(src), "r", store))
    again = prepare_data.fn(_config(src), "r", store)
    assert getattr(again, "name", None) == "Cached" and again.result().uri == first.uri  # unchanged: reused

    mtime = src.stat().st_mtime_ns
    _write(src, 1)  # every answer changed, same size and config: the content tells (the hash)
    os.utime(src, ns=(mtime + 10**9, mtime + 10**9))  # as an editor leaves it (a coarse clock could repeat mtime)
    second = _built(prepare_data.fn(_config(src), "r", store))
    assert second.uri != first.uri
    rows = read_parquet(Store(store).get_output(second, "train.parquet", tmp_path / "got" / "train.parquet"))
    assert rows and all(int(r["answer"]) % 2 == 1 for r in rows)  # the edited answers, not the old ones


def test_a_data_folder_counts_every_file_in_it(tmp_path):
    src, folder = tmp_path / "qa.jsonl", tmp_path / "eval"
    _write(src, 0)
    folder.mkdir()
    (folder / "a.jsonl").write_text(json.dumps({"prompt": "what is 9 plus 9?", "answer": "18"}) + "\n")
    before = data_inputs(_config(src, folder).data)
    assert set(before) == {"data.train_sources.0", "data.eval_sources.0"}
    (folder / "b.jsonl").write_text(json.dumps({"prompt": "what is 7 plus 7?", "answer": "14"}) + "\n")
    after = data_inputs(_config(src, folder).data)
    assert after["data.train_sources.0"] == before["data.train_sources.0"]
    assert sorted(after["data.eval_sources.0"]["files"]) == ["a.jsonl", "b.jsonl"] != sorted(before["data.eval_sources.0"]["files"])


def test_builtin_data_keys_how_its_held_out_problems_are_kept_apart():
    """Issue 42 changed the built-in tasks' splits (held out by canonical problem, not by prompt string): a store's
    prepare_data made before rebuilds once, not reused with held-out problems in its training rows."""
    from tasks.storage.data_inputs import BUILTIN_HELD_OUT

    assert data_inputs(PipelineConfig().data) == {"data.builtin_held_out": BUILTIN_HELD_OUT}
    from grpo_core.config import DataConfig

    assert data_inputs(DataConfig(builtin_task=None, countdown={})) == {"data.builtin_held_out": BUILTIN_HELD_OUT}


def test_hub_dataset_counts_its_cached_revision(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    assert cached_revision("org/some-set") is None  # never loaded here: the name only
    ref = tmp_path / "hub" / "datasets--org--some-set" / "refs" / "main"
    ref.parent.mkdir(parents=True)
    ref.write_text("abc123\n")
    assert cached_revision("org/some-set") == "abc123"
