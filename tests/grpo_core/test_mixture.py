"""A GRPO data mixture by source: prompts per step by weight, rewards routed per source, groups of one source,
per-source metrics in the JSONL."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from grpo_core.config import GRPOConfig, SourceMix
from grpo_core.generation import Rollout
from grpo_core.models.tiny import build_tiny_model
from grpo_core.rewards import REWARD_FUNCS, register_reward
from grpo_core.rewards.base import completion_text, last_user_text
from grpo_core.rewards.scoring import score_completions
from grpo_core.trainer.loop import train_grpo
from grpo_core.trainer.mixture import Mixture, MixtureError, allot_prompts, per_source_scale

torch.set_num_threads(1)

SOURCES = ("alpha", "beta", "gamma")
ROWS = [{"prompt": [{"role": "user", "content": f"{s[0]}{i}"}], "answer": "", "task": s, "source": s}
        for s in SOURCES for i in range(12)]
CALLS: list[tuple[str, list[str], list[str]]] = []  # (reward, sources it saw, prompts it saw)


def _recording(name: str, value: float):
    def reward(prompts, completions, source, **kwargs):
        CALLS.append((name, list(source), [last_user_text(p) for p in prompts]))
        return [value + len(completion_text(c)) % 3 for c in completions]  # varies, so groups are informative

    reward.__name__ = name
    return reward


@pytest.fixture(autouse=True, scope="module")
def registered():
    """The three rewards, registered by name for this module only (other tests list the registry)."""
    names = {"mix_alpha": 0.0, "mix_beta": 10.0, "mix_gamma": 100.0}
    for name, value in names.items():
        register_reward(name)(_recording(name, value))
    yield
    for name in names:
        REWARD_FUNCS.pop(name, None)


def mix_config(**overrides) -> GRPOConfig:
    fields = dict(
        use_vllm=False, max_steps=2, generation_batch_size=16, num_generations=4, max_completion_length=6,
        max_prompt_length=16, per_device_train_batch_size=16, learning_rate=1e-3, beta=0.0, save_steps=100,
        report_to=["jsonl"], scale_rewards="batch",
        sources=[SourceMix(name="alpha", weight=2.0, reward_funcs=["mix_alpha"]),
                 SourceMix(name="beta", weight=1.0, reward_funcs=["mix_beta"]),
                 SourceMix(name="gamma", weight=1.0, reward_funcs=["mix_gamma"])],
    )
    fields.update(overrides)
    return GRPOConfig(**fields)


def test_allot_prompts_largest_remainder():
    assert allot_prompts([2, 1, 1], 4) == [2, 1, 1]
    assert allot_prompts([1, 1], 3) == [2, 1]  # tie: the earlier source
    assert allot_prompts([0.7, 0.2, 0.1], 10) == [7, 2, 1]
    assert allot_prompts([1, 1, 1], 4) == [2, 1, 1]


def test_each_step_takes_its_share_of_every_source_and_groups_stay_in_one_source():
    config = mix_config(generation_batch_size=32)  # 8 prompts per step: 4 alpha, 2 beta, 2 gamma
    mixture = Mixture(config, ROWS, lambda entries: ([REWARD_FUNCS[e] for e in entries], list(entries)))
    assert mixture.counts == [4, 2, 2]
    seen = Counter()
    for step in range(6):
        idx = mixture.rows_at(step * 8, 8)
        assert mixture.rows_at(step * 8, 8) == idx  # a position names one prompt, always
        rows = [mixture.rows[i] for i in idx]
        assert [r["source"] for r in rows] == ["alpha"] * 4 + ["beta"] * 2 + ["gamma"] * 2
        seen.update(r["prompt"][0]["content"] for r in rows)
    assert sum(1 for p in seen if p.startswith("a")) == 12  # 24 alpha draws cover its 12 rows (an epoch each)


def test_a_source_with_no_rows_or_no_share_is_refused():
    resolve = lambda entries: ([REWARD_FUNCS[e] for e in entries], list(entries))  # noqa: E731
    with pytest.raises(MixtureError, match="source 'gamma' has no training rows.*alpha, beta"):
        Mixture(mix_config(), [r for r in ROWS if r["source"] != "gamma"], resolve)
    tiny = mix_config(sources=[SourceMix(name="alpha", weight=100, reward_funcs=["mix_alpha"]),
                               SourceMix(name="beta", weight=1, reward_funcs=["mix_beta"])])
    with pytest.raises(MixtureError, match="source 'beta' .* gets 0 of the 4 prompts"):
        Mixture(tiny, ROWS, resolve)


@pytest.mark.parametrize("weight", [0, -1.0])
def test_a_weight_of_zero_or_below_is_refused(weight):
    with pytest.raises(ValueError, match=f"source 'beta' has weight {weight}.* must be > 0"):
        SourceMix(name="beta", weight=weight, reward_funcs=["mix_beta"])


def test_a_source_without_reward_functions_is_refused():
    with pytest.raises(ValueError, match="source 'beta' has no reward function"):
        SourceMix(name="beta", weight=1.0)


def test_routes_call_each_function_on_its_own_rows_only():
    rows = [ROWS[0], ROWS[12], ROWS[24], ROWS[1]]  # alpha, beta, gamma, alpha
    mixture = Mixture(mix_config(), ROWS, lambda entries: ([REWARD_FUNCS[e] for e in entries], list(entries)))
    rollouts = [Rollout([1], [2], None, False, "x" * k) for k in range(8)]  # G = 2
    CALLS.clear()
    scores = score_completions(mixture.funcs, mixture.reward_names, rows, rollouts, 2, 6, mixture.routes(rows))
    assert [(n, s) for n, s, _ in CALLS] == [("mix_alpha", ["alpha"] * 4), ("mix_beta", ["beta"] * 2),
                                             ("mix_gamma", ["gamma"] * 2)]
    nan = float("nan")
    expected = torch.tensor([[0, nan, nan], [1, nan, nan], [nan, 12, nan], [nan, 10, nan],
                             [nan, nan, 101], [nan, nan, 102], [0, nan, nan], [1, nan, nan]])
    torch.testing.assert_close(scores, expected, equal_nan=True)


def test_batch_scaling_uses_each_sources_own_std():
    rewards = torch.tensor([0.0, 2.0, 100.0, 300.0])
    centred = torch.tensor([-1.0, 1.0, -100.0, 100.0])
    out = per_source_scale(centred, rewards, ["a", "a", "b", "b"], eps=0.0)
    a_std, b_std = torch.tensor([0.0, 2.0]).std(), torch.tensor([100.0, 300.0]).std()
    torch.testing.assert_close(out, torch.tensor([-1 / a_std, 1 / a_std, -100 / b_std, 100 / b_std]))


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=32, num_layers=2, num_heads=2)


def test_three_sources_three_rewards_routed_in_training(tmp_path, tiny_path):
    CALLS.clear()
    out = train_grpo(mix_config(), tiny_path, ROWS, tmp_path / "run", resume=False)
    assert out["step"] == 2
    # every call of a source's reward saw that source's rows only, each prompt's G completions together
    by_reward = {"mix_alpha": "alpha", "mix_beta": "beta", "mix_gamma": "gamma"}
    assert {n for n, _, _ in CALLS} == set(by_reward)
    for name, sources, prompts in CALLS:
        assert set(sources) == {by_reward[name]}, (name, sources)
        groups = [prompts[i:i + 4] for i in range(0, len(prompts), 4)]
        assert all(len(set(g)) == 1 for g in groups), prompts  # a group is G samples of one prompt
    per_step = Counter(n for n, _, _ in CALLS)
    assert per_step == {"mix_alpha": 2, "mix_beta": 2, "mix_gamma": 2}  # one call per source per step
    assert Counter(len(p) for n, _, p in CALLS if n == "mix_alpha") == {8: 2}  # 2 prompts x G=4 per step
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for m in lines:
        assert 0 <= m["rewards/alpha/mean"] < 3 and 10 <= m["rewards/beta/mean"] < 13
        assert 100 <= m["rewards/gamma/mean"] < 103
        assert m["rewards/mix_gamma/mean"] == m["rewards/gamma/mean"]  # gamma's function scored gamma only
        assert (m["mixture/alpha/prompts"], m["mixture/beta/prompts"], m["mixture/gamma/prompts"]) == (2, 1, 1)
        assert (m["completions/count"], m["completions/alpha/count"], m["completions/beta/count"]) == (16, 8, 4)
        # accuracy: each source's own (first) reward passes (>= 1): beta's and gamma's always, alpha's sometimes
        assert m["completions/beta/accuracy"] == 1.0 and m["completions/gamma/accuracy"] == 1.0
        assert 0.0 <= m["completions/alpha/accuracy"] <= 1.0
        assert not any(k.endswith("/checking_rate") for k in m)  # no source has tries


def test_sft_epoch_takes_each_sources_share():
    from grpo_core.config import SFTConfig, SourceWeight
    from grpo_core.trainer.mixture import weighted_epoch

    rows = [{"prompt": f"c{i}", "completion": "x", "source": "chain"} for i in range(30)]
    rows += [{"prompt": f"h{i}", "completion": "y", "source": "helpful"} for i in range(6)]
    rows += [{"prompt": f"o{i}", "completion": "z", "source": "other"} for i in range(4)]
    sources = SFTConfig(sources=[SourceWeight(name="chain", weight=1), SourceWeight(name="helpful", weight=1)]).sources
    epoch = weighted_epoch(rows, sources, seed=0)
    assert Counter(r["source"] for r in epoch) == {"chain": 18, "helpful": 18}  # 36 rows, half each; "other" out
    assert len({r["prompt"] for r in epoch if r["source"] == "chain"}) == 18  # subsampled without repeats
    assert {r["prompt"] for r in epoch if r["source"] == "helpful"} == {f"h{i}" for i in range(6)}  # cycled 3 times
    assert weighted_epoch(rows, sources, seed=0) == epoch
    with pytest.raises(MixtureError, match="source 'missing' has no SFT rows"):
        weighted_epoch(rows, [SourceWeight(name="missing")], seed=0)


# --- quotas under DAPO dynamic sampling: each source refills its own share of the step ---

QUOTA_SOURCES = ("chain", "helpful", "unsafe")  # weights 2 : 1 : 1 of 16 prompts: 8 + 4 + 4 groups a step


def quota_config(rounds: int) -> GRPOConfig:
    return GRPOConfig(generation_batch_size=64, num_generations=4, dynamic_sampling=True,
                      max_dynamic_sampling_rounds=rounds,
                      sources=[SourceMix(name="chain", weight=2.0, reward_funcs=["mix_alpha"]),
                               SourceMix(name="helpful", weight=1.0, reward_funcs=["mix_beta"]),
                               SourceMix(name="unsafe", weight=1.0, reward_funcs=["mix_gamma"])])


def near_ceiling(informative_chain: int, calls: list[tuple[int, int]]):
    """``generate(position, count)``: of each block's 8 chain groups only the first ``informative_chain`` have
    a wrong answer (the rest all right: flat); every helpful and unsafe group is informative."""
    from grpo_core.trainer.rollouts import ScoredGroups

    def generate(position: int, count: int) -> ScoredGroups:
        calls.append((position, count))
        positions = list(range(position, position + count))
        rows, rewards = [], []
        for p in positions:
            offset = p % 16
            source = "chain" if offset < 8 else "helpful" if offset < 12 else "unsafe"
            rows.append({"prompt": str(p), "source": source})
            flat = source == "chain" and offset >= informative_chain
            rewards += [1.0] * 4 if flat else [0.0, 1.0, 1.0, 1.0]
        rollouts = [Rollout([p], [1], None, False, "") for p in positions for _ in range(4)]
        return ScoredGroups(positions, rows, rollouts, torch.tensor(rewards)[:, None], [False] * count)

    return generate


def _combined(groups) -> torch.Tensor:
    return groups.rewards_per_func[:, 0]


def test_dynamic_sampling_fills_each_sources_quota_with_its_own_groups():
    from grpo_core.trainer.mixture import source_group_metrics
    from grpo_core.trainer.rollouts import collect_step_groups

    config = quota_config(rounds=3)
    mixture = Mixture(config, [{"prompt": "x", "source": s} for s in QUOTA_SOURCES],
                      lambda entries: ([REWARD_FUNCS[e] for e in entries], list(entries)))
    assert mixture.counts == [8, 4, 4]
    calls: list[tuple[int, int]] = []
    out = collect_step_groups(near_ceiling(3, calls), 0, config, _combined, quotas=mixture.counts)
    metrics = source_group_metrics(out.train.rows, mixture.names, out.short)
    weights = [s.weight for s in config.sources]
    for name, w in zip(QUOTA_SOURCES, weights):  # the configured mixture, within one group
        assert abs(metrics[f"mixture/{name}/trained"] - 16 * w / sum(weights)) <= 1, metrics
    assert [metrics[f"mixture/{n}/trained"] for n in QUOTA_SOURCES] == [8, 4, 4]
    assert [metrics[f"mixture/{n}/short"] for n in QUOTA_SOURCES] == [0, 0, 0] and out.short == [0, 0, 0]
    assert calls == [(0, 16), (16, 8), (32, 8)]  # refills generate only the short source's slice of a block
    assert out.rounds == 3 and out.position == 48 and out.informative == 16 and len(out.generated) == 32


def test_a_source_that_cannot_fill_its_quota_is_short_never_replaced():
    from grpo_core.trainer.mixture import source_group_metrics
    from grpo_core.trainer.rollouts import collect_step_groups

    config = quota_config(rounds=2)
    names = list(QUOTA_SOURCES)
    out = collect_step_groups(near_ceiling(1, []), 0, config, _combined, quotas=[8, 4, 4])
    metrics = source_group_metrics(out.train.rows, names, out.short)
    # 3 rounds x 1 informative chain group: 3 of its 8, logged short by 5; helpful and unsafe keep 4 each
    assert [metrics[f"mixture/{n}/trained"] for n in names] == [3, 4, 4]
    assert metrics["mixture/chain/short"] == 5 and out.short == [5, 0, 0] and out.informative == 11
    assert Counter(r["source"] for r in out.train.rows) == {"chain": 3, "helpful": 4, "unsafe": 4}


def test_flat_steps_report_no_kept_group_and_each_source_short(tmp_path, tiny_path, caplog):
    """Every reward constant: no group carries an advantage, so kept_groups is 0 (not prompts_per_step), every
    source is short by its whole quota, the flat first round the step falls back to is logged apart from the trained
    groups, and the first time a source is short a warning names it."""
    register_reward("mix_flat")(lambda completions, **kw: [1.0] * len(completions))
    try:
        sources = [SourceMix(name=s, weight=w, reward_funcs=["mix_flat"]) for s, w in zip(SOURCES, (2.0, 1.0, 1.0))]
        with caplog.at_level("WARNING", logger="grpo_core.trainer.step"):
            train_grpo(mix_config(sources=sources, dynamic_sampling=True, max_dynamic_sampling_rounds=1, max_steps=2),
                       tiny_path, ROWS, tmp_path / "run", resume=False)
    finally:
        REWARD_FUNCS.pop("mix_flat", None)
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for m in lines:
        assert m["dynamic_sampling/kept_groups"] == 0 and m["dynamic_sampling/rounds"] == 2
        assert m["frac_reward_zero_std"] == 1.0
        assert (m["mixture/alpha/short"], m["mixture/beta/short"], m["mixture/gamma/short"]) == (2, 1, 1)
        # the step falls back to its flat first round: those groups are counted apart, none as trained
        assert (m["mixture/alpha/trained"], m["mixture/beta/trained"], m["mixture/gamma/trained"]) == (0, 0, 0)
        assert (m["mixture/alpha/flat_fallback"], m["mixture/beta/flat_fallback"],
                m["mixture/gamma/flat_fallback"]) == (2, 1, 1)
    warned = [r.getMessage() for r in caplog.records if "other sources do not fill its share" in r.getMessage()]
    assert len(warned) == 3 and "source 'alpha' trained 0 of its 2 groups" in warned[0]


def test_two_sources_naming_one_reward_differently_are_refused_and_one_entry_is_shared():
    """Two reward-model entries under one name (here the default `reward_model`) collapsed into the first one's model
    and scope; they are refused at config load naming both sources, what differs and the fix."""
    from pydantic import ValidationError

    def rm(model: str, scope: str) -> dict:
        return {"reward_model": {"model": model, "scope": scope}}

    def sources(a: dict, b: dict) -> list[dict]:
        return [{"name": "helpful", "reward_funcs": [a]}, {"name": "unsafe", "reward_funcs": [b]}]

    with pytest.raises(ValidationError, match=r"sources 'helpful' and 'unsafe' both name a reward 'reward_model' but "
                                              r"the entries differ \(model: '/rm/a' vs '/rm/b', scope: 'summary' vs "
                                              r"'full'\).*name: reward_model_unsafe"):
        GRPOConfig(sources=sources(rm("/rm/a", "summary"), rm("/rm/b", "full")))
    with pytest.raises(ValidationError, match="both name a reward 'mix_alpha'.*registered: 'mix_alpha' vs None"):
        GRPOConfig(sources=sources("mix_alpha", {"judge": {"model": "/judge", "name": "mix_alpha"}}))
    shared = GRPOConfig(generation_batch_size=16, num_generations=4,
                        sources=sources(rm("/rm/a", "summary"), rm("/rm/a", "summary")))
    resolved: list[list] = []

    def resolve(entries):
        resolved.append(list(entries))
        return [lambda completions, **kw: [0.0] * len(completions)] * len(entries), [e.name for e in entries]

    rows = [{"prompt": "p", "source": s} for s in ("helpful", "unsafe")]
    mixture = Mixture(shared, rows, resolve)
    assert len(resolved[0]) == 1 and mixture.reward_names == ["reward_model"]  # one model, loaded once
    assert mixture.member.tolist() == [[True], [True]]


def test_each_source_logs_its_own_completion_features_in_a_mixture():
    from grpo_core.trainer.metrics import source_completion_metrics

    def r(text):
        return Rollout([1], [5] * len(text), None, False, text)

    rollouts = [r("<think>3+8=11?13;wait;8+5=13?13</think><answer>8+5</answer>"), r("<think>3+8=11</think><answer>3+8</answer>"),
                r("<think>1+2=3;3+3=6</think><answer>6</answer>"), r("<think>1+2=3;3+3=6</think><answer>6</answer>")]
    m = source_completion_metrics(rollouts, ["countdown", "countdown", "chain", "chain"])
    assert m["completions/countdown/reflection_rate"] == 0.5 and m["completions/chain/reflection_rate"] == 0.0
    assert m["completions/countdown/mean_length"] == (len(rollouts[0].text) + len(rollouts[1].text)) / 2
    assert m["completions/chain/mean_steps"] == 2.0 and m["completions/countdown/mean_steps"] == 2.0
    assert source_completion_metrics(rollouts, ["chain"] * 4) == {}  # one source: the step's own keys say it


def test_each_source_logs_its_count_accuracy_and_checking_numbers():
    """Issue 42: per source the completions counted, their accuracy, and on a task with tries (countdown) whether
    reflection is checking that pays; one source logs them as the step's own keys."""
    from grpo_core.trainer.metrics import completion_metrics, source_completion_metrics

    def r(text):
        return Rollout([1], [5] * len(text), None, False, text)

    texts = ["<think>3+8=11?13;wait;8+5=13?13</think><answer>8+5</answer>", "<think>3+8=11</think><answer>3+8</answer>",
             "<think>8+5=13;wait;3+8=11</think><answer>3+8</answer>", "<think>1+2=3;3+3=6</think><answer>6</answer>"]
    rollouts = [r(t) for t in texts]
    prompts = [[{"role": "user", "content": "3,8,5->13:"}]] * 3 + ["1+2+3="]
    labels, correct = ["countdown"] * 3 + ["chain"], [True, False, False, True]
    m = source_completion_metrics(rollouts, labels, prompts=prompts, correct=correct)
    assert m["completions/countdown/count"] == 3 and m["completions/chain/count"] == 1
    assert m["completions/countdown/accuracy"] == pytest.approx(1 / 3) and m["completions/chain/accuracy"] == 1.0
    assert m["completions/countdown/checking_rate"] == pytest.approx(1 / 3)  # only the first checks a miss and retries
    assert m["completions/countdown/miss_retry_rate"] == pytest.approx(1 / 3)  # of its 3 misses
    assert m["completions/countdown/hit_stop_rate"] == 0.5  # the third goes on past its hit ...
    assert m["completions/countdown/reflection_after_hit_rate"] == pytest.approx(1 / 3)  # ... with a wait after it
    assert m["completions/countdown/first_try_hit_rate"] == pytest.approx(1 / 3)
    assert m["completions/countdown/retry_hit_rate"] == 1.0
    assert not any(k.startswith("completions/chain/") and k.endswith("_rate") and "reflection_rate" not in k
                   for k in m)  # no tries, no checking numbers
    one = completion_metrics(rollouts[:3], prompts=prompts[:3], correct=correct[:3])
    assert one["completions/count"] == 3 and one["completions/checking_rate"] == pytest.approx(1 / 3)
    assert one["completions/accuracy"] == pytest.approx(1 / 3)
    assert "completions/checking_rate" not in completion_metrics(rollouts[3:], prompts=prompts[3:])


