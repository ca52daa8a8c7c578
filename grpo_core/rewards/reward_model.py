"""A sequence-classification reward model as a reward function (TRL's contract).

    fn = RewardModelReward(RewardModelSpec(model="/models/rm", scope="summary", normalize=True))
    fn(prompts=[...], completions=[...])  ->  [float | None, ...]

The model is any ``AutoModelForSequenceClassification`` checkpoint with ``num_labels=1`` (the Skywork-Reward
family, or the one the ``reward_model`` stage trains). Each (prompt, response) is rendered as a conversation
through the model's own chat template (prompt messages + one assistant turn, as TRL's GRPOTrainer scores a
reward model), tokenized without added special tokens, cut on the right at ``max_length`` (TRL), and scored
``batch_size`` sequences at a time on the model's own device. The score is ``logits[:, 0]``.

What the model sees of a completion is the spec's ``scope`` (``select_scope``): R1 (section 2.3.4) judged
helpfulness on the summary only (the text after the reasoning) and harmlessness on the whole response. A
response without ``</think>`` has no summary: it is scored as an empty answer and counted
(``rewards/{name}/no_summary``, ``scoped_response``).

``normalize: true`` divides by the model's ``reward_stats.json`` when it has one, else by the running moments of
every score seen so far; those are state (``state_dict``) that the GRPO trainer keeps in its checkpoints, and under
several trainer processes they are every rank's scores, merged at each update (``share_moments``), so N processes
normalise as one does.
``reward_clip_range: [lo, hi]`` then clamps each score (``clip_scores``), counted as ``rewards/{name}/clipped``.

Bounded in time: the rows of a call share a ``timeout``; rows whose batch would start after it score None and
are counted (``rewards/{name}/timeouts``). A failing forward scores its batch None and is counted
(``rewards/{name}/errors``); a row that cannot be rendered likewise. A path that is not a sequence-classification
model fails at construction with one message (``check_sequence_classifier``).
"""

from __future__ import annotations

import json
import logging
import math
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
import torch.distributed as dist

from grpo_core.config import RewardModelSpec
from grpo_core.rewards.base import completion_text, count_reward_event, is_conversational

logger = logging.getLogger(__name__)

THINK_END = "</think>"
REWARD_STATS_FILE = "reward_stats.json"  # {"mean": ..., "std": ...} of the model's scores on its training responses


class NotARewardModel(ValueError):
    """A reward-model path that is not a sequence-classification checkpoint with one output."""


def select_scope(text: str, scope: str) -> str | None:
    """``summary``: the text after the last ``</think>``, None when there is none (reasoning cut by the length cap
    or never closed: no summary); ``full``: the whole response."""
    if scope != "summary":
        return text
    return text.rsplit(THINK_END, 1)[1].strip() if THINK_END in text else None


def scoped_response(text: str, scope: str, reward_name: str) -> str:
    """What a reward model or judge sees of a response (``select_scope``). A response with no summary is seen as
    an empty one, counted as ``rewards/{name}/no_summary``: never the whole text (its reasoning would be judged as
    the answer), never None (a missing score combines to 0, the mean of a normalised reward model)."""
    selected = select_scope(text, scope)
    if selected is None:
        count_reward_event(reward_name, "no_summary")
        return ""
    return selected


def resolve_device(device: str | None) -> torch.device:
    """``device`` as given; None = the last visible GPU (the policy trains on the first), else the CPU."""
    if device is not None:
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device(f"cuda:{torch.cuda.device_count() - 1}")
    return torch.device("cpu")


def check_sequence_classifier(path: str | Path) -> None:
    """Raise ``NotARewardModel`` unless ``path`` is a ``...ForSequenceClassification`` model with num_labels=1.

    A local folder is read from its ``config.json``; a hub name through ``AutoConfig``."""
    from transformers import AutoConfig

    local = Path(path)
    how = ("a reward_model entry needs an AutoModelForSequenceClassification checkpoint with num_labels=1: train "
           "one with the reward_model stage (add a `reward_model:` section and write `model: reward_model`) or give "
           "a reward-model checkpoint such as Skywork-Reward")
    if local.is_dir() and not (local / "config.json").is_file():
        raise NotARewardModel(f"reward model {path}: no config.json in that folder, so not a model; {how}")
    if not local.exists() and str(path).startswith(("/", ".", "~")):
        raise NotARewardModel(f"reward model {path}: no such folder; {how}")
    try:
        config = AutoConfig.from_pretrained(str(path))
    except Exception as e:  # noqa: BLE001 - whatever the loader says, the message must name the path
        raise NotARewardModel(f"reward model {path}: cannot read its config ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}); {how}") from None
    archs = list(getattr(config, "architectures", None) or [])
    if not any(a.endswith("ForSequenceClassification") for a in archs):
        raise NotARewardModel(f"reward model {path}: its config.json names {archs or 'no architecture'}, not a "
                              f"...ForSequenceClassification model; {how}")
    if config.num_labels != 1:
        raise NotARewardModel(f"reward model {path}: num_labels={config.num_labels}, a reward model has exactly 1 "
                              f"output (a scalar score); {how}")


