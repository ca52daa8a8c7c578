"""grpo_core.tools: parsing Hermes-style tool calls, the calculator, schemas from type hints, loading tools by name
or import path, ToolSet.respond turning every failure into an error turn (and counting it), and the python tool in
the code reward's sandbox (output, exceptions, time, memory and network bounded)."""

from __future__ import annotations

import json
import re
import shutil
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Literal, Optional

import pytest
from transformers.utils import get_json_schema

from grpo_core.rewards.code import SandboxLimits
from grpo_core.tools import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ToolCall,
    ToolResult,
    ToolSet,
    calculate,
    load_tool,
    parse_tool_call,
    python_tool,
    tool_from_function,
)

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap not installed (apt-get install -y bubblewrap)"
)


def call(name: str, arguments: str) -> str:
    return f'Let me compute.\n{TOOL_CALL_OPEN}\n{{"name": "{name}", "arguments": {arguments}}}\n{TOOL_CALL_CLOSE}'


def answer(tools: ToolSet, text: str) -> ToolResult:
    result = tools.respond(text)
    assert result is not None, text
    return result


def add(a: int, b: int = 1) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


# ---------------------------------------------------------------- parsing


@pytest.mark.parametrize("text", [
    '<tool_call>{"name": "calculator", "arguments": {"expression": "123*456"}}</tool_call>',
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "123*456"}}\n</tool_call>',
    'I will use a tool.\n<tool_call>  \n\t{"name":"calculator","arguments":{"expression":"123*456"}}  \n</tool_call>',
    '<tool_call>{"name": "calculator", "arguments": {"expression": "123*456"}, "id": "c1"}</tool_call>',
])
def test_a_good_call_parses_with_any_whitespace(text: str) -> None:
    assert parse_tool_call(text) == ToolCall("calculator", {"expression": "123*456"})


def test_the_last_of_several_calls_is_taken() -> None:
    first = call("calculator", '{"expression": "1+1"}')
    text = f"{first}\n<tool_response>2</tool_response>\n" + call("python", '{"code": "print(3)"}')
    assert parse_tool_call(text) == ToolCall("python", {"code": "print(3)"})


def test_missing_arguments_read_as_none_given() -> None:
    assert parse_tool_call('<tool_call>{"name": "now"}</tool_call>') == ToolCall("now", {})


@pytest.mark.parametrize("body, says", [
    ('{"name": "calculator", "arguments": {"expression": "1+1"}', "not valid JSON"),  # a brace short
    ("{'name': 'calculator'}", "not valid JSON"),  # Python, not JSON
    ('["calculator", {"expression": "1"}]', "must be a JSON object"),
    ('{"arguments": {"expression": "1"}}', 'no "name"'),
    ('{"name": "", "arguments": {}}', 'no "name"'),
    ('{"name": 3, "arguments": {}}', 'no "name"'),
    ('{"name": "calculator", "arguments": "{\\"expression\\": \\"1\\"}"}', '"arguments" must be a JSON object'),
    ('{"name": "calculator", "arguments": [1, 2]}', '"arguments" must be a JSON object'),
    ("[" * 100_000, "nested too deeply"),
])
def test_a_malformed_call_is_a_message(body: str, says: str) -> None:
    parsed = parse_tool_call(f"{TOOL_CALL_OPEN}{body}{TOOL_CALL_CLOSE}")
    assert isinstance(parsed, str) and says in parsed


def test_an_unclosed_call_at_the_end_is_malformed_even_after_a_good_one() -> None:
    text = call("calculator", '{"expression": "1+1"}') + '\n<tool_call>{"name": "calculator", "arguments": {}}'
    parsed = parse_tool_call(text)
    assert isinstance(parsed, str) and "not closed" in parsed


@pytest.mark.parametrize("text", ["", "The answer is 42.", "</tool_call>", "I could use <tool_response> here"])
def test_no_call_is_none(text: str) -> None:
    assert parse_tool_call(text) is None


# ---------------------------------------------------------------- calculator


