"""Every benchmark script runs: each ``tests/benchmarks/*.py`` with a ``__main__`` block, in its quick mode.

The convention every benchmark script follows:
- ``python tests/benchmarks/NAME.py`` with no arguments runs the full measurement (what the README quotes);
- ``python tests/benchmarks/NAME.py --quick`` runs the same code path at tiny sizes and exits 0 (what this test
  runs; the numbers mean nothing, their shape does);
- both print their result last, as one JSON line where the script has a summary;
- a run or child process that fails makes the script exit non-zero with a message naming it
  (``_child.exit_if_failed`` / ``_child.run_json``), never 0 with a summary that lacks its headline number.

Scripts are found by glob (helpers ``_*.py`` and tests ``test_*.py`` aside), so a new script is covered as soon as it
lands: without ``--quick`` in its source it fails here. ``NOT_RUN`` lists the scripts skipped, each with why.
``EXTENDED`` lists those whose quick mode takes about a minute or more on a busy 2-core CPU: they run in the extended
tier (``pytest -m extended``, which CI runs after the CI tier). ``CHECKS`` holds, per script, what its quick run's output must show (keys present, numbers
finite, ratios positive, and what the script does by construction); speed is never asserted.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
SCRIPTS = sorted(p for p in HERE.glob("*.py")
                 if not p.name.startswith(("_", "test_")) and "__main__" in p.read_text())
NOT_RUN = {  # name -> why it is skipped
    "async_accuracy.py": "needs --store of finished runs",
    "gpu_check.py": "GPU only",
    "mixture_seeds.py": "needs --store of finished runs",
}
EXTENDED = {  # quick modes near or over a minute on a busy 2-core CPU: the extended tier (`pytest -m extended`) runs them
    # (seconds quiet, speed probe 0.30 s / with other work on the 2 cores)
    "grpo_vs_trl.py",  # four children (ours x3, TRL): 53 / ~170 s
    "async_vs_sync.py",  # the default's data, 2 SFT steps, two GRPO children: 30 / ~110 s
    "plan_vs_measured.py",  # a process and a 2-rank torchrun: 22 / ~80 s
    "rejection_throughput.py",  # a vLLM engine on CPU: 12 / ~90 s
    "tool_seeds.py",  # two toy `r1 run`s of configs/tiny-tools.yaml (with tools and without): 150 s busy
}
NEEDS_DATA = {"reward_throughput.py", "verify_agreement.py"}  # read ../shared/data (skipped where it is absent)


def json_lines(stdout: str) -> list[dict[str, Any]]:
    """The JSON objects a script printed, one a line, in order (other lines skipped)."""
    out = []
    for line in stdout.splitlines():
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


def finite(value: Any, *, positive: bool = False) -> float:
    assert isinstance(value, (int, float)) and not isinstance(value, bool), f"not a number: {value!r}"
    assert math.isfinite(value), f"not finite: {value!r}"
    assert value > 0 or not positive, f"not positive: {value!r}"
    return float(value)


def check_async_vs_sync(lines: list[dict[str, Any]]) -> None:
    out = lines[-1]
    finite(out["async_speedup"], positive=True)
    finite(out["bound"], positive=True)
    assert out["best_sync"] == "sync_t1"  # the only synchronous configuration of --quick
    for run in ("sync_t1", "async"):
        r = out["runs"][run]
        finite(r["s_per_step"], positive=True)
        assert r["steps_measured"] >= 1 and r["completion_length"] > 0
    assert out["runs"]["async"]["sampler_generate_s"] > 0  # the asynchronous run generated in its sampler


def check_grpo_vs_trl(lines: list[dict[str, Any]]) -> None:
    out = lines[-1]
    for key in ("same_backend_speedup", "best_backend_speedup", "peak_rss_ratio"):
        finite(out[key], positive=True)
    runs = out["per_workload"]["chain"]["base"]["runs"]
    assert {"ours_hf", "trl_hf", "ours_async"} <= set(runs)
    for r in runs.values():
        finite(r["s_per_step"], positive=True)
        finite(r["train_gflops"], positive=True)
    assert runs["ours_hf"]["rollout_cpu_s"] > 0  # its sampling is timed (the patched generate_groups ran)


def check_fetch_verify_cost(lines: list[dict[str, Any]]) -> None:
    out = lines[-1]
    assert set(out["rows"]) == {"base_model", "train.parquet", "cold_start.parquet", "eval.parquet"}
    for r in out["rows"].values():
        assert r["bytes"] > 0
        for key in ("plain", "verified", "hashing", "cached"):
            finite(r[key])
    finite(out["run_extra_s"])


def check_countdown_aha(lines: list[dict[str, Any]]) -> None:
    out = lines[-1]
    for stage in ("cold_start", "grpo"):
        assert 0 <= out[stage]["accuracy"] <= 1 and 0 <= out[stage]["reflection_rate"] <= 1
        finite(out[stage]["mean_length_sampled"], positive=True)
    for key in ("train_reflection_fifths", "train_length_fifths", "train_reward_fifths"):
        assert len(out[key]) == 5 and all(math.isfinite(v) for v in out[key])
    assert out["wall_s"]["total"] >= 0


def check_general_rl(lines: list[dict[str, Any]]) -> None:
    out = lines[-1]
    assert out["quick"] is True and out["steps"] == 2 and 0 <= out["rm_pair_acc"] <= 1
    for when in ("before", "after"):
        for source in ("", "helpful/", "unsafe/"):
            finite(out[when][f"eval/{source}rm_score"])
            assert 0 <= out[when][f"eval/{source}preferred_rate"] <= 1


def check_logprob_memory(lines: list[dict[str, Any]]) -> None:
    out = lines[-1]
    for key in ("memory_ratio", "time_ratio", "wall_time_ratio", "naive_pass_peak_mib", "chunked_pass_peak_mib"):
        finite(out[key], positive=True)
    assert out["chunk_size"] == 128
    assert out["same_logps"] is True  # the chunked pass gives the naive pass's log-probs


def check_sft_memory(lines: list[dict[str, Any]]) -> None:
    out = lines[-1]
    for key in ("memory_ratio", "time_ratio", "old_pass_peak_mib", "chunked_pass_peak_mib"):
        finite(out[key], positive=True)
    assert out["same_loss"] is True and out["same_grads"] is True  # the chunked loss is the full-logits loss


def check_plan_vs_measured(lines: list[dict[str, Any]]) -> None:
    assert {(r["ranks"], r["strategy"]) for r in lines} == {(1, "single"), (2, "fsdp")}
    for r in lines:
        assert r["model"] == "10m" and r["params"] > 10_000_000
        finite(r["predicted_total_mib"], positive=True)
        finite(r["measured_mib"], positive=True)
        assert 0.5 < finite(r["ratio"]) < 2, r  # the planner is not off by a factor (README: 0.97-1.11)


def check_rejection_throughput(lines: list[dict[str, Any]]) -> None:
    out = lines[-1]
    assert out["prompts"] == 32 and out["samples"] == 2
    assert out["samples_per_run"] == [64, 64, 64]  # raw, the stage and its fixed batches: every sample of every prompt
    for key in ("ratio", "chunked_ratio"):
        finite(out[key], positive=True)
    for key in ("raw_samples_per_s", "ours_samples_per_s", "chunked_samples_per_s", "raw_tokens_per_s"):
        assert len(out[key]) == 1 and finite(out[key][0], positive=True)


def check_reward_throughput(lines: list[dict[str, Any]]) -> None:
    rows = lines[-1]["rows"]
    assert len(rows) == 4
    for r in rows:
        assert r["checks"] == 100
        finite(r["checks_per_s"], positive=True)
        assert 0.4 <= r["mean_reward"] <= 0.6, r  # half the answers are right by construction


def check_verify_agreement(lines: list[dict[str, Any]]) -> None:
    assert len(lines) == 7  # verify_cases, two gold-as-completion sets, four labelled sets
    for r in lines:
        assert r["cases"] == 40
        for who in ("ours", "math_verify"):
            assert 0 <= r[who] <= 1 and r[f"{who}_n"] == round(r[who] * r["cases"])


def check_tool_seeds(lines: list[dict[str, Any]]) -> None:
    out = lines[-1]
    assert out["quick"] and out["seeds"] == 1 and len(out["rows"]) == 1
    [row] = out["rows"]
    for key in ("greedy", "pass@1", "control_greedy"):
        assert len(row[key]) == 3 and all(0 <= v <= 1 for v in row[key]), (key, row[key])
    assert all(0 <= v <= 1 for v in row["call_rate"] + row["call_rate_sampled"])
    finite(row["wall_s"], positive=True)
    finite(row["control_wall_s"], positive=True)
    finite(row["probe_s_per_step"], positive=True)
    assert out["passes"] == int(row["passes"])


CHECKS: dict[str, Callable[[list[dict[str, Any]]], None]] = {
    "async_vs_sync.py": check_async_vs_sync,
    "grpo_vs_trl.py": check_grpo_vs_trl,
    "fetch_verify_cost.py": check_fetch_verify_cost,
    "countdown_aha.py": check_countdown_aha,
    "general_rl.py": check_general_rl,
    "logprob_memory.py": check_logprob_memory,
    "sft_memory.py": check_sft_memory,
    "plan_vs_measured.py": check_plan_vs_measured,
    "rejection_throughput.py": check_rejection_throughput,
    "reward_throughput.py": check_reward_throughput,
    "verify_agreement.py": check_verify_agreement,
    "tool_seeds.py": check_tool_seeds,
}


def dedicated_test(script: Path) -> str | None:
    """The test file beside it that runs ``script --quick`` and checks its output already (run once, not twice)."""
    for test in sorted(HERE.glob("test_*.py")):
        text = test.read_text()
        if test.name != Path(__file__).name and script.name in text and "--quick" in text:
            return test.name
    return None


def _param(script: Path):  # type: ignore[no-untyped-def]
    covered = dedicated_test(script)
    why = NOT_RUN.get(script.name) or (f"its --quick runs in {covered}" if covered else None)
    marks = [pytest.mark.skip(reason=why)] if why else []
    if script.name in EXTENDED:
        marks.append(pytest.mark.extended)
    return pytest.param(script, id=script.stem, marks=marks)


@pytest.mark.parametrize("script", [_param(s) for s in SCRIPTS])
def test_benchmark_script_runs_in_quick_mode(script: Path, request: pytest.FixtureRequest) -> None:
    assert "--quick" in script.read_text(), f"{script.name}: add a --quick flag (see {Path(__file__).name}'s docstring)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    if script.name in NEEDS_DATA:
        env["R1_SHARED_DATA"] = str(request.getfixturevalue("shared_data"))
    proc = subprocess.run([sys.executable, str(script), "--quick"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900 if script.name in EXTENDED else 300)
    assert proc.returncode == 0, f"{script.name} --quick failed:\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip(), f"{script.name} --quick printed nothing"
    if script.name in CHECKS:
        lines = json_lines(proc.stdout)
        assert lines, f"{script.name} --quick printed no JSON line:\n{proc.stdout[-2000:]}"
        CHECKS[script.name](lines)


def test_scripts_are_discovered() -> None:
    names = {s.name for s in SCRIPTS}
    assert {"checkpoint_memory.py", "fsdp_load_memory.py"} <= names
    assert dedicated_test(HERE / "checkpoint_memory.py") == "test_checkpoint_memory.py"
    assert not (set(NOT_RUN) | EXTENDED | set(CHECKS) | NEEDS_DATA) - names, "a list here names a script that is gone"
    unchecked = {s.name for s in SCRIPTS} - set(NOT_RUN) - set(CHECKS) - {s.name for s in SCRIPTS if dedicated_test(s)}
    assert not unchecked, f"{sorted(unchecked)}: add what the quick run's output must show to CHECKS"


def test_a_failed_child_is_an_error_not_a_number(tmp_path: Path) -> None:
    """``_child``: a child that fails comes back as its error, and a benchmark with one exits 1 naming it."""
    sys.path.insert(0, str(HERE))
    try:
        import _child
    finally:
        sys.path.remove(str(HERE))
    failing = tmp_path / "failing.py"
    failing.write_text("import sys\nsys.exit('no rows for source countdown')\n")
    result = _child.launch(str(failing), {"threads": 1}, timeout=60)
    assert result["error"].startswith("exit 1:") and "no rows for source countdown" in result["error"]
    with pytest.raises(SystemExit) as e:
        _child.exit_if_failed({"sync_t1 round 0": result["error"]})
    assert e.value.code != 0 and "sync_t1 round 0" in str(e.value.code) and "countdown" in str(e.value.code)
    _child.exit_if_failed({})  # nothing failed: returns
    with pytest.raises(SystemExit) as e:
        _child.run_json([sys.executable, str(failing)], what="naive child")
    assert "naive child failed (exit 1)" in str(e.value.code) and "countdown" in str(e.value.code)
    assert _child.run_json([sys.executable, "-c", "print('x'); print('{\"a\": 1}')"]) == {"a": 1}
