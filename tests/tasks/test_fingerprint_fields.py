"""A stage's fingerprint holds the config it reads (issue 45): an option added to the code, with a default, keeps every
committed stage of a store; a local model folder counts by its content, so weights replaced in place are rebuilt."""

from __future__ import annotations

import json
import os
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel, create_model

from grpo_core.config import JudgeSpec, RewardModelSpec
from tasks.config.fingerprint_fields import MODEL_FOLDER_FIELDS, keyed_fields, model_folders
from tasks.config.pipeline import PipelineConfig, load_config
from tasks.config.stages import all_stages, get_stage
from tasks.runner.common import fingerprint
from tasks.storage import file_hashes
from tasks.storage.manifest import StageRef

ROOT = Path(__file__).resolve().parents[2]
CI_CONFIG = ROOT / "configs" / "ci-tiny.yaml"


def _with_new_option(value):
    """``value`` with every config model in it (itself, nested sections, list items) an instance of a subclass that
    has one more option, ``new_option`` with a default: what adding a field to each config class does."""
    if isinstance(value, list):
        return [_with_new_option(v) for v in value]
    if not isinstance(value, BaseModel):
        return value
    cls = create_model(f"{type(value).__name__}WithNewOption", __base__=type(value), new_option=(int, 7))
    fields = {n: _with_new_option(getattr(value, n)) for n in type(value).model_fields}
    return cls.model_construct(_fields_set=set(value.model_fields_set), **fields)


def _stage_fingerprints(config: PipelineConfig) -> dict[str, str]:
    """Each stage's fingerprint under ``config``, as its task computes it (section, model section, same parents)."""
    parent = {"p": StageRef(run="r", stage="p", version="v1", path="r/p/v1", fingerprint="f", created="t")}
    return {s.name: fingerprint(s.name, s.section_of(config), parent, {"model": config.model})
            for s in all_stages() if s.enabled(config)}


@pytest.mark.parametrize("config", [PipelineConfig(), load_config(CI_CONFIG)], ids=["default", "ci-tiny"])
def test_a_new_option_with_a_default_changes_no_stage_fingerprint(config):
    sections = {s.config_key: _with_new_option(s.section_of(config)) for s in all_stages() if s.enabled(config)}
    extended = config.model_copy(update={**sections, "model": _with_new_option(config.model)})
    assert extended.grpo_train.sampling.new_option == 7  # nested sections have it too
    assert _stage_fingerprints(extended) == _stage_fingerprints(config)
    # the option set away from its default is part of what the stage reads: a new fingerprint
    changed = extended.model_copy(update={"grpo_train": extended.grpo_train.model_copy(update={"new_option": 8})})
    assert _stage_fingerprints(changed)["grpo_train"] != _stage_fingerprints(config)["grpo_train"]


def _run_stages(config: PipelineConfig, store: str) -> dict[str, str]:
    """Every stage ``config`` runs, and the evaluation of each model, called as the pipeline calls them: the name
    of the state of each (``Cached`` for a reused output, else built)."""
    from tasks.stages.evaluate import evaluate

    refs, states = {}, {}
    for stage in [s for s in all_stages() if s.enabled(config)]:
        out = stage.task.fn(config, "r", store, {n: refs[n] for n in stage.inputs(config)})
        built = isinstance(out, StageRef)
        states[stage.name], refs[stage.name] = ("built", out) if built else (out.name, out.result())
        if stage.trains:
            ev = evaluate.fn(config, "r", store, refs[stage.name], {"prepare_data": refs["prepare_data"]})
            states[f"evaluate/{stage.name}"] = ev.name if not isinstance(ev, StageRef) else "built"
    return states


def test_a_store_keeps_every_committed_stage_when_an_option_is_added(tmp_path):
    config, store = load_config(CI_CONFIG), str(tmp_path / "store")
    assert set(_run_stages(config, store).values()) == {"built"}
    sections = {s.config_key: _with_new_option(s.section_of(config)) for s in all_stages() if s.enabled(config)}
    extended = config.model_copy(update={**sections, "model": _with_new_option(config.model),
                                         "evaluate": _with_new_option(config.evaluate)})
    states = _run_stages(extended, store)
    assert set(states.values()) == {"Cached"}, states


def test_a_value_written_at_its_default_is_the_default_and_a_tag_is_kept():
    config = load_config(CI_CONFIG)
    written = config.model_copy(update={"grpo_train": config.grpo_train.model_copy(update={"epsilon": 0.2})})
    assert type(config.grpo_train).model_fields["epsilon"].default == 0.2
    assert _stage_fingerprints(written) == _stage_fingerprints(config)
    # a reward model and a judge naming one model are two rewards: their type stays in the key
    assert keyed_fields(RewardModelSpec(model="m")) != keyed_fields(JudgeSpec(model="m"))