@pytest.mark.parametrize("expression, value", [
    ("123*456", "56088"), ("2**100", "1267650600228229401496703205376"), ("7/2", "3.5"), ("8/2", "4.0"),
    ("7//2", "3"), ("-7 % 3", "2"), ("-(2+3)*4", "-20"), ("0.1+0.2", "0.30000000000000004"), ("2**-1", "0.5"),
    (" ( 1 + 2 ) * 3 ", "9"), ("+5", "5"), ("1e3 * 2", "2000.0"), ("(-2)**3", "-8"),
])
def test_calculator_values(expression: str, value: str) -> None:
    assert calculate(expression) == value


@pytest.mark.parametrize("expression, says", [
    ("x + 1", "names are not allowed"), ("__import__('os').system('true')", "function calls are not allowed"),
    ("abs(-1)", "function calls are not allowed"), ("(1).real", "attribute access is not allowed"),
    ("'a' * 3", "is not a number"), ("True + 1", "is not a number"), ("1 < 2", "Compare is not allowed"),
    ("lambda: 1", "Lambda is not allowed"), ("[1, 2]", "List is not allowed"), ("1 << 10", "BinOp is not allowed"),
    ("2^10", "write **"), ("1/0", "division by zero"), ("5 % 0", "division by zero"), ("1 +", "not an arithmetic"),
    ("9**9**9", "too large"), ("2**5000", "too large"), ("(10**1000)*(10**1000)", "too large"),
    ("2.0**100000", "too large"), ("1e308*10", "not a finite number"), ("(-8)**0.5", "complex"),
    ("1" + "+1" * 600, "longer than"), ("(" * 300 + "1" + ")" * 300, "too many nested parentheses"),
], ids=lambda x: x[:20] if isinstance(x, str) else None)
def test_calculator_refuses_what_is_not_bounded_arithmetic(expression: str, says: str) -> None:
    start = time.monotonic()
    with pytest.raises(ValueError, match=re.escape(says)):
        calculate(expression)
    assert time.monotonic() - start < 1.0  # refused before computing, not after minutes of 9**387420489


# ---------------------------------------------------------------- schemas and loading


def kitchen_sink(count: int, ratio: float, label: str, flag: bool, items: list[int],
                 note: Optional[str] = None,  # noqa: UP045 (typing.Optional, as older code writes it)
                 mode: Literal["fast", "slow"] = "fast",
                 weights: dict[str, float] | None = None) -> str:
    """Do several things at once.

    Args:
        count: how many
        ratio: a fraction
        label: a name for it,
            over two lines
        flag: whether to
        items: the integers
        note: a remark
        mode: how
        weights: per name
    """
    return label


def test_schema_from_type_hints_and_docstring_matches_transformers() -> None:
    tool = tool_from_function(kitchen_sink)
    params = tool.parameters
    assert tool.description == "Do several things at once."
    assert params["required"] == ["count", "ratio", "label", "flag", "items"]
    assert {k: p.get("type") for k, p in params["properties"].items()} == {
        "count": "integer", "ratio": "number", "label": "string", "flag": "boolean", "items": "array",
        "note": "string", "mode": "string", "weights": "object"}
    assert params["properties"]["items"]["items"] == {"type": "integer"}
    assert params["properties"]["note"]["nullable"] is True and params["properties"]["mode"]["enum"] == ["fast", "slow"]
    assert params["properties"]["label"]["description"] == "a name for it, over two lines"
    expected = get_json_schema(kitchen_sink)  # what apply_chat_template(tools=[fn]) would build from the function
    expected["function"].pop("return")
    assert tool.schema() == expected


def test_sphinx_docstrings_and_overrides() -> None:
    def scale(x: float, by: int = 2) -> float:
        """Scale a number.

        :param x: the number
        :param by: the factor
        :returns: the product
        """
        return x * by

    tool = tool_from_function(scale, name="times", description="Multiply.", timeout=1.5)
    assert (tool.name, tool.description, tool.timeout) == ("times", "Multiply.", 1.5)
    assert tool_from_function(scale).description == "Scale a number."
    descriptions = {k: p["description"] for k, p in tool.parameters["properties"].items()}
    assert descriptions == {"x": "the number", "by": "the factor"}
    assert tool.parameters["required"] == ["x"]


