# python tests/benchmarks/grpo_vs_trl.py --threads 1 --steps 6 --rounds 2
"""This project's GRPO trainer against TRL's ``GRPOTrainer`` on the same work, side by side.

Same for both: a tiny local model (``grpo_core.models.tiny.build_tiny_model``: the embedded default, hidden 128
x 4 layers, ~0.9M parameters, and one 4x wider), the prompts and reward (plain TRL-contract functions) of
two workloads: ``chain`` (the embedded default's task, ``grpo_core.data.synthetic``: ~9-token prompts,
``chain_accuracy``) and ``gsm8k`` (the last 120 characters of GSM8K test questions read from ``--gsm8k``:
~120-token prompts, the length a real tokenizer gives a GSM8K prompt; reward: share of digits), 8 prompts x
G=8 completions x 32 new tokens per step,
temperature 1, beta 0.04 (so both run a reference model), loss_type "grpo", one optimiser step per
generation round on one 64-sequence micro-batch, fp32, no gradient checkpointing (TRL's defaults bf16=True
and gradient_checkpointing=True are switched off: both only cost time on a CPU), no saving, no reporting,
and the same torch thread count (``--threads``, also OMP_NUM_THREADS).

Each (workload, model, trainer, backend) runs in a fresh child process (so its peak RSS, ``ru_maxrss``, is its own); the
configurations are interleaved (round r runs ours/TRL in alternating order) so load changes on the shared
machine hit both alike. A child runs ``--steps`` steps; its first step (warm-up: lazy init, vLLM graph
capture) is excluded. Reported: median seconds and CPU-seconds (user+sys, all threads) per step, the split
generate/reward/train, peak RSS, and the achieved GFLOP rate of the training passes (policy forward+backward
6*P*tokens, reference forward 2*P*tokens, TRL's vLLM path adds an old-log-prob forward 2*P*tokens) per
CPU-second of the step's training share (step CPU minus sampling+scoring CPU) against the CPU-time rate of a
big fp32 matmul at the same thread count (both per CPU-second, so other processes' load cancels out). "The
work" counts every sequence's prompt + completion (what TRL executes); this trainer runs a shared prompt once
per group (``share_prompt_forward``), so its "executed" FLOPs count each prompt once.

``ours_async`` is this trainer with ``async_rollouts: true`` (transformers sampling in a sampler process one step
behind, pinned to a core of its own; the trainer keeps ``--threads``, capped at the cores left): it uses one more
core than the others, as the asynchronous configuration does on the 2-core machine, its last step (training
only: nothing left to generate) is excluded like the warm-up, and its CPU-seconds leave out the sampler
process's (only the trainer's are counted).

Comparisons: same backend (ours with transformers sampling vs TRL use_vllm=False), best backend (the best of
ours with transformers sampling, colocated vLLM and asynchronous rollouts vs TRL's best that runs here), and
peak RSS with the same backend. Speedups are ratios of
steps/s (TRL s/step / ours s/step); ``*_cpu_speedup`` uses CPU-seconds, steadier on a shared CPU. The
top-level numbers are the embedded default's (chain prompts, base model); ``per_workload`` holds every
(workload, model). The last line is JSON. A run that fails (TRL's colocated vLLM aside: a probe, tried until it
fails once and reported as ``trl_vllm``) makes the script exit 1 after it, naming the run, so a speedup never goes
missing unnoticed. ``--quick``: the base model on chain prompts, 3 steps, one round, no TRL vLLM probe (a smoke
run; ``tests/benchmarks/test_benchmark_scripts.py`` runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _child import exit_if_failed, launch

NUM_PROMPTS, NUM_GENERATIONS, MAX_COMPLETION_LENGTH = 8, 8, 32
BETA, LEARNING_RATE, SEED = 0.04, 5e-5, 0
MODELS = {"base": {"hidden_size": 128, "num_heads": 4}, "wide": {"hidden_size": 512, "num_heads": 8}}
RUNS = ("ours_hf", "trl_hf", "ours_vllm", "trl_vllm", "ours_async")


def cpu_seconds() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


class StepClock:
    """Wall and CPU time between consecutive step ends, with the step's phase times and token count."""

    def __init__(self) -> None:
        self.last = (time.perf_counter(), cpu_seconds())
        self.steps: list[dict[str, float]] = []

    def tick(self, phases: dict[str, float]) -> None:
        now = (time.perf_counter(), cpu_seconds())
        self.steps.append({"wall": now[0] - self.last[0], "cpu": now[1] - self.last[1], **phases})
        self.last = now


