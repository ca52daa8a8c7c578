"""Tool calls in evaluation and rejection sampling (issue 43): with ``sampling.tools`` the held-out evaluation samples
multi-turn trajectories and reports ``eval/tools/...`` beside accuracy (``grpo_core.evaluation.tool_use``), without
tools it is what it was; rejection sampling keeps a trajectory whose final answer is right, not one that is right
only inside a tool turn, reads readability off the model's turns, and keeps the tool turns in the kept text."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from transformers import AutoTokenizer

from grpo_core.config import EvalConfig, GRPOConfig, RejectionSamplingConfig
from grpo_core.data.calc import calc_accuracy, tool_call_text
from grpo_core.evaluation.heldout import evaluate, sample_seed
from grpo_core.evaluation.tool_use import tool_use_metrics
from grpo_core.generation.trajectory import tool_call_close_id
from grpo_core.models.tiny import build_tiny_model
from grpo_core.recipe.rejection import rejection_sample
from grpo_core.tools import TOOL_RESPONSE_CLOSE, TOOL_RESPONSE_OPEN
from grpo_core.trainer.during_rl import rl_eval_config
from tasks.config.pipeline import ConfigError, load_config
from tests.grpo_core.run_helpers import scripted_rollout

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]


def fenced_calculator(expression: str) -> str:
    """The calculator's value inside a code fence (a tool whose output the readability filters would drop).

    Args:
        expression: two operands and one operator, e.g. 1234+5678
    """
    a, b = expression.split("+")
    return f"```\n{int(a) + int(b)}\n```"


@pytest.fixture(scope="module")
def tool_tokenizer(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("tiny-tools"), hidden_size=32, num_layers=2, num_heads=2,
                            tool_tokens=True)
    return path, AutoTokenizer.from_pretrained(path)


class ScriptedSampler:
    """A sampler that plays a part per completion: ``plan(prompt, seed, greedy)`` names it. Parts: ``call`` (the
    calculator, then the value it read back: right), ``twice`` (two calls, then the value: right), ``unknown`` (a call
    to a tool that does not exist: an error turn, then a wrong answer in the head), ``head`` (a wrong answer, no call),
    ``call_wrong`` (the calculator, then a wrong answer: right only in the tool turn), ``fenced`` (the fenced
    calculator, then the value), ``own_fence`` (the value in a code fence of its own, no call). A trajectory keeps
    the part its first turn played (a later turn's seed is derived, so the part is looked up by the first turn's
    text, which must name one part). Records every request and every prompt it continues."""

    def __init__(self, tokenizer, plan) -> None:
        self.tokenizer, self.plan, self.requests, self.prompts = tokenizer, plan, [], []
        self.parts: dict[tuple[bool, str], str] = {}  # (greedy, prompt and first turn) -> the part it plays

    def part(self, text: str, seed: int, greedy: bool) -> str:
        if TOOL_RESPONSE_CLOSE not in text:
            return self.plan(text.split("=")[0] + "=", seed, greedy)
        [part] = {p for (g, start), p in self.parts.items() if g == greedy and text.startswith(start)}
        return part

    def turn(self, text: str, part: str) -> str:
        expression = text.split("=")[0]
        value = eval(expression)  # noqa: S307 - the script's own two-operand sum
        calls = text.count("<tool_call>")
        read = text.rsplit(TOOL_RESPONSE_OPEN, 1)[1].split(TOOL_RESPONSE_CLOSE)[0] if calls else None
        if part == "head":
            return f"<think>{expression}={value + 1}</think><answer>{value + 1}</answer>"
        if part == "own_fence":
            return f"<think>```\n{value}\n```</think><answer>{value}</answer>"
        if part == "unknown":
            if not calls:
                return "<think>" + tool_call_text(expression).replace("calculator", "abacus")
            return f"{expression}={value + 1}</think><answer>{value + 1}</answer>"
        name = "fenced_calculator" if part == "fenced" else "calculator"
        if calls < (2 if part == "twice" else 1):
            return ("" if calls else "<think>") + tool_call_text(expression).replace("calculator", name)
        answer = value + 1 if part == "call_wrong" else int(read.strip().strip("`").strip())
        return f"{expression}={answer}</think><answer>{answer}</answer>"

    def generate(self, prompt_ids, request):
        self.requests.append(request)
        request = request.seeded(len(prompt_ids))
        out = []
        for i, seed in enumerate(request.seeds):
            prompt = list(prompt_ids[i // request.n])
            text = self.tokenizer.decode(prompt, skip_special_tokens=True)
            self.prompts.append(text)
            part = self.part(text, seed, request.greedy)
            turn = self.turn(text, part)
            if TOOL_RESPONSE_CLOSE not in text:
                assert self.parts.setdefault((request.greedy, text + turn), part) == part, "a first turn, two parts"
            out.append(scripted_rollout(self.tokenizer, prompt, turn, request))
        return out


# --- evaluation ---

# Four held-out rows, two sources; the greedy part of each row, the sampled part by seed
ROWS = [{"id": "r0", "prompt": "1111+2222=", "answer": "3333", "source": "a"},
        {"id": "r1", "prompt": "3333+4444=", "answer": "7777", "source": "a"},
        {"id": "r2", "prompt": "5555+1234=", "answer": "6789", "source": "b"},
        {"id": "r3", "prompt": "6000+1000=", "answer": "7000", "source": "b"}]
GREEDY = {"1111+2222=": "call", "3333+4444=": "unknown", "5555+1234=": "head", "6000+1000=": "twice"}
SAMPLED = ("call", "unknown", "head")  # by seed % 3


def eval_plan(prompt: str, seed: int, greedy: bool) -> str:
    return GREEDY[prompt] if greedy else SAMPLED[seed % 3]


def _eval_config(tools=("calculator",)) -> EvalConfig:
    return EvalConfig(reward_func="calc_accuracy", forced_reasoning=False, seed=7,
                      sampling={"num_generations": 4, "max_prompt_length": 16, "max_completion_length": 256,
                                "use_vllm": False, "tools": list(tools), **({"max_turns": 3} if tools else {})})


def test_evaluation_with_tools_reports_the_tool_use_rates_exactly(tool_tokenizer):
    path, tokenizer = tool_tokenizer
    sampler = ScriptedSampler(tokenizer, eval_plan)
    metrics = evaluate(_eval_config(), path, ROWS, tokenizer=tokenizer, backend=sampler, return_rows=True)
    # greedy: calls [1, 1, 0, 2] (r1's is an unknown tool: an error turn), right where the calculator answered
    assert metrics["eval/accuracy"] == 0.5
    assert metrics["eval/tools/call_rate"] == 0.75 and metrics["eval/tools/calls_per_response"] == 1.0
    assert metrics["eval/tools/error_rate"] == 0.25
    assert (metrics["eval/a/tools/call_rate"], metrics["eval/a/tools/calls_per_response"],
            metrics["eval/a/tools/error_rate"]) == (1.0, 1.0, 0.5)
    assert (metrics["eval/b/tools/call_rate"], metrics["eval/b/tools/calls_per_response"],
            metrics["eval/b/tools/error_rate"]) == (0.5, 1.0, 0.0)
    assert metrics["eval/a/accuracy"] == metrics["eval/b/accuracy"] == 0.5
    # sampled: each row's four seeds play call (right), unknown (an error, then wrong) or head (wrong)
    parts = {r["source"]: [] for r in ROWS}
    for r in ROWS:
        parts[r["source"]] += [SAMPLED[sample_seed(7, r["id"], j) % 3] for j in range(4)]
    every = parts["a"] + parts["b"]
    assert {"call", "unknown", "head"} <= set(every)  # the seeds play every part
    for prefix, played in (("eval/", every), ("eval/a/", parts["a"]), ("eval/b/", parts["b"])):
        calls = sum(p in ("call", "unknown") for p in played)
        assert metrics[f"{prefix}pass@1"] == pytest.approx(played.count("call") / len(played))
        assert metrics[f"{prefix}tools/call_rate_sampled"] == pytest.approx(calls / len(played))
        assert metrics[f"{prefix}tools/calls_per_response_sampled"] == pytest.approx(calls / len(played))
        expected_errors = played.count("unknown") / calls if calls else math.nan
        assert metrics[f"{prefix}tools/error_rate_sampled"] == pytest.approx(expected_errors, nan_ok=True)
    rows = metrics["rows"]
    assert [r["tool_calls"] for r in rows] == [1, 1, 0, 2] and [r["tool_errors"] for r in rows] == [0, 1, 0, 0]
    assert [r["correct"] for r in rows] == [True, False, False, True]
    assert TOOL_RESPONSE_OPEN in rows[0]["greedy"] and rows[3]["greedy"].count(TOOL_RESPONSE_OPEN) == 2
    # every turn after the first continues a trajectory; every call stops on </tool_call>
    close = tool_call_close_id(tokenizer)
    assert all(close in r.stop_token_ids for r in sampler.requests)
    assert any(TOOL_RESPONSE_CLOSE in p for p in sampler.prompts)


def test_evaluation_without_tools_is_single_turn_with_no_tool_keys(tool_tokenizer):
    path, tokenizer = tool_tokenizer
    sampler = ScriptedSampler(tokenizer, eval_plan)
    config = _eval_config(tools=())
    metrics = evaluate(config, path, ROWS, tokenizer=tokenizer, backend=sampler, return_rows=True)
    assert not [k for k in metrics if "tools/" in k]
    assert not [k for row in metrics["rows"] for k in row if k.startswith("tool_")]
    # one generate call for greedy and one for the samples, no stop but EOS: no trajectory
    assert len(sampler.requests) == 2 and all(r.stop_token_ids == () for r in sampler.requests)
    assert not any(TOOL_RESPONSE_CLOSE in p for p in sampler.prompts)
    # the first turn alone: r0's greedy call is never answered, so only the head answers could pass (none is right)
    assert metrics["eval/accuracy"] == 0.0 and metrics["rows"][0]["greedy"].endswith("</tool_call>")


def test_tool_use_metrics_over_no_call():
    assert tool_use_metrics([0, 0], [0, 0]) == {"tools/call_rate": 0.0, "tools/calls_per_response": 0.0,
                                                "tools/error_rate": pytest.approx(math.nan, nan_ok=True)}
    assert tool_use_metrics([2, 0, 1, 1], [1, 0, 0, 1]) == {"tools/call_rate": 0.75, "tools/calls_per_response": 1.0,
                                                            "tools/error_rate": 0.5}


# --- rejection sampling ---


def _rs_config(tools=("calculator",), **kw) -> RejectionSamplingConfig:
    return RejectionSamplingConfig(**{
        "reward_func": "calc_accuracy", "keep_per_prompt": 4, "seed": 3,
        "sampling": {"num_generations": 4, "max_prompt_length": 16, "max_completion_length": 160, "use_vllm": False,
                     "tools": list(tools), **({"max_turns": 3} if tools else {})}, **kw})


def test_rejection_sampling_keeps_a_trajectory_whose_final_answer_is_right(tool_tokenizer):
    """Row p0: every sample calls the calculator and answers with its value (kept, tool turn in the text); row p1:
    every sample calls it and then answers wrong, so the right value is only inside the tool turn (dropped)."""
    _, tokenizer = tool_tokenizer
    rows = [{"id": "p0", "prompt": "1234+4321=", "answer": "5555"},
            {"id": "p1", "prompt": "2000+3000=", "answer": "5000"}]
    sampler = ScriptedSampler(tokenizer,
                              lambda prompt, seed, greedy: "call" if prompt == "1234+4321=" else "call_wrong")
    kept, stats = rejection_sample(_rs_config(), sampler, tokenizer, rows)
    assert stats["rs/num_samples"] == 8 and stats["rs/rejected/incorrect"] == 4
    assert [p["pass_rate"] for p in stats["per_prompt"]] == [1.0, 0.0]
    assert len(kept) == 1 and stats["rs/rejected/duplicate"] == 3  # four identical right trajectories: one kept
    [row] = kept
    assert row["prompt"] == "1234+4321=" and TOOL_RESPONSE_OPEN + "5555" + TOOL_RESPONSE_CLOSE in row["completion"]
    assert row["completion"].endswith("<answer>5555</answer>") and "<tool_call>" in row["completion"]
    assert calc_accuracy([row["completion"]], ["1234+4321="]) == [1.0]
    assert (stats["rs/tools/calls"], stats["rs/tools/errors"], stats["rs/tools/samples_with_call"],
            stats["rs/tools/kept_with_call"]) == (8, 0, 8, 1)
    # the sampler's prompts carried no schemas the tiny template would render, and every answer came after a tool turn
    assert sum(TOOL_RESPONSE_CLOSE in p for p in sampler.prompts) == 8


def test_rejection_sampling_readability_reads_the_models_turns_only(tool_tokenizer):
    """A tool turn holding a code fence does not drop the sample (the model did not write it); a fence the model
    writes in its own turn does."""
    _, tokenizer = tool_tokenizer
    rows = [{"id": "p0", "prompt": "1234+4321=", "answer": "5555"},
            {"id": "p1", "prompt": "2000+3000=", "answer": "5000"}]
    sampler = ScriptedSampler(tokenizer,
                              lambda prompt, seed, greedy: "fenced" if prompt == "1234+4321=" else "own_fence")
    config = _rs_config(tools=["tests.grpo_core.test_tool_eval:fenced_calculator"], keep_per_prompt=1,
                        readability={"max_tokens": 95})
    kept, stats = rejection_sample(config, sampler, tokenizer, rows)
    assert [p["pass_rate"] for p in stats["per_prompt"]] == [1.0, 1.0]  # both right
    assert stats["rs/rejected/code_block"] == 4 and stats["rs/rejected/overlong"] == 0
    [row] = kept
    assert row["prompt"] == "1234+4321=" and "```" in row["completion"] and TOOL_RESPONSE_OPEN in row["completion"]
    tool_turn = TOOL_RESPONSE_OPEN + "```\n5555\n```" + TOOL_RESPONSE_CLOSE
    assert tool_turn in row["completion"]
    whole, model = (len(tokenizer(text, add_special_tokens=False)["input_ids"])
                    for text in (row["completion"], row["completion"].replace(tool_turn, "")))
    assert model <= 95 < whole  # the whole trajectory is over readability.max_tokens; the model's turns are not


def test_rejection_sampling_without_tools_samples_single_turn(tool_tokenizer):
    _, tokenizer = tool_tokenizer
    rows = [{"id": "p0", "prompt": "1234+4321=", "answer": "5555"}]
    sampler = ScriptedSampler(tokenizer, lambda prompt, seed, greedy: "call")
    kept, stats = rejection_sample(_rs_config(tools=()), sampler, tokenizer, rows)
    assert kept == [] and stats["rs/rejected/incorrect"] == 4  # the call is never answered: no final answer
    assert len(sampler.requests) == 1 and sampler.requests[0].stop_token_ids == ()
    assert not [k for k in stats if k.startswith("rs/tools/")]


# --- configuration ---


@pytest.mark.parametrize("section", [EvalConfig, RejectionSamplingConfig])
def test_evaluation_and_rejection_check_their_tool_fields_as_grpo_does(section):
    assert section(sampling={"tools": ["calculator"], "use_vllm": True}).sampling.tools == ["calculator"]
    with pytest.raises(ValidationError, match=r"sampling.max_turns \(2\) bounds the model turns"):
        section(sampling={"max_turns": 2})
    with pytest.raises(ValidationError, match=r"names calculator more than once"):
        section(sampling={"tools": ["calculator", "calculator"], "use_vllm": False})
    assert section(tools=["calculator"], use_vllm=False).sampling.tools == ["calculator"]  # the flat spelling too


def test_evaluation_during_rl_keeps_the_tools_on_either_trainer_sampler():
    base = _eval_config()
    for use_vllm in (False, True):
        config = GRPOConfig(sampling={"use_vllm": use_vllm}, reward_funcs=["calc_accuracy"])
        assert rl_eval_config(config, base).sampling.tools == ["calculator"]


def test_the_shipped_tool_config_evaluates_and_rejection_samples_with_the_calculator():
    config = load_config(ROOT / "configs" / "tiny-tools.yaml")
    for section in (config.evaluate, config.rejection_sample):
        assert section.sampling.tools == ["calculator"] and section.sampling.max_turns == 3
    default = load_config()
    assert default.evaluate.sampling.tools == default.rejection_sample.sampling.tools == []


def test_a_pipeline_evaluation_tool_that_does_not_load_names_its_yaml_line(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("evaluate:\n  sampling:\n    use_vllm: false\n    tools: [calculatr]\n")
    with pytest.raises(ConfigError, match=r"config.yaml:4: evaluate.sampling.tools.0: tool 'calculatr'"):
        load_config(path)


# --- a kept trajectory, fine-tuned on (sft_consolidate) ---


class QwenToolSampler:
    """Scripted Qwen2.5 turns: a calculator call inside the think block, then (after the tool turn) the rest of the
    reasoning and the answer (the form the format reward passes)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def generate(self, prompt_ids, request):
        out = []
        for i in range(len(prompt_ids) * request.n):
            prompt = prompt_ids[i // request.n]
            if "<tool_response>" in self.tokenizer.decode(prompt):
                turn = "it read 5555</think><answer>5555</answer>"
            else:
                turn = ('<think>a sum: the calculator<tool_call>\n{"name": "calculator", "arguments": '
                        '{"expression": "1234+4321"}}\n</tool_call>')
            out.append(scripted_rollout(self.tokenizer, prompt, turn, request))
        return out

    def update_weights(self, model) -> None:  # pragma: no cover - not a trainer's sampler
        pass


def test_a_kept_qwen_trajectory_fine_tunes_on_the_tokens_it_was_sampled_as(tmp_path):
    """On Qwen2.5's format (a tool turn is <|im_end|> <|im_start|>user <tool_response> ... <|im_start|>assistant),
    a trajectory rejection sampling keeps is fine-tuned on exactly what was sampled: the prompt with the tools' schemas
    (the row's tools column) and the trajectory's own tokens, the tool turn out of the loss, the model's turns in it."""
    import json

    from grpo_core.generation.prompts import encode_prompt
    from grpo_core.recipe.consolidation import label_rows, mix_by_ratio
    from grpo_core.trainer.sft import IGNORE_INDEX, encode_sft_row
    from tests.standins import build_model

    tokenizer = AutoTokenizer.from_pretrained(build_model(tmp_path, "Qwen/Qwen2.5-0.5B-Instruct"))
    rows = [{"id": "q0", "prompt": [{"role": "user", "content": "What is 1234+4321?"}], "answer": "5555"}]
    config = _rs_config(reward_func="math_accuracy", keep_per_prompt=1,
                        sampling={"num_generations": 2, "max_prompt_length": 768, "max_completion_length": 200,
                                  "use_vllm": False, "tools": ["calculator"], "max_turns": 3})
    sampler = QwenToolSampler(tokenizer)
    kept, stats = rejection_sample(config, sampler, tokenizer, rows)
    assert stats["rs/tools/kept_with_call"] == 1
    [row] = kept
    assert "<|im_end|>\n<|im_start|>user\n<tool_response>\n5555\n</tool_response><|im_end|>\n<|im_start|>assistant\n" \
        in row["completion"]  # the tool turn as the template wrote it, not "\nuser\n...\nassistant\n"
    schemas = json.loads(row["tools"])
    assert [s["function"]["name"] for s in schemas] == ["calculator"]
    # what was sampled: the same seeds give the same trajectory; its tokens and its tool mask
    from grpo_core.evaluation.tool_use import ToolSampler

    prompt_ids = encode_prompt(tokenizer, rows[0]["prompt"], tools=schemas)
    from grpo_core.generation.base import GenerationRequest

    [sampled] = ToolSampler.of(config.sampling, tokenizer).generate(
        sampler, [prompt_ids], GenerationRequest(n=1, max_tokens=200, seeds=[0]))
    assert sampled.text == row["completion"] and sum(sampled.tool_mask) > 0
    for labelled in (label_rows(kept)[0], mix_by_ratio(kept, {"g": [{"prompt": "hi", "completion": "hello"}]}, 1.0,
                                                       seed=0)[0][0]):
        assert labelled["tools"] == row["tools"]  # the consolidation set keeps the column
    ids, labels = encode_sft_row(tokenizer, label_rows(kept)[0], max_length=4096)
    assert ids == prompt_ids + sampled.completion_ids  # the final EOS is the row's own (<|im_end|>)
    expected = [IGNORE_INDEX] * len(prompt_ids) + [IGNORE_INDEX if tool else t for t, tool in
                                                   zip(sampled.completion_ids, sampled.tool_mask)]
    assert labels == expected


def test_benchmark_evaluation_with_tools_reports_the_tool_use_rates(tool_tokenizer):
    """r1 eval's benchmark evaluation samples trajectories with the tools and reports their use beside the accuracy,
    greedy and sampled, as the held-out evaluation does."""
    from grpo_core.evaluation.benchmarks import evaluate_benchmark

    _, tokenizer = tool_tokenizer
    sampler = ScriptedSampler(tokenizer, eval_plan)
    metrics, results = evaluate_benchmark(sampler, tokenizer, ROWS, _eval_config(), reward_func="calc_accuracy")
    # greedy as in the held-out test: calls [1, 1, 0, 2], one an unknown tool (an error turn)
    assert metrics["greedy"] == 0.5
    assert (metrics["tools/call_rate"], metrics["tools/calls_per_response"], metrics["tools/error_rate"]) == \
        (0.75, 1.0, 0.25)
    assert [r["greedy_tool_calls"] for r in results] == [1, 1, 0, 2]
    played = [SAMPLED[sample_seed(7, r["id"], j) % 3] for r in ROWS for j in range(4)]
    calls = [int(p in ("call", "unknown")) for p in played]
    assert [c for r in results for c in r["tool_calls"]] == calls
    assert metrics["tools/call_rate_sampled"] == pytest.approx(sum(calls) / len(calls))
    assert metrics["tools/error_rate_sampled"] == pytest.approx(played.count("unknown") / sum(calls))
    assert metrics["pass@1"] == pytest.approx(played.count("call") / len(played))
    plain, _ = evaluate_benchmark(ScriptedSampler(tokenizer, eval_plan), tokenizer, ROWS, _eval_config(tools=()),
                                  reward_func="calc_accuracy")
    assert not [k for k in plain if k.startswith("tools/")]
