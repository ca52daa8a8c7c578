"""``r1 eval RUN/STAGE`` on a tiny model and a local slice of MATH-500 (issue 11, must show 4): a committed
evaluation output with the per-benchmark keys, shown by ``r1 status --json`` and in the report beside the
config's reference numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from flows.run_status import evaluation_of
from flows.stages import RUN_CONFIG, stage_flow
from tasks.config.pipeline import load_config
from tasks.stages.evaluate import output_name
from tasks.storage.store import Store

ROOT = Path(__file__).resolve().parents[2]
RUN = "evalrun"
KEYS = ("eval/math500/pass@1", "eval/math500/pass@2", "eval/math500/maj@2", "eval/math500/maj@1",
        "eval/math500/greedy")


@pytest.fixture(scope="module")
def run_with_model(tmp_path_factory, shared_data):
    """A run holding real committed prepare_data and cold_start_sft outputs (configs/ci-tiny.yaml), the
    config with a reference block, and a 3-problem slice of MATH-500 as a local file."""
    tmp = tmp_path_factory.mktemp("eval-cmd")
    raw = yaml.safe_load((ROOT / "configs" / "ci-tiny.yaml").read_text())
    raw["evaluate"]["sampling"].update(max_prompt_length=48)
    raw["evaluate"].update(reference={"math500": {"label": "DeepSeek-R1", "pass@1": 97.3, "maj@2": 98.0}})
    config_path = tmp / "config.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    config = load_config(config_path)
    store = str(tmp / "store")
    Store(store).write_run_file(RUN, RUN_CONFIG, {"config": config.model_dump(mode="json")})
    stage_flow("prepare_data")(run=RUN, config=config, store=store)
    stage_flow("cold_start_sft")(run=RUN, config=config, store=store)
    problems = json.loads((shared_data / "math500_test.json").read_text())[:3]
    slice_path = tmp / "math500_slice.json"
    slice_path.write_text(json.dumps(problems))
    return {"store": store, "config": config_path, "slice": slice_path}


def test_r1_eval_commits_benchmark_numbers_that_status_shows(run_with_model):
    store, runner = run_with_model["store"], CliRunner()
    args = ["eval", f"{RUN}/cold_start_sft", "--benchmarks", f"math500={run_with_model['slice']}", "-n", "2",
            "--k", "1,2", "--max-completion-length", "8", "--store", store, "-c", str(run_with_model["config"])]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    st = Store(store)
    model = st.latest(RUN, "cold_start_sft")
    evaluation = evaluation_of(st, model)
    manifest = st.manifest(evaluation)
    assert manifest["path"].startswith(f"{RUN}/{output_name('cold_start_sft')}/")
    assert manifest["parents"]["model"]["version"] == model.version
    for key in (*KEYS, "eval/accuracy", "eval/accuracy_forced_reasoning"):  # benchmarks and the held-out set
        assert 0.0 <= manifest["metrics"][key] <= 1.0, key
    assert manifest["metrics"]["eval/math500/num_rows"] == 3.0
    assert manifest["config"][output_name("cold_start_sft")]["sampling"]["temperature"] == 1.0  # the config's own where the command sets none
    rows = [json.loads(line) for line in st.read_text(st.path(manifest["path"], "benchmarks/math500.jsonl")).splitlines()]
    assert [r["id"] for r in rows] == ["test/precalculus/807.json", "test/intermediate_algebra/1994.json",
                                       "test/algebra/2584.json"]
    assert all(len(r["samples"]) == len(r["correct"]) == 2 for r in rows)
    for key in KEYS:  # the run's number is the mean of the per-problem numbers it committed
        per_row = [r[key.split("/")[-1]] if key != "eval/math500/greedy" else float(r["greedy_correct"]) for r in rows]
        assert manifest["metrics"][key] == pytest.approx(sum(per_row) / 3)

    status = runner.invoke(app, ["status", RUN, "--json", "--store", store])
    assert status.exit_code == 0, status.output
    metrics = json.loads(status.output)["stages"]["cold_start_sft"]["metrics"]
    assert {k: metrics[k] for k in KEYS} == {k: manifest["metrics"][k] for k in KEYS}

    again = runner.invoke(app, args)  # same model, same config, same rows: the committed evaluation is reused
    assert again.exit_code == 0, again.output
    assert evaluation_of(st, model).version == evaluation.version

    report = runner.invoke(app, ["report", RUN, "--store", store])
    assert report.exit_code == 0, report.output
    assert "## Benchmarks (R1 protocol)" in report.output
    assert "| math500 | cold_start_sft |" in report.output
    assert "| math500 | DeepSeek-R1 (reference) | 97.3% |" in report.output


def test_r1_eval_refuses_bad_targets_and_options(run_with_model):
    store, runner = run_with_model["store"], CliRunner()
    cases = [
        (["eval", f"{RUN}/prepare_data", "--store", store], "makes no model"),
        (["eval", "nowhere", "--store", store], "neither a model folder"),
        (["eval", str(run_with_model["slice"].parent), "--store", store], "is not a model folder (no config.json there)"),
        (["eval", f"{RUN}/cold_start_sft", "--benchmarks", "math5000", "--store", store], "unknown benchmark 'math5000'"),
        (["eval", f"{RUN}/cold_start_sft", "--benchmarks", "math500", "-n", "2", "--k", "4", "--store", store],
         "k=4 is outside 1..sampling.num_generations"),
    ]
    for args, message in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 1 and message in result.output, (args, result.output)


def test_r1_eval_on_a_model_folder_writes_results_there(run_with_model, tmp_path):
    from grpo_core.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "my-model", hidden_size=32, num_layers=1, num_heads=2, max_position_embeddings=64)
    out = tmp_path / "results"
    result = CliRunner().invoke(app, ["eval", str(model), "--benchmarks", f"math500={run_with_model['slice']}",
                                      "-n", "3", "--k", "2,3", "--limit", "2", "--max-completion-length", "6",
                                      "--max-prompt-length", "32", "--output", str(out)])
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "metrics.json").read_text())
    assert {"eval/math500/pass@1", "eval/math500/pass@2", "eval/math500/pass@3", "eval/math500/maj@3",
            "eval/math500/greedy"} <= set(saved["metrics"])
    assert (saved["config"]["sampling"]["temperature"], saved["config"]["sampling"]["top_p"]) == (0.6, 0.95)  # the R1 protocol by default
    assert len((out / "math500.jsonl").read_text().splitlines()) == 2
    assert "eval/math500/pass@1" in result.output
    assert "evaluation samples with transformers (a model folder with evaluate.sampling.use_vllm unset" in result.output
    nothing = CliRunner().invoke(app, ["eval", str(model)])
    assert nothing.exit_code == 1 and "name benchmarks with --benchmarks" in nothing.output
