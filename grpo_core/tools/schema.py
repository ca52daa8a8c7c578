"""A tool's description for the model (an OpenAI/HF function schema built from a typed Python function) and the
check of a call's arguments against it.

The schema follows ``transformers.utils.get_json_schema`` (what ``apply_chat_template(tools=[fn])`` builds):
``int``/``float``/``str``/``bool`` -> ``integer``/``number``/``string``/``boolean``, ``list[X]`` -> ``array`` of
``X``, ``dict[str, X]`` -> ``object``, ``Literal[...]`` -> ``enum``, ``X | None`` -> ``X`` with ``"nullable": true``.
It departs in being lenient where transformers raises: a parameter without a docstring line gets no description.
The check covers what a model gets wrong in practice (missing, unknown and mistyped arguments), not all of JSON
Schema: ``type`` (one or a list), ``nullable``, ``enum``, ``items``, ``properties``/``required`` of objects.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Union

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what OpenAI's function names allow; also keeps stats keys clean
_SIMPLE = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}
_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Returns?|Yields?|Raises|Examples?|Notes?)\s*:\s*$")
_ARG_LINE = re.compile(r"^(\s*)(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")  # "name (type): text"


@dataclass(frozen=True)
class Tool:
    """A tool the model may call. ``function`` is called with the call's arguments as keyword arguments; its
    return value is ``str()``-ed, except a returned ``ToolResult`` (``grpo_core.tools.calls``), whose ``content``
    and ``error`` are taken as they are (how a tool reports a failure the model should read verbatim). A call
    running past ``timeout`` seconds is answered with an error; a Python function cannot be killed, only
    abandoned (its daemon thread runs on), so a tool that can hang should bound itself, as ``python`` does."""

    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object
    function: Callable[..., Any]
    timeout: float = 5.0

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"tool name {self.name!r}: use 1-64 letters, digits, '_' or '-' (OpenAI's rule)")
        if self.parameters.get("type") != "object":
            raise ValueError(f"tool {self.name!r}: parameters must be a JSON schema with \"type\": \"object\", "
                             f"got {self.parameters!r}")
        if not self.timeout > 0:
            raise ValueError(f"tool {self.name!r}: timeout must be > 0 seconds, got {self.timeout}")

    def schema(self) -> dict[str, Any]:
        """The OpenAI/HF function schema, as ``apply_chat_template(tools=[...])`` takes it."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


def tool_from_function(fn: Callable[..., Any], *, name: str | None = None, description: str | None = None,
                       timeout: float = 5.0) -> Tool:
    """A ``Tool`` for a typed function: parameters from its type hints (required when they have no default),
    descriptions from its docstring (the text before the sections, and Google-style ``Args:`` lines or Sphinx
    ``:param x:`` lines). ValueError naming the parameter for a hint it cannot express, or none."""
    tool_name = name or getattr(fn, "__name__", "")
    try:
        signature = inspect.signature(fn)
        # the parameters' hints only: a return annotation naming a class the module cannot see at run time (under
        # TYPE_CHECKING, or local, with `from __future__ import annotations`) does not matter to the schema
        annotations = {k: v for k, v in getattr(fn, "__annotations__", {}).items() if k != "return"}
        hints = typing.get_type_hints(types.SimpleNamespace(__annotations__=annotations),
                                      globalns=getattr(inspect.unwrap(fn), "__globals__", {}))
    except (TypeError, ValueError, NameError) as e:
        raise ValueError(f"tool {tool_name!r}: cannot read the signature and type hints of {fn!r}: {e}") from e
    summary, arg_docs = _parse_docstring(inspect.getdoc(fn) or "")
    properties: dict[str, Any] = {}
    required = []
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ValueError(f"tool {tool_name!r}: parameter {param.name!r} is {param.kind.description}; a tool "
                             "is called with named arguments only")
        if param.name not in hints:
            raise ValueError(f"tool {tool_name!r}: parameter {param.name!r} has no type hint; annotate it (int, "
                             "float, str, bool, list[...], dict[str, ...], Literal[...], X | None)")
        try:
            prop = json_schema_of(hints[param.name])
        except TypeError as e:
            raise ValueError(f"tool {tool_name!r}: parameter {param.name!r}: {e}") from e
        if param.name in arg_docs:
            prop["description"] = arg_docs[param.name]
        properties[param.name] = prop
        if param.default is param.empty:
            required.append(param.name)
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return Tool(name=tool_name, description=summary if description is None else description,
                parameters=parameters, function=fn, timeout=timeout)