def test_every_field_named_like_a_model_is_a_model_folder_field():
    """A new field that names a model goes into MODEL_FOLDER_FIELDS, so its folder's content is fingerprinted."""
    seen, todo, missed = set(), [PipelineConfig], []
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        for name, info in cls.model_fields.items():
            todo += [t for t in _models_in(info.annotation)]
            names_a_model = name in ("model", "ensemble") or name.endswith(("name_or_path", "init_model"))
            if names_a_model and str in _leaf_types(info.annotation):
                listed = [f for c, fields in MODEL_FOLDER_FIELDS.items() if issubclass(cls, c) for f in fields]
                if name not in listed:
                    missed.append(f"{cls.__name__}.{name}")
    assert not missed, f"fields naming a model missing from MODEL_FOLDER_FIELDS: {missed}"


def _models_in(annotation) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _models_in(a)]


def _leaf_types(annotation) -> set:
    args = typing.get_args(annotation)
    return {annotation} if not args else {t for a in args for t in _leaf_types(a)}


# ------------------------------------------------------------------------------------------- model folders by content


def _model_folder(path: Path, weights: bytes) -> Path:
    (path / ".cache").mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (path / "model.safetensors").write_bytes(weights)
    (path / ".cache" / "download.metadata").write_text("a timestamp")  # hidden: not the model
    return path


def test_a_model_folder_counts_by_its_files_content(tmp_path):
    folder = _model_folder(tmp_path / "judge", b"w" * 1000)
    section = RewardModelSpec(model=str(folder))
    before = model_folders(section)
    assert set(before[str(folder)]) == {"config.json", "model.safetensors"}
    (folder / ".cache" / "download.metadata").write_text("another timestamp")
    assert model_folders(section) == before
    st = (folder / "model.safetensors").stat()
    (folder / "model.safetensors").write_bytes(b"v" * 1000)  # same size, mtime set back: the bytes tell
    os.utime(folder / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert model_folders(section) != before
    assert model_folders(RewardModelSpec(model=str(folder), url="http://judge:8000")) == {}  # served: a name
    assert model_folders(RewardModelSpec(model="org/hub-model")) == {}


def test_a_large_file_is_hashed_once_per_change_across_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("R1_HASH_CACHE", str(tmp_path / "hashes"))
    monkeypatch.setattr(file_hashes, "PERSIST_BYTES", 100)
    monkeypatch.setattr(file_hashes, "RACY_NS", 0)  # the file was written just now: remember it all the same
    monkeypatch.setattr(file_hashes, "_MEMO", {})
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"a" * 1000)
    reads = []
    real = file_hashes.sha256_file
    monkeypatch.setattr(file_hashes, "sha256_file", lambda p: reads.append(p) or real(p))
    first = file_hashes.file_sha256(weights)
    monkeypatch.setattr(file_hashes, "_MEMO", {})  # another process: only the hash cache remembers
    assert file_hashes.file_sha256(weights) == first and len(reads) == 1
    (tmp_path / "new").write_bytes(b"b" * 1000)
    os.replace(tmp_path / "new", weights)  # replaced (a new inode: no tick can hide it), read again
    monkeypatch.setattr(file_hashes, "_MEMO", {})
    assert file_hashes.file_sha256(weights) != first and len(reads) == 2


def test_a_file_changed_within_the_racy_window_is_read_every_time(tmp_path, monkeypatch):
    """File times tick coarsely: two writes within one tick leave one stat, so a file changed in the last RACY_NS is
    never remembered (as git treats its index's racy entries)."""
    monkeypatch.setattr(file_hashes, "_MEMO", {})
    fresh = tmp_path / "config.json"
    fresh.write_text("{}")
    reads = []
    real = file_hashes.sha256_file
    monkeypatch.setattr(file_hashes, "sha256_file", lambda p: reads.append(p) or real(p))
    file_hashes.file_sha256(fresh)
    file_hashes.file_sha256(fresh)
    assert len(reads) == 2
    monkeypatch.setattr(file_hashes, "RACY_NS", 0)
    file_hashes.file_sha256(fresh)
    file_hashes.file_sha256(fresh)
    assert len(reads) == 3  # older than the window: remembered


def test_replaced_base_model_weights_rerun_the_stage_and_unchanged_are_reused(tmp_path):
    """prepare_data keys the model section: a local base-model folder counts by its content (later stages read it
    through prepare_data's version, their parent)."""
    from tasks.config.pipeline import PipelineConfig as Config

    base = _model_folder(tmp_path / "base", b"w" * 1000)
    src = tmp_path / "qa.jsonl"
    src.write_text("".join(json.dumps({"prompt": f"what is {i} plus {i}?", "answer": str(2 * i)}) + "\n"
                           for i in range(8)))
    config = Config.model_validate({"model": {"name_or_path": str(base)}, "data": {
        "builtin_task": None, "train_sources": [{"path": str(src)}], "eval_fraction": 0.3, "decontaminate": False}})
    prepare_data, store = get_stage("prepare_data").task, str(tmp_path / "store")
    first = prepare_data.fn(config, "r", store)
    assert isinstance(first, StageRef)
    again = prepare_data.fn(config, "r", store)
    assert getattr(again, "name", None) == "Cached" and again.result().uri == first.uri  # unchanged: reused
    st = (base / "model.safetensors").stat()
    (base / "model.safetensors").write_bytes(b"v" * 1000)  # new weights in place: same name, size and mtime
    os.utime(base / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns))
    second = prepare_data.fn(config, "r", store)
    assert isinstance(second, StageRef) and second.uri != first.uri
