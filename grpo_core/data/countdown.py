"""A built-in verifiable task where checking and retrying pays: Countdown in miniature.

A few numbers in 1..``max_number`` and a target that exactly one try reaches; a try is one operator of ``operators``
on two of the numbers (default: three numbers in 1..12, ``+``: which two add up to the target)::

    prompt      3,8,5->13:
    first try   <think>3+8=11</think><answer>3+8</answer>                                (wrong: 11, not 13)
    with checks <think>3+8=11;wait, 11!=13;8+5=13</think><answer>8+5</answer>

Which try reaches the target is not in the prompt's surface, so a first try is right about a third of the
time; computing the try's value, checking it against the target and trying another is what pays (TinyZero's
Countdown, where R1-Zero-style reflection appeared, cut to what a ~1M-parameter model can do on a CPU).

The cold-start set is in the style of a teacher that mostly commits to its first try unchecked (right or not)
and only in a ``check_fraction`` of traces checks each try and retries until one reaches the target, so
RL has a rare behaviour to amplify (``wait`` is one of ``emergence.REFLECTION_PHRASES``), not one to copy.

The reward ``countdown_accuracy`` verifies from the prompt and the row's ``operators``: exactly ``<think>...</think>
<answer>x op y</answer>`` with x and y two of the prompt's numbers (a number used at most as often as given), ``op``
one of the task's operators and ``x op y`` equal to the target. Rows follow the normalised schema ``{id, prompt,
answer (the target), task, source, operators}``.

Held out by problem, not by spelling: a problem is the multiset of its numbers, its target and its operators
(``problem_key``: ``3,8,5->13:`` and ``5,3,8->13:`` are one problem), so a held-out problem is in no training prompt,
cold-start trace or pretraining try in any order of its numbers (``make_countdown_splits``; ``recipe.prepare``
checks every source). Three numbers in 1..12 with ``+`` make 792 problems; the transfer set (``SOURCE_TRANSFER``)
has four numbers, a shape no training source has.
"""

from __future__ import annotations

import random
import re
from typing import Any, Hashable

from grpo_core.data.synthetic import apply_op, sample_rows, split_rows
from grpo_core.rewards.base import completion_text, prompt_text

TASK = SOURCE = "countdown"
SOURCE_TRANSFER = "countdown_transfer"  # held-out problems of a harder shape (four numbers): eval only
DEFAULT_OPERATORS = "+"
DEFAULT_MAX_NUMBER = 12
PROMPT = re.compile(r"^(\d+(?:,\d+)+)->(\d+):$")
ANSWER = re.compile(r"^<think>([^<]*)</think><answer>(\d+)([-+*])(\d+)</answer>$")


def candidates(numbers: list[int], operators: str) -> list[str]:
    """Every try: one operator on two of the numbers, in the prompt's order (subtraction larger first)."""
    out = []
    for i in range(len(numbers)):
        for j in range(i + 1, len(numbers)):
            for op in operators:
                a, b = numbers[i], numbers[j]
                if op == "-" and b > a:
                    a, b = b, a
                out.append(f"{a}{op}{b}")
    return out


def format_prompt(numbers: list[int], target: int) -> str:
    return f"{','.join(map(str, numbers))}->{target}:"


def parse_prompt(text: str) -> tuple[list[int], int] | None:
    """``(numbers, target)`` of a countdown prompt, else ``None``."""
    m = PROMPT.match(text.strip())
    return ([int(x) for x in m.group(1).split(",")], int(m.group(2))) if m else None


def problem_key(text: str, operators: str = DEFAULT_OPERATORS) -> tuple | None:
    """A countdown prompt's canonical problem: its numbers as a multiset, its target and its operators (any order
    of the numbers is the same problem: the same tries reach the target); None for a prompt that is not countdown."""
    problem = parse_prompt(text)
    if problem is None:
        return None
    numbers, target = problem
    return (TASK, tuple(sorted(numbers)), target, "".join(sorted(operators)))


