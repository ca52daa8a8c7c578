"""Rows in one normalised schema: read, validate, normalise, write (parquet).

Every prompt row, whatever its origin, becomes::

    {"id": str, "prompt": [{"role": "user", "content": str}, ...], "answer": str, "task": str, "source": str}

plus any ``keep_columns`` of the source (e.g. ``tests`` for code rewards). Cold-start/SFT rows are
``{"prompt": messages, "completion": str}``.

Sources: local ``.jsonl``/``.json``/``.parquet``/``.csv`` files, or anything ``datasets.load_dataset``
opens (a hub name such as ``openai/gsm8k``, or a local folder, read afresh each time: ``_read_datasets``).
Rows are validated one by one; a bad row raises a ``DataError`` naming file, row (the 1-based line for
jsonl/csv) and field with how to fix it, or, with ``on_error="skip"``, is skipped and counted; a byte
that is not UTF-8 makes its row bad.
An empty file is an error of its own. ``RAW_PROMPT`` keeps a row's prompt as read, before any template, for
decontamination (``grpo_core.recipe.prepare``).
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal

from grpo_core.config import DatasetSource
from grpo_core.rewards.base import prompt_text
from grpo_core.rewards.extract import parse_gold_answer

OnError = Literal["raise", "skip"]
log = logging.getLogger(__name__)
RAW_PROMPT = "_raw_prompt"  # a row's prompt text before its template: what decontamination compares; never written
FILE_SUFFIXES = {".jsonl", ".json", ".parquet", ".csv"}
ROLES = {"system", "user", "assistant"}


class DataError(ValueError):
    """A data set row or file that cannot be used; the message says where and how to fix it."""


@dataclass
class LoadStats:
    rows_read: int = 0
    rows_kept: int = 0
    rows_skipped: int = 0
    errors: list[str] = field(default_factory=list)  # the first few skip reasons

    def skip(self, message: str) -> None:
        self.rows_skipped += 1
        if len(self.errors) < 20:
            self.errors.append(message)

    def as_dict(self) -> dict[str, Any]:
        return {"rows_read": self.rows_read, "rows_kept": self.rows_kept, "rows_skipped": self.rows_skipped,
                "errors": list(self.errors)}


# ---------------------------------------------------------------- reading raw records


def read_records(source: str | Path, *, split: str = "train", name: str | None = None,
                 on_error: OnError = "raise", stats: LoadStats | None = None) -> list[tuple[str, dict[str, Any]]]:
    """``(location, record)`` pairs from a local file or a ``datasets`` source.

    ``location`` is what an error message shows, e.g. ``"data/train.jsonl line 7"``.
    Malformed lines (jsonl) raise a DataError naming the line, or are skipped and counted.
    """
    stats = stats if stats is not None else LoadStats()
    path = Path(source)
    if path.is_file() and path.suffix.lower() in FILE_SUFFIXES:
        return _read_file(path, on_error, stats)
    if path.is_file():
        raise DataError(f"{path}: unsupported file type {path.suffix!r}; use one of {sorted(FILE_SUFFIXES)}")
    if not path.exists() and (str(source).startswith((".", "/", "~")) or path.suffix.lower() in FILE_SUFFIXES):
        raise DataError(f"{source}: no such file or folder ({path.resolve()}; a relative path in a config file is "
                        "read from the config file's folder, else from the working folder)")
    return _read_datasets(str(source), split=split, name=name)


def _read_file(path: Path, on_error: OnError, stats: LoadStats) -> list[tuple[str, dict[str, Any]]]:
    out = _read_rows(path, on_error, stats)
    if not out and not stats.rows_skipped:
        raise DataError(f"{path}: the file is empty (no rows); fill it or remove it from the data sources")
    return out


# Text files are decoded with errors="surrogateescape": a byte that is not UTF-8 becomes one character in
# U+DC80..U+DCFF, so it is found in the line or row that holds it (a DataError there, or skipped), instead of
# a UnicodeDecodeError from the middle of the file that names neither.
_NOT_UTF8 = re.compile("[\udc80-\udcff]")


def _not_utf8(where: str, text: str, what: str = "row") -> str:
    bad = _NOT_UTF8.search(text)
    byte = ord(bad.group()) - 0xDC00 if bad else 0
    return (f"{where}: byte 0x{byte:02x} is not UTF-8; re-save the file as UTF-8 "
            f"(e.g. iconv -f latin1 -t utf-8) or fix the {what}")


def _bad_strings(obj: Any) -> Iterator[str]:
    """The strings (keys included) inside a parsed record that hold bytes that were not UTF-8."""
    if isinstance(obj, str):
        if _NOT_UTF8.search(obj):
            yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _bad_strings(k)
            yield from _bad_strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _bad_strings(v)


def _read_rows(path: Path, on_error: OnError, stats: LoadStats) -> list[tuple[str, dict[str, Any]]]:
    suffix = path.suffix.lower()
    out: list[tuple[str, dict[str, Any]]] = []
    if suffix == ".jsonl":
        with path.open(encoding="utf-8", errors="surrogateescape") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                loc = f"{path} line {lineno}"
                if _NOT_UTF8.search(line):
                    _fail(_not_utf8(loc, line), on_error, stats)
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    _fail(f"{loc}: malformed JSON ({e.msg} at column {e.colno}); fix or delete the line",
                          on_error, stats)
                    continue
                if not isinstance(rec, dict):
                    _fail(f"{loc}: expected a JSON object, got {type(rec).__name__}", on_error, stats)
                    continue
                out.append((loc, rec))
        return out
    if suffix == ".json":
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
        if not text.strip():
            return out
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
        if isinstance(data, dict):  # {"data": [...]} or {"rows": [...]}: the one list-valued key
            lists = [v for v in data.values() if isinstance(v, list)]
            if len(lists) != 1:
                raise DataError(f"{path}: expected a JSON list of objects (or an object with one list of rows)")
            data = lists[0]
        if not isinstance(data, list):
            raise DataError(f"{path}: expected a JSON list of objects, got {type(data).__name__}")
        bad_lines = iter(text.count("\n", 0, m.start()) + 1 for m in _NOT_UTF8.finditer(text))
        for i, rec in enumerate(data, start=1):
            if not isinstance(rec, dict):
                _fail(f"{path} row {i}: expected a JSON object, got {type(rec).__name__}", on_error, stats)
                continue
            bad = list(_bad_strings(rec))
            if bad:  # rows and their bad bytes come in file order: this row's first one is the next line
                line = next(bad_lines, None)
                for _ in range(sum(len(_NOT_UTF8.findall(b)) for b in bad) - 1):
                    next(bad_lines, None)
                _fail(_not_utf8(f"{path} row {i}" + (f" (line {line})" if line else ""), bad[0]), on_error, stats)
                continue
            out.append((f"{path} row {i}", rec))
        return out
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return [(f"{path} row {i}", rec) for i, rec in enumerate(pq.read_table(path).to_pylist(), start=1)]
    with path.open(encoding="utf-8", errors="surrogateescape", newline="") as f:  # .csv; header on line 1
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        if any(_NOT_UTF8.search(h) for h in header if h):
            raise DataError(_not_utf8(f"{path} line 1", " ".join(h for h in header if h), "header"))
        start = 2
        for rec in reader:
            bad = list(_bad_strings(list(rec.values())))  # values beyond the header come as one list
            if bad:
                _fail(_not_utf8(f"{path} line {start}", bad[0]), on_error, stats)
            else:
                out.append((f"{path} line {start}", dict(rec)))
            start = reader.line_num + 1
    return out


def _read_datasets(source: str, *, split: str, name: str | None) -> list[tuple[str, dict[str, Any]]]:
    """A hub name (``openai/gsm8k``) or a folder ``datasets`` understands.

    A local folder is read by ``load_dataset`` as a hub set is (its README.md configs, ``data_files``, splits), but
    into a cache folder of its own, removed once its rows are read: the shared cache keys a local folder by its name
    and layout, not its content or place, so a folder rebuilt in place or another folder of the same name came back
    with the first one's rows. A hub name reads through the shared cache (its offline copy) as before."""
    import datasets

    local = Path(source).expanduser().is_dir()
    try:
        if not local:
            return _records(datasets.load_dataset(source, name, split=split), f"{source}[{split}]")
        root = Path(datasets.config.HF_DATASETS_CACHE)  # the space set aside for data sets, not /tmp
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="r1-local-folder-", dir=root) as cache:
            return _records(datasets.load_dataset(source, name, split=split, cache_dir=cache), f"{source}[{split}]")
    except Exception as e:  # noqa: BLE001 - re-raised with the source named
        raise DataError(f"cannot load dataset {source!r} (config {name!r}, split {split!r}): "
                        f"{type(e).__name__}: {e}") from e


