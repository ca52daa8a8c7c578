"""The writer's fence: the check every commit to a run runs first in this process (``Store``: a stage output's
manifest, a checkpoint's ``_COMPLETE``). ``tasks/storage/lease.py`` installs the run's lease check while it holds
the lease, so a writer that lost the run commits nothing.
"""

from __future__ import annotations

from typing import Callable

# (store URL, run) -> the check a commit to that run runs first, in this process: the run's lease
# (``tasks/storage/lease.py`` installs it while it holds the lease). It raises to refuse the commit.
_FENCES: dict[tuple[str, str], Callable[[str], None]] = {}


def set_fence(url: str, run: str, check: Callable[[str], None]) -> None:
    """Make every commit to ``run`` in the store at ``url`` from this process call ``check(what)`` first."""
    _FENCES[(url, run)] = check


def clear_fence(url: str, run: str, check: Callable[[str], None]) -> None:
    """Remove ``check`` (only if it is still the one installed)."""
    if _FENCES.get((url, run)) == check:
        del _FENCES[(url, run)]


def check_fence(url: str, run: str, what: str) -> None:
    """Run the fence installed for ``run`` in the store at ``url`` (none: nothing to check) before committing
    ``what``; it raises to refuse the commit."""
    if (check := _FENCES.get((url, run))) is not None:
        check(what)
