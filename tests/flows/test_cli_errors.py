"""A data error inside the running pipeline ends ``r1 run`` with one error line and no committed output."""

from __future__ import annotations

import json

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
