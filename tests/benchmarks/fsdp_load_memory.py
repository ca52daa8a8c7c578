"""Host memory of loading a model for FSDP on N CPU ranks: the sharded load vs one full copy of the model.

    python tests/benchmarks/fsdp_load_memory.py                       # ~1B-parameter Qwen2-shaped, 2 ranks
    python tests/benchmarks/fsdp_load_memory.py --preset 0.5b --how replicated
    python tests/benchmarks/fsdp_load_memory.py --quick                # the small preset (~48M)

Saves a random Qwen2-shaped model (fp32 safetensors) once to a temp folder, then runs ``torchrun
--nproc_per_node N`` with this file as each rank. A rank resets its RSS high-water mark after its imports and
the process group are up, loads the model the trainer's way, and reports its peak RSS above that baseline.
``--how sharded`` is ``grpo_core.trainer.fsdp.load_sharded_model`` (meta device, rank 0 reads each tensor and
broadcasts it); ``--how replicated`` is the load it replaced (every rank ``from_pretrained`` in fp32, then
``fully_shard``). The last line is a JSON summary: per-rank load peaks, their sum, one full copy and the
largest single tensor (a rank holds its shards plus about one full tensor at a time).

The ranks run with ``MALLOC_MMAP_THRESHOLD_=1048576`` unless ``--glibc-default``: glibc otherwise raises its
mmap threshold each time a large buffer is freed (up to 32 MiB), so later few-MiB buffers come from the heap
and stay in the RSS after they are freed; on a small model that retention is as large as the model and
hides what is live. Tensors of a ~1B model (> 32 MiB) are mmapped either way.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRESETS = {  # Qwen2 widths; tied embeddings
    "1b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=16,
               num_attention_heads=12, num_key_value_heads=2),  # ~0.98B (Qwen2.5-1.5B's widths, 16 of 28 layers)
    "0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2),  # Qwen2.5-0.5B's shape, 494M
    "small": dict(vocab_size=4096, hidden_size=512, intermediate_size=2048, num_hidden_layers=12,
                  num_attention_heads=8, num_key_value_heads=2),  # ~41M: the test's size
}


def build(folder: Path, preset: str) -> None:
    """A random-init model of ``preset``'s shape, saved as safetensors (run in its own process)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(tie_word_embeddings=True, **PRESETS[preset]),
                                             dtype=torch.float32)
    model.save_pretrained(folder, safe_serialization=True)  # weights and config.json: all a load reads


def rank_entry(folder: str, how: str, results: str) -> None:
    """One torchrun rank: baseline, load, peak; writes ``results/rank{RANK}.json``."""
    import gc

    import torch
    import torch.distributed as dist
    from transformers import AutoConfig, AutoModelForCausalLM

    sys.path.insert(0, str(Path(__file__).parent))
    from _memory import read_status_kib, reset_peak_rss

    from grpo_core.trainer.distributed import barrier, init_distributed
    from grpo_core.trainer.fsdp import load_sharded_model, shard_model
    from grpo_core.trainer.skeleton import load_model

    torch.set_num_threads(1)
    ctx = init_distributed()
    with torch.device("meta"):  # import the model's code before the baseline: its pages are not the model's
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    dist.barrier()
    gc.collect()
    base = reset_peak_rss()
    if how == "sharded":
        model = load_sharded_model(folder, ctx)
    else:
        model = shard_model(load_model(folder, ctx.device), ctx)
    gc.collect()
    peak, after = read_status_kib("VmHWM"), read_status_kib("VmRSS")
    barrier(ctx)
    local = sum(p.to_local().numel() for p in model.parameters()) * 4
    (Path(results) / f"rank{ctx.rank}.json").write_text(json.dumps({"rank": ctx.rank, "base_mib": base / 1024, "peak_mib": peak / 1024,
                                       "load_peak_mib": (peak - base) / 1024, "after_mib": (after - base) / 1024,
                                       "local_shard_mib": local / 2**20}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="1b")
    parser.add_argument("--how", choices=["sharded", "replicated"], default="sharded")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--model-dir", help="reuse a folder saved by an earlier run of this preset")
    parser.add_argument("--glibc-default", action="store_true", help="leave glibc's dynamic mmap threshold on")
    parser.add_argument("--quick", action="store_true", help="the small preset (what the tests run)")
    args = parser.parse_args()
    if args.quick:
        args.preset = "small"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    if not args.glibc_default:  # see the module docstring
        env["MALLOC_MMAP_THRESHOLD_"] = str(1 << 20)
    with tempfile.TemporaryDirectory(prefix="fsdp-load-") as tmp:
        folder = Path(args.model_dir or Path(tmp) / args.preset)
        if not (folder / "config.json").exists():
            subprocess.run([sys.executable, __file__, "--build", str(folder), args.preset], env=env, check=True)
        sys.path.insert(0, str(ROOT))
        from grpo_core.trainer.weights import index_weights

        sizes = [e.end - e.begin for e in index_weights(folder).values()]
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
             __file__, "--rank", str(folder), args.how, tmp], env=env, capture_output=True, text=True,
        )
        if proc.returncode:
            sys.exit(f"torchrun failed:\n{proc.stderr[-4000:]}")
        ranks = [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(args.nproc)]
    for r in ranks:
        print(f"rank {r['rank']}: baseline {r['base_mib']:.0f} MiB, peak {r['peak_mib']:.0f} MiB, "
              f"load peak +{r['load_peak_mib']:.0f} MiB (own shard {r['local_shard_mib']:.0f} MiB)")
    summary = {"preset": args.preset, "how": args.how, "nproc": args.nproc, "params": sum(sizes) // 4,
               "full_copy_mib": sum(sizes) / 2**20, "largest_tensor_mib": max(sizes) / 2**20,
               "sum_load_peak_mib": sum(r["load_peak_mib"] for r in ranks), "ranks": ranks}
    print(f"one full copy {summary['full_copy_mib']:.0f} MiB ({summary['params'] / 1e6:.0f}M fp32 parameters), "
          f"largest tensor {summary['largest_tensor_mib']:.0f} MiB; sum of the ranks' load peaks "
          f"{summary['sum_load_peak_mib']:.0f} MiB")
    print(json.dumps(summary))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--build"]:
        build(Path(sys.argv[2]), sys.argv[3])
    elif sys.argv[1:2] == ["--rank"]:
        rank_entry(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        main()
