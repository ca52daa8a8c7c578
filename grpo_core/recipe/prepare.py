"""The prepare_data stage as a function: every source's rows together, deduped, decontaminated, split.

Decontamination drops training rows that share a word n-gram (default 13, as in GPT-3's and the Llama reports'
contamination checks) with any eval prompt; a prompt shorter than n words is compared whole. It compares the
prompt field as read, before any ``prompt_template``: a template shared by the train and eval sources would
otherwise put the same n-grams in every prompt and drop them all (the rows carry that text as ``RAW_PROMPT``
until ``prepare_datasets`` returns). A source that loses more than ``max_contaminated_fraction`` of its rows fails
the stage, naming the source, the count and one shared n-gram. Splits are deterministic: rows are ordered by a
seeded hash of their id, not by input order.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from grpo_core.config import CalcData, CountdownData, DataConfig, DatasetSource
from grpo_core.data import calc, countdown, general, synthetic
from grpo_core.data.rows import (RAW_PROMPT, DataError, load_prompt_rows, normalized_prompt_hash, source_label)
from grpo_core.recipe.cold_start import load_cold_start_source, source_key
from grpo_core.rewards.base import prompt_text

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- dedupe, decontaminate, split


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


def warn_if_mostly_duplicates(what: str, before: int, after: int) -> None:
    """A warning with the counts when deduplication removed most of a split's rows (80 copies of one prompt
    train on one prompt: the data is not what its row count says)."""
    if before and before - after > before / 2:
        log.warning("deduplication removed %d of %d %s rows (%.0f%%): the sources repeat prompts; %d distinct "
                    "prompts are left", before - after, before, what, 100 * (before - after) / before, after)


_WORD = re.compile(r"\w+|[^\w\s]")


def _ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    words = _WORD.findall(text.lower())
    if len(words) < n:
        return {tuple(words)} if words else set()
    return {tuple(words[i: i + n]) for i in range(len(words) - n + 1)}


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


# ---------------------------------------------------------------- the prepare_data stage, as a function


def countdown_rows(config: CountdownData, seed: int, *, pretrain: bool) -> tuple[list[dict], list[dict], list[dict],
                                                                               list[dict]]:
    """The countdown task's (train, eval, cold start, pretraining) rows (``grpo_core.data.countdown``): distinct
    training prompts; held-out problems (and the four-number transfer set, source ``countdown_transfer``) in no
    training, cold-start or pretraining row in any order of their numbers (``countdown.problem_key``); cold-start and
    pretraining prompts may repeat; pretraining rows only with ``pretrain`` (a tiny base is pretrained)."""
    shape = {"max_number": config.max_number, "operators": config.operators}
    c_train, c_eval = countdown.make_countdown_splits(config.num_train, config.num_eval, seed=seed, unique_train=True,
                                                      **shape)
    if config.transfer_num_eval:
        transfer = countdown.make_countdown_rows(config.transfer_num_eval, seed=50_000 + seed, num_numbers=4,
                                                 distinct_problems=True, source=countdown.SOURCE_TRANSFER, **shape)
        c_eval += [{**r, "id": r["id"].replace("countdown-", "countdown-transfer-", 1)} for r in transfer]
    held_out = {countdown.problem_key(r["prompt"][0]["content"], config.operators) for r in c_eval}
    style = {"retry_order": config.retry_order, "check_style": config.check_style, "operators": config.operators}
    cold = countdown.make_countdown_cold_start(countdown.make_countdown_rows(
        config.cold_start_size, seed=10_000 + seed, exclude=held_out, unique=False, **shape),
        check_fraction=config.check_fraction, seed=seed, **style) if config.cold_start_size else []
    pre: list[dict] = []
    if pretrain and config.pretrain_size:
        pre = [{k: r[k] for k in ("prompt", "completion")} for r in countdown.make_countdown_cold_start(
            countdown.make_countdown_rows(config.pretrain_size, seed=30_000 + seed, exclude=held_out, unique=False,
                                          **shape),
            check_fraction=config.pretrain_check_fraction, seed=seed, **style)]
    return c_train, c_eval, cold, pre


def calc_rows(config: CalcData, seed: int, *, pretrain: bool) -> tuple[list[dict], list[dict], list[dict], list[dict]]:
    """The calc task's (train, eval, cold start, pretraining) rows (``grpo_core.data.calc``): distinct training
    prompts; held-out problems in no training, cold-start or pretraining row in either order of a sum's or product's
    operands (``calc.problem_key``); cold-start and pretraining prompts may repeat; pretraining rows (a
    ``pretrain_tool_fraction`` of them calling the calculator) only with ``pretrain``. Seeds apart from the other
    tasks' (60,000 and 70,000 + seed)."""
    shape = {"digits": config.digits, "operators": config.operators}
    k_train, k_eval = calc.make_calc_splits(config.num_train, config.num_eval, seed=seed, unique_train=True, **shape)
    held_out = {calc.problem_key(prompt_text(r["prompt"])) for r in k_eval}
    cold = calc.make_calc_cold_start(calc.make_calc_rows(
        config.cold_start_size, seed=60_000 + seed, exclude=held_out, unique=False, **shape),
        tool_fraction=config.tool_fraction, seed=seed) if config.cold_start_size else []
    pre: list[dict] = []
    if pretrain and config.pretrain_size:
        pre = [{k: r[k] for k in ("prompt", "completion")} for r in calc.make_calc_cold_start(calc.make_calc_rows(
            config.pretrain_size, seed=70_000 + seed, exclude=held_out, unique=False, **shape),
            tool_fraction=config.pretrain_tool_fraction, seed=70_000 + seed)]
    return k_train, k_eval, cold, pre