def _records(ds: Any, label: str) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{label} row {i}", rec) for i, rec in enumerate(ds, start=1)]


def _fail(message: str, on_error: OnError, stats: LoadStats) -> None:
    if on_error == "raise":
        raise DataError(message + ". Or set on_error: skip to skip and count bad rows.")
    stats.skip(message)


# ---------------------------------------------------------------- normalising rows


def to_messages(value: Any, *, template: str | None = None) -> list[dict[str, str]]:
    """A prompt as chat messages: a string becomes one user turn; a message list is checked."""
    if isinstance(value, str):
        if not value.strip():
            raise ValueError("is empty")
        return [{"role": "user", "content": template.format(prompt=value) if template else value}]
    if isinstance(value, (list, tuple)) and value and all(isinstance(m, dict) for m in value):
        msgs = []
        for m in value:
            if m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise ValueError(f"has a message without a valid role/content: {m!r}")
            msgs.append({"role": m["role"], "content": m["content"]})
        if template and msgs[-1]["role"] == "user":
            msgs[-1]["content"] = template.format(prompt=msgs[-1]["content"])
        return msgs
    raise ValueError(f"must be a string or a list of chat messages, got {type(value).__name__}")


def normalize_record(record: dict[str, Any], location: str, src: DatasetSource, index: int,
                     label: str | None = None, *, keep_raw: bool = False) -> dict[str, Any]:
    """One raw record -> a schema row, or a DataError naming location and field; ``label`` is
    ``source_label(src)``, computed here when not given; ``keep_raw``: a templated prompt's text as read is kept
    under ``RAW_PROMPT`` (for decontamination)."""
    if label is None:
        label = source_label(src)
    fmap = src.field_map
    row: dict[str, Any] = {}
    if src.answer_format == "none":  # a general source (no reference answer): a reward model or judge scores it
        row["answer"] = ""
    for key in ("prompt",) if src.answer_format == "none" else ("prompt", "answer"):
        column = fmap.get(key, key)
        if column not in record or record[column] is None or record[column] == "":
            raise DataError(
                f"{location}: field {key!r} (column {column!r}) is missing or empty; columns present: "
                f"{sorted(record)}. Fix the row, or map the field with field_map: {{{key!r}: '<column>'}}"
            )
        try:
            if key == "prompt":
                row["prompt"] = to_messages(record[column], template=src.prompt_template)
                if keep_raw and src.prompt_template:
                    row[RAW_PROMPT] = raw_prompt_text(record[column])
            else:
                value = record[column]
                row["answer"] = parse_gold_answer(value if isinstance(value, str) else json.dumps(value),
                                                  src.answer_format)
                check_gold_answer(value, row["answer"], src)
        except ValueError as e:
            raise DataError(f"{location}: field {key!r} (column {column!r}) {e}; "
                            f"value starts {str(record[column])[:60]!r}") from None
    id_column = fmap.get("id", "id")
    row["id"] = str(record[id_column]) if record.get(id_column) not in (None, "") else f"{label}-{index:06d}"
    row["task"] = str(record.get(fmap["task"])) if "task" in fmap and record.get(fmap["task"]) else src.task
    row["source"] = label
    for col in src.keep_columns:
        if col not in record:
            raise DataError(f"{location}: keep_columns names {col!r}, which the row lacks; columns present: {sorted(record)}")
        row[col] = record[col]
    return row


