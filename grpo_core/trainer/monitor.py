"""The reward-hacking monitor: the training reward (the proxy) beside a held-out signal the policy never trains on.

Reward over-optimisation is the known failure of RL against a learned reward: the proxy keeps rising while the true
preference falls (Gao et al. 2022, "Scaling Laws for Reward Model Overoptimization"). Every ``eval_steps`` steps the
monitor takes the first ``eval_samples`` held-out rows of each monitored source (the evaluation's general sources
this stage trains on), decodes them greedily with the policy, and scores each completion twice:

- ``monitor/{source}/proxy``: the source's own training rewards combined with its weights (what the step optimises),
  each reward model's score on a fixed scale (``reward_model.raw_scores``: its ``reward_stats.json`` or raw, never
  the running moments of ``normalize``, which rise with the policy's scores and would make a rising proxy read flat;
  not clipped);
- ``monitor/{source}/heldout``: ``monitor_reward`` (a second reward model, a judge or a rule no source trains on), or
  the evaluation's ``rule_reward`` (the embedded default's generating rule: the preferred rate).

Each is a mean over the rows scored (None / NaN left out). Scoring moves no RNG and leaves the reward functions'
state (a reward model's running moments) and event counters as training left them, so training is unchanged.

Alarm (``hacking_alarm``): a source alarms at an evaluation when, over its last ``monitor_window`` evaluations
(this one last), the proxy's last value is above its first and the held-out signal's last value is below its
first. End points, not a fitted trend: simple to state and to check by hand. No alarm before ``monitor_window``
evaluations exist, and NaN never alarms. ``monitor/{source}/alarm`` is 1.0 on an evaluation that alarms, else 0.0.

Checkpoint selection (``select_checkpoint: heldout``, ``best_evaluation``): the evaluated step whose held-out signal,
averaged over the monitored sources, is highest; a tie goes to the earlier step (the less optimised one).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from grpo_core.config import EvalConfig, GRPOConfig
from grpo_core.evaluation.heldout import _generate
from grpo_core.generation import GenerationBackend
from grpo_core.generation.prompts import encode_prompts
from grpo_core.rewards.base import RewardFunc
from grpo_core.rewards.reward_model import raw_scores
from grpo_core.rewards.scoring import load_reward_states, resolve_reward, reward_states, score_completions
from grpo_core.trainer.during_rl import preserved_rng, reward_events_aside
from grpo_core.trainer.loss import combine_rewards
from grpo_core.trainer.mixture import Mixture

PROXY, HELDOUT, ALARM = "proxy", "heldout", "alarm"


@dataclass(frozen=True)
class Alarm:
    """A source whose proxy rose while its held-out signal fell, from ``first_step`` to ``step``."""

    source: str
    first_step: int
    step: int
    proxy_first: float
    proxy_last: float
    heldout_first: float
    heldout_last: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def message(self) -> str:
        return (f"reward hacking suspected on source {self.source!r}: from step {self.first_step} to step {self.step} "
                f"the training reward (proxy) rose {self.proxy_first:.4g} -> {self.proxy_last:.4g} while the held-out "
                f"signal fell {self.heldout_first:.4g} -> {self.heldout_last:.4g}")


def hacking_alarm(source: str, points: Sequence[tuple[int, float, float]], window: int) -> Alarm | None:
    """The alarm of the module docstring on a source's evaluations ``points`` (``(step, proxy, heldout)``, oldest
    first, the current one last); None when it does not fire."""
    if len(points) < window:
        return None
    (first, p0, h0), (last, p1, h1) = points[-window], points[-1]
    if p1 > p0 and h1 < h0:  # NaN compares False: never alarms
        return Alarm(source, first, last, p0, p1, h0, h1)
    return None


def source_points(history: Sequence[dict[str, Any]], source: str) -> list[tuple[int, float, float]]:
    """``(step, proxy, heldout)`` of every evaluation of ``source`` in a run's log rows."""
    p, h = metric(source, PROXY), metric(source, HELDOUT)
    return [(int(r["step"]), float(r[p]), float(r[h])) for r in history if p in r and h in r]


def metric(source: str, kind: str) -> str:
    return f"monitor/{source}/{kind}"


def monitored_sources(history: Sequence[dict[str, Any]]) -> list[str]:
    """The sources a run's log rows hold monitor numbers of."""
    return sorted({k.split("/")[1] for r in history for k in r if k.startswith("monitor/") and k.endswith("/" + HELDOUT)})


def best_evaluation(history: Sequence[dict[str, Any]]) -> tuple[int, float] | None:
    """``(step, held-out signal)`` of the evaluated step with the highest held-out signal averaged over the monitored
    sources (NaN sources left out); ties to the earlier step; None without an evaluation."""
    sources = monitored_sources(history)
    best: tuple[int, float] | None = None
    for row in history:
        values = [float(row[k]) for s in sources if (k := metric(s, HELDOUT)) in row and not math.isnan(float(row[k]))]
        if values and (best is None or sum(values) / len(values) > best[1]):
            best = (int(row["step"]), sum(values) / len(values))
    return best


