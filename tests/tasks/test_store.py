"""The object store: manifest-last commits, uncommitted output ignored, checkpoints, S3 through moto, errors."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from tasks.storage.manifest import StageRef
from tasks.storage.store import MANIFEST, Store, StoreError, StoreStalled


def _files(root: Path) -> Path:
    (root / "model").mkdir(parents=True)
    (root / "model" / "weights.bin").write_bytes(b"\x00\x01" * 5000)
    (root / "train.parquet").write_bytes(b"rows")
    return root


def _commit(store: Store, src: Path, run: str = "r", stage: str = "prepare_data", fp: str = "fp1"):
    w = store.begin(run, stage)
    w.put_dir(src)
    return w, w.commit(fingerprint=fp, config={"x": 1}, parents={}, metrics={"m": 0.5})


def _roundtrip(store: Store, tmp_path: Path) -> None:
    src = _files(tmp_path / "src")
    w = store.begin("r", "prepare_data")
    w.put_dir(src)
    assert store.latest("r", "prepare_data") is None  # files written, manifest not yet: invisible
    ref = w.commit(fingerprint="fp1", config={"data": {"n": 1}}, parents={}, metrics={"data/num_train": 3})
    assert store.latest("r", "prepare_data") == ref
    assert store.latest("r", "prepare_data", fingerprint="other") is None
    manifest = store.manifest(ref)
    weights = (src / "model" / "weights.bin").read_bytes()
    assert manifest["files"]["model/weights.bin"] == {"sha256": hashlib.sha256(weights).hexdigest(), "size": 10000}
    assert manifest["config"] == {"data": {"n": 1}} and manifest["metrics"] == {"data/num_train": 3}
    assert "torch" in manifest["packages"] and manifest["created"].endswith("Z")
    out = store.get_output(ref, "model", tmp_path / "dl")  # checked against the manifest
    assert (out / "weights.bin").read_bytes() == weights
    # JSON-serialisable reference; what is persisted is store-relative
    assert StageRef.from_dict(json.loads(json.dumps(ref.to_dict()))) == ref
    assert manifest["path"] == ref.path == f"r/prepare_data/{ref.version}" and "uri" not in manifest
    assert ref.uri == store.uri_of(ref.path)

    # checkpoints: one without its completion marker is never resumed from
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "state.pt").write_bytes(b"s")
    store.put_checkpoint("r", "grpo_train", "key", 2, ck)
    store.put_file(ck / "state.pt", store.path("r", "grpo_train", "_checkpoints", "key", "checkpoint-4", "state.pt"))
    assert store.latest_checkpoint("r", "grpo_train", "key")[0] == 2
    store.put_checkpoint("r", "grpo_train", "key", 6, ck)
    store.prune_checkpoints("r", "grpo_train", "key", keep=1)
    step, uri = store.latest_checkpoint("r", "grpo_train", "key")
    assert step == 6 and (store.get_checkpoint(uri, tmp_path / "ck6") / "state.pt").read_bytes() == b"s"
    assert not store.exists(store.path("r", "grpo_train", "_checkpoints", "key", "checkpoint-2"))


def test_local_store_commit_and_checkpoints(tmp_path):
    _roundtrip(Store(tmp_path / "store"), tmp_path)


def test_s3_store_through_moto(s3_env, tmp_path):
    store = Store(s3_env)
    _roundtrip(store, tmp_path)
    assert store.runs() == ["r"]
    text = json.dumps(store.manifest(store.latest("r", "prepare_data")))
    assert "testing-secret-never-logged" not in text and "AWS_" not in text


def test_uncommitted_and_aborted_output_is_ignored(tmp_path):
    store = Store(tmp_path / "store")
    _, first = _commit(store, _files(tmp_path / "a"))
    dead = store.begin("r", "prepare_data")  # a writer that died after uploading, before its manifest
    dead.put_dir(tmp_path / "a")
    assert store.latest("r", "prepare_data") == first
    assert store.uncommitted("r", "prepare_data") == [dead.version]
    aborted = store.begin("r", "prepare_data")
    aborted.put_dir(tmp_path / "a")
    aborted.abort()
    assert not (tmp_path / "store" / "r" / "prepare_data" / aborted.version).exists()
    time.sleep(0.01)
    _, second = _commit(store, tmp_path / "a", fp="fp2")
    assert store.latest("r", "prepare_data") == second  # newest committed wins
    assert store.latest("r", "prepare_data", fingerprint="fp1") == first
    assert (tmp_path / "store" / "r" / "prepare_data" / second.version / MANIFEST).exists()


def test_unreachable_s3_endpoint_fails_fast_naming_it(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "supersecret-value")
    start = time.monotonic()
    with pytest.raises(StoreError) as err:
        Store("s3://some-bucket/prefix")
    assert time.monotonic() - start < 30
    msg = str(err.value)
    assert "cannot reach S3 endpoint http://127.0.0.1:9" in msg and "s3://some-bucket/prefix" in msg
    assert "supersecret" not in msg and "\n" not in msg


def _within(seconds: float, fn):
    """``fn()``'s result or exception, failing the test (not hanging it) if it takes longer than ``seconds``."""
    import threading

    out: dict = {}

    def call():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"still waiting after {seconds} s")
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_s3_endpoint_that_never_answers_fails_within_the_timeouts(black_hole, monkeypatch):
    url, accepted = black_hole
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "supersecret-value")
    monkeypatch.setenv("R1_S3_CONNECT_TIMEOUT", "2")
    monkeypatch.setenv("R1_S3_READ_TIMEOUT", "2")
    start = time.monotonic()
    with pytest.raises(StoreError) as err:
        _within(30, lambda: Store("s3://some-bucket/prefix"))
    assert time.monotonic() - start < 15 and len(accepted) == 1  # the check tries once
    msg = str(err.value)
    assert msg == (f"cannot reach S3 endpoint {url} for s3://some-bucket/prefix while opening the store: no answer "
                   "within 2 s (R1_S3_READ_TIMEOUT, the limit on one store operation); check AWS_ENDPOINT_URL_S3 and "
                   "the network")
    # later calls are bounded as a whole too: botocore's attempts and s3fs's tries no longer multiply the limit
    store = Store("s3://some-bucket/prefix", check=False)
    start = time.monotonic()
    with pytest.raises(StoreStalled, match="while checking .*: no answer within 2 s"):
        _within(30, lambda: store.exists(store.path("r", "x")))
    assert time.monotonic() - start < 12  # one 2 s limit with room for a slow machine; multiplied it is ~30 s