GSM8K_DEFAULT = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k_test.jsonl"
GSM8K_PROMPT_CHARS = 120  # the question's last 120 characters: ~120 byte-level tokens, a real tokenizer's GSM8K prompt


def digit_share(completions, **kwargs) -> list[float]:
    """Share of a completion's characters that are digits (TRL contract): varies across a random model's samples."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]


def workload(spec: dict[str, Any]) -> tuple[list[dict[str, Any]], Any, int]:
    """Rows, reward function and this trainer's ``max_prompt_length`` (no truncation: both see the same prompts)."""
    if spec["workload"] == "chain":  # the embedded default's task: ~9-token prompts
        from grpo_core.data.synthetic import chain_accuracy, make_chain_rows

        return make_chain_rows(256, seed=SEED), chain_accuracy, 64
    with open(spec["gsm8k_path"]) as f:  # GSM8K questions: ~120-token prompts
        questions = [json.loads(line)["question"] for line in f][:256]
    rows = [{"prompt": [{"role": "user", "content": q[-GSM8K_PROMPT_CHARS:]}]} for q in questions]
    return rows, digit_share, 256


def run_ours(spec: dict[str, Any], clock: StepClock) -> dict[str, Any]:
    from grpo_core.config import GRPOConfig
    from grpo_core.trainer.loop import train_grpo

    rows, reward, max_prompt_length = workload(spec)
    config = GRPOConfig(
        num_generations=NUM_GENERATIONS, generation_batch_size=NUM_PROMPTS * NUM_GENERATIONS,
        max_completion_length=MAX_COMPLETION_LENGTH, max_prompt_length=max_prompt_length, temperature=1.0,
        beta=BETA, loss_type="grpo", scale_rewards="group", epsilon=0.2,
        learning_rate=LEARNING_RATE, lr_scheduler_type="constant", adam_beta2=0.999, max_grad_norm=1.0,
        max_steps=spec["steps"], per_device_train_batch_size=NUM_PROMPTS * NUM_GENERATIONS,
        save_steps=10**6, report_to=[], torch_num_threads=spec["threads"], seed=SEED,
        use_vllm=spec["backend"] == "vllm", async_rollouts=spec["backend"] == "async", reward_funcs=[reward.__name__],
    )

    import grpo_core.trainer.step as step_module  # where the trainer looks generate_groups up

    rollout_cpu = [0.0]
    generate_groups = step_module.generate_groups  # AttributeError (the child fails) if the trainer moved it

    def timed_generate_groups(*args, **kwargs):  # CPU-seconds of sampling + scoring, for the train share
        start = cpu_seconds()
        out = generate_groups(*args, **kwargs)
        rollout_cpu[0] += cpu_seconds() - start
        return out

    step_module.generate_groups = timed_generate_groups

    class Recorder:
        def on_step(self, step: int, max_steps: int, metrics: dict[str, float]) -> None:
            tokens = metrics["tokens_per_second"] * metrics["time/step"]  # prompt + completion tokens of the step
            clock.tick({"generate": metrics["time/generate"], "reward": metrics["time/reward"],
                        "train": metrics["time/train"], "tokens": tokens, "rollout_cpu": rollout_cpu[0],
                        "completion_tokens": metrics["completions/mean_length"] * NUM_PROMPTS * NUM_GENERATIONS})
            rollout_cpu[0] = 0.0

    with tempfile.TemporaryDirectory() as out:
        clock.last = (time.perf_counter(), cpu_seconds())
        train_grpo(config, spec["model_path"], rows, out, reward_funcs=[reward],
                   resume=False, callbacks=[Recorder()])
    return {"old_logp_pass": False,  # one update per generation round: pi_old is the policy's own forward, detached
            "prompt_share": NUM_GENERATIONS if config.share_prompt_forward else 1,
            "train_only_last_step": config.async_rollouts}