def alarms_of(history: Sequence[dict[str, Any]], window: int) -> list[Alarm]:
    """Every alarm of a run's log rows, replayed from the numbers logged (the manifest's record)."""
    out = []
    for source in monitored_sources(history):
        points = source_points(history, source)
        out += [a for i in range(len(points)) if (a := hacking_alarm(source, points[: i + 1], window)) is not None]
    return sorted(out, key=lambda a: (a.step, a.source))


class RewardMonitor:
    """The monitor of one run: its rows by source, the proxy (the mixture's own functions) and the held-out signal."""

    def __init__(self, config: GRPOConfig, eval_config: EvalConfig, rows: list[dict[str, Any]], mixture: Mixture,
                 signal: RewardFunc, signal_name: str) -> None:
        self.config, self.eval_config, self.mixture = config, eval_config, mixture
        self.signal, self.signal_name = signal, signal_name
        self.rows = rows
        self.sources = sorted({str(r["source"]) for r in rows})

    def evaluate(self, backend: GenerationBackend, tokenizer: Any, step: int, history: Sequence[dict[str, Any]]
                 ) -> tuple[dict[str, float], list[Alarm]]:
        """``monitor/{source}/proxy``, ``/heldout`` and ``/alarm`` of the policy ``backend`` samples from after
        ``step`` (``history``: the run's log rows before it), and the alarms that fire."""

        s = self.config.sampling
        encoded = encode_prompts(tokenizer, [r["prompt"] for r in self.rows], s.max_prompt_length, s.long_prompts)
        rows = [self.rows[i] for i in encoded.kept]
        saved_state = reward_states(self.mixture.funcs)
        try:
            with reward_events_aside(), preserved_rng():
                greedy = _generate(backend, encoded.ids, n=1, max_tokens=s.max_completion_length, greedy=True,
                                   batch=self.eval_config.sampling.batch_size)
                with raw_scores(self.mixture.funcs):  # rank 0 alone: no merge of running moments either
                    per_func = score_completions(self.mixture.funcs, self.mixture.reward_names, rows, greedy, 1,
                                                 s.max_completion_length, routes=self.mixture.routes(rows))  # [N, R]
                proxy = combine_rewards(per_func, self.mixture.row_weights(rows, 1)).tolist()  # [N]
                heldout = score_completions([self.signal], [self.signal_name], rows, greedy, 1,
                                            s.max_completion_length)[:, 0].tolist()  # [N]
        finally:  # the monitor's scoring is not training's: reward state and event counts as they were
            load_reward_states(self.mixture.funcs, saved_state)
        proxy_unscored = per_func.isnan().all(dim=1).tolist()  # [N] no training reward applied (None everywhere)
        metrics: dict[str, float] = {}
        alarms = []
        for source in self.sources:
            mine = [i for i, r in enumerate(rows) if str(r["source"]) == source]
            metrics[metric(source, PROXY)] = _mean([proxy[i] for i in mine if not proxy_unscored[i]])
            metrics[metric(source, HELDOUT)] = _mean([heldout[i] for i in mine if not math.isnan(heldout[i])])
            points = source_points(history, source) + [(step, metrics[metric(source, PROXY)],
                                                        metrics[metric(source, HELDOUT)])]
            alarm = hacking_alarm(source, points, self.config.monitor_window)
            metrics[metric(source, ALARM)] = float(alarm is not None)
            if alarm is not None:
                alarms.append(alarm)
        return metrics, alarms


def build_monitor(config: GRPOConfig, eval_config: EvalConfig | None, eval_rows: list[dict[str, Any]],
                  mixture: Mixture) -> RewardMonitor | None:
    """The run's monitor: the general sources of ``eval_config`` this run trains on (every one of them when it has no
    mixture), scored by ``config.monitor_reward`` or else ``eval_config.rule_reward``; None when there is no held-out
    signal or no such rows, unless ``monitor_reward`` or ``select_checkpoint: heldout`` asks for one (then an error
    saying what is missing)."""
    general = list(eval_config.general_sources) if eval_config is not None else []
    sources = [g for g in general if not mixture.mixed or g in mixture.names]
    signal_entry = config.monitor_reward or (eval_config.rule_reward if eval_config is not None else None)
    asked = config.monitor_reward is not None or config.select_checkpoint == "heldout"
    rows: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    for r in eval_rows:
        src = str(r.get("source"))
        if src in sources and counts.get(src, 0) < config.eval_samples:
            counts[src] = counts.get(src, 0) + 1
            rows.append(r)
    if signal_entry is None or not rows:
        if asked:
            missing = ("a held-out signal: set monitor_reward (or the evaluate section's rule_reward)"
                       if signal_entry is None else
                       f"held-out rows of a general source this stage trains on (evaluate.general_sources: {general}; "
                       f"held-out sources: {sorted({str(r.get('source')) for r in eval_rows})})")
            raise ValueError(f"monitor_reward / select_checkpoint: heldout need {missing}")
        return None
    signal, name = resolve_reward(signal_entry)
    return RewardMonitor(config, eval_config or EvalConfig(), rows, mixture, signal, name)


def _mean(values: list[float]) -> float:
    return float(sum(values)) / len(values) if values else math.nan
