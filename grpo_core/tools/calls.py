"""Reading a tool call out of a completion, and the result a tool turn carries back.

The format is Qwen2.5's (Hermes style): the model writes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
and reads the answer in a tool turn, which Qwen's chat template wraps in ``<tool_response>...</tool_response>``.
A rollout stops on ``</tool_call>``, so the call that matters is the last one in the text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"
_QUOTE_CHARS = 200  # how much of a malformed call an error message quotes back to the model
# A tool turn in a completion's text, tags included, its content in group 1; one left open at the end (a trajectory
# cut by its token budget) runs to the end of the text
TOOL_TURN = re.compile(rf"{re.escape(TOOL_RESPONSE_OPEN)}(.*?)(?:{re.escape(TOOL_RESPONSE_CLOSE)}|\Z)", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolResult:
    content: str  # what the model reads in the tool turn (the tool's output, or an error message)
    error: bool  # True for malformed call / unknown tool / bad arguments / tool raised / timed out
    name: str | None  # the tool called (None when the call could not be parsed)
    seconds: float  # wall time of the call


def parse_tool_call(text: str) -> ToolCall | str | None:
    """The last ``<tool_call>...</tool_call>`` in ``text``: a ``ToolCall``; an error message (str) when it is
    malformed (bad JSON, not an object, no ``"name"``, ``"arguments"`` not an object, or a ``<tool_call>`` left
    unclosed at the end); ``None`` when ``text`` holds no ``<tool_call>``.

    A missing ``"arguments"`` reads as ``{}`` (a tool without parameters), so the argument check, not the parser,
    says which ones are required. Keys besides ``name`` and ``arguments`` (an ``id``) are ignored.
    """
    start = text.rfind(TOOL_CALL_OPEN)
    if start < 0:
        return None
    body, closed, _ = text[start + len(TOOL_CALL_OPEN):].partition(TOOL_CALL_CLOSE)
    body = body.strip()
    if not closed:
        return f"the last {TOOL_CALL_OPEN} is not closed by {TOOL_CALL_CLOSE}"
    try:
        call = json.loads(body)
    except ValueError as e:  # json.JSONDecodeError
        return f"the tool call is not valid JSON ({e}): {_quote(body)}"
    except RecursionError:  # thousands of nested brackets: the model's text, so an error turn, not a crash
        return "the tool call is nested too deeply to read"
    if not isinstance(call, dict):
        return f'the tool call must be a JSON object {{"name": ..., "arguments": {{...}}}}, got: {_quote(body)}'
    name = call.get("name")
    if not isinstance(name, str) or not name:
        return f'the tool call has no "name" (a non-empty string): {_quote(body)}'
    arguments = call.get("arguments", {})
    if not isinstance(arguments, dict):
        return f'"arguments" must be a JSON object of named arguments, got: {_quote(json.dumps(arguments))}'
    return ToolCall(name=name, arguments=arguments)


def format_tool_response(content: str) -> str:
    """``content`` wrapped as Qwen2.5's chat template wraps a tool turn's content (for code that writes the turn
    itself instead of calling ``apply_chat_template`` with a ``{"role": "tool"}`` message)."""
    return f"{TOOL_RESPONSE_OPEN}\n{content}\n{TOOL_RESPONSE_CLOSE}"


def tool_response_spans(text: str, before: str = TOOL_RESPONSE_OPEN, after: str = TOOL_RESPONSE_CLOSE
                        ) -> list[tuple[int, int]]:
    """``(start, end)`` character spans of the tool turns in a completion: from ``before`` to ``after``, both
    included (default the tags; a chat template's own tool turn, ``generation.trajectory.tool_turn_format``, is what
    a rollout's ``tool_mask`` covers and what SFT leaves out of the loss); a tool turn left open at the end runs to
    the end of the text."""
    if not before or not after:  # a format without both edges: no span can be told apart
        return []
    turn = re.compile(rf"{re.escape(before)}(.*?)(?:{re.escape(after)}|\Z)", re.DOTALL)
    return [m.span() for m in turn.finditer(text)]


def truncate(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters, with a note saying how much was cut (so the model knows)."""
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}\n... [truncated: {len(text) - max_chars} more characters]"


def _quote(body: str) -> str:
    return body if len(body) <= _QUOTE_CHARS else body[:_QUOTE_CHARS] + "..."
