"""Reward models and judges behind an OpenAI-compatible server (``url:`` on a ``reward_model`` / ``judge`` entry).

    fn = ServedJudge(JudgeSpec(model="Qwen2.5-72B-Instruct", url="http://judge:8000", api_key_env="JUDGE_KEY"))
    fn(prompts=[...], completions=[...])  ->  [float in [0, 1] | None, ...]

A judge larger than the trainer's GPU runs elsewhere (verl's reward loop, slime ``--rm-url``, OpenRLHF
``--reward.remote_url``). Start one with ``vllm serve MODEL --served-model-name NAME`` and point ``url`` at it.

Routes (vLLM 0.32's OpenAI-compatible server, ``vllm/entrypoints``):
- judge: ``POST {url}/v1/chat/completions`` with the in-process judge's rubric chat (``judge.judge_messages``),
  greedy (``temperature: 0``), ``max_tokens = max_new_tokens``; the verdict goes through ``parse_judge_score``.
- reward model: ``POST {url}/classify`` with ``messages`` = the prompt plus one assistant turn (the server applies
  the model's chat template, no generation prompt, as ``reward_model.conversation_ids`` does), ``use_activation:
  false`` (the raw ``logits[:, 0]``, not vLLM's default sigmoid) and ``truncate_prompt_tokens = max_length`` cut on
  the right (TRL). vLLM serves any ``...ForSequenceClassification`` checkpoint there (runner pooling, convert
  classify); the score is ``data[0].probs[0]``.

Same contract as in process: one request per row, ``batch_size`` in flight (a bounded thread pool; the server
batches them), a call's rows share ``timeout`` seconds, a row with no score is None and counted
(``rewards/{name}/errors``: refused, 4xx, 5xx or a malformed answer; ``timeouts``: not answered in time;
``unparsed``: a judge verdict with no readable score). Connection errors, 429 and 5xx are retried with
exponential backoff inside the call's deadline; once a row gives up on them, the call's rows not yet sent fail
at once, so a dead server costs about ``batch_size x (1 + RETRIES)`` connection attempts a call, not one per row.
``max_failed_calls`` calls in a row with no answer at all raise ``RewardServerUnavailable`` naming the URL: the
trainer stops instead of training steps on None (NaN rewards count as 0 in the loss).

Departure from the in-process judge: no tokenizer here, so a long response is cut in its middle to about
``max_length x CHARS_PER_TOKEN`` characters of prompt. The key (``api_key_env`` names the variable) travels only
in the Authorization header; every message this module writes is passed through ``redact``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Callable

import httpx

from grpo_core.config import JudgeSpec, RewardModelSpec
from grpo_core.rewards.base import completion_text, count_reward_event, is_conversational, last_user_text
from grpo_core.rewards.judge import CUT, JUDGE_TEMPLATE, RUBRICS, check_parses, judge_messages, parse_judge_score
from grpo_core.rewards.reward_model import RunningMoments, clip_scores, normalize_scores, scoped_response

logger = logging.getLogger(__name__)

RETRIES = 3  # per request, on connection errors, 429 and 5xx, inside the call's deadline
BACKOFF_S = 0.25  # first wait; doubles each retry
CHARS_PER_TOKEN = 3  # a conservative characters-per-token of BPE text, to fit a judge prompt in max_length
RETRY_STATUS = {429, 500, 502, 503, 504}
HINTS = {401: " (the server refused the key: check api_key_env)", 403: " (the server refused the key: check api_key_env)",
         404: " (url must be the server's root, model its --served-model-name)"}


class RewardServerUnavailable(RuntimeError):
    """A served reward model / judge that answered none of the requests of ``max_failed_calls`` calls in a row."""


class RequestFailed(Exception):
    """One row's request that got no usable answer; ``event`` is its counter (``errors`` or ``timeouts``)."""

    def __init__(self, event: str, reason: str) -> None:
        super().__init__(reason)
        self.event, self.reason = event, reason