def evaluate_expression(expr: str) -> int:
    m = re.fullmatch(r"(\d+)([-+*])(\d+)", expr)
    if not m:
        raise ValueError(f"not a countdown expression: {expr!r}")
    return apply_op(int(m.group(1)), m.group(2), int(m.group(3)))


def make_countdown_rows(num_rows: int, *, seed: int = 0, num_numbers: int = 3, operators: str = DEFAULT_OPERATORS,
                        max_number: int = DEFAULT_MAX_NUMBER, exclude: set[Hashable] | None = None,
                        unique: bool = True, distinct_problems: bool = False, source: str = SOURCE
                        ) -> list[dict[str, Any]]:
    """``num_rows`` prompt rows (``synthetic.sample_rows``): ``num_numbers`` numbers in 1..max_number and the
    value of one try (chosen uniformly) that no other try reaches, so exactly one try is right; each row carries
    its ``operators`` (the reward accepts those only). ``exclude`` holds canonical problems (``problem_key``)."""
    def draw(rng: random.Random) -> tuple[str, str] | None:
        numbers = [rng.randint(1, max_number) for _ in range(num_numbers)]
        values = [evaluate_expression(e) for e in candidates(numbers, operators)]
        target = rng.choice(values)
        return (format_prompt(numbers, target), str(target)) if values.count(target) == 1 else None

    rows = sample_rows(num_rows, draw, seed=seed, task=TASK, source=source, exclude=exclude, unique=unique,
                       distinct_problems=distinct_problems, key=lambda text: problem_key(text, operators),
                       hint="allow more or larger numbers (max_number), or set unique=False")
    return [{**r, "operators": operators} for r in rows]


def make_countdown_splits(num_train: int, num_eval: int, *, seed: int = 0, unique_train: bool = False,
                          operators: str = DEFAULT_OPERATORS, **kwargs: Any) -> tuple[list[dict], list[dict]]:
    """Train and held-out rows with no canonical problem in common (``synthetic.split_rows``: eval drawn first,
    ``num_eval`` distinct problems; train never holds one of them in any order of its numbers). Train may repeat a
    prompt unless ``unique_train``."""
    return split_rows(make_countdown_rows, num_train, num_eval, seed=seed, train_options={"unique": unique_train},
                      key=lambda text: problem_key(text, operators), operators=operators, **kwargs)


RETRY_ORDERS = ("random", "systematic")
CHECK_STYLES = ("wait", "compare")


def teacher_trace(numbers: list[int], target: int, operators: str, rng: random.Random, *, check: bool,
                  retry_order: str = "random", check_style: str = "wait") -> str:
    """The teacher's completion: tries in a random order; unchecked, the first try is the answer; checked,
    each wrong try is followed by ``wait, V!=T`` and the next, until one reaches the target. A checked trace with
    ``retry_order="systematic"`` takes the tries in the prompt's order (``candidates``), so what to try after a
    failed check follows from the tries so far instead of being drawn again. With ``check_style="compare"`` a
    checked trace writes the target beside every try's value before deciding (``3+8=11?13;wait;8+5=13?13``), so
    the decision to retry or stop reads two numbers side by side instead of recalling the target."""
    if retry_order not in RETRY_ORDERS:
        raise ValueError(f"retry_order must be one of {RETRY_ORDERS}, got {retry_order!r}")
    if check_style not in CHECK_STYLES:
        raise ValueError(f"check_style must be one of {CHECK_STYLES}, got {check_style!r}")
    steps, answer = [], ""
    tries = candidates(numbers, operators)
    order = tries if check and retry_order == "systematic" else rng.sample(tries, len(tries))
    for expr in order:
        value = evaluate_expression(expr)
        steps.append(f"{expr}={value}" + (f"?{target}" if check and check_style == "compare" else ""))
        answer = expr
        if not check or value == target:
            break
        steps.append("wait" if check_style == "compare" else f"wait, {value}!={target}")
    return f"<think>{';'.join(steps)}</think><answer>{answer}</answer>"


