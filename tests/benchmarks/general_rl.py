# python tests/benchmarks/general_rl.py [--tag B] [--seed 0] [--preferred-fraction 0.3] [--lr 5e-5] [--steps 40] [--quick]
"""Final RL on the built-in general sources alone, at the embedded default's model size (hidden 128 x 4 layers):
cold-start SFT (300 steps) on helpful/unsafe answers with ``--preferred-fraction`` preferred, a reward model on the
rule-made pairs, then GRPO with the reward model as the only reward; prints eval/rm_score and eval/preferred_rate
before and after (greedy, held-out prompts) as one JSON line. The embedded default's general_cold_start_preferred
was chosen with it (README: +28/+44 points at 0.15, +70/+73/+83 at 0.3, 40 steps). Models go to a temporary folder
unless ``--out`` names one. ``--quick``: the same path at tiny sizes (2 SFT, 2 reward-model and 2 GRPO steps on 40
prompts a source), seconds; ``tests/benchmarks/test_benchmark_scripts.py`` runs it and checks the JSON line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from grpo_core.config import EvalConfig, GRPOConfig, RewardConfig, RewardModelSpec, SFTConfig, SourceMix
from grpo_core.data import general
from grpo_core.evaluation.heldout import evaluate
from grpo_core.models.tiny import build_tiny_model
from grpo_core.trainer.loop import train_grpo
from grpo_core.trainer.reward_model import train_reward_model
from grpo_core.trainer.sft import train_sft

SOURCES = ("helpful", "unsafe")


def build_rows(seed: int, pref: float, sizes: dict[str, int]) -> tuple[list[dict], list[dict], list[dict], list[dict]]:
    """(train prompts, held-out prompts, cold-start rows, preference pairs) of both general sources."""
    train: list[dict] = []
    ev: list[dict] = []
    cold: list[dict] = []
    pairs: list[dict] = []
    for s in SOURCES:
        t, e = general.make_general_splits(s, sizes["train"], sizes["eval"], seed=seed)
        train += t
        ev += e
        excl = {r["prompt"][0]["content"] for r in e}
        cold += general.make_general_cold_start(general.make_general_rows(s, sizes["cold"], seed=10_000 + seed, exclude=excl),
                                                preferred_fraction=pref, seed=seed)
        pairs += general.make_preference_pairs(general.make_general_rows(s, sizes["pairs"], seed=20_000 + seed,
                                                                         exclude=excl), seed=seed)
    return train, ev, cold, pairs


def run(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    sizes = ({"train": 40, "eval": 8, "cold": 40, "pairs": 40} if args.quick
             else {"train": 300, "eval": 50, "cold": 400, "pairs": 500})
    sft_steps, rm_steps = (2, 2) if args.quick else (300, 80)
    seed = args.seed
    train, ev, cold, pairs = build_rows(seed, args.preferred_fraction, sizes)
    t0 = time.time()
    base = build_tiny_model(out / "base", seed=seed)
    train_sft(SFTConfig(learning_rate=3e-3, lr_scheduler_type="cosine", warmup_steps=10, max_steps=sft_steps,
                        per_device_train_batch_size=32, max_length=48, report_to=["jsonl"], save_steps=1000,
                        torch_num_threads=1, seed=seed), base, cold, out / "sft", resume=False)
    rm = train_reward_model(RewardConfig(learning_rate=1e-3, lr_scheduler_type="constant", max_steps=rm_steps,
                                         per_device_train_batch_size=32, max_length=64, report_to=["jsonl"],
                                         save_steps=1000, torch_num_threads=1, seed=seed),
                            base, pairs, out / "rm", resume=False)
    rm_path = rm["final_path"]

    def measure(path: Path) -> dict[str, float]:
        m = evaluate(EvalConfig(general_sources=list(SOURCES), rule_reward="preference_rule", forced_reasoning=False,
                                rm_reward=RewardModelSpec(model=rm_path, name="rm", scope="full"),
                                sampling={"max_completion_length": 32, "batch_size": 100, "num_generations": 0}),
                     str(path), ev)
        return {k: round(v, 3) for k, v in m.items() if "rm_score" in k or "preferred" in k}

    before = measure(out / "sft" / "final")
    cfg = GRPOConfig(learning_rate=args.lr, lr_scheduler_type="constant", max_steps=args.steps, save_steps=1000,
                     generation_batch_size=64, per_device_train_batch_size=64, beta=0.04, report_to=["jsonl"],
                     torch_num_threads=1, seed=seed,
                     sampling={"num_generations": 8, "max_prompt_length": 32, "max_completion_length": 32,
                               "use_vllm": False},
                     sources=[SourceMix(name="helpful", weight=1, reward_funcs=[
                                  RewardModelSpec(model=rm_path, name="rm_helpful", scope="summary")]),
                              SourceMix(name="unsafe", weight=1, reward_funcs=[
                                  RewardModelSpec(model=rm_path, name="rm_harmless", scope="full")])])
    train_grpo(cfg, out / "sft" / "final", train, out / "grpo", resume=False)
    after = measure(out / "grpo" / "final")
    return {"tag": args.tag, "seed": seed, "pref": args.preferred_fraction, "lr": args.lr, "steps": args.steps,
            "rm_pair_acc": rm.get("eval/pair_accuracy"), "before": before, "after": after,
            "wall_s": round(time.time() - t0), "quick": args.quick}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", default="B", help="a label for the JSON line (and the folder under --out)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--preferred-fraction", type=float, default=0.3, help="share of cold-start answers preferred")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--steps", type=int, default=40, help="GRPO steps")
    parser.add_argument("--out", help="keep the models under OUT/TAG (default: a temporary folder, removed)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 2 steps a stage (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.steps = 2
    torch.set_num_threads(1)
    out = Path(args.out) / args.tag if args.out else Path(tempfile.mkdtemp(prefix="general-rl-"))
    try:
        print(json.dumps(run(args, out)))
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
