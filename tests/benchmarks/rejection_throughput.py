# python tests/benchmarks/rejection_throughput.py [--model PATH] [--prompts 1500] [--rounds 2] [--threads 2]
"""Rejection sampling's throughput against one raw ``LLM.generate`` call on the same engine, prompts and settings.

The embedded default's rejection_sample stage (configs/tiny-cpu.yaml: 1,500 training prompts x 4 samples,
48 new tokens, temperature 1, chain_accuracy) on vLLM: ``rejection_sample_with_config`` end to end (prompt
encoding, generation, scoring, filters) against ``llm.generate(prompts, SamplingParams(n=4, ...))`` on the
same engine. The two run interleaved (raw, ours, raw, ours, ...) so load from other processes hits both;
the ratio is of the medians. ``--model`` is a trained GRPO model (its completions stop early, as in the
stage); without it a random-init model of the embedded default's shape is built (completions run to the cap).
Prints one JSON line: samples/s for each round, completion tokens/s, and ``ratio`` (ours / raw).
Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="a GRPO model directory; default: a random-init model of the embedded default's shape")
    ap.add_argument("--prompts", type=int, default=1500)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch
    from transformers import AutoConfig, AutoTokenizer
    from vllm import SamplingParams

    from grpo_core.config import GRPOConfig, RejectionSamplingConfig
    from grpo_core.generation import backend_options, make_backend
    from grpo_core.rejection import rejection_sample_with_config
    from grpo_core.synthetic import make_chain_splits
    from grpo_core.tiny import build_tiny_model
    from grpo_core.trainer.prompts import encode_prompts

    torch.set_num_threads(args.threads)
    model = Path(args.model) if args.model else build_tiny_model(Path(tempfile.mkdtemp()) / "tiny")  # hidden 128 x 4 x 4
    rows = make_chain_splits(4000, 200, seed=0)[0]  # the embedded default's training prompts
    rs = RejectionSamplingConfig(num_samples=args.samples, max_new_tokens=args.max_new_tokens, max_prompts=args.prompts,
                                 reward_func="chain_accuracy", max_prompt_length=32)
    tokenizer = AutoTokenizer.from_pretrained(model)
    sizes = GRPOConfig(max_prompt_length=rs.max_prompt_length, max_completion_length=rs.max_new_tokens)
    backend = make_backend("vllm", str(model), tokenizer=tokenizer,
                           **backend_options(sizes, "vllm", torch.device("cpu"), AutoConfig.from_pretrained(model)))

    prompt_ids = encode_prompts(tokenizer, [r["prompt"] for r in rows[: args.prompts]], rs.max_prompt_length, "truncate").ids
    requests = [{"prompt_token_ids": p} for p in prompt_ids]
    params = SamplingParams(n=rs.num_samples, temperature=rs.temperature, top_p=rs.top_p, max_tokens=rs.max_new_tokens,
                            stop_token_ids=backend.eos_token_ids, detokenize=False)

    def raw() -> tuple[int, int]:
        outputs = backend.llm.generate(requests, params, use_tqdm=False)
        completions = [c for o in outputs for c in o.outputs]
        return len(completions), sum(len(c.token_ids) for c in completions)

    def ours() -> tuple[int, int]:
        kept, stats = rejection_sample_with_config(rs, backend, tokenizer, rows)
        return stats["rs/num_samples"], -1  # token count is not exposed by the stage; samples are what it reports

    backend.llm.generate(requests[:8], params, use_tqdm=False)  # warm-up: first-call compilation and allocation
    result: dict[str, list[float]] = {"raw_samples_per_s": [], "ours_samples_per_s": [], "raw_tokens_per_s": []}
    for _ in range(args.rounds):
        for name, fn in (("raw", raw), ("ours", ours)):
            start = time.perf_counter()
            samples, tokens = fn()
            wall = time.perf_counter() - start
            result[f"{name}_samples_per_s"].append(round(samples / wall, 1))
            if tokens >= 0:
                result["raw_tokens_per_s"].append(round(tokens / wall, 1))
    ratio = statistics.median(result["ours_samples_per_s"]) / statistics.median(result["raw_samples_per_s"])
    print(json.dumps({"model": "trained" if args.model else "random-init", "prompts": len(prompt_ids),
                      "samples": rs.num_samples, "threads": args.threads, **result, "ratio": round(ratio, 3)}))


if __name__ == "__main__":
    main()
