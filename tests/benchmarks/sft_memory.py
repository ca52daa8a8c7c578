# OMP_WAIT_POLICY=PASSIVE python tests/benchmarks/sft_memory.py          (quick smoke run: --quick)
"""Peak memory of one SFT training pass (forward + backward): the old full-logits loss vs grpo_core's chunked loss.

Model: a 1-layer Qwen2 with Qwen2.5-0.5B's widths (hidden 896, vocab 151,936, tied embeddings), random
init, fp32 on CPU (or ``--device cuda``); batch: 4 rows of 32 prompt tokens (label -100) + 1024
completion tokens, the same batch for both methods.

- old: the previous ``grpo_core.trainer.sft.completion_token_loss``, re-implemented below: ``model(...).logits``
  ``[B, L, V]``, shifted, ``cross_entropy(reduction="sum")`` over the label tokens.
- chunked: ``grpo_core.trainer.sft.completion_token_loss`` (hidden states, LM head on ``logprob_chunk_size`` rows at
  a time under activation checkpointing, only from the first label column on).

Both divide by the label-token count and call ``backward()``. Each measurement runs in a fresh subprocess,
methods interleaved (A B, B A, ...). The child first runs a small warm-up step, so the parameters'
``.grad`` buffers exist (zeroed, not freed: a training step reuses them) and kernels are loaded; then on CPU
it resets the kernel's RSS high-water mark (``/proc/self/clear_refs``) and reports ``VmHWM - VmRSS_before``,
what the pass added on top of weights and gradients; on CUDA ``max_memory_allocated - memory_allocated``.
The last line is JSON with ``memory_ratio`` (chunked / old, target <= 1/3) and whether losses agree. A child that
fails ends the script with exit 1 and its stderr. ``--quick``: the same code path at a small size (an 8,192-token
vocabulary, hidden 224, 2 x (16 + 256) tokens in chunks of 128), in seconds; its ratios mean little.
``tests/benchmarks/test_benchmark_scripts.py`` runs it and checks the JSON line's keys and that both losses and
gradients agree.

Measured on 2 CPU threads: old 7,898 MiB, chunked 2,106 MiB at SFTConfig's chunk size 256 (ratio 0.27,
CPU time x1.15); at GRPO's 1024 the chunked pass took 4,038 MiB (ratio 0.51): the backward of one chunk
holds ~4 fp32 ``[chunk, V]`` tensors (2.5 MiB per row, from the two runs); the ~1.4 GiB left at chunk 0 (the
tied 136M-parameter embedding's gradient temporaries, the layer's activations) does not shrink with the chunk.
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

IGNORE_INDEX = -100


def run_child(args: argparse.Namespace) -> None:
    import torch

    from grpo_core.trainer.sft import completion_token_loss

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model = qwen_one_layer(args.vocab, args.hidden).to(device).train()
    input_ids = torch.randint(0, args.vocab, (args.batch, args.prompt + args.tokens), device=device)  # [B, L]
    attention_mask = torch.ones_like(input_ids)  # [B, L]
    labels = input_ids.clone()  # [B, L]
    labels[:, : args.prompt] = IGNORE_INDEX  # completion-only loss

    def old(ids, mask, lab):
        """The previous SFT loss: summed cross-entropy from the full [B, L, V] logits."""
        logits = model(input_ids=ids, attention_mask=mask).logits  # [B, L, V]
        # position t predicts token t+1: drop the last logit and the first label
        shift_logits = logits[:, :-1].float()  # [B, L-1, V]
        shift_labels = lab[:, 1:]  # [B, L-1]
        loss_sum = torch.nn.functional.cross_entropy(
            shift_logits.reshape(-1, shift_logits.shape[-1]), shift_labels.reshape(-1),
            ignore_index=IGNORE_INDEX, reduction="sum",
        )
        return loss_sum / int((shift_labels != IGNORE_INDEX).sum())

    def chunked(ids, mask, lab):
        num_tokens = int((lab[:, 1:] != IGNORE_INDEX).sum())
        return completion_token_loss(model, ids, mask, lab, num_tokens=num_tokens, chunk_size=args.chunk_size)[0]

    method = {"old": old, "chunked": chunked}[args.child]
    method(input_ids[:1, :48], attention_mask[:1, :48], labels[:1, :48]).backward()  # warm-up; allocates .grad
    model.zero_grad(set_to_none=False)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() / 2**10
    else:
        before = reset_peak_rss()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    loss = method(input_ids, attention_mask, labels)
    loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**10
    else:
        peak = read_status_kib("VmHWM")
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    grad_sum = float(sum(p.grad.double().abs().sum() for p in model.parameters()))
    print(json.dumps({
        "method": args.child, "pass_peak_mib": (peak - before) / 1024, "peak_mib": peak / 1024,
        "cpu_s": cpu, "wall_s": wall, "loss": float(loss), "grad_abs_sum": grad_sum,
    }))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=1024, help="completion tokens per row")
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--chunk-size", type=int, default=None, help="default: SFTConfig's logprob_chunk_size")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="vocabulary 8,192, hidden 224, 2 x (16 + 256) tokens, "
                        "chunks of 128 (a smoke run)")
    parser.add_argument("--child", choices=["old", "chunked"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.vocab, args.hidden, args.batch, args.prompt, args.tokens, args.repeats = 8192, 224, 2, 16, 256, 1
        args.chunk_size = args.chunk_size or 128  # several chunks of the 512 rows, as at full size
    if args.chunk_size is None:
        from grpo_core.config import SFTConfig

        args.chunk_size = SFTConfig().logprob_chunk_size
    if args.child:
        return run_child(args)

    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
    forward = [f"--{k.replace('_', '-')}={getattr(args, k)}"  # the resolved sizes (after --quick)
               for k in ("batch", "tokens", "prompt", "vocab", "hidden", "chunk_size", "threads", "device")]
    results: dict[str, list[dict]] = {"old": [], "chunked": []}
    print(f"B={args.batch} L={args.prompt}+{args.tokens} V={args.vocab} H={args.hidden} chunk_size={args.chunk_size} "
          f"threads={args.threads} device={args.device}")
    print(f"{'method':<8} {'rep':>3} {'pass peak MiB':>14} {'peak MiB':>9} {'cpu s':>7} {'wall s':>7} {'loss':>9}")
    for rep in range(args.repeats):
        for method in (("old", "chunked") if rep % 2 == 0 else ("chunked", "old")):
            r = run_json([sys.executable, __file__, *forward, "--child", method], env, what=f"{method} child")
            results[method].append(r)
            print(f"{method:<8} {rep:>3} {r['pass_peak_mib']:>14.0f} {r['peak_mib']:>9.0f} {r['cpu_s']:>7.2f} "
                  f"{r['wall_s']:>7.2f} {r['loss']:>9.5f}", flush=True)

    def med(method: str, key: str) -> float:
        return statistics.median(r[key] for r in results[method])

    summary = {
        "memory_ratio": med("chunked", "pass_peak_mib") / med("old", "pass_peak_mib"),
        "old_pass_peak_mib": med("old", "pass_peak_mib"),
        "chunked_pass_peak_mib": med("chunked", "pass_peak_mib"),
        "time_ratio": med("chunked", "cpu_s") / med("old", "cpu_s"),
        "chunk_size": args.chunk_size,
        "same_loss": abs(med("old", "loss") - med("chunked", "loss")) <= 1e-5 * abs(med("old", "loss")),
        "same_grads": abs(med("old", "grad_abs_sum") - med("chunked", "grad_abs_sum"))
        <= 1e-4 * abs(med("old", "grad_abs_sum")),
        "children_max_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
