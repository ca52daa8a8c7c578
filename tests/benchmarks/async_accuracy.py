# python tests/benchmarks/async_accuracy.py --store /tmp/fin/store --runs mix-seed0 mix-seed1 mix-seed2
"""Issue 15's must-show 2: asynchronous GRPO learns as well as synchronous, per seed.

For each finished embedded-default run in ``--store`` (``r1 run --seed N --run mix-seedN``), the GRPO stage is
trained twice from that run's committed cold-start model on its ``prepare_data`` train set, with the run's own
``grpo_train`` config (from the stage's manifest): once as committed (synchronous) and once with
``async_rollouts: true`` (everything else equal). Each model is then scored on the run's held-out set with the
run's ``evaluate`` config (``grpo_core.evaluation.heldout.evaluate``, as the evaluate stage does; without the
reward model, so ``eval/accuracy`` is the chain task's greedy accuracy). Each training+evaluation runs in a fresh
child process (``_child.launch``), one after the other.

Prints a markdown table (seed, sync and async held-out accuracy, their difference, s/step each, the async run's
mean ``async/staleness`` and mean ``sampling/importance_sampling_ratio/mean``, and the accuracy the store's own
evaluation of the committed GRPO model gives, a check on the synchronous rerun) and one JSON line with
``max_abs_difference`` and ``within_3_points`` (the issue's bar, every seed). ``--steps N`` trains N steps
instead of the config's ``max_steps`` and ``--eval-rows N`` scores N held-out rows per source (a smoke run). Not a test: it takes the stage's time twice per seed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _child import launch


def run_inputs(store: Any, run: str, work: Path) -> dict[str, Any]:
    """The paths and configs one run's comparison needs, fetched from the store."""
    from tasks.config.pipeline import PipelineConfig
    from tasks.stages.evaluate import output_name

    refs = {s: store.latest(run, s) for s in ("prepare_data", "cold_start_sft", "grpo_train")}
    missing = [s for s, ref in refs.items() if ref is None]
    if missing:
        raise SystemExit(f"{store.url}/{run} has no committed {', '.join(missing)}; run `r1 run --run {run} --store "
                         f"{store.url}` first")
    saved = store.read_run_file(run, "config.json")
    if saved is None:
        raise SystemExit(f"{store.url}/{run} has no saved run config (_run/config.json); rerun `r1 run --run {run}`")
    pipeline = PipelineConfig.model_validate(saved["config"])
    grpo = store.manifest(refs["grpo_train"])["config"]["grpo_train"]  # exactly what the committed stage ran
    committed = None
    evaluated = store.latest(run, output_name("grpo_train"))
    if evaluated is not None:
        committed = store.manifest(evaluated).get("metrics", {}).get("eval/accuracy")
    data = work / run / "data"
    return {
        "model_path": str(store.get_output(refs["cold_start_sft"], "model", work / run / "cold_start_model")),
        "train_path": str(store.get_output(refs["prepare_data"], "train.parquet", data / "train.parquet")),
        "eval_path": str(store.get_output(refs["prepare_data"], "eval.parquet", data / "eval.parquet")),
        "grpo": grpo,
        "evaluate": pipeline.evaluate.model_copy(update={"rm_reward": None}).model_dump(mode="json"),
        "seed": pipeline.grpo_train.seed,
        "committed_accuracy": committed,
    }


