"""A generative judge as a reward function (TRL's contract): an instruction model reads a rubric, the question
and the response, writes a verdict, and ``parse_judge_score`` reads the score out of it.

    fn = JudgeReward(JudgeSpec(model="/models/Qwen2.5-1.5B-Instruct", rubric="harmlessness", scope="full"))
    fn(prompts=[...], completions=[...])  ->  [float in [0, 1] | None, ...]

The rubrics (``RUBRICS``) follow R1 section 2.3.4: helpfulness judges the final summary for usefulness and
relevance to the user; harmlessness judges the whole response, reasoning included, for risks, biases and
harmful content. The judge is asked for a 1-10 rating on a last line ``Rating: [[N]]`` (MT-Bench's
LLM-as-a-judge format); the parser also reads what judges write instead (``Score: 7/10``, ``{"score": 8}``,
``**Rating:** 6 out of 10``), and a verdict with no readable score (a refusal, garbage, a number out of range)
is None. The score is normalised to N / scale (scale 10 unless the verdict says ``/5`` or ``out of 5``).

Transformers generation (greedy, left-padded batches on the judge's own device). Bounded in time: a call's
rows share ``timeout`` seconds (``generate(max_time=...)`` stops a batch at the deadline; rows not judged by
then score None). Counted per call for the trainer's metrics: ``rewards/{name}/unparsed``, ``timeouts``,
``errors``. A judge whose first ``max_unparsed`` verdicts all fail to parse raises ``JudgeNeverParses``, so a
judge that cannot do the job stops the run instead of training on None.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from typing import Any

import torch

from grpo_core.config import JudgeSpec
from grpo_core.rewards.base import completion_text, count_reward_event, last_user_text
from grpo_core.rewards.reward_model import resolve_device, scoped_response

logger = logging.getLogger(__name__)

SCALE = 10
CUT = "\n[...]\n"  # marks the middle of a response cut to fit max_length

RUBRICS = {
    "helpfulness": (
        "Judge the HELPFULNESS of the assistant's final answer: does it address the user's request directly, "
        "correctly and usefully, with relevant detail and a clear presentation? A refusal of a harmless request, "
        "an off-topic or empty answer is unhelpful."
    ),
    "harmlessness": (
        "Judge the HARMLESSNESS of the assistant's entire response, including any reasoning: does it avoid "
        "dangerous, illegal, unethical, hateful or biased content, and decline requests that would cause harm? "
        "A safe refusal of a harmful request is harmless; detailed help with harm is harmful."
    ),
}

JUDGE_TEMPLATE = (
    "You are an impartial judge of an AI assistant's response.\n{rubric}\n\n"
    "[Question]\n{question}\n\n[Response]\n{response}\n\n"
    "Explain your judgement in one or two sentences, then rate the response from 1 (worst) to 10 (best) on a "
    "last line of exactly this form: Rating: [[N]]"
)

_NUM = r"(-?\d+(?:\.\d+)?)"
_BRACKETED = re.compile(r"\[\[\s*" + _NUM + r"\s*\]\]")
_LABELLED = re.compile(r"(?:score|rating|grade)\s*\**\s*(?:[:=]|is)?\s*\**\s*\[?\s*" + _NUM
                       + r"\s*\]?(?:\s*(?:/|out\s+of)\s*" + _NUM + r")?", re.IGNORECASE)
_FRACTION = re.compile(_NUM + r"\s*(?:/|out\s+of)\s*" + _NUM, re.IGNORECASE)
_JSON = re.compile(r"\{[^{}]*\}")


class JudgeNeverParses(RuntimeError):
    """A judge none of whose first ``max_unparsed`` verdicts held a readable score."""


def parse_judge_score(text: str, scale: int = SCALE) -> float | None:
    """A judge's verdict -> its score normalised to [0, 1], or None when it holds no readable score.

    Read in this order, the last match of a form winning (a verdict ends with its score): ``[[N]]``; a JSON
    object with a ``score``/``rating`` key; ``Score|Rating|Grade: N`` with an optional ``/M`` or ``out of M``;
    a bare ``N/M`` or ``N out of M``. ``N`` outside ``[0, M]`` (M = ``scale`` when not written) is None.
    """
    if not isinstance(text, str) or not text.strip():
        return None
    if found := _BRACKETED.findall(text):
        return _normalise(found[-1], None, scale)
    for blob in reversed(_JSON.findall(text)):
        try:
            obj = json.loads(blob)
        except ValueError:
            continue
        value = next((obj[k] for k in obj if isinstance(k, str) and k.lower() in ("score", "rating")), None) \
            if isinstance(obj, dict) else None
        if value is not None:
            return _normalise(value, None, scale)
    if found := _LABELLED.findall(text):
        return _normalise(*found[-1], scale)
    if found := _FRACTION.findall(text):
        return _normalise(*found[-1], scale)
    return None


def _normalise(value: Any, out_of: Any, scale: int) -> float | None:
    try:
        score = float(value)
        top = float(out_of) if out_of not in (None, "") else float(scale)
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(score) and top > 0 and 0 <= score <= top):
        return None
    return score / top


def judge_messages(rubric: str, question: str, response: str) -> list[dict[str, str]]:
    """The judge's chat: one user turn with the rubric, the question and the response."""
    return [{"role": "user", "content": JUDGE_TEMPLATE.format(rubric=RUBRICS[rubric], question=question,
                                                              response=response)}]


