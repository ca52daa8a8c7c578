# python tests/benchmarks/general_rl.py TAG SEED PREFERRED_FRACTION LR STEPS   (e.g. B 0 0.3 5e-5 40)
"""Final RL on the built-in general sources alone, at the embedded default's model size (hidden 128 x 4 layers):
cold-start SFT (300 steps) on helpful/unsafe answers with PREFERRED_FRACTION preferred, a reward model on the
rule-made pairs, then GRPO with the reward model as the only reward; prints eval/rm_score and eval/preferred_rate
before and after (greedy, held-out prompts). The embedded default's general_cold_start_preferred was chosen with it."""

import json
import sys
import time

import torch

torch.set_num_threads(1)

from grpo_core.config import EvalConfig, GRPOConfig, RewardConfig, RewardModelSpec, SFTConfig, SourceMix
from grpo_core.data import general
from grpo_core.evaluation.heldout import evaluate
from grpo_core.models.tiny import build_tiny_model
from grpo_core.trainer.loop import train_grpo
from grpo_core.trainer.reward_model import train_reward_model
from grpo_core.trainer.sft import train_sft
tag, seed, pref, lr, steps = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
out = f"/tmp/general-rl/{tag}"
train, ev, cold, pairs = [], [], [], []
for s in ("helpful", "unsafe"):
    t, e = general.make_general_splits(s, 300, 50, seed=seed)
    train += t; ev += e
    excl = {r["prompt"][0]["content"] for r in e}
    cold += general.make_general_cold_start(general.make_general_rows(s, 400, seed=10_000 + seed, exclude=excl), preferred_fraction=pref, seed=seed)
    pairs += general.make_preference_pairs(general.make_general_rows(s, 500, seed=20_000 + seed, exclude=excl), seed=seed)
t0 = time.time()
base = build_tiny_model(f"{out}/base", seed=seed)
train_sft(SFTConfig(learning_rate=3e-3, lr_scheduler_type="cosine", warmup_steps=10, max_steps=300, per_device_train_batch_size=32, max_length=48, report_to=["jsonl"], save_steps=1000, torch_num_threads=1, seed=seed), base, cold, f"{out}/sft", resume=False)
rm = train_reward_model(RewardConfig(learning_rate=1e-3, lr_scheduler_type="constant", max_steps=80, per_device_train_batch_size=32, max_length=64, report_to=["jsonl"], save_steps=1000, torch_num_threads=1, seed=seed), base, pairs, f"{out}/rm", resume=False)
rm_path = rm["final_path"]
def measure(path):
    m = evaluate(EvalConfig(general_sources=["helpful", "unsafe"], rm_reward=RewardModelSpec(model=rm_path, name="rm", scope="full"), rule_reward="preference_rule", sampling={"max_completion_length": 32, "batch_size": 100, "num_generations": 0}, forced_reasoning=False), path, ev)
    return {k: round(v, 3) for k, v in m.items() if "rm_score" in k or "preferred" in k}
before = measure(f"{out}/sft/final")
cfg = GRPOConfig(learning_rate=lr, lr_scheduler_type="constant", max_steps=steps, save_steps=1000, num_generations=8, generation_batch_size=64, per_device_train_batch_size=64, max_prompt_length=32, max_completion_length=32, beta=0.04, use_vllm=False, report_to=["jsonl"], torch_num_threads=1, seed=seed,
                 sources=[SourceMix(name="helpful", weight=1, reward_funcs=[RewardModelSpec(model=rm_path, name="rm_helpful", scope="summary")]),
                          SourceMix(name="unsafe", weight=1, reward_funcs=[RewardModelSpec(model=rm_path, name="rm_harmless", scope="full")])])
train_grpo(cfg, f"{out}/sft/final", train, f"{out}/grpo", resume=False)
after = measure(f"{out}/grpo/final")
print(json.dumps({"tag": tag, "seed": seed, "pref": pref, "lr": lr, "steps": steps, "rm_pair_acc": rm.get("eval/pair_accuracy"), "before": before, "after": after, "wall_s": round(time.time() - t0)}))
