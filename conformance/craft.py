"""Writer output made by the harness itself, for testing a committer alone.

A committer is a conformance class of its own (spec §0.3): it has to commit what any conforming
writer wrote, and refuse (§4.2) what no committer may publish. :func:`craft_attempt` turns a
:class:`~conformance.cases.SaveCase` into the files and writer indexes of one attempt — data
shards with ranges under their implied names (R-TABLE-7), entry value files, JSON writer indexes
with their checksums — as plain bytes and dicts, so that a committer test can break exactly one
rule before :meth:`Crafted.write` puts them on disk.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from conformance.cases import SaveCase, rank_writer
from conformance.spec import DTYPES, path_problem
from conformance.store import crc32c

__all__ = ["BLOCK_SIZE", "Crafted", "WriterOutput", "craft_attempt", "entry_file", "file_record",
           "safetensors_bytes"]

BLOCK_SIZE = 4096


def file_record(data: bytes, block_size: int = BLOCK_SIZE) -> dict[str, Any]:
    """The ``files`` record of ``data`` (§6): size and one CRC-32C per block."""
    blocks = "".join(f"{crc32c(data[i:i + block_size]):08x}"
                     for i in range(0, len(data), block_size))
    return {"size": len(data),
            "checksum": {"algorithm": "crc32c", "block_size": block_size, "blocks": blocks}}


def safetensors_bytes(items: list[tuple[str, str, list[int], bytes]]) -> bytes:
    """A safetensors file (§11.1) of ``(name, st_dtype, shape, data)`` items, packed in order."""
    header: dict[str, Any] = {}
    pos = 0
    for name, dt, shape, data in items:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [pos, pos + len(data)]}
        pos += len(data)
    h = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return len(h).to_bytes(8, "little") + h + b"".join(it[3] for it in items)


def _zstd(data: bytes) -> bytes:
    import zstandard

    return bytes(zstandard.ZstdCompressor(write_content_size=True).compress(data))


@dataclass
class WriterOutput:
    """The files one writer stores and its writer index (as a dict, not yet serialised)."""

    writer: int
    files: dict[str, bytes] = field(default_factory=dict)
    index: dict[str, Any] = field(default_factory=dict)

    def add_file(self, rel: str, data: bytes) -> None:
        """Store ``data`` at ``rel`` and record it in the index."""
        self.files[rel] = data
        self.index["files"][rel] = file_record(data)


@dataclass
class Crafted:
    """The writer outputs of one attempt."""

    attempt_id: str
    writers: list[WriterOutput]

    def write(self, root: Path, *, skip_index: tuple[int, ...] = ()) -> Path:
        """Write every file and index below ``root/attempt_id``; return the attempt directory."""
        adir = root / self.attempt_id
        for w in self.writers:
            for rel, data in w.files.items():
                (adir / rel).parent.mkdir(parents=True, exist_ok=True)
                (adir / rel).write_bytes(data)
            if w.writer not in skip_index:
                (adir / "index").mkdir(parents=True, exist_ok=True)
                (adir / "index" / f"w{w.writer:05d}.json").write_text(
                    json.dumps(w.index, ensure_ascii=False, separators=(",", ":")),
                    encoding="utf-8")
        return adir


def _implied_name(key: str, offsets: list[int]) -> str:
    return key + "@" + ",".join(str(o) for o in offsets)


def _tensors(case: SaveCase, outs: list[WriterOutput]) -> None:
    items: list[list[tuple[str, str, list[int], bytes]]] = [[] for _ in outs]
    for t in case.tensors:
        st_dtype, isz = DTYPES[t.dtype]
        full = t.data()
        for offs, lens, w in t.boxes:
            sl = tuple(slice(o, o + n) for o, n in zip(offs, lens, strict=True))
            raw = np.ascontiguousarray(full[sl]).tobytes()
            if len(raw) != math.prod(lens) * isz:  # a box beyond the shape: pad with bytes
                raw = (raw + bytes(math.prod(lens) * isz))[: math.prod(lens) * isz]
            name = _implied_name(t.key, offs)
            rel = f"data/w{w:05d}-0000.safetensors"
            if case.codec == "zstd":
                frame = _zstd(raw)
                items[w].append((name, "U8", [len(frame)], frame))
            else:
                items[w].append((name, st_dtype, list(lens), raw))
            decl = outs[w].index["tensors"].setdefault(
                t.key, {"dtype": t.dtype, "shape": t.shape, "ranges": []})
            decl["ranges"].append({"offsets": offs, "lengths": lens, "file": rel, "name": name,
                                   "codec": case.codec})
        if not t.boxes:
            outs[t.declared_by].index["tensors"][t.key] = {"dtype": t.dtype, "shape": t.shape,
                                                          "ranges": []}
    for w, its in enumerate(items):
        if its:
            outs[w].add_file(f"data/w{w:05d}-0000.safetensors", safetensors_bytes(its))


def entry_file(name: str, tag: str, encoding: str, n: int) -> str:
    """The RECOMMENDED entry file name (§2.1), or a short safe one when that breaks §2.2."""
    suffix = ".json.zst" if encoding == "json+zstd" else ".json"
    rel = f"entries/{name}.{tag}{suffix}"
    if path_problem(rel) is not None:
        rel = f"entries/e{crc32c(name.encode()):08x}-{n:04d}.{tag}{suffix}"
    return rel


def _entries(case: SaveCase, outs: list[WriterOutput]) -> None:
    for n, e in enumerate(case.entries):
        decl = {"schema": e.schema, "scope": e.scope, "encoding": e.encoding}
        pairs = [(e.writer, None, e.value)] if e.scope == "global" else \
            [(rank_writer(r, case.num_writers), r, v) for r, v in enumerate(e.values)]
        for w, rank, value in pairs:
            data = json.dumps(value, ensure_ascii=False, allow_nan=False).encode()
            if e.encoding == "json+zstd":
                data = _zstd(data)
            rel = entry_file(e.name, "g" if rank is None else f"r{rank:05d}", e.encoding, n)
            outs[w].add_file(rel, data)
            d = outs[w].index["entries"].setdefault(
                e.name, {**decl, **({"world_size_policy": e.policy} if e.policy else {}),
                         "values": []})
            d["values"].append({"file": rel} if rank is None else {"rank": rank, "file": rel})


def craft_attempt(case: SaveCase, attempt_id: str) -> Crafted:
    """The files and writer indexes a conforming set of writers would store for ``case``."""
    outs = [WriterOutput(w, index={"format": "portable-ckpt-writer-index", "format_version": "1.0",
                                   "attempt_id": attempt_id, "writer": w, "files": {},
                                   "tensors": {}, "entries": {}})
            for w in range(case.num_writers)]
    _tensors(case, outs)
    _entries(case, outs)
    return Crafted(attempt_id, outs)