_LATEX_COMMAND = re.compile(r"\\(?:text|mbox|mathrm|textbf|operatorname)\{[^}]*\}|\\(?:begin|end)\{[^}]*\}|\\[A-Za-z]+")
_PLAIN_WORD = re.compile(r"(?<![\\\w])[A-Za-z]{2,}(?![\w{])")
FREE_TEXT_WORDS = 3  # plain words outside LaTeX from which a gold answer reads as a sentence, not an expression


def check_gold_answer(value: Any, parsed: str, src: DatasetSource) -> None:
    """Refuse a gold answer no reward can grade against: empty once parsed (``#### `` with nothing after it),
    and, for a ``task: math`` source, a list or mapping, or free text (``FREE_TEXT_WORDS`` or more plain words
    outside LaTeX: "the red one is bigger"), which a math reward would compare completions against in vain.
    ``\\text{Evelyn}``, matrices and numbers with units pass (every MATH-500 and GSM8K answer does)."""
    if not parsed.strip():
        raise ValueError(f"parses to an empty answer (answer_format {src.answer_format!r}: nothing after the "
                         "'####' or inside the box?)")
    if src.task != "math":
        return
    if isinstance(value, (list, dict)):
        raise ValueError(f"is a JSON {type(value).__name__}, not one answer; a math reward compares one expression "
                         "(write the items as one string, e.g. '1, 2', or set the source's task to what it is)")
    words = _PLAIN_WORD.findall(_LATEX_COMMAND.sub(" ", parsed))
    if len(words) >= FREE_TEXT_WORDS:
        raise ValueError(f"reads as free text ({' '.join(words[:6])!r}...), not a math answer a reward can check; "
                         "fix the answer (e.g. put it in \\boxed{} or after '####' and set answer_format), or, for "
                         "prompts scored by a reward model, set answer_format: none")


