"""What prepare_data reads besides its config: the content of its local data files and the revision of its hub
data sets, as a part of prepare_data's fingerprint (``tasks.runner.common.stage_task``'s ``inputs``).

Without it a data file edited in place (every answer changed, same run name and config) was "reused": the
fingerprint held the config's paths, not what the paths hold. Here each local source (``data.train_sources``,
``eval_sources``, and ``cold_start_sources``: a file source's file, a trace set's file, a teacher's ``prompts``
file) counts by the sha256 of its bytes; a folder by every file in it (relative name and sha256). A file is read
once per change (``file_hashes.py``), so a run that fingerprints twice reads each file once.

A hub data set counts by the revision its local cache resolved last: the commit in the hub cache's
``refs/<revision>`` (``HF_HUB_CACHE/datasets--org--name/refs/main``), else the newest version folder of the
``datasets`` cache (``HF_DATASETS_CACHE/org___name/<config>/<version>/<hash>``). Neither is asked of the hub
(no network before a stage), so a hub data set that changed since the cache last loaded it, or one never
loaded here (only its name counts then), is seen on the next run after the cache has the new revision.
A teacher source's model folder counts as every model folder a stage's config names does
(``tasks.config.fingerprint_fields``); a ``run:RUN/STAGE`` teacher is a parent with its version.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from grpo_core.config import DataConfig, DatasetSource, TeacherSource, TraceSource
from tasks.storage.file_hashes import file_sha256


# Since issue 42 the built-in tasks hold out problems up to their symmetries (countdown's numbers in any order, a
# chain's commuting first pair), where before only the exact prompt string was held out: a store's prepare_data of
# a built-in task made before then rebuilds once instead of being reused with held-out problems in its training rows.
BUILTIN_HELD_OUT = "by canonical problem"


def data_inputs(data: DataConfig) -> dict[str, Any]:
    """``{"data.train_sources.0": {"path": ..., "sha256": ...}, ...}`` for every source ``data`` names, and for the
    built-in verifiable tasks how their held-out rows are kept apart (``BUILTIN_HELD_OUT``)."""
    named: list[tuple[str, DatasetSource | TraceSource | TeacherSource]] = [
        *((f"train_sources.{i}", s) for i, s in enumerate(data.train_sources)),
        *((f"eval_sources.{i}", s) for i, s in enumerate(data.eval_sources)),
        *((f"cold_start_sources.{i}", s) for i, s in enumerate(data.cold_start_sources))]
    out = {}
    for where, src in named:
        if isinstance(src, TeacherSource):
            if src.prompts is None:
                continue
            where, src = f"{where}.prompts", src.prompts
        location, name = (src.dataset, src.name) if isinstance(src, TraceSource) else (src.path, src.name)
        out[f"data.{where}"] = source_identity(location, name)
    if data.builtin_task is not None or data.countdown is not None:
        out["data.builtin_held_out"] = BUILTIN_HELD_OUT
    return out


def source_identity(location: str, config_name: str | None = None) -> dict[str, Any]:
    """A local file's or folder's content hash, or a hub data set's cached revision (None when not cached)."""
    path = Path(location).expanduser()
    if path.is_file():
        return {"path": location, "sha256": file_sha256(path)}
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
        return {"path": location, "files": {p.relative_to(path).as_posix(): file_sha256(p) for p in files}}
    return {"hub": location, "config": config_name, "revision": cached_revision(location, config_name)}


def cached_revision(name: str, config_name: str | None = None) -> str | None:
    """The revision of hub data set ``name`` that the local caches hold (module docstring), or None."""
    try:
        from huggingface_hub import constants

        ref = Path(constants.HF_HUB_CACHE) / f"datasets--{name.replace('/', '--')}" / "refs" / "main"
        if ref.is_file():
            return ref.read_text().strip() or None
    except ImportError:
        pass
    org, _, short = name.rpartition("/")
    try:
        from datasets.naming import camelcase_to_snakecase

        short = camelcase_to_snakecase(short)  # as load_dataset names its cache folder
    except ImportError:
        short = short.lower()
    root = Path(os.environ.get("HF_DATASETS_CACHE") or Path(os.environ.get("HF_HOME") or
                Path.home() / ".cache" / "huggingface") / "datasets")
    folder = root / (f"{org}___{short}" if org else short) / (config_name or "default")
    versions = [p for p in folder.glob("*/*") if p.is_dir()] if folder.is_dir() else []
    return max(versions, key=lambda p: p.stat().st_mtime_ns).name if versions else None
