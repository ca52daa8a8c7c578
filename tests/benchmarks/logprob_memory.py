# python tests/benchmarks/logprob_memory.py          (quick smoke run: --quick)
"""Peak memory and time of the old/ref log-prob pass: naive full log-softmax vs grpo_core's chunked pass.

Model: a 1-layer Qwen2 with Qwen2.5-0.5B's widths (hidden 896, vocab 151,936, tied embeddings), random
init, fp32 on CPU; input 4 x (32 prompt + 1024 completion) tokens, forward only (``torch.no_grad``).

- naive: ``model(..., logits_to_keep=T+1).logits[:, :-1]`` -> ``log_softmax(-1)`` -> ``gather`` (TRL's
  path without its chunking): [B, T, V] logits and an fp32 log-softmax of the same size.
- chunked: ``grpo_core.trainer.logprobs.compute_token_logps`` (hidden states, lm_head on ``chunk_size`` rows at a time).

Each measurement runs in a fresh subprocess, methods interleaved (A B, B A, ...). Memory: torch's CPU
allocator keeps no statistics, so the child resets the kernel's RSS high-water mark (``/proc/self/clear_refs``)
after building the model and reports ``VmHWM - VmRSS_before``, i.e. what the pass itself added on top of the
weights. Time: CPU seconds (user + sys) of the pass with 1 torch thread, steadier than wall time on shared
cores; wall time is printed too. The last line is JSON with ``memory_ratio`` (chunked / naive, target <= 0.25)
and ``time_ratio`` (target <= 1.2). A child that fails ends the script with exit 1 and its stderr.

``--quick``: the same code path at a small size (an 8,192-token vocabulary, hidden 224, 2 x (16 + 256) tokens in
chunks of 128, one repeat), in seconds; its ratios mean little (the weights, not the pass, dominate at that size).
``tests/benchmarks/test_benchmark_scripts.py`` runs it and checks the JSON line's keys and that both passes give
the same log-probs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

from _child import run_json
from _memory import qwen_one_layer, read_status_kib, reset_peak_rss


def run_child(args: argparse.Namespace) -> None:
    import torch

    from grpo_core.trainer.logprobs import compute_token_logps

    torch.set_num_threads(args.threads)
    model = qwen_one_layer(args.vocab, args.hidden).eval()
    T = args.tokens
    input_ids = torch.randint(0, args.vocab, (args.batch, args.prompt + T))  # [B, L]
    attention_mask = torch.ones_like(input_ids)  # [B, L]

    def naive(ids, mask, T):
        logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=T + 1).logits[:, :-1]  # [B, T, V]
        return logits.log_softmax(-1).gather(-1, ids[:, -T:, None]).squeeze(-1)  # [B, T]

    def chunked(ids, mask, T):
        return compute_token_logps(model, ids, mask, T, chunk_size=args.chunk_size)[0]  # [B, T]

    method = {"naive": naive, "chunked": chunked}[args.child]
    with torch.no_grad():
        method(input_ids[:1, -16:], attention_mask[:1, -16:], 8)  # warm-up: kernels, lazy init
        before = reset_peak_rss()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        logps = method(input_ids, attention_mask, T)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        peak = read_status_kib("VmHWM")
    print(json.dumps({
        "method": args.child, "pass_peak_mib": (peak - before) / 1024, "rss_peak_mib": peak / 1024,
        "cpu_s": cpu, "wall_s": wall, "checksum": float(logps.double().sum()),
    }))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=1024, help="completion tokens per row (logits_to_keep)")
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--chunk-size", type=int, default=None, help="default: compute_token_logps's default")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="vocabulary 8,192, hidden 224, 2 x (16 + 256) tokens, "
                        "chunks of 128, 1 repeat (a smoke run)")
    parser.add_argument("--child", choices=["naive", "chunked"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.vocab, args.hidden, args.batch, args.prompt, args.tokens, args.repeats = 8192, 224, 2, 16, 256, 1
        args.chunk_size = args.chunk_size or 128  # several chunks of the 512 rows, as at full size
    if args.chunk_size is None:
        import inspect

        from grpo_core.trainer.logprobs import compute_token_logps

        args.chunk_size = inspect.signature(compute_token_logps).parameters["chunk_size"].default
    if args.child:
        return run_child(args)

    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
    forward = [f"--{k.replace('_', '-')}={getattr(args, k)}"  # the resolved sizes (after --quick)
               for k in ("batch", "tokens", "prompt", "vocab", "hidden", "chunk_size", "threads")]
    results: dict[str, list[dict]] = {"naive": [], "chunked": []}
    print(f"B={args.batch} T={args.tokens} V={args.vocab} H={args.hidden} chunk_size={args.chunk_size} threads={args.threads}")
    print(f"{'method':<8} {'rep':>3} {'pass peak MiB':>14} {'RSS peak MiB':>13} {'cpu s':>7} {'wall s':>7}")
    for rep in range(args.repeats):
        for method in (("naive", "chunked") if rep % 2 == 0 else ("chunked", "naive")):
            r = run_json([sys.executable, __file__, *forward, "--child", method], env, what=f"{method} child")
            results[method].append(r)
            print(f"{method:<8} {rep:>3} {r['pass_peak_mib']:>14.0f} {r['rss_peak_mib']:>13.0f} {r['cpu_s']:>7.2f} {r['wall_s']:>7.2f}", flush=True)

    def med(method: str, key: str) -> float:
        return statistics.median(r[key] for r in results[method])

    summary = {
        "memory_ratio": med("chunked", "pass_peak_mib") / med("naive", "pass_peak_mib"),
        "time_ratio": med("chunked", "cpu_s") / med("naive", "cpu_s"),
        "wall_time_ratio": med("chunked", "wall_s") / med("naive", "wall_s"),
        "naive_pass_peak_mib": med("naive", "pass_peak_mib"),
        "chunked_pass_peak_mib": med("chunked", "pass_peak_mib"),
        "naive_cpu_s": med("naive", "cpu_s"),
        "chunked_cpu_s": med("chunked", "cpu_s"),
        "chunk_size": args.chunk_size,
        "same_logps": abs(med("naive", "checksum") - med("chunked", "checksum")) <= 1e-5 * abs(med("naive", "checksum")),
        "children_max_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
