"""The configuration reference, generated from the pydantic models: ``reference/configuration.md`` (every section of
``PipelineConfig`` and every field of every model reachable from it) and ``reference/configs.md`` (every shipped
config in ``configs/``, its comments and the fields it sets away from the defaults), written by
``python docs/gen/regenerate.py`` with the other generated pages.

``render()`` returns the pages as text (page path under docs/ -> markdown); ``tests/docs/test_config_reference.py``
compares them with the files, so a field added without regenerating fails. The output is the same on every run and
every machine: no dates, no absolute paths, models and fields in declaration order, configs sorted by name.

What is read from where: a section's readers come from the stage table (``tasks/config/stages.py``: each entry names
its section), except the sections no entry names (``READERS_OUTSIDE_TABLE``); a field's description, constraints
and default from its ``Field``; TRL's name for a field, where TRL's differs, from ``json_schema_extra={"trl": ...}``.
"""

from __future__ import annotations

import inspect
import re
import sys
import types
import unicodedata
import warnings
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # loaded by path (regenerate.py, the tests): the packages are beside docs/
    sys.path.insert(0, str(ROOT))

import annotated_types  # noqa: E402  (pydantic's constraint metadata)
import yaml  # noqa: E402
from pydantic import BaseModel  # noqa: E402
from pydantic.fields import FieldInfo  # noqa: E402
from pydantic_core import to_jsonable_python  # noqa: E402

from tasks.config.pipeline import PipelineConfig, parse_config  # noqa: E402
from tasks.config.fingerprint_fields import is_tag  # noqa: E402
from tasks.config.stages import entries  # noqa: E402
from tasks.config.yaml_file import read_config_yaml  # noqa: E402

CONFIGURATION = "reference/configuration.md"
CONFIGS = "reference/configs.md"
CONFIG_DIR = ROOT / "configs"
REGENERATE = "python docs/gen/regenerate.py"

# The sections of PipelineConfig that no stage-table entry names, with the code that reads them. The table gives
# every other section's stages; a section in neither place stops the generator (``section_readers``).
READERS_OUTSIDE_TABLE = {
    # prepare_data builds model.tiny (and keys its fingerprint on the section); the stages that start from the base
    # model read model.name_or_path through StageContext.base_model; parse_config checks lengths against its positions
    "model": "prepare_data (builds `model.tiny`: [prepare_data.py](/tasks/stages/prepare_data.py)); cold_start_sft, "
             "and reward_model / sft_consolidate with `init_from: base`, start from it "
             "([StageContext.base_model](/tasks/runner/common.py)); the load-time length check "
             "([limits.py](/tasks/config/limits.py))",
    # the stage flows give each task run.retries / retry_delay_seconds; the training runner reads the rest
    "run": "every stage: retries ([flows/stages.py](/flows/stages.py)); isolation, checkpoints, threads and tracker "
           "files ([training.py](/tasks/runner/training.py), [common.py](/tasks/runner/common.py))",
}

DEFAULT_WIDTH = 90  # characters of a default or value shown in a table cell; longer ones are cut with "..."


# ---------------------------------------------------------------- the models

def section_readers(section: str) -> list[str]:
    """The stages that read ``section`` of PipelineConfig, by the stage table (``entries()``, in table order)."""
    return [stage.name for stage in entries() if stage.config_key == section]