def test_an_untyped_or_unsupported_parameter_is_a_clear_error() -> None:
    def untyped(x):  # type: ignore[no-untyped-def]
        return x

    def odd(x: set[int]) -> int:
        return len(x)

    def star(*xs: int) -> int:
        return sum(xs)

    with pytest.raises(ValueError, match="parameter 'x' has no type hint"):
        tool_from_function(untyped)
    with pytest.raises(ValueError, match="parameter 'x'.*no JSON schema.*use int, float"):
        tool_from_function(odd)
    with pytest.raises(ValueError, match="named arguments only"):
        tool_from_function(star)
    with pytest.raises(ValueError, match="letters, digits"):
        tool_from_function(add, name="two words")


def test_load_a_builtin_by_name() -> None:
    tool = load_tool("calculator")
    assert tool.name == "calculator" and tool.parameters["required"] == ["expression"]
    assert tool.function(expression="6*7") == "42"


def test_load_a_user_tool_by_import_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_tools_mod.py").write_text(textwrap.dedent('''
        from __future__ import annotations
        from grpo_core.tools import Tool

        def word_count(text: str, min_length: int | None = None) -> int:
            """Count the words of a text.

            Args:
                text: the text
                min_length: count only words this long
            """
            return len([w for w in text.split() if len(w) >= (min_length or 0)])

        ECHO = Tool(name="echo", description="Echo.", function=lambda said: said,
                    parameters={"type": "object", "properties": {"said": {"type": "string"}}, "required": ["said"]})
        NOT_A_TOOL = 3
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    tools = ToolSet.from_specs(["my_tools_mod:word_count", "my_tools_mod:ECHO", "calculator"])
    assert tools.names == ["word_count", "echo", "calculator"]
    schema = tools.schemas()[0]
    assert schema["type"] == "function" and schema["function"]["name"] == "word_count"
    assert schema["function"]["parameters"]["properties"]["min_length"] == {
        "type": "integer", "nullable": True, "description": "count only words this long"}
    result = answer(tools, call("word_count", '{"text": "a bb ccc", "min_length": 2}'))
    assert result == ToolResult(content="2", error=False, name="word_count", seconds=result.seconds)
    assert answer(tools, call("echo", '{"said": "hi"}')).content == "hi"


