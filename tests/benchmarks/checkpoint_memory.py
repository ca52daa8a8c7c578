"""Host memory of an FSDP checkpoint save and resume per rank, over one full fp32 model-plus-optimizer state.

    python tests/benchmarks/checkpoint_memory.py                    # ~1B-parameter Qwen2-shaped, 2 ranks
    python tests/benchmarks/checkpoint_memory.py --preset 0.3b --legacy
    python tests/benchmarks/checkpoint_memory.py --quick            # ~5M parameters (the test's size)

Each of ``--nproc`` torchrun ranks (gloo, CPU) builds a random Qwen2-shaped model sharded with the trainer's FSDP2
layout, takes one AdamW step (so both Adam moments exist) and drops the gradients, as at a checkpoint step. Then:

- save: reset the RSS high-water mark, write the trainer's sharded checkpoint state
  (``grpo_core.trainer.sharded_state.save_sharded_state``: each rank its shards, torch.distributed.checkpoint);
- resume: in fresh torchrun processes (a freed heap would hide the growth), reset the mark after the imports and
  the process group, then load as the trainer resumes (``load_sharded_model(..., state_dir=)``, AdamW,
  ``load_optimizer_state``).

``save_rss_ratio`` / ``resume_rss_ratio`` are the largest rank's peak RSS growth over one full state (12 bytes a
parameter: fp32 weights and two Adam moments). A resume necessarily grows by the rank's own shards (1/N of the
state), so at 2 ranks its floor is 0.5; a save needs no copy. ``--legacy`` also measures the gathered save the
trainer used before (full weights and optimizer state built on every rank, kept on rank 0). The speed probe is
each phase's wall time and GB/s of state written or read. The last line is ONE JSON object.

Ranks run with ``MALLOC_MMAP_THRESHOLD_=1048576`` (see ``fsdp_load_memory.py``: glibc's dynamic threshold keeps
freed few-MiB buffers in the RSS and hides what is live).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRESETS = {  # Qwen2 widths; tied embeddings
    "1b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=16,
               num_attention_heads=12, num_key_value_heads=2),  # ~0.98B (Qwen2.5-1.5B's widths, 16 of 28 layers)
    "0.3b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=12,
                 num_attention_heads=14, num_key_value_heads=2),  # ~0.3B (Qwen2.5-0.5B's widths, 12 of 24 layers)
    "quick": dict(vocab_size=4096, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2),  # ~5M
}
STATE_BYTES_PER_PARAM = 12  # fp32 weights + Adam's exp_avg and exp_avg_sq


def _sharded_model(preset: str, ctx):  # type: ignore[no-untyped-def]
    """The trainer's FSDP2 layout over a random-init model, built on the meta device and filled shard by shard."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from grpo_core.trainer.fsdp import _fully_shard, _make_root

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(Qwen2Config(tie_word_embeddings=True, **PRESETS[preset]),
                                                 dtype=torch.float32)
    _fully_shard(model, ctx, bf16=False, cpu_offload=False)
    model.to_empty(device=ctx.device)
    torch.manual_seed(ctx.rank)
    with torch.no_grad():
        for p in model.parameters():
            p.to_local().normal_(0.0, 0.02)
        for module in model.modules():  # rotary inv_freq
            if module._non_persistent_buffers_set:
                model._init_weights(module)
    return _make_root(model, ctx)


def _peak_growth(base_kib: int) -> float:
    from _memory import read_status_kib

    return (read_status_kib("VmHWM") - base_kib) * 1024.0


