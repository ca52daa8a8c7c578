"""A data error inside the running pipeline ends ``r1 run`` with one error line and no committed output."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from typer.testing import CliRunner

from flows.cli import app
from tasks.config.pipeline import DEFAULT_CONFIG
from tasks.storage.store import Store


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


@pytest.fixture
def no_pipeline(monkeypatch):
    """Refusals must come before the pipeline (and Prefect) starts; if the CLI gets there, fail at once."""
    import flows.r1_pipeline
    import flows.stages

    def started(*_, **__):
        raise AssertionError("the pipeline started")

    monkeypatch.setattr(flows.r1_pipeline, "r1_pipeline", started)
    monkeypatch.setattr(flows.stages, "stage_flow", started)


def _one_error_line(result) -> str:
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def _files_under(path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.parametrize("name, problem", [
    ("../escape", "contains a path separator"),
    ("a/b", "contains a path separator"),
    ("a..b", "contains '..'"),
    ("", "is empty"),
    ("_run", "starts with '_' or '.' (names the store keeps for itself)"),
    (".hidden", "starts with '_' or '.' (names the store keeps for itself)"),
])
@pytest.mark.parametrize("command", ["run", "stage", "status", "report"])
def test_bad_run_name_is_refused_and_nothing_is_written(tmp_path, monkeypatch, no_pipeline, command, name, problem):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # a relative escape would land here or in tmp_path
    store = ["--store", str(work / "store")]
    args = {"run": ["run", "--run", name], "stage": ["stage", "grpo_train", "--run", name],
            "status": ["status", name], "report": ["report", name]}[command]
    line = _one_error_line(CliRunner().invoke(app, args + store))
    assert line == f"error: run name {name!r} {problem}; use letters, digits, '-', '_' and '.', e.g. --run exp-1"
    assert _files_under(tmp_path) == ["work"]  # no store, nothing outside it


@pytest.mark.parametrize("url, message", [
    ("http://example.com/r1", "store URL 'http://example.com/r1': scheme 'http://' is not supported; "
                              "use a local folder, file:///path, or s3://bucket[/prefix]"),
    ("gs://bucket/r1", "store URL 'gs://bucket/r1': scheme 'gs://' is not supported; "
                       "use a local folder, file:///path, or s3://bucket[/prefix]"),
    ("s3://", "store URL 's3://' names no bucket; use s3://bucket or s3://bucket/prefix"),
    ("s3:///prefix", "store URL 's3:///prefix' names no bucket; use s3://bucket or s3://bucket/prefix"),
    ("file://", "store URL 'file://' names no folder; use file:///absolute/path or a plain path"),
    ("s3:/bucket", "store URL 's3:/bucket' looks like a URL missing '://'; "
                   "use a local folder, file:///path, or s3://bucket[/prefix]"),
])
@pytest.mark.parametrize("command", ["run", "status"])
def test_unsupported_store_url_is_refused_before_prefect(tmp_path, monkeypatch, no_pipeline, command, url, message):
    monkeypatch.chdir(tmp_path)  # a mangled URL used to become a local folder here
    args = ["run", "--run", "x"] if command == "run" else ["status", "x"]
    assert _one_error_line(CliRunner().invoke(app, args + ["--store", url])) == f"error: {message}"
    assert _files_under(tmp_path) == []


def test_store_url_from_the_environment_is_checked_too(tmp_path, monkeypatch, no_pipeline):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("R1_STORE", "http://example.com/r1")
    line = _one_error_line(CliRunner().invoke(app, ["status", "x"]))
    assert line.startswith("error: store URL 'http://example.com/r1': scheme 'http://' is not supported")
    assert _files_under(tmp_path) == []


def test_status_of_an_unknown_run_names_the_store_and_lists_runs(tmp_path):
    store = Store(tmp_path / "store")
    for i in range(7):
        store.write_run_file(f"exp-{i}", "config.json", {"config": {}})
    before = _files_under(tmp_path)
    for args in (["status", "nosuchrun"], ["status", "nosuchrun", "--json"], ["report", "nosuchrun"]):
        line = _one_error_line(CliRunner().invoke(app, args + ["--store", str(tmp_path / "store")]))
        assert line == (f"error: no run 'nosuchrun' in store {store.url}; runs there: exp-2, exp-3, exp-4, exp-5, "
                        "exp-6 (and 2 more); pass --store if the run is in another store")
    assert _files_under(tmp_path) == before
    empty = tmp_path / "empty"
    line = _one_error_line(CliRunner().invoke(app, ["status", "exp-1", "--store", str(empty)]))
    assert line == (f"error: no run 'exp-1' in store {empty}; it holds no runs yet; "
                    "pass --store if the run is in another store")
    ok = CliRunner().invoke(app, ["status", "exp-1", "--store", str(tmp_path / "store")])
    assert ok.exit_code == 0 and "pending" in ok.output  # a run that exists still shows its stages


def test_flows_refuse_a_bad_run_name_when_called_without_the_cli(tmp_path, monkeypatch):
    """A deployment run passes its parameters straight to the flow: the run name is checked there too."""
    import flows.r1_pipeline
    from flows.r1_pipeline import r1_pipeline
    from flows.stages import run_stage
    from tasks.config.pipeline import ConfigError

    def planned(*_, **__):
        raise AssertionError("the pipeline planned its stages")

    monkeypatch.setattr(flows.r1_pipeline.Dispatcher, "plan", planned)
    message = "run name '../escape' contains a path separator; use letters, digits, '-', '_' and '.', e.g. --run exp-1"
    with pytest.raises(ConfigError) as err:
        r1_pipeline.fn(run_name="../escape", store=str(tmp_path / "store"))
    assert str(err.value) == message
    with pytest.raises(ConfigError) as err:
        run_stage("grpo_train", "../escape", store=str(tmp_path / "store"))
    assert str(err.value) == message
    assert _files_under(tmp_path) == []


ROOT = Path(__file__).resolve().parents[2]


def _subprocess_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "R1_"))}
    return {**env, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PYTHONPATH": str(ROOT), **extra}


def test_a_data_error_is_a_few_lines_without_tracebacks(tmp_path):
    """As a user sees it (``r1 run`` in a terminal: Prefect's console handler included): it printed ~216 lines
    and 4 tracebacks; now Prefect's lines for the failure are one line each, then the one ``error:`` line naming
    file, line, field and fix. R1_TRACEBACK=1 brings the tracebacks back."""
    data = tmp_path / "qa.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"{i}+1=", "solution": str(i + 1)}) for i in range(4)) + "\n")
    cfg = tmp_path / "bad-data.yaml"
    cfg.write_text("model: {tiny: {hidden_size: 16, num_layers: 1, num_heads: 2}}\n"
                   f"data: {{builtin_task: null, train_sources: [{{path: '{data}'}}]}}\n")
    command = [sys.executable, "-m", "flows.cli", "run", "-c", str(cfg), "--run", "bad", "--store", str(tmp_path / "s")]
    out = subprocess.run(command, cwd=tmp_path, env=_subprocess_env(tmp_path), capture_output=True, text=True,
                         timeout=600)
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert out.returncode == 1, "\n".join(lines)
    assert "Traceback" not in out.stdout + out.stderr and len(lines) <= 20, "\n".join(lines)
    assert lines[-1].startswith(f"error: DataError: {data} line 1: field 'answer'"), lines[-1]
    assert "Fix the row, or map the field with field_map" in lines[-1] and "R1_TRACEBACK" not in lines[-1]

    shown = subprocess.run(command, cwd=tmp_path, env=_subprocess_env(tmp_path, R1_TRACEBACK="1"),
                           capture_output=True, text=True, timeout=600)
    assert shown.returncode == 1 and "Traceback (most recent call last)" in shown.stderr


def test_a_full_disk_says_free_space_then_rerun(tmp_path):
    """ENOSPC while a stage writes its output (``r1 stage`` in its own process, the store's upload made to fail as a
    full disk does): the line says a disk is full, where, and to free space and rerun."""
    full = tmp_path / "store" / "x.parquet"
    script = textwrap.dedent(f"""
        import errno, os, sys
        from tasks.storage.store import StageWriter
        def put_dir(self, local, name=""):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), {str(full)!r})
        StageWriter.put_dir = put_dir
        from flows.cli import main
        sys.argv = ["r1", "stage", "prepare_data", "--run", "full", "-c", {str(ROOT / "configs" / "ci-tiny.yaml")!r},
                    "--store", {str(tmp_path / "store")!r}]
        main()
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=_subprocess_env(tmp_path),
                         capture_output=True, text=True, timeout=600)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stdout + out.stderr
    assert lines[-1] == (f"error: a disk is full ([Errno 28] No space left on device: '{full}'): free space there (or "
                         "point R1_WORKDIR / --store at a bigger disk), then rerun the same command to resume (finished "
                         "stages are reused, training resumes from its last checkpoint)"), lines[-1]