def _models_in(annotation: Any, suffix: str = "") -> list[tuple[type[BaseModel], str]]:
    """The models an annotation holds, each with the path suffix of where it sits (``[]``: a list item)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, suffix)]
    if origin is Annotated:
        return _models_in(args[0], suffix)
    if origin in (list, tuple, set, frozenset):
        return [m for a in args if a is not Ellipsis for m in _models_in(a, suffix + "[]")]
    if origin is dict:
        return _models_in(args[1], suffix + ".KEY") if len(args) == 2 else []
    return [m for a in args for m in _models_in(a, suffix)]


def model_paths() -> dict[type[BaseModel], list[str]]:
    """Every model reachable from PipelineConfig with the config paths where it sits (``grpo_train.sampling``,
    ``data.train_sources[]``), in declaration order of the fields; PipelineConfig itself at the path ``""``."""
    found: dict[type[BaseModel], list[str]] = {PipelineConfig: [""]}

    def walk(model: type[BaseModel], path: str, stack: tuple[type, ...]) -> None:
        for name, info in model.model_fields.items():
            for sub, suffix in _models_in(info.annotation):
                where = f"{path}.{name}{suffix}" if path else f"{name}{suffix}"
                paths = found.setdefault(sub, [])
                if where not in paths:
                    paths.append(where)
                if sub not in stack:
                    walk(sub, where, (*stack, sub))

    walk(PipelineConfig, "", (PipelineConfig,))
    return found


def reachable_models() -> list[type[BaseModel]]:
    """PipelineConfig and every model reachable from it, each once, in page order (``page_order``)."""
    return [model for model, _ in page_order()]


def page_order() -> list[tuple[type[BaseModel], int]]:
    """(model, heading level): PipelineConfig, then each section's model (level 2) followed by the models first
    reached from it (level 3), depth first in field order; a model that is itself a section's is under its own."""
    sections = [m for info in PipelineConfig.model_fields.values() for m, _ in _models_in(info.annotation)]
    order: list[tuple[type[BaseModel], int]] = [(PipelineConfig, 2)]
    seen: set[type[BaseModel]] = {PipelineConfig}

    def nested(model: type[BaseModel]) -> None:
        for info in model.model_fields.values():
            for sub, _ in _models_in(info.annotation):
                if sub not in seen and sub not in sections:
                    seen.add(sub)
                    order.append((sub, 3))
                    nested(sub)

    for model in sections:
        if model not in seen:
            seen.add(model)
            order.append((model, 2))
            nested(model)
    return order


def ordered_fields(model: type[BaseModel]) -> list[tuple[str, FieldInfo]]:
    """The model's fields, its own first: each class of its MRO in turn (the most derived first), its fields in
    declaration order; GRPOConfig's own fields come before those it shares from OptimConfig."""
    names: list[str] = []
    for cls in model.__mro__:
        names += [n for n in cls.__dict__.get("__annotations__", {}) if n in model.model_fields and n not in names]
    names += [n for n in model.model_fields if n not in names]
    return [(name, model.model_fields[name]) for name in names]


def slugify(text: str) -> str:
    """A heading's id as Python-Markdown's toc extension makes it (``markdown.extensions.toc.slugify``)."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def model_anchor(model: type[BaseModel]) -> str:
    """The id of a model's heading (its name is the heading's text)."""
    return "sections" if model is PipelineConfig else slugify(model.__name__)


def field_anchor(model: type[BaseModel], name: str) -> str:
    """The id of a field's row in configuration.md: ``grpoconfig.beta`` (no heading's id has a dot)."""
    return f"{slugify(model.__name__)}.{name}"


# ---------------------------------------------------------------- text of a field

def _type_tokens(annotation: Any) -> list[str | type[BaseModel]]:
    """The annotation as text pieces and models (``list[str | RewardModelSpec | JudgeSpec]``)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is None or annotation is type(None):
        return ["None"]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if origin is Annotated:
        return _type_tokens(args[0])
    if origin is Literal:
        return [" | ".join(f'"{a}"' if isinstance(a, str) else repr(a) for a in args)]
    if origin in (Union, types.UnionType):
        ordered = [a for a in args if a is not type(None)] + [a for a in args if a is type(None)]  # None last
        out: list[str | type[BaseModel]] = []
        for i, arg in enumerate(ordered):
            out += ([" | "] if i else []) + _type_tokens(arg)
        return out
    if origin is not None:  # list[...], dict[...], tuple[...]
        out = [f"{getattr(origin, '__name__', str(origin))}["]
        for i, arg in enumerate(args):
            out += ([", "] if i else []) + (["..."] if arg is Ellipsis else _type_tokens(arg))
        return out + ["]"]
    if annotation is Any:
        return ["Any"]
    return [getattr(annotation, "__name__", str(annotation))]


def type_text(annotation: Any) -> str:
    """A field's type as plain text: ``int | None``, ``"grpo" | "dapo"``, ``list[SourceMix]``."""
    return "".join(t if isinstance(t, str) else t.__name__ for t in _type_tokens(annotation))


def type_markdown(annotation: Any) -> str:
    """A field's type for a table cell: a code span, or, when it holds models, text with a link to each model."""
    tokens = _type_tokens(annotation)
    if all(isinstance(t, str) for t in tokens):
        return code("".join(tokens))  # type: ignore[arg-type]
    return "".join(_escape_plain(t) if isinstance(t, str) else f"[{t.__name__}](#{model_anchor(t)})" for t in tokens)


def field_default(info: FieldInfo) -> Any:
    """The field's default, a default_factory called (every factory here is a list, a dict or a model)."""
    return info.get_default(call_default_factory=True)


