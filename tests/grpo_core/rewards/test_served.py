"""Reward models and judges over HTTP (grpo_core.rewards.served) against a fake OpenAI-compatible server in a
thread: what is sent (the rubric chat, the reward model's conversation, the key), parsed verdicts and scores,
bounded concurrency, retries on 5xx, no retry on 4xx, a stopped server (None, counted as errors, within the
timeout), the run stopping when every call fails, and the key kept out of every message. The same client against
a real vLLM server: test_served_vllm.py."""

from __future__ import annotations

import json
import logging
import math
import time

import pytest

from grpo_core.config import GRPOConfig, JudgeSpec, RewardModelSpec
from grpo_core.rewards import pop_reward_stats
from grpo_core.rewards.judge import JudgeNeverParses, judge_messages
from grpo_core.rewards.scoring import resolve_reward
from grpo_core.rewards.served import RETRIES, RewardServerUnavailable, ServedJudge, ServedRewardModel
from tests.grpo_core.rewards.fake_openai import FakeOpenAI, closed_port_url

KEY = "sk-test-THIS-MUST-NOT-LEAK-5f3a"
PROMPTS = [[{"role": "system", "content": "Be kind."}, {"role": "user", "content": "How do I fix a bike?"}]] * 4
COMPLETIONS = [[{"role": "assistant", "content": "<think>plan it</think>Use a wrench."}]] * 4


@pytest.fixture
def server():
    with FakeOpenAI() as s:
        yield s


