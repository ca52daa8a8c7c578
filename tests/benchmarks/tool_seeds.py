# python tests/benchmarks/tool_seeds.py                 (seeds 0 1 2 and their no-tool controls, a temporary store)
# python tests/benchmarks/tool_seeds.py --store /tmp/tools --seeds 0 1 2 5
"""The tool task over seeds (issue 43's must-show 2): configs/tiny-tools.yaml with tools and without.

For each seed, ``r1 run -c configs/tiny-tools.yaml --seed N --run tools-seed<N> --store STORE`` (timed), and its
control: the same config with ``sampling.tools`` (and ``max_turns``) removed from every section that samples
(grpo_train, rejection_sample, final_rl, evaluate), ``--run notools-seed<N>``; the base, the data and the cold start
are the same (a cold-start trace that calls the calculator is still in the SFT set; nothing answers a call). Then
``r1 status --json`` gives each stage's held-out evaluation (100 four-digit sums no training, cold-start or pretraining
row holds): ``eval/accuracy`` (greedy), ``eval/pass@1`` (two samples at temperature 1), and the tool use
``eval/tools/call_rate`` (greedy) and ``call_rate_sampled``, ``calls_per_response_sampled``, ``error_rate_sampled``.

A seed passes (must-show 2) when after GRPO the sampled tool-call rate is at least 50% and at least 5x the cold
start's, greedy held-out accuracy is at least 20 points above the cold start's and at least 15 above the control's
after GRPO. Printed: the table (markdown), the wall of each run beside its speed probe (the base's pretraining
seconds per step, the same work in every run), then one JSON line. Runs already committed in STORE are reused (the
stages are cached), so a rerun only prints the table (its wall is then the cache's, not a run's).

``--quick``: one seed at toy sizes (a few steps a stage), the code path only; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "tiny-tools.yaml"
SAMPLING_SECTIONS = ("grpo_train", "rejection_sample", "final_rl", "evaluate")
STAGES = ("cold_start_sft", "grpo_train", "final_rl")


def without_tools(raw: dict[str, Any]) -> dict[str, Any]:
    """The config with no tool in any section that samples (the control)."""
    out = json.loads(json.dumps(raw))
    for name in SAMPLING_SECTIONS:
        sampling = (out.get(name) or {}).get("sampling") or {}
        sampling.pop("tools", None)
        sampling.pop("max_turns", None)
    return out


def quick(raw: dict[str, Any]) -> dict[str, Any]:
    """Toy sizes: every stage a few steps, small data, so the path runs in a minute or two. Rejection sampling keeps
    any trajectory that ends (pass mark 0: the toy model answers no sum), so consolidation has rows."""
    out = json.loads(json.dumps(raw))
    out["model"]["tiny"]["pretrain"].update(max_steps=40, save_steps=40, warmup_steps=4)
    out["data"]["calc"].update(num_train=40, num_eval=8, cold_start_size=80, pretrain_size=400)
    out["cold_start_sft"].update(max_steps=20, save_steps=20)
    for name in ("grpo_train", "final_rl"):
        out[name].update(max_steps=1, save_steps=1, generation_batch_size=16, per_device_train_batch_size=16)
    out["rejection_sample"].update(max_prompts=8, reward_threshold=0.0)
    out["sft_consolidate"].update(max_steps=1, save_steps=1)
    return out


def measure(config: Path, run: str, seed: int, store: str) -> dict[str, Any]:
    """Run (timed) and read back: per stage the held-out metrics, the seeds, the speed probe."""
    start = time.perf_counter()
    subprocess.run(["r1", "run", "-c", str(config), "--seed", str(seed), "--run", run, "--store", store], check=True)
    wall = time.perf_counter() - start
    status = json.loads(subprocess.run(["r1", "status", run, "--store", store, "--json"], check=True,
                                       capture_output=True, text=True).stdout)
    if set(status["seeds"].values()) != {seed}:
        sys.exit(f"run {run} in {store} was not made with seed {seed} everywhere: {status['seeds']}")
    pretrain = status["stages"]["prepare_data"]["metrics"].get("pretrain/runtime_s", math.nan)
    steps = yaml.safe_load(config.read_text())["model"]["tiny"]["pretrain"]["max_steps"]
    return {"wall_s": wall, "probe_s_per_step": pretrain / steps,
            "eval": {s: status["stages"][s]["metrics"] for s in STAGES}}


def seed_row(seed: int, tools: dict[str, Any], control: dict[str, Any] | None) -> dict[str, Any]:
    """One seed's numbers and its verdict."""
    m = tools["eval"]
    cold, grpo, final = m["cold_start_sft"], m["grpo_train"], m["final_rl"]
    row = {
        "seed": seed,
        "greedy": [cold["eval/accuracy"], grpo["eval/accuracy"], final["eval/accuracy"]],
        "pass@1": [cold["eval/pass@1"], grpo["eval/pass@1"], final["eval/pass@1"]],
        "call_rate": [cold["eval/tools/call_rate"], grpo["eval/tools/call_rate"]],
        "call_rate_sampled": [cold["eval/tools/call_rate_sampled"], grpo["eval/tools/call_rate_sampled"]],
        "calls_per_answer": grpo["eval/tools/calls_per_response_sampled"],
        "tool_errors": grpo["eval/tools/error_rate_sampled"],
        "control_greedy": [control["eval"][s]["eval/accuracy"] for s in STAGES] if control else None,
        "wall_s": tools["wall_s"], "probe_s_per_step": tools["probe_s_per_step"],
        "control_wall_s": control["wall_s"] if control else None,
    }
    rate, cold_rate = row["call_rate_sampled"][1], row["call_rate_sampled"][0]
    row["passes"] = bool(
        rate >= 0.5 and rate >= 5 * cold_rate
        and row["greedy"][1] >= row["greedy"][0] + 0.20
        and (control is None or row["greedy"][1] >= row["control_greedy"][1] + 0.15))
    return row


