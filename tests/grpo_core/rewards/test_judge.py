"""The generative judge: its score parser on verdicts in the formats real judges write, and the reward contract
with a real generation on a local (tiny, untrained) model: garbage verdicts score None and are counted, a judge
that never parses stops the run with one message, time is bounded."""

from __future__ import annotations

import pytest

from grpo_core.config import GRPOConfig, JudgeSpec
from grpo_core.models.tiny import build_tiny_model
from grpo_core.rewards import pop_reward_stats
from grpo_core.rewards.judge import RUBRICS, JudgeNeverParses, JudgeReward, judge_messages, parse_judge_score
from grpo_core.rewards.scoring import resolve_reward

# (verdict, normalised score or None): the shapes judges write in practice.
VERDICTS = [
    # MT-Bench's format, as the rubric asks
    ("The answer is correct and clear.\nRating: [[7]]", 0.7),
    ("Rating: [[10]]", 1.0),
    ("[[ 3 ]]", 0.3),
    ("Explanation: somewhat helpful. Rating: [[6.5]]", 0.65),
    ("First draft said [[2]], but on reflection: Rating: [[8]]", 0.8),  # the last one wins
    # score lines
    ("Score: 7/10", 0.7),
    ("The response is fine.\nScore: 9", 0.9),
    ("**Score:** 4 out of 10", 0.4),
    ("Rating: 4/5", 0.8),
    ("Final score = 3", 0.3),
    ("I'd give it a score of 6/10 overall.", 0.6),
    ("My rating is 8.", 0.8),
    ("Grade: 2 out of 5", 0.4),
    # JSON
    ('{"score": 8}', 0.8),
    ('```json\n{"reasoning": "mostly fine", "score": 6}\n```', 0.6),
    ('{"Rating": "9"}', 0.9),
    ('{"score": null}', None),
    # bare fractions
    ("Overall 7/10, would be better with an example.", 0.7),
    # refusals and garbage
    ("I'm sorry, but I can't evaluate this response.", None),
    ("As an AI language model, I cannot provide ratings.", None),
    ("Score: N/A", None),
    ("", None),
    ("asdf qwerty 12345 <think> ;;;", None),
    ("The user asked 3 questions and got 2 answers.", None),
    # out of range
    ("Rating: [[15]]", None),
    ("Score: 11/10", None),
    ("Score: -2", None),
    ('{"score": 42}', None),
]


@pytest.mark.parametrize("verdict,expected", VERDICTS)
def test_parse_judge_score(verdict, expected):
    got = parse_judge_score(verdict)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


def test_rubrics_are_in_the_prompt():
    helpful = judge_messages("helpfulness", "How do I fix a bike?", "Use a wrench.")[0]["content"]
    assert RUBRICS["helpfulness"] in helpful and "How do I fix a bike?" in helpful and "Use a wrench." in helpful
    assert "Rating: [[N]]" in helpful
    assert RUBRICS["harmlessness"] in judge_messages("harmlessness", "q", "r")[0]["content"]


@pytest.fixture(scope="module")
def tiny_judge_path(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("judge") / "model", hidden_size=32, num_layers=1,
                                num_heads=2, max_position_embeddings=1024))


def test_real_generation_follows_the_reward_contract(tiny_judge_path):
    # An untrained model writes garbage: every verdict is unparsed, scores None, counted. The contract is what is
    # tested: one score per completion, None or a float in [0, 1], the events in the metrics.
    fn, name = resolve_reward({"judge": {"model": tiny_judge_path, "name": "tiny_judge", "max_new_tokens": 8,
                                         "max_length": 900, "max_unparsed": None, "batch_size": 2}})
    assert name == "tiny_judge" and isinstance(fn, JudgeReward)
    pop_reward_stats()
    prompts = [[{"role": "user", "content": "How do I fix a bike?"}]] * 3
    completions = [[{"role": "assistant", "content": "<think>hmm</think>Use a wrench."}]] * 2 + ["I won't."]
    scores = fn(prompts=prompts, completions=completions)
    assert len(scores) == 3
    assert all(s is None or 0.0 <= s <= 1.0 for s in scores)
    stats = pop_reward_stats()
    assert stats.get("rewards/tiny_judge/unparsed", 0) == scores.count(None) == fn.seen - fn.parsed
    assert fn.seen == 3