def test_a_full_disk_in_a_training_child_is_recognised_from_its_message():
    """A training child's failure reaches the CLI as ``StageProcessFailed`` whose message holds its traceback."""
    from flows.cli_errors import failure_line
    from tasks.runner.launch import StageProcessFailed

    child = ("tasks.runner.worker failed (exit code 1)\n--- traceback of rank 0 ---\nTraceback (most recent call "
             "last):\n  ...\nOSError: [Errno 28] No space left on device: '/scratch/ckpt/model.safetensors'\n")
    line = failure_line(StageProcessFailed(child, returncode=1, rank=0, child_traceback=child))
    assert line.startswith("a disk is full ([Errno 28] No space left on device: '/scratch/ckpt/model.safetensors'): "
                           "free space there") and "then rerun the same command" in line


def test_a_stalled_s3_store_names_the_endpoint_the_timeout_and_rerun(own_s3_server, tmp_path):
    """The S3 endpoint hangs (SIGSTOP: connections accepted, never answered) while ``r1`` holds the run: no
    heartbeat reaches the store, the writer stops before its lease could go stale (as it must), and says the store
    went silent, naming the endpoint and the time limits, and to rerun: not "another writer owns the run"."""
    import boto3

    url, proc = own_s3_server
    aws = {"AWS_ENDPOINT_URL_S3": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    boto3.client("s3", endpoint_url=url, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket="stalls")
    # As `r1 run` holds it (flows/cli_common: _interruptible, _lease), with a 3 s lease and a fast heartbeat; the
    # read timeout above the lease's guard, as the defaults are (60 s vs 50 s)
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time
        import typer
        import flows.cli_common as C
        from flows.cli_common import _interruptible, _lease
        from tasks.storage.store import Store
        take = C.acquire_lease
        C.acquire_lease = lambda *a, **k: take(*a, heartbeat_s=0.3, ttl_s=3, settle_s=0, **k)
        try:
            with _interruptible(), _lease(Store("s3://stalls/runs"), "stalled", False):
                print("held", flush=True)
                time.sleep(60)
        except typer.Exit as e:
            sys.exit(e.exit_code)
    """)], cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**_subprocess_env(tmp_path), **aws, "R1_S3_READ_TIMEOUT": "5"})
    try:
        assert writer.stdout.readline().strip() == "held", writer.stderr.read()
        proc.send_signal(signal.SIGSTOP)
        stalled = time.monotonic()
        assert writer.wait(timeout=60) == 1
        assert time.monotonic() - stalled < 20  # 2.5 s (the lease's guard), seconds more to unwind
    finally:
        writer.kill()
        proc.send_signal(signal.SIGCONT)
    last = writer.stderr.read().strip().splitlines()[-1]
    assert last.startswith("error: lost the lease on run 'stalled' in s3://stalls/runs: no heartbeat reached the store "
                           "since "), last
    assert "(a lease goes stale after 3 s)" in last
    assert (f"; S3 endpoint {url} for s3://stalls/runs did not answer the lease's heartbeats (each store operation "
            "waits at most 5 s, R1_S3_READ_TIMEOUT): the run stopped so that no other writer overlaps it: check "
            "AWS_ENDPOINT_URL_S3 and the network, then rerun the same command to resume") in last, last


def test_the_error_line_of_a_store_failure_says_rerun_and_of_a_bug_where_its_traceback_is(monkeypatch):
    from flows.cli_errors import failure_line
    from grpo_core.data.rows import DataError
    from tasks.storage.lease import LeaseLost
    from tasks.storage.store import StoreStalled

    monkeypatch.delenv("R1_TRACEBACK", raising=False)
    stalled = StoreStalled("cannot reach S3 endpoint E for s3://b/p while reading: no answer within 60 s")
    assert failure_line(stalled) == (f"StoreStalled: {stalled}; once the store answers, rerun the same command to "
                                     "resume (finished stages are reused, training resumes from its last checkpoint)")
    assert "rerun" not in failure_line(LeaseLost("commit refused: lost the lease"))  # another writer owns the run
    assert failure_line(DataError("f.jsonl line 3: field 'answer' ...")) == "DataError: f.jsonl line 3: field 'answer' ..."
    assert failure_line(KeyError("k")) == "KeyError: 'k' (R1_TRACEBACK=1 shows the traceback)"
    monkeypatch.setenv("R1_TRACEBACK", "1")
    assert failure_line(KeyError("k")) == "KeyError: 'k'"
