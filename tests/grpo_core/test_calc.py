"""The built-in calc task (issue 43): arithmetic where a calculator call pays; its rows, held-out problems, cold-start
traces with and without the tool, and the reward that reads the model's final answer, never the tool's."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from grpo_core.config.data import CalcData, DataConfig
from grpo_core.data import calc
from grpo_core.data.calc import (
    calc_accuracy,
    head_trace,
    make_calc_cold_start,
    make_calc_rows,
    make_calc_splits,
    problem_key,
    split_turns,
    tool_response_spans,
    tool_trace,
    tool_use,
)
from grpo_core.data.rows import DataError
from grpo_core.recipe.prepare import (
    canonical_problem,
    check_held_out,
    held_out_overlap,
    prepare_datasets,
)
from grpo_core.rewards import get_reward_funcs
from grpo_core.rewards.base import prompt_text
from grpo_core.tools import (
    TOOL_RESPONSE_CLOSE,
    TOOL_RESPONSE_OPEN,
    ToolCall,
    calculate,
    parse_tool_call,
)

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml"
TOOL = ('<think><tool_call>{"name":"calculator","arguments":{"expression":"4831+2975"}}</tool_call>'
        '<tool_response>7806</tool_response>4831+2975=7806</think><answer>7806</answer>')


def _text(row: dict) -> str:
    return prompt_text(row["prompt"])


def _score(completion: str, prompt: str = "4831+2975=") -> float | None:
    return calc_accuracy([completion], prompts=[[{"role": "user", "content": prompt}]])[0]


def test_the_traces_are_the_formats_the_tool_and_the_template_use():
    assert head_trace(4831, "+", 2975) == "<think>4831+2975=7806</think><answer>7806</answer>"
    assert tool_trace(4831, "+", 2975) == TOOL
    assert parse_tool_call(TOOL) == ToolCall("calculator", {"expression": "4831+2975"})  # what grpo_core.tools reads
    assert tool_trace(9120, "-", 871).count("<tool_response>8249</tool_response>") == 1
    assert tool_trace(12, "*", 34).endswith("12*34=408</think><answer>408</answer>")


def test_a_completion_splits_into_model_and_tool_turns():
    turns = split_turns(TOOL)
    assert turns == [("assistant", TOOL[:TOOL.index("<tool_response>")]), ("tool", "7806"),
                     ("assistant", "4831+2975=7806</think><answer>7806</answer>")]
    rejoined = "".join(c if role == "assistant" else f"{TOOL_RESPONSE_OPEN}{c}{TOOL_RESPONSE_CLOSE}"
                       for role, c in turns)
    assert rejoined == TOOL
    [(start, end)] = tool_response_spans(TOOL)
    assert TOOL[start:end] == "<tool_response>7806</tool_response>"
    assert split_turns(head_trace(1, "+", 2)) == [("assistant", head_trace(1, "+", 2))] and not tool_response_spans("x")
    two = "<think><tool_call>{}</tool_call><tool_response>error: no</tool_response><tool_call>{}</tool_call>" \
          "<tool_response>7</tool_response></think><answer>7</answer>"
    assert [role for role, _ in split_turns(two)] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert split_turns("a<tool_response>12") == [("assistant", "a"), ("tool", "12")]  # cut inside a tool turn
    assert tool_response_spans("a<tool_response>12\n") == [(1, 19)]


def test_tool_use_counts_calls_and_error_turns():
    assert tool_use(TOOL) == (1, 0)
    assert tool_use(head_trace(4831, "+", 2975)) == (0, 0)
    errs = ("<think><tool_call>{bad</tool_call><tool_response>error: the tool call is not valid JSON</tool_response>"
            '<tool_call>{"name":"calculator","arguments":{"expression":"1+1"}}</tool_call><tool_response>\n'
            "error: names are not allowed\n</tool_response><tool_call>{}</tool_call><tool_response>2</tool_response>"
            "</think><answer>2</answer>")
    assert tool_use(errs) == (3, 2)
    assert tool_use([{"role": "assistant", "content": TOOL}]) == (1, 0)  # a chat completion


def test_reward_reads_the_models_final_answer_never_the_tools():
    assert _score("<think>4831+2975=7806</think><answer>7806</answer>") == 1.0
    assert _score("<think></think><answer>7806</answer>") == 1.0
    assert _score("<think>4831+2975=7706</think><answer>7706</answer>") == 0.0  # wrong in the head
    assert _score("<think>4831+2975=7806</think>") == 0.0  # no answer
    assert _score("<answer>7806</answer>") == 0.0 and _score("7806") == 0.0  # not the format
    assert _score("<think>x</think><answer>07806</answer>") == 0.0  # one spelling of the value
    assert _score("<think>x</think><answer>7806</answer>junk") == 0.0
    assert _score(TOOL) == 1.0
    assert _score(TOOL.replace("<answer>7806", "<answer>7807")) == 0.0  # the tool was right, the answer is not
    ends_in_tool = TOOL[:TOOL.index("</tool_response>") + len("</tool_response>")]
    assert _score(ends_in_tool) == 0.0 and _score(TOOL[:TOOL.index("</tool_response>")]) == 0.0
    in_tool = TOOL.replace("<tool_response>7806", "<tool_response></think><answer>7806</answer>")
    assert _score(in_tool.replace("</tool_response>4831+2975=7806</think><answer>7806</answer>",
                                  "</tool_response>")) == 0.0  # an answer inside the tool turn is not the model's
    assert _score(in_tool) == 1.0  # and does not stop the model's own answer from counting
    assert _score(TOOL.replace("7806</tool_response>", "error: x < y</tool_response>")) == 1.0  # any tool content
    assert _score("<think><tool_call>{}</tool_call></think><answer>7806</answer>") == 1.0  # a call left unanswered
    assert _score("<think><x>4831</think><answer>7806</answer>") == 0.0  # another tag in the reasoning
    assert _score(TOOL, "9120-871=") == 0.0 and _score("<think></think><answer>8249</answer>", "9120-871=") == 1.0
    assert _score("<think></think><answer>408</answer>", "12*34=") == 1.0
    assert _score(TOOL, "3,8,5->13:") is None and _score(TOOL, "What is 2+2?") is None  # not calc
    assert calc_accuracy([TOOL]) == [None]  # no prompts
    [fn] = get_reward_funcs(["calc_accuracy"])
    assert fn is calc_accuracy and fn([[{"role": "assistant", "content": TOOL}]], prompts=["4831+2975="]) == [1.0]


def test_rows_are_deterministic_by_seed_and_have_the_asked_shape():
    rows = make_calc_rows(300, seed=4, digits=3, operators="+-*")
    assert rows == make_calc_rows(300, seed=4, digits=3, operators="+-*") != make_calc_rows(300, seed=5, digits=3,
                                                                                              operators="+-*")
    assert len({_text(r) for r in rows}) == 300 and {r["prompt"][0]["role"] for r in rows} == {"user"}
    for r in rows:
        a, op, b = calc.parse_prompt(_text(r))
        assert 100 <= a <= 999 and 100 <= b <= 999 and r["answer"] == str(calc.prompt_value(_text(r)))
        assert (r["task"], r["source"], r["operators"]) == ("calc", "calc", "+-*") and (op != "-" or a >= b)
    assert {calc.parse_prompt(_text(r))[1] for r in rows} == {"+", "-", "*"}
    assert all(len(_text(r)) == 10 for r in make_calc_rows(50, seed=0))  # the default: 4-digit sums, dddd+dddd=


def test_problem_keys_fold_the_commuting_operands_and_prepare_uses_them():
    assert problem_key("4831+2975=") == problem_key("2975+4831=") == canonical_problem(" 2975+4831= ")
    assert problem_key("12*34=") == problem_key("34*12=") != problem_key("12+34=")
    assert problem_key("9120-871=") != problem_key("871-9120=")
    assert problem_key("3+5*2=") is None and problem_key("3,8,5->13:") is None
    assert canonical_problem("3+5*2=") == canonical_problem("5+3*2=")  # chains as before
    train, ev = make_calc_splits(800, 300, seed=2, digits=2, unique_train=True)
    keys = {problem_key(_text(r)) for r in ev}
    assert len(keys) == 300 and not keys & {problem_key(_text(r)) for r in train}
    assert all(r["id"].startswith("calc-eval-") for r in ev)


def test_cold_start_calls_the_tool_in_the_share_asked_for_and_is_always_right():
    rows = make_calc_rows(500, seed=1, operators="+*", unique=False)
    for fraction, wanted in ((0.1, 50), (0.0, 0), (1.0, 500), (0.333, 166)):
        cold = make_calc_cold_start(rows, tool_fraction=fraction, seed=3)
        assert sum(tool_use(r["completion"])[0] for r in cold) == wanted
        assert calc_accuracy([r["completion"] for r in cold], prompts=[r["prompt"] for r in cold]) == [1.0] * 500
        assert {r["source"] for r in cold} == {"calc"} and cold == make_calc_cold_start(rows, tool_fraction=fraction,
                                                                                        seed=3)
    for r in make_calc_cold_start(rows[:40], tool_fraction=1.0):  # the tool turn is what the calculator returns
        call = parse_tool_call(r["completion"])
        tool_turns = [c for role, c in split_turns(r["completion"]) if role == "tool"]
        assert tool_turns == [calculate(call.arguments["expression"])]
    with pytest.raises(ValueError, match="tool_fraction"):
        make_calc_cold_start(rows, tool_fraction=1.5)


CALC = {"num_train": 300, "num_eval": 60, "digits": 2, "cold_start_size": 600, "tool_fraction": 0.2,
        "pretrain_size": 900}


def test_prepare_builds_calc_beside_the_chain_with_held_out_problems_in_no_training_row():
    data = prepare_datasets(DataConfig(num_train=50, num_eval=10, cold_start_size=20, pretrain_size=30, calc=CALC))
    train = [r for r in data.train if r["source"] == "calc"]
    held = [r for r in data.eval if r["source"] == "calc"]
    cold = [r for r in data.cold_start if r["source"] == "calc"]
    pre = [r for r in data.pretrain if calc.parse_prompt(_text(r))]
    assert len(train) == 300 and len({_text(r) for r in train}) == 300 and len(held) == 60
    assert len(cold) == 600 and sum(tool_use(r["completion"])[0] for r in cold) == 120
    assert len(pre) == 900 and not any(tool_use(r["completion"])[0] for r in pre)  # worked in the head, no tool
    keys = {problem_key(_text(r)) for r in held}  # 2 digits: 4,095 + problems, 1,800 rows drawn around 60 held out
    assert len(keys) == 60 and not keys & {problem_key(_text(r)) for r in train + cold + pre}
    assert held_out_overlap(data.eval, {"train": data.train, "cold-start": data.cold_start, "pretraining": pre}) == []
    assert data.stats["train_by_source"]["calc"] == 300 and data.stats["eval_by_source"]["calc"] == 60
    assert prepare_datasets(DataConfig(num_train=50, num_eval=10, cold_start_size=20, pretrain_size=30,
                                       calc=CALC)).train == data.train  # deterministic by seed
    unpretrained = prepare_datasets(DataConfig(num_train=50, num_eval=10, cold_start_size=20,
                                               calc={**CALC, "pretrain_size": 0}))
    assert not unpretrained.pretrain
    only = prepare_datasets(DataConfig(builtin_task=None, calc={**CALC, "pretrain_size": 0}))
    assert {r["source"] for r in only.train} == {"calc"}


def test_prepare_fails_naming_the_rows_when_a_training_source_holds_a_held_out_calc_problem(tmp_path):
    base = {"builtin_task": None, "calc": {**CALC, "pretrain_size": 0}}
    data = prepare_datasets(DataConfig(**base))
    a, op, b = calc.parse_prompt(_text(data.train[0]))
    swapped = calc.format_prompt(b, op, a)
    leaked = tmp_path / "eval.jsonl"  # a user's eval source holding a training problem with its operands swapped
    leaked.write_text(json.dumps({"prompt": swapped, "answer": str(a + b)}) + "\n")
    with pytest.raises(DataError, match=rf"training rows hold a held-out problem.*calc sum's.*train row "
                                        rf"'{a}\+{b}=' is eval row .*'{b}\+{a}='"):
        prepare_datasets(DataConfig(**base, eval_sources=[{"path": str(leaked)}], decontaminate=False))
    held = next(r for r in data.eval if r["source"] == "calc")
    x, _, y = calc.parse_prompt(_text(held))
    planted = [*data.cold_start,
               {"prompt": [{"role": "user", "content": f"{y}+{x}="}], "completion": "", "source": "calc"}]
    with pytest.raises(DataError, match=rf"1 training rows.*cold-start row '{y}\+{x}=' is eval row {held['id']}"):
        check_held_out(data.eval, {"train": data.train, "cold-start": planted})


def test_the_config_section_has_bounds_and_needs_a_pretraining_corpus_for_pretrain_size():
    assert CalcData().digits == 4 and CalcData().operators == "+" and 0 < CalcData().tool_fraction <= 0.2
    for bad in ({"digits": 1}, {"tool_fraction": 1.2}, {"operators": "/"}, {"num_eval": 0}, {"cold_start_size": -1}):
        with pytest.raises(ValidationError):
            CalcData(**bad)
    with pytest.raises(ValidationError, match=r"data.calc.pretrain_size \(900\).*set data.pretrain_size"):
        DataConfig(calc=CALC)
    assert DataConfig(builtin_task=None, calc={"num_train": 10}).calc.num_train == 10  # a task of its own
    assert DataConfig().calc is None


def _digest(rows: list[dict]) -> str:
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


def test_the_embedded_defaults_data_is_unchanged_without_calc_and_beside_it():
    """configs/tiny-cpu.yaml has no calc section: its prepared data is the data built with calc=None, and adding a
    calc section adds calc rows only (every other row, in order, as without it)."""
    raw = yaml.safe_load(CONFIG.read_text())["data"]
    assert "calc" not in raw
    default = prepare_datasets(DataConfig.model_validate(raw))
    explicit = prepare_datasets(DataConfig.model_validate({**raw, "calc": None}))
    with_calc = prepare_datasets(DataConfig.model_validate({**raw, "calc": {**CALC, "digits": 4}}))
    for part in ("train", "eval", "cold_start", "pretrain", "preferences"):
        rows = getattr(default, part)
        assert _digest(getattr(explicit, part)) == _digest(rows)
        assert _digest([r for r in getattr(with_calc, part) if not calc.parse_prompt(_text(r))]) == _digest(rows), part
        assert not any(calc.parse_prompt(_text(r)) for r in rows)
