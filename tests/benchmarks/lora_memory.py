# OMP_WAIT_POLICY=PASSIVE python tests/benchmarks/lora_memory.py            (--quick: 1 layer, small vocabulary, short rows)
"""Peak memory and step time of one training step: LoRA (``use_peft``) vs full fine-tuning, measured in one run.

Model: Qwen2.5-0.5B's widths (hidden 896, intermediate 4864, 14 query / 2 key-value heads, vocabulary 151,936,
tied embeddings) with ``--layers`` decoder layers (default 4; 24 in the real model), random init. Full
fine-tuning trains it as the trainers do (fp32 weights, all trainable); LoRA freezes it in the trainer's base
dtype (fp32 on CPU, the model's bf16 on GPU: ``grpo_core.trainer.lora.base_dtype``) and trains rank-16 adapters
on every linear layer (``GRPOConfig`` defaults: lora_r 16, alpha 32, all-linear). A step is the SFT loss
(``grpo_core.trainer.sft.completion_token_loss``: chunked LM head) on ``--batch`` rows of ``--tokens`` tokens,
backward, gradient clipping and a fused AdamW step (its state is created in the first step).

Each measurement runs in a fresh subprocess (methods interleaved: full lora, lora full, ...). The child records
its RSS (CPU) or allocated bytes (CUDA) before building the model and reports the peak over a warm-up step and
``--steps`` timed steps on top of it: weights, gradients, optimizer state and the step's activations. Step time
is the median wall time of the timed steps. The last stdout line is JSON: ``lora_peak_ratio`` and
``lora_step_ratio`` (LoRA / full, medians over repeats; below 1 = LoRA smaller / faster), each method's numbers,
and ``matmul_gflops`` (a 1024 x 1024 fp32 matmul's best rate on this machine: the speed probe that tells a slow
machine from a slow method).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from _child import run_json
from _memory import read_status_kib, reset_peak_rss

METHODS = ("full", "lora")


def build_model(layers: int, vocab: int) -> "torch.nn.Module":  # noqa: F821
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=vocab, hidden_size=896, intermediate_size=4864, num_hidden_layers=layers,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def run_child(args: argparse.Namespace) -> None:
    import torch

    from grpo_core.config import SFTConfig
    from grpo_core.trainer.lora import lora_config
    from grpo_core.trainer.optim import build_optimizer
    from grpo_core.trainer.sft import IGNORE_INDEX, completion_token_loss

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    before = torch.cuda.memory_allocated() if cuda else read_status_kib("VmRSS") * 1024
    if not cuda:
        reset_peak_rss()
    config = SFTConfig(use_peft=args.child == "lora", learning_rate=1e-4)
    model = build_model(args.layers, args.vocab)
    if config.use_peft:
        from peft import get_peft_model

        if cuda:
            model = model.to(torch.bfloat16)  # the frozen base in the model's dtype (Qwen2.5: bf16)
        model = get_peft_model(model, lora_config(config, "CAUSAL_LM"))
    model = model.to(device).train()
    optimizer = build_optimizer(model, config)
    ids = torch.randint(0, args.vocab, (args.batch, args.tokens), device=device)  # [B, L]
    labels = ids.clone()  # [B, L]
    labels[:, : args.tokens // 8] = IGNORE_INDEX  # a prompt without loss
    num_tokens = int((labels[:, 1:] != IGNORE_INDEX).sum())

    def step() -> float:
        start = time.perf_counter()
        loss, _ = completion_token_loss(model, ids, torch.ones_like(ids), labels, num_tokens=num_tokens,
                                        chunk_size=256)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    step()  # warm-up: creates AdamW's state, loads kernels
    times = [step() for _ in range(args.steps)]
    if cuda:
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = read_status_kib("VmHWM") * 1024 - before
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(json.dumps({"peak_mib": peak / 2**20, "step_s": statistics.median(times), "trainable": trainable}))


def matmul_gflops(threads: int, n: int = 1024, repeats: int = 10) -> float:
    """Best fp32 GFLOP/s of an ``n x n`` matmul (wall time, as the step times are)."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 layer, an 8,192-token vocabulary, 1 x 128 tokens, 1 repeat, "
                        "1 timed step")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cuda" if _cuda() else "cpu")
    parser.add_argument("--child", choices=METHODS)
    args = parser.parse_args()
    if args.quick:
        args.layers, args.batch, args.tokens, args.steps, args.repeats, args.vocab = 1, 1, 128, 1, 1, 8192
    if args.child:
        run_child(args)
        return
    runs: dict[str, list[dict]] = {m: [] for m in METHODS}
    for r in range(args.repeats):  # interleaved: full lora, lora full, ...
        for method in METHODS if r % 2 == 0 else METHODS[::-1]:
            cmd = [sys.executable, __file__, "--child", method] + [
                f"--{k}={getattr(args, k)}" for k in ("layers", "batch", "tokens", "steps", "vocab", "threads", "device")]
            runs[method].append(run_json(cmd, os.environ, what=f"{method} child"))
    med = {m: {k: statistics.median(r[k] for r in runs[m]) for k in ("peak_mib", "step_s", "trainable")} for m in METHODS}
    print(json.dumps({
        "lora_peak_ratio": med["lora"]["peak_mib"] / med["full"]["peak_mib"],
        "lora_step_ratio": med["lora"]["step_s"] / med["full"]["step_s"],
        "full": med["full"], "lora": med["lora"], "matmul_gflops": matmul_gflops(args.threads),
        "device": args.device, "layers": args.layers, "batch": args.batch, "tokens": args.tokens,
        "threads": args.threads, "repeats": args.repeats,
    }))


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    main()
