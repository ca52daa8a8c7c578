"""Read a model folder's safetensors weights one tensor at a time, with plain file reads.

Used by the sharded (FSDP) load: rank 0 reads each tensor here and broadcasts it, so no process ever holds
a whole model. Departure from ``safetensors.safe_open``: that memory-maps the file, and every page of the
mapping a read touches stays in the process's resident set until the file is closed, i.e. the whole file by
the end of a load; ``read`` uses ``readinto`` into a fresh tensor, which the caller frees when done.

Format (https://github.com/huggingface/safetensors): 8 bytes little-endian header length N, N bytes of JSON
``{name: {"dtype", "shape", "data_offsets": [begin, end]}}`` (offsets relative to the end of the header),
then the raw data. Sharded folders list name -> file in ``model.safetensors.index.json``.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}


@dataclass(frozen=True)
class TensorEntry:
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int  # absolute byte offset in ``file``
    end: int


def index_weights(folder: str | Path) -> dict[str, TensorEntry]:
    """Every tensor of ``folder``'s ``model.safetensors`` (or its sharded files), by name; reads headers only.

    A hub model name (``Qwen/Qwen2.5-7B``) resolves to its local snapshot (the cache, or a download of the
    safetensors files), as ``from_pretrained`` would."""
    if not Path(folder).is_dir():
        from huggingface_hub import snapshot_download

        folder = snapshot_download(str(folder), allow_patterns=["*.safetensors", "*.safetensors.index.json"])
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted({folder / f for f in json.loads(index.read_text())["weight_map"].values()})
    elif (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    else:
        raise FileNotFoundError(f"{folder} has neither model.safetensors nor model.safetensors.index.json; "
                                "save the model with save_pretrained(..., safe_serialization=True)")
    entries: dict[str, TensorEntry] = {}
    for file in files:
        with open(file, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            begin, end = meta["data_offsets"]
            entries[name] = TensorEntry(file, DTYPES[meta["dtype"]], tuple(meta["shape"]), 8 + length + begin, 8 + length + end)
    return entries


def read_tensor(entry: TensorEntry) -> torch.Tensor:
    """One tensor, read from disk into its own memory (no mapping left behind)."""
    out = torch.empty(entry.shape, dtype=entry.dtype)
    with open(entry.file, "rb") as f:
        f.seek(entry.begin)
        view = memoryview(out.reshape(-1).view(torch.uint8).numpy())
        if f.readinto(view) != entry.end - entry.begin:
            raise OSError(f"{entry.file}: truncated tensor data at bytes {entry.begin}-{entry.end}")
    return out
