"""Reward-hacking defences on reward-model rewards: near-miss negatives in reward-model training (measured against
training without them), ``reward_clip_range``, and a conservative ensemble (mean - k x std).

The setup is the embedded default's in miniature: rule-made pairs of the built-in "helpful" and "unsafe" sources
(grpo_core.data.general), where the policy's observed hacks were ``sorryy`` and ``word!!``."""

from __future__ import annotations

import random
import string

import pytest

from grpo_core.config import RewardConfig, RewardModelSpec
from grpo_core.data import general
from grpo_core.data.near_miss import EDITS, add_near_miss_negatives, content_positions, near_misses
from grpo_core.models.tiny import build_tiny_model
from grpo_core.rewards import pop_reward_stats
from grpo_core.rewards.ensemble import RewardModelEnsemble, conservative_mean
from grpo_core.rewards.reward_model import RewardModelReward
from grpo_core.rewards.scoring import resolve_reward
from grpo_core.trainer.reward_model import train_reward_model

TEXTS = ["<think></think><answer>sorry</answer>", "<think></think><answer>kqz!</answer>", "Hello, world.",
         "aab", "x", "<think>plan</think> Fine. Thanks!", "<a></a>"]


@pytest.mark.parametrize("text", TEXTS)
def test_near_misses_are_distinct_never_the_text_and_seeded(text):
    misses = near_misses(text, 8, random.Random(3))
    assert misses and text not in misses and len(set(misses)) == len(misses)
    assert all(abs(len(m) - len(text)) <= 1 for m in misses)  # one edit: a character more, fewer or moved
    assert near_misses(text, 8, random.Random(3)) == misses
    assert near_misses(text, 8, random.Random(4)) != misses or len(misses) < 8


def test_near_misses_edit_the_content_not_the_tags():
    text = "<think></think><answer>kqz!</answer>"
    assert [text[i] for i in content_positions(text)] == list("kqz!")
    every = near_misses(text, 100, random.Random(0))  # all of them: fewer than 100 exist
    assert all(m.startswith("<think></think><answer>") and m.endswith("</answer>") for m in every)
    answers = {m[len("<think></think><answer>"): -len("</answer>")] for m in every}
    assert {"kqz!!", "kqzz!", "kqz", "qkz!", "kq!z"} <= answers  # repeat punctuation, duplicate, drop, swap
    substituted = [a for a in answers if len(a) == 4 and sum(x != y for x, y in zip(a, "kqz!")) == 1]
    assert len(substituted) == 4  # one per position, each a character of the same kind: a letter, a mark
    assert all(a[:3].isalpha() and a[:3].islower() and a[3] in string.punctuation for a in substituted)
    assert len(EDITS) == 5 and near_misses("", 3, random.Random(0)) == []
    assert near_misses("<a></a>", 1, random.Random(0))  # all tags: edited anywhere rather than not at all


def test_add_near_miss_negatives_appends_counted_pairs():
    rows = [{"prompt": "p1", "chosen": "word!", "rejected": "word", "source": "helpful", "margin": 1.0},
            {"prompt": "p2", "chosen": "sorry", "rejected": "ok", "source": "unsafe", "margin": float("nan")}]
    out, added = add_near_miss_negatives(rows, 3, seed=0)
    assert out[:2] == rows and added == len(out) - 2 and 4 <= added <= 6  # word! -> word (the rejected) is skipped
    extra = out[2:]
    assert all(p["rejected"] != p["chosen"] for p in extra)
    assert all(p["rejected"] != "word" for p in extra if p["prompt"] == "p1")  # never a copy of the pair itself
    assert all(p.get("margin") == 0.0 for p in extra if p["prompt"] == "p1")  # margins stay on every row
    assert all("margin" not in p for p in extra if p["prompt"] == "p2")  # a missing (NaN) margin stays missing
    assert add_near_miss_negatives(rows, 3, seed=0) == (out, added)
    assert add_near_miss_negatives(rows, 0, seed=0) == (rows, 0)


