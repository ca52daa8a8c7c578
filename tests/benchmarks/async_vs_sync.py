# python tests/benchmarks/async_vs_sync.py [--store DIR --run NAME] [--steps 8] [--rounds 2] [--quick]
"""The embedded default's GRPO stage synchronous against asynchronous (``async_rollouts``) on the same 2 cores.

Work: configs/tiny-cpu.yaml's ``grpo_train`` section as the stage gets it (``trainer_config``): its mixture of 6
chain + 14 countdown prompts a step x G=8 x up to 64 new tokens, each source scored by its own reward, beta 0.04,
packed micro-batches, transformers sampling. Its inputs are the cold-start SFT model and the training rows of a
finished embedded-default run (``--store DIR --run NAME``: its newest ``cold_start_sft`` model and
``prepare_data`` train.parquet), or, without ``--store``, built here as the stages build them: the default's
``data`` section through ``grpo_core.recipe.prepare.prepare_datasets`` (every source's training rows, chain and
countdown among them, and its cold-start set), then ``--sft-steps`` cold-start SFT steps on the tiny-cpu model
shape, not pretrained (completions then stop early as the stage's do, rather than running to the cap as a random
model's do).

Configurations, each in a fresh child process (``--steps`` GRPO steps, no checkpoints, no reporting):
``sync_t1`` and ``sync_t2`` (the synchronous stage at 1 and 2 torch threads: its best is the baseline) and
``async`` (``async_rollouts: true``: the trainer at 1 thread, the sampler process at ``async_sampler_threads``
1, each pinned to a core of its own by ``grpo_core.generation.process``; the sampler also computes the reference
log-probs) and ``async_ref_trainer`` (the same with ``async_reference_on_sampler: false``: the trainer runs the
reference forward, as before). Rounds are interleaved (in order, then reversed) so load from other processes hits
every configuration alike. ``sampler gen s`` / ``sampler ref s``: the sampler process's own seconds per step.

s/step is the median wall time between consecutive step ends over steps 2..N-1 of every child: step 1 is
warm-up (and, asynchronous, generates its own rollouts: nothing ran before it), and the asynchronous run's last
step has no next step to generate for (it is only training), so both ends are dropped for every
configuration. ``bound`` is what overlap alone can give on the synchronous 1-thread split, with the reference
forward (``time/reference``, part of the synchronous ``time/train``) moved to the sampler's side as ``async``
does: (generate + train) / max(generate + reference, train - reference); ``bound_ref_trainer`` is the same for
``async_ref_trainer`` (the reference stays with the trainer): (generate + train) / max(generate, train). The
last line is JSON with ``async_speedup`` = best sync s/step / async s/step. Not a test: numbers depend on the
machine and its load.

A child that fails makes the script exit 1, naming it, after the JSON line of what did run (so no run passes
with ``async_speedup`` missing). ``--quick``: the same code path at tiny sizes (2 SFT steps, 3 GRPO steps of 2
prompts, one chain and one countdown, x 8 completions of up to 8 tokens, ``sync_t1`` and ``async`` only, one
round, no contention loops). Its numbers mean nothing; ``tests/benchmarks/test_benchmark_scripts.py`` runs it.

Overlap pays only as far as the two cores are independent. ``core_contention`` measures that: two one-thread
loops of the tiny model's matrix products, each pinned to a core of its own, run together, against each alone
(mean slowdown; 1.0 = independent cores, 2.0 = one core's worth of arithmetic shared by two). Then
``bound_contended`` = best sync s/step / (max(generate + reference, train - reference) x core_contention): the
async speedup this machine allows once both sides run at the contended speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _child import REPO, exit_if_failed, launch

CONFIG = REPO / "configs" / "tiny-cpu.yaml"
RUNS = ("sync_t1", "sync_t2", "async", "async_ref_trainer")


def stage_inputs(args: argparse.Namespace, work: Path) -> tuple[Path, Path]:
    """(cold-start model folder, training rows parquet): from a finished run in ``--store``, else built here."""
    if args.store:
        from tasks.storage.store import Store

        store = Store(args.store, check=False)
        sft, data = store.latest(args.run, "cold_start_sft"), store.latest(args.run, "prepare_data")
        if sft is None or data is None:
            raise SystemExit(f"{args.store}/{args.run} has no committed cold_start_sft and prepare_data; run "
                             f"`r1 run --run {args.run} --store {args.store}` first, or leave out --store")
        return (store.get_output(sft, "model", work / "cold_start_model"),
                store.get_output(data, "train.parquet", work / "train.parquet"))
    from grpo_core.data.rows import write_parquet
    from grpo_core.models.tiny import build_tiny_model
    from grpo_core.recipe.prepare import prepare_datasets
    from grpo_core.trainer.sft import train_sft
    from tasks.config.pipeline import load_config
    from tasks.config.training_spec import trainer_config

    cfg = load_config(CONFIG)
    data = prepare_datasets(cfg.data)  # the prepare_data stage's rows: every source the GRPO mixture names
    base = build_tiny_model(work / "base", **cfg.model.tiny.architecture())
    sft_cfg = trainer_config("sft", cfg.cold_start_sft, torch_num_threads=2).model_copy(
        update={"max_steps": args.sft_steps, "save_steps": 10**6, "report_to": []})
    start = time.perf_counter()
    result = train_sft(sft_cfg, base, data.cold_start, work / "sft", resume=False)
    print(f"cold-start SFT: {args.sft_steps} steps on {len(data.cold_start)} rows in "
          f"{time.perf_counter() - start:.0f} s", flush=True)
    return Path(result.get("final_path") or work / "sft" / "final"), write_parquet(data.train, work / "train.parquet")


def run_child(spec: dict[str, Any]) -> None:
    """One configuration: the tiny-cpu GRPO section for ``steps`` steps; prints the per-step times."""
    from grpo_core.config import GRPOConfig
    from grpo_core.data.rows import read_parquet
    from grpo_core.trainer.loop import train_grpo
    from tasks.config.pipeline import load_config
    from tasks.config.training_spec import trainer_config

    stage = trainer_config("grpo", load_config(CONFIG).grpo_train, torch_num_threads=spec["threads"])
    section = stage.model_dump(mode="json", exclude_unset=True)  # what the stage sets, to change before validation
    if spec.get("quick"):  # tiny steps: 2 prompts (one a source) x G=8, up to 8 tokens
        section.update(generation_batch_size=16, per_device_train_batch_size=16)
        section["sampling"] = {**section["sampling"], "max_completion_length": 8}
    config = GRPOConfig(**{**section, "max_steps": spec["steps"], "save_steps": 10**6, "report_to": [],
                           "torch_num_threads": spec["threads"], "async_rollouts": spec["async"],
                           "async_reference_on_sampler": spec.get("ref_on_sampler", True)})
    steps: list[dict[str, float]] = []
    last = [time.perf_counter()]

    class Recorder:
        def on_step(self, step: int, max_steps: int, metrics: dict[str, float]) -> None:
            now = time.perf_counter()
            steps.append({"wall": now - last[0], "generate": metrics["time/generate"], "train": metrics["time/train"],
                          "reference": metrics["time/reference"],
                          "wait_sampler": metrics.get("time/wait_sampler", 0.0),
                          "sampler_generate": metrics.get("time/sampler_generate", 0.0),
                          "sampler_reference": metrics.get("time/sampler_reference", 0.0),
                          "length": metrics["completions/mean_length"]})
            last[0] = now

    rows = read_parquet(spec["rows_path"])
    with tempfile.TemporaryDirectory() as out:
        last[0] = time.perf_counter()
        train_grpo(config, spec["model_path"], rows, out, resume=False, callbacks=[Recorder()])
    print("RESULT " + json.dumps({"steps": steps}), flush=True)


def measured(results: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Steps 2..N-1 of every child (warm-up and the asynchronous run's train-only last step dropped)."""
    return [s for r in results if "steps" in r for s in r["steps"][1:-1]]


