"""The writer's fence: the check every commit to a run runs first and again after it, in every process that writes
for the run's lease owner (``tasks/storage/commit.py``: a stage output's manifest, a checkpoint's ``_COMPLETE``, a
run file such as ``lineage.json``).

``tasks/storage/lease.py`` installs the check: the lease holder's own (``r1 run``, ``r1 stage``), or one that writes
on the holder's behalf (``fenced_as``: a stage dispatched to a worker, a training child, a follower node). The
owner's token crosses to child processes in ``OWNER_ENV`` / ``MODE_ENV`` (``fence_env``), so the training child's
checkpoints are fenced as its parent's commits are.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping

OWNER_ENV, MODE_ENV = "R1_LEASE_OWNER", "R1_LEASE_MODE"
HOLDER = "holder"  # the lease is held by this process or its parent: it must be in the store, ours, and fresh
DISPATCHED = "dispatched"  # a stage run for a pipeline on a worker: refused while another live writer holds the run
MODES = (HOLDER, DISPATCHED)

# A check raises to refuse the commit ``what``; else it returns until when (epoch seconds) the lease is surely
# ours, or None when it cannot say (a commit is then bounded by the store's own operation bound only).
Check = Callable[[str], "float | None"]


@dataclass(frozen=True)
class Fence:
    check: Check
    owner: str  # the lease token the commits are made for
    mode: str  # HOLDER or DISPATCHED


# (store URL, run) -> the fence of that run in this process.
_FENCES: dict[tuple[str, str], Fence] = {}


def set_fence(url: str, run: str, check: Check, owner: str, mode: str) -> None:
    """Make every commit to ``run`` in the store at ``url`` from this process call ``check(what)`` first."""
    _FENCES[(url, run)] = Fence(check, owner, mode)


def clear_fence(url: str, run: str, check: Check) -> None:
    """Remove ``check`` (only if it is still the one installed)."""
    if (fence := _FENCES.get((url, run))) is not None and fence.check == check:
        del _FENCES[(url, run)]


def check_fence(url: str, run: str, what: str) -> float | None:
    """Run the fence installed for ``run`` in the store at ``url`` (none: nothing to check) before committing
    ``what``; it raises to refuse the commit, else says until when the lease is surely ours (None: unknown)."""
    if (fence := _FENCES.get((url, run))) is not None:
        return fence.check(what)
    return None


def fence_env(url: str, run: str) -> dict[str, str]:
    """The variables a child process needs to fence its commits to ``run`` as this process does ({} when this
    process has no fence for it)."""
    if (fence := _FENCES.get((url, run))) is None:
        return {}
    return {OWNER_ENV: fence.owner, MODE_ENV: fence.mode}


def owner_from_env(env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(owner, mode) that a parent handed this process (``fence_env``), or None."""
    env = os.environ if env is None else env
    owner, mode = env.get(OWNER_ENV, "").strip(), env.get(MODE_ENV, "").strip() or HOLDER
    if not owner:
        return None
    if mode not in MODES:
        raise ValueError(f"{MODE_ENV}={mode!r} is not one of {', '.join(MODES)} (set by the process that started "
                         "this one; unset it with R1_LEASE_OWNER to run without a fence)")
    return owner, mode
