"""Hand-built versions and zstd frames for the cost-bound tests (issue 12).

A hostile writer controls every byte, so these helpers write safetensors shards, zstd frames and
manifests directly instead of going through ``ShardWriter`` (which only writes honest files).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from portable_ckpt.format.dtypes import DTYPES
from portable_ckpt.format.manifest import (
    Checksum,
    Continuation,
    FileRecord,
    RangeRecord,
    TensorEntry,
    WriterIndex,
)
from portable_ckpt.io.checksum import BlockHasher
from portable_ckpt.io.commit import commit
from portable_ckpt.io.safetensors_io import build_header
from portable_ckpt.io.writer import new_attempt_id
from portable_ckpt.storage import open_storage

_MAGIC = struct.pack("<I", 0xFD2FB528)


def rle_frame(
    total: int,
    *,
    byte: int = 0,
    window_log: int = 20,
    single_segment: bool = False,
    content_size: int | None = -1,
) -> bytes:
    """A valid zstd frame decoding to ``total`` copies of ``byte``, made of RLE blocks.

    ``content_size`` -1 declares ``total``; ``None`` declares nothing; any other value lies.
    Every block holds at most 128 KiB (and at most the window), so the frame is about
    ``4 * total / 2^17`` bytes: 16 GiB fits in 512 KiB.
    """
    declared = total if content_size == -1 else content_size
    fhd = (3 << 6) if declared is not None else 0
    if single_segment:
        fhd |= 1 << 5
        if declared is None:
            raise ValueError("a single-segment frame declares its content size")
    head = _MAGIC + bytes([fhd])
    if not single_segment:
        head += bytes([(window_log - 10) << 3])
    if declared is not None:
        head += struct.pack("<Q", declared)
    blk = min(1 << 17, total if single_segment else 1 << window_log) or 1
    n_full, rest = divmod(total, blk)
    sizes = [blk] * n_full + ([rest] if rest or not n_full else [])
    full = struct.pack("<I", (blk << 3) | (1 << 1))[:3] + bytes([byte])
    body = bytearray(full * (len(sizes) - 1))
    last = sizes[-1]
    body += struct.pack("<I", (last << 3) | (1 << 1) | 1)[:3] + (bytes([byte]) if last else b"")
    if not last:
        body[-4:] = struct.pack("<I", 1)[:3]  # an empty last raw block
    return head + bytes(body)


@dataclass
class Piece:
    """One range record and the stored safetensors tensor it points at."""

    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    payload: bytes
    codec: str = "none"
    name: str | None = None  # default: key@offsets
    st_dtype: str | None = None  # default: the tensor's (codec none) or U8 (zstd)
    st_shape: tuple[int, ...] | None = None  # default: lengths (none) or [len(payload)] (zstd)


@dataclass
class HandTensor:
    """A tensor entry of a hand-built version."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    pieces: list[Piece] = field(default_factory=list)


def _record(data: bytes, block_size: int, rel: str) -> FileRecord:
    h = BlockHasher(block_size)
    h.update(data)
    return FileRecord(rel, len(data), Checksum("crc32c", block_size, h.blocks()))


def write_version(
    root: str, tensors: Sequence[HandTensor], *, step: int = 1, block_size: int = 4096
) -> str:
    """Write every piece into one shard ``data/w00000-0000.safetensors`` and commit; return the id."""
    storage = open_storage(root, create=True)
    attempt = new_attempt_id(step)
    rel = "data/w00000-0000.safetensors"
    items: list[tuple[str, str, Sequence[int], int]] = []
    blobs: list[bytes] = []
    idx = WriterIndex(attempt, 0)
    for t in tensors:
        recs = []
        for p in t.pieces:
            name = p.name or f"{t.key}@{','.join(str(o) for o in p.offsets)}"
            st_dtype = p.st_dtype or ("U8" if p.codec == "zstd" else DTYPES[t.dtype].safetensors)
            st_shape = p.st_shape or ((len(p.payload),) if p.codec == "zstd" else p.lengths)
            if name not in {i[0] for i in items}:
                items.append((name, st_dtype, st_shape, len(p.payload)))
                blobs.append(p.payload)
            recs.append(RangeRecord(p.offsets, p.lengths, rel, name, p.codec))
        idx.tensors[t.key] = TensorEntry(t.key, t.dtype, t.shape, recs)
    data = build_header(items, {"format": "pt"}) + b"".join(blobs)
    storage.put(f"{attempt}/{rel}", data)
    idx.files[rel] = _record(data, block_size, rel)
    commit(
        storage,
        attempt,
        step=step,
        indexes=[idx],
        expected_writers=[0],
        continuation=Continuation("exact", 1, None),
        check_headers=False,
    )
    return attempt


def edit_manifest(version_dir: str, fn: Callable[[dict[str, Any]], Any]) -> None:
    """Apply ``fn`` to the parsed manifest of ``version_dir`` and write it back."""
    p = os.path.join(version_dir, "manifest.json")
    with open(p, "rb") as f:
        doc = json.loads(f.read())
    fn(doc)
    with open(p, "wb") as f:
        f.write(json.dumps(doc).encode())
