"""The sha256 of local input files and folders, for stage fingerprints (data files: ``data_inputs.py``; model folders:
``tasks.config.fingerprint_fields``), remembered so that a file is read once per change, not once per fingerprint.

A hash is remembered under the file's stat: (device, inode, size, mtime_ns, ctime_ns). Any write to a file, or a file
put in its place, moves its ctime, which no tool sets back (``cp -p``, ``rsync -t`` and ``touch`` restore the mtime,
never the ctime), so a remembered hash is the hash of the bytes there now. File times tick coarsely (a few ms), so
two writes within one tick can leave one stat: as git does with its index, a file changed in the last ``RACY_NS`` is
read again each time, and only older ones are remembered. Within a process every file's hash is kept in memory; a
file of ``PERSIST_BYTES`` or more (weights shards, large data sets) is also written to ``hash_cache()``, one small
file per stat, so a model of 15 GB (~20 s of sha256 on one core) is hashed once per change on a machine, not once by
every stage process that fingerprints it. A file system whose ctime is fake (some FUSE mounts) leaves size and
mtime to tell a change: set ``R1_HASH_CACHE=off`` there to hash once in every process.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from tasks.storage.manifest import sha256_file

PERSIST_BYTES = 8 << 20  # files this large have their hash written to the hash cache; smaller ones cost ~ms to hash
RACY_NS = 2 * 10**9  # a file changed this recently is not remembered (module docstring)
_HEX = re.compile(r"^[0-9a-f]{64}$")
_MEMO: dict[tuple[int, ...], str] = {}  # stat key -> sha256, for this process
log = logging.getLogger(__name__)


def hash_cache() -> Path | None:
    """Where remembered hashes live: ``$R1_HASH_CACHE``, else ``$XDG_CACHE_HOME/r1/sha256`` (``~/.cache/r1/sha256``);
    None when ``R1_HASH_CACHE`` is ``off``."""
    where = os.environ.get("R1_HASH_CACHE")
    if where == "off":
        return None
    if where:
        return Path(where).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "r1" / "sha256"


def _stat_key(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes (a link's target's), read once per change (module docstring)."""
    st = os.stat(path)
    key = _stat_key(st)
    if key in _MEMO:
        return _MEMO[key]
    root = hash_cache() if st.st_size >= PERSIST_BYTES else None
    entry = root / hashlib.sha256(":".join(map(str, key)).encode()).hexdigest() if root is not None else None
    if entry is not None and entry.is_file() and _HEX.match(known := entry.read_text().strip()):
        _MEMO[key] = known
        return known
    digest = sha256_file(Path(path))
    if _stat_key(os.stat(path)) != key or time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < RACY_NS:
        return digest  # written while read, or so recently that a write within its time tick would not show
    _MEMO[key] = digest
    if entry is not None:
        _remember(entry, digest)
    return digest


def _remember(entry: Path, digest: str) -> None:
    """Write one remembered hash (atomically: a reader sees the whole hash or none); a cache that cannot be
    written costs a re-hash next time, never a failed stage."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=".part-")
        with os.fdopen(fd, "w") as f:
            f.write(digest)
        os.replace(tmp, entry)
    except OSError as e:
        log.debug("hash cache %s not written: %s", entry.parent, e)


def folder_files(path: Path, *, skip_hidden: bool = False) -> dict[str, dict[str, Any]]:
    """``{relative name: {"size": ..., "sha256": ...}}`` for every file under ``path``; ``skip_hidden`` leaves out
    names with a part starting with a dot (a model folder's ``.git``, which holds its weights again, and the
    ``.cache`` a hub download leaves, whose timestamps say nothing of the weights)."""
    out = {}
    for p in sorted(q for q in path.rglob("*") if q.is_file()):
        rel = p.relative_to(path)
        if skip_hidden and any(part.startswith(".") for part in rel.parts):
            continue
        out[rel.as_posix()] = {"size": p.stat().st_size, "sha256": file_sha256(p)}
    return out