def plain(value: Any) -> Any:
    """``value`` as a config file writes it: a model as the fields it sets away from their defaults (required and
    tag fields kept), a reward entry as ``{reward_model: {...}}`` / ``{judge: {...}}``, tuples as lists."""
    if isinstance(value, BaseModel):
        fields = type(value).model_fields
        out = {name: plain(getattr(value, name)) for name, info in fields.items()
               if info.is_required() or is_tag(info.annotation) or getattr(value, name) != field_default(info)}
        if "type" in fields and is_tag(fields["type"].annotation):  # a reward entry: its kind is its YAML key
            return {out.pop("type"): out}
        return out
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return to_jsonable_python(value)


def yaml_flow(value: Any) -> str:
    """``value`` as one line of YAML (flow style), as a config file would write it."""
    text = yaml.safe_dump(plain(value), default_flow_style=True, sort_keys=False, allow_unicode=True,
                          width=1_000_000).strip()
    return text[:-3].strip() if text.endswith("\n...") else text


def short_yaml(value: Any) -> str:
    """``yaml_flow(value)`` as a table cell: a code span, cut at ``DEFAULT_WIDTH`` characters (a long list says how
    many items it has)."""
    text = yaml_flow(value)
    if len(text) <= DEFAULT_WIDTH:
        return code(text)
    items = f" ({len(value)} items)" if isinstance(value, (list, tuple)) else ""
    return code(text[:DEFAULT_WIDTH].rstrip() + " ...") + items


def default_markdown(info: FieldInfo) -> str:
    """A field's default for a table cell: ``required``, or its YAML (a model with all its defaults is ``{}``)."""
    return "required" if info.is_required() else short_yaml(field_default(info))


_CONSTRAINTS = ((annotated_types.Gt, "gt", "> {}"), (annotated_types.Ge, "ge", ">= {}"),
                (annotated_types.Lt, "lt", "< {}"), (annotated_types.Le, "le", "<= {}"),
                (annotated_types.MultipleOf, "multiple_of", "multiple of {}"),
                (annotated_types.MinLen, "min_length", "min length {}"),
                (annotated_types.MaxLen, "max_length", "max length {}"))


def constraints(info: FieldInfo) -> list[str]:
    """The field's checks from its metadata: ``> 0``, ``<= 1``, ``min length 1``, ``pattern ^...$``."""
    out = []
    for item in info.metadata:
        for kind, attr, text in _CONSTRAINTS:
            if isinstance(item, kind):
                out.append(text.format(getattr(item, attr)))
        if getattr(item, "pattern", None) is not None:
            out.append(f"pattern {item.pattern}")
    return out


def trl_name(info: FieldInfo) -> str | None:
    """TRL's name for the field where it differs from ours (``json_schema_extra={"trl": ...}``)."""
    extra = info.json_schema_extra
    return extra.get("trl") if isinstance(extra, dict) else None  # type: ignore[return-value]


# ---------------------------------------------------------------- markdown

_CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def escape(text: str) -> str:
    """``text`` (a description, a docstring) as inline markdown for a table cell: code spans kept; outside them
    ``\\``, ``|``, ``*``, ``[``/``]`` and ``<`` (``<think>`` would be an HTML tag) escaped; ``\\n`` a space."""
    text = " ".join(text.split())
    out, last = [], 0
    for match in _CODE_SPAN.finditer(text):
        out += [_escape_plain(text[last:match.start()]), match.group(0)]
        last = match.end()
    return "".join(out + [_escape_plain(text[last:])])


def _escape_plain(text: str) -> str:
    """Markdown's special characters escaped; ``_`` only at a word's edge (``max_steps`` stays as it is)."""
    text = re.sub(r"([\\|*\[\]])", r"\\\1", text)
    text = re.sub(r"(?<!\w)_|_(?!\w)", r"\\_", text)
    return text.replace("<", "&lt;")


def code(text: str) -> str:
    """``text`` as a code span (longer fences when it holds a backtick)."""
    fence = "``" if "`" in text else "`"
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def docstring_summary(model: type[BaseModel]) -> str:
    """The first paragraph of the model's own docstring, rst ````code```` as markdown ```code```."""
    doc = model.__dict__.get("__doc__") or ""
    first = inspect.cleandoc(doc).split("\n\n", 1)[0] if doc.strip() else ""
    return escape(first.replace("``", "`"))


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def field_row(model: type[BaseModel], name: str, info: FieldInfo, extra: list[str] = ()) -> str:
    """One field's table row: name (with its anchor), type, [extra], default, constraints, description."""
    anchor = field_anchor(model, name)
    description = escape(info.description or "")
    if (trl := trl_name(info)) is not None:
        description += f" TRL: {escape(trl) if ' ' in trl else code(trl)}."
    return _row([f'<a id="{anchor}"></a>[{code(name)}](#{anchor})', type_markdown(info.annotation), *extra,
                 default_markdown(info), ", ".join(code(c) for c in constraints(info)), description])