def make_countdown_cold_start(rows: list[dict[str, Any]], *, check_fraction: float = 0.05, operators: str = "+",
                              seed: int = 0, retry_order: str = "random", check_style: str = "wait"
                              ) -> list[dict[str, Any]]:
    """SFT rows ``{prompt, completion, source}``: a ``check_fraction`` of traces check and retry (in
    ``retry_order`` and ``check_style``, see ``teacher_trace``), the rest commit to the first try."""
    if not 0.0 <= check_fraction <= 1.0:
        raise ValueError(f"check_fraction must be in [0, 1], got {check_fraction}")
    rng = random.Random(seed)
    out = []
    for row in rows:
        numbers, target = parse_prompt(prompt_text(row["prompt"]))  # type: ignore[misc]
        check = rng.random() < check_fraction
        out.append({"prompt": row["prompt"], "source": SOURCE,
                    "completion": teacher_trace(numbers, target, operators, rng, check=check,
                                                  retry_order=retry_order, check_style=check_style)})
    return out


def countdown_accuracy(completions: list[Any], prompts: list[Any] | None = None,
                       operators: list[str | None] | None = None, **kwargs: Any) -> list[float | None]:
    """1.0 when the completion is exactly ``<think>...</think><answer>x op y</answer>``, ``{x, y}`` are the
    prompt's two numbers, ``op`` one of the row's ``operators`` (column; ``DEFAULT_OPERATORS`` where a row has
    none) and ``x op y`` is its target; 0.0 otherwise; None for a prompt that is not countdown."""
    if prompts is None:
        return [None] * len(completions)
    allowed = operators if operators is not None else [None] * len(completions)
    scores: list[float | None] = []
    for completion, prompt, ops in zip(completions, prompts, allowed):
        problem = parse_prompt(prompt_text(prompt))
        if problem is None:
            scores.append(None)
            continue
        numbers, target = problem
        m = ANSWER.match(completion_text(completion).strip())
        ok = (m is not None and m.group(3) in (ops or DEFAULT_OPERATORS)
              and reaches(numbers, target, int(m.group(2)), m.group(3), int(m.group(4))))
        scores.append(1.0 if ok else 0.0)
    return scores


def reaches(numbers: list[int], target: int, x: int, op: str, y: int) -> bool:
    """``x op y`` uses two of ``numbers`` (each at most as often as given) and equals ``target``."""
    rest = list(numbers)
    return x in rest and (rest.remove(x) or y in rest) and apply_op(x, op, y) == target


TRY = re.compile(r"^(\d+)([-+*])(\d+)=")


def try_steps(completion: Any, prompt: Any) -> list[tuple[bool, str]] | None:
    """The tries of a completion's reasoning in order, each as ``(hit, after)``: ``hit`` whether ``x op y`` reaches the
    target with two of the prompt's numbers (computed, not read off the response), ``after`` what the reasoning says
    after the try up to the next try (the rest of its own ``;``-piece after ``x op y=``, then the pieces that are not
    tries, joined by ``;``): ``3+8=11?13;wait;8+5=13?13`` is ``[(False, "11?13;wait"), (True, "13?13")]``. Text before
    the first try is in no ``after``. None for a prompt that is not countdown. ``evaluation.checking`` reads it (does a
    check follow a miss, does the response stop after a hit)."""
    problem = parse_prompt(prompt_text(prompt))
    if problem is None:
        return None
    numbers, target = problem
    text = completion_text(completion)
    think = text[text.find("<think>") + len("<think>"):text.find("</think>")] if "</think>" in text else text
    steps: list[tuple[bool, list[str]]] = []
    for piece in think.split(";"):
        if m := TRY.match(piece.strip()):
            hit = reaches(numbers, target, int(m.group(1)), m.group(2), int(m.group(3)))
            steps.append((hit, [piece.strip()[m.end():]]))
        elif steps:
            steps[-1][1].append(piece)
    return [(hit, ";".join(after)) for hit, after in steps]
