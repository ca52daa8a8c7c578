"""Reading a pipeline config's YAML text: the mapping, and the line of every key, with the problems PyYAML lets
through refused at load (``tasks.config.pipeline.load_config`` is the caller).

PyYAML's ``safe_load`` keeps the last of two equal keys in one mapping without a word (``beta: 0.04`` then
``beta: 0.4`` twenty lines down: the second wins), and reads an empty file as None, which would run the model
defaults. Here a duplicate key is an error naming both lines, a syntax error names ``file:line:column`` and
what is wrong, and a file with no settings is an error. Merge keys (``<<: *anchor``) may still be overridden:
that is what they are for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class YAMLProblem(ValueError):
    """A config text that is not a usable YAML mapping; the message starts with ``file:line``."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (before merge keys are flattened)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {seen[key]}, again at line {line}); "
                    "the second would silently replace the first: keep one", key_node.start_mark)
            seen.setdefault(key, line)
        return super().construct_mapping(node, deep=deep)


def read_config_yaml(path: Path, text: str) -> tuple[dict[str, Any], dict[tuple, int]]:
    """``(mapping, key lines)`` of a config file's ``text``: raises YAMLProblem for a syntax error (with line and
    column), a duplicate key (both lines), an empty file, or a top level that is not a mapping."""
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
        lines = key_lines(yaml.compose(text, Loader=yaml.SafeLoader))
    except yaml.MarkedYAMLError as e:
        raise YAMLProblem(_describe(path, e)) from None
    except yaml.YAMLError as e:
        raise YAMLProblem(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    if data is None:
        raise YAMLProblem(f"{path}: the config file is empty (no settings, only comments or blank lines); give at "
                          "least the model (start from configs/tiny-cpu.yaml), or leave out -c to run the embedded "
                          "default")
    if not isinstance(data, dict):
        raise YAMLProblem(f"{path}: expected a mapping of stage sections at the top level, got a "
                          f"{type(data).__name__}")
    return data, lines


def _describe(path: Path, e: yaml.MarkedYAMLError) -> str:
    """``file:line:column: not valid YAML: problem (context)``, with a hint for a tab (YAML indents with spaces)."""
    mark = e.problem_mark or e.context_mark
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    what = " ".join(p for p in (e.problem, e.context) if p) or str(e).splitlines()[0]
    if "'\\t'" in what:
        what += "; YAML indents with spaces, not tabs: replace the tab with spaces"
    return f"{where}: not valid YAML: {what}"


def key_lines(node: Any, prefix: tuple = ()) -> dict[tuple, int]:
    """(key path) -> 1-based line of every mapping key / sequence item in a composed YAML tree."""
    out: dict[tuple, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            loc = (*prefix, key.value)
            out[loc] = key.start_mark.line + 1
            out.update(key_lines(value, loc))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[(*prefix, i)] = item.start_mark.line + 1
            out.update(key_lines(item, (*prefix, i)))
    return out
