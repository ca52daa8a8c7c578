"""Relative data paths in a config file mean "next to the config file", wherever the command runs.

``data.train_sources[0].path: data/train.jsonl`` in ``/proj/configs/run.yaml`` is ``/proj/configs/data/train.jsonl``,
whether ``r1 run -c configs/run.yaml`` is typed in ``/proj`` or in ``/tmp``: a relative path that exists beside
the config is made absolute in the loaded config, so what a run records (and hands to a deployment) no longer
depends on the working folder. One that does not exist there is left as written: it may name a file on the
machine that runs the stage (a deployment's worker), or a hub dataset (``openai/gsm8k``); reading it, a path
with a data-file suffix that is not there fails naming the file (``grpo_core.data.rows.read_records``), never
as a Hub error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

DATA_SOURCE_LISTS = ("train_sources", "eval_sources", "cold_start_sources")


def _source_paths(data: Any) -> Iterator[tuple[tuple, dict[str, Any]]]:
    """``(yaml location of the path field, the source mapping)`` for each data source with a string ``path``."""
    section = data.get("data") if isinstance(data, dict) else None
    if not isinstance(section, dict):
        return
    for key in DATA_SOURCE_LISTS:
        sources = section.get(key)
        if not isinstance(sources, list):
            continue
        for i, src in enumerate(sources):
            if isinstance(src, dict) and isinstance(src.get("path"), str):
                yield ("data", key, i, "path"), src


def resolve_data_paths(data: Any, config_dir: Path) -> None:
    """Make the relative paths of ``data``'s sources that exist beside the config absolute (in place)."""
    for _, src in _source_paths(data):
        raw = src["path"]
        if "://" in raw or Path(raw).is_absolute():
            continue
        beside = (config_dir / Path(raw).expanduser()).resolve()
        if beside.exists():
            src["path"] = str(beside)
