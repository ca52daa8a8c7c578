"""The tools of a rollout: loading them by name or import path, answering the model's last tool call, and counting
what happened (calls, errors, seconds per tool; malformed calls; calls to unknown tools).

``ToolSet.respond`` never raises: whatever the model wrote, and whatever a tool does, comes back as a
``ToolResult`` the model reads in its next turn (an ``error: ...`` message for a malformed call, an unknown tool,
arguments that do not fit the schema, a tool that raised or ran past its timeout), so one bad call costs a turn,
not the batch.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Sequence
from typing import Any

from grpo_core.tools.builtin import BUILTIN_TOOLS
from grpo_core.tools.calls import ToolCall, ToolResult, parse_tool_call, truncate
from grpo_core.tools.schema import Tool, check_arguments, tool_from_function

MAX_CONTENT_CHARS = 4_000  # of any tool's answer in the tool turn: a tool's output should not flood the context


def load_tool(spec: str) -> Tool:
    """A built-in tool by name (``calculator``, ``python``), or ``package.module:function`` (a typed function, made a
    tool by ``tool_from_function``; a ``Tool`` object at that path is taken as it is). ValueError naming the spec
    and the fix when it cannot be found."""
    spec = spec.strip()
    if spec in BUILTIN_TOOLS:
        return BUILTIN_TOOLS[spec]()
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise ValueError(f"tool {spec!r}: not a built-in tool ({', '.join(sorted(BUILTIN_TOOLS))}) and not an import "
                         "path; write a built-in name or 'package.module:function' (a typed function or a Tool)")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and module_name.startswith(e.name):  # the module itself, not one it imports
            raise ValueError(f"tool {spec!r}: no module named {e.name!r}; install the package that holds it or put "
                             "its folder on PYTHONPATH (the import path is 'package.module:function')") from e
        raise ValueError(f"tool {spec!r}: importing {module_name!r} failed: {e}; install what it needs") from e
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
            raise ValueError(f"tool {spec!r}: {module_name} has no {attribute!r}; its public callables: "
                             f"{', '.join(public) or 'none'}")
        target = getattr(target, part)
    if isinstance(target, Tool):
        return target
    if not callable(target):
        raise ValueError(f"tool {spec!r}: {attribute} is a {type(target).__name__}, not a function or a Tool")
    return tool_from_function(target)


def tool_spec_problem(spec: str) -> str | None:
    """Why ``spec`` cannot be loaded (``load_tool``'s message), None when it can: for checking a config before
    anything runs. A built-in name is checked by name only, so ``python``'s sandbox check runs where the rollouts
    run, not where the config is read; an import path is imported."""
    if spec.strip() in BUILTIN_TOOLS:
        return None
    try:
        load_tool(spec)
    except ValueError as e:
        return str(e)
    return None


class ToolSet:
    """Named tools, their schemas for the chat template, and ``respond`` for the model's last call. Safe to call
    from several threads at once (rollouts answered in parallel share the counters)."""

    def __init__(self, tools: Sequence[Tool], *, max_content_chars: int = MAX_CONTENT_CHARS):
        names = [t.name for t in tools]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"tool names must be unique; given more than once: {', '.join(twice)}")
        self.tools: dict[str, Tool] = {t.name: t for t in tools}
        self.max_content_chars = max_content_chars
        self._lock = threading.Lock()
        self._stats: dict[str, float] = {}
        self.reset_stats()

    @classmethod
    def from_specs(cls, specs: Sequence[str], *, field: str | None = None, **kwargs: Any) -> ToolSet:
        """Tools by ``load_tool`` spec: built-in names or ``package.module:function`` paths. ``field`` (a config
        field, e.g. ``sampling.tools``): a spec that does not load fails naming it, ``sampling.tools[1]: ...``."""
        tools = []
        for i, spec in enumerate(specs):
            try:
                tools.append(load_tool(spec))
            except ValueError as e:
                if field is None:
                    raise
                raise ValueError(f"{field}[{i}]: {e}") from None
        return cls(tools, **kwargs)

    @property
    def names(self) -> list[str]:
        return list(self.tools)

    def schemas(self) -> list[dict[str, Any]]:
        """OpenAI/HF function schemas, as ``tokenizer.apply_chat_template(messages, tools=...)`` takes them."""
        return [tool.schema() for tool in self.tools.values()]

    def respond(self, text: str) -> ToolResult | None:
        """The answer to the last tool call in ``text``, or None when it has none. Never raises."""
        start = time.monotonic()
        try:  # parse_tool_call handles whatever a model writes; this is a last guard for the batch
            call = parse_tool_call(text)
        except Exception as e:  # noqa: BLE001
            call = f"the tool call could not be read ({type(e).__name__}: {e})"
        if call is None:
            return None
        if isinstance(call, str):
            self._count("tools/malformed")
            return self._result(f"error: {call}", True, None, start)
        tool = self.tools.get(call.name)
        if tool is None:
            self._count("tools/unknown")
            return self._result(f"error: unknown tool {call.name!r}; the tools are: {', '.join(self.tools) or 'none'}",
                                True, call.name, start)
        try:
            problem = check_arguments(call.arguments, tool.parameters)
        except Exception as e:  # noqa: BLE001 (a hand-written schema the check cannot read: the tool's fault)
            problem = f"its schema could not be checked ({type(e).__name__}: {e})"
        if problem is not None:
            return self._result(f"error: {tool.name}: {problem}", True, tool.name, start)
        content, error, timed_out = _call(tool, call)
        return self._result(content, error, tool.name, start, timed_out=timed_out)

    def stats(self) -> dict[str, float]:
        """Counters since the last reset: ``tools/<name>/calls``, ``/errors``, ``/timeouts``, ``/seconds`` (total
        wall time) per tool, ``tools/malformed``, ``tools/unknown``, and ``tools/calls``, ``tools/errors`` over all
        calls (malformed and unknown ones included)."""
        with self._lock:
            return dict(self._stats)

    def add_stats(self, counts: dict[str, float]) -> None:
        """Add counters kept elsewhere (``stats()`` of the same tools in the asynchronous sampler's process)."""
        with self._lock:
            for key, value in counts.items():
                self._stats[key] = self._stats.get(key, 0.0) + value

    def reset_stats(self) -> None:
        keys = ["tools/calls", "tools/errors", "tools/malformed", "tools/unknown"]
        keys += [f"tools/{name}/{what}" for name in self.tools for what in ("calls", "errors", "timeouts", "seconds")]
        with self._lock:
            self._stats = dict.fromkeys(keys, 0.0)

    def _count(self, key: str, amount: float = 1.0) -> None:
        with self._lock:
            self._stats[key] = self._stats.get(key, 0.0) + amount

    def _result(self, content: str, error: bool, name: str | None, start: float, *,
                timed_out: bool = False) -> ToolResult:
        seconds = time.monotonic() - start
        with self._lock:
            self._stats["tools/calls"] += 1
            self._stats["tools/errors"] += error
            if name in self.tools:
                self._stats[f"tools/{name}/calls"] += 1
                self._stats[f"tools/{name}/errors"] += error
                self._stats[f"tools/{name}/timeouts"] += timed_out
                self._stats[f"tools/{name}/seconds"] += seconds
        return ToolResult(content=truncate(content, self.max_content_chars), error=error, name=name, seconds=seconds)


def _call(tool: Tool, call: ToolCall) -> tuple[str, bool, bool]:
    """(content, error, timed out) of one call, run in a daemon thread joined for ``tool.timeout`` seconds. A
    thread cannot be killed: one past its timeout is abandoned and runs on in the background (daemon, so it does
    not hold the interpreter's exit); tools that can hang bound themselves (``python`` kills its process)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            value = tool.function(**call.arguments)
            # str() in this thread too: a __str__ that hangs or raises is the tool's fault, bounded the same way
            box["value"] = value if isinstance(value, ToolResult) else str(value)
        except BaseException as e:  # noqa: BLE001 (a tool's SystemExit too must not reach the rollout)
            box["error"] = e

    thread = threading.Thread(target=target, name=f"tool-{tool.name}", daemon=True)
    thread.start()
    thread.join(tool.timeout)
    if thread.is_alive():
        return f"error: {tool.name} did not answer within {tool.timeout:g} s (timed out)", True, True
    if "error" in box:
        e = box["error"]
        return f"error: {tool.name} raised {type(e).__name__}: {e}", True, False
    value = box["value"]
    if isinstance(value, ToolResult):
        return str(value.content), bool(value.error), False
    return value, False, False