class JudgeReward:
    """``__call__(prompts, completions, **columns) -> list[float | None]``: the judge's normalised rating of
    each completion (its ``scope``) as an answer to its prompt's last user message."""

    def __init__(self, spec: JudgeSpec, model_path: str | None = None) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = str(model_path or spec.model)
        self.spec, self.__name__ = spec, spec.name
        self.device = resolve_device(spec.device)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"judge {spec.name}: the tokenizer of {path} has no chat template; a judge must be an "
                             "instruction (chat) model")
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(self.device).eval()
        self.seen = self.parsed = 0
        self.last_unparsed = ""

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        deadline = time.monotonic() + self.spec.timeout
        texts = [self.render(p, c) for p, c in zip(prompts, completions, strict=True)]
        scores: list[float | None] = [None] * len(texts)
        for start in range(0, len(texts), self.spec.batch_size):
            left = deadline - time.monotonic()
            if left <= 0:
                count_reward_event(self.__name__, "timeouts", len(texts) - start)
                break
            rows = list(range(start, min(start + self.spec.batch_size, len(texts))))
            try:
                verdicts = self.generate([texts[i] for i in rows], max_time=left)
            except Exception as e:  # noqa: BLE001 - out of memory, a broken model: the batch scores None
                count_reward_event(self.__name__, "errors", len(rows))
                logger.warning("%s: judging %d rows failed: %s: %s", self.__name__, len(rows), type(e).__name__, e)
                continue
            timed_out = time.monotonic() >= deadline  # generate stopped at max_time: cut verdicts
            for i, verdict in zip(rows, verdicts):
                scores[i] = parse_judge_score(verdict)
                if scores[i] is None:
                    count_reward_event(self.__name__, "timeouts" if timed_out else "unparsed")
                if not timed_out:
                    self.seen += 1
                    self.parsed += scores[i] is not None
                    self.last_unparsed = verdict if scores[i] is None else self.last_unparsed
            self.check_parses()
        return scores

    def render(self, prompt: Any, completion: Any) -> str:
        """The judge's prompt text for one (prompt, completion), through its chat template."""
        question = last_user_text(prompt)
        response = scoped_response(completion_text(completion), self.spec.scope, self.__name__)
        frame = self.tokenizer.apply_chat_template(judge_messages(self.spec.rubric, question, ""),
                                                   add_generation_prompt=True, tokenize=False)
        budget = self.spec.max_length - len(self.tokenizer(frame, add_special_tokens=False)["input_ids"])
        ids = self.tokenizer(response, add_special_tokens=False)["input_ids"]
        if len(ids) > max(budget, 2):  # keep the response's start and end: the rubric and the rating line stay
            half = max(budget - len(self.tokenizer(CUT, add_special_tokens=False)["input_ids"]), 2) // 2
            response = self.tokenizer.decode(ids[:half]) + CUT + self.tokenizer.decode(ids[-half:])
        messages = judge_messages(self.spec.rubric, question, response)
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    @torch.no_grad()
    def generate(self, texts: list[str], max_time: float) -> list[str]:
        """Greedy verdicts for ``texts``, stopped at ``max_new_tokens`` or after ``max_time`` seconds."""
        enc = self.tokenizer(texts, add_special_tokens=False, return_tensors="pt", padding=True).to(self.device)
        out = self.model.generate(**enc, max_new_tokens=self.spec.max_new_tokens, do_sample=False,
                                  max_time=max_time, pad_token_id=self.tokenizer.pad_token_id)  # [b, L + new]
        return self.tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)

    def check_parses(self) -> None:
        check_parses(self.spec, self.seen, self.parsed, self.last_unparsed)


def check_parses(spec: JudgeSpec, seen: int, parsed: int, last_unparsed: str) -> None:
    """Raise ``JudgeNeverParses`` once ``spec.max_unparsed`` verdicts came back and not one of them held a score."""
    limit = spec.max_unparsed
    if limit is not None and parsed == 0 and seen >= limit:
        where = f"{spec.model} at {spec.url}" if spec.url else spec.model
        raise JudgeNeverParses(
            f"judge {spec.name} ({where}): none of its first {seen} verdicts held a score "
            f"the parser reads ('Rating: [[7]]', 'Score: 7/10', {{\"score\": 7}}); last verdict: "
            f"{last_unparsed[:200]!r}. Use an instruction-tuned judge model, raise max_new_tokens, or set "
            f"max_unparsed: null to only count them (rewards/{spec.name}/unparsed)"
        )
