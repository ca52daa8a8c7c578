"""A stage attempt's local scratch folder, and the sweep that removes those whose process is gone.

    {R1_WORKDIR or $TMPDIR/r1-work}/{run}/{stage}/{pid}-{random}/      (evaluate: {run}/evaluate/{stage}/...)
        .r1-owner.json     the process that made it (``tasks/storage/owner.py``: host, pid, pid namespace, start time)

A stage removes its folder when it ends, failed or not; a process killed by ``kill -9`` (or the OOM killer)
cannot, and the folder can hold a full checkpoint. So each new folder is made after a sweep that removes
every folder under the same base whose owner ran on this host and is gone. A live writer's folder, another
host's (a shared R1_WORKDIR) and anything without an owner file are left alone.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from tasks.storage.owner import process_gone, this_process

OWNER = ".r1-owner.json"
_DEPTHS = ("*/*/*/" + OWNER, "*/*/*/*/" + OWNER)  # {run}/{stage}/{attempt}, {run}/evaluate/{stage}/{attempt}

log = logging.getLogger("r1.scratch")


def sweep_scratch(base: Path) -> list[Path]:
    """Remove the attempt folders under ``base`` whose owner process is gone (this host only); returns them."""
    removed = []
    for marker in (m for pattern in _DEPTHS for m in Path(base).glob(pattern)):
        try:
            owner = json.loads(marker.read_text())
        except (OSError, ValueError):
            continue  # being written, or removed by another sweep
        if isinstance(owner, dict) and process_gone(owner):
            shutil.rmtree(marker.parent, ignore_errors=True)
            removed.append(marker.parent)
    if removed:
        log.warning("removed %d scratch folder(s) left by processes that are gone: %s", len(removed),
                    ", ".join(str(p) for p in removed))
    return removed


def new_scratch(base: Path, run: str, stage: str) -> Path:
    """A fresh folder for one attempt of ``stage`` (a retry reads from the store, not from a previous attempt),
    after sweeping the folders dead processes left under ``base``."""
    sweep_scratch(base)
    work = Path(base) / run / stage / f"{os.getpid()}-{os.urandom(3).hex()}"
    work.mkdir(parents=True)
    (work / OWNER).write_text(json.dumps(this_process()))
    return work