def source_label(src: DatasetSource) -> str:
    if src.source:
        return src.source
    return Path(src.path).name if Path(src.path).exists() else src.path


def load_prompt_rows(src: DatasetSource, *, on_error: OnError = "raise", keep_raw: bool = False
                     ) -> tuple[list[dict[str, Any]], LoadStats]:
    """Read, validate and normalise one source (``keep_raw``: see ``normalize_record``)."""
    stats = LoadStats()
    records = read_records(src.path, split=src.split, name=src.name, on_error=on_error, stats=stats)
    stats.rows_read = stats.rows_skipped  # malformed lines were read and skipped already
    rows = []
    label = source_label(src)
    for i, (loc, rec) in enumerate(records):
        if src.max_rows is not None and len(rows) >= src.max_rows:
            break
        stats.rows_read += 1
        try:
            rows.append(normalize_record(rec, loc, src, i, label, keep_raw=keep_raw))
        except DataError as e:
            _fail(str(e), on_error, stats)
    stats.rows_kept = len(rows)
    return rows, stats


def load_sft_rows(src: DatasetSource, *, on_error: OnError = "raise", keep_raw: bool = False
                  ) -> tuple[list[dict[str, Any]], LoadStats]:
    """Reasoning traces ``{prompt, completion}`` (field_map names the two columns; ``keep_raw``: see
    ``normalize_record``)."""
    stats = LoadStats()
    records = read_records(src.path, split=src.split, name=src.name, on_error=on_error, stats=stats)
    stats.rows_read = stats.rows_skipped
    rows = []
    for loc, rec in records:
        if src.max_rows is not None and len(rows) >= src.max_rows:
            break
        stats.rows_read += 1
        try:
            out = {}
            for key in ("prompt", "completion"):
                column = src.field_map.get(key, key)
                value = rec.get(column)
                if not value:
                    raise DataError(f"{loc}: field {key!r} (column {column!r}) is missing or empty; columns "
                                    f"present: {sorted(rec)}. Map it with field_map: {{{key!r}: '<column>'}}")
                if key == "prompt":
                    out[key] = to_messages(value, template=src.prompt_template)
                    if keep_raw and src.prompt_template:
                        out[RAW_PROMPT] = raw_prompt_text(value)
                elif not isinstance(value, str):
                    raise DataError(f"{loc}: field 'completion' (column {column!r}) must be a string")
                else:
                    out[key] = value
            rows.append(out)
        except (DataError, ValueError) as e:
            _fail(str(e), on_error, stats)
    stats.rows_kept = len(rows)
    return rows, stats


def normalized_prompt_hash(prompt: Any) -> str:
    text = " ".join(prompt_text(prompt).lower().split())
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def raw_prompt_text(value: Any) -> str:
    """The text of a prompt field as read (a string, or a message list's contents), before any template."""
    return prompt_text(to_messages(value))


# ---------------------------------------------------------------- parquet


def write_parquet(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Write rows atomically (temp file + rename); nested prompts become list<struct<role, content>>."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows) if rows else pa.table({})
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def read_parquet(path: str | Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return pq.read_table(Path(path)).to_pylist()

