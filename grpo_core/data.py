"""Prompt data sets in one normalised schema: load, validate, dedupe, decontaminate, split, write.

Every prompt row, whatever its origin, becomes::

    {"id": str, "prompt": [{"role": "user", "content": str}, ...], "answer": str, "task": str, "source": str}

plus any ``keep_columns`` of the source (e.g. ``tests`` for code rewards). Cold-start/SFT rows are
``{"prompt": messages, "completion": str}``.

Sources: local ``.jsonl``/``.json``/``.parquet``/``.csv`` files, or anything ``datasets.load_dataset``
opens (a hub name such as ``openai/gsm8k``, or a local folder). Rows are validated one by one; a bad
row raises a ``DataError`` naming file, row (the 1-based line for jsonl/csv) and field with how to fix
it, or, with ``on_error="skip"``, is skipped and counted; a byte that is not UTF-8 makes its row bad.
An empty file is an error of its own.

Decontamination drops training rows that share a word n-gram (default 13, as in GPT-3's and the
Llama reports' contamination checks) with any eval prompt; a prompt shorter than n words is compared
whole. It compares the prompt field as read, before any ``prompt_template``: a template shared by the
train and eval sources would otherwise put the same n-grams in every prompt and drop them all (the
rows carry that text as ``RAW_PROMPT`` until ``prepare_datasets`` returns). A source that loses more
than ``max_contaminated_fraction`` of its rows fails the stage, naming the source, the count and one
shared n-gram. Splits are deterministic: rows are ordered by a seeded hash of their id, not by input order.
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
from typing import Any, Iterable, Iterator, Literal

from grpo_core.config import DataConfig, DatasetSource
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
    if not path.exists() and str(source).startswith((".", "/", "~")):
        raise DataError(f"{source}: no such file or folder")
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
    """A hub name (``openai/gsm8k``) or a folder ``datasets`` understands."""
    import datasets

    try:
        ds = datasets.load_dataset(source, name, split=split)
    except Exception as e:  # noqa: BLE001 - re-raised with the source named
        raise DataError(f"cannot load dataset {source!r} (config {name!r}, split {split!r}): "
                        f"{type(e).__name__}: {e}") from e
    label = f"{source}[{split}]"
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
    ``_source_label(src)``, computed here when not given; ``keep_raw``: a templated prompt's text as read is kept
    under ``RAW_PROMPT`` (for decontamination)."""
    if label is None:
        label = _source_label(src)
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


def _source_label(src: DatasetSource) -> str:
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
    label = _source_label(src)
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


# ---------------------------------------------------------------- dedupe, decontaminate, split


