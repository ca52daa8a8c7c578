"""``math_accuracy``: 1.0 when the completion's final answer equals the ground truth, decided by math-verify.

Pipeline per completion: ``parse_gold_answer`` on the ground truth, ``extract_answer`` on the completion
(last ``<answer>``, else the last box(es), else the tail; see ``extract``) -> fast paths in this process (equal
plain numbers, distinct integers, identical strings; never for a tail) -> otherwise math-verify in a
``VerifierPool`` worker with a hard deadline: a box is parsed as ``\\boxed{answer}``, a tail by math-verify's
own LaTeX + expression extraction, whose answer is final when it finds one (the last number counts only when
it finds none). A gold without math delimiters is read as ``$gold$``. A timeout or a failed check scores 0.0
and is counted (``rewards/math_accuracy/timeouts`` | ``errors``); a row without ground truth scores ``None``.
In a process that cannot start workers (a ``multiprocessing.Pool`` worker, ``datasets.map(num_proc=N)``) the
checks run in-process under their own time bound (``pool.call_in_process``), with the same scores.

Departures from the seed's ``math_reward``: the LAST box counts (models revise), boxes nest, equality is
symbolic (``0.5`` = ``\\frac{1}{2}``, ``1,000`` = ``1000``, ``25\\%`` = ``25``, intervals, sets), and every
check is bounded in time. Ground truth may be a bare answer (``"0.5"``, ``"\\frac{\\pi}{2}"``), a boxed one,
or a GSM8K solution ending ``#### 72``.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Sequence

from grpo_core.rewards.base import completion_text, count_reward_event
from grpo_core.rewards.extract import ExtractedAnswer, extract_answer, parse_gold_answer, to_safe_text
from grpo_core.rewards.pool import VerifierPool

DEFAULT_TIMEOUT_S = 3.0
DEFAULT_NUM_WORKERS = 2


@dataclass(frozen=True)
class VerifyOptions:
    """math-verify's knobs. ``match_types``: ``latex`` / ``expr``, or ``("library_default",)``."""

    match_types: tuple[str, ...] = ("latex", "expr")
    precision: int = 6  # math-verify's float_rounding
    strict: bool = True
    allow_set_relation_comp: bool = False


# -- the worker side (runs inside VerifierPool processes; imports SymPy there, never here) --------------


def _not_timeout_notice(record: logging.LogRecord) -> bool:
    """math-verify warns once per process that its own (signal) timeout is off; every check here is bounded by
    the pool's deadline or the in-process alarm instead, so the notice is noise in users' logs."""
    return not str(record.msg).startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_not_timeout_notice)


def _extraction_config(match_types: tuple[str, ...]) -> list[Any] | None:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    if tuple(match_types) == ("library_default",):
        return None
    targets: list[Any] = []
    for t in match_types:
        if t == "latex":
            targets.append(LatexExtractionConfig(boxed_match_priority=0))
        elif t == "expr":
            targets.append(ExprExtractionConfig())
        else:
            raise ValueError(f"unknown match type {t!r}; use 'latex', 'expr' or 'library_default'")
    return targets


def _parse(text: str, config: list[Any] | None) -> list[Any]:
    from math_verify import parse

    # parsing_timeout=None: math-verify's signal.alarm would reset the pool's own timer.
    if config is None:
        return parse(text, parsing_timeout=None)
    return parse(text, extraction_config=config, parsing_timeout=None)


@functools.lru_cache(maxsize=1024)
def _parse_gold(gold: str, match_types: tuple[str, ...]) -> tuple[Any, ...]:
    """math-verify's parse of a gold answer (already bare: ``parse_gold_answer`` ran in the trainer), cached
    per worker: the G completions of a prompt share one gold."""
    config = _extraction_config(match_types)
    gold_text = gold if _LATEX_DELIMS.search(gold) else f"${gold}$"
    return tuple(_parse(gold_text, config) or _parse(gold, config))