def summarise(results: list[dict[str, Any]]) -> dict[str, float] | None:
    steps = measured(results)
    if not steps:
        return None
    med = lambda key: statistics.median(s[key] for s in steps)  # noqa: E731
    return {"s_per_step": med("wall"), "generate_s": med("generate"), "train_s": med("train"),
            "reference_s": med("reference"),
            "wait_sampler_s": med("wait_sampler"), "sampler_generate_s": med("sampler_generate"),
            "sampler_reference_s": med("sampler_reference"), "completion_length": med("length"), "steps_measured": len(steps)}


_MATMUL_LOOP = """
import os, sys, time, torch
os.sched_setaffinity(0, {int(sys.argv[1])})
torch.set_num_threads(1)
x, w = torch.randn(64 * 40, 128), torch.randn(128, 384)
t = time.perf_counter()
for _ in range(100):
    (x @ w).tanh_() @ w.T
print(time.perf_counter() - t)
"""


def core_contention(repeats: int = 3) -> float:
    """Mean slowdown of a one-thread matrix-product loop on each of cores 0 and 1 when both run at once."""
    def loops(cores: tuple[int, ...]) -> list[float]:
        procs = [subprocess.Popen([sys.executable, "-c", _MATMUL_LOOP, str(c)], stdout=subprocess.PIPE, text=True)
                 for c in cores]
        return [float(p.communicate()[0]) for p in procs]

    alone = [statistics.median(loops((c,))[0] for _ in range(repeats)) for c in (0, 1)]
    together = [loops((0, 1)) for _ in range(repeats)]
    return statistics.mean(statistics.median(t[i] for t in together) / alone[i] for i in (0, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="store of a finished embedded-default run (with --run)")
    parser.add_argument("--run", default="default", help="run name in --store")
    parser.add_argument("--sft-steps", type=int, default=400, help="cold-start SFT steps when no --store is given")
    parser.add_argument("--steps", type=int, default=8, help="GRPO steps per child; the first and last are not measured")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of every configuration")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per child")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, two configurations, one round (a smoke run)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return run_child(json.loads(args.child))
    runs = RUNS
    if args.quick:
        args.sft_steps, args.steps, args.rounds, runs = 2, 3, 1, ("sync_t1", "async")
    if args.steps < 3:
        parser.error("--steps must be at least 3 (the first and last steps are not measured)")
    load = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="async_vs_sync_"))
    model_path, rows_path = stage_inputs(args, work)
    specs = {"sync_t1": {"threads": 1, "async": False}, "sync_t2": {"threads": 2, "async": False},
             "async": {"threads": 1, "async": True},
             "async_ref_trainer": {"threads": 1, "async": True, "ref_on_sampler": False}}
    results: dict[str, list[dict[str, Any]]] = {run: [] for run in RUNS}
    print(f"{'run':<17} {'rnd':>3} {'s/step':>7} {'gen s':>6} {'train s':>7} {'ref s':>5} {'wait s':>6} "
          f"{'sampler gen s':>13} {'sampler ref s':>13}", flush=True)
    for rnd in range(args.rounds):
        for run in (runs if rnd % 2 == 0 else tuple(reversed(runs))):
            spec = {**specs[run], "steps": args.steps, "model_path": str(model_path), "rows_path": str(rows_path),
                    "quick": args.quick}
            r = launch(str(Path(__file__).resolve()), spec, args.timeout)
            results[run].append(r)
            if "error" in r:
                print(f"{run:<17} {rnd:>3} failed: {r['error']}", flush=True)
                continue
            s = summarise([r])
            print(f"{run:<17} {rnd:>3} {s['s_per_step']:>7.2f} {s['generate_s']:>6.2f} {s['train_s']:>7.2f} "
                  f"{s['reference_s']:>5.2f} {s['wait_sampler_s']:>6.2f} {s['sampler_generate_s']:>13.2f} "
                  f"{s['sampler_reference_s']:>13.2f}", flush=True)
    summary = {run: summarise(rs) for run, rs in results.items()}
    sync = {run: v for run, v in summary.items() if run.startswith("sync") and v is not None}
    out: dict[str, Any] = {"runs": summary, "steps_per_child": args.steps, "rounds": args.rounds,
                           "model": f"{args.store}/{args.run}" if args.store else f"built ({args.sft_steps} SFT steps)",
                           "cores": os.cpu_count(), "load_avg_start": load, "load_avg_end": os.getloadavg()}
    if sync:
        best = min(sync, key=lambda k: sync[k]["s_per_step"])
        out["best_sync"] = best
        if summary["async"] is not None:
            out["async_speedup"] = sync[best]["s_per_step"] / summary["async"]["s_per_step"]
        if summary["async_ref_trainer"] is not None:
            out["async_ref_trainer_speedup"] = sync[best]["s_per_step"] / summary["async_ref_trainer"]["s_per_step"]
        if "sync_t1" in sync:
            gen, train, ref = (sync["sync_t1"][k] for k in ("generate_s", "train_s", "reference_s"))
            overlapped = max(gen + ref, train - ref)  # the longer side once the reference pass is the sampler's
            out["bound"] = (gen + train) / overlapped
            out["bound_ref_trainer"] = (gen + train) / max(gen, train)
            if (os.cpu_count() or 1) >= 2 and not args.quick:
                out["core_contention"] = core_contention()
                out["bound_contended"] = sync[best]["s_per_step"] / (overlapped * out["core_contention"])
    print(json.dumps(out))
    exit_if_failed({f"{run} round {rnd}": r["error"] for run, rs in results.items()
                    for rnd, r in enumerate(rs) if "error" in r})


if __name__ == "__main__":
    main()
