"""Trust the store: committed files are checked against their manifests before use, a store works wherever
it is copied or moved to, and a damaged manifest hides only its own version.

One small run (configs/ci-tiny.yaml: prepare_data, then cold_start_sft) is made once per module; each
test works on its own copy of that store.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.report import write_report
from tasks.config.pipeline import PipelineConfig, load_config
from tasks.config.stages import get_stage
from tasks.runner.common import StageFailed
from tasks.storage.manifest import StageRef
from tasks.storage.store import MANIFEST, IntegrityError, Store

ROOT = Path(__file__).resolve().parents[2]
RUN = "r"
cold_start_sft, grpo_train = get_stage("cold_start_sft").task, get_stage("grpo_train").task


@pytest.fixture(scope="module")
def config() -> PipelineConfig:
    return load_config(ROOT / "configs" / "ci-tiny.yaml")


@pytest.fixture(scope="module")
def template(tmp_path_factory, config) -> Path:
    """A store holding committed prepare_data and cold_start_sft outputs of run ``r``."""
    prepare_data = get_stage("prepare_data").task

    root = tmp_path_factory.mktemp("template") / "store"
    data = prepare_data.fn(config, RUN, str(root))
    cold_start_sft.fn(config, RUN, str(root), {"prepare_data": data})
    return root


@pytest.fixture
def store_dir(template, tmp_path) -> Path:
    root = tmp_path / "store"
    shutil.copytree(template, root)
    return root


def _inputs(root: Path) -> dict[str, StageRef]:
    store = Store(root)
    return {"prepare_data": store.latest(RUN, "prepare_data"), "cold_start_sft": store.latest(RUN, "cold_start_sft")}


def _file(root: Path, stage: str, name: str) -> tuple[Path, dict]:
    ref = Store(root).latest(RUN, stage)
    return root / ref.path / name, Store(root).manifest(ref)["files"][name]


def _flip_middle_byte(path: Path) -> None:
    """A same-size overwrite: one byte in the middle changes."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``root``: sha256 and mtime (byte-identical and untouched)."""
    return {p.relative_to(root).as_posix(): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("stage, name, damage", [
    ("cold_start_sft", "model/model.safetensors", "same size"),
    ("prepare_data", "train.parquet", "same size"),
    ("prepare_data", "train.parquet", "truncated"),
])
def test_tampered_upstream_file_fails_the_next_stage_and_commits_nothing(store_dir, config, stage, name, damage):
    path, expected = _file(store_dir, stage, name)
    if damage == "same size":
        _flip_middle_byte(path)
    else:
        path.write_bytes(path.read_bytes()[:-10])
    actual = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(StageFailed) as err:
        grpo_train.fn(config, RUN, str(store_dir), _inputs(store_dir))
    msg = str(err.value)
    assert str(path) in msg and f"r1 stage {stage} --run {RUN}" in msg and f"--from-stage {stage}" in msg
    if damage == "same size":
        assert f"sha256 {actual}, manifest says {expected['sha256']}" in msg
    else:
        assert f"size {expected['size'] - 10} bytes, manifest says {expected['size']}" in msg
    store = Store(store_dir)
    assert store.latest(RUN, "grpo_train") is None and store.uncommitted(RUN, "grpo_train") == []


def test_a_file_verified_once_is_not_hashed_again_but_a_later_change_is_caught(store_dir, monkeypatch):
    store = Store(store_dir)
    ref = store.latest(RUN, "cold_start_sft")
    store.get_output(ref, "model", store_dir.parent / "a")
    hashed = []
    real = Store._stream_hashed
    monkeypatch.setattr(Store, "_stream_hashed",
                        lambda self, rpath, dest, *rest: hashed.append(rpath) or real(self, rpath, dest, *rest))
    out = store.get_output(ref, "model", store_dir.parent / "b")  # same bytes, same identity: copied, not hashed
    weights = store_dir / ref.path / "model" / "model.safetensors"
    assert hashed == [] and (out / "model.safetensors").read_bytes() == weights.read_bytes()
    _flip_middle_byte(weights)
    with pytest.raises(IntegrityError, match="model.safetensors does not match its manifest"):
        store.get_output(ref, "model", store_dir.parent / "c")
    assert any(p.endswith("model/model.safetensors") for p in hashed)


def test_history_and_checkpoints_are_checked_too(store_dir, tmp_path):
    from tasks.runner.training import read_history

    store = Store(store_dir)
    ref = store.latest(RUN, "cold_start_sft")
    assert [h["step"] for h in read_history(store, ref)] == [1, 2, 3, 4]
    (store_dir / ref.path / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(IntegrityError, match="metrics.jsonl does not match its manifest.*r1 stage cold_start_sft"):
        read_history(store, ref)

    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "state.pt").write_bytes(b"0123456789")
    store.put_checkpoint(RUN, "grpo_train", "key", 2, ck)
    step, uri = store.latest_checkpoint(RUN, "grpo_train", "key")
    (Path(uri) / "state.pt").write_bytes(b"0123456780")
    fix = f"delete {uri} to resume from the checkpoint before it.*r1 stage grpo_train --run {RUN}"
    with pytest.raises(IntegrityError, match=f"state.pt does not match its manifest.*{fix}"):
        store.get_checkpoint(uri, tmp_path / "resume")


def test_copied_store_reruns_a_stage_from_the_copy_and_leaves_the_original_untouched(store_dir, config, tmp_path):
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(store_dir, copy)
    before = _snapshot(store_dir)
    original = Store(store_dir).latest(RUN, "prepare_data")  # a ref read from the original ...
    # ... is resolved in the store the task opens: the copy
    ref = cold_start_sft.fn(config, RUN, str(copy), {"prepare_data": original}, force=True)
    assert ref.uri.startswith(str(copy)) and (copy / ref.path / MANIFEST).is_file()
    manifest = json.loads((copy / ref.path / MANIFEST).read_text())
    assert manifest["path"] == ref.path and str(tmp_path) not in json.dumps(manifest["parents"])
    assert len([p for p in (copy / RUN / "cold_start_sft").iterdir() if not p.name.startswith("_")]) == 2
    write_report(Store(copy), RUN)
    assert (copy / RUN / "_report" / "report.md").is_file()
    assert _snapshot(store_dir) == before
    for p in copy.rglob("*"):  # nothing persisted in the copy names where either store is
        assert not p.is_file() or str(tmp_path).encode() not in p.read_bytes(), p


def test_moved_store_still_works(store_dir, config, tmp_path):
    inputs = {"prepare_data": Store(store_dir).latest(RUN, "prepare_data")}  # resolved where it was read ...
    moved = tmp_path / "moved"
    shutil.move(store_dir, moved)
    assert not store_dir.exists()  # ... which is gone: a task resolves it in the store it opens
    # same config, same upstream versions: the committed output is found there (fingerprints are relative)
    state = cold_start_sft.fn(config, RUN, str(moved), inputs)
    assert state.name == "Cached" and state.result().uri.startswith(str(moved))
    ref = cold_start_sft.fn(config, RUN, str(moved), inputs, force=True)  # and a rerun reads from it
    assert Store(moved).latest(RUN, "cold_start_sft") == ref and not store_dir.exists()


def test_damaged_manifest_hides_only_its_version(store_dir, caplog):
    store = Store(store_dir)
    good = store.latest(RUN, "cold_start_sft")
    newer = store_dir / RUN / "cold_start_sft" / "99991231T000000000000Z-ffffff"  # sorts after the good one
    shutil.copytree(store_dir / good.path, newer)
    (newer / MANIFEST).write_text((newer / MANIFEST).read_text()[:100])  # truncated
    data = store.latest(RUN, "prepare_data")
    manifest = store_dir / data.path / MANIFEST
    manifest.write_bytes(b"\x00\xff" + manifest.read_bytes()[:7])  # garbage, not even UTF-8
    with caplog.at_level(logging.WARNING, logger="r1.store"):
        assert store.latest(RUN, "cold_start_sft") == good
        assert store.latest(RUN, "prepare_data") is None
    assert str(newer / MANIFEST) in caplog.text and str(manifest) in caplog.text
    assert store.uncommitted(RUN, "cold_start_sft") == [newer.name]

    result = CliRunner().invoke(app, ["status", RUN, "--store", str(store_dir)])
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line.split()[1] for line in result.output.splitlines()[1:] if line.strip()}
    assert lines["prepare_data"] == "incomplete" and lines["cold_start_sft"] == "completed"
    assert lines["grpo_train"] == "pending"


