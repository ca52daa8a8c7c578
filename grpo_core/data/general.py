"""The embedded default's non-verifiable sources: "helpful" and "unsafe" prompts, judged by preference.

Beside the verifiable chain task (``grpo_core.data.synthetic``), R1's final RL trains on general prompts whose reward
is a reward model of human preference (DeepSeek-R1, sec. 2.3.4). These two built-in sources make that visible on
a laptop CPU: a preferred answer has a property the cold-start answers mostly lack, preference pairs
(chosen/rejected) come from a rule, a reward model is trained on the pairs, and RL must move the policy towards
the property through the reward model alone::

    source   prompt      cold-start answer (mostly)           preferred answer (the rule)
    helpful  echo kqz    <think></think><answer>kqz</answer>   <think></think><answer>kqz!</answer>
    unsafe   hack kqz    <think></think><answer>kqz</answer>   <think></think><answer>sorry</answer>

The rule (``preference_rule``, registered as a reward) is what generates the pairs and what evaluation's
``eval/preferred_rate`` measures; the shipped configs never use it as an RL reward, so a reward model that is
hacked shows as a gap between its own score (``eval/rm_score``) and the rule's pass rate. Rejected answers also
include over-refusal on helpful prompts and a cheerful compliance on unsafe ones, so a reward model that learns
"always refuse" or "always add !" loses pair accuracy.

Rows follow ``grpo_core.data``'s schema with ``answer`` empty and ``task`` = ``source`` = the source name.
Everything is deterministic by seed.
"""

from __future__ import annotations

import random
import re
import string
from typing import Any

from grpo_core.rewards.base import completion_text, last_user_text

SOURCES = ("helpful", "unsafe")
VERBS = {"helpful": "echo", "unsafe": "hack"}
REFUSAL = "sorry"
ANSWER = re.compile(r"^<think>[^<]*</think><answer>([^<]*)</answer>$")


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 4)))


def _reply(text: str) -> str:
    return f"<think></think><answer>{text}</answer>"


def preferred_reply(source: str, word: str) -> str:
    """The answer the rule prefers: the word with '!' (helpful), a refusal (unsafe)."""
    return _reply(f"{word}!" if source == "helpful" else REFUSAL)


def plain_reply(word: str) -> str:
    """The cold-start answer: the word echoed back (a compliance, on unsafe prompts)."""
    return _reply(word)


def make_general_rows(source: str, num_rows: int, *, seed: int = 0, exclude: set[str] | None = None
                      ) -> list[dict[str, Any]]:
    """``num_rows`` distinct prompts of ``source`` ("helpful" or "unsafe"), none in ``exclude``."""
    if source not in SOURCES:
        raise ValueError(f"unknown built-in general source {source!r}; built-in: {', '.join(SOURCES)}")
    rng = random.Random(f"{source}:{seed}")
    seen = set(exclude or ())
    rows: list[dict[str, Any]] = []
    while len(rows) < num_rows:
        text = f"{VERBS[source]} {_word(rng)}"
        if text in seen:
            continue
        seen.add(text)
        rows.append({"id": f"{source}-{seed}-{len(rows):06d}", "prompt": [{"role": "user", "content": text}],
                     "answer": "", "task": source, "source": source})
    return rows


def make_general_splits(source: str, num_train: int, num_eval: int, *, seed: int = 0
                        ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Train and held-out prompts of ``source`` with no prompt in common."""
    eval_rows = make_general_rows(source, num_eval, seed=seed * 2 + 1)
    exclude = {r["prompt"][0]["content"] for r in eval_rows}
    for r in eval_rows:
        r["id"] = r["id"].replace(f"{source}-", f"{source}-eval-", 1)
    return make_general_rows(source, num_train, seed=seed * 2, exclude=exclude), eval_rows


def _word_of(prompt: Any) -> str:
    return last_user_text(prompt).split(" ", 1)[-1]


def make_general_cold_start(rows: list[dict[str, Any]], *, preferred_fraction: float = 0.15, seed: int = 0
                            ) -> list[dict[str, Any]]:
    """SFT rows ``{prompt, completion, source}``: the plain echo, the preferred answer for a
    ``preferred_fraction`` of them (so sampling finds it now and then, and RL has something to amplify)."""
    if not 0.0 <= preferred_fraction <= 1.0:
        raise ValueError(f"preferred_fraction must be in [0, 1], got {preferred_fraction}")
    rng = random.Random(seed)
    out = []
    for row in rows:
        word = _word_of(row["prompt"])
        good = rng.random() < preferred_fraction
        out.append({"prompt": row["prompt"], "completion": preferred_reply(row["source"], word) if good
                    else plain_reply(word), "source": row["source"]})
    return out


def make_preference_pairs(rows: list[dict[str, Any]], *, seed: int = 0) -> list[dict[str, Any]]:
    """One pair ``{prompt, chosen, rejected, source}`` per row, chosen by the rule: the preferred answer over
    the plain echo, or over the other source's preferred answer (over-refusal / cheerful compliance)."""
    rng = random.Random(seed)
    out = []
    for row in rows:
        source, word = row["source"], _word_of(row["prompt"])
        other = "unsafe" if source == "helpful" else "helpful"
        rejected = preferred_reply(other, word) if rng.random() < 0.3 else plain_reply(word)
        out.append({"prompt": row["prompt"], "chosen": preferred_reply(source, word), "rejected": rejected,
                    "source": source})
    return out


def follows_rule(source: str, prompt: Any, text: str) -> bool:
    """Whether ``text`` is the answer the rule prefers for ``prompt`` of ``source``."""
    m = ANSWER.match(text.strip())
    if m is None:
        return False
    word = _word_of(prompt)
    return m.group(1) == (f"{word}!" if source == "helpful" else REFUSAL)


def preference_rule(prompts: list[Any], completions: list[Any], task: list[Any] | None = None,
                    **kwargs: Any) -> list[float | None]:
    """1.0 when the completion is the rule's preferred answer for its ``task`` (helpful, unsafe), else 0.0;
    None for rows of other tasks. The generating rule of the preference pairs: evaluation's
    ``eval/preferred_rate``; never the RL reward of a shipped config (the reward model is)."""
    tasks = task or [None] * len(completions)
    return [float(follows_rule(t, p, completion_text(c))) if t in SOURCES else None
            for p, c, t in zip(prompts, completions, tasks)]
