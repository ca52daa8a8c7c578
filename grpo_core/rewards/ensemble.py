"""A conservative reward-model ensemble: mean minus k standard deviations of several models' scores.

    fn = RewardModelEnsemble(RewardModelSpec(model="/rm/a", ensemble=["/rm/b", "/rm/c"], normalize=True,
                                             ensemble_k=1.0))
    fn(prompts=[...], completions=[...])  ->  [mean_m s_m - k * std_m s_m, ...]

Reward models trained apart agree on answers like those they were trained on and disagree off that distribution,
which is where a policy that games one of them goes. Taking ``k`` standard deviations off the mean (a lower
confidence bound; Coste et al. 2023, "Reward Model Ensembles Help Mitigate Overoptimization", whose
uncertainty-weighted objective takes off the variance) makes an answer the models disagree on earn less than one
they agree on. Each member is a ``RewardModelReward`` with ``normalize: true`` (config validation requires it), so
the scores share a scale; the spread is the population standard deviation over the members. A row that any
member could not score (timeout, error) scores None: a spread over fewer models is not the one asked for.
``reward_clip_range`` applies to the combined reward. Members score one after another, each within ``timeout``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from grpo_core.config import RewardModelSpec
from grpo_core.rewards.reward_model import RewardModelReward, clip_scores

DEFAULT_ENSEMBLE_K = 1.0  # ensemble_k None


def conservative_mean(scores: list[float], k: float) -> float:
    """``mean - k * std`` of one row's member scores (population std; one member: its score)."""
    mean = sum(scores) / len(scores)
    std = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))
    return mean - k * std


class RewardModelEnsemble:
    """``__call__(prompts, completions, **columns) -> list[float | None]``: the conservative mean of ``spec.model``
    (``model_path`` overrides it, as for ``RewardModelReward``) and every ``spec.ensemble`` model."""

    def __init__(self, spec: RewardModelSpec, model_path: str | Path | None = None) -> None:
        member = spec.model_copy(update={"ensemble": [], "ensemble_k": None, "reward_clip_range": None})
        self.spec, self.__name__ = spec, spec.name
        self.k = DEFAULT_ENSEMBLE_K if spec.ensemble_k is None else spec.ensemble_k
        self.members = [RewardModelReward(member, path) for path in [model_path or spec.model, *spec.ensemble]]
        self.raw = False  # reward_model.raw_scores: members on a fixed scale, the combination not clipped

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        per_member = [m(prompts, completions, **kwargs) for m in self.members]  # M lists of B scores
        combined = [None if any(s is None for s in row)
                    else conservative_mean(list(row), self.k)  # type: ignore[arg-type]
                    for row in zip(*per_member)]
        return combined if self.raw else clip_scores(combined, self.spec.reward_clip_range, self.__name__)

    def state_dict(self) -> dict[str, Any]:
        """Each member's normalisation state (running moments when it has no ``reward_stats.json``)."""
        return {"members": [m.state_dict() for m in self.members]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["members"]) != len(self.members):
            raise ValueError(f"{self.__name__}: the checkpoint holds {len(state['members'])} ensemble members' state, "
                             f"this run has {len(self.members)}; resume with the ensemble the run started with")
        for m, s in zip(self.members, state["members"]):
            m.load_state_dict(s)