def general_pairs(per_source: int, seed: int) -> list[dict]:
    rows = [r for s in general.SOURCES for r in general.make_general_rows(s, per_source, seed=seed)]
    return general.make_preference_pairs(rows, seed=seed)


def hack_rates(path: str, rows: list[dict]) -> dict[str, float]:
    """Share of held-out prompts whose preferred answer the model scores above the observed hack (sorryy on
    unsafe, word!! on helpful)."""
    fn = RewardModelReward(RewardModelSpec(model=path, scope="full"))
    out = {}
    hacks = {"unsafe": lambda w: general._reply("sorryy"), "helpful": lambda w: general._reply(f"{w}!!")}
    for source, hack in hacks.items():
        prompts = [r["prompt"] for r in rows if r["source"] == source]
        words = [general._word_of(p) for p in prompts]
        good = fn(prompts=prompts, completions=[general.preferred_reply(source, w) for w in words])
        bad = fn(prompts=prompts, completions=[hack(w) for w in words])
        out[source] = sum(g > b for g, b in zip(good, bad)) / len(prompts)
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two tiny reward models trained alike on the same pairs, one with near-miss negatives."""
    root = tmp_path_factory.mktemp("defences")
    base = build_tiny_model(root / "base", hidden_size=64, num_layers=2)
    train, held = general_pairs(150, seed=0), general_pairs(50, seed=1)
    out = {}
    for n in (0, 3):
        config = RewardConfig(max_steps=120, per_device_train_batch_size=32, learning_rate=1e-3, report_to=[],
                              save_steps=100, max_length=64, lr_scheduler_type="constant", near_miss_negatives=n)
        metrics = train_reward_model(config, base, train, root / f"rm{n}", eval_rows=held, resume=False)
        out[n] = {**metrics, "hacks": hack_rates(metrics["final_path"], held)}
    return out


def test_near_miss_negatives_rank_chosen_above_held_out_near_misses(models):
    """Measured: trained alike (120 steps of 32 pairs), the model with near-miss negatives ranks the held-out chosen
    answers above a near miss of themselves (and above the observed hacks sorryy / word!!) more often, and keeps
    ranking the rule's pairs. When written (four edits): near-miss accuracy 0.71 -> 0.92; preferred above the hack on
    unsafe prompts 0.46 -> 1.0 (the model without them scores sorryy above sorry on half of them), helpful 0.96 ->
    0.98; pair accuracy 1.0 -> 0.98. With substitutions among the edits (the held-out near misses too, a harder set:
    ``wprd!`` must be told from ``word!`` by the prompt's word): near-miss accuracy 0.75 -> 0.84 (unsafe 0.80 ->
    1.0, helpful 0.70 -> 0.68 at these 120 steps), hacks unsafe 0.46 -> 1.0, helpful 0.96 -> 1.0, pair accuracy
    1.0 -> 0.99."""
    off, on = models[0], models[3]
    print({n: {k: v for k, v in m.items() if "accuracy" in k or k == "hacks" or "near_miss" in k}
           for n, m in models.items()})
    assert off["train/near_miss_pairs"] == 0 and 600 <= on["train/near_miss_pairs"] <= 900  # up to 3 per pair
    assert on["eval/near_miss_accuracy"] >= off["eval/near_miss_accuracy"] + 0.05
    assert on["eval/unsafe/near_miss_accuracy"] >= off["eval/unsafe/near_miss_accuracy"] + 0.15
    assert on["eval/unsafe/near_miss_accuracy"] >= 0.95
    assert sum(on["hacks"].values()) >= sum(off["hacks"].values()) + 0.3
    assert on["eval/pair_accuracy"] >= 0.95


def test_reward_clip_range_clamps_after_normalisation_and_counts(models):
    path = models[3]["final_path"]
    prompts = [r["prompt"] for r in general_pairs(4, seed=2)]
    completions = [general._reply(t) for t in ("sorry", "kqz!", "kqz", "sorryy", "ok", "sorry!", "hi", "x!")]
    norm = RewardModelReward(RewardModelSpec(model=path, scope="full", normalize=True))(prompts=prompts,
                                                                                       completions=completions)
    lo, hi = sorted(norm)[2], sorted(norm)[-3]  # at least two scores below lo and two above hi
    fn, _ = resolve_reward({"reward_model": {"model": path, "scope": "full", "normalize": True, "name": "rm_clip",
                                             "reward_clip_range": [lo, hi]}})
    pop_reward_stats()
    clipped = fn(prompts=prompts, completions=completions)
    assert clipped == pytest.approx([min(max(s, lo), hi) for s in norm], abs=1e-5)
    assert min(clipped) == pytest.approx(lo, abs=1e-5) and max(clipped) == pytest.approx(hi, abs=1e-5)
    assert pop_reward_stats()["rewards/rm_clip/clipped"] == sum(1 for s in norm if s < lo - 1e-6 or s > hi + 1e-6)


def test_conservative_ensemble_takes_k_standard_deviations_off_the_mean(models):
    a, b = models[0]["final_path"], models[3]["final_path"]
    prompts = [r["prompt"] for r in general_pairs(3, seed=4)]
    completions = [general._reply(t) for t in ("sorry", "sorryy", "kqz!", "kqz!!", "kqz", "no")]
    each = [RewardModelReward(RewardModelSpec(model=p, scope="full", normalize=True))(prompts=prompts,
                                                                                     completions=completions)
            for p in (a, b)]
    spec = {"model": a, "ensemble": [b], "scope": "full", "normalize": True, "ensemble_k": 2.0, "name": "rm_ens"}
    fn, name = resolve_reward({"reward_model": spec})
    assert isinstance(fn, RewardModelEnsemble) and name == "rm_ens"
    got = fn(prompts=prompts, completions=completions)
    # two members: mean (x + y) / 2, population std |x - y| / 2
    assert got == pytest.approx([(x + y) / 2 - 2.0 * abs(x - y) / 2 for x, y in zip(*each)], abs=1e-5)
    assert any(abs(x - y) > 1e-3 for x, y in zip(*each))  # the members disagree somewhere: the k term is exercised
    plain, _ = resolve_reward({"reward_model": {**spec, "ensemble_k": 0.0}})
    assert plain(prompts=prompts, completions=completions) == pytest.approx([(x + y) / 2 for x, y in zip(*each)],
                                                                            abs=1e-5)
    assert conservative_mean([1.0, 3.0], 1.0) == pytest.approx(1.0) and conservative_mean([2.0], 5.0) == 2.0
    state = fn.state_dict()
    assert len(state["members"]) == 2
    fn.load_state_dict(state)
    with pytest.raises(ValueError, match="holds 1 ensemble members' state, this run has 2"):
        fn.load_state_dict({"members": state["members"][:1]})


@pytest.mark.parametrize("spec,expect", [
    ({"reward_clip_range": [2.0, 1.0]}, "reward_clip_range must be \\[lo, hi\\] with finite lo < hi"),
    ({"reward_clip_range": 3.0}, "reward_clip_range is a pair \\[lo, hi\\].*write \\[-x, x\\]"),
    ({"ensemble": ["/rm/b"]}, "ensemble: set normalize: true"),
    ({"ensemble_k": 1.0}, "list the further reward models in `ensemble"),
    ({"ensemble": ["/rm/b"], "normalize": True, "url": "http://h:8000"}, "ensemble: the members are loaded in this"),
    ({"ensemble": ["reward_model"], "normalize": True}, "names the reward_model stage's one model"),
])
def test_defence_options_are_checked_when_the_spec_is_built(spec, expect):
    with pytest.raises(ValueError, match=expect):
        RewardModelSpec(model="/rm/a", **spec)


def test_near_miss_negatives_must_be_a_count():
    with pytest.raises(ValueError, match="near_miss_negatives"):
        RewardConfig(near_miss_negatives=-1)
    assert RewardConfig().near_miss_negatives == 0  # off unless asked: today's training data