def test_manifest_with_absolute_uris_is_refused_clearly(store_dir, caplog):
    store = Store(store_dir)
    ref = store.latest(RUN, "cold_start_sft")
    path = store_dir / ref.path / MANIFEST
    old = json.loads(path.read_text())
    old.pop("path")
    old.update(schema=1, uri=str(store_dir / ref.path))
    path.write_text(json.dumps(old))
    with caplog.at_level(logging.WARNING, logger="r1.store"):
        assert store.latest(RUN, "cold_start_sft") is None
    assert "absolute URIs" in caplog.text
    with pytest.raises(IntegrityError, match="absolute URIs.*r1 stage cold_start_sft"):
        store.manifest(ref)
    with pytest.raises(Exception, match="no store-relative path"):
        StageRef.from_dict({k: v for k, v in ref.to_dict().items() if k != "path"})


def test_store_synced_to_s3_is_verified_there(store_dir, s3_env, tmp_path):
    store = Store(s3_env)
    store.fs.put(str(store_dir) + "/", store.root, recursive=True)  # a sync of the local folder
    ref = store.latest(RUN, "cold_start_sft")
    assert ref is not None and ref.uri.startswith(s3_env)
    out = store.get_output(ref, "model", tmp_path / "ok")
    local = store_dir / ref.path / "model" / "model.safetensors"
    assert (out / "model.safetensors").read_bytes() == local.read_bytes()
    _flip_middle_byte(local)
    store.fs.put_file(str(local), store.path(ref.path, "model", "model.safetensors"))  # same size, new ETag
    with pytest.raises(IntegrityError, match="model.safetensors does not match its manifest"):
        store.get_output(ref, "model", tmp_path / "bad")


def test_manifest_naming_a_file_outside_its_output_is_refused(store_dir, tmp_path):
    store = Store(store_dir)
    ref = store.latest(RUN, "cold_start_sft")
    path = store_dir / ref.path / MANIFEST
    m = json.loads(path.read_text())
    m["files"]["model/../../../../escaped"] = m["files"]["model/model.safetensors"]
    path.write_text(json.dumps(m))
    with pytest.raises(IntegrityError, match="outside the output"):
        store.get_output(ref, "model", tmp_path / "in" / "model")
    assert not list(tmp_path.rglob("escaped"))