class ServedEndpoint:
    """An httpx client for one server: the key from ``api_key_env``, retries, and messages free of the key."""

    def __init__(self, spec: JudgeSpec | RewardModelSpec) -> None:
        assert spec.url is not None
        self.url, self.label = spec.url, f"{spec.type} {spec.name} ({spec.model} at {spec.url})"
        self._secret: str | None = None
        headers = {}
        if spec.api_key_env is not None:
            self._secret = os.environ.get(spec.api_key_env) or None
            if self._secret is None:
                raise ValueError(f"{self.label}: api_key_env names {spec.api_key_env}, which is not set in this "
                                 f"process's environment; export {spec.api_key_env}=<key> where the stage runs")
            headers["Authorization"] = f"Bearer {self._secret}"
        self.client = httpx.Client(headers=headers, limits=httpx.Limits(max_connections=spec.batch_size))

    def redact(self, text: str) -> str:
        """``text`` with the key, if any, replaced: a server may echo a request's header in its error body."""
        return text.replace(self._secret, "***") if self._secret else text

    def post(self, route: str, payload: dict[str, Any], deadline: float, down: threading.Event) -> dict[str, Any]:
        """The JSON answer of ``POST {url}{route}``, retried on connection errors, 429 and 5xx until ``deadline``
        (``time.monotonic()``); ``down`` set = another row of this call gave up on the server: fail at once."""
        reason = ""  # why the last attempt failed
        for attempt in range(RETRIES + 1):
            if down.is_set():
                raise RequestFailed("errors", "not sent: the server failed the call's other requests")
            left = deadline - time.monotonic()
            if left <= 0 and reason:  # out of time while retrying: the failure, not the clock, is the cause
                break
            if left <= 0:
                raise RequestFailed("timeouts", "no answer within the call's timeout")
            try:
                response = self.client.post(self.url + route, json=payload, timeout=left)
            except httpx.TimeoutException:
                raise RequestFailed("timeouts", "no answer within the call's timeout") from None
            except httpx.TransportError as e:  # refused, reset, DNS: the server is not there (yet)
                reason = f"{type(e).__name__}: {e}"
            else:
                if response.status_code < 400:
                    try:
                        return response.json()
                    except ValueError:
                        raise RequestFailed("errors", f"HTTP {response.status_code} with a body that is not JSON: "
                                                      f"{response.text[:200]!r}") from None
                reason = f"HTTP {response.status_code}{HINTS.get(response.status_code, '')}: {response.text[:300]}"
                if response.status_code not in RETRY_STATUS:  # 400, 401, 404: the same request fails again
                    raise RequestFailed("errors", reason)
            if attempt < RETRIES:
                time.sleep(max(0.0, min(BACKOFF_S * 2 ** attempt, deadline - time.monotonic())))
        down.set()
        raise RequestFailed("errors", reason)

    def map(self, requests: list[tuple[str, dict[str, Any]]], timeout: float, workers: int
            ) -> list[dict[str, Any] | RequestFailed]:
        """Every ``(route, payload)`` posted with ``workers`` in flight; each answer or its ``RequestFailed``,
        in order. Returns by ``timeout`` seconds (a row still in flight then is a timeout)."""
        deadline, down = time.monotonic() + timeout, threading.Event()
        out: list[dict[str, Any] | RequestFailed] = [RequestFailed("timeouts", "not answered in time")] * len(requests)
        if not requests:
            return out
        pool = ThreadPoolExecutor(max_workers=min(workers, len(requests)), thread_name_prefix="served-reward")
        futures = {pool.submit(self.post, route, payload, deadline, down): i
                   for i, (route, payload) in enumerate(requests)}
        done, _ = wait(futures, timeout=max(0.0, deadline - time.monotonic()) + 1.0)  # httpx's own timeout ends each
        pool.shutdown(wait=False, cancel_futures=True)
        for future in done:
            try:
                out[futures[future]] = future.result()
            except RequestFailed as e:
                out[futures[future]] = RequestFailed(e.event, self.redact(e.reason))
            except Exception as e:  # noqa: BLE001 - whatever else went wrong scores the row None, counted
                out[futures[future]] = RequestFailed("errors", self.redact(f"{type(e).__name__}: {e}"))
        return out


class _ServedReward:
    """What a served judge and reward model share: the endpoint, counting, and the failed-call watch."""

    route: str

    def __init__(self, spec: JudgeSpec | RewardModelSpec) -> None:
        self.spec, self.__name__ = spec, spec.name
        self.endpoint = ServedEndpoint(spec)
        self.failed_calls = 0  # calls in a row with no answer from the server

    def request(self, prompt: Any, completion: Any) -> dict[str, Any]:
        raise NotImplementedError

    def score(self, answer: dict[str, Any]) -> float | None:
        raise NotImplementedError

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        payloads = [self.request(p, c) for p, c in zip(prompts, completions, strict=True)]
        answers = self.endpoint.map([(self.route, p) for p in payloads], self.spec.timeout, self.spec.batch_size)
        scores: list[float | None] = [None] * len(answers)
        failures: list[RequestFailed] = []
        for i, answer in enumerate(answers):
            if isinstance(answer, RequestFailed):
                count_reward_event(self.__name__, answer.event)
                failures.append(answer)
                continue
            try:
                scores[i] = self.score(answer)
            except (KeyError, IndexError, TypeError, ValueError) as e:  # the server answered something else
                count_reward_event(self.__name__, "errors")
                failures.append(RequestFailed("errors", self.endpoint.redact(f"unexpected answer ({type(e).__name__}: "
                                                                             f"{e}): {str(answer)[:200]}")))
        if failures:
            logger.warning("%s: %d of %d requests got no score (first: %s)", self.endpoint.label, len(failures),
                           len(answers), failures[0].reason)
        self.watch_failed_calls(sum(not isinstance(a, RequestFailed) for a in answers), failures)
        return scores

    def watch_failed_calls(self, answered: int, failures: list[RequestFailed]) -> None:
        """Raise ``RewardServerUnavailable`` after ``max_failed_calls`` calls in a row with no answer at all."""
        if answered or not failures:
            self.failed_calls = 0
            return
        self.failed_calls += 1
        limit = self.spec.max_failed_calls
        if limit is not None and self.failed_calls >= limit:
            raise RewardServerUnavailable(
                f"{self.endpoint.label}: the server answered none of the requests of the last {self.failed_calls} "
                f"calls (last failure: {failures[-1].reason}). Start it (docs/recipes/reward-server.md), check url and api_key_env, or raise max_failed_calls (null: only count "
                f"rewards/{self.__name__}/errors)")


