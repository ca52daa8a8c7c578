# python tests/benchmarks/packing.py            (--quick: a smaller model, shorter rows, one round: a smoke run)
"""Packed, padding-free micro-batches vs padded ones: SFT and GRPO training tokens/s on R1-shaped lengths.

Model: a Qwen2 built here (``grpo_core.models.tiny.build_tiny_model``: hidden 256, 4 layers, 4 heads, byte
vocabulary; ``--quick``: hidden 128, 2 layers), random init, fp32 on CPU, 1 torch thread. Lengths: completion lengths drawn lognormal (sigma 0.7, so
the 5th-95th percentile spread is 10x, as R1 traces vary) and clipped to a 10x range around the median; prompts of
16-64 tokens.

- SFT: one optimiser step's gradient pass (``trainer.sft._accumulate_gradients``) over 32 rows in micro-batches
  of 8: padded = the default (``group_by_length``: sorted, each micro-batch padded to its longest row), packed =
  ``padding_free`` with ``max_tokens_per_batch`` = 8 x the mean row length (the same tokens per micro-batch).
  ``packed_speedup_sft_unsorted`` compares with ``group_by_length: false`` (rows padded in stream order).
- GRPO: one ``trainer.update.optimise`` step (reference forward, beta 0.04, then the policy forward + backward
  and the optimiser step) on 4 prompts x G=8 completions in micro-batches of 8: padded = the default
  (``share_prompt_forward``: each prompt once per micro-batch), packed = ``padding_free`` with the same budget rule.

Both modes train on the same rows and the same tokens; tokens/s counts every real (unpadded) token of the rows.
Modes alternate within one process (padded, packed, then packed, padded, ...) and medians are compared. The last
line is ONE JSON object: ``packed_speedup_sft`` and ``packed_speedup_grpo`` (packed / padded tokens/s, target
>= 1.5) and ``speed_probe`` (each mode's absolute tokens/s, a fixed matrix product's GFLOP/s before and after, the
load average), so a run on a loaded or slower machine can be read against another.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout first

from grpo_core.config import GRPOConfig, SFTConfig  # noqa: E402
from grpo_core.models.tiny import build_tiny_model  # noqa: E402
from grpo_core.trainer.distributed import DistContext  # noqa: E402
from grpo_core.trainer.sft import IGNORE_INDEX, _accumulate_gradients  # noqa: E402
from grpo_core.trainer.update import TrainBatch, optimise  # noqa: E402

CPU = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
ROWS, MICRO, G = 32, 8, 8


def r1_lengths(n: int, median: int, rng: np.random.Generator) -> list[int]:
    """Lognormal lengths, sigma 0.7 (5th-95th percentile 10x apart), clipped to [median/sqrt(10), median*sqrt(10)]."""
    lengths = rng.lognormal(np.log(median), 0.7, n)
    return np.clip(lengths, median / 10 ** 0.5, median * 10 ** 0.5).astype(int).tolist()


def sft_rows(median: int, rng: np.random.Generator) -> list[tuple[list[int], list[int]]]:
    rows = []
    for completion in r1_lengths(ROWS, median, rng):
        prompt = int(rng.integers(16, 65))
        ids = rng.integers(4, 260, prompt + completion).tolist()
        rows.append((ids, [IGNORE_INDEX] * prompt + ids[prompt:]))
    return rows


def grpo_batch(median: int, rng: np.random.Generator) -> TrainBatch:
    """ROWS / G prompts (16-64 tokens, left-padded) x G completions (right-padded), random advantages."""
    prompts = [rng.integers(4, 260, int(rng.integers(16, 65))).tolist() for _ in range(ROWS // G)]
    completions = [rng.integers(4, 260, n).tolist() for n in r1_lengths(ROWS, median, rng)]
    lp, tc = max(map(len, prompts)), max(map(len, completions))
    prompt_ids, prompt_mask = torch.zeros(ROWS, lp, dtype=torch.long), torch.zeros(ROWS, lp, dtype=torch.long)
    completion_ids, completion_mask = torch.zeros(ROWS, tc, dtype=torch.long), torch.zeros(ROWS, tc, dtype=torch.long)
    for i, c in enumerate(completions):
        p = prompts[i // G]
        prompt_ids[i, lp - len(p):], prompt_mask[i, lp - len(p):] = torch.tensor(p), 1
        completion_ids[i, : len(c)], completion_mask[i, : len(c)] = torch.tensor(c), 1
    advantages = torch.from_numpy(rng.standard_normal(ROWS)).float()
    return TrainBatch(prompt_ids, prompt_mask, completion_ids, completion_mask, completion_mask.clone(), advantages,
                      None)


def matmul_gflops(seconds: float = 0.5) -> float:
    """GFLOP/s of 256 x 256 fp32 matrix products on this thread: the machine's speed at the time."""
    a = torch.randn(256, 256)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ a
        count += 1
    return 2 * 256 ** 3 * count / (time.perf_counter() - start) / 1e9


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="hidden 128 x 2 layers, median completion 48 tokens, "
                        "1 round (a smoke run)")
    parser.add_argument("--median", type=int, default=None, help="median completion tokens (default 256; quick 48)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds per mode (default 3; quick 1)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    median = args.median or (48 if args.quick else 256)
    rounds = args.rounds or (1 if args.quick else 3)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    load_start, gflops_start = os.getloadavg(), matmul_gflops()

    from transformers import AutoModelForCausalLM

    path = build_tiny_model(Path(tempfile.mkdtemp(prefix="packing_bench_")), hidden_size=128 if args.quick else 256,
                            num_layers=2 if args.quick else 4, num_heads=4, architecture="qwen2", max_position_embeddings=8 * median)
    base = AutoModelForCausalLM.from_pretrained(path)
    sft_data, batch = sft_rows(median, rng), grpo_batch(median, rng)
    sft_tokens = sum(len(ids) for ids, _ in sft_data)
    grpo_tokens = int(batch.prompt_mask.sum() + batch.completion_mask.sum())
    budget_sft = MICRO * sft_tokens // ROWS  # the same real tokens per micro-batch as 8 rows hold on average
    budget_grpo = MICRO * grpo_tokens // ROWS
    sft_configs = {"padded": SFTConfig(per_device_train_batch_size=MICRO, gradient_accumulation_steps=ROWS // MICRO),
                   "unsorted": SFTConfig(per_device_train_batch_size=MICRO, gradient_accumulation_steps=ROWS // MICRO,
                                         group_by_length=False),
                   "packed": SFTConfig(per_device_train_batch_size=MICRO, gradient_accumulation_steps=ROWS // MICRO,
                                       padding_free=True, max_tokens_per_batch=budget_sft)}
    grpo_base = dict(num_generations=G, generation_batch_size=ROWS, per_device_train_batch_size=MICRO, beta=0.04,
                     max_completion_length=max(1, int(batch.completion_mask.sum(1).max())))
    grpo_configs = {"padded": GRPOConfig(**grpo_base),
                    "packed": GRPOConfig(**grpo_base, padding_free=True, max_tokens_per_batch=budget_grpo)}
    model, ref_model = copy.deepcopy(base), copy.deepcopy(base)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: every round trains the same weights
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)

    def sft(mode: str) -> float:
        model.zero_grad(set_to_none=True)
        return timed(lambda: _accumulate_gradients(model, sft_data, 0, sft_configs[mode], CPU))

    def grpo(mode: str) -> float:
        return timed(lambda: optimise(model, ref_model, optimizer, scheduler, copy.deepcopy(batch),
                                      grpo_configs[mode], CPU))

    modes = {"sft": ("padded", "packed", "unsorted"), "grpo": ("padded", "packed")}
    seconds: dict[str, dict[str, list[float]]] = {name: {mode: [] for mode in m} for name, m in modes.items()}
    for name, run in (("sft", sft), ("grpo", grpo)):
        run("packed"), run("padded")  # warm-up: kernels, allocator, the attention swap
        for rnd in range(rounds):
            for mode in (modes[name] if rnd % 2 == 0 else modes[name][::-1]):
                seconds[name][mode].append(run(mode))
                print(f"{name:<4} round {rnd} {mode:<6} {seconds[name][mode][-1]:7.3f} s", file=sys.stderr, flush=True)

    tokens = {"sft": sft_tokens, "grpo": grpo_tokens}
    rate = {f"{mode}_{name}_tokens_per_s": tokens[name] / statistics.median(s[mode])
            for name, s in seconds.items() for mode in modes[name]}
    print(json.dumps({
        "packed_speedup_sft": rate["packed_sft_tokens_per_s"] / rate["padded_sft_tokens_per_s"],
        "packed_speedup_grpo": rate["packed_grpo_tokens_per_s"] / rate["padded_grpo_tokens_per_s"],
        "packed_speedup_sft_unsorted": rate["packed_sft_tokens_per_s"] / rate["unsorted_sft_tokens_per_s"],
        "speed_probe": {**rate, "matmul_gflops_start": gflops_start, "matmul_gflops_end": matmul_gflops(),
                        "load_avg_start": load_start, "load_avg_end": os.getloadavg()},
        "median_completion_tokens": median, "rows": ROWS, "micro_batch_rows": MICRO, "rounds": rounds,
        "sft_tokens": sft_tokens, "grpo_tokens": grpo_tokens,
        "max_tokens_per_batch": {"sft": budget_sft, "grpo": budget_grpo},
    }))


if __name__ == "__main__":
    main()