def conversation_ids(tokenizer: Any, prompt: Any, response: str, max_length: int) -> list[int]:
    """Token ids of (prompt, response) as one chat through ``tokenizer``'s template, cut on the right at
    ``max_length`` (TRL's RewardTrainer). A plain-text prompt becomes one user message."""
    messages = list(prompt) if is_conversational(prompt) else [{"role": "user", "content": str(prompt)}]
    text = tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": response}], tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"][:max_length]


def pad_right(seqs: list[list[int]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """``input_ids`` / ``attention_mask`` ``[B, L]``, right-padded (the classifier reads the last non-pad token)."""
    length = max(len(s) for s in seqs)
    input_ids = torch.full((len(seqs), length), pad_token_id, dtype=torch.long)  # [B, L]
    attention_mask = torch.zeros((len(seqs), length), dtype=torch.long)  # [B, L]
    for i, s in enumerate(seqs):
        input_ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        attention_mask[i, : len(s)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def set_pad_token(model: torch.nn.Module, tokenizer: Any) -> int:
    """Give the tokenizer a pad token (its EOS when it has none) and the model its id: a sequence classifier
    finds each row's last real token through ``config.pad_token_id`` (as TRL's RewardTrainer sets it)."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    return tokenizer.pad_token_id


class RunningMoments:
    """Mean and standard deviation of every score seen so far (Chan et al.'s parallel update).

    ``across_ranks`` (set by the GRPO trainer on its training reward functions, ``share_moments``): each ``update``
    merges every rank's batch, in rank order, so N processes that each score their share of a step hold the moments
    one process scoring the whole step holds, and normalise alike. The update is then a collective: every rank calls
    it together (``scoring.score_completions`` calls such a function on every rank, with no rows where a rank holds
    none of its source's)."""

    def __init__(self) -> None:
        self.count, self.mean, self.m2 = 0, 0.0, 0.0
        self.across_ranks = False

    def update(self, values: list[float]) -> None:
        parts = [batch_moments(values)]
        if self.across_ranks and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            parts = [None] * dist.get_world_size()
            dist.all_gather_object(parts, batch_moments(values))
        for n, mean, m2 in parts:
            self.merge(n, mean, m2)

    def merge(self, n: int, mean: float, m2: float) -> None:
        """Add a batch of ``n`` values with mean ``mean`` and sum of squared deviations ``m2``."""
        if not n:
            return
        delta, total = mean - self.mean, self.count + n
        self.mean += delta * n / total
        self.m2 += m2 + delta ** 2 * self.count * n / total
        self.count = total

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.count) if self.count > 1 else 1.0

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count, self.mean, self.m2 = int(state["count"]), float(state["mean"]), float(state["m2"])


class RewardModelReward:
    """``__call__(prompts, completions, **columns) -> list[float | None]``: the reward model's score of each
    (prompt, completion), on ``spec.device``; ``model_path`` overrides ``spec.model`` (the task layer passes the
    fetched stage output for ``model: reward_model``)."""

    def __init__(self, spec: RewardModelSpec, model_path: str | Path | None = None) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        path = str(model_path or spec.model)
        check_sequence_classifier(path)
        self.spec, self.path, self.__name__ = spec, path, spec.name
        self.device = resolve_device(spec.device)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
        self.model.to(self.device).eval().requires_grad_(False)
        self.pad_token_id = set_pad_token(self.model, self.tokenizer)
        stats_file = Path(path) / REWARD_STATS_FILE
        self.stats = json.loads(stats_file.read_text()) if stats_file.is_file() else None
        self.moments = RunningMoments()
        self.raw = False  # raw_scores: the score on a fixed scale, for the reward-hacking monitor

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        deadline = time.monotonic() + self.spec.timeout
        scores: list[float | None] = [None] * len(completions)
        encoded: dict[int, list[int]] = {}
        for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            try:
                response = scoped_response(completion_text(completion), self.spec.scope, self.__name__)
                encoded[i] = conversation_ids(self.tokenizer, prompt, response, self.spec.max_length)
            except Exception as e:  # noqa: BLE001 - one unrenderable row scores None, counted
                count_reward_event(self.__name__, "errors")
                logger.warning("%s: row %d cannot be rendered: %s: %s", self.__name__, i, type(e).__name__, e)
        order = sorted(encoded, key=lambda i: len(encoded[i]))  # similar lengths share a batch: less padding
        for start in range(0, len(order), self.spec.batch_size):
            if time.monotonic() > deadline:
                count_reward_event(self.__name__, "timeouts", len(order) - start)
                break
            batch = order[start: start + self.spec.batch_size]
            try:
                inputs = {k: v.to(self.device) for k, v in pad_right([encoded[i] for i in batch], self.pad_token_id).items()}
                with torch.no_grad():
                    logits = self.model(**inputs, use_cache=False).logits[:, 0].float().cpu()  # [b]
            except Exception as e:  # noqa: BLE001 - out of memory, a bad checkpoint: the batch scores None
                count_reward_event(self.__name__, "errors", len(batch))
                logger.warning("%s: scoring %d rows failed: %s: %s", self.__name__, len(batch), type(e).__name__, e)
                continue
            for i, s in zip(batch, logits.tolist()):
                scores[i] = s if math.isfinite(s) else None
        if self.raw:
            return fixed_scale(scores, self.stats if self.spec.normalize else None)
        return clip_scores(self.normalize(scores) if self.spec.normalize else scores, self.spec.reward_clip_range,
                           self.__name__)

    def state_dict(self) -> dict[str, Any]:
        """The running moments ``normalize`` uses without ``reward_stats.json``: the GRPO trainer checkpoints
        them, so a resumed run maps a score to the reward the uninterrupted run gives it."""
        return {"moments": self.moments.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.moments.load_state_dict(state["moments"])

    def normalize(self, scores: list[float | None]) -> list[float | None]:
        return normalize_scores(scores, self.stats, self.moments)


def batch_moments(values: list[float]) -> tuple[int, float, float]:
    """``(count, mean, sum of squared deviations)`` of ``values``."""
    if not values:
        return 0, 0.0, 0.0
    mean = sum(values) / len(values)
    return len(values), mean, sum((v - mean) ** 2 for v in values)


def moments_of(func: Any) -> list[RunningMoments]:
    """The running moments a reward function normalises by: its own, an ensemble's members'."""
    own = getattr(func, "moments", None)
    return ([own] if isinstance(own, RunningMoments) else []) + [m for member in getattr(func, "members", [])
                                                                 for m in moments_of(member)]


def share_moments(func: Any) -> None:
    """Have ``func``'s running moments (if any) merged over every rank at each update (``RunningMoments``)."""
    for moments in moments_of(func):
        moments.across_ranks = True


def fixed_scale(scores: list[float | None], stats: dict[str, Any] | None) -> list[float | None]:
    """What ``raw_scores`` gives: ``scores`` normalised by a model's fixed ``reward_stats.json`` when given, else as
    they are; never by the running moments, never clipped."""
    return scores if stats is None else normalize_scores(scores, stats, RunningMoments())


@contextmanager
def raw_scores(funcs: Sequence[Any]) -> Iterator[None]:
    """Inside the block the reward models among ``funcs`` (an ensemble's members too) score on a fixed scale:
    normalised by ``reward_stats.json`` where the model has one, else raw; not by the running moments, which move
    with the policy's scores (a proxy that rises in raw score would read flat against them), and not clipped
    (``reward_clip_range`` would flatten it too). The running moments are neither read nor updated, so no rank
    joins a merge (``RunningMoments.across_ranks``): one rank alone may score (the reward-hacking monitor)."""
    targets = [f for func in funcs for f in (func, *getattr(func, "members", [])) if hasattr(f, "raw")]
    for f in targets:
        f.raw = True
    try:
        yield
    finally:
        for f in targets:
            f.raw = False


def normalize_scores(scores: list[float | None], stats: dict[str, Any] | None,
                     moments: RunningMoments) -> list[float | None]:
    """``(s - mean) / std``: ``stats`` (a model's ``reward_stats.json``) when given, else every score seen so far
    (``moments``, updated here). None stays None."""
    if stats is not None:
        mean, std = float(stats["mean"]), float(stats["std"])
    else:
        moments.update([s for s in scores if s is not None])
        mean, std = moments.mean, moments.std
    std = std if std > 1e-6 else 1.0
    return [None if s is None else (s - mean) / std for s in scores]


def clip_scores(scores: list[float | None], clip_range: tuple[float, float] | None,
                reward_name: str) -> list[float | None]:
    """Each score clamped into ``clip_range`` (OpenRLHF's ``reward_clip_range``; None = unchanged), applied after
    normalisation so the range reads in the units the trainer sees. A clamped score is counted as
    ``rewards/{name}/clipped``: a policy that keeps hitting ``hi`` is pushing the model where it stops meaning much."""
    if clip_range is None:
        return scores
    lo, hi = clip_range
    clipped = [None if s is None else min(max(s, lo), hi) for s in scores]
    count_reward_event(reward_name, "clipped", sum(1 for s, c in zip(scores, clipped) if s is not None and s != c))
    return clipped