@pytest.mark.parametrize("spec, says", [
    ("calculater", "not a built-in tool \\(calculator, python\\).*'package.module:function'"),
    ("no_such_module_r1:f", "no module named 'no_such_module_r1'.*PYTHONPATH"),
    ("json:no_such_function", "json has no 'no_such_function'; its public callables: .*dumps"),
    ("my_tools_bad:NOT_A_TOOL", "NOT_A_TOOL is a int, not a function or a Tool"),
    ("my_tools_bad:needs", "importing 'my_tools_bad' failed"),
])
def test_a_bad_spec_names_itself_and_the_fix(spec: str, says: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    imports = "import no_such_dependency_r1\n" if spec.endswith(":needs") else ""
    (tmp_path / "my_tools_bad.py").write_text(f"{imports}NOT_A_TOOL = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_tools_bad", raising=False)
    with pytest.raises(ValueError, match=f"tool '{spec}': {says}"):
        load_tool(spec)


# ---------------------------------------------------------------- ToolSet.respond: every failure is a turn


def test_duplicate_names_are_refused() -> None:
    with pytest.raises(ValueError, match="given more than once: add"):
        ToolSet([tool_from_function(add), tool_from_function(add)])


def test_no_call_no_answer_and_a_good_call_answers() -> None:
    tools = ToolSet([tool_from_function(add)])
    assert tools.respond("The answer is 3.") is None
    assert tools.stats()["tools/calls"] == 0
    result = tools.respond(call("add", '{"a": 2}'))
    assert result is not None and (result.content, result.error, result.name) == ("3", False, "add")


def test_every_failure_is_an_error_turn_and_counted() -> None:
    release = threading.Event()

    def explode(x: int) -> int:
        raise RuntimeError(f"boom {x}")

    def slow(x: int) -> int:
        release.wait(30)
        return x

    tools = ToolSet([tool_from_function(add), tool_from_function(explode), tool_from_function(slow, timeout=0.2)])
    cases = [
        ('<tool_call>{"name": "add", "arguments": {"a": 1}</tool_call>', None, "not valid JSON"),
        ("<tool_call>{", None, "not closed"),
        (call("search", '{"q": "x"}'), "search", "unknown tool 'search'; the tools are: add, explode, slow"),
        (call("add", '{"b": 1}'), "add",
         "missing required argument(s): a; the arguments are: a (integer), b (integer, optional)"),
        (call("add", '{"a": 1, "c": 2}'), "add", "unexpected argument(s): c"),
        (call("add", '{"a": "1"}'), "add", "argument a must be integer, got string '1'"),
        (call("add", '{"a": 1.5}'), "add", "argument a must be integer, got number 1.5"),
        (call("add", '{"a": true}'), "add", "argument a must be integer, got boolean True"),
        (call("add", '{"a": null}'), "add", "argument a must be integer, got null None"),
        (call("explode", '{"x": 7}'), "explode", "explode raised RuntimeError: boom 7"),
        (call("slow", '{"x": 7}'), "slow", "slow did not answer within 0.2 s"),
    ]
    try:
        for text, name, says in cases:
            start = time.monotonic()
            result = tools.respond(text)
            assert result is not None and result.error and result.name == name, (text, result)
            assert result.content.startswith("error: ") and says in result.content, (says, result.content)
            assert time.monotonic() - start < 5.0
    finally:
        release.set()
    stats = tools.stats()
    assert (stats["tools/malformed"], stats["tools/unknown"]) == (2, 1)
    assert (stats["tools/add/calls"], stats["tools/add/errors"]) == (6, 6)
    assert (stats["tools/explode/errors"], stats["tools/slow/errors"], stats["tools/slow/timeouts"]) == (1, 1, 1)
    assert stats["tools/slow/seconds"] >= 0.2 and (stats["tools/calls"], stats["tools/errors"]) == (11, 11)
    assert answer(tools, call("add", '{"a": 1, "b": 2}')).content == "3"
    assert (tools.stats()["tools/add/calls"], tools.stats()["tools/add/errors"]) == (7, 6)
    tools.reset_stats()
    assert set(tools.stats().values()) == {0.0}


def test_nested_argument_types_are_checked() -> None:
    def total(xs: list[int], mode: Literal["sum", "max"] = "sum", w: dict[str, float] | None = None) -> int:
        return sum(xs) if mode == "sum" else max(xs)

    tools = ToolSet([tool_from_function(total)])
    assert answer(tools, call("total", '{"xs": [1, 2, 3], "mode": "max", "w": null}')).content == "3"
    for arguments, says in [('{"xs": [1, "2"]}', "argument xs[1] must be integer"),
                            ('{"xs": [1], "mode": "min"}', "argument mode must be one of ['sum', 'max']"),
                            ('{"xs": [1], "w": {"a": "x"}}', "argument w.a must be number")]:
        result = tools.respond(call("total", arguments))
        assert result is not None and result.error and says in result.content, result


def test_a_tool_whose_answer_cannot_be_printed_or_exits_is_an_error_turn() -> None:
    class Unprintable:
        def __str__(self) -> str:
            raise ValueError("no")

    def bad() -> Unprintable:
        return Unprintable()

    def leave() -> str:
        raise SystemExit(3)

    tools = ToolSet([tool_from_function(bad, description="x"), tool_from_function(leave, description="x")])
    assert "bad raised ValueError: no" in answer(tools, '<tool_call>{"name": "bad"}</tool_call>').content
    assert "leave raised SystemExit: 3" in answer(tools, '<tool_call>{"name": "leave"}</tool_call>').content


def test_long_answers_are_cut_with_a_note() -> None:
    def spew(n: int) -> str:
        return "x" * n

    tools = ToolSet([tool_from_function(spew, description="x")], max_content_chars=100)
    content = answer(tools, call("spew", '{"n": 150}')).content
    assert content.startswith("x" * 100 + "\n") and content.endswith("[truncated: 50 more characters]")


def test_calculator_errors_through_respond() -> None:
    tools = ToolSet.from_specs(["calculator"])
    ok = tools.respond(call("calculator", '{"expression": "123*456"}'))
    bad = tools.respond(call("calculator", '{"expression": "9**9**9"}'))
    assert ok is not None and (ok.content, ok.error) == ("56088", False)
    assert bad is not None and bad.error and bad.content.startswith("error: the result is too large")
    assert (tools.stats()["tools/calculator/calls"], tools.stats()["tools/calculator/errors"]) == (2, 1)


def test_counters_add_up_across_threads() -> None:
    tools = ToolSet.from_specs(["calculator"])
    texts = [call("calculator", '{"expression": "6*7"}'), call("calculator", '{"expression": "x"}'), "<tool_call>{"]

    def work() -> None:
        for i in range(30):
            answer(tools, texts[i % 3])

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = tools.stats()
    assert (stats["tools/calls"], stats["tools/errors"], stats["tools/malformed"]) == (240, 160, 80)
    assert (stats["tools/calculator/calls"], stats["tools/calculator/errors"]) == (160, 80)


# ---------------------------------------------------------------- the python tool, in the bwrap sandbox

# a roomy time limit where the program ends by itself (a loaded machine starts Python slowly), a short one where the
# limit is what the test reads
ROOMY = SandboxLimits(timeout=30.0, memory_mb=256, max_output_bytes=64 << 10)
FAST = SandboxLimits(timeout=1.5, memory_mb=256, max_output_bytes=64 << 10)


@pytest.fixture(scope="module")
def python_tools() -> ToolSet:
    return ToolSet([python_tool(limits=ROOMY)])


def run_code(tools: ToolSet, code: str) -> ToolResult:
    result = tools.respond(f'{TOOL_CALL_OPEN}{{"name": "python", "arguments": {{"code": {json.dumps(code)}}}}}'
                           f"{TOOL_CALL_CLOSE}")
    assert result is not None and result.name == "python"
    return result


@pytest.mark.sandbox
@needs_bwrap
def test_python_prints_and_reports_no_output(python_tools: ToolSet) -> None:
    assert load_tool("python").parameters["required"] == ["code"]
    result = run_code(python_tools, "import math\nprint(math.comb(10, 3))\nprint('done')")
    assert (result.content, result.error) == ("120\ndone\n", False)
    assert run_code(python_tools, "x = 1").content.startswith("(no output")


@pytest.mark.sandbox
@needs_bwrap
def test_python_exception_shows_the_stderr_tail_and_stdout(python_tools: ToolSet) -> None:
    result = run_code(python_tools, "print('before')\n1/0")
    assert result.error and result.content.startswith("error: the program failed (exit status 1)")
    assert "ZeroDivisionError: division by zero" in result.content and "stdout before that:\nbefore" in result.content


@pytest.mark.sandbox
@needs_bwrap
def test_python_infinite_loop_is_killed_at_its_time_limit() -> None:
    fast = ToolSet([python_tool(limits=FAST)])
    start = time.monotonic()
    result = run_code(fast, "print('spinning', flush=True)\nwhile True:\n    pass")
    assert time.monotonic() - start < FAST.timeout + 5
    assert result.error and "ran past its 1.5 s time limit and was killed" in result.content
    assert fast.stats()["tools/python/timeouts"] == 0  # the sandbox killed it: no thread was abandoned


@pytest.mark.sandbox
@needs_bwrap
def test_python_memory_hog_is_bounded(python_tools: ToolSet) -> None:
    result = run_code(python_tools, "x = bytearray(2 << 30)\nprint('allocated')")
    assert result.error and "MemoryError" in result.content and "allocated" not in result.content
    grow = run_code(python_tools, "xs = []\nwhile True:\n    xs.append(bytearray(16 << 20))")
    assert grow.error and ("MemoryError" in grow.content or "killed" in grow.content)


@pytest.mark.sandbox
@needs_bwrap
def test_python_has_no_network(python_tools: ToolSet) -> None:
    code = ("import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect(('1.1.1.1', 53))\n"
            "print('connected')")
    result = run_code(python_tools, code)
    assert result.error and "stdout before that" not in result.content  # 'connected' was never printed
    assert "OSError: [Errno 101] Network is unreachable" in result.content


@pytest.mark.sandbox
@needs_bwrap
def test_python_output_is_cut_and_counted(python_tools: ToolSet) -> None:
    before = python_tools.stats()
    result = run_code(python_tools, "print('y' * 5000)")
    assert not result.error and result.content.startswith("y" * 2000 + "\n... [truncated: 3001 more characters]")
    flood = run_code(python_tools, "while True:\n    print('z' * 1000)")
    assert flood.error and "printed more than 65536 bytes and was killed" in flood.content
    after = python_tools.stats()
    assert after["tools/python/calls"] - before["tools/python/calls"] == 2
    assert after["tools/python/errors"] - before["tools/python/errors"] == 1
