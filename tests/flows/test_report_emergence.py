"""The report's "Emergence, measured" section on a run written into a local store through the store's own API.

The stages' outputs are what the pipeline commits (a GRPO stage's ``metrics.jsonl``, an evaluation whose
parent is the model it scored), with measured-looking numbers chosen so each phase rule and both aha outcomes
appear: grpo_train's reflection rate jumps at step 30, final_rl's stays flat. The real pipeline's report is
checked in test_pipeline.py (ci-tiny) as well.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

from typer.testing import CliRunner

from flows.cli import app
from flows.report import write_report
from flows.report_emergence import NOT_MEASURED, emergence_section, measured_emergence
from grpo_core.evaluation.emergence import PHASES
from tasks.stages.evaluate import output_name
from tasks.storage.store import Store

RUN = "emerge"


def _commit(store: Store, stage: str, parents: dict, metrics: dict, files: dict[str, Path] | None = None):
    writer = store.begin(RUN, stage)
    for name, path in (files or {}).items():
        writer.put_file(path, name)
    return writer.commit(fingerprint=stage, config={}, parents=parents, metrics=metrics)


def _history(path: Path, reflection, accuracy) -> Path:
    rows = [{"step": s, "reward": a, "rewards/chain_accuracy/mean": a, "completions/mean_length": 20.0,
             "completions/reflection_rate": r, "completions/mean_steps": 3.0} for s, r, a in zip(range(1, 61), reflection, accuracy)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _eval(direct, steps, reflection, backtrack, with_r, without_r, accuracy):
    return {"eval/accuracy": accuracy, "eval/pass@1": accuracy, "eval/mean_length": 12.0,
            "eval/mean_length_sampled": 14.0, "eval/direct_rate": direct, "eval/mean_steps": steps,
            "eval/reflection_rate": reflection, "eval/backtrack_rate": backtrack,
            "eval/accuracy_with_reflection": with_r, "eval/accuracy_without_reflection": without_r}


def test_report_has_the_measured_phase_table_and_the_aha_plot(tmp_path):
    from PIL import Image

    store = Store(tmp_path / "store")
    jump = _history(tmp_path / "grpo.jsonl", [0.02 if s < 30 else 0.6 for s in range(1, 61)],
                    [0.2 if s < 30 else 0.7 for s in range(1, 61)])
    flat = _history(tmp_path / "final.jsonl", [0.5] * 60, [0.7] * 60)
    evals = {"cold_start_sft": _eval(0.9, 0.3, 0.0, 0.0, math.nan, 0.2, 0.2),
             "grpo_train": _eval(0.0, 4.0, 0.4, 0.01, 0.8, 0.5, 0.65),
             "sft_consolidate": {"eval/accuracy": 0.6, "eval/mean_length": 12.0},  # evaluated before the features
             "final_rl": _eval(0.0, 6.0, 0.5, 0.2, 0.8, 0.6, 0.7)}
    refs = {}
    for stage, files in (("cold_start_sft", None), ("grpo_train", {"metrics.jsonl": jump}), ("sft_consolidate", None),
                         ("final_rl", {"metrics.jsonl": flat})):
        refs[stage] = _commit(store, stage, {}, {}, files)
        _commit(store, output_name(stage), {"model": refs[stage]}, evals[stage])

    report = write_report(store, RUN)

    rows = {r["stage"]: r for r in report.emergence["rows"]}
    assert [rows[s]["phase"] for s in refs] == [PHASES[0], PHASES[2], NOT_MEASURED, PHASES[3]]
    assert rows["grpo_train"]["reflection"] == 0.4 and rows["grpo_train"]["mean length"] == 14.0
    assert report.emergence["aha"] == {"grpo_train": 30, "final_rl": None}
    md = report.markdown
    assert "## Emergence, measured" in md
    assert f"| grpo_train | {PHASES[2]} | 0.0% | 4.0 | 40.0% | 1.0% | 14.0 | 65.0% | 80.0% | 50.0% | 65.0% |" in md
    assert f"| cold_start_sft | {PHASES[0]} | 90.0% | 0.3 | 0.0% | 0.0% | 14.0 | 20.0% |  | 20.0% | 20.0% |" in md
    assert "- grpo_train: candidate aha step **30** (read `completions/reflection_rate`): 2.0% over the first 10 " \
           "steps, above it over steps 30-40; accuracy (`rewards/chain_accuracy/mean`) +50.0 points over those steps" in md
    assert "- final_rl: no aha step found under the rule (read `completions/reflection_rate`)" in md
    assert "max(3 se, 0.05)" in md and "The last 10 steps must be above the start" in md
    assert "Phase rule (first that holds)" in md and "Aha rule:" in md and "[reflection.png](reflection.png)" in md
    with Image.open(io.BytesIO(store.fs.cat_file(store.path(RUN, "_report", "reflection.png")))) as img:
        assert img.format == "PNG" and img.size[0] > 100
    saved = json.loads(store.read_text(store.path(RUN, "_report", "report.json")))
    assert saved["plots"]["reflection"] == "reflection.png" and saved["emergence"]["aha"]["grpo_train"] == 30
    assert "## Emergence, measured" in store.read_text(store.path(RUN, "_report", "report.md"))

    status = CliRunner().invoke(app, ["status", RUN, "--json", "--store", str(store.url)])
    assert status.exit_code == 0, status.output
    metrics = json.loads(status.output)["stages"]["grpo_train"]["metrics"]
    assert metrics["eval/reflection_rate"] == 0.4 and metrics["eval/mean_steps"] == 4.0


def test_a_run_without_reflection_logs_says_so(tmp_path):
    store = Store(tmp_path / "store")
    ref = _commit(store, "cold_start_sft", {}, {})
    _commit(store, output_name("cold_start_sft"), {"model": ref}, _eval(0.0, 3.0, 0.0, 0.0, math.nan, 0.5, 0.5))
    report = write_report(store, RUN)
    assert report.emergence["aha"] == {} and "- no RL stage logged `completions/reflection_rate`" in report.markdown
    assert f"| cold_start_sft | {PHASES[1]} |" in report.markdown
    assert store.exists(store.path(RUN, "_report", "reflection.png"))


def test_two_reasoning_sources_get_their_own_rows_and_aha_verdicts(tmp_path):
    """A mixture of a task that checks its work (countdown) and one that never does (chain): each has its own
    phase row and aha verdict, and the averaged row still comes first."""
    store = Store(tmp_path / "store")
    hist = tmp_path / "grpo.jsonl"
    rows = [{"step": s, "reward": 0.5, "completions/reflection_rate": 0.03 if s < 20 else 0.2,
             "completions/chain/reflection_rate": 0.0, "completions/countdown/reflection_rate": 0.06 if s < 20 else 0.4,
             "completions/mean_length": 20.0} for s in range(1, 61)]
    hist.write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics = {**_eval(0.0, 4.0, 0.2, 0.0, 0.8, 0.6, 0.8),
               **{k.replace("eval/", "eval/chain/"): v for k, v in _eval(0.0, 4.0, 0.0, 0.0, math.nan, 0.9, 0.9).items()},
               **{k.replace("eval/", "eval/countdown/"): v for k, v in _eval(0.0, 3.0, 0.4, 0.0, 0.8, 0.5, 0.7).items()},
               "eval/helpful/rm_score": 1.0}
    ref = _commit(store, "grpo_train", {}, {}, {"metrics.jsonl": hist})
    _commit(store, output_name("grpo_train"), {"model": ref}, metrics)

    report = write_report(store, RUN)

    by_stage = {r["stage"]: r for r in report.emergence["rows"]}
    assert list(by_stage) == ["grpo_train", "grpo_train · chain", "grpo_train · countdown"]
    assert by_stage["grpo_train · countdown"]["reflection"] == 0.4 and by_stage["grpo_train · chain"]["reflection"] == 0.0
    assert by_stage["grpo_train · countdown"]["phase"] == PHASES[2] and by_stage["grpo_train · chain"]["phase"] == PHASES[1]
    assert report.emergence["aha"] == {"grpo_train": 20, "grpo_train · chain": None, "grpo_train · countdown": 20}
    assert "- grpo_train · countdown: candidate aha step **20**" in report.markdown


def test_a_source_that_logs_its_checking_rate_is_judged_on_it():
    """countdown logs ``checking_rate`` (a missed try followed by a check and another try): its verdict reads that
    curve, not its reflection rate, and says so; its accuracy is its own reward function's; chain, which logs no
    checking rate, is judged on its reflection rate; counts are read where logged."""
    rows = [{"step": s, "reward": 0.5, "completions/count": 128, "completions/reflection_rate": 0.2,
             "completions/countdown/count": 64, "completions/chain/count": 64,
             "completions/countdown/reflection_rate": 0.05 if s < 25 else 0.5,  # says "wait" more, checks no more
             "completions/countdown/checking_rate": 0.1, "rewards/countdown_accuracy/mean": 0.3,
             "completions/chain/reflection_rate": 0.0 if s < 25 else 0.3} for s in range(1, 61)]
    measured = measured_emergence({}, {"grpo_train": rows})
    assert measured["aha"] == {"grpo_train": None, "grpo_train · chain": 25, "grpo_train · countdown": None}
    assert measured["aha_detail"]["grpo_train · countdown"]["curve"] == "completions/countdown/checking_rate"
    for row in rows:
        row["completions/countdown/checking_rate"] = 0.1 if row["step"] < 25 else 0.45
        row["rewards/countdown_accuracy/mean"] = 0.3 if row["step"] < 25 else 0.6
    measured = measured_emergence({}, {"grpo_train": rows})
    assert measured["aha"]["grpo_train · countdown"] == 25
    md = emergence_section(measured)
    assert "- grpo_train · countdown: candidate aha step **25** (read `completions/countdown/checking_rate`)" in md
    assert "accuracy (`rewards/countdown_accuracy/mean`) +30.0 points" in md
    assert "- grpo_train · chain: candidate aha step **25** (read `completions/chain/reflection_rate`)" in md
    assert "accuracy (`reward`) +0.0 points" in md  # chain logged no accuracy of its own: the step's reward
    assert "- grpo_train: no aha step found under the rule (read `completions/reflection_rate`)" in md


def test_checking_columns_are_filled_for_a_source_with_tries_and_empty_without():
    """Issue 42: the table's checking columns read ``eval/{source}/checking_rate`` and the rest (countdown's); a
    source without tries (chain) and the mixed stage row leave them empty."""
    from types import SimpleNamespace

    checking = {"checking_rate": 0.6, "miss_retry_rate": 0.7, "hit_stop_rate": 0.9, "first_try_hit_rate": 0.3,
                "retry_hit_rate": 0.55, "reflection_after_hit_rate": 0.05}
    metrics = {**_eval(0.0, 4.0, 0.2, 0.0, 0.8, 0.6, 0.8),
               **{k.replace("eval/", "eval/chain/"): v for k, v in _eval(0.0, 4.0, 0.0, 0.0, math.nan, 0.9, 0.9).items()},
               **{k.replace("eval/", "eval/countdown/"): v for k, v in _eval(0.0, 3.0, 0.4, 0.0, 0.8, 0.5, 0.7).items()},
               **{f"eval/countdown/{k}": v for k, v in checking.items()}}
    measured = measured_emergence({"grpo_train": SimpleNamespace(metrics=metrics)}, {})
    rows = {r["stage"]: r for r in measured["rows"]}
    assert rows["grpo_train · countdown"]["checking"] == 0.6 and rows["grpo_train · countdown"]["retries hit"] == 0.55
    assert rows["grpo_train"]["checking"] is None and rows["grpo_train · chain"]["hits that stop"] is None
    md = emergence_section(measured)
    assert ("| checking | misses checked & retried | hits that stop | first tries hit | retries hit "
            "| reflection after a hit |") in md
    lines = {line.split(" | ")[0].lstrip("| "): line for line in md.splitlines() if line.startswith("| grpo_train")}
    assert lines["grpo_train · countdown"].endswith("| 60.0% | 70.0% | 90.0% | 30.0% | 55.0% | 5.0% |")
    assert lines["grpo_train · chain"].endswith("| 90.0% |  |  |  |  |  |  |")  # greedy accuracy, then empty
    assert lines["grpo_train"].endswith("| 80.0% |  |  |  |  |  |  |")