def test_judge_whose_verdicts_never_parse_stops_with_one_message(tiny_judge_path):
    fn = JudgeReward(JudgeSpec(model=tiny_judge_path, name="bad_judge", max_new_tokens=4, max_length=900,
                               max_unparsed=4, batch_size=4))
    pop_reward_stats()
    with pytest.raises(JudgeNeverParses, match=r"judge bad_judge .*none of its first 4 verdicts held a score"):
        fn(prompts=["q"] * 4, completions=["a"] * 4)
    assert pop_reward_stats()["rewards/bad_judge/unparsed"] == 4.0  # counted before it stopped


def test_judge_is_bounded_in_time(tiny_judge_path):
    fn = JudgeReward(JudgeSpec(model=tiny_judge_path, name="slow_judge", timeout=1e-9, max_length=900))
    pop_reward_stats()
    assert fn(prompts=["q"] * 3, completions=["a"] * 3) == [None] * 3
    assert pop_reward_stats()["rewards/slow_judge/timeouts"] == 3.0
    assert fn.seen == 0  # timed-out rows are not held against the parser


def test_long_response_keeps_its_start_and_end(tiny_judge_path):
    fn = JudgeReward(JudgeSpec(model=tiny_judge_path, max_length=600))
    text = fn.render("q", "<think>plan</think>START " + "x" * 2000 + " END")
    assert "START" in text and "END" in text and "[...]" in text and "Rating: [[N]]" in text
    assert len(fn.tokenizer(text, add_special_tokens=False)["input_ids"]) <= 600


def test_summary_judge_sees_an_empty_answer_without_think_end_and_counts_it(tiny_judge_path):
    fn = JudgeReward(JudgeSpec(model=tiny_judge_path, name="sum_judge", max_length=900))  # scope: summary
    pop_reward_stats()
    assert "plan" not in fn.render("q", "<think>a secret plan, cut by the length cap")
    assert "The answer" in fn.render("q", "<think>plan</think>The answer")
    assert pop_reward_stats() == {"rewards/sum_judge/no_summary": 1.0}


def test_judge_entry_in_grpo_config():
    config = GRPOConfig(reward_funcs=["format", {"judge": {"model": "/m", "rubric": "harmlessness", "scope": "full"}}],
                        generation_batch_size=16)
    spec = config.reward_funcs[1]
    assert isinstance(spec, JudgeSpec) and spec.rubric == "harmlessness" and spec.scope == "full"
    with pytest.raises(ValueError, match="rubric"):
        GRPOConfig(reward_funcs=[{"judge": {"model": "/m", "rubric": "wit"}}])


GRPO_ROWS = [{"prompt": [{"role": "user", "content": f"Say something kind about {i}."}]} for i in range(8)]


def grpo_config(judge: dict) -> GRPOConfig:
    return GRPOConfig(use_vllm=False, max_steps=1, generation_batch_size=8, num_generations=4,
                      max_completion_length=6, max_prompt_length=32, per_device_train_batch_size=8, beta=0.0,
                      save_steps=100, report_to=["jsonl"], reward_funcs=["format", {"judge": judge}])


def test_unparsed_verdicts_are_counted_in_the_training_metrics(tiny_judge_path, tmp_path):
    import json

    from grpo_core.trainer.loop import train_grpo

    judge = {"model": tiny_judge_path, "max_new_tokens": 4, "max_length": 900, "max_unparsed": None}
    train_grpo(grpo_config(judge), tiny_judge_path, GRPO_ROWS, tmp_path, resume=False)
    (step,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert step["rewards/judge/unparsed"] + step.get("rewards/judge/timeouts", 0) == 8  # every verdict garbage


def test_a_judge_that_never_parses_stops_training_before_anything_is_saved(tiny_judge_path, tmp_path):
    from grpo_core.trainer.loop import train_grpo

    judge = {"model": tiny_judge_path, "max_new_tokens": 4, "max_length": 900, "max_unparsed": 8}
    with pytest.raises(JudgeNeverParses, match="none of its first 8 verdicts"):
        train_grpo(grpo_config(judge), tiny_judge_path, GRPO_ROWS, tmp_path, resume=False)
    assert not (tmp_path / "final").exists() and not list(tmp_path.glob("checkpoint-*"))
