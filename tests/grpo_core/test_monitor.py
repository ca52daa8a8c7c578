"""The reward-hacking monitor (grpo_core/trainer/monitor.py) and ``select_checkpoint: heldout``
(grpo_core/trainer/selection.py): the alarm rule by hand, the config checks, and a tiny run whose proxy is gamed."""

from __future__ import annotations

import json
import math

import pytest
import torch

from grpo_core.config import EvalConfig, GRPOConfig
from grpo_core.rewards.base import REWARD_FUNCS, completion_text, register_reward, reward_names
from grpo_core.trainer.monitor import best_evaluation, hacking_alarm
from tests.grpo_core.run_helpers import read_metrics


def test_alarm_fires_when_the_proxy_rises_while_the_heldout_signal_falls():
    alarm = hacking_alarm("unsafe", [(10, 1.0, 0.6), (20, 2.0, 0.5), (30, 4.9, 0.2)], window=3)
    assert alarm is not None and (alarm.first_step, alarm.step) == (10, 30)
    assert (alarm.proxy_first, alarm.proxy_last, alarm.heldout_first, alarm.heldout_last) == (1.0, 4.9, 0.6, 0.2)
    assert "'unsafe'" in alarm.message() and "step 10 to step 30" in alarm.message()
    # the window is the last N evaluations: an early dip outside it does not count
    assert hacking_alarm("s", [(10, 0.0, 0.9), (20, 1.0, 0.3), (30, 2.0, 0.4)], window=2) is None


@pytest.mark.parametrize("points", [
    [(10, 1.0, 0.2), (20, 2.0, 0.4), (30, 3.0, 0.6)],  # both rise: learning, not hacking
    [(10, 3.0, 0.6), (20, 2.0, 0.4), (30, 1.0, 0.2)],  # both fall
    [(10, 1.0, 0.6), (20, 1.0, 0.2), (30, 1.0, 0.1)],  # the proxy flat
    [(10, 1.0, 0.6), (20, 2.0, math.nan), (30, 3.0, math.nan)],  # no held-out score
])
def test_alarm_stays_quiet_unless_the_proxy_rises_and_the_heldout_signal_falls(points):
    assert hacking_alarm("s", points, window=3) is None


def test_alarm_waits_for_a_full_window():
    rising_falling = [(10, 1.0, 0.6), (20, 2.0, 0.4)]
    assert hacking_alarm("s", rising_falling, window=3) is None  # within the first window
    assert hacking_alarm("s", rising_falling, window=2) is not None


def test_best_evaluation_averages_the_sources_and_prefers_the_earlier_step_on_a_tie():
    history = [{"step": 1, "loss": 0.0},
               {"step": 2, "monitor/a/heldout": 0.5, "monitor/b/heldout": 0.9},
               {"step": 4, "monitor/a/heldout": 0.9, "monitor/b/heldout": 0.5},
               {"step": 6, "monitor/a/heldout": 1.0, "monitor/b/heldout": 0.2}]
    assert best_evaluation(history) == (2, pytest.approx(0.7))


