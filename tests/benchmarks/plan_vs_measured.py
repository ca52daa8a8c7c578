# OMP_NUM_THREADS=1 python tests/benchmarks/plan_vs_measured.py      (10m and 100m; then once: --sizes 500m)
"""The memory planner's model-state prediction against the measured peak RSS growth on CPU.

Models: three Qwen2-shaped random-init models (``Qwen2Config``, built with ``from_config``, never
downloaded), fp32, tied embeddings:
  10m:  vocab 32,768, hidden 256, intermediate 768, 4 layers, 4 heads / 2 KV heads (~11.6M parameters)
  100m: vocab 151,936, hidden 512, intermediate 1,536, 8 layers, 8 heads / 2 KV heads (~102M)
  500m: Qwen2.5-0.5B's shape (494M)

Each case runs in fresh processes: 1 process, and 2 ranks under torchrun (gloo) with the trainer's FSDP2
(``grpo_core.trainer.fsdp.shard_model``) and, for the smaller models, its DDP path. Every rank builds the
policy and a frozen reference model (sharded like the policy under FSDP), the trainer's AdamW
(``build_optimizer``) and runs two RL-shaped steps through the trainer's ``optimizer_step`` (gradient
all-reduce under DDP, clipping, AdamW): a no-grad reference forward, a forward + backward of the policy on
one 8-token row (activations are negligible, so the peak is model state), then the step. The second step
runs with AdamW's state allocated, so the peak holds weights, gradients, optimizer state and reference.

Measured: the growth of the kernel's RSS high-water mark over the process's RSS just before the models
were built (``/proc/self/clear_refs``, tests/benchmarks/_memory.py), the largest over the ranks. Predicted:
``grpo_core.plan.memory.model_state_bytes(shape, strategy, ranks, device="cpu", reference=True)``.
One JSON line per case: predicted components, predicted total, measured, ratio (measured / predicted;
target within 25%). A case whose process fails ends the script with exit 1, naming the case (its stderr is
above). ``--quick``: the 10m model, 1 process and 2 ranks under FSDP (DDP left out), about a minute on 2 cores;
``tests/benchmarks/test_benchmark_scripts.py`` runs it and checks every line's keys and numbers.

Measured on this project's 2-core CPU (MiB predicted / measured, ratio):
  10m:  1 process 284 / 293 (1.03); 2 ranks FSDP 260 / 288 (1.11); 2 ranks DDP 284 / 290 (1.02)
  100m: 1 process 2,538 / 2,605 (1.03); 2 ranks FSDP 2,330 / 2,406 (1.03); 2 ranks DDP 2,538 / 2,612 (1.03)
  500m: 1 process 10,462 / 10,613 (1.01); 2 ranks FSDP 7,162 / 6,976 (0.97) (run once; DDP not run, ~22 GB)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _memory import read_status_kib, reset_peak_rss

ROOT = Path(__file__).resolve().parents[2]
SHAPES = {
    "10m": dict(vocab_size=32768, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2),
    "100m": dict(vocab_size=151936, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                 num_attention_heads=8, num_key_value_heads=2),
    "500m": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2),
}


def qwen2_config(size: str):
    from transformers import Qwen2Config

    return Qwen2Config(**SHAPES[size], tie_word_embeddings=True, max_position_embeddings=4096)


def child(size: str, strategy: str, out: Path) -> None:
    """One rank: a warm-up on a tiny model of the same class (kernels, allocator arenas, gloo buffers), then
    the measured run; writes this rank's peak growth (KiB) to ``out``-rank.json."""
    import gc

    import torch
    from transformers import Qwen2Config

    from grpo_core.trainer.distributed import init_distributed

    torch.set_num_threads(1)
    ctx = init_distributed()
    fsdp = strategy == "fsdp" and ctx.enabled
    tiny = Qwen2Config(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    two_steps(tiny, ctx, fsdp)
    gc.collect()
    baseline = reset_peak_rss()
    two_steps(qwen2_config(size), ctx, fsdp)
    peak_kib = read_status_kib("VmHWM") - baseline
    Path(f"{out}-{ctx.rank}.json").write_text(json.dumps({"rank": ctx.rank, "peak_kib": peak_kib}))


def two_steps(config, ctx, fsdp: bool) -> None:
    """Policy + frozen reference (sharded under FSDP), the trainer's AdamW, two steps of the trainer's update."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_core.config import OptimConfig
    from grpo_core.trainer.fsdp import shard_model
    from grpo_core.trainer.optim import build_optimizer, build_scheduler
    from grpo_core.trainer.skeleton import optimizer_step

    optim_config = OptimConfig(learning_rate=1e-4, lr_scheduler_type="constant")
    torch.manual_seed(0)
    ids = torch.randint(config.vocab_size, (1, 8))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if fsdp:
        model = shard_model(model, ctx)
    ref = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval().requires_grad_(False)
    if fsdp:
        ref = shard_model(ref, ctx)
    optimizer = build_optimizer(model, optim_config)
    scheduler = build_scheduler(optimizer, optim_config, 2)
    for _ in range(2):
        with torch.no_grad():
            ref(input_ids=ids)
        if fsdp:
            ref.reshard()
        loss = model(input_ids=ids).logits.float().log_softmax(-1).mean()  # [1, 8, V] -> scalar
        loss.backward()
        optimizer_step(model, optimizer, scheduler, 1.0, ctx)


def run_case(size: str, nproc: int, strategy: str, work: Path) -> dict:
    from grpo_core.plan.memory import ModelShape, model_state_bytes

    out = work / f"{size}-{nproc}-{strategy}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    script = [str(Path(__file__).resolve()), "--child", size, strategy, str(out)]
    if nproc == 1:
        cmd = [sys.executable, *script]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *script]
    proc = subprocess.run(cmd, env=env, cwd=ROOT)
    if proc.returncode:
        sys.exit(f"case {size} {nproc}:{strategy} failed (exit {proc.returncode}); its output is above")
    measured = max(json.loads(Path(f"{out}-{r}.json").read_text())["peak_kib"] for r in range(nproc)) * 1024
    shape = ModelShape.from_config(qwen2_config(size))
    resolved = "single" if nproc == 1 else strategy
    predicted = model_state_bytes(shape, resolved, nproc, device="cpu", reference=True)
    total = sum(predicted.values())
    return {"model": size, "params": shape.num_params, "ranks": nproc, "strategy": resolved,
            "predicted_mib": {k: round(v / 2**20, 1) for k, v in predicted.items()},
            "predicted_total_mib": round(total / 2**20, 1), "measured_mib": round(measured / 2**20, 1),
            "ratio": round(measured / total, 3), "within_25pct": abs(measured / total - 1) <= 0.25}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10m,100m", help="comma-separated: 10m, 100m, 500m (500m needs ~13 GB)")
    parser.add_argument("--cases", default="1:single,2:fsdp,2:ddp", help="ranks:strategy pairs")
    parser.add_argument("--work", default=None, help="where the ranks write their peaks (default: a fresh temp folder)")
    parser.add_argument("--quick", action="store_true", help="10m only, 1 process and 2 ranks FSDP (a smoke run)")
    parser.add_argument("--child", nargs=3, metavar=("SIZE", "STRATEGY", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child[:2], Path(args.child[2]))
        return
    if args.quick:
        args.sizes, args.cases = "10m", "1:single,2:fsdp"
    work = Path(args.work or tempfile.mkdtemp(prefix="plan_vs_measured_"))
    work.mkdir(parents=True, exist_ok=True)
    for size in args.sizes.split(","):
        for case in args.cases.split(","):
            nproc, strategy = case.split(":")
            print(json.dumps(run_case(size, int(nproc), strategy, work)), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