def _equal(gold: list[Any], pred: list[Any], opts: VerifyOptions) -> bool:
    from math_verify import verify

    if not gold or not pred:
        return False
    return bool(
        verify(
            gold,
            pred,
            float_rounding=opts.precision,
            strict=opts.strict,
            allow_set_relation_comp=opts.allow_set_relation_comp,
            timeout_seconds=None,
        )
    )


_LATEX_DELIMS = re.compile(r"(?<!\\)\$|\\\(|\\\[|\\boxed|\\fbox")  # math mode opens (an escaped \$ is a dollar)
_PROSE = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{3,}")  # a word that is not a \command


def check_answer(gold: str, pred: str, pred_kind: str, opts: VerifyOptions, tail: str = "") -> float:
    """(worker) 1.0 if the extracted answer equals ``gold`` under math-verify, else 0.0.

    ``pred_kind`` ``"tail"`` (no tag, no box): math-verify's own extraction reads ``tail`` first, and its
    answer is final when it finds one; the last number ``pred`` (the seed's fallback) counts only when it finds
    nothing at all.
    """
    config = _extraction_config(opts.match_types)
    gold_parsed = list(_parse_gold(gold, tuple(opts.match_types)))
    if pred_kind == "tail":
        found = _parse(tail, config)
        if found or not pred:
            return 1.0 if _equal(gold_parsed, found, opts) else 0.0
    pred_parsed = _parse(f"\\boxed{{{pred}}}", config)
    if _equal(gold_parsed, pred_parsed, opts):
        return 1.0
    # <answer> content may be prose ("The answer is $5$"): let math-verify find the answer inside it.
    if pred_kind == "answer" and (_LATEX_DELIMS.search(pred) or _PROSE.search(pred)):
        return 1.0 if _equal(gold_parsed, _parse(pred, config), opts) else 0.0
    return 0.0


def check_texts(gold: str, pred: str, opts: VerifyOptions) -> float:
    """(worker) math-verify's own extraction on both full texts, as in Math-Verify's test suite."""
    config = _extraction_config(opts.match_types)
    return 1.0 if _equal(_parse(gold, config), _parse(pred, config), opts) else 0.0


def run_check(kind: str, *args: Any) -> float:
    """(worker) the pool's single entry point, so one forkserver preload serves both checks."""
    if kind == "answer":
        return check_answer(*args)
    return check_texts(*args)


# -- the trainer side ---------------------------------------------------------------------------------

_POOL: VerifierPool | None = None
_POOL_LOCK = threading.Lock()
_SETTINGS = {"timeout": DEFAULT_TIMEOUT_S, "num_workers": DEFAULT_NUM_WORKERS, "memory_limit_mb": 4096}


def configure(
    *, timeout: float | None = None, num_workers: int | None = None, memory_limit_mb: int | None = None
) -> dict[str, Any]:
    """Set the verifier's per-check deadline (s), worker count and worker memory cap; returns the settings."""
    global _POOL
    new = dict(_SETTINGS)
    for key, value in (("timeout", timeout), ("num_workers", num_workers), ("memory_limit_mb", memory_limit_mb)):
        if value is not None:
            new[key] = value
    if new["timeout"] <= 0 or new["num_workers"] < 1:
        raise ValueError(f"need timeout > 0 and num_workers >= 1, got {new}")
    with _POOL_LOCK:
        if new != _SETTINGS and _POOL is not None:
            _POOL.close()
            _POOL = None
        _SETTINGS.update(new)
    return dict(_SETTINGS)