def readers_markdown(section: str) -> str:
    """Who reads ``section`` of PipelineConfig: its stages by the table, else ``READERS_OUTSIDE_TABLE``'s line."""
    if readers := section_readers(section):
        return ", ".join(code(r) for r in readers)
    if section in READERS_OUTSIDE_TABLE:
        return READERS_OUTSIDE_TABLE[section]
    raise KeyError(f"section {section!r} of PipelineConfig is named by no stage-table entry and is not in "
                   "docs/gen/config_ref.py's READERS_OUTSIDE_TABLE: add who reads it there")


def own_fields(model: type[BaseModel], base: type[BaseModel]) -> list[str]:
    """The fields ``model`` declares itself (new or redeclared) rather than inherits from ``base``."""
    between = model.__mro__[:model.__mro__.index(base)]
    return [n for n in model.model_fields if any(n in c.__dict__.get("__annotations__", {}) for c in between)]


def _model_section(model: type[BaseModel], level: int, paths: list[str], base: type[BaseModel] | None) -> list[str]:
    lines = [f"{'#' * level} {model.__name__}", ""]
    if summary := docstring_summary(model):
        lines += [summary, ""]
    sections = [p for p in paths if p in PipelineConfig.model_fields]
    others = [p for p in paths if p not in sections]
    if sections:
        lines += [f"**Section{'s' if len(sections) > 1 else ''}:** "
                  + "; ".join(f"{code(s)}, read by {readers_markdown(s)}" for s in sections) + ".", ""]
    if others:
        lines += [f"**{'Also at' if sections else 'At'}:** {', '.join(code(p) for p in others)}.", ""]
    if base is not None:
        lines += [f"Every field of [{base.__name__}](#{model_anchor(base)}), and its own: "
                  f"{', '.join(code(n) for n in own_fields(model, base))}.", ""]
    lines += [_row(["Field", "Type", "Default", "Constraints", "Description"]), _row(["---"] * 5)]
    lines += [field_row(model, name, info) for name, info in ordered_fields(model)]
    return lines + [""]


def render_configuration() -> str:
    """``reference/configuration.md``: the sections, then each model's fields."""
    paths = model_paths()
    order = page_order()
    documented = [m for m, _ in order]
    lines = [
        "# Configuration", "",
        "!!! note \"Generated\"",
        f"    Generated by `{REGENERATE}` from the pydantic models "
        "([pipeline.py](/tasks/config/pipeline.py), [grpo_core/config](/grpo_core/config/__init__.py)): "
        "do not edit by hand.", "",
        "A pipeline config is one YAML file (`r1 run -c FILE`; without `-c`, the embedded default "
        "[configs/tiny-cpu.yaml](/configs/tiny-cpu.yaml)). Its top-level keys are the [sections](#sections) below: "
        "`model` (the base model), one section per entry of the stage table ([stages.py](/tasks/config/stages.py)), "
        "named as the stage (`data` for prepare_data) and in the table's order, and `run` (how stages execute). "
        "A mapping under a key is the model its type names, documented below once with every field; a key left out "
        "keeps its default, and an unknown key is an error naming its file and line. An optional section "
        "(default `null`) is a stage that runs only when the config has it.", "",
        "A `reward_funcs` entry is a registered reward's name, `{reward_model: {...}}` ([RewardModelSpec]"
        "(#rewardmodelspec)) or `{judge: {...}}` ([JudgeSpec](#judgespec)). A sampling field written beside a "
        "section's `sampling:` (TRL's flat layout) is moved into it. Defaults are written as YAML: `{}` is a model "
        "with all of its own defaults; constraints are checked when the config is loaded; TRL gives TRL's name for "
        "the same setting where it differs from ours.", "",
        "The configs shipped in `configs/` are on [Shipped configs](configs.md), each with the fields it sets away "
        "from these defaults.", "",
        "## Sections", "",
        "The sections of `PipelineConfig`, built from the stage table; each stage reads its own section.", "",
        _row(["Section", "Type", "Read by", "Default", "Constraints", "Description"]), _row(["---"] * 6),
        *[field_row(PipelineConfig, name, info, extra=[readers_markdown(name)])
          for name, info in PipelineConfig.model_fields.items()], "",
    ]
    for model, level in order[1:]:
        base = next((b for b in model.__mro__[1:] if b in documented), None)
        lines += _model_section(model, level, paths[model], base)
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------- the shipped configs