def test_a_source_with_tries_logs_its_checking_numbers_each_step(tmp_path, tiny_path):
    """Issue 42 wired through a GRPO step: a source whose prompts are countdown problems logs
    ``completions/{source}/checking_rate`` and the rest beside its count and accuracy; the source without tries
    logs none, and the mixed step no unprefixed checking numbers."""
    rows = [{"prompt": [{"role": "user", "content": f"{i},{i + 1},5->{2 * i + 1}:"}], "answer": str(2 * i + 1),
             "source": "alpha"} for i in range(1, 9)] + [r for r in ROWS if r["source"] == "beta"]
    sources = [SourceMix(name="alpha", weight=1.0, reward_funcs=["mix_alpha"]),
               SourceMix(name="beta", weight=1.0, reward_funcs=["mix_beta"])]
    train_grpo(mix_config(sources=sources, max_steps=1), tiny_path, rows, tmp_path / "run", resume=False)
    m = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert m["completions/alpha/count"] == 8 and m["completions/beta/count"] == 8
    assert 0.0 <= m["completions/alpha/checking_rate"] <= 1.0  # an untrained model: no tries, so 0
    assert {f"completions/alpha/{k}" for k in ("miss_retry_rate", "hit_stop_rate", "first_try_hit_rate",
                                               "retry_hit_rate", "reflection_after_hit_rate")} <= set(m)
    assert "completions/beta/checking_rate" not in m and "completions/checking_rate" not in m
