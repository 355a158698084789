"""Helpers for the requirement tests: build real versions, tamper with them, watch storage calls."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.errors import CheckpointError
from portable_ckpt.format import jsonio
from portable_ckpt.format.manifest import Checksum, Continuation, FileRecord, Manifest
from portable_ckpt.io.checksum import BlockHasher
from portable_ckpt.io.commit import commit
from portable_ckpt.io.reader import Checkpoint
from portable_ckpt.io.safetensors_io import build_header
from portable_ckpt.io.versions import load_manifest
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.storage import LocalStorage, ObjectInfo, open_storage

from ..core.helpers import grid_boxes, sample_array, save_sharded

__all__ = [
    "RecordingStorage",
    "build_version",
    "edit_manifest",
    "expect_code",
    "grid_boxes",
    "open_and_read_all",
    "read_manifest",
    "rechecksum",
    "rewrite_file",
    "rewrite_shard_header",
    "sample_array",
    "save_sharded",
    "shard_header",
]


def build_version(
    root: Path,
    *,
    step: int = 1,
    codec: str = "none",
    entries: dict[str, Any] | None = None,
    continuation: Continuation | None = None,
) -> tuple[Path, Manifest]:
    """A small two-writer version: ``a`` (8x8 float32 in 2 ranges), ``b`` (5 int32), one entry."""
    a = np.arange(64, dtype=np.float32).reshape(8, 8)
    m = save_sharded(
        root,
        {"a": (a, (2, 1)), "b": (np.arange(5, dtype=np.int32), (1,))},
        step=step,
        codec=codec,
        entries={"cfg": {"x": 1}} if entries is None else entries,
        continuation=continuation,
    )
    return root / m.attempt_id, m


def read_manifest(vdir: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((vdir / "manifest.json").read_text())
    return doc


def edit_manifest(vdir: Path, fn: Callable[[dict[str, Any]], Any]) -> None:
    """Apply ``fn`` to the manifest document of ``vdir`` and write it back (compact JSON)."""
    doc = read_manifest(vdir)
    fn(doc)
    (vdir / "manifest.json").write_text(json.dumps(doc))


def rechecksum(vdir: Path, rel: str) -> None:
    """Make the manifest's size and block checksums of ``rel`` match the file on disk again.

    A stored writer index that lists ``rel`` gets the same record, and its own record in the
    manifest follows (R-INDEX-6 compares an index's file records by size too).
    """
    data = (vdir / rel).read_bytes()

    def fixed(rec: dict[str, Any]) -> None:
        h = BlockHasher(rec["checksum"]["block_size"])
        h.update(data)
        rec["size"] = len(data)
        rec["checksum"]["blocks"] = h.blocks()

    edit_manifest(vdir, lambda doc: fixed(doc["files"][rel]))
    if rel.startswith("index/"):
        return
    listed = read_manifest(vdir)["files"]
    for idx in sorted(p for p in listed if p.startswith("index/")):
        path = vdir / idx
        try:
            doc = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("files"), dict) and rel in doc["files"]:
            fixed(doc["files"][rel])
            path.write_text(json.dumps(doc))
            rechecksum(vdir, idx)


def rewrite_file(vdir: Path, rel: str, data: bytes) -> None:
    """Replace a listed file's bytes and make its manifest record consistent with them."""
    (vdir / rel).write_bytes(data)
    rechecksum(vdir, rel)


def shard_header(path: Path) -> tuple[int, dict[str, Any], bytes]:
    """Return ``(N, header, data_area)`` of a safetensors file."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return n, json.loads(raw[8 : 8 + n]), raw[8 + n :]


def rewrite_shard_header(
    vdir: Path, rel: str, fn: Callable[[dict[str, Any]], Any], *, raw_header: bytes | None = None
) -> None:
    """Edit the JSON header of a data file (data area unchanged) and re-checksum it."""
    n, header, data = shard_header(vdir / rel)
    fn(header)
    body = raw_header if raw_header is not None else json.dumps(header).encode()
    body += b" " * (-(len(body) + 8) % 8)
    rewrite_file(vdir, rel, struct.pack("<Q", len(body)) + body + data)


def rename_shard_member(path: Path, rel: str, old: str, new: str, block_size: int) -> FileRecord:
    """Rename member ``old`` of an uncommitted writer's data file ``path`` (its file ``rel``) to
    ``new``; return the file record of the bytes now there (no manifest yet to mend)."""
    _, header, data = shard_header(path)
    header[new] = header.pop(old)
    body = jsonio.dumps(header)
    body += b" " * (-(len(body) + 8) % 8)
    raw = struct.pack("<Q", len(body)) + body + data
    path.write_bytes(raw)
    h = BlockHasher(block_size)
    h.update(raw)
    return FileRecord(rel, len(raw), Checksum("crc32c", block_size, h.blocks()))


def rebuild_shard(
    vdir: Path, rel: str, items: list[tuple[str, str, list[int], bytes]]
) -> None:
    """Replace a data file by a fresh safetensors file of ``(name, st_dtype, shape, payload)``."""
    header = build_header([(n, d, s, len(p)) for n, d, s, p in items], {"format": "pt"})
    rewrite_file(vdir, rel, header + b"".join(p for *_, p in items))


def open_and_read_all(path: Path | str) -> Checkpoint:
    """Open a version, read every tensor and entry value, and deep-verify it."""
    ck = portable_ckpt.open(path)
    for k in ck.tensors:
        ck.read(k)
    for name, e in ck.entries.items():
        if e.scope == "global":
            ck.entry(name)
        else:
            for v in e.values:
                ck.entry(name, rank=v.rank)
    errs = ck.verify(deep=True)
    if errs:
        raise errs[0]
    return ck


def expect_code(code: str | set[str], fn: Callable[..., Any], *args: Any, **kw: Any) -> CheckpointError:
    """Run ``fn`` and require a CheckpointError with ``code`` (or one of a set of codes)."""
    with pytest.raises(CheckpointError) as ei:
        fn(*args, **kw)
    codes = {code} if isinstance(code, str) else code
    assert ei.value.code in codes, f"expected {codes}, got {ei.value.code}: {ei.value}"
    return ei.value


class RecordingStorage(LocalStorage):
    """A real local backend that records every operation ``(op, path, offset, length)``."""

    def __init__(self, root: str | os.PathLike[str], *, create: bool = False) -> None:
        super().__init__(root, create=create)
        self.ops: list[tuple[str, str, int, int]] = []

    def read_into(self, path: str, offset: int, buf: memoryview) -> None:
        self.ops.append(("read", path, offset, len(buf)))
        super().read_into(path, offset, buf)

    def read_into_many(self, path: str, offset: int, bufs: list[memoryview]) -> None:
        self.ops.append(("read", path, offset, sum(len(b) for b in bufs)))
        LocalStorage.read_into_many(self, path, offset, bufs)

    def read_extents(self, path: str, extents: Any) -> None:
        for offset, bufs in extents:  # one recorded read per extent (one preadv each)
            self.ops.append(("read", path, offset, sum(len(b) for b in bufs)))
        LocalStorage.read_extents(self, path, extents)

    def read_all(self, path: str, *, max_size: int) -> bytes:
        data = super().read_all(path, max_size=max_size)
        self.ops.append(("read", path, 0, len(data)))
        return data

    def size(self, path: str) -> int:
        self.ops.append(("size", path, 0, 0))
        return super().size(path)

    def open_writer(self, path: str):  # type: ignore[no-untyped-def]
        self.ops.append(("create", path, 0, 0))
        return super().open_writer(path)

    def create_if_absent(self, path: str, data: bytes) -> bool:
        self.ops.append(("create_if_absent", path, 0, len(data)))
        return super().create_if_absent(path, data)

    def delete(self, path: str) -> None:
        self.ops.append(("delete", path, 0, 0))
        super().delete(path)

    def list(self, prefix: str = "", *, recursive: bool = True) -> Iterator[ObjectInfo]:
        self.ops.append(("list", prefix, 0, 0))
        return super().list(prefix, recursive=recursive)

    def reads(self, prefix: str = "") -> list[tuple[str, int, int]]:
        return [(p, o, n) for op, p, o, n in self.ops if op == "read" and p.startswith(prefix)]


def open_recorded(root: Path, attempt: str) -> tuple[RecordingStorage, Checkpoint]:
    """Open a version through a :class:`RecordingStorage` (to observe exactly what is read)."""
    st = RecordingStorage(root)
    return st, Checkpoint(st, attempt, load_manifest(st, attempt))


def write_attempt(
    root: Path, arrays: dict[str, np.ndarray], *, step: int = 1, writer: int = 0, **kw: Any
) -> tuple[str, Any]:
    """Write one writer's share (not committed); return ``(attempt_id, index)``."""
    storage = open_storage(root, create=True)
    attempt = new_attempt_id(step)
    w = ShardWriter(storage, attempt, writer, **kw)
    for k, v in arrays.items():
        w.add_tensor(k, v)
    return attempt, w.finish()


__all__ += ["commit", "open_recorded", "rebuild_shard", "write_attempt"]
