"""A built-in verifiable task where a tool pays: two-operand arithmetic on operands too long to compute in the head.

Two ``digits``-digit operands and one of ``operators`` (default four digits, ``+``); subtraction puts the larger
operand first. A ~1M-parameter byte-level model adds two 4-digit numbers in its head unreliably (a carry across
four columns, no worked steps); one ``calculator`` call (``grpo_core.tools``) gets it right every time::

    prompt      4831+2975=
    in the head <think>4831+2975=7806</think><answer>7806</answer>
    with a tool <think><tool_call>{"name":"calculator","arguments":{"expression":"4831+2975"}}</tool_call>
                <tool_response>7806</tool_response>4831+2975=7806</think><answer>7806</answer>      (one line)

The tool call is ``json.dumps`` with compact separators (``CALL_SEPARATORS``: 8 bytes shorter than the default
spacing, and one spelling everywhere), so ``grpo_core.tools.parse_tool_call`` reads it; the tool turn is what the
tiny model's tool chat template renders (``<tool_response>{content}</tool_response>``, no separators) around what
the calculator returns, so a cold-start trace is token for token what a rollout with the tool would hold.

The cold start is in the style of a teacher that computes in its head and is always right, and calls the
calculator in a ``tool_fraction`` of its traces (exactly that share, rounded): RL has a rare behaviour to amplify,
where a base that errs in its head loses reward. The tiny base's corpus gets head traces only (``pretrain_size``:
plain worked sums, no tool): a base model has seen arithmetic, not this tool.

The reward ``calc_accuracy`` verifies against the value computed from the prompt: exactly ``<think>...</think>
<answer>N</answer>``, where the reasoning may hold tool calls and tool turns, and N (after the last tool turn) is
the value. A tool turn's content is never read as the answer: a completion that ends in or right after a tool turn
scores 0, and so does a right tool result followed by a wrong answer. ``split_turns`` and ``tool_response_spans``
(``grpo_core.tools``', re-exported here) cut a completion into its model and tool turns (the SFT loss masks the
tool's tokens, as the RL loss does); ``tool_use`` counts calls and error turns. Rows follow the normalised schema
``{id, prompt, answer, task, source, operators}``.

Held out by problem, not by spelling (``problem_key``): for ``+`` and ``*`` the unordered operand pair
(``4831+2975=`` and ``2975+4831=`` are one problem), for ``-`` the ordered pair. Four digits make ~40.5 million
``+`` problems, so any held-out set is a vanishing share; two digits make 4,095.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Hashable
from typing import Any

from grpo_core.data.synthetic import apply_op, sample_rows, split_rows
from grpo_core.rewards.base import completion_text, prompt_text
from grpo_core.tools.builtin import calculate
from grpo_core.tools.calls import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_RESPONSE_CLOSE,
    TOOL_RESPONSE_OPEN,
    TOOL_TURN,
    tool_response_spans,  # noqa: F401 (re-exported: a trace's tool turns, as this module's tests read them)
)

TASK = SOURCE = "calc"
DEFAULT_OPERATORS = "+"
DEFAULT_DIGITS = 4
TOOL_NAME = "calculator"
CALL_SEPARATORS = (",", ":")  # json.dumps's compact form: {"name":"calculator","arguments":{...}}
ERROR_PREFIX = "error:"  # how a tool's error turn starts (grpo_core.tools: calculator and python errors)
PROMPT = re.compile(r"^(\d+)([-+*])(\d+)=$")
# The whole completion: a think block whose reasoning may hold tool calls and tool turns, then one answer. A tool
# turn's content may hold any text (an error quoting the model's call) and is skipped, never read as the answer.
_ANY_TAG = "|".join(re.escape(t) for t in (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE))
ANSWER = re.compile(
    rf"^<think>(?:[^<]|{re.escape(TOOL_CALL_OPEN)}(?:(?!{_ANY_TAG}).)*{re.escape(TOOL_CALL_CLOSE)}"
    rf"|{re.escape(TOOL_RESPONSE_OPEN)}(?:(?!{_ANY_TAG}).)*{re.escape(TOOL_RESPONSE_CLOSE)})*"
    r"</think><answer>(-?\d+)</answer>$", re.DOTALL)


def format_prompt(a: int, op: str, b: int) -> str:
    return f"{a}{op}{b}="


def parse_prompt(text: str) -> tuple[int, str, int] | None:
    """``(a, op, b)`` of a calc prompt, else ``None``."""
    m = PROMPT.match(text.strip())
    return (int(m.group(1)), m.group(2), int(m.group(3))) if m else None


def problem_key(text: str) -> tuple | None:
    """A calc prompt's canonical problem: the operand pair, unordered for ``+`` and ``*`` (they commute), ordered for
    ``-``; None for a prompt that is not two operands and one operator."""
    problem = parse_prompt(text)
    if problem is None:
        return None
    a, op, b = problem
    return (TASK, (min(a, b), max(a, b)) if op in "+*" else (a, b), op)


def prompt_value(text: str) -> int | None:
    """The true value of a calc prompt, computed from the prompt (not by the tool the model calls)."""
    problem = parse_prompt(text)
    return apply_op(*problem) if problem is not None else None


def make_calc_rows(num_rows: int, *, seed: int = 0, digits: int = DEFAULT_DIGITS, operators: str = DEFAULT_OPERATORS,
                   exclude: set[Hashable] | None = None, unique: bool = True, distinct_problems: bool = False
                   ) -> list[dict[str, Any]]:
    """``num_rows`` prompt rows (``synthetic.sample_rows``): two ``digits``-digit operands (no leading zero) and an
    operator drawn from ``operators``, the larger operand first for ``-``; each row carries its ``operators``.
    ``exclude`` holds canonical problems (``problem_key``)."""
    low, high = 10 ** (digits - 1), 10 ** digits - 1

    def draw(rng: random.Random) -> tuple[str, str]:
        a, b, op = rng.randint(low, high), rng.randint(low, high), rng.choice(operators)
        if op == "-" and b > a:
            a, b = b, a
        return format_prompt(a, op, b), str(apply_op(a, op, b))

    rows = sample_rows(num_rows, draw, seed=seed, task=TASK, source=SOURCE, exclude=exclude, unique=unique,
                       distinct_problems=distinct_problems, key=problem_key,
                       hint="allow more digits or operators, or set unique=False")
    return [{**r, "operators": operators} for r in rows]


def make_calc_splits(num_train: int, num_eval: int, *, seed: int = 0, unique_train: bool = False,
                     **kwargs: Any) -> tuple[list[dict], list[dict]]:
    """Train and held-out rows with no canonical problem in common (``synthetic.split_rows``: eval drawn first,
    ``num_eval`` distinct problems; train never holds one in either operand order). Train may repeat a prompt unless
    ``unique_train``."""
    return split_rows(make_calc_rows, num_train, num_eval, seed=seed, train_options={"unique": unique_train},
                      key=problem_key, **kwargs)


def tool_call_text(expression: str) -> str:
    """``<tool_call>{"name":"calculator","arguments":{"expression":...}}</tool_call>`` in the one spelling used."""
    call = json.dumps({"name": TOOL_NAME, "arguments": {"expression": expression}}, separators=CALL_SEPARATORS)
    return f"{TOOL_CALL_OPEN}{call}{TOOL_CALL_CLOSE}"


def head_trace(a: int, op: str, b: int) -> str:
    """The value computed in the head, always right: ``<think>a op b=V</think><answer>V</answer>``."""
    value = apply_op(a, op, b)
    return f"<think>{a}{op}{b}={value}</think><answer>{value}</answer>"


def tool_trace(a: int, op: str, b: int) -> str:
    """One calculator call, its tool turn (what the calculator returns), the sum written out, the answer."""
    expression = f"{a}{op}{b}"
    result = calculate(expression)
    return (f"<think>{tool_call_text(expression)}{TOOL_RESPONSE_OPEN}{result}{TOOL_RESPONSE_CLOSE}"
            f"{expression}={result}</think><answer>{result}</answer>")


def make_calc_cold_start(rows: list[dict[str, Any]], *, tool_fraction: float = 0.1, seed: int = 0
                         ) -> list[dict[str, Any]]:
    """SFT rows ``{prompt, completion, source}``: ``round(tool_fraction * len(rows))`` of them (chosen by ``seed``)
    call the calculator (``tool_trace``), the rest compute in the head (``head_trace``); every one is right."""
    if not 0.0 <= tool_fraction <= 1.0:
        raise ValueError(f"tool_fraction must be in [0, 1], got {tool_fraction}")
    with_tool = set(random.Random(seed).sample(range(len(rows)), round(tool_fraction * len(rows))))
    out = []
    for i, row in enumerate(rows):
        a, op, b = parse_prompt(prompt_text(row["prompt"]))  # type: ignore[misc]
        out.append({"prompt": row["prompt"], "source": SOURCE,
                    "completion": tool_trace(a, op, b) if i in with_tool else head_trace(a, op, b)})
    return out


def calc_accuracy(completions: list[Any], prompts: list[Any] | None = None, **kwargs: Any) -> list[float | None]:
    """1.0 when the completion is exactly ``<think>...</think><answer>N</answer>`` (tool calls and tool turns allowed
    in the reasoning, ``ANSWER``) and N is the prompt's value; 0.0 otherwise (a completion that ends in a tool turn,
    or whose tool result is right and answer wrong, included); None for a prompt that is not calc."""
    if prompts is None:
        return [None] * len(completions)
    scores: list[float | None] = []
    for completion, prompt in zip(completions, prompts):
        value = prompt_value(prompt_text(prompt))
        if value is None:
            scores.append(None)
            continue
        m = ANSWER.match(completion_text(completion).strip())
        scores.append(1.0 if m is not None and m.group(1) == str(value) else 0.0)
    return scores


def split_turns(text: str) -> list[tuple[str, str]]:
    """A completion as its turns in order: ``("assistant", text)`` for the model's, ``("tool", content)`` for each
    tool turn (the content inside the tags; one left open at the end runs to the end); empty model turns are left
    out. Joined again with each tool content wrapped in ``<tool_response>...</tool_response>`` (as the tiny model's
    tool chat template renders a tool message after an open assistant turn) they give back ``text``."""
    turns: list[tuple[str, str]] = []
    position = 0
    for m in TOOL_TURN.finditer(text):
        if m.start() > position:
            turns.append(("assistant", text[position:m.start()]))
        turns.append(("tool", m.group(1)))
        position = m.end()
    if position < len(text):
        turns.append(("assistant", text[position:]))
    return turns


def tool_use(completion: Any) -> tuple[int, int]:
    """``(calls, errors)``: how many ``<tool_call>`` blocks a completion opens, and how many of its tool turns are
    errors (content starting ``error:``, as ``grpo_core.tools`` writes a failed call)."""
    text = completion_text(completion)
    errors = sum(content.strip().startswith(ERROR_PREFIX) for role, content in split_turns(text) if role == "tool")
    return text.count(TOOL_CALL_OPEN), errors
