"""Tool calls in multi-turn rollouts (issue 43): the model writes a Qwen2.5/Hermes-style
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, generation stops on ``</tool_call>``, a ``ToolSet``
answers the last call with a ``ToolResult``, and the answer goes back to the model as a tool turn.

Modules, bottom up: ``calls`` (the tags, parsing a call, the result), ``schema`` (a tool's JSON schema from a
typed function, checking a call's arguments), ``builtin`` (``calculator``, and ``python`` in the code reward's
sandbox), ``toolset`` (loading tools by name or import path, answering calls, counting them).

    tools = ToolSet.from_specs(["calculator", "python", "my_pkg.tools:lookup"])
    prompt = tokenizer.apply_chat_template(messages, tools=tools.schemas(), add_generation_prompt=True)
    result = tools.respond(completion)  # None: no call, the rollout ends; else a {"role": "tool"} turn
"""

from grpo_core.tools.builtin import BUILTIN_TOOLS, calculate, calculator_tool, python_tool, run_python
from grpo_core.tools.calls import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_RESPONSE_CLOSE,
    TOOL_RESPONSE_OPEN,
    TOOL_TURN,
    ToolCall,
    ToolResult,
    format_tool_response,
    parse_tool_call,
    tool_response_spans,
)
from grpo_core.tools.schema import Tool, check_arguments, json_schema_of, tool_from_function
from grpo_core.tools.toolset import ToolSet, load_tool, tool_spec_problem

__all__ = [
    "BUILTIN_TOOLS",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "TOOL_RESPONSE_CLOSE",
    "TOOL_RESPONSE_OPEN",
    "TOOL_TURN",
    "Tool",
    "ToolCall",
    "ToolResult",
    "ToolSet",
    "calculate",
    "calculator_tool",
    "check_arguments",
    "format_tool_response",
    "json_schema_of",
    "load_tool",
    "parse_tool_call",
    "python_tool",
    "run_python",
    "tool_from_function",
    "tool_response_spans",
    "tool_spec_problem",
]
