"""Seeds derived from the run's seed: ``derive_seed(seed, *keys)``, one scheme for every new stream.

A derived seed is a pure function of the run's ``seed`` and integer keys that name what is seeded (numpy's
``SeedSequence`` hashes them: no two key tuples collide in practice, unlike ``seed + offset``), never of a rank,
a batch slot or a wall clock; so results do not depend on batching, process count or resume. Used by the GRPO
trainer: a completion's sampling seed is ``derive_seed(seed, step, stream position, j)`` and the prompt stream's
epoch ``e`` is shuffled by ``seeded_rng(seed, e)`` (``generation/prompts.py``).

Recorded streams kept for reproducibility. These predate ``derive_seed``; converting them would change the
embedded default's data and every number in the README's learning table, so they stay as they are:

- additive offsets: ``recipe/prepare.py`` (cold-start ``10_000 + seed``, preference pairs ``20_000 + seed``,
  pretraining ``30_000 + seed`` / ``40_000 + seed``), ``data/synthetic.py`` and ``data/general.py`` (the eval
  split's ``2 * seed + 1``), ``trainer/mixture.py`` (source ``i``'s prompt stream ``seed * 1_000 + i``);
- sha256: ``evaluation/heldout.py`` ``sample_seed(seed, row_id, j)`` (evaluation, rejection sampling, teacher
  sampling: keyed by a row id string, not an integer) and the split order in ``recipe/prepare.py``;
- ``random.Random(seed)`` / ``random.Random(f"{source}:{seed}")``: ``data/synthetic.py``, ``data/general.py``,
  ``recipe/consolidation.py``, ``trainer/reward_model.py``.
"""

from __future__ import annotations

import numpy as np


def derive_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed for the stream named by ``keys`` (non-negative ints) of a run seeded with ``seed``."""
    return int(np.random.SeedSequence([seed, *keys]).generate_state(1, dtype=np.uint64)[0] >> 1)


def seeded_rng(seed: int, *keys: int) -> np.random.Generator:
    """A numpy generator for the stream named by ``keys``: the same ``SeedSequence([seed, *keys])`` as
    ``derive_seed``, handed to numpy whole rather than cut to one integer."""
    return np.random.default_rng([seed, *keys])
