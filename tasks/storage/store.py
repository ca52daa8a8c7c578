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

What a manifest holds, its checks and ``StageRef`` are in ``tasks/storage/manifest.py`` (no I/O).

Every commit to a run (a manifest, a checkpoint's ``_COMPLETE``, a run file such as ``lineage.json``) goes through
the run's fence (``tasks/storage/fence.py``, installed by ``tasks/storage/lease.py`` in every process that writes for
the lease's owner), checked before and after the write, which is undone when the run was lost meanwhile
(``tasks/storage/commit.py``); the lease itself is written by compare-and-swap (``write_if``).
Every S3 operation as a whole is bounded by R1_S3_READ_TIMEOUT (``_bounded``; see ``tasks/storage/s3_settings.py``).

Readers only see committed versions; an output whose writer died before its manifest is ignored (and the
writer deletes it on a clean failure), and so is a version whose manifest cannot be read (truncated, not
JSON; logged with its path).

Trust: every file read from a committed output (``get_output``, ``read_output``) or a checkpoint
(``get_checkpoint``) is checked against the size and sha256 its manifest (or ``_COMPLETE``) lists, hashed
while it streams to disk; a mismatch raises ``IntegrityError`` (not retried) naming the file, both hashes
and the stage to rerun. A file already verified in this process is not hashed again while the store
reports the same identity for it (size + mtime/ctime/inode locally, ETag on S3).

Relocatable: manifests and ``StageRef`` hold store-relative paths (``run/stage/version``), resolved
against the store they are read from, so a store folder copied, moved or synced to S3 works where it lands.

Files stream between disk and store (s3fs switches to multipart uploads for large files), with no extra
local copy; sha256 is computed from the local file before uploading, and from the bytes as they arrive
while downloading (no second pass over a downloaded file).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import io
import json
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import fsspec
import fsspec.asyn

# StoreError, TransientStoreError and IntegrityError are defined beside StageRef (which raises them too);
# callers import them from here, with the Store that raises them.
from tasks.storage.deadline import Progress, Stalled, call_within
from tasks.storage.commit import (MANIFEST, FileLock, StageWriter, WriteConflict, commit_json,
                                  precondition_failed, replace_file)
from tasks.storage.fence import check_fence
from tasks.storage.manifest import (IntegrityError, StageRef, StoreError, TransientStoreError,  # noqa: F401 - re-exported
                                    check_manifest, ref_from_manifest, rerun_hint, sha256_file, utc_now)
from tasks.storage.s3_settings import S3_TRIES, StoreStalled, explain, s3_options, s3_timeouts, stalled

CHECKPOINTS = "_checkpoints"
COMPLETE = "_COMPLETE"
DEFAULT_ROOT = "./r1-runs"
CHUNK = 8 << 20  # bytes per read while downloading and hashing

log = logging.getLogger("r1.store")
# (uri, sha256) -> the store's identity of the file when its bytes were last hashed and matched; a file
# fetched again with the same identity is copied without hashing it again.
_VERIFIED: dict[tuple[str, str], tuple[Any, ...]] = {}


def new_version() -> str:
    """A new output version: UTC time + random (sorts by time)."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ") + "-" + secrets.token_hex(3)


class Store:
    """Stage outputs and checkpoints of runs under one root URL (a folder or ``s3://bucket[/prefix]``; None:
    ``$R1_STORE``, else ``./r1-runs``); files are checked against their manifest as they are read."""

    def __init__(self, root: str | os.PathLike[str] | None = None, *, check: bool = True) -> None:
        root = str(root or os.environ.get("R1_STORE") or DEFAULT_ROOT)
        protocol = fsspec.utils.get_protocol(root)
        if protocol in ("file", "local"):
            root = str(Path(fsspec.utils.stringify_path(root).removeprefix("file://")).expanduser().resolve())
        self.protocol = protocol
        self.timeouts = s3_timeouts() if protocol in ("s3", "s3a") else {}
        self.fs, self.root = self._filesystem(root)
        self.url = root if protocol in ("file", "local") else f"{protocol}://{self.root}"
        if check:
            self.check()

    def _filesystem(self, root: str, attempts: int | None = None) -> tuple[Any, str]:
        options = s3_options(self.timeouts, attempts) if self.timeouts else {}
        try:
            fs, path = fsspec.url_to_fs(root, **options)
        except (ImportError, ValueError) as e:
            raise StoreError(f"store URL {root!r} is not usable: {e}") from None
        if self.timeouts:
            fs.retries = 1 if attempts == 1 else S3_TRIES
        return fs, path

    # ---- errors -------------------------------------------------------------------------------------
    def _explain(self, e: BaseException, action: str) -> StoreError:
        """One line that says what failed and where, never credentials (``s3_settings.explain``)."""
        return explain(e, action, self.url, self.timeouts)

    def _stalled(self, action: str) -> StoreError:
        return stalled(action, self.url, self.timeouts)

    def _bounded(self, action: str, fn: Callable[[], Any], progress: Progress | None = None, *,
                 limit_s: float | None = None, on_abandoned: Callable[[], None] | None = None) -> Any:
        """``fn()`` within R1_S3_READ_TIMEOUT as a whole (per stretch without ``progress`` for a transfer; within
        ``limit_s`` when that is shorter), or ``StoreStalled`` naming the endpoint, the store, ``action`` and the
        variable; ``on_abandoned``: see ``call_within``. Local stores: unbounded."""
        if not self.timeouts:
            return fn()
        limit = self.timeouts["read"] if limit_s is None else min(limit_s, self.timeouts["read"])
        try:
            return call_within(limit, fn, progress, on_abandoned)
        except Stalled:
            if limit < self.timeouts["read"]:
                raise StoreStalled(f"{action} in {self.url} did not finish within {limit:.3g} s, the time this "
                                   "writer's lease on the run had left; it is undone when it ends") from None
            raise self._stalled(action) from None

    def check(self) -> None:
        """Fail fast if the root cannot be listed or created: on S3 one try, so an endpoint that never
        answers fails within connect + read timeout, not after every retry."""
        try:
            if self.protocol.startswith("s3"):
                bucket = self.root.split("/", 1)[0]
                fs = self._filesystem(self.url, attempts=1)[0]
                self._bounded("opening the store", lambda: fs.ls(bucket, refresh=True))
            else:
                self.fs.makedirs(self.root, exist_ok=True)
        except Exception as e:  # noqa: BLE001 - every backend error becomes one clear line
            raise self._explain(e, "opening the store") from None

    # ---- paths --------------------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *[p.strip("/") for p in parts if p]])

    def uri(self, path: str) -> str:
        return path if self.protocol in ("file", "local") else f"{self.protocol}://{path}"

    def uri_of(self, rel: str) -> str:
        """The URI of a store-relative path (a ``StageRef.path``) in this store."""
        return self.uri(self.path(rel))

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
        dest, action = self._strip(dest), f"uploading {Path(local).name}"
        progress = Progress()

        def upload() -> None:
            self.fs.makedirs(dest.rsplit("/", 1)[0], exist_ok=True)
            if self.timeouts:  # parts of CHUNK bytes (at most 10,000 parts): progress every few seconds
                size = Path(local).stat().st_size
                chunk = max(CHUNK, -(-size // 10_000))
                self.fs.put_file(str(local), dest, callback=_Ticks(progress), chunksize=chunk)
            else:
                self.fs.put_file(str(local), dest)

        try:
            self._bounded(action, upload, progress)
        except Exception as e:  # noqa: BLE001
            raise self._explain(e, action) from None

    def _identity(self, rpath: str) -> tuple[Any, ...]:
        """What changes when the file's bytes are replaced: ETag on S3; size, mtime, ctime, inode locally.
        Asked of the store itself, never of a cached listing."""
        self.fs.invalidate_cache(rpath)
        info = self.fs.info(rpath)
        keys = ("ETag", "LastModified") if self.protocol.startswith("s3") else ("mtime", "created", "ino")
        return (info.get("size"), *(str(info.get(k)) for k in keys))

    def _get_verified(self, rpath: str, dest: Path, expected: dict[str, Any], fix: str) -> float:
        """Download ``rpath`` to ``dest``, hashing the bytes as they are written; raise ``IntegrityError``
        unless size and sha256 match ``expected``. Returns the seconds spent hashing."""
        uri, want = self.uri(rpath), expected["sha256"]
        dest.parent.mkdir(parents=True, exist_ok=True)
        progress = Progress()

        def download() -> tuple[Any, int, str, float]:
            hashed = 0.0
            ident = self._identity(rpath)
            progress.tick()
            if _VERIFIED.get((uri, want)) == ident:  # these exact bytes were verified in this process
                if self.timeouts:
                    self.fs.get_file(rpath, str(dest), callback=_Ticks(progress), chunksize=CHUNK)
                else:
                    self.fs.get_file(rpath, str(dest))
                size, actual = dest.stat().st_size, want
                progress.tick()
                if self._identity(rpath) != ident:  # replaced while copying: hash what was copied
                    hashed, actual = _timed_sha256(dest)
            else:
                size, actual, hashed = self._stream_hashed(rpath, dest, progress)
            return ident, size, actual, hashed

        try:
            ident, size, actual, hashed = self._bounded(f"downloading {uri}", download, progress)
        except FileNotFoundError:
            raise IntegrityError(f"{uri} is missing but its manifest lists it; {fix}") from None
        except Exception as e:  # noqa: BLE001
            raise self._explain(e, f"downloading {uri}") from None
        if size != expected["size"] or actual != want:
            dest.unlink(missing_ok=True)
            _VERIFIED.pop((uri, want), None)
            what = (f"size {size} bytes, manifest says {expected['size']}" if size != expected["size"]
                    else f"sha256 {actual}, manifest says {want}")
            raise IntegrityError(f"{uri} does not match its manifest ({what}): it was modified or damaged "
                                 f"after it was written; {fix}")
        _VERIFIED[(uri, want)] = ident
        return hashed

    def _stream_hashed(self, rpath: str, dest: Path, progress: Progress | None = None) -> tuple[int, str, float]:
        """(size, sha256, hashing seconds) of the bytes copied from ``rpath`` to ``dest`` in one pass."""
        h, size, hashed = hashlib.sha256(), 0, 0.0
        tick = progress.tick if progress is not None else lambda: None
        with self.fs.open(rpath, "rb", block_size=CHUNK) as src, open(dest, "wb") as out:
            while block := src.read(CHUNK):
                tick()
                t = time.perf_counter()
                h.update(block)
                hashed += time.perf_counter() - t
                out.write(block)
                size += len(block)
        return size, h.hexdigest(), hashed

    def get_output(self, ref: "StageRef", name: str, dest: Path) -> Path:
        """Download file or folder ``name`` of the committed output ``ref`` (resolved in this store) into
        ``dest``: only the files its manifest lists, each checked against the manifest's size and sha256."""
        files = self.manifest(ref).get("files") or {}
        wanted = {rel: info for rel, info in files.items() if rel == name or rel.startswith(f"{name}/")}
        fix = rerun_hint(ref)
        if not wanted:
            raise IntegrityError(f"{self.uri_of(ref.path)} has no {name!r} in its manifest; {fix}")
        hashed = 0.0
        for rel, info in sorted(wanted.items()):
            if rel.startswith("/") or ".." in rel.split("/"):  # a manifest never names a file outside its output
                raise IntegrityError(f"{self.uri_of(ref.path)}/{MANIFEST} lists {rel!r}, outside the output; {fix}")
            target = dest if rel == name else dest / rel[len(name) + 1:]
            hashed += self._get_verified(self.path(ref.path, rel), target, info, fix)
        log.debug("verified %d file(s) of %s/%s (%.3f s hashing)", len(wanted), ref.path, name, hashed)
        return dest

    def read_output(self, ref: "StageRef", name: str) -> bytes:
        """The bytes of file ``name`` of the committed output ``ref``, checked against its manifest;
        FileNotFoundError when the manifest lists no such file."""
        info = (self.manifest(ref).get("files") or {}).get(name)
        if info is None:
            raise FileNotFoundError(f"{ref.path}/{name}")
        path = self.path(ref.path, name)
        try:
            data = self._read_bytes(path)
        except FileNotFoundError:
            raise IntegrityError(f"{self.uri(path)} is missing but its manifest lists it; {rerun_hint(ref)}") from None
        except Exception as e:  # noqa: BLE001
            raise self._explain(e, f"reading {path}") from None
        actual = hashlib.sha256(data).hexdigest()
        if len(data) != info["size"] or actual != info["sha256"]:
            raise IntegrityError(f"{self.uri(path)} does not match its manifest (sha256 {actual}, manifest says "
                                 f"{info['sha256']}): it was modified or damaged after it was written; "
                                 f"{rerun_hint(ref)}")
        return data

    def _read(self, path: str, parse: Callable[[Any], Any]) -> Any:
        """``parse(binary file)`` of ``path``; FileNotFoundError when it does not exist, any other failure
        (the read or the parse) one store error naming the path."""
        progress = Progress()

        def read() -> bytes:
            with self.fs.open(self._strip(path), "rb", block_size=CHUNK) as f:
                blocks = []
                while block := f.read(CHUNK):
                    progress.tick()
                    blocks.append(block)
                return b"".join(blocks)

        for attempt in range(3):
            try:
                return parse(io.BytesIO(self._bounded(f"reading {path}", read, progress)))
            except FileNotFoundError:
                raise
            except Exception as e:  # noqa: BLE001
                if type(e).__name__ == "FileExpired" and attempt < 2:  # s3fs: rewritten while read (a heartbeat)
                    continue
                raise self._explain(e, f"reading {path}") from None

    def read_json(self, path: str) -> dict[str, Any]:
        return self._read(path, json.load)

    def _read_bytes(self, path: str) -> bytes:
        return self._read(path, lambda f: f.read())

    def read_text(self, path: str) -> str:
        """A text file's content; FileNotFoundError when it does not exist."""
        return self._read(path, lambda f: f.read().decode("utf-8"))

    def write_json(self, path: str, obj: dict[str, Any]) -> None:
        """Write one JSON object atomically (S3 puts are atomic; locally write-then-rename)."""
        data = json.dumps(obj, indent=2, sort_keys=True, default=str)
        path = self._strip(path)
        try:
            if self.protocol in ("file", "local"):
                replace_file(Path(path), data.encode())
            else:
                self._bounded(f"writing {path}", lambda: self.fs.pipe_file(path, data.encode()))
        except Exception as e:  # noqa: BLE001
            raise self._explain(e, f"writing {path}") from None

    def exists(self, path: str) -> bool:
        try:
            return self._bounded(f"checking {path}", lambda: self.fs.exists(self._strip(path)))
        except Exception as e:  # noqa: BLE001
            raise self._explain(e, f"checking {path}") from None

    def _ls(self, path: str) -> list[str]:
        try:
            self.fs.invalidate_cache(path)
            names = self._bounded(f"listing {path}", lambda: self.fs.ls(path, detail=False))
            return [p.rstrip("/").rsplit("/", 1)[-1] for p in names]
        except FileNotFoundError:
            return []
        except Exception as e:  # noqa: BLE001
            raise self._explain(e, f"listing {path}") from None

    def remove(self, path: str) -> None:
        def rm() -> None:
            self.fs.invalidate_cache()
            if self.fs.exists(self._strip(path)):
                self.fs.rm(self._strip(path), recursive=True)

        try:
            self._bounded(f"removing {path}", rm)
        except Exception:  # noqa: BLE001 - best effort cleanup of uncommitted output
            pass

    # ---- conditional writes: the lease's compare-and-swap, commits (tasks/storage/commit.py) ----------------
    def tag_of(self, data: bytes) -> str:
        """The tag ``read_tagged`` gives a file holding ``data``: its S3 ETag (a single PUT's MD5), locally sha256."""
        return f'"{hashlib.md5(data).hexdigest()}"' if self.timeouts else hashlib.sha256(data).hexdigest()

    def read_tagged(self, path: str) -> tuple[bytes, str]:
        """A file's bytes and tag in one request (no HEAD first: s3fs's open fails with FileExpired when the file
        is rewritten between its HEAD and its GET); FileNotFoundError when it does not exist."""
        path = self._strip(path)
        if not self.timeouts:
            data = Path(path).read_bytes()
            return data, self.tag_of(data)
        bucket, key, _ = self.fs.split_path(path)

        async def get() -> tuple[bytes, str]:
            resp = await self.fs._call_s3("get_object", Bucket=bucket, Key=key)
            async with resp["Body"] as body:
                return await body.read(), resp["ETag"]

        try:
            return self._bounded(f"reading {path}", lambda: fsspec.asyn.sync(self.fs.loop, get))
        except FileNotFoundError:
            raise
        except Exception as e:  # noqa: BLE001
            raise self._explain(e, f"reading {path}") from None

    def write_if(self, path: str, data: bytes, tag: str | None, *, limit_s: float | None = None,
                 on_abandoned: Callable[[], None] | None = None) -> str:
        """Write ``data`` only if the file's tag is still ``tag`` (None: only if there is no file); its new tag, or
        ``WriteConflict``. S3: ``If-Match`` / ``If-None-Match``; locally under a lock on ``{root}/.r1-lock``.
        ``limit_s``: a bound shorter than R1_S3_READ_TIMEOUT; ``on_abandoned``: see ``deadline.call_within``."""
        path = self._strip(path)
        if not self.timeouts:
            with FileLock(Path(self.root) / ".r1-lock"):
                if _local_tag(path) != tag:
                    raise WriteConflict(f"{path} changed since it was read")
                replace_file(Path(path), data)
            return self.tag_of(data)
        cond = {"IfMatch": tag} if tag is not None else {"mode": "create"}
        try:
            out = self._bounded(f"writing {path}", lambda: self.fs.pipe_file(path, data, **cond), limit_s=limit_s,
                                on_abandoned=on_abandoned)
        except Exception as e:  # noqa: BLE001
            if precondition_failed(e):
                raise WriteConflict(f"{self.uri(path)} changed since it was read") from None
            raise self._explain(e, f"writing {path}") from None
        return str((out or {}).get("ETag") or self.tag_of(data))

    def remove_if(self, path: str, tag: str) -> bool:
        """Delete the file only if its tag is still ``tag``; False when it is not (or it is gone)."""
        path = self._strip(path)
        if not self.timeouts:
            with FileLock(Path(self.root) / ".r1-lock"):
                if _local_tag(path) != tag:
                    return False
                Path(path).unlink()
                return True
        bucket, key, _ = self.fs.split_path(path)
        try:
            self._bounded(f"removing {path}", lambda: self.fs.call_s3("delete_object", Bucket=bucket, Key=key,
                                                                       IfMatch=tag))
        except Exception as e:  # noqa: BLE001
            if isinstance(e, FileNotFoundError) or precondition_failed(e):
                return False
            raise self._explain(e, f"removing {path}") from None
        self.fs.invalidate_cache(path)
        return True

    # ---- stage outputs ------------------------------------------------------------------------------
    def begin(self, run: str, stage: str, version: str | None = None) -> "StageWriter":
        """A writer of a new output of ``stage``; ``version``: one drawn earlier with ``new_version`` (a training
        stage names it in its trackers' lineage before it commits), else a new one."""
        return StageWriter(self, run, stage, version or new_version())

    def runs(self) -> list[str]:
        return sorted(n for n in self._ls(self.root) if not n.startswith((".", "_")))

    def latest(self, run: str, stage: str, fingerprint: str | None = None, *,
               where: Callable[[dict[str, Any]], bool] | None = None) -> StageRef | None:
        """The newest committed output of ``stage`` (with that fingerprint, and whose manifest satisfies
        ``where``, if given); manifests are read newest first, only until one matches."""
        for m in self._committed(run, stage, newest_first=True):
            if (fingerprint is None or m.get("fingerprint") == fingerprint) and (where is None or where(m)):
                return ref_from_manifest(m, self.url)
        return None

    def _committed(self, run: str, stage: str, newest_first: bool = False) -> Iterator[dict[str, Any]]:
        """Manifests of committed versions, read one at a time (a version without one is uncommitted, and so
        is one whose manifest cannot be read: it is skipped and logged)."""
        for version in sorted(self._ls(self.path(run, stage)), reverse=newest_first):
            if version.startswith(("_", ".")):
                continue
            path = self.path(run, stage, version, MANIFEST)
            try:
                data = self._read_bytes(path)
            except FileNotFoundError:
                continue
            try:
                m = json.loads(data)
                check_manifest(m, f"{run}/{stage}/{version}")
            except (ValueError, KeyError, TypeError) as e:
                log.warning("skipping %s: unreadable manifest (%s); treated as uncommitted", self.uri(path),
                            f"{type(e).__name__}: {e}"[:200])
                continue
            yield m

    def manifest(self, ref: StageRef) -> dict[str, Any]:
        """The manifest of ``ref``'s output in this store."""
        try:
            data = self._read_bytes(self.path(ref.path, MANIFEST))
        except FileNotFoundError:
            raise IntegrityError(f"{self.uri_of(ref.path)} has no {MANIFEST}: not committed in {self.url}; "
                                 f"{rerun_hint(ref)}") from None
        try:
            m = json.loads(data)
            check_manifest(m, ref.path)
        except (ValueError, KeyError, TypeError) as e:
            raise IntegrityError(f"{self.uri_of(ref.path)}/{MANIFEST} is unreadable "
                                 f"({type(e).__name__}: {str(e)[:200]}); {rerun_hint(ref)}") from None
        return m

    # ---- multi-node launches -----------------------------------------------------------------------------
    def node_spec_path(self, rdzv_id: str) -> str:
        """Where node 0 of a multi-node training stage leaves its training spec for the other nodes
        (``_nodes/{rdzv_id}.json``; ``runs()`` skips names starting with ``_``)."""
        return self.path("_nodes", f"{rdzv_id}.json")

    # ---- the run's own files ----------------------------------------------------------------------------
    def write_run_file(self, run: str, name: str, obj: dict[str, Any]) -> str:
        """A run-level JSON file (e.g. the resolved pipeline config a run was started with, ``lineage.json``): a
        commit to the run, under its fence."""
        path = self.path(run, "_run", name)
        commit_json(self, run, path, obj, f"run file {name}")
        return self.uri(path)

    def read_run_file(self, run: str, name: str) -> dict[str, Any] | None:
        try:
            return self.read_json(self.path(run, "_run", name))
        except FileNotFoundError:
            return None

    def run_file(self, run: str, name: str) -> str:
        """The path of a run-level file (``{run}/_run/{name}``)."""
        return self.path(run, "_run", name)

    def remove_run_file(self, run: str, name: str) -> None:
        """Delete a run-level file; locally also the folders it leaves empty (a run is listed while its
        folder exists)."""
        path = self.run_file(run, name)
        self.remove(path)
        if self.protocol in ("file", "local"):
            for folder in (Path(path).parent, Path(path).parent.parent):
                try:
                    folder.rmdir()
                except OSError:  # not empty (or already gone)
                    break

    def uncommitted(self, run: str, stage: str) -> list[str]:
        """Version folders without a readable manifest (a writer still running, one that died, a damaged
        manifest) and checkpoint keys."""
        names = [n for n in self._ls(self.path(run, stage)) if not n.startswith(("_", "."))]
        committed = {m["version"] for m in self._committed(run, stage)}  # readable manifests only
        out = [n for n in names if n not in committed]
        return out + [f"{CHECKPOINTS}/{k}" for k in self._ls(self.path(run, stage, CHECKPOINTS))]

    # ---- checkpoints --------------------------------------------------------------------------------
    def checkpoint_dir(self, run: str, stage: str, key: str) -> str:
        return self.path(run, stage, CHECKPOINTS, key)

    def put_checkpoint(self, run: str, stage: str, key: str, step: int, local_dir: Path) -> str:
        dest = self.path(run, stage, CHECKPOINTS, key, f"checkpoint-{step}")
        check_fence(self.url, run, f"{stage} checkpoint {step}")  # a writer that lost the run uploads nothing
        files = self.put_dir(local_dir, dest)
        commit_json(self, run, f"{dest}/{COMPLETE}", {"step": step, "files": files, "created": utc_now()},
                    f"{stage} checkpoint {step}")
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

    def get_checkpoint(self, uri: str, local_dir: Path) -> Path:
        """Download a complete checkpoint (``latest_checkpoint``'s URI), each file checked against the
        sizes and sha256 in its ``_COMPLETE`` marker."""
        path = self._strip(uri).rstrip("/")
        files = self.read_json(f"{path}/{COMPLETE}").get("files") or {}
        run, stage = path[len(self.root.rstrip("/")) + 1:].split("/")[:2]
        fix = (f"delete {uri} to resume from the checkpoint before it (or start the stage over: "
               f"`r1 stage {stage} --run {run}`)")
        for rel, info in sorted(files.items()):
            if rel.startswith("/") or ".." in rel.split("/"):
                raise IntegrityError(f"{uri}/{COMPLETE} lists {rel!r}, outside the checkpoint; {fix}")
            self._get_verified(f"{path}/{rel}", Path(local_dir) / rel, info, fix)
        return Path(local_dir)

    def checkpoint_uri(self, run: str, stage: str, key: str, step: int) -> str | None:
        """The URI of the complete checkpoint at ``step``, or None."""
        path = f"{self.checkpoint_dir(run, stage, key)}/checkpoint-{step}"
        return self.uri(path) if self.exists(f"{path}/{COMPLETE}") else None

    def prune_checkpoints(self, run: str, stage: str, key: str, keep: int, protect: tuple[int, ...] = ()) -> None:
        """Keep the newest ``keep`` complete checkpoints and the complete ones at the steps in ``protect`` (the one
        ``select_checkpoint: heldout`` would commit); remove older ones and every partial one (no ``_COMPLETE``:
        an upload cut short by a full disk, a lost connection or a kill). Called by the one writer of the stage
        right after it completed a checkpoint, so no partial one is still being written. A partial checkpoint is
        never counted as kept: one of a higher step would otherwise push the last complete one out."""
        base = self.checkpoint_dir(run, stage, key)
        steps = sorted(int(n.split("-")[1]) for n in self._ls(base) if n.startswith("checkpoint-"))
        complete = [s for s in steps if self.exists(f"{base}/checkpoint-{s}/{COMPLETE}")]
        kept = (set(complete[-keep:]) if keep > 0 else set()) | (set(protect) & set(complete))
        for step in steps:
            if step not in kept:
                self.remove(f"{base}/checkpoint-{step}")


class _Ticks(fsspec.callbacks.Callback):
    """An fsspec transfer callback that ticks ``progress`` as parts finish."""

    def __init__(self, progress: Progress) -> None:
        super().__init__()
        self.progress = progress

    def call(self, *args: Any, **kwargs: Any) -> None:
        self.progress.tick()


def _local_tag(path: str) -> str | None:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if os.path.exists(path) else None


def _timed_sha256(path: Path) -> tuple[float, str]:
    t = time.perf_counter()
    digest = sha256_file(path)
    return time.perf_counter() - t, digest
