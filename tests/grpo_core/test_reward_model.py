"""Reward models: the Bradley-Terry loss by hand, training on rule-made pairs with held-out pair accuracy, the
trained model as a ``reward_funcs`` entry (scope, normalisation, time bound), and a path that is no reward model."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from transformers import AutoConfig

from grpo_core.config import GRPOConfig, RewardConfig, RewardModelSpec
from grpo_core.models.tiny import build_tiny_model
from grpo_core.rewards import pop_reward_stats
from grpo_core.rewards.reward_model import NotARewardModel, RewardModelReward, select_scope
from grpo_core.rewards.scoring import resolve_reward
from grpo_core.trainer.loop import resolve_rewards
from grpo_core.trainer.reward_model import bradley_terry_loss, split_pairs, train_reward_model

GOOD = "Sure. Step 1: gather what you need. Step 2: follow the steps. Thanks for asking!"
BAD = "No."


def test_bradley_terry_loss_hand_computed():
    # r_chosen - r_rejected = [1, -1]: -log sigmoid(1) = log(1 + e^-1) = 0.3132617, -log sigmoid(-1) = log(1 + e)
    # = 1.3132617; mean 0.8132617. One of two pairs ranked right: accuracy 0.5; mean difference 0.
    r_c, r_r = torch.tensor([2.0, 0.5]), torch.tensor([1.0, 1.5])
    loss, metrics = bradley_terry_loss(r_c, r_r)
    assert loss.item() == pytest.approx(0.8132617, abs=1e-6)
    assert metrics == {"accuracy": 0.5, "margin": 0.0}
    # margin 0.5 (TRL's margin column): differences [0.5, -1.5] -> log(1 + e^-0.5) = 0.4740770 and
    # log(1 + e^1.5) = 1.7014132; mean 1.0877451.
    loss, _ = bradley_terry_loss(r_c, r_r, margin=torch.tensor([0.5, 0.5]))
    assert loss.item() == pytest.approx(1.0877451, abs=1e-6)
    # center_rewards_coefficient 0.01: + 0.01 * mean([3^2, 2^2]) = 0.065.
    loss, _ = bradley_terry_loss(r_c, r_r, center_rewards_coefficient=0.01)
    assert loss.item() == pytest.approx(0.8782617, abs=1e-6)


def test_bradley_terry_gradient_pushes_chosen_up():
    r_c, r_r = torch.zeros(3, requires_grad=True), torch.zeros(3, requires_grad=True)
    bradley_terry_loss(r_c, r_r)[0].backward()
    # d/dr_c of -log sigmoid(r_c - r_r) at 0 is -sigmoid(0) = -0.5, over a mean of 3 pairs.
    assert r_c.grad.tolist() == pytest.approx([-0.5 / 3] * 3)
    assert r_r.grad.tolist() == pytest.approx([0.5 / 3] * 3)


def test_select_scope():
    assert select_scope("<think>plan</think> The answer.", "summary") == "The answer."
    assert select_scope("<think>a</think>b</think> c", "summary") == "c"
    assert select_scope("no reasoning here", "summary") is None  # no </think>: no summary
    assert select_scope("<think>cut by the length cap", "summary") is None
    assert select_scope("<think>plan</think> The answer.", "full") == "<think>plan</think> The answer."


def pairs(n: int, seed: int) -> list[dict]:
    """Rule-made pairs: the chosen answer is the polite step-by-step one, the rejected a bare 'No.'."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        q = f"How do I {rng.choice(['cook', 'paint', 'fix', 'clean', 'sell'])} a {rng.choice(['car', 'bike', 'lamp', 'boat'])}?"
        chosen, rejected = (GOOD, BAD) if rng.random() < 0.5 else (GOOD.replace("Sure", "Of course"), BAD.lower())
        rows.append({"prompt": [{"role": "user", "content": q}], "chosen": chosen, "rejected": rejected,
                     "source": "helpful" if i % 2 else "unsafe"})
    return rows


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("rm")
    base = build_tiny_model(root / "base", hidden_size=64, num_layers=2)
    config = RewardConfig(max_steps=24, per_device_train_batch_size=8, learning_rate=1e-3, report_to=["jsonl"],
                          save_steps=100, max_length=128)
    metrics = train_reward_model(config, base, pairs(160, 0), root / "out", resume=False)
    return base, metrics


def test_reward_model_training_reports_held_out_pair_accuracy(trained):
    _, metrics = trained
    assert metrics["eval/num_pairs"] == 16  # eval_fraction 0.1 of 160
    assert metrics["eval/pair_accuracy"] >= 0.9
    assert metrics["eval/reward_margin"] > 0
    assert {"eval/helpful/pair_accuracy", "eval/unsafe/pair_accuracy"} <= set(metrics)
    assert metrics["train/steps"] == 24
    final = metrics["final_path"]
    stats = json.loads(open(f"{final}/reward_stats.json").read())
    assert stats["num_responses"] > 0 and stats["std"] > 0
    config = AutoConfig.from_pretrained(final)
    assert config.architectures[0].endswith("ForSequenceClassification") and config.num_labels == 1
    assert config.pad_token_id is not None