def table(rows: list[dict[str, Any]]) -> list[str]:
    pct = lambda v: f"{100 * v:.1f}%" if v == v else "-"  # noqa: E731
    lines = ["| seed | held-out greedy: cold start -> GRPO -> final RL | pass@1 | tool-call rate greedy | sampled | "
             "calls per answer | tool errors | no-tool control greedy | wall s (probe s/step) | passes |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        control = " -> ".join(pct(v) for v in r["control_greedy"]) if r["control_greedy"] else "-"
        lines.append(
            f"| {r['seed']} | {' -> '.join(pct(v) for v in r['greedy'])} | "
            f"{' -> '.join(pct(v) for v in r['pass@1'])} | {' -> '.join(pct(v) for v in r['call_rate'])} | "
            f"{' -> '.join(pct(v) for v in r['call_rate_sampled'])} | {r['calls_per_answer']:.2f} | "
            f"{pct(r['tool_errors'])} | {control} | {r['wall_s']:.0f} ({r['probe_s_per_step']:.3f}) | "
            f"{'yes' if r['passes'] else 'no'} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="store root (default: a new temporary folder)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--no-control", action="store_true", help="the runs with tools only")
    parser.add_argument("--quick", action="store_true", help="one seed at toy sizes: the code path only")
    args = parser.parse_args()
    store = args.store or tempfile.mkdtemp(prefix="tool_seeds_")
    Path(store).mkdir(parents=True, exist_ok=True)
    raw = yaml.safe_load(CONFIG.read_text())
    seeds = args.seeds[:1] if args.quick else args.seeds
    if args.quick:
        raw = quick(raw)
    configs = Path(store) / "_configs"
    configs.mkdir(exist_ok=True)
    with_path, control_path = configs / "tiny-tools.yaml", configs / "tiny-tools-no-tools.yaml"
    with_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    control_path.write_text(yaml.safe_dump(without_tools(raw), sort_keys=False))
    rows = []
    for seed in seeds:
        tools = measure(with_path, f"tools-seed{seed}", seed, store)
        control = None if args.no_control else measure(control_path, f"notools-seed{seed}", seed, store)
        rows.append(seed_row(seed, tools, control))
    print("\n".join(table(rows)))
    print(json.dumps({"passes": sum(r["passes"] for r in rows), "seeds": len(rows), "quick": args.quick,
                      "store": store, "rows": rows}))


if __name__ == "__main__":
    main()
