"""Commits to a run: a stage output's writer, and the fenced write every commit goes through.

A commit (a stage output's ``manifest.json``, a checkpoint's ``_COMPLETE``, a run file such as ``lineage.json``)
must not land once another writer holds the run. A check before the write is not enough: the write can take up
to the store's operation bound, and a write given up on keeps running in its thread (``deadline.py``). So
``commit_json``:

1. runs the run's fence (``fence.py``: the lease, in whatever process writes for its owner), which says until
   when the lease is surely ours (``valid_until``: at least a sixth of the TTL before anyone may take it over);
2. writes, bounded by that time (a write still running then is given up on), atomically (S3 puts; locally
   write-then-rename), and for a file that may already exist by compare-and-swap on the tag it read;
3. runs the fence again, and undoes the write when the run is no longer ours, and, in its thread, when the write
   was given up on: a conditional delete (or restore of the previous bytes) that only matches the bytes this
   writer wrote, so it never removes another writer's commit.

A write that passed step 3 landed while the lease in the store was ours (the second check reads it after the
write returned; S3 and a local disk read what was written): the other writer took the run after it. What is
left: a write that lands after a takeover is visible until its undo (one lease read later); a store that never
answers again keeps the undo waiting in its thread.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any

from tasks.storage.fence import check_fence
from tasks.storage.manifest import StageRef, StoreError, new_manifest, ref_from_manifest, sha256_file

MANIFEST = "manifest.json"
# ``store`` below is a ``tasks.storage.store.Store`` (not imported: store.py imports this module).
log = logging.getLogger("r1.store")


class WriteConflict(StoreError):
    """A conditional write (``Store.write_if``) found the file changed since it was read. Not retried."""


def commit_json(store: Any, run: str, path: str, obj: dict[str, Any], what: str) -> None:
    """Write JSON ``obj`` at ``path`` as the commit ``what`` to ``run``, under its fence (module docstring). The
    file may exist already (a run file; a checkpoint saved again): the undo then puts back what was there."""
    data = json.dumps(obj, indent=2, sort_keys=True, default=str).encode()
    deadline = check_fence(store.url, run, what)
    before: tuple[bytes, str] | None = None
    try:
        before = store.read_tagged(path)
    except FileNotFoundError:
        pass
    mine = store.tag_of(data)

    def undo() -> None:
        try:
            if before is None:
                store.remove_if(path, mine)
            else:
                store.write_if(path, before[0], mine)
        except StoreError as e:
            log.error("could not undo %s at %s: %s", what, store.uri(path), e)

    limit = None if deadline is None else deadline - time.time()
    if limit is not None and limit <= 0:  # the lease ran out before the write could start
        check_fence(store.url, run, what)
        limit = None
    try:
        store.write_if(path, data, before[1] if before else None, limit_s=limit, on_abandoned=undo)
    except WriteConflict:
        check_fence(store.url, run, what)  # another writer's bytes: the fence names it
        raise
    try:
        check_fence(store.url, run, what)  # the run may have been taken while the write was in flight
    except BaseException:
        undo()
        raise


def precondition_failed(e: BaseException) -> bool:
    """S3 answered 412 (If-Match / If-None-Match did not hold); s3fs raises it as an OSError or FileExistsError."""
    return isinstance(e, FileExistsError) or any(s in str(e) for s in ("pre-condition", "PreconditionFailed"))


def replace_file(path: Path, data: bytes) -> None:
    """Write ``path`` atomically: a temporary file beside it, then a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{secrets.token_hex(3)}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class FileLock:
    """``flock`` on ``path`` (created on first use) while the block runs: a local store's compare-and-swap."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: Any) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


class StageWriter:
    """One uncommitted stage output: upload files into it, then ``commit`` (manifest last) or ``abort``."""

    def __init__(self, store: Any, run: str, stage: str, version: str) -> None:
        self.store, self.run, self.stage, self.version = store, run, stage, version
        self.rel = f"{run}/{stage}/{version}"
        self.path = store.path(self.rel)
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
        manifest = new_manifest(run=self.run, stage=self.stage, version=self.version, fingerprint=fingerprint,
                                config=config, parents=parents, metrics=metrics, files=self.files, extra=extra)
        commit_json(self.store, self.run, f"{self.path}/{MANIFEST}", manifest, f"{self.stage} output {self.version}")
        return ref_from_manifest(manifest, self.store.url)

    def abort(self) -> None:
        self.store.remove(self.path)

    def __enter__(self) -> "StageWriter":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        """Leaving the block by an exception (any, KeyboardInterrupt included) aborts; the exception goes on.
        A normal exit does nothing: the block commits explicitly."""
        if exc_type is not None:
            self.abort()
