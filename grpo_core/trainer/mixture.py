"""A GRPO data mixture by source: each step's prompts split among sources by weight, rewards routed per source.

``GRPOConfig.sources`` lists the sources (``SourceMix``: name, weight, reward functions). Rows belong to the
source their ``source`` column names. Every step's ``prompts_per_step`` prompts are allotted to the sources by
weight (largest remainder, fixed for the run), in a fixed layout: of stream positions ``b*P .. b*P + P - 1``
the first ``n_0`` belong to source 0, the next ``n_1`` to source 1, and so on; each source draws its rows from
its own seeded ``PromptStream``, so a position still names one prompt for every rank and every restart.

A group is G completions of one prompt, so it never mixes sources. Rewards: the reward columns are the
union of the sources' functions; a function is called only on the rows of the sources that name it (the
others get NaN, "does not apply", in its column), and each row's scores are combined with its own source's
weights. ``scale_rewards: batch`` divides by the std of the row's own source in the batch (one std over a
mixture would let the source with the widest reward range set every source's step size).

Without ``sources`` there is one source of every row with ``reward_funcs`` / ``reward_weights``: the trainer
as it was.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch

from grpo_core.config import GRPOConfig
from grpo_core.generation.prompts import PromptStream


class MixtureError(ValueError):
    """A mixture that cannot be trained on these rows; the message names the source and how to fix it."""


def allot_prompts(weights: Sequence[float], prompts_per_step: int) -> list[int]:
    """Prompts per step of each source: ``prompts_per_step`` split by weight, largest remainder first
    (ties to the earlier source)."""
    total = sum(weights)
    exact = [w / total * prompts_per_step for w in weights]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: prompts_per_step - sum(counts)]:
        counts[i] += 1
    return counts


class Mixture:
    """The sources of one GRPO run: which rows, how many per step, which reward functions with which weights."""

    def __init__(self, config: GRPOConfig, rows: list[dict[str, Any]],
                 resolve: Callable[[list[Any]], tuple[list[Callable], list[str]]]) -> None:
        """``resolve(entries) -> (functions, names)`` turns config reward entries into callables."""
        P = config.prompts_per_step
        if not config.sources:  # one source: every row, the top-level reward functions
            self.names: list[str | None] = [None]
            self.counts = [P]
            self.funcs, self.reward_names = resolve(list(config.reward_funcs))
            weights = config.reward_weights or [1.0] * len(self.funcs)
            self.weights = torch.tensor([weights], dtype=torch.float32)  # [S=1, R]
            self.member = torch.ones(1, len(self.funcs), dtype=torch.bool)  # [S=1, R]
            self.rows = rows
            self.source_of = [0] * len(rows)
        else:
            self.names = [s.name for s in config.sources]
            present = sorted({str(r.get("source")) for r in rows})
            by_name = {n: [r for r in rows if r.get("source") == n] for n in self.names}
            for n, part in by_name.items():
                if not part:
                    raise MixtureError(f"source {n!r} has no training rows (the rows' source column holds: "
                                       f"{', '.join(present)}); fix the source name or add its data")
            self.counts = allot_prompts([s.weight for s in config.sources], P)
            for s, n in zip(config.sources, self.counts):
                if n == 0:
                    raise MixtureError(f"source {s.name!r} (weight {s.weight}) gets 0 of the {P} prompts of a step; "
                                       "raise its weight or generation_batch_size / num_generations")
            entries: list[Any] = []
            keys: list[str] = []
            for s in config.sources:
                for e in s.reward_funcs:
                    key = _key(e)
                    if key not in keys:
                        keys.append(key)
                        entries.append(e)
            self.funcs, self.reward_names = resolve(entries)
            self.weights = torch.zeros(len(self.names), len(self.funcs))  # [S, R]; 0 = not this source's
            self.member = torch.zeros(len(self.names), len(self.funcs), dtype=torch.bool)  # [S, R]
            for i, s in enumerate(config.sources):
                for e, w in zip(s.reward_funcs, s.reward_weights or [1.0] * len(s.reward_funcs)):
                    self.weights[i, keys.index(_key(e))] = w
                    self.member[i, keys.index(_key(e))] = True
            self.rows = [r for n in self.names for r in by_name[n]]
            self.source_of = [i for i, n in enumerate(self.names) for _ in by_name[n]]
        self.offsets = [sum(self.counts[:i]) for i in range(len(self.counts))]
        firsts = [self.source_of.index(i) for i in range(len(self.names))]
        sizes = [self.source_of.count(i) for i in range(len(self.names))]
        self.first_row = firsts
        self.streams = [PromptStream(n, config.seed if len(self.names) == 1 else config.seed * 1_000 + i)
                        for i, n in enumerate(sizes)]
        self.prompts_per_step = P

    @property
    def mixed(self) -> bool:
        return self.names != [None]

    def rows_at(self, start: int, count: int) -> list[int]:
        """Indices into ``self.rows`` of stream positions ``start .. start + count - 1`` (module docstring)."""
        if not self.mixed:
            return self.streams[0].rows_at(start, count)
        out = []
        for p in range(start, start + count):
            block, offset = divmod(p, self.prompts_per_step)
            s = max(i for i, o in enumerate(self.offsets) if o <= offset)
            q = block * self.counts[s] + offset - self.offsets[s]
            out.append(self.first_row[s] + self.streams[s].rows_at(q, 1)[0])
        return out

    def source_index(self, row: dict[str, Any]) -> int:
        return 0 if not self.mixed else self.names.index(row.get("source"))

    def routes(self, rows: Sequence[dict[str, Any]]) -> list[list[int]]:
        """For each reward function, the indices of ``rows`` it scores (its own sources' rows)."""
        srcs = [self.source_index(r) for r in rows]
        return [[i for i, s in enumerate(srcs) if self.member[s, col]] for col in range(len(self.funcs))]

    def row_weights(self, rows: Sequence[dict[str, Any]], num_generations: int) -> torch.Tensor:
        """``[P*G, R]`` each completion's reward weights: its source's."""
        idx = torch.tensor([self.source_index(r) for r in rows]).repeat_interleave(num_generations)  # [P*G]
        return self.weights[idx]


def weighted_epoch(rows: list[dict[str, Any]], sources: Sequence[Any], seed: int) -> list[dict[str, Any]]:
    """An SFT epoch by source: ``len`` = the rows of the named sources, each source's share by weight
    (``allot_prompts``), filled by its rows in a seeded order, cycled when the share is larger than the source
    (``sources``: objects with ``name`` and ``weight``)."""
    by_name = {s.name: [r for r in rows if r.get("source") == s.name] for s in sources}
    for name, part in by_name.items():
        if not part:
            present = sorted({str(r.get("source")) for r in rows})
            raise MixtureError(f"source {name!r} has no SFT rows (the rows' source column holds: "
                               f"{', '.join(present)}); fix the source name or add its data")
    total = sum(len(part) for part in by_name.values())
    out: list[dict[str, Any]] = []
    for i, (s, n) in enumerate(zip(sources, allot_prompts([s.weight for s in sources], total))):
        stream = PromptStream(len(by_name[s.name]), seed * 1_000 + i)
        out += [by_name[s.name][j] for j in stream.rows_at(0, n)]
    return out


def _key(entry: Any) -> str:
    """A reward entry's identity within a mixture: a name, or a spec's ``name`` (its metric name); two sources
    naming one reward share it (``config.check_shared_reward_names`` refuses different entries under one name)."""
    if isinstance(entry, str):
        return entry
    name = getattr(entry, "name", None)
    return str(name) if name else repr(entry)


def source_labels(rows: Sequence[dict[str, Any]], num_generations: int) -> list[str]:
    """``[P*G]`` the source name of each completion (``source`` column; ``unknown`` when absent)."""
    return [str(r.get("source") or "unknown") for r in rows for _ in range(num_generations)]


def per_source_scale(advantages: torch.Tensor, rewards: torch.Tensor, labels: Sequence[str], eps: float = 1e-4
                     ) -> torch.Tensor:
    """``scale_rewards: batch`` within each source: centred advantages ``[B]`` divided by the std of the
    rewards ``[B]`` of the completion's own source."""
    out = advantages.clone()  # [B]
    for name in dict.fromkeys(labels):
        mask = torch.tensor([lab == name for lab in labels])  # [B]
        std = rewards[mask].std() if int(mask.sum()) > 1 else torch.tensor(0.0)
        out[mask] = advantages[mask] / (std + eps)
    return out


def source_reward_metrics(rewards: torch.Tensor, labels: Sequence[str], num_generations: int) -> dict[str, float]:
    """``rewards/{source}/mean`` and ``/std`` of the combined reward ``[B]`` over each source's completions,
    and ``mixture/{source}/prompts``, the source's prompts in the step."""
    out = {}
    for name in sorted(set(labels)):
        values = rewards[torch.tensor([lab == name for lab in labels])]  # [b]
        out[f"rewards/{name}/mean"] = values.mean().item()
        out[f"rewards/{name}/std"] = values.std().item() if values.numel() > 1 else 0.0
        out[f"mixture/{name}/prompts"] = values.numel() / num_generations
    return out


def source_group_metrics(train_rows: Sequence[dict[str, Any]], names: Sequence[str | None],
                         short: Sequence[int] | None, fell_back: bool = False) -> dict[str, float]:
    """``mixture/{source}/trained``: the groups of each source the step trained on (``train_rows``: one row per
    group), beside ``mixture/{source}/prompts`` (generated); with ``short`` (dynamic sampling, one per source of
    ``names``) ``mixture/{source}/short``: the groups its quota lacked. ``fell_back`` (dynamic sampling found no
    informative group, so the step trains on its flat first round: ``collect_step_groups``): those groups carry no
    advantage and are counted apart, as ``mixture/{source}/flat_fallback``, with ``trained`` 0. ``names``
    ``[None]``: one source, counted by the rows' source column, no quota beside the step's own."""
    kinds = ("trained", "flat_fallback") if fell_back else ("trained",)
    out = {f"mixture/{name}/{kind}": 0.0 for name in names if name is not None for kind in kinds}
    for label in source_labels(train_rows, 1):
        key = f"mixture/{label}/{kinds[-1]}"
        out[key] = out.get(key, 0.0) + 1
    if short is not None and names != [None]:
        out.update({f"mixture/{name}/short": float(n) for name, n in zip(names, short)})
    return out