class ServedRewardModel(_ServedReward):
    """A sequence-classification reward model served by vLLM (``/classify``): the raw score of each (prompt,
    completion's ``scope``), optionally normalised by running statistics (no ``reward_stats.json`` over HTTP)."""

    route = "/classify"

    def __init__(self, spec: RewardModelSpec) -> None:
        super().__init__(spec)
        self.moments = RunningMoments()
        self.raw = False  # reward_model.raw_scores: the server's score as it comes (no reward_stats.json here)

    def request(self, prompt: Any, completion: Any) -> dict[str, Any]:
        messages = list(prompt) if is_conversational(prompt) else [{"role": "user", "content": str(prompt)}]
        response = scoped_response(completion_text(completion), self.spec.scope, self.__name__)
        return {"model": self.spec.model, "messages": messages + [{"role": "assistant", "content": response}],
                "use_activation": False, "truncate_prompt_tokens": self.spec.max_length, "truncation_side": "right"}

    def score(self, answer: dict[str, Any]) -> float | None:
        (data,) = answer["data"]
        if int(data.get("num_classes", len(data["probs"]))) != 1:
            raise ValueError(f"the served model has {data['num_classes']} classes; a reward model has 1 "
                             "(num_labels=1)")
        return float(data["probs"][0])

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        scores = super().__call__(prompts, completions, **kwargs)
        if self.raw:
            return scores
        return clip_scores(normalize_scores(scores, None, self.moments) if self.spec.normalize else scores,
                           self.spec.reward_clip_range, self.__name__)


class ServedJudge(_ServedReward):
    """A judge served over chat completions: the in-process judge's rubric chat and score parser."""

    route = "/v1/chat/completions"

    def __init__(self, spec: JudgeSpec) -> None:
        super().__init__(spec)
        self.seen = self.parsed = 0
        self.last_unparsed = ""

    def request(self, prompt: Any, completion: Any) -> dict[str, Any]:
        question = last_user_text(prompt)
        response = cut_middle(scoped_response(completion_text(completion), self.spec.scope, self.__name__),
                              self.spec.max_length * CHARS_PER_TOKEN - len(JUDGE_TEMPLATE) - len(question)
                              - len(RUBRICS[self.spec.rubric]))
        return {"model": self.spec.model, "messages": judge_messages(self.spec.rubric, question, response),
                "max_tokens": self.spec.max_new_tokens, "temperature": 0.0}

    def score(self, answer: dict[str, Any]) -> float | None:
        verdict = answer["choices"][0]["message"]["content"] or ""
        score = parse_judge_score(verdict)
        if score is None:
            count_reward_event(self.__name__, "unparsed")
        self.seen += 1
        self.parsed += score is not None
        self.last_unparsed = verdict if score is None else self.last_unparsed
        return score

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        scores = super().__call__(prompts, completions, **kwargs)
        check_parses(self.spec, self.seen, self.parsed, self.last_unparsed)
        return scores


def cut_middle(text: str, budget: int) -> str:
    """``text`` if it has at most ``budget`` characters, else its start and end around ``CUT`` (the rubric asks
    for a judgement of the whole response; its start and end carry the most)."""
    if len(text) <= max(budget, 2):
        return text
    half = max(budget - len(CUT), 2) // 2
    return text[:half] + CUT + text[-half:]


def served_reward(spec: JudgeSpec | RewardModelSpec) -> Callable[..., list[float | None]]:
    """The served reward function of an entry with ``url``."""
    return ServedJudge(spec) if isinstance(spec, JudgeSpec) else ServedRewardModel(spec)