def normalized_prompt_hash(prompt: Any) -> str:
    text = " ".join(prompt_text(prompt).lower().split())
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def dedupe_rows(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """Keep the first row of each normalised prompt (case and whitespace folded)."""
    seen: set[str] = set()
    out = []
    for row in rows:
        h = normalized_prompt_hash(row["prompt"])
        if h not in seen:
            seen.add(h)
            out.append(row)
    return out, len(rows) - len(out)


_WORD = re.compile(r"\w+|[^\w\s]")


def _ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    words = _WORD.findall(text.lower())
    if len(words) < n:
        return {tuple(words)} if words else set()
    return {tuple(words[i: i + n]) for i in range(len(words) - n + 1)}


def raw_prompt_text(value: Any) -> str:
    """The text of a prompt field as read (a string, or a message list's contents), before any template."""
    return prompt_text(to_messages(value))


def _compared_text(row: dict[str, Any]) -> str:
    return row.get(RAW_PROMPT) or prompt_text(row["prompt"])


@dataclass
class Contamination:
    """What ``decontaminate`` dropped, per source: how many rows of how many, and one n-gram a dropped row shares
    with an eval prompt (what a user needs to see why)."""

    removed: dict[str, int] = field(default_factory=dict)
    total: dict[str, int] = field(default_factory=dict)
    example: dict[str, str] = field(default_factory=dict)

    @property
    def num_removed(self) -> int:
        return sum(self.removed.values())

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {src: {"removed": n, "of": self.total[src], "example_ngram": self.example[src]}
                for src, n in self.removed.items()}

    def check(self, max_fraction: float, what: str, ngram_size: int) -> None:
        """A ``DataError`` for the first source that lost more than ``max_fraction`` of its rows."""
        for src, n in self.removed.items():
            if n > max_fraction * self.total[src]:
                raise DataError(
                    f"decontamination dropped {n} of {self.total[src]} {what} rows of source {src!r} "
                    f"({n / self.total[src]:.0%}, above data.max_contaminated_fraction {max_fraction}): they share "
                    f"{ngram_size}-word runs with eval prompts, e.g. {self.example[src]!r}. Prompts are compared "
                    "before prompt_template, so the shared text is in the prompt field itself (a system prompt or "
                    "boilerplate in the data, or train and eval from the same split?); fix the sources, or raise "
                    "data.ngram_size, data.max_contaminated_fraction, or set data.decontaminate: false")


def decontaminate(train: list[dict[str, Any]], eval_rows: Iterable[dict[str, Any]], *, ngram_size: int = 13
                  ) -> tuple[list[dict[str, Any]], Contamination]:
    """Drop training rows that share a word n-gram with any eval prompt (short prompts: whole match).

    Words are ``\\w+`` runs and single punctuation marks, lowercased, so ``7+8*3=`` is 6 words. Rows are
    compared by their prompt before any template (``RAW_PROMPT``), eval rows too.
    """
    eval_grams: set[tuple[str, ...]] = set()
    for row in eval_rows:
        eval_grams |= _ngrams(_compared_text(row), ngram_size)
    kept, report = [], Contamination()
    for r in train:
        src = str(r.get("source", ""))
        report.total[src] = report.total.get(src, 0) + 1
        shared = _ngrams(_compared_text(r), ngram_size) & eval_grams
        if not shared:
            kept.append(r)
            continue
        report.removed[src] = report.removed.get(src, 0) + 1
        if src not in report.example:  # the first shared run in reading order
            words = _WORD.findall(_compared_text(r).lower())
            report.example[src] = " ".join(next(g for i in range(max(1, len(words) - ngram_size + 1))
                                                if (g := tuple(words[i: i + ngram_size])) in shared))
    return kept, report


def split_rows(rows: list[dict[str, Any]], *, eval_fraction: float = 0.05, eval_size: int | None = None,
               seed: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Deterministic train/eval split by a seeded hash of each row's id (independent of input order)."""
    order = sorted(rows, key=lambda r: hashlib.sha256(f"{seed}:{r['id']}".encode()).hexdigest())
    n_eval = eval_size if eval_size is not None else max(1, round(len(rows) * eval_fraction))
    if not 0 < n_eval < len(rows):
        raise DataError(f"cannot hold out {n_eval} of {len(rows)} rows; give more rows or change eval_fraction")
    return order[n_eval:], order[:n_eval]


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


# ---------------------------------------------------------------- the prepare_data stage, as a function


@dataclass
class PreparedData:
    train: list[dict[str, Any]]
    eval: list[dict[str, Any]]
    cold_start: list[dict[str, Any]]
    stats: dict[str, Any]
    preferences: list[dict[str, Any]] = field(default_factory=list)  # {prompt, chosen, rejected, source}
    pretrain: list[dict[str, Any]] = field(default_factory=list)  # {prompt, completion}: the tiny base's corpus


def prepare_datasets(config: DataConfig) -> PreparedData:
    """Build the train/eval prompt sets and the cold-start SFT set a DataConfig describes."""
    from grpo_core import general, synthetic

    train: list[dict[str, Any]] = []
    eval_rows: list[dict[str, Any]] = []
    cold: list[dict[str, Any]] = []
    pretrain: list[dict[str, Any]] = []
    stats: dict[str, Any] = {"sources": {}}
    if config.builtin_task == "chain":
        kw = {"min_operands": config.min_operands, "max_operands": config.max_operands}
        b_train, b_eval = synthetic.make_chain_splits(config.num_train, config.num_eval, seed=config.seed, **kw)
        train += b_train
        eval_rows += b_eval
        held_out = {r["prompt"][0]["content"] for r in b_eval}
        if config.cold_start_size:
            cs_prompts = synthetic.make_chain_rows(config.cold_start_size, seed=10_000 + config.seed,
                                                   exclude=held_out, **kw)
            cold += [{**r, "source": synthetic.SOURCE} for r in synthetic.make_cold_start_rows(
                cs_prompts, direct_fraction=config.cold_start_direct_fraction,
                coarse_fraction=config.cold_start_coarse_fraction, seed=config.seed)]
        if config.pretrain_size:  # other problems than the cold start's, none held out, every one worked in full
            pretrain = synthetic.make_cold_start_rows(synthetic.make_chain_rows(
                config.pretrain_size, seed=30_000 + config.seed, exclude=held_out, **kw), direct_fraction=0.0)
    preferences: list[dict[str, Any]] = []
    for name in config.builtin_general:  # grpo_core.general: prompts, cold-start answers, rule-made pairs
        g_train, g_eval = general.make_general_splits(name, config.general_num_train, config.general_num_eval,
                                                      seed=config.seed)
        train += g_train
        eval_rows += g_eval
        exclude = {r["prompt"][0]["content"] for r in g_eval}
        if config.general_cold_start_size:
            cs_rows = general.make_general_rows(name, config.general_cold_start_size, seed=10_000 + config.seed,
                                                exclude=exclude)
            cold += general.make_general_cold_start(cs_rows, preferred_fraction=config.general_cold_start_preferred,
                                                    seed=config.seed)
        if config.general_pretrain_size and config.pretrain_size:  # the plain echo only: no preferred answer
            pre_rows = general.make_general_rows(name, config.general_pretrain_size, seed=40_000 + config.seed,
                                                 exclude=exclude)
            pretrain += [{k: r[k] for k in ("prompt", "completion")}
                         for r in general.make_general_cold_start(pre_rows, preferred_fraction=0.0)]
        if config.general_num_pairs:
            pair_rows = general.make_general_rows(name, config.general_num_pairs, seed=20_000 + config.seed,
                                                  exclude=exclude)
            preferences += general.make_preference_pairs(pair_rows, seed=config.seed)
    for kind, sources, target in (("train", config.train_sources, train), ("eval", config.eval_sources, eval_rows)):
        for src in sources:
            rows, s = load_prompt_rows(src, on_error=config.on_error, keep_raw=True)
            target += rows
            stats["sources"][f"{kind}:{src.path}"] = s.as_dict()
    for src in config.cold_start_sources:  # files, trace sets and teachers: grpo_core.cold_start
        from grpo_core.cold_start import load_cold_start_source, source_key

        rows, stats["sources"][source_key(src)] = load_cold_start_source(src, train, on_error=config.on_error)
        label = _source_label(src) if isinstance(src, DatasetSource) else source_key(src).split(":", 1)[1]
        cold += [{**r, "source": r.get("source") or label} for r in rows]
    if config.dedupe:
        train, stats["train_duplicates"] = dedupe_rows(train)
        eval_rows, stats["eval_duplicates"] = dedupe_rows(eval_rows)
    if not train and config.on_error == "skip" and any(s["rows_skipped"] for s in stats["sources"].values()):
        raise DataError("no training rows left: every row was skipped as bad (on_error: skip); "
                        "see the skip reasons in the data stats, or set on_error: raise to stop at the first")
    if not eval_rows:
        train, eval_rows = split_rows(train, eval_fraction=config.eval_fraction, seed=config.seed)
    if config.decontaminate:
        for what, rows in (("train", train), ("cold_start", cold)):
            kept, report = decontaminate(rows, eval_rows, ngram_size=config.ngram_size)
            stats[f"{what}_contaminated"] = report.num_removed
            stats[f"{what}_contaminated_by_source"] = report.as_dict()
            stats["ngram_size"] = config.ngram_size
            for src, info in report.as_dict().items():
                log.warning("decontamination dropped %d of %d %s rows of source %r (e.g. shared with an eval prompt: "
                            "%r)", info["removed"], info["of"], what.replace("_", "-"), src, info["example_ngram"])
            report.check(config.max_contaminated_fraction, what.replace("_", "-"), config.ngram_size)
            train, cold = (kept, cold) if what == "train" else (train, kept)
    if not train:
        raise DataError("no training rows left after loading, dedupe and decontamination")
    for row in (*train, *eval_rows, *cold):
        row.pop(RAW_PROMPT, None)
    stats.update({"num_train": len(train), "num_eval": len(eval_rows), "num_cold_start": len(cold),
                  "num_preferences": len(preferences), "num_pretrain": len(pretrain), "train_by_source": _count_by_source(train),
                  "eval_by_source": _count_by_source(eval_rows)})
    return PreparedData(train=train, eval=eval_rows, cold_start=cold, stats=stats, preferences=preferences,
                        pretrain=pretrain)


def _count_by_source(rows: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rows:
        out[r.get("source", "")] = out.get(r.get("source", ""), 0) + 1
    return out
