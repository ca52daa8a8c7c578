"""The built-in verifiable task of the embedded default: "chain" arithmetic with worked steps.

A problem is 3-4 operands in 1..9 joined by ``+ - *`` and evaluated LEFT TO RIGHT (a stated
convention, no operator precedence), with every intermediate result kept in 0..99::

    prompt      7+8*3-5=
    solution    <think>7+8=15;15*3=45;45-5=40</think><answer>40</answer>

The cold-start SFT set leaves the reasoning out of a fraction of the examples (``<think></think>``
straight before the answer, default half), so the SFT model has both a direct mode and a
step-by-step mode and GRPO can discover that the steps pay (measured in the README's emergence table).
Another fraction can work in coarse steps, two operations at a time (``<think>7+8*3=45;45-5=40</think>``):
a worse reasoning strategy than one operation a step for a model that has to do each step in its head,
so RL can also improve how the model reasons (when to split a step), measured with the direct mode banned.

Rows follow the pipeline's normalised schema (``grpo_core.data``):
``{id, prompt: [{"role": "user", "content": ...}], answer: str, task: "chain", source: "chain"}``;
SFT rows are ``{prompt, completion}``. Everything is deterministic by seed.
The reward ``chain_accuracy`` is 1 for exactly ``<think>...</think><answer>N</answer>`` with N right.
"""

from __future__ import annotations

import random
import re
from typing import Any, Callable, Hashable

from grpo_core.rewards.base import completion_text

TASK = "chain"
SOURCE = "chain"
OPERATORS = "+-*"
MAX_VALUE = 99

# Exactly one think block then one answer block, nothing around them; the think block may be empty.
CHAIN_FORMAT = re.compile(r"^<think>([^<]*)</think><answer>(-?\d+)</answer>$")