def get_pool() -> VerifierPool:
    """The shared verifier pool (workers start on first use)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = VerifierPool(
                run_check,
                num_workers=int(_SETTINGS["num_workers"]),
                timeout=float(_SETTINGS["timeout"]),
                memory_limit_mb=_SETTINGS["memory_limit_mb"],
                preload=("math_verify",),
                warmup=("answer", "1/2", "\\frac{1}{2}", "boxed", VerifyOptions()),
            )
        return _POOL


_PLAIN_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?")


def _as_number(text: str) -> Decimal | None:
    s = text.replace("\\$", "").replace("$", "").strip().rstrip(".")  # "32, 349" is a set, not 32349
    if not s or not _PLAIN_NUMBER.fullmatch(s) or not any(c.isdigit() for c in s):
        return None
    try:
        return Decimal(s.replace(",", ""))
    except InvalidOperation:
        return None


def fast_verdict(gold: str, pred: str) -> float | None:
    """A verdict without SymPy where one is certain, else ``None`` (ask math-verify)."""
    g, p = _as_number(gold), _as_number(pred)
    if g is not None and p is not None:
        if g == p:
            return 1.0
        if g == g.to_integral_value() and p == p.to_integral_value():
            return 0.0  # distinct integers: no rounding tolerance can make them equal
        return None
    if "".join(gold.split()) == "".join(pred.split()):
        return 1.0
    return None


def score_answers(
    preds: Sequence[ExtractedAnswer | None],
    golds: Sequence[str | None],
    *,
    options: VerifyOptions = VerifyOptions(),
    timeout: float | None = None,
    reward_name: str = "math_accuracy",
) -> list[float | None]:
    """Scores for already-extracted answers against normalised golds (``None`` gold -> ``None``)."""
    scores: list[float | None] = [None] * len(preds)
    jobs: list[tuple[int, tuple[Any, ...]]] = []
    for i, (pred, gold) in enumerate(zip(preds, golds, strict=True)):
        if gold is None:
            continue
        if pred is None or not (pred.text or pred.tail):
            scores[i] = 0.0
            continue
        verdict = None if pred.kind == "tail" else fast_verdict(gold, pred.text)  # a tail needs math-verify
        if verdict is not None:
            scores[i] = verdict
        else:
            jobs.append((i, ("answer", gold, pred.text, pred.kind, options, pred.tail)))
    _run_jobs(jobs, scores, timeout, reward_name)
    return scores


def _run_jobs(
    jobs: list[tuple[int, tuple[Any, ...]]], scores: list[float | None], timeout: float | None, name: str
) -> None:
    if not jobs:
        return
    outcomes = get_pool().map([args for _, args in jobs], timeout=timeout)
    for (i, _), out in zip(jobs, outcomes):
        scores[i] = float(out.value) if out.status == "ok" else 0.0
        if out.status != "ok":
            count_reward_event(name, out.status + "s")


def verify_texts(
    golds: Sequence[str], preds: Sequence[str], *, options: VerifyOptions = VerifyOptions(), timeout: float | None = None
) -> list[float]:
    """math-verify on whole texts (its own extraction for both sides), each check bounded by the pool."""
    scores: list[float | None] = [None] * len(golds)
    jobs = [
        (i, ("texts", to_safe_text(g), to_safe_text(p), options))
        for i, (g, p) in enumerate(zip(golds, preds, strict=True))
    ]
    _run_jobs(jobs, scores, timeout, "math_verify")
    return [s if s is not None else 0.0 for s in scores]


def math_accuracy(completions: list[Any], answer: Sequence[Any] | None = None, **kwargs: Any) -> list[float | None]:
    """TRL reward: 1.0 if the completion's final answer equals ``answer`` (dataset column), else 0.0.

    The verifier's deadline and worker count come from ``configure`` (the trainer sets them from
    ``GRPOConfig.reward_timeout`` / ``reward_num_workers``).
    """
    if answer is None:
        raise ValueError("math_accuracy needs the ground truth as the dataset column 'answer'")
    if len(answer) != len(completions):
        raise ValueError(f"{len(completions)} completions but {len(answer)} answers")
    preds = [extract_answer(completion_text(c)) for c in completions]
    golds = [None if a is None else parse_gold_answer(a) for a in answer]
    return score_answers(preds, golds)
