"""The whole pipeline through real Prefect against S3 (moto on 127.0.0.1, s3fs), on configs/ci-tiny.yaml.

One pipeline run (module fixture) serves the checks that read it: every stage committed and evaluated,
a second run fully cached, ``r1 status --json``, ``r1 report`` with PNGs that open, ``r1 stage
rejection_sample`` reusing the upstream outputs, ``--from-stage``, and a worker killed mid-``grpo_train``
whose retry resumes from the store's checkpoint. Tests run in file order; the later ones add versions.
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.r1_pipeline import r1_pipeline
from flows.run_status import evaluation_of
from flows.stages import stage_flow
from tasks.config.pipeline import load_config
from tasks.config.stages import all_stages, stage_names
from tasks.storage.lease import LEASE
from tasks.storage.store import Store

ROOT = Path(__file__).resolve().parents[2]
RUN = "ci"
CI_CONFIG = ROOT / "configs" / "ci-tiny.yaml"
STAGES = [s.name for s in all_stages() if s.enabled(load_config(CI_CONFIG))]  # the stages ci-tiny runs
MODEL_STAGES = ("cold_start_sft", "grpo_train", "sft_consolidate", "final_rl")


@pytest.fixture(scope="module")
def s3_store(s3_server):
    import boto3

    bucket = f"r1-flows-{uuid.uuid4().hex[:8]}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ENDPOINT_URL_S3", s3_server)
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing-secret-never-logged")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        mp.setenv("R1_WORKDIR", str(Path(os.environ.get("TMPDIR", "/tmp")) / f"r1-work-{bucket}"))
        boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=bucket)
        yield f"s3://{bucket}/runs"


@pytest.fixture(scope="module")
def config():
    return load_config(CI_CONFIG)


@pytest.fixture(scope="module")
def first_run(s3_store, config):
    start = time.monotonic()
    state = r1_pipeline(config=config, run_name=RUN, store=s3_store, return_state=True)
    assert state.is_completed(), state.message
    return {"result": state.result(), "seconds": time.monotonic() - start}


def _task_runs(flow_run_id) -> list:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    with get_client(sync_client=True) as client:
        children = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])))
        ids = [flow_run_id, *(c.id for c in children)]
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": ids}))


def _versions(store: Store, stage: str) -> int:
    """Committed outputs of ``stage`` (version folders with a manifest)."""
    store.fs.invalidate_cache()
    return len(store.fs.glob(store._strip(store.path(RUN, stage, "*", "manifest.json"))))


def test_pipeline_commits_and_evaluates_every_stage(first_run, s3_store):
    store = Store(s3_store)
    refs = first_run["result"]["stages"]
    assert list(refs) == list(STAGES)
    for stage in STAGES:
        manifest = store.manifest(store.latest(RUN, stage))
        assert manifest["path"] == refs[stage]["path"] == f"{RUN}/{stage}/{manifest['version']}"  # store-relative
        assert refs[stage]["uri"] == store.uri_of(manifest["path"]) and refs[stage]["uri"].startswith(s3_store)
        for name, info in manifest["files"].items():  # every listed file exists with its size
            assert store.fs.size(store.path(manifest["path"], name)) == info["size"]
        if stage in MODEL_STAGES:  # evaluated: its own output, whose parent is the model
            evaluation = store.manifest(evaluation_of(store, store.latest(RUN, stage)))
            assert evaluation["parents"]["model"]["version"] == manifest["version"]
            assert 0.0 <= evaluation["metrics"]["eval/accuracy"] <= 1.0
            assert evaluation["metrics"]["eval/mean_length"] > 0
            assert "eval/accuracy" not in manifest["metrics"]
    # parents are the exact upstream versions
    grpo = store.manifest(store.latest(RUN, "grpo_train"))
    assert grpo["parents"]["cold_start_sft"]["version"] == store.latest(RUN, "cold_start_sft").version
    consolidate = store.manifest(store.latest(RUN, "sft_consolidate"))
    assert set(consolidate["parents"]) == {"prepare_data", "rejection_sample", "grpo_train"}  # init_from grpo_train
    history = store.read_text(store.path(grpo["path"], "metrics.jsonl")).splitlines()
    assert [json.loads(line)["step"] for line in history] == [1, 2, 3, 4]
    assert all(0.0 <= json.loads(line)["completions/reflection_rate"] <= 1.0 for line in history)
    print(f"ci-tiny pipeline on S3: {first_run['seconds']:.0f} s")


def test_second_run_is_cached_end_to_end(first_run, s3_store, config):
    store = Store(s3_store)
    before = {s: _versions(store, s) for s in STAGES}
    state = r1_pipeline(config=config, run_name=RUN, store=s3_store, return_state=True)
    assert state.is_completed()
    runs = _task_runs(state.state_details.flow_run_id)
    stage_runs = [t for t in runs if t.name.split("-")[0] in (*STAGES, "evaluate")]
    assert stage_runs and all(t.state.name == "Cached" for t in stage_runs), [(t.name, t.state.name) for t in stage_runs]
    assert {s: _versions(store, s) for s in STAGES} == before


def test_status_json_shape(first_run, s3_store):
    result = CliRunner().invoke(app, ["status", RUN, "--json", "--store", s3_store])
    assert result.exit_code == 0, result.output
    status = json.loads(result.output)
    assert status["run"] == RUN and list(status["stages"]) == stage_names()
    for stage, info in status["stages"].items():
        if stage not in STAGES:  # an optional stage ci-tiny does not enable
            assert info == {"state": "skipped", "uri": None, "path": None, "metrics": {}}
            continue
        assert info["state"] == "completed" and info["uri"].startswith(s3_store)
        assert isinstance(info["metrics"], dict)
    assert "eval/accuracy" in status["stages"]["final_rl"]["metrics"]
    for key in ("eval/reflection_rate", "eval/mean_steps", "eval/backtrack_rate", "eval/direct_rate",
                "eval/accuracy_with_reflection", "eval/accuracy_without_reflection"):
        assert key in status["stages"]["final_rl"]["metrics"], key
    table = CliRunner().invoke(app, ["status", RUN, "--store", s3_store])
    assert table.exit_code == 0 and all(s in table.output for s in STAGES)


def test_report_prints_table_and_plots_open(first_run, s3_store, tmp_path):
    from PIL import Image

    result = CliRunner().invoke(app, ["report", RUN, "--store", s3_store])
    assert result.exit_code == 0, result.output
    assert "| stage / step | accuracy |" in result.output
    for stage in MODEL_STAGES:
        assert f"{stage} (held-out)" in result.output
    assert "grpo_train step 4 (train samples)" in result.output
    # the seed's phase table from measured features, one measured row per evaluated stage, and the aha verdict
    from grpo_core.evaluation.emergence import PHASES

    assert "## Emergence, measured" in result.output
    for stage in MODEL_STAGES:
        assert any(f"| {stage} | {phase} |" in result.output for phase in PHASES), stage
    for stage in ("grpo_train", "final_rl"):  # 4 and 2 steps: fewer than one window of the rule
        assert f"- {stage}: no aha step found under the rule" in result.output
    store = Store(s3_store)
    for name in ("reward", "accuracy", "length", "reflection"):
        data = store.fs.cat_file(store._strip(f"{s3_store}/{RUN}/_report/{name}.png"))
        with Image.open(io.BytesIO(data)) as img:
            assert img.format == "PNG" and img.size[0] > 100


def test_evaluate_writes_its_own_output_and_rewrites_no_manifest(first_run, s3_store, config):
    """Committed manifests are written once: evaluating a model again adds an evaluation output whose parent
    is that model, and every other manifest of the run stays byte-identical."""
    from tasks.stages.evaluate import evaluate, output_name

    store = Store(s3_store)
    store.fs.invalidate_cache()
    pattern = store._strip(f"{s3_store}/{RUN}/**/manifest.json")
    before = {p: store.fs.cat_file(p) for p in store.fs.glob(pattern)}
    grpo = store.latest(RUN, "grpo_train")
    evals_before = _versions(store, output_name("grpo_train"))
    ref = evaluate.fn(config, RUN, s3_store, grpo, {"prepare_data": store.latest(RUN, "prepare_data")}, force=True)
    store.fs.invalidate_cache()
    after = {p: store.fs.cat_file(p) for p in store.fs.glob(pattern)}
    assert {p: after[p] for p in before} == before  # byte-identical
    assert set(after) - set(before) == {store._strip(f"{ref.uri}/manifest.json")}
    assert _versions(store, output_name("grpo_train")) == evals_before + 1
    assert store.manifest(ref)["parents"]["model"]["version"] == grpo.version
    assert evaluation_of(store, grpo).version == ref.version  # status and report read the newest evaluation
    assert store.exists(f"{ref.uri}/results.jsonl")


def test_stage_rerun_reuses_upstream(first_run, s3_store):
    from prefect import get_client
    from prefect.client.schemas.filters import FlowFilter

    store = Store(s3_store)
    before = {s: _versions(store, s) for s in STAGES}
    result = CliRunner().invoke(app, ["stage", "rejection_sample", "--run", RUN, "--store", s3_store])
    assert result.exit_code == 0, result.output
    assert not store.exists(store.run_file(RUN, LEASE))  # the run's lease was held, then released
    after = {s: _versions(store, s) for s in STAGES}
    assert after == {**before, "rejection_sample": before["rejection_sample"] + 1}  # only it wrote a new output
    new = store.manifest(store.latest(RUN, "rejection_sample"))
    assert new["parents"]["grpo_train"]["version"] == store.latest(RUN, "grpo_train").version
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_runs(flow_filter=FlowFilter(name={"any_": ["rejection-sample"]}), limit=1,
                                         sort="START_TIME_DESC")[0]
    names = [(t.name.rsplit("-", 1)[0], t.state.name) for t in _task_runs(flow_run.id)]
    assert names == [("rejection_sample", "Completed")]  # no upstream task ran, and it was not a cache hit


@pytest.mark.slow
def test_from_stage_reruns_tail_and_reuses_head(first_run, s3_store, config):
    store = Store(s3_store)
    before = {s: _versions(store, s) for s in STAGES}
    state = r1_pipeline(config=config, run_name=RUN, store=s3_store, from_stage="sft_consolidate", return_state=True)
    assert state.is_completed()
    after = {s: _versions(store, s) for s in STAGES}
    assert after == {**before, "sft_consolidate": before["sft_consolidate"] + 1, "final_rl": before["final_rl"] + 1}
    states = {t.name: t.state.name for t in _task_runs(state.state_details.flow_run_id)}
    assert {n.rsplit("-", 1)[0] for n, s in states.items() if s == "Cached"} >= {
        "reuse-prepare_data", "reuse-cold_start_sft", "reuse-grpo_train", "reuse-rejection_sample"}


@pytest.mark.slow
def test_killed_grpo_worker_resumes_from_store_checkpoint(first_run, s3_store, config):
    """SIGKILL the training process after its first stored checkpoint; the retry resumes from the store."""
    cfg = config.model_copy(deep=True)
    cfg.grpo_train.max_steps, cfg.grpo_train.save_steps = 24, 2
    cfg.run.isolation, cfg.run.retries, cfg.run.retry_delay_seconds = "subprocess", 1, 0
    store = Store(s3_store)
    done: dict = {}
    thread = threading.Thread(target=lambda: done.update(state=stage_flow("grpo_train")(run=RUN, config=cfg, store=s3_store,
                                                                                return_state=True)))
    thread.start()
    pattern = store._strip(f"{s3_store}/{RUN}/grpo_train/_checkpoints/*/checkpoint-*/_COMPLETE")
    killed = None
    deadline = time.monotonic() + 300
    while killed is None and time.monotonic() < deadline and thread.is_alive():
        store.fs.invalidate_cache()
        if store.fs.glob(pattern):
            for child in psutil.Process().children(recursive=True):
                if "tasks.runner.worker" in " ".join(child.cmdline()):
                    child.kill()
                    killed = child.pid
        time.sleep(0.05)
    thread.join(timeout=600)
    assert killed is not None, "the worker finished or never checkpointed before it could be killed"
    state = done["state"]
    assert state.is_completed(), state.message
    manifest = store.manifest(store.latest(RUN, "grpo_train"))
    assert manifest["config"]["grpo_train"]["max_steps"] == 24
    resumed = manifest["training"]["resumed_from_step"]
    assert 2 <= resumed < 24
    steps = [json.loads(line)["step"] for line in store.read_text(store.path(manifest["path"], "metrics.jsonl")).splitlines()]
    assert steps == list(range(1, 25))  # no step lost or repeated
    runs = [t for t in _task_runs(state.state_details.flow_run_id) if t.name.startswith("grpo_train")]
    assert len(runs) == 1 and runs[0].run_count == 2  # the task was retried once, in place
    store.fs.invalidate_cache()
    assert not store.fs.glob(pattern)  # checkpoints are removed once the model is committed
