# python tests/benchmarks/rejection_throughput.py [--model PATH] [--prompts 1500] [--rounds 2] [--threads 2] [--no-chunked] [--quick]
"""Rejection sampling's throughput against one raw ``LLM.generate`` call on the same engine, prompts and settings.

The rejection_sample stage's sampling on vLLM, on the embedded default's chain prompts (1,500 training prompts x 4
samples, 48 new tokens, temperature 1, chain_accuracy: configs/tiny-cpu.yaml's stage when this was measured; it now
samples 500 prompts of each of chain and countdown, up to 64 tokens): ``rejection_sample`` end to end (prompt
encoding, generation, scoring, filters) against ``llm.generate(prompts, SamplingParams(n=4, ...))`` on the
same engine; ``chunked`` is the same stage with the engine marked as not batching itself, so it gets 16
prompts (64 sequences) per call, as before this benchmark's change. They run interleaved (raw, ours, chunked,
raw, ...) so load from other processes hits all of them; the ratios are of the medians, and ``ratio_per_round``
pairs each round's runs. Each run also prints a progress line to stderr. ``--model`` is a trained GRPO model (its
completions stop early, as in the stage); without it a random-init model of the embedded default's shape is built
(completions run to the cap).
Prints one JSON line: samples/s for each round, raw completion tokens/s, ``ratio`` (ours / raw) and
``chunked_ratio`` (chunked / raw).
Not a test: numbers depend on the machine and its load. ``--quick``: 32 prompts x 2 samples of up to 8 tokens,
one round (a smoke run of the same code path; its numbers mean little);
``tests/benchmarks/test_benchmark_scripts.py`` runs it and checks the JSON line's keys and that every run
returned every sample.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="a GRPO model directory; default: a random-init model of the embedded default's shape")
    ap.add_argument("--prompts", type=int, default=1500)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-completion-length", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-chunked", action="store_true", help="skip the fixed-batch comparison")
    ap.add_argument("--quick", action="store_true", help="32 prompts x 2 samples of up to 8 tokens, 1 round (a smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.prompts, args.samples, args.max_completion_length, args.rounds = 32, 2, 8, 1

    import torch
    from transformers import AutoConfig, AutoTokenizer
    from vllm import SamplingParams

    from grpo_core.config import RejectionSamplingConfig
    from grpo_core.generation import backend_options, make_backend
    from grpo_core.recipe.rejection import rejection_sample
    from grpo_core.data.synthetic import make_chain_splits
    from grpo_core.models.tiny import build_tiny_model
    from grpo_core.generation.prompts import encode_prompts

    torch.set_num_threads(args.threads)
    model = Path(args.model) if args.model else build_tiny_model(Path(tempfile.mkdtemp()) / "tiny")  # hidden 128 x 4 x 4
    rows = make_chain_splits(4000, 200, seed=0)[0]  # the embedded default's training prompts
    sampling = {"num_generations": args.samples, "max_completion_length": args.max_completion_length,
                "max_prompt_length": 32, "vllm_gpu_memory_utilization": 0.3}  # 0.3: what it measured with (grpo_train's)
    rs = RejectionSamplingConfig(sampling=sampling, max_prompts=args.prompts, reward_func="chain_accuracy")
    tokenizer = AutoTokenizer.from_pretrained(model)
    backend = make_backend("vllm", str(model), tokenizer=tokenizer,
                           **backend_options(rs.sampling, "vllm", torch.device("cpu"), seed=rs.seed,
                                             model_config=AutoConfig.from_pretrained(model)))

    prompt_ids = encode_prompts(tokenizer, [r["prompt"] for r in rows[: args.prompts]], rs.sampling.max_prompt_length,
                            "truncate").ids
    requests = [{"prompt_token_ids": p} for p in prompt_ids]
    s = rs.sampling
    params = SamplingParams(n=s.num_generations, temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_completion_length,
                            stop_token_ids=backend.eos_token_ids, detokenize=False)

    def raw() -> tuple[int, int]:
        outputs = backend.llm.generate(requests, params, use_tqdm=False)
        completions = [c for o in outputs for c in o.outputs]
        return len(completions), sum(len(c.token_ids) for c in completions)

    def ours() -> tuple[int, int]:
        kept, stats = rejection_sample(rs, backend, tokenizer, rows)
        return stats["rs/num_samples"], -1  # token count is not exposed by the stage; samples are what it reports

    def chunked() -> tuple[int, int]:
        backend.batches_itself = False  # the stage's fixed batches (batch_size 64 sequences per call)
        try:
            return ours()
        finally:
            backend.batches_itself = True

    backend.llm.generate(requests[:8], params, use_tqdm=False)  # warm-up: first-call compilation and allocation
    runs = [("raw", raw), ("ours", ours)] + ([] if args.no_chunked else [("chunked", chunked)])
    result: dict[str, list[float]] = {f"{name}_samples_per_s": [] for name, _ in runs}
    result["raw_tokens_per_s"] = []
    result["samples_per_run"] = []
    for round_ in range(args.rounds):
        for name, fn in runs:
            start = time.perf_counter()
            samples, tokens = fn()
            wall = time.perf_counter() - start
            result[f"{name}_samples_per_s"].append(round(samples / wall, 1))
            result["samples_per_run"].append(samples)
            if tokens >= 0:
                result["raw_tokens_per_s"].append(round(tokens / wall, 1))
            print(f"round {round_ + 1} {name}: {samples} samples in {wall:.1f} s", file=sys.stderr, flush=True)
    # each round's own ratio compares runs minutes apart, under the same load
    result["ratio_per_round"] = [round(o / r, 3) for o, r in zip(result["ours_samples_per_s"], result["raw_samples_per_s"])]
    raw_median = statistics.median(result["raw_samples_per_s"])
    ratio = statistics.median(result["ours_samples_per_s"]) / raw_median
    if not args.no_chunked:
        result["chunked_ratio"] = round(statistics.median(result["chunked_samples_per_s"]) / raw_median, 3)
    print(json.dumps({"model": "trained" if args.model else "random-init", "prompts": len(prompt_ids),
                      "samples": rs.sampling.num_generations, "threads": args.threads, **result, "ratio": round(ratio, 3)}))


if __name__ == "__main__":
    main()