def test_split_pairs_is_seeded_and_disjoint():
    rows = [{"i": i} for i in range(50)]
    train, held = split_pairs(rows, 0.2, seed=3)
    assert len(held) == 10 and len(train) == 40
    assert {r["i"] for r in train}.isdisjoint({r["i"] for r in held})
    assert split_pairs(rows, 0.2, seed=3) == (train, held)


def test_trained_model_is_a_reward_function(trained):
    _, metrics = trained
    rows = pairs(6, seed=1)
    prompts = [r["prompt"] for r in rows] * 2
    # scope: summary (the default) reads the text after </think>
    completions = ([[{"role": "assistant", "content": f"<think>ok</think>{r['chosen']}"}] for r in rows]
                   + [f"<think>ok</think>{r['rejected']}" for r in rows])
    fn, name = resolve_reward({"reward_model": {"model": metrics["final_path"], "name": "rm"}})
    assert name == "rm" and fn.__name__ == "rm"
    scores = fn(prompts=prompts, completions=completions)
    assert len(scores) == 12 and all(isinstance(s, float) for s in scores)
    assert min(scores[:6]) > max(scores[6:])  # every chosen response above every rejected one
    # normalize: (s - mean) / std with the model's reward_stats.json
    stats = json.loads(open(f"{metrics['final_path']}/reward_stats.json").read())
    norm = RewardModelReward(RewardModelSpec(model=metrics["final_path"], normalize=True))(prompts=prompts,
                                                                                           completions=completions)
    assert norm == pytest.approx([(s - stats["mean"]) / stats["std"] for s in scores], abs=1e-4)


def test_scope_summary_scores_only_the_part_after_think(trained):
    _, metrics = trained
    prompt = pairs(1, seed=2)[0]["prompt"]
    summary = RewardModelReward(RewardModelSpec(model=metrics["final_path"], scope="summary"))
    full = RewardModelReward(RewardModelSpec(model=metrics["final_path"], scope="full"))
    reasoned, unreasoned = f"<think>{BAD} {BAD} {BAD}</think>{GOOD}", f"<think></think>{GOOD}"
    s = summary(prompts=[prompt, prompt], completions=[reasoned, unreasoned])
    f = full(prompts=[prompt, prompt], completions=[reasoned, unreasoned])
    assert s[0] == pytest.approx(s[1], abs=1e-5)  # the reasoning is not seen
    assert f[0] != pytest.approx(f[1], abs=1e-3)  # the reasoning is seen


def test_scope_summary_without_think_end_scores_an_empty_summary_and_counts_it(trained):
    """No </think> (reasoning cut by the length cap, or never opened): no summary. It is scored as an empty answer
    and counted as rewards/{name}/no_summary, never as the whole text (the reasoning judged as the answer)."""
    _, metrics = trained
    prompt = pairs(1, seed=2)[0]["prompt"]
    summary = RewardModelReward(RewardModelSpec(model=metrics["final_path"], name="rm_sum", scope="summary"))
    pop_reward_stats()
    s = summary(prompts=[prompt] * 4, completions=[f"<think>{GOOD}", GOOD, "<think>plan</think>", f"<think></think>{GOOD}"])
    assert s[0] == pytest.approx(s[2], abs=1e-5) and s[1] == pytest.approx(s[2], abs=1e-5)  # the empty summary
    assert s[3] > s[2] + 1e-3  # a real summary is read
    assert pop_reward_stats() == {"rewards/rm_sum/no_summary": 2.0}
    full = RewardModelReward(RewardModelSpec(model=metrics["final_path"], name="rm_full", scope="full"))
    full(prompts=[prompt], completions=[GOOD])
    assert pop_reward_stats() == {}  # full scope has nothing to miss


def test_reward_model_is_bounded_in_time_and_counts_timeouts(trained):
    _, metrics = trained
    fn = RewardModelReward(RewardModelSpec(model=metrics["final_path"], name="rm_slow", timeout=1e-9, batch_size=2))
    pop_reward_stats()
    scores = fn(prompts=["q"] * 5, completions=[GOOD] * 5)
    assert scores == [None] * 5
    assert pop_reward_stats()["rewards/rm_slow/timeouts"] == 5.0


def test_grpo_resolves_reward_model_entries(trained):
    _, metrics = trained
    config = GRPOConfig(reward_funcs=["format", {"reward_model": {"model": metrics["final_path"], "scope": "full"}}],
                        generation_batch_size=16)
    funcs, names, _ = resolve_rewards(config, None)
    assert names == ["format", "reward_model"]
    assert isinstance(funcs[1], RewardModelReward) and math.isfinite(funcs[1](prompts=["q"], completions=[GOOD])[0])