def run_trl(spec: dict[str, Any], clock: StepClock) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows, reward, _ = workload(spec)
    use_vllm = spec["backend"] == "vllm"
    phases = {"generate": 0.0, "reward": 0.0, "tokens": 0.0, "completion_tokens": 0.0, "rollout_cpu": 0.0}

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate(self, prompts):  # tokenise, sample, decode
            start, start_cpu = time.perf_counter(), cpu_seconds()
            out = super()._generate(prompts)
            phases["generate"] += time.perf_counter() - start
            phases["rollout_cpu"] += cpu_seconds() - start_cpu
            prompt_ids, completion_ids = out[0], out[1]
            phases["completion_tokens"] += sum(len(c) for c in completion_ids)
            phases["tokens"] += sum(len(p) + len(c) for p, c in zip(prompt_ids, completion_ids))
            return out

        def _calculate_rewards(self, *args, **kwargs):
            start, start_cpu = time.perf_counter(), cpu_seconds()
            out = super()._calculate_rewards(*args, **kwargs)
            phases["reward"] += time.perf_counter() - start
            phases["rollout_cpu"] += cpu_seconds() - start_cpu
            return out

    class Recorder(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            clock.last = (time.perf_counter(), cpu_seconds())

        def on_step_end(self, args, state, control, **kwargs):
            wall_since = time.perf_counter() - clock.last[0]
            train = wall_since - phases["generate"] - phases["reward"]  # ref log-probs, loss, backward, AdamW
            clock.tick({**phases, "train": train})
            phases.update({k: 0.0 for k in phases})

    out = tempfile.mkdtemp()
    args = GRPOConfig(
        output_dir=out, report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
        max_steps=spec["steps"], per_device_train_batch_size=NUM_PROMPTS * NUM_GENERATIONS,
        gradient_accumulation_steps=1, num_generations=NUM_GENERATIONS,
        max_completion_length=MAX_COMPLETION_LENGTH, temperature=1.0,
        beta=BETA, loss_type="grpo", scale_rewards="group", epsilon=0.2,
        learning_rate=LEARNING_RATE, lr_scheduler_type="constant", max_grad_norm=1.0,
        use_cpu=True, bf16=False, gradient_checkpointing=False, seed=SEED, dataloader_num_workers=0,
        model_init_kwargs={"dtype": torch.float32},
        use_vllm=use_vllm, vllm_mode="colocate", vllm_max_model_length=128, vllm_enable_sleep_mode=False,
    )
    torch.set_num_threads(spec["threads"])
    trainer = TimedGRPOTrainer(
        model=spec["model_path"], reward_funcs=[reward], args=args,
        train_dataset=Dataset.from_list(rows), callbacks=[Recorder()],
    )
    torch.set_num_threads(spec["threads"])
    trainer.train()
    return {"old_logp_pass": use_vllm and args.vllm_importance_sampling_correction}


def run_child(spec: dict[str, Any]) -> None:
    import torch

    torch.set_num_threads(spec["threads"])
    clock = StepClock()
    extra = (run_ours if spec["trainer"] == "ours" else run_trl)(spec, clock)
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print("RESULT " + json.dumps({"steps": clock.steps, "peak_rss_mib": peak_rss_mib,
                                  "threads": torch.get_num_threads(), **extra}), flush=True)


def measure_matmul_peak(threads: int, n: int = 1024, repeats: int = 10) -> float:
    """Best fp32 GFLOP per CPU-second of an ``n x n`` matmul at ``threads`` threads (CPU time, not wall: on
    a shared machine wall time counts other processes' turns)."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        torch.mm(a, b)
        best = min(best, time.process_time() - start)
    return 2 * n**3 / best / 1e9


def build_models(root: Path) -> dict[str, dict[str, Any]]:
    from transformers import AutoConfig, AutoModelForCausalLM

    from grpo_core.models.tiny import build_tiny_model, count_parameters

    out = {}
    for name, shape in MODELS.items():
        path = build_tiny_model(root / name, seed=SEED, num_layers=4, **shape)
        params = count_parameters(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path)))
        out[name] = {"path": str(path), "params": params, **shape}
    return out


def summarise(results: list[dict[str, Any]], params: int, peak_gflops: float) -> dict[str, Any] | None:
    """Medians over the steps of every child of one configuration, warm-up steps dropped."""
    steps = [s for r in results if "steps" in r for s in r["steps"][1:-1 if r.get("train_only_last_step") else None]]
    if not steps:
        return None
    med = lambda key: statistics.median(s[key] for s in steps)  # noqa: E731
    old_pass = any(r.get("old_logp_pass") for r in results)
    train_flops = [(6 + 2 + (2 if old_pass else 0)) * params * s["tokens"] for s in steps]  # policy fwd+bwd, ref, old
    share = max(r.get("prompt_share", 1) for r in results if "steps" in r)  # a prompt runs once per `share` rows
    done_flops = [f * (s["completion_tokens"] + (s["tokens"] - s["completion_tokens"]) / share) / s["tokens"]
                  for f, s in zip(train_flops, steps)]
    gen_flops = [2 * params * s["completion_tokens"] for s in steps]  # ~one forward per sampled token
    # Per CPU-second of the training share of the step (step CPU minus sampling and scoring CPU), and per wall second.
    train_gflops = statistics.median(f / (s["cpu"] - s["rollout_cpu"]) / 1e9 for f, s in zip(train_flops, steps))
    train_gflops_wall = statistics.median(f / s["train"] / 1e9 for f, s in zip(train_flops, steps))
    done_gflops = statistics.median(f / (s["cpu"] - s["rollout_cpu"]) / 1e9 for f, s in zip(done_flops, steps))
    return {
        "s_per_step": med("wall"), "cpu_s_per_step": med("cpu"), "generate_s": med("generate"),
        "reward_s": med("reward"), "train_s": med("train"), "tokens_per_step": med("tokens"),
        "train_cpu_s": statistics.median(s["cpu"] - s["rollout_cpu"] for s in steps),
        "rollout_cpu_s": med("rollout_cpu"), "train_gflops": train_gflops, "train_gflops_wall": train_gflops_wall,
        "train_frac_of_matmul_peak": train_gflops / peak_gflops,
        "train_gflops_executed": done_gflops, "train_executed_frac_of_matmul_peak": done_gflops / peak_gflops,
        "generate_gflops": statistics.median(rates) if (rates := [f / s["generate"] / 1e9 for f, s in zip(gen_flops, steps)
                                                                  if s["generate"] > 0]) else None,  # async: off the step
        "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in results if "steps" in r),
        "steps_measured": len(steps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="base model only, 3 steps, 1 round, no TRL vLLM probe")
    parser.add_argument("--steps", type=int, default=6, help="steps per child, the first is warm-up")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of every configuration")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--models", default="base,wide", help=f"comma list of {list(MODELS)}")
    parser.add_argument("--workloads", default="chain,gsm8k", help="comma list of chain (the embedded default's "
                        "~9-token prompts), gsm8k (~120-token GSM8K questions)")
    parser.add_argument("--gsm8k", default=str(GSM8K_DEFAULT), help="GSM8K jsonl with a question field")
    parser.add_argument("--skip-trl-vllm", action="store_true", help="do not try TRL's colocated vLLM mode")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per child")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return run_child(json.loads(args.child))
    if args.quick:
        args.steps, args.rounds, args.models, args.skip_trl_vllm, args.workloads = 3, 1, "base", True, "chain"
    from grpo_core.generation import vllm_available

    peak = measure_matmul_peak(args.threads)
    load = os.getloadavg()
    print(f"threads={args.threads} steps/child={args.steps} rounds={args.rounds} load avg {load[0]:.1f} "
          f"{load[1]:.1f} {load[2]:.1f} (cores {os.cpu_count()}); fp32 matmul peak {peak:.1f} GFLOP per CPU-s", flush=True)
    root = Path(tempfile.mkdtemp(prefix="grpo_vs_trl_"))
    models = {k: v for k, v in build_models(root).items() if k in args.models.split(",")}
    workloads = args.workloads.split(",")
    if "gsm8k" in workloads and not Path(args.gsm8k).is_file():
        print(f"gsm8k workload skipped: {args.gsm8k} not found (--gsm8k PATH)", flush=True)
        workloads.remove("gsm8k")
    runs = ["ours_hf", "trl_hf"] + (["ours_vllm"] if vllm_available() else []) + ["ours_async"]
    trl_vllm_error = "not tried (--skip-trl-vllm)" if args.skip_trl_vllm else None
    if not vllm_available():
        trl_vllm_error = "vllm not installed"
    results: dict[tuple[str, str, str], list[dict]] = {}
    print(f"{'prompts':<7} {'model':<5} {'run':<9} {'rnd':>3} {'s/step':>7} {'cpu s':>7} {'gen s':>6} {'train s':>7} {'RSS MiB':>8}")
    for rnd in range(args.rounds):
        for work in workloads:
            for model, info in models.items():
                order = list(runs if rnd % 2 == 0 else reversed(runs))
                if trl_vllm_error is None:  # tried until it fails once
                    order.append("trl_vllm")
                for run in order:
                    trainer, backend = run.split("_")
                    spec = {"trainer": trainer, "backend": backend, "model_path": info["path"], "steps": args.steps,
                            "threads": args.threads, "workload": work, "gsm8k_path": args.gsm8k}
                    r = launch(str(Path(__file__).resolve()), spec, args.timeout)
                    results.setdefault((work, model, run), []).append(r)
                    if "error" in r:
                        print(f"{work:<7} {model:<5} {run:<9} {rnd:>3} failed: {r['error']}", flush=True)
                        if run == "trl_vllm":
                            trl_vllm_error = r["error"]
                        continue
                    s = r["steps"][1:]
                    med = lambda k: statistics.median(x[k] for x in s)  # noqa: E731
                    print(f"{work:<7} {model:<5} {run:<9} {rnd:>3} {med('wall'):>7.2f} {med('cpu'):>7.2f} "
                          f"{med('generate'):>6.2f} {med('train'):>7.2f} {r['peak_rss_mib']:>8.0f}", flush=True)

    per_workload: dict[str, dict[str, Any]] = {}
    for work in workloads:
        per_model = per_workload.setdefault(work, {})
        for model, info in models.items():
            per_model[model] = entry = compare(
                {run: summarise(results.get((work, model, run), []), info["params"], peak) for run in RUNS}
            )
            entry.update(params=info["params"], hidden_size=info["hidden_size"])
            report(work, model, info, entry)

    head_work = "chain" if "chain" in per_workload else next(iter(per_workload))
    head_model = "base" if "base" in models else next(iter(models))
    head = per_workload[head_work][head_model]
    print(json.dumps({
        "same_backend_speedup": head.get("same_backend_speedup"),
        "best_backend_speedup": head.get("best_backend_speedup"),
        "best_backend": head.get("best_backend"),
        "peak_rss_ratio": head.get("peak_rss_ratio"),
        "workload": head_work, "model": head_model,
        "trl_vllm": "ok" if trl_vllm_error is None and any(k[2] == "trl_vllm" for k in results) else trl_vllm_error,
        "threads": args.threads, "matmul_peak_gflops": peak, "load_avg_start": load, "load_avg_end": os.getloadavg(),
        "per_workload": per_workload,
    }))
    # TRL's colocated vLLM is a probe (tried until it fails once, reported as "trl_vllm"); any other run must run
    exit_if_failed({f"{work}/{model}/{run} round {rnd}": r["error"] for (work, model, run), rs in results.items()
                    if run != "trl_vllm" for rnd, r in enumerate(rs) if "error" in r})


def compare(summary: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    """Speedups (TRL s/step / ours s/step) and the RSS ratio from one (workload, model)'s run summaries."""
    summary = {k: v for k, v in summary.items() if v is not None}
    ours = {k: v for k, v in summary.items() if k.startswith("ours")}
    trl = {k: v for k, v in summary.items() if k.startswith("trl")}
    entry: dict[str, Any] = {"runs": summary}
    if "ours_hf" in summary and "trl_hf" in summary:
        entry["same_backend_speedup"] = summary["trl_hf"]["s_per_step"] / summary["ours_hf"]["s_per_step"]
        entry["same_backend_cpu_speedup"] = summary["trl_hf"]["cpu_s_per_step"] / summary["ours_hf"]["cpu_s_per_step"]
        entry["peak_rss_ratio"] = summary["ours_hf"]["peak_rss_mib"] / summary["trl_hf"]["peak_rss_mib"]
    if ours and trl:
        best_ours = min(ours, key=lambda k: ours[k]["s_per_step"])
        best_trl = min(trl, key=lambda k: trl[k]["s_per_step"])
        entry["best_backend"] = {"ours": best_ours, "trl": best_trl}
        entry["best_backend_speedup"] = trl[best_trl]["s_per_step"] / ours[best_ours]["s_per_step"]
        entry["best_backend_cpu_speedup"] = trl[best_trl]["cpu_s_per_step"] / ours[best_ours]["cpu_s_per_step"]
    return entry


def report(work: str, model: str, info: dict[str, Any], entry: dict[str, Any]) -> None:
    print(f"\n{work} prompts, {model}: {info['params'] / 1e6:.2f}M params, hidden {info['hidden_size']}")
    for run, v in entry["runs"].items():
        print(f"  {run:<9} {v['s_per_step']:.2f} s/step  {v['cpu_s_per_step']:.2f} cpu-s/step  "
              f"(wall: generate {v['generate_s']:.2f}, reward {v['reward_s']:.3f}, train {v['train_s']:.2f}; "
              f"cpu: rollout {v['rollout_cpu_s']:.2f}, train {v['train_cpu_s']:.2f}), {v['tokens_per_step']:.0f} tokens\n"
              f"            training passes: the work at {v['train_gflops']:.1f} GFLOP per CPU-s "
              f"({v['train_gflops_wall']:.1f} per wall s); executed {v['train_gflops_executed']:.1f} GFLOP per CPU-s = "
              f"{100 * v['train_executed_frac_of_matmul_peak']:.0f}% of matmul peak; "
              f"generate {v['generate_gflops'] or 0:.2f} GFLOP/s, peak RSS {v['peak_rss_mib']:.0f} MiB")
    for key in ("same_backend_speedup", "same_backend_cpu_speedup", "best_backend_speedup",
                "best_backend_cpu_speedup", "peak_rss_ratio"):
        if key in entry:
            print(f"  {key}: {entry[key]:.2f}")


if __name__ == "__main__":
    main()