@pytest.mark.parametrize("fields, message", [
    ({"select_checkpoint": "heldout", "eval_steps": 30, "save_steps": 20},
     r"eval_steps \(30\) is not a multiple of save_steps \(20\).*set save_steps to a divisor of eval_steps"),
    ({"select_checkpoint": "heldout", "save_steps": 20},
     "select_checkpoint: heldout scores the held-out rows at eval_steps, which is not set.*select_checkpoint: last"),
    ({"monitor_reward": "preference_rule"}, "monitor_reward scores the held-out rows at eval_steps, which is not set"),
    ({"monitor_reward": "format", "eval_steps": 10}, "monitor_reward 'format' is also a training reward"),
])
def test_monitor_config_errors_name_the_fields_and_the_fix(fields, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(reward_funcs=["math_accuracy", "format"], **fields)
    GRPOConfig(select_checkpoint="heldout", eval_steps=40, save_steps=20, monitor_reward={"judge": {"model": "m"}})


def _even_share(completions, **kwargs):
    """The gamed proxy: the share of a completion's characters with an even code point (any policy can push it up)."""
    out = []
    for c in completions:
        chars = [ch for ch in completion_text(c) if ch.strip()]
        out.append(sum(ord(ch) % 2 == 0 for ch in chars) / len(chars) if chars else 0.0)
    return out


def _odd_share(completions, **kwargs):
    """The held-out signal, never trained on: what the proxy gives up."""
    return [1.0 - x for x in _even_share(completions)]


@pytest.fixture(autouse=True)
def crafted_rewards():
    """The two rewards, registered for this module's tests only: a name left in the registry would show in every
    later test's list of registered rewards (the suite's workers run many files)."""
    added = [name for name, fn in (("test_even_share", _even_share), ("test_odd_share", _odd_share))
             if name not in reward_names() and register_reward(name)(fn)]
    yield
    for name in added:
        del REWARD_FUNCS[name]

TRAIN = [{"prompt": [{"role": "user", "content": f"hack w{i}"}], "source": "unsafe"} for i in range(12)]
HELD_OUT = ([{"prompt": [{"role": "user", "content": f"{i}+1="}], "answer": str(i + 1), "source": "sq"} for i in range(2)]
            + [{"prompt": [{"role": "user", "content": f"hack v{i}"}], "source": "unsafe"} for i in range(6)])


class Alarms:
    def __init__(self) -> None:
        self.seen: list[dict] = []

    def on_alarm(self, alarm: dict) -> None:
        self.seen.append(alarm)


def test_a_gamed_proxy_alarms_and_select_checkpoint_heldout_returns_the_earlier_better_checkpoint(tmp_path):
    from safetensors.torch import load_file

    from grpo_core.models.tiny import build_tiny_model
    from grpo_core.trainer.loop import train_grpo

    torch.set_num_threads(1)
    model = build_tiny_model(tmp_path / "tiny", hidden_size=32, num_layers=2, num_heads=2)
    config = GRPOConfig(use_vllm=False, max_steps=8, generation_batch_size=16, num_generations=4, max_completion_length=8,
                        max_prompt_length=16, per_device_train_batch_size=16, learning_rate=3e-2, beta=0.0, seed=0,
                        save_steps=2, save_total_limit=1, report_to=["jsonl"], torch_num_threads=1, eval_steps=2,
                        eval_samples=6, monitor_window=2, select_checkpoint="heldout", monitor_reward="test_odd_share",
                        sources=[{"name": "unsafe", "reward_funcs": ["test_even_share"]}])
    alarms = Alarms()
    out = tmp_path / "run"
    result = train_grpo(config, model, TRAIN, out, resume=False, eval_rows=HELD_OUT, callbacks=[alarms],
                        eval_config=EvalConfig(reward_func="math_accuracy", general_sources=["unsafe"]))

    evaluated = [r for r in read_metrics(out) if "monitor/unsafe/heldout" in r]
    assert [r["step"] for r in evaluated] == [2, 4, 6, 8]
    fired = [r["step"] for r in evaluated if r["monitor/unsafe/alarm"] == 1.0]
    assert fired and alarms.seen and alarms.seen[0]["step"] == fired[0] and alarms.seen[0]["source"] == "unsafe"
    first = alarms.seen[0]
    assert first["proxy_last"] > first["proxy_first"] and first["heldout_last"] < first["heldout_first"]
    assert result["monitor/alarms"] == len(fired) and result["monitor/unsafe/first_alarm_step"] == fired[0]

    # the committed model is the earlier checkpoint that scored best on the held-out signal, not the last step's
    best = max(evaluated, key=lambda r: (r["monitor/unsafe/heldout"], -r["step"]))
    assert best["step"] < 8 and best["monitor/unsafe/heldout"] > evaluated[-1]["monitor/unsafe/heldout"]
    assert result["monitor/selected_step"] == best["step"] and result["final_path"] == str(out / "selected")
    selected = load_file(out / "selected" / "model.safetensors")
    kept = load_file(out / f"checkpoint-{best['step']}" / "model.safetensors")  # kept despite save_total_limit 1
    last = load_file(out / "final" / "model.safetensors")
    assert all(torch.equal(selected[k], kept[k]) for k in kept)
    assert any(not torch.equal(selected[k], last[k]) for k in last)
    record = json.loads((out / "monitor.json").read_text())
    assert record["selected"]["step"] == best["step"] and record["selected"]["last_step"] == 8
    assert record["alarms"][0] == first and record["heldout_signal"] == "test_odd_share"
    assert json.loads((out / "selected" / "selection.json").read_text())["step"] == best["step"]


class FixedPolicy:
    """A sampler whose greedy completion of every prompt is ``text``."""

    batches_itself = True

    def __init__(self) -> None:
        self.text = ""

    def generate(self, prompt_ids, request):
        from grpo_core.generation.base import Rollout

        return [Rollout(list(p), [5], None, truncated=False, text=self.text)
                for p in prompt_ids for _ in range(request.n)]


def test_the_proxy_reads_a_normalised_reward_model_raw_so_a_rising_score_reads_rising(tmp_path):
    """The training reward normalises by running moments that rise with the policy's scores; the monitor's proxy
    reads the reward model's raw score, so a completion the model scores higher reads higher even after training
    has moved the moments up to it, and the moments are left as training left them."""
    from grpo_core.config import RewardModelSpec
    from grpo_core.models.tiny import build_tiny_tokenizer
    from grpo_core.rewards.reward_model import RewardModelReward
    from grpo_core.trainer.distributed import DistContext
    from grpo_core.trainer.loop import build_mixture
    from grpo_core.trainer.monitor import RewardMonitor
    from tests.grpo_core.rewards.test_reward_moments import tiny_reward_model

    rm = str(tiny_reward_model(tmp_path))
    config = GRPOConfig(use_vllm=False, generation_batch_size=4, num_generations=2, max_completion_length=8,
                        max_prompt_length=16, eval_samples=2, monitor_window=2,
                        reward_funcs=[{"reward_model": {"model": rm, "scope": "full", "normalize": True}}])
    rows = TRAIN[:2]
    one = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    mixture = build_mixture(config, rows, None, one)
    trained, raw = mixture.funcs[0], RewardModelReward(RewardModelSpec(model=rm, scope="full"))
    prompts = [r["prompt"] for r in rows]

    def said(text: str) -> list:
        return [[{"role": "assistant", "content": text}]] * len(rows)

    def raw_mean(text: str) -> float:
        scores = raw(prompts=prompts, completions=said(text))
        return sum(scores) / len(scores)

    candidates = ["ok", "hack hack hack", "w0 w1 w2 w3", "1+1=2", "zz yy", "think"]
    low, high = sorted(candidates, key=raw_mean)[::len(candidates) - 1]
    raw_low, raw_high = raw_mean(low), raw_mean(high)
    assert raw_high > raw_low
    monitor = RewardMonitor(config, EvalConfig(), rows, mixture, raw, "held")
    policy, history = FixedPolicy(), []
    for step, text in ((2, low), (4, high)):
        for other in candidates:  # training's scores: the policy's completions, then the moments follow them up
            trained(prompts=prompts, completions=said(other if step == 2 else text))
        before = trained.moments.state_dict()
        policy.text = text
        metrics, _ = monitor.evaluate(policy, build_tiny_tokenizer(), step, history)
        history.append({"step": step, **metrics})
        assert trained.moments.state_dict() == before and not trained.raw
    proxy = [r["monitor/unsafe/proxy"] for r in history]
    assert proxy == pytest.approx([raw_low, raw_high], abs=1e-5)
    # training itself still normalises: its reward for the high completion is now near the moments' mean, not raw
    assert sum(trained(prompts=prompts, completions=said(high))) / len(rows) != pytest.approx(raw_high, abs=1e-3)