def json_schema_of(hint: Any) -> dict[str, Any]:
    """The JSON schema of one type hint; TypeError for a hint JSON cannot carry."""
    if hint is Any:
        return {}
    if hint in _SIMPLE:
        return {"type": _SIMPLE[hint]}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is list or origin is list:
        return {"type": "array", **({"items": json_schema_of(args[0])} if args else {})}
    if hint is dict or origin is dict:
        if args and args[0] is not str:
            raise TypeError(f"{hint}: JSON object keys are strings; use dict[str, ...]")
        return {"type": "object", **({"additionalProperties": json_schema_of(args[1])} if args else {})}
    if origin is Literal:
        kinds = sorted({_SIMPLE[type(a)] for a in args if type(a) in _SIMPLE})
        if not kinds or not all(type(a) in _SIMPLE for a in args):
            raise TypeError(f"{hint}: a Literal is supported of str, int, float, bool or None values only")
        return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": list(args)}
    if origin in (Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        if len(members) == 1:
            return {**json_schema_of(members[0]), **({"nullable": True} if len(members) < len(args) else {})}
        schemas = [json_schema_of(m) for m in members]
        if not all(set(s) == {"type"} and isinstance(s["type"], str) for s in schemas):
            raise TypeError(f"{hint}: a union is supported of plain types only (int | str, not list[int] | str)")
        return {"type": [s["type"] for s in schemas], **({"nullable": True} if len(members) < len(args) else {})}
    raise TypeError(f"type hint {hint!r} has no JSON schema here; use int, float, str, bool, list[...], "
                    "dict[str, ...], Literal[...] or X | None")


def check_arguments(arguments: dict[str, Any], schema: dict[str, Any]) -> str | None:
    """Why ``arguments`` do not fit the object ``schema`` (missing, unknown or mistyped arguments), or None."""
    properties = schema.get("properties", {})
    missing = [k for k in schema.get("required", []) if k not in arguments]
    if missing:
        return f"missing required argument(s): {', '.join(missing)}; {_expected(schema)}"
    unknown = [k for k in arguments if k not in properties]
    if unknown and schema.get("additionalProperties", False) is False:  # a model's typo is more likely than intent
        return f"unexpected argument(s): {', '.join(unknown)}; {_expected(schema)}"
    for key, value in arguments.items():
        problem = _check_value(value, properties.get(key, {}), key)
        if problem:
            return problem
    return None


def _check_value(value: Any, schema: dict[str, Any], path: str) -> str | None:
    if value is None and schema.get("nullable"):
        return None
    if "enum" in schema and value not in schema["enum"]:
        return f"argument {path} must be one of {schema['enum']!r}, got {_short(value)}"
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else list(kinds)
        if not any(_is_type(value, k) for k in kinds):
            return f"argument {path} must be {' or '.join(kinds)}, got {_json_type(value)} {_short(value)}"
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            problem = _check_value(item, schema["items"], f"{path}[{i}]")
            if problem:
                return problem
    if isinstance(value, dict) and "properties" in schema:
        problem = check_arguments(value, schema)
        return None if problem is None else f"in argument {path}: {problem}"
    if isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, item in value.items():
            problem = _check_value(item, schema["additionalProperties"], f"{path}.{key}")
            if problem:
                return problem
    return None


def _is_type(value: Any, kind: str) -> bool:
    if kind == "integer":  # bool is an int in Python but not in JSON
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    python_type = {"string": str, "boolean": bool, "array": list, "object": dict, "null": type(None)}.get(kind)
    return python_type is None or isinstance(value, python_type)  # an unknown kind is not ours to refuse


def _json_type(value: Any) -> str:
    for kind in ("boolean", "integer", "number", "string", "array", "object", "null"):
        if _is_type(value, kind):
            return kind
    return type(value).__name__


def _expected(schema: dict[str, Any]) -> str:
    properties = schema.get("properties", {})
    if not properties:
        return "this tool takes no arguments"
    required = set(schema.get("required", []))
    parts = [f"{k} ({'/'.join(_kinds(p)) or 'any'}{'' if k in required else ', optional'})"
             for k, p in properties.items()]
    return f"the arguments are: {', '.join(parts)}"


def _kinds(prop: dict[str, Any]) -> list[str]:
    kinds = prop.get("type", [])
    return [kinds] if isinstance(kinds, str) else list(kinds)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(the text before the first section, {parameter: description}) of a Google- or Sphinx-style docstring."""
    summary: list[str] = []
    args: dict[str, list[str]] = {}
    section: str | None = None
    current: str | None = None
    indent = 0
    for line in doc.splitlines():
        sphinx = re.match(r"^\s*:param\s+(?:\w+\s+)?(\w+)\s*:\s*(.*)$", line)
        header = _SECTION.match(line)
        if sphinx:
            section, current = "sphinx", sphinx.group(1)
            args[current] = [sphinx.group(2)]
        elif header:
            section, current = header.group(1).lower(), None
        elif re.match(r"^\s*:\w+", line):  # another Sphinx field (:returns:, :raises ...:) ends the summary
            section, current = "sphinx", None
        elif section is None:
            summary.append(line)
        elif section in ("args", "arguments", "parameters"):
            entry = _ARG_LINE.match(line)
            if entry and (current is None or len(entry.group(1)) <= indent):
                indent, current = len(entry.group(1)), entry.group(2).lstrip("*")
                args[current] = [entry.group(3)]
            elif current is not None and line.strip():
                args[current].append(line.strip())  # a continuation line of the current argument
        elif section == "sphinx" and current is not None and line.strip() and not line.lstrip().startswith(":"):
            args[current].append(line.strip())
    return "\n".join(summary).strip(), {k: " ".join(v).strip() for k, v in args.items()}