def apply_op(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unknown operator {op!r}")


def sample_chain_problem(rng: random.Random, min_operands: int = 3, max_operands: int = 4) -> tuple[list[int], list[str]]:
    """Operands and operators whose left-to-right intermediates all stay in 0..MAX_VALUE."""
    n = rng.randint(min_operands, max_operands)
    operands, ops = [rng.randint(1, 9)], []
    value = operands[0]
    while len(operands) < n:
        op, b = rng.choice(OPERATORS), rng.randint(1, 9)
        nxt = apply_op(value, op, b)
        if 0 <= nxt <= MAX_VALUE:  # resample this step only; every prefix is always valid
            operands.append(b)
            ops.append(op)
            value = nxt
    return operands, ops


def chain_steps(operands: list[int], ops: list[str], ops_per_step: int = 1) -> list[str]:
    """The worked steps, e.g. ``["7+8=15", "15*3=45", "45-5=40"]``; with ``ops_per_step=2``
    ``["7+8*3=45", "45-5=40"]`` (coarse steps: two operations done at once)."""
    steps, value = [], operands[0]
    pairs = list(zip(ops, operands[1:]))
    for i in range(0, len(pairs), ops_per_step):
        text, nxt = str(value), value
        for op, b in pairs[i:i + ops_per_step]:
            text += f"{op}{b}"
            nxt = apply_op(nxt, op, b)
        steps.append(f"{text}={nxt}")
        value = nxt
    return steps


def evaluate_chain(expression: str) -> int:
    """Left-to-right value of ``"7+8*3-5"`` (a trailing ``=`` is ignored)."""
    tokens = re.findall(r"\d+|[-+*]", expression.rstrip("="))
    value = int(tokens[0])
    for op, b in zip(tokens[1::2], tokens[2::2]):
        value = apply_op(value, op, int(b))
    return value


def format_solution(operands: list[int], ops: list[str], *, with_reasoning: bool = True, ops_per_step: int = 1) -> str:
    steps = chain_steps(operands, ops, ops_per_step) if with_reasoning else []
    answer = evaluate_chain(_expression(operands, ops))
    return f"<think>{';'.join(steps)}</think><answer>{answer}</answer>"


def _expression(operands: list[int], ops: list[str]) -> str:
    return str(operands[0]) + "".join(f"{op}{b}" for op, b in zip(ops, operands[1:]))


def sample_rows(num_rows: int, draw: Callable[[random.Random], tuple[str, str] | None], *, seed: int, task: str,
                source: str, exclude: set[Hashable] | None = None, unique: bool = True, distinct_problems: bool = False,
                key: Callable[[str], Hashable] | None = None, hint: str = "") -> list[dict[str, Any]]:
    """``num_rows`` rows of a built-in task in the normalised schema, each from ``draw(rng) -> (prompt text,
    answer)`` (None: draw again). ``key`` maps a prompt text to its canonical problem (the task's ``problem_key``:
    the prompt up to the task's symmetries; default the text itself); ``exclude`` holds canonical problems to avoid
    (pass the held-out ones to keep a training source disjoint from them). ``unique`` avoids repeated prompt texts,
    ``distinct_problems`` repeated problems (a held-out set counts problems, not spellings). Too few distinct prompts
    is a ValueError ending in ``hint``."""
    key = key or (lambda text: text)
    rng = random.Random(seed)
    excluded = set(exclude or ())
    texts: set[str] = set()
    problems: set[Hashable] = set()
    rows: list[dict[str, Any]] = []
    attempts = 0
    while len(rows) < num_rows:
        attempts += 1
        if attempts > 100 * num_rows + 1000:
            raise ValueError(f"could only make {len(rows)} distinct {task} problems of {num_rows} asked for; {hint}")
        drawn = draw(rng)
        if drawn is None:
            continue
        text, answer = drawn
        problem = key(text)
        if problem in excluded or (unique and text in texts) or (distinct_problems and problem in problems):
            continue
        texts.add(text)
        problems.add(problem)
        rows.append({"id": f"{task}-{seed}-{len(rows):06d}", "prompt": [{"role": "user", "content": text}],
                     "answer": answer, "task": task, "source": source})
    return rows


def split_rows(make_rows: Callable[..., list[dict[str, Any]]], num_train: int, num_eval: int, *, seed: int,
               key: Callable[[str], Hashable] | None = None, train_options: dict[str, Any] | None = None,
               **kwargs: Any) -> tuple[list[dict], list[dict]]:
    """Train and held-out eval rows of ``make_rows`` with no canonical problem in common (``key``, see
    ``sample_rows``): eval drawn first, from its own stream, ``num_eval`` distinct problems (its ids marked
    ``{task}-eval-``); train drawn with those problems excluded. ``train_options`` go to the train rows only."""
    key = key or (lambda text: text)
    eval_rows = make_rows(num_eval, seed=seed * 2 + 1, distinct_problems=True, **kwargs)
    exclude = {key(r["prompt"][0]["content"]) for r in eval_rows}
    train_rows = make_rows(num_train, seed=seed * 2, exclude=exclude, **{**kwargs, **(train_options or {})})
    for r in eval_rows:
        r["id"] = r["id"].replace(f"{r['task']}-", f"{r['task']}-eval-", 1)
    return train_rows, eval_rows


def problem_key(text: str) -> tuple:
    """A chain prompt's canonical problem: the same worked steps up to the order of the first pair when its
    operator commutes (``3+5*2=`` and ``5+3*2=`` are one problem; ``5-3*2=`` is not ``3-5*2=``)."""
    tokens = re.findall(r"\d+|[-+*]", text.rstrip("="))
    operands, ops = [int(t) for t in tokens[0::2]], tokens[1::2]
    if ops and ops[0] in "+*":
        operands[:2] = sorted(operands[:2])
    return (TASK, tuple(operands), tuple(ops))


def make_chain_rows(num_rows: int, *, seed: int = 0, min_operands: int = 3, max_operands: int = 4,
                    exclude: set[Hashable] | None = None, unique: bool = True, distinct_problems: bool = False
                    ) -> list[dict[str, Any]]:
    """``num_rows`` chain prompt rows (``sample_rows``); ``exclude`` holds canonical problems (``problem_key``)."""
    def draw(rng: random.Random) -> tuple[str, str]:
        text = _expression(*sample_chain_problem(rng, min_operands, max_operands)) + "="
        return text, str(evaluate_chain(text))

    return sample_rows(num_rows, draw, seed=seed, task=TASK, source=SOURCE, exclude=exclude, unique=unique,
                       distinct_problems=distinct_problems, key=problem_key,
                       hint="allow more operands or set unique=False")


def make_chain_splits(num_train: int, num_eval: int, *, seed: int = 0, **kwargs: Any) -> tuple[list[dict], list[dict]]:
    """Train and held-out eval rows with no canonical problem in common (``split_rows``, ``problem_key``)."""
    return split_rows(make_chain_rows, num_train, num_eval, seed=seed, key=problem_key, **kwargs)


def make_cold_start_rows(rows: list[dict[str, Any]], *, direct_fraction: float = 0.5, coarse_fraction: float = 0.0,
                         seed: int = 0) -> list[dict[str, Any]]:
    """Worked solutions for chain prompt rows as SFT rows ``{prompt, completion}``.

    A ``direct_fraction`` of them (chosen by ``seed``) get an empty ``<think></think>``, a ``coarse_fraction``
    coarse steps (two operations a step), the rest one operation a step.
    """
    for name, value in (("direct_fraction", direct_fraction), ("coarse_fraction", coarse_fraction)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {value}")
    if direct_fraction + coarse_fraction > 1.0:
        raise ValueError(f"direct_fraction + coarse_fraction must be at most 1, got {direct_fraction} + {coarse_fraction}")
    rng = random.Random(seed)
    out = []
    for row in rows:
        text = row["prompt"][0]["content"] if isinstance(row["prompt"], list) else row["prompt"]
        tokens = re.findall(r"\d+|[-+*]", text.rstrip("="))
        operands, ops = [int(t) for t in tokens[0::2]], tokens[1::2]
        u = rng.random()  # one draw a row: direct below direct_fraction, then coarse, then fine steps
        completion = format_solution(operands, ops, with_reasoning=u >= direct_fraction,
                                     ops_per_step=2 if u < direct_fraction + coarse_fraction else 1)
        out.append({"prompt": row["prompt"], "completion": completion})
    return out


def parse_chain_completion(text: str) -> tuple[str, str] | None:
    """``(think, answer)`` when ``text`` is exactly the chain format, else ``None``."""
    m = CHAIN_FORMAT.match(text.strip())
    return (m.group(1), m.group(2)) if m else None


def chain_accuracy(completions: list[Any], answer: list[Any] | None = None, **kwargs: Any) -> list[float | None]:
    """1.0 for exactly ``<think>...</think><answer>N</answer>`` with N equal to the answer, else 0.0."""
    if answer is None:
        return [None] * len(completions)
    scores: list[float | None] = []
    for completion, ans in zip(completions, answer):
        parsed = parse_chain_completion(completion_text(completion))
        scores.append(1.0 if parsed is not None and parsed[1] == str(ans).strip() else 0.0)
    return scores


def chain_format(completions: list[Any], **kwargs: Any) -> list[float | None]:
    """1.0 for exactly ``<think>...</think><answer>N</answer>`` (any N), else 0.0."""
    return [1.0 if parse_chain_completion(completion_text(c)) else 0.0 for c in completions]