def test_causal_lm_is_not_a_reward_model(trained, tmp_path):
    base, _ = trained
    with pytest.raises(NotARewardModel, match=r"names \['LlamaForCausalLM'\], not a \.\.\.ForSequenceClassification"):
        RewardModelReward(RewardModelSpec(model=str(base)))
    with pytest.raises(NotARewardModel, match="no config.json in that folder"):
        RewardModelReward(RewardModelSpec(model=str(tmp_path)))
    with pytest.raises(NotARewardModel, match="no such folder"):
        RewardModelReward(RewardModelSpec(model=str(tmp_path / "missing")))


class StopAt:
    """Interrupts training after ``step`` is logged (its checkpoint, when due, is already written)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step(self, step: int, max_steps: int, metrics: dict) -> None:
        if step == self.step:
            raise KeyboardInterrupt(f"stopped at {step}")


class Steps:
    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_step(self, step: int, max_steps: int, metrics: dict) -> None:
        self.steps.append(step)


def test_interrupted_training_resumes_to_the_same_model(trained, tmp_path):
    from safetensors.torch import load_file

    base, _ = trained
    config = RewardConfig(max_steps=6, per_device_train_batch_size=4, learning_rate=1e-3, report_to=["jsonl"],
                          save_steps=2, max_length=96, lr_scheduler_type="cosine", warmup_steps=1, seed=5)
    rows = pairs(40, seed=4)
    whole = train_reward_model(config, base, rows, tmp_path / "whole", resume=False)
    with pytest.raises(KeyboardInterrupt):
        train_reward_model(config, base, rows, tmp_path / "cut", resume=False, callbacks=[StopAt(3)])
    seen = Steps()
    resumed = train_reward_model(config, base, rows, tmp_path / "cut", resume=True, callbacks=[seen])
    assert seen.steps == [3, 4, 5, 6]  # from checkpoint-2: step 3 was logged but never checkpointed
    a, b = load_file(f"{whole['final_path']}/model.safetensors"), load_file(f"{resumed['final_path']}/model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["eval/pair_accuracy"] == whole["eval/pair_accuracy"]
    steps = [json.loads(line)["step"] for line in open(tmp_path / "cut" / "metrics.jsonl")]
    assert steps == [1, 2, 3, 4, 5, 6][: len(steps)] and steps[-1] == 6 and len(steps) == 6


def test_grpo_trains_on_the_reward_model(trained, tmp_path):
    from grpo_core.trainer.loop import train_grpo

    base, metrics = trained
    config = GRPOConfig(use_vllm=False, max_steps=1, generation_batch_size=8, num_generations=4,
                        max_completion_length=6, max_prompt_length=48, per_device_train_batch_size=8, beta=0.0,
                        save_steps=100, report_to=["jsonl"],
                        reward_funcs=[{"reward_model": {"model": metrics["final_path"], "scope": "full"}}])
    rows = [{"prompt": r["prompt"]} for r in pairs(4, seed=9)]
    train_grpo(config, base, rows, tmp_path, resume=False)
    (step,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert math.isfinite(step["rewards/reward_model/mean"]) and step["rewards/reward_model/std"] > 0
    assert "rewards/reward_model/timeouts" not in step and (tmp_path / "final" / "model.safetensors").is_file()


def test_normalize_without_stats_resumes_with_the_running_moments(trained, tmp_path):
    """`normalize: true` on a model without reward_stats.json divides by the running moments of every score so far;
    they are in the checkpoint, so a run resumed at step 2 maps the same scores to the same rewards (and ends with
    the same weights) as the run that never stopped. Without them the resumed run restarts the moments at step 2."""
    import shutil

    from grpo_core.trainer.loop import train_grpo
    from tests.grpo_core.run_helpers import assert_same_final_weights

    base, metrics = trained
    no_stats = tmp_path / "rm"
    shutil.copytree(metrics["final_path"], no_stats)
    (no_stats / "reward_stats.json").unlink()
    config = GRPOConfig(use_vllm=False, max_steps=3, generation_batch_size=8, num_generations=4,
                        max_completion_length=6, max_prompt_length=48, per_device_train_batch_size=8, beta=0.0,
                        save_steps=1, report_to=["jsonl"], learning_rate=1e-3, seed=5,
                        reward_funcs=[{"reward_model": {"model": str(no_stats), "scope": "full", "normalize": True}}])
    rows = [{"prompt": r["prompt"]} for r in pairs(8, seed=9)]
    whole = train_grpo(config, base, rows, tmp_path / "whole", resume=False)
    killed = tmp_path / "killed"
    train_grpo(config, base, rows, killed, resume=False)
    state = json.loads((killed / "checkpoint-2" / "trainer_state.json").read_text())
    (moments,) = state["reward_state"][0]  # rank 0's state of the one reward function
    assert moments["moments"]["count"] == 2 * 8  # two steps of 2 prompts x 4 completions
    for gone in ("final", "checkpoint-3"):  # as if killed during step 3
        shutil.rmtree(killed / gone)
    resumed = train_grpo(config, base, rows, killed)  # resume=True: from checkpoint-2
    assert resumed["rewards/reward_model/mean"] == whole["rewards/reward_model/mean"]
    assert resumed["reward"] == whole["reward"]
    assert_same_final_weights(tmp_path / "whole", killed)
