"""Near-miss negatives for reward-model training: character-level perturbations of the chosen answer.

A reward model trained only on (preferred, rule-rejected) pairs never sees an answer one keystroke away from the
preferred one, so it is free to score ``sorryy`` or ``word!!`` as high as ``sorry`` or ``word!``, and RL finds
those answers (reward over-optimisation, Gao et al. 2022). Adding pairs ``(prompt, chosen, near_miss(chosen))``
teaches it that the exact answer beats its near misses (perturbed-response negatives as in contrastive
reward-model training, e.g. Shen et al. 2024 "Improving reward models with synthetic critiques" use edits of the
chosen answer; here the edits are character-level and rule-free).

The edits (``EDITS``): duplicate a character, repeat a trailing punctuation mark (``word!`` -> ``word!!``), drop a
character, swap two adjacent different characters, substitute a character with another of its kind (a letter for a
letter of the same case, a digit for a digit, a mark for a mark: ``sorry`` -> ``sorrv``, the one-keystroke typo a
final RL found in a model trained on the other four). They act on the content only: characters inside markup tags
(``<think>``, ``</answer>``, ...) are left alone, since a broken tag is the format reward's business and would
spend most edits on template text the policy never gets wrong; a text that is all tags is edited anywhere.
A near miss is never the chosen text itself, and the same (text, seed, index) gives the same near misses.
"""

from __future__ import annotations

import math
import random
import re
import string
from typing import Any, Callable

TAG = re.compile(r"<[^<>]*>")
PUNCTUATION = set(string.punctuation)


def content_positions(text: str) -> list[int]:
    """Indices of ``text``'s characters outside markup tags and not whitespace (every non-space index when
    the text is all tags)."""
    in_tag = [False] * len(text)
    for m in TAG.finditer(text):
        for i in range(m.start(), m.end()):
            in_tag[i] = True
    outside = [i for i, c in enumerate(text) if not in_tag[i] and not c.isspace()]
    return outside or [i for i, c in enumerate(text) if not c.isspace()]


def _duplicate(text: str, i: int, rng: random.Random) -> str:
    return text[: i + 1] + text[i:]


def _drop(text: str, i: int, rng: random.Random) -> str:
    return text[:i] + text[i + 1:]


def _swap(text: str, i: int, rng: random.Random) -> str:
    return text[:i] + text[i + 1] + text[i] + text[i + 2:]


KINDS = (string.ascii_lowercase, string.ascii_uppercase, string.digits, string.punctuation)


def _substitute(text: str, i: int, rng: random.Random) -> str:
    """``text`` with character ``i`` replaced by another character of its kind (drawn from ``rng``)."""
    kind = next(k for k in KINDS if text[i] in k)
    return text[:i] + rng.choice([c for c in kind if c != text[i]]) + text[i + 1:]


Edit = Callable[[str, int, random.Random], str]  # (text, position, rng) -> the edited text


def _candidates(text: str, positions: list[int]) -> dict[str, tuple[Edit, list[int]]]:
    """Each edit's function and the positions where it changes ``text``."""
    content = set(positions)
    trailing = [i for i in positions if text[i] in PUNCTUATION
                and (i + 1 == len(text) or i + 1 not in content)]  # the last mark before a tag, space or the end
    swaps = [i for i in positions if i + 1 in content and text[i] != text[i + 1]]
    substitutable = [i for i in positions if any(text[i] in k for k in KINDS)]
    return {"duplicate": (_duplicate, list(positions)), "repeat_punctuation": (_duplicate, trailing),
            "drop": (_drop, list(positions)), "swap": (_swap, swaps), "substitute": (_substitute, substitutable)}


EDITS = ("duplicate", "repeat_punctuation", "drop", "swap", "substitute")


def near_misses(text: str, n: int, rng: random.Random) -> list[str]:
    """Up to ``n`` distinct near misses of ``text``, none equal to it: each an edit (``EDITS``, chosen uniformly
    among those that apply) at a uniformly chosen content position. Fewer when the text has fewer distinct ones
    (an empty text has none)."""
    positions = content_positions(text)
    pools = {name: (fn, list(pos)) for name, (fn, pos) in _candidates(text, positions).items()}
    out: list[str] = []
    seen = {text}
    while len(out) < n:
        live = [name for name in EDITS if pools[name][1]]
        if not live:
            break
        fn, pos = pools[rng.choice(live)]
        i = pos.pop(rng.randrange(len(pos)))  # without replacement: the loop ends
        edited = fn(text, i, rng)
        if edited not in seen:
            seen.add(edited)
            out.append(edited)
    return out


def _has_margin(row: dict[str, Any]) -> bool:
    margin = row.get("margin")
    return margin is not None and not (isinstance(margin, float) and math.isnan(margin))  # parquet's missing: NaN


def add_near_miss_negatives(rows: list[dict[str, Any]], n: int, seed: int) -> tuple[list[dict[str, Any]], int]:
    """``rows`` followed by up to ``n`` pairs ``{prompt, chosen, rejected: near miss of chosen, source}`` per row,
    and how many were added. Row ``k``'s near misses come from ``Random(f"near_miss:{seed}:{k}")``, so they do not
    depend on the other rows. A pair with a margin gives its near misses margin 0 (no margin asked), so margins
    still apply to every row (TRL's margin column is all rows or none)."""
    if n <= 0:
        return list(rows), 0
    added: list[dict[str, Any]] = []
    for k, row in enumerate(rows):
        chosen = str(row["chosen"])
        for miss in near_misses(chosen, n, random.Random(f"near_miss:{seed}:{k}")):
            if miss == str(row.get("rejected")):
                continue  # already a pair
            pair = {"prompt": row["prompt"], "chosen": chosen, "rejected": miss, "source": row.get("source")}
            if _has_margin(row):
                pair["margin"] = 0.0
            added.append(pair)
    return list(rows) + added, len(added)