# ---------------------------------------------------------------- held out by problem, not by spelling

_CHAIN_PROMPT = re.compile(r"^\d+(?:[-+*]\d+)+=$")


def canonical_problem(text: str) -> tuple | None:
    """A built-in verifiable task's prompt as its canonical problem (the task's ``problem_key``: countdown's numbers
    as a multiset with the target, calc's operand pair (unordered for ``+`` and ``*``), chain's steps up to a
    commuting first pair); None for any other prompt. A two-operand prompt is keyed as calc whichever task drew it: a
    chain of two operands is the same problem, with the same symmetry (its first pair commutes)."""
    text = text.strip()
    for key in (countdown.problem_key(text), calc.problem_key(text)):
        if key is not None:
            return key
    return synthetic.problem_key(text) if _CHAIN_PROMPT.match(text) else None


def held_out_overlap(eval_rows: list[dict[str, Any]], sources: dict[str, list[dict[str, Any]]]
                     ) -> list[tuple[str, str, str, str]]:
    """``(source, training prompt, eval id, eval prompt)`` for every training row (of ``sources``: train prompts,
    cold-start traces, the base's pretraining corpus) whose canonical problem is a held-out one."""
    held: dict[tuple, dict[str, Any]] = {}
    for row in eval_rows:
        if (key := canonical_problem(prompt_text(row["prompt"]))) is not None:
            held.setdefault(key, row)
    found = []
    for name, rows in sources.items():
        for row in rows:
            text = prompt_text(row["prompt"])
            if (hit := held.get(canonical_problem(text))) is not None:  # type: ignore[arg-type]
                found.append((name, text, str(hit.get("id")), prompt_text(hit["prompt"])))
    return found


def check_held_out(eval_rows: list[dict[str, Any]], sources: dict[str, list[dict[str, Any]]]) -> None:
    """A ``DataError`` naming the rows when a held-out problem of a built-in task is in a training source in any
    spelling (``held_out_overlap``): its accuracy would measure recall, not the task."""
    if found := held_out_overlap(eval_rows, sources):
        shown = "; ".join(f"{name} row {text!r} is eval row {eid} ({etext!r})" for name, text, eid, etext in found[:5])
        raise DataError(f"{len(found)} training rows hold a held-out problem up to the task's symmetries (the order "
                        "of countdown's numbers, of a calc sum's or product's operands, a commuting first pair of a "
                        f"chain): {shown}. Draw the training sources with the held-out problems excluded "
                        "(grpo_core.data.*.problem_key)")


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
        held_out = {synthetic.problem_key(r["prompt"][0]["content"]) for r in b_eval}
        if config.cold_start_size:
            cs_prompts = synthetic.make_chain_rows(config.cold_start_size, seed=10_000 + config.seed,
                                                   exclude=held_out, **kw)
            cold += [{**r, "source": synthetic.SOURCE} for r in synthetic.make_cold_start_rows(
                cs_prompts, direct_fraction=config.cold_start_direct_fraction,
                coarse_fraction=config.cold_start_coarse_fraction, seed=config.seed)]
        if config.pretrain_size:  # other problems than the cold start's, none held out, every one worked in full
            pretrain = synthetic.make_cold_start_rows(synthetic.make_chain_rows(
                config.pretrain_size, seed=30_000 + config.seed, exclude=held_out, **kw), direct_fraction=0.0)
    # beside the chain task its pretraining corpus (data.pretrain_size) gates the others'; without it their own sizes
    with_pretrain = bool(config.pretrain_size) or config.builtin_task is None
    if config.countdown is not None:
        c_train, c_eval, c_cold, c_pretrain = countdown_rows(config.countdown, config.seed, pretrain=with_pretrain)
        train, eval_rows, cold, pretrain = train + c_train, eval_rows + c_eval, cold + c_cold, pretrain + c_pretrain
    if config.calc is not None:
        k_train, k_eval, k_cold, k_pretrain = calc_rows(config.calc, config.seed, pretrain=with_pretrain)
        train, eval_rows, cold, pretrain = train + k_train, eval_rows + k_eval, cold + k_cold, pretrain + k_pretrain
    preferences: list[dict[str, Any]] = []
    for name in config.builtin_general:  # grpo_core.data.general: prompts, cold-start answers, rule-made pairs
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
    for src in config.cold_start_sources:  # files, trace sets and teachers: grpo_core.recipe.cold_start
        rows, stats["sources"][source_key(src)] = load_cold_start_source(src, train, on_error=config.on_error)
        label = source_label(src) if isinstance(src, DatasetSource) else source_key(src).split(":", 1)[1]
        cold += [{**r, "source": r.get("source") or label} for r in rows]
    if config.dedupe:
        for what, rows in (("train", train), ("eval", eval_rows)):
            kept, stats[f"{what}_duplicates"] = dedupe_rows(rows)
            warn_if_mostly_duplicates(what, len(rows), len(kept))
            train, eval_rows = (kept, eval_rows) if what == "train" else (train, kept)
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
    check_held_out(eval_rows, {"train": train, "cold-start": cold, "pretraining": pretrain})
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