def test_a_stalled_s3_endpoint_fails_every_operation_within_twice_the_timeout(own_s3_server, tmp_path, monkeypatch):
    """SIGSTOP the moto server mid-run (it still accepts connections, as a hung endpoint does): every kind of
    store operation fails within 2 x R1_S3_READ_TIMEOUT, whatever botocore and s3fs retry inside it."""
    import signal

    import boto3

    url, proc = own_s3_server
    for name, value in (("AWS_ENDPOINT_URL_S3", url), ("AWS_ACCESS_KEY_ID", "testing"),
                        ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_DEFAULT_REGION", "us-east-1"),
                        ("R1_S3_READ_TIMEOUT", "1.5")):
        monkeypatch.setenv(name, value)
    boto3.client("s3", endpoint_url=url).create_bucket(Bucket="stalls")
    monkeypatch.setenv("R1_S3_READ_TIMEOUT", "30")  # the healthy setup, unhurried on a busy machine
    healthy = Store("s3://stalls/runs")
    ref = _commit(healthy, _files(tmp_path / "src"))[1]  # healthy: all of this works
    listed = healthy.manifest(ref)["files"]["model/weights.bin"]
    weights = healthy.path(ref.path, "model", "weights.bin")
    local = tmp_path / "up.bin"
    local.write_bytes(b"x" * 1000)
    # every call from here on has 1.5 s; none is made before the endpoint hangs (a busy machine may need more)
    monkeypatch.setenv("R1_S3_READ_TIMEOUT", "1.5")
    store = Store("s3://stalls/runs", check=False)
    proc.send_signal(signal.SIGSTOP)
    operations = {
        "opening the store": lambda: Store("s3://stalls/runs"),
        "reading": lambda: store.read_run_file("r", "config.json"),
        # a run file's commit reads what it replaces first (to put it back if the run is lost meanwhile)
        "reading stalls/runs/r/_run/config.json": lambda: store.write_run_file("r", "config.json", {"a": 1}),
        "writing": lambda: store.write_json(store.path("r", "x.json"), {"a": 1}),
        "listing": lambda: store.runs(),
        "uploading up.bin": lambda: store.put_file(local, store.path("r", "x", "up.bin")),
        "reading stalls/runs/r/prepare_data": lambda: store.get_output(ref, "model", tmp_path / "dl"),
        f"downloading s3://{weights}": lambda: store._get_verified(weights, tmp_path / "w.bin", listed, "rerun"),
    }
    for action, op in operations.items():
        start = time.monotonic()
        with pytest.raises(StoreStalled) as err:
            _within(60, op)
        took = time.monotonic() - start
        assert took < 3, f"{action} took {took:.1f} s"  # 2 x R1_S3_READ_TIMEOUT
        msg = str(err.value)
        assert msg.startswith(f"cannot reach S3 endpoint {url} for s3://stalls/runs while {action}"), msg
        assert "no answer within 1.5 s (R1_S3_READ_TIMEOUT" in msg


@pytest.mark.parametrize("name, value", [("R1_S3_READ_TIMEOUT", "soon"), ("R1_S3_CONNECT_TIMEOUT", "0"),
                                         ("R1_S3_MAX_ATTEMPTS", "-1")])
def test_bad_s3_timeout_settings_are_refused_naming_the_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(StoreError, match=f"^{name}='{value}' is not a number >= "):
        Store("s3://some-bucket/prefix", check=False)


def test_unauthorised_s3_fails_with_access_denied(s3_env, moto_auth):
    moto_auth(0)  # moto checks credentials from now on
    with pytest.raises(StoreError, match="access denied by S3 endpoint") as err:
        Store(s3_env)
    assert "testing-secret-never-logged" not in str(err.value)


def test_missing_bucket_says_so(s3_server, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with pytest.raises(StoreError, match="bucket not found"):
        Store("s3://no-such-bucket-r1/x")


def test_partial_checkpoints_are_removed_and_never_counted_as_kept(tmp_path):
    """A checkpoint upload cut short (a full disk, a kill) leaves a folder without ``_COMPLETE``: the next completed
    checkpoint's pruning removes it, and a partial one of a higher step does not push the complete one out."""
    store = Store(tmp_path / "store")
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "state.pt").write_bytes(b"s")
    partial = store.path("r", "grpo_train", "_checkpoints", "key", "checkpoint-9")
    store.put_file(ck / "state.pt", f"{partial}/state.pt")  # cut short before its marker (save_steps was 9 then)
    store.put_checkpoint("r", "grpo_train", "key", 3, ck)
    store.put_checkpoint("r", "grpo_train", "key", 6, ck)
    store.prune_checkpoints("r", "grpo_train", "key", keep=1)
    assert store.latest_checkpoint("r", "grpo_train", "key")[0] == 6
    base = store.checkpoint_dir("r", "grpo_train", "key")
    assert sorted(store._ls(base)) == ["checkpoint-6"]