def test_judge_over_http_sends_the_rubric_chat_and_parses_the_verdict(server, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", KEY)
    fn, name = resolve_reward({"judge": {"model": "big-judge", "url": server.url + "/v1/", "api_key_env": "JUDGE_KEY",
                                         "rubric": "harmlessness", "scope": "full", "max_new_tokens": 64}})
    assert isinstance(fn, ServedJudge) and name == "judge"
    pop_reward_stats()
    assert fn(prompts=PROMPTS, completions=COMPLETIONS) == pytest.approx([0.7] * 4)
    assert pop_reward_stats() == {}
    (sent, *_) = server.behaviour.requests
    assert sent["path"] == "/v1/chat/completions" and sent["headers"]["Authorization"] == f"Bearer {KEY}"
    assert sent["body"] == {"model": "big-judge", "max_tokens": 64, "temperature": 0.0, "messages": judge_messages(
        "harmlessness", "How do I fix a bike?", "<think>plan it</think>Use a wrench.")}  # the local judge's prompt


def test_reward_model_over_http_sends_the_conversation_and_reads_the_raw_score(server):
    server.behaviour.score = -2.25
    fn, _ = resolve_reward({"reward_model": {"model": "rm", "url": server.url, "max_length": 256}})
    assert isinstance(fn, ServedRewardModel)
    assert fn(prompts=["Say hi."], completions=["<think>x</think> Hi!"]) == [-2.25]
    (sent,) = server.behaviour.requests
    assert sent["path"] == "/classify" and "Authorization" not in sent["headers"]
    assert sent["body"] == {"model": "rm", "use_activation": False, "truncate_prompt_tokens": 256,
                            "truncation_side": "right", "messages": [  # scope summary: the text after </think>
                                {"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}]}


def test_reward_clip_range_clamps_the_served_score(server):
    server.behaviour.score = -2.25
    fn, _ = resolve_reward({"reward_model": {"model": "rm", "url": server.url, "name": "rm_http", "scope": "full",
                                             "reward_clip_range": [-1.0, 1.0]}})
    pop_reward_stats()
    assert fn(prompts=["Say hi."] * 2, completions=["Hi!"] * 2) == [-1.0, -1.0]
    assert pop_reward_stats() == {"rewards/rm_http/clipped": 2.0}


def test_raw_scores_read_a_normalising_served_model_unnormalised_and_unclipped(server):
    """The reward-hacking monitor's reading (``reward_model.raw_scores``): the server's score as it comes, the running
    moments neither read nor moved; outside the block the training reward is normalised and clipped again."""
    from grpo_core.rewards.reward_model import raw_scores

    fn, _ = resolve_reward({"reward_model": {"model": "rm", "url": server.url, "scope": "full", "normalize": True,
                                             "reward_clip_range": [-1.0, 1.0]}})
    for score in (1.0, 3.0):
        server.behaviour.score = score
        fn(prompts=["Say hi."], completions=["Hi!"])  # training's calls: moments of 1.0 and 3.0
    before = fn.moments.state_dict()
    server.behaviour.score = 7.5
    with raw_scores([fn]):
        assert fn(prompts=["Say hi."] * 2, completions=["Hi!"] * 2) == [7.5, 7.5]
    assert fn.moments.state_dict() == before
    assert fn(prompts=["Say hi."], completions=["Hi!"]) == [1.0]  # (7.5 - mean) / std, clipped


def test_requests_are_concurrent_and_bounded_by_batch_size(server):
    server.behaviour.delay_s = 0.3
    fn = ServedJudge(JudgeSpec(model="j", url=server.url, batch_size=3))
    assert fn(prompts=["q"] * 9, completions=["</think>a"] * 9) == pytest.approx([0.7] * 9)
    assert server.behaviour.max_in_flight == 3  # three at once (not one after another), never four


def test_unparsed_verdicts_are_counted_and_a_judge_that_never_parses_stops_naming_the_url(server):
    server.behaviour.verdict = "I cannot rate this."
    fn = ServedJudge(JudgeSpec(model="j", name="remote", url=server.url, max_unparsed=None))
    pop_reward_stats()
    assert fn(prompts=["q"] * 3, completions=["</think>a"] * 3) == [None] * 3
    assert pop_reward_stats() == {"rewards/remote/unparsed": 3.0}
    strict = ServedJudge(JudgeSpec(model="j", name="remote", url=server.url, max_unparsed=4))
    with pytest.raises(JudgeNeverParses, match=rf"judge remote \(j at {server.url}\): none of its first 4"):
        strict(prompts=["q"] * 4, completions=["</think>a"] * 4)


def test_5xx_is_retried_with_backoff_and_4xx_is_not(server):
    server.behaviour.fail_first = 2  # two 503s, then answers
    fn = ServedRewardModel(RewardModelSpec(model="rm", url=server.url, batch_size=1))
    pop_reward_stats()
    assert fn(prompts=["q"], completions=["</think>a"]) == [1.5]
    assert len(server.behaviour.requests) == 3 and pop_reward_stats() == {}

    server.behaviour.requests.clear()
    server.behaviour.fail_first, server.behaviour.fail_status = 10, 400
    assert fn(prompts=["q", "q"], completions=["</think>a", "</think>b"]) == [None, None]
    assert len(server.behaviour.requests) == 2  # one each: a bad request fails again
    assert pop_reward_stats() == {"rewards/reward_model/errors": 2.0}


def test_a_stopped_server_scores_none_counted_as_errors_within_the_timeout():
    fn = ServedJudge(JudgeSpec(model="j", name="down", url=closed_port_url(), timeout=5.0, batch_size=2))
    pop_reward_stats()
    start = time.monotonic()
    assert fn(prompts=["q"] * 6, completions=["</think>a"] * 6) == [None] * 6
    assert time.monotonic() - start < 5.0 + 10  # its timeout, with room for a slow machine
    assert pop_reward_stats() == {"rewards/down/errors": 6.0}


def test_a_slow_server_is_cut_at_the_timeout(server):
    server.behaviour.delay_s = 20.0
    fn = ServedRewardModel(RewardModelSpec(model="rm", name="slow", url=server.url, timeout=0.5))
    pop_reward_stats()
    start = time.monotonic()
    assert fn(prompts=["q"] * 2, completions=["</think>a"] * 2) == [None, None]
    assert time.monotonic() - start < 10.0  # cut at 0.5 s (with room for a slow machine), not waited 20 s for
    assert pop_reward_stats() == {"rewards/slow/timeouts": 2.0}


def test_every_call_failing_raises_naming_the_url_after_max_failed_calls():
    url = closed_port_url()
    fn = ServedJudge(JudgeSpec(model="j", url=url, max_failed_calls=2, timeout=5.0))
    assert fn(prompts=["q"], completions=["</think>a"]) == [None]  # one failed call: counted, not fatal
    with pytest.raises(RewardServerUnavailable, match=rf"judge judge \(j at {url}\): the server answered none of "
                                                      r"the requests of the last 2 calls .*Connection refused"):
        fn(prompts=["q"], completions=["</think>a"])


def test_a_dead_server_costs_a_bounded_number_of_attempts_per_call(server):
    server.behaviour.fail_first = 10_000  # always 503
    fn = ServedJudge(JudgeSpec(model="j", url=server.url, batch_size=2, timeout=30.0, max_failed_calls=None))
    assert fn(prompts=["q"] * 40, completions=["</think>a"] * 40) == [None] * 40
    assert len(server.behaviour.requests) <= 2 * (1 + RETRIES)  # not 40 x 4: rows not sent fail at once


def test_the_key_never_reaches_logs_or_error_messages(server, monkeypatch, caplog):
    monkeypatch.setenv("JUDGE_KEY", KEY)
    server.behaviour.fail_first, server.behaviour.fail_status = 10_000, 401
    server.behaviour.fail_body = json.dumps({"error": f"bad token Bearer {KEY}"})  # a server that echoes it
    spec = JudgeSpec(model="j", url=server.url, api_key_env="JUDGE_KEY", max_failed_calls=1)
    fn = ServedJudge(spec)
    with caplog.at_level(logging.DEBUG), pytest.raises(RewardServerUnavailable) as raised:
        fn(prompts=["q"], completions=["</think>a"])
    assert server.behaviour.requests[0]["headers"]["Authorization"] == f"Bearer {KEY}"  # it was sent
    text = caplog.text + str(raised.value) + repr(raised.value) + spec.model_dump_json()
    assert "HTTP 401 (the server refused the key: check api_key_env)" in text and "***" in text
    assert KEY not in text and KEY[-8:] not in text


def test_a_missing_key_variable_fails_at_construction(monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    with pytest.raises(ValueError, match="api_key_env names NO_SUCH_KEY_VAR, which is not set"):
        ServedJudge(JudgeSpec(model="j", url="http://127.0.0.1:9", api_key_env="NO_SUCH_KEY_VAR"))


@pytest.mark.parametrize("entry,message", [
    ({"url": "http://user:pw@host:8000"}, "must not carry credentials"),
    ({"url": "http://host:8000?key=abc"}, "must not carry credentials"),
    ({"url": "host:8000"}, "http://host:port"),
    ({"api_key_env": "JUDGE_KEY"}, "set url too"),
    ({"url": "http://h:1", "api_key_env": "sk-abc123"}, "api_key_env"),  # a key pasted in place of a name
])
def test_url_entries_are_checked(entry, message):
    with pytest.raises(ValueError, match=message):
        JudgeSpec(model="j", **entry)


def test_url_is_the_server_root_and_no_local_checks_apply():
    from tasks.config.pipeline import reward_entry_problem
    from tasks.config.plan import section_scorers
    from tasks.config.sections import is_stage_reference

    spec = RewardModelSpec(model="reward_model", url="http://rm:8000/v1/")
    assert spec.url == "http://rm:8000"
    assert not is_stage_reference(spec)  # a served name, not the run's reward_model stage
    assert reward_entry_problem(JudgeSpec(model="/not/here", url="http://j:8000"), None) is None
    section = GRPOConfig(reward_funcs=["format", {"judge": {"model": "/not/here", "url": "http://j:8000"}}],
                         generation_batch_size=16)
    assert section_scorers(section, "grpo", lambda model: pytest.fail("a served judge needs no local memory")) == []


# ------------------------------------------------------------ the trainer when every reward call fails

def test_grpo_stops_cleanly_when_the_judge_server_never_answers(tmp_path):
    """Today a None reward is NaN and counts as 0 in the loss (trainer/loss.py nansum), so a dead server would
    train on nothing; the served judge raises after max_failed_calls calls instead, before anything is saved."""
    from grpo_core.models.tiny import build_tiny_model
    from grpo_core.trainer.loop import train_grpo

    policy = build_tiny_model(tmp_path / "policy", hidden_size=32, num_layers=1, num_heads=2)
    url = closed_port_url()
    config = GRPOConfig(use_vllm=False, max_steps=3, generation_batch_size=8, num_generations=4,
                        max_completion_length=6, max_prompt_length=32, per_device_train_batch_size=8, beta=0.0,
                        save_steps=1, report_to=["jsonl"],
                        reward_funcs=["format", {"judge": {"model": "j", "url": url, "timeout": 5.0,
                                                           "max_failed_calls": 2}}])
    rows = [{"prompt": [{"role": "user", "content": f"Say something kind about {i}."}]} for i in range(8)]
    start = time.monotonic()
    with pytest.raises(RewardServerUnavailable, match=rf"j at {url}\): the server answered none .* last 2 calls"):
        train_grpo(config, policy, rows, tmp_path / "out", resume=False)
    assert time.monotonic() - start < 120
    steps = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 1 and steps[0]["rewards/judge/errors"] == 8  # step 1 counted, step 2 stopped the run
    assert math.isnan(steps[0].get("rewards/judge/mean", math.nan))
    assert not (tmp_path / "out" / "final").exists()