def shipped_configs() -> list[Path]:
    """Every shipped config, sorted by name."""
    return sorted(CONFIG_DIR.glob("*.yaml"))


def _first_comment_block(text: str) -> list[str]:
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[2:] if line.startswith("# ") else line[1:])
    return lines


def config_description(text: str) -> list[str]:
    """The config's first comment block as markdown: ``hardware:`` in bold, indented lines (commands) as a code
    block, the rest as paragraphs."""
    out: list[str] = []
    paragraph: list[str] = []
    commands: list[str] = []

    def flush() -> None:
        if paragraph:
            out.extend([escape(" ".join(paragraph)), ""])
            paragraph.clear()
        if commands:
            out.extend(["```text", *commands, "```", ""])
            commands.clear()

    for line in _first_comment_block(text):
        if line.startswith(" "):
            if paragraph:
                flush()
            commands.append(line.strip())
        elif line.lower().startswith("hardware:"):
            flush()
            out.extend([f"**Hardware:** {escape(line.split(':', 1)[1].strip())}", ""])
        elif not line.strip():
            flush()
        else:
            if commands:
                flush()
            paragraph.append(line.strip())
    flush()
    return out


def load_shipped(path: Path) -> PipelineConfig:
    """A shipped config, validated as ``r1 run -c`` reads it, but with its data paths as written (no absolute
    path enters the page) and the warnings of older spellings silenced."""
    data, lines = read_config_yaml(path, path.read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return parse_config(data, str(path.relative_to(ROOT)), lines)


def changed_fields(value: BaseModel, default: BaseModel | None = None, path: str = ""
                   ) -> list[tuple[str, type[BaseModel], str, str, str]]:
    """(path, owning model, field, value, default) for every field of ``value`` away from its default: the default
    at that place (a section's own default instance), recursing into a field whose type is one model."""
    rows = []
    model = type(value)
    for name, info in ordered_fields(model):
        here = f"{path}.{name}" if path else name
        got = getattr(value, name)
        expected = getattr(default, name) if isinstance(default, model) else field_default(info)
        if info.is_required() or got != expected:
            single = [m for m, suffix in _models_in(info.annotation) if not suffix]
            if isinstance(got, BaseModel) and len(single) == 1:
                nested = changed_fields(got, expected if isinstance(expected, BaseModel) else None, here)
                if not isinstance(expected, BaseModel):  # an optional model given: say so, then its fields
                    rows.append((here, model, name, "set, fields below" if nested else code("{}"),
                                 short_yaml(expected)))
                rows += nested
            else:
                rows.append((here, model, name, short_yaml(got),
                             "required" if info.is_required() else short_yaml(expected)))
    return rows


def render_configs() -> str:
    """``reference/configs.md``: each shipped config's description, its whole YAML and what it sets."""
    lines = [
        "# Shipped configs", "",
        "!!! note \"Generated\"",
        f"    Generated by `{REGENERATE}` from `configs/*.yaml` and the pydantic models: "
        "do not edit by hand (edit the configs, then regenerate).", "",
        "The configs in `configs/`, sorted by name. Each is commented line by line; its first comment block is its "
        "description. Run one with `r1 run -c configs/NAME.yaml`; `r1 run` with no `-c` runs the embedded default, "
        "`tiny-cpu.yaml`. Under each config, the fields it sets away from the defaults, each linked to its entry "
        "in [Configuration](configuration.md).", "",
    ]
    for path in shipped_configs():
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        lines += [f"## {path.name}", "", f"[{rel}](/{rel})", "", *config_description(text)]
        lines += ["```yaml", text.rstrip("\n"), "```", ""]
        rows = changed_fields(load_shipped(path))
        lines += ["Fields set away from the defaults:", "",
                  _row(["Field", "Value", "Default"]), _row(["---"] * 3)]
        lines += [_row([f"[{code(where)}](configuration.md#{field_anchor(model, name)})", value, default])
                  for where, model, name, value, default in rows]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------- the pages

def render() -> dict[str, str]:
    """The generated pages: path under docs/ -> markdown."""
    return {CONFIGURATION: render_configuration(), CONFIGS: render_configs()}