def rank_entry(phase: str, preset: str, folder: str, legacy: bool, results: str) -> None:
    """One torchrun rank of ``phase``: save (build, step, save, legacy save) or resume; writes
    ``results/{phase}{RANK}.json``."""
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from _memory import reset_peak_rss

    from grpo_core.trainer.distributed import barrier, init_distributed
    from grpo_core.trainer.fsdp import gather_model_state, gather_optimizer_state
    from grpo_core.trainer.sharded_state import STATE_DIR, save_sharded_state

    torch.set_num_threads(1)
    ctx = init_distributed()
    state_dir = Path(folder) / STATE_DIR
    if phase == "resume":
        _resume(ctx, folder, state_dir, results)
        return
    model = _sharded_model(preset, ctx)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)  # as after the trainer's optimizer_step
    if ctx.is_main:
        model.config.save_pretrained(folder)  # what a checkpoint keeps beside the shards
    out: dict = {"rank": ctx.rank, "params": params}

    barrier(ctx)
    gc.collect()
    base = reset_peak_rss()
    start = time.perf_counter()
    save_sharded_state(model, optimizer, state_dir)
    barrier(ctx)
    out["save_s"], out["save_growth"] = time.perf_counter() - start, _peak_growth(base)

    if legacy:  # the gathered format: every rank builds the full states, rank 0 keeps them
        gc.collect()
        base = reset_peak_rss()
        start = time.perf_counter()
        full = (gather_model_state(model), gather_optimizer_state(optimizer, ctx))
        barrier(ctx)
        out["legacy_save_s"], out["legacy_save_growth"] = time.perf_counter() - start, _peak_growth(base)
        del full
    (Path(results) / f"save{ctx.rank}.json").write_text(json.dumps(out))


def _resume(ctx, folder: str, state_dir: Path, results: str) -> None:  # type: ignore[no-untyped-def]
    import torch
    from _memory import reset_peak_rss
    from transformers import AutoConfig, AutoModelForCausalLM

    from grpo_core.trainer.distributed import barrier
    from grpo_core.trainer.fsdp import load_sharded_model
    from grpo_core.trainer.sharded_state import load_optimizer_state

    with torch.device("meta"):  # import the model's code before the baseline: its pages are not the state's
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    barrier(ctx)
    gc.collect()
    base = reset_peak_rss()
    start = time.perf_counter()
    model = load_sharded_model(folder, ctx, state_dir=state_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    load_optimizer_state(model, optimizer, state_dir)
    barrier(ctx)
    out = {"rank": ctx.rank, "resume_s": time.perf_counter() - start, "resume_growth": _peak_growth(base)}
    (Path(results) / f"resume{ctx.rank}.json").write_text(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="1b")
    parser.add_argument("--quick", action="store_true", help="the ~5M preset (what the test runs)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--legacy", action="store_true", help="also measure the gathered save it replaced")
    args = parser.parse_args()
    preset = "quick" if args.quick else args.preset
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": str(1 << 20), "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryDirectory(prefix="checkpoint-memory-") as tmp:
        for phase in ("save", "resume"):
            proc = subprocess.run(
                [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
                 __file__, "--rank", phase, preset, str(Path(tmp) / "checkpoint"), str(int(args.legacy)), tmp],
                env=env, capture_output=True, text=True,
            )
            if proc.returncode:
                sys.exit(f"torchrun ({phase}) failed:\n{proc.stderr[-4000:]}")
        ranks = [{**json.loads((Path(tmp) / f"save{r}.json").read_text()),
                  **json.loads((Path(tmp) / f"resume{r}.json").read_text())} for r in range(args.nproc)]
    full = ranks[0]["params"] * STATE_BYTES_PER_PARAM
    summary = {
        "preset": preset, "nproc": args.nproc, "params": ranks[0]["params"], "full_state_gib": full / 2**30,
        "save_rss_ratio": max(r["save_growth"] for r in ranks) / full,
        "resume_rss_ratio": max(r["resume_growth"] for r in ranks) / full,
        "save_s": max(r["save_s"] for r in ranks), "resume_s": max(r["resume_s"] for r in ranks),
    }
    summary["save_gb_per_s"] = full / 1e9 / summary["save_s"]
    summary["resume_gb_per_s"] = full / 1e9 / summary["resume_s"]
    if args.legacy:
        summary["legacy_save_rss_ratio"] = max(r["legacy_save_growth"] for r in ranks) / full
        summary["legacy_save_s"] = max(r["legacy_save_s"] for r in ranks)
    summary["ranks"] = [{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()} for r in ranks]
    print(json.dumps(summary))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rank"]:
        rank_entry(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "1", sys.argv[6])
    else:
        main()