def run_child(spec: dict[str, Any]) -> None:
    """Train one configuration and evaluate its final model; print ``RESULT {...}``."""
    from grpo_core.config import EvalConfig, GRPOConfig
    from grpo_core.data.rows import read_parquet
    from grpo_core.evaluation.heldout import evaluate
    from grpo_core.trainer.loop import train_grpo

    fields = {**spec["grpo"], "async_rollouts": spec["async"], "report_to": ["jsonl"], "save_steps": 10**6}
    if spec["steps"]:
        fields["max_steps"] = spec["steps"]
    config = GRPOConfig(**fields)
    walls: list[float] = []
    last = [0.0]

    class Recorder:
        def on_step(self, step: int, max_steps: int, metrics: dict[str, float]) -> None:
            now = time.perf_counter()
            walls.append(now - last[0])
            last[0] = now

    with tempfile.TemporaryDirectory() as out:
        last[0] = time.perf_counter()
        train_grpo(config, spec["model_path"], read_parquet(spec["train_path"]), out, resume=False,
                   callbacks=[Recorder()])
        metrics = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
        result = evaluate(EvalConfig(**spec["evaluate"]), Path(out) / "final", read_parquet(spec["eval_path"]))

    def mean(key: str) -> float | None:
        values = [m[key] for m in metrics if key in m]
        return statistics.fmean(values) if values else None

    print("RESULT " + json.dumps({
        "accuracy": result["eval/accuracy"],
        "s_per_step": statistics.median(walls[1:] or walls),  # step 1 warms up
        "staleness": mean("async/staleness"),
        "is_ratio_mean": mean("sampling/importance_sampling_ratio/mean"),
        "steps": len(metrics),
    }), flush=True)


def fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else format(value, pattern)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="store of finished embedded-default runs (required)")
    parser.add_argument("--runs", nargs="+", default=["mix-seed0", "mix-seed1", "mix-seed2"])
    parser.add_argument("--steps", type=int, default=0, help="GRPO steps (0: the run's max_steps)")
    parser.add_argument("--eval-rows", type=int, default=0, help="held-out rows per source (0: the run's "
                        "evaluate.max_rows; a smoke run's shortcut)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each child (the async sampler "
                        "takes one of them)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per child")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # a child gets its spec only
        return run_child(json.loads(args.child))
    if not args.store:
        parser.error("--store is required: the store of finished `r1 run --seed N --run mix-seedN` runs")
    from tasks.storage.store import Store

    store = Store(args.store, check=False)
    work = Path(tempfile.mkdtemp(prefix="async_accuracy_"))
    rows = []
    for run in args.runs:
        inputs = run_inputs(store, run, work)
        results = {}
        for mode in ("sync", "async"):
            spec = {**inputs, "async": mode == "async", "steps": args.steps, "threads": args.threads}
            if args.eval_rows:
                spec["evaluate"] = {**spec["evaluate"], "max_rows": args.eval_rows}
            results[mode] = launch(str(Path(__file__).resolve()), spec, args.timeout)
            if "error" in results[mode]:
                raise SystemExit(f"{run} {mode}: {results[mode]['error']}")
            print(f"{run} {mode}: {json.dumps(results[mode])}", flush=True)
        sync, asyn = results["sync"], results["async"]
        rows.append({"run": run, "seed": inputs["seed"], "sync_accuracy": sync["accuracy"],
                     "async_accuracy": asyn["accuracy"], "difference": asyn["accuracy"] - sync["accuracy"],
                     "sync_s_per_step": sync["s_per_step"], "async_s_per_step": asyn["s_per_step"],
                     "mean_staleness": asyn["staleness"], "is_ratio_mean": asyn["is_ratio_mean"],
                     "committed_accuracy": inputs["committed_accuracy"], "steps": sync["steps"]})
    print("| seed | sync acc | async acc | difference | sync s/step | async s/step | mean staleness | IS ratio mean "
          "| committed GRPO acc |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['seed']} | {r['sync_accuracy']:.1%} | {r['async_accuracy']:.1%} | {100 * r['difference']:+.1f} "
              f"| {r['sync_s_per_step']:.2f} | {r['async_s_per_step']:.2f} | {fmt(r['mean_staleness'], '.2f')} "
              f"| {fmt(r['is_ratio_mean'], '.4f')} | {fmt(r['committed_accuracy'], '.1%')} |")
    worst = max(abs(r["difference"]) for r in rows)
    print(json.dumps({"rows": rows, "max_abs_difference": worst, "within_3_points": worst <= 0.03,
                      "steps": args.steps or None}))


if __name__ == "__main__":
    main()
