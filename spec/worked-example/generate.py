#!/usr/bin/env python3
"""Write the byte-exact worked example of spec §21 (informative; the output is committed).

One version of a job with two writers: tensor ``w`` (float32, 2 × 2) in two ranges — row 0 by
writer 0 with codec ``none``, row 1 by writer 1 with codec ``zstd`` (one raw block, built by
hand) — a global ``pck:step/1`` entry and a per-rank entry. Standard library and ``crc32c``
only; every byte is determined by this script. ``tests/test_spec_worked_example.py`` checks that
the hex and JSON printed in spec §21 are these files and that the reference reader and the
conformance checker accept them.

Usage: python spec/worked-example/generate.py [--out DIR] [--print]
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path
from typing import Any

import crc32c

ATTEMPT = "s000000000007-20260101T000000000000Z-0123456789abcdef"
BLOCK = 4096
META = {"format": "pt", "portable_ckpt": "1.0"}


def _text(v: Any, depth: int) -> str:
    # Objects open one member per line down to depth 2, lists of objects one item per line;
    # everything else is written on one line (", " and ": " separators).
    pad = "  " * (depth + 1)
    if isinstance(v, dict) and v and depth < 3:
        body = ",\n".join(f"{pad}{json.dumps(k)}: {_text(x, depth + 1)}" for k, x in v.items())
        return "{\n" + body + "\n" + "  " * depth + "}"
    if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
        body = ",\n".join(pad + json.dumps(x, separators=(", ", ": ")) for x in v)
        return "[\n" + body + "\n" + "  " * depth + "]"
    return json.dumps(v, separators=(", ", ": "))


def dumps(doc: Any) -> bytes:
    """The JSON text of a document as stored here (readable, deterministic), then a newline."""
    return (_text(doc, 0) + "\n").encode()


def record(data: bytes) -> dict[str, Any]:
    """A file record (§6): size and one CRC-32C per 4096-byte block."""
    blocks = "".join(f"{crc32c.crc32c(data[i:i + BLOCK]):08x}" for i in range(0, len(data), BLOCK))
    return {"size": len(data), "checksum": {"algorithm": "crc32c", "block_size": BLOCK,
                                            "blocks": blocks}}


def shard(name: str, dtype: str, shape: list[int], data: bytes) -> bytes:
    """A one-tensor safetensors file, header padded with spaces to a multiple of 8 (§11.1)."""
    header = {"__metadata__": META, name: {"dtype": dtype, "shape": shape,
                                           "data_offsets": [0, len(data)]}}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def zstd_raw_frame(data: bytes) -> bytes:
    """One Zstandard frame (RFC 8878) holding ``data`` in one raw block.

    Magic, descriptor 0x20 (single segment, 1-byte content size), the size, one raw last block
    (header ``1 | size << 3``, 3 bytes little-endian), the bytes.
    """
    assert len(data) < 256
    block = struct.pack("<I", 1 | len(data) << 3)[:3]
    return b"\x28\xb5\x2f\xfd\x20" + bytes([len(data)]) + block + data


def build() -> dict[str, bytes]:
    """Every file of the version, by path relative to the attempt directory."""
    row0 = struct.pack("<2f", 1.0, 2.0)
    row1 = struct.pack("<2f", 3.0, 4.0)
    files: dict[str, bytes] = {
        "data/w00000-0000.safetensors": shard("w@0,0", "F32", [1, 2], row0),
        "data/w00001-0000.safetensors": shard("w@1,0", "U8", [17], zstd_raw_frame(row1)),
        "entries/progress.g.json": b'{"step":7}',
        "entries/seed.r00000.json": b'{"seed":100}',
        "entries/seed.r00001.json": b'{"seed":101}',
    }
    ranges = [
        {"offsets": [0, 0], "lengths": [1, 2], "file": "data/w00000-0000.safetensors",
         "name": "w@0,0", "codec": "none"},
        {"offsets": [1, 0], "lengths": [1, 2], "file": "data/w00001-0000.safetensors",
         "name": "w@1,0", "codec": "zstd"},
    ]
    progress = {"schema": {"id": "pck:step/1"}, "scope": "global", "encoding": "json"}
    seed = {"schema": {"id": "pck:json/1"}, "scope": "per_rank", "world_size_policy": "modulo",
            "encoding": "json"}
    writers = {
        0: (["data/w00000-0000.safetensors", "entries/progress.g.json",
             "entries/seed.r00000.json"], [ranges[0]],
            {"progress": {**progress, "values": [{"file": "entries/progress.g.json"}]},
             "seed": {**seed, "values": [{"rank": 0, "file": "entries/seed.r00000.json"}]}}),
        1: (["data/w00001-0000.safetensors", "entries/seed.r00001.json"], [ranges[1]],
            {"seed": {**seed, "values": [{"rank": 1, "file": "entries/seed.r00001.json"}]}}),
    }
    for w, (paths, rr, entries) in writers.items():
        files[f"index/w{w:05d}.json"] = dumps({
            "format": "portable-ckpt-writer-index", "format_version": "1.0",
            "attempt_id": ATTEMPT, "writer": w, "files": {p: record(files[p]) for p in paths},
            "tensors": {"w": {"dtype": "float32", "shape": [2, 2], "ranges": rr}},
            "entries": entries})
    files["manifest.json"] = dumps({
        "format": "portable-ckpt", "format_version": "1.0", "attempt_id": ATTEMPT, "step": 7,
        "created_at": "2026-01-01T00:00:00.000000Z",
        "committed_at": "2026-01-01T00:00:01.000000Z",
        "producer": {"name": "worked-example", "version": "1"},
        "continuation": {"contract": "exact", "world_size": 2, "mesh": None},
        "files": {p: record(d) for p, d in sorted(files.items())},
        "tensors": {"w": {"dtype": "float32", "shape": [2, 2], "ranges": ranges}},
        "entries": {"progress": {**progress, "values": [{"file": "entries/progress.g.json"}]},
                    "seed": {**seed, "values": [
                        {"rank": 0, "file": "entries/seed.r00000.json"},
                        {"rank": 1, "file": "entries/seed.r00001.json"}]}},
        "must_understand": [], "extensions": {}})
    return files


def hexdump(data: bytes) -> str:
    """``xxd``-style lines: offset, 16 bytes in hex pairs, ASCII (``.`` for others)."""
    lines = []
    for i in range(0, len(data), 16):
        chunk = data[i:i + 16]
        hexpart = " ".join(chunk[j:j + 2].hex() for j in range(0, len(chunk), 2))
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{i:08x}: {hexpart:<39}  {text}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Write the files below ``--out`` (default: next to this script); ``--print`` the dumps."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent))
    ap.add_argument("--print", action="store_true", help="print each file as spec §21 shows it")
    args = ap.parse_args(argv)
    files = build()
    for rel, data in files.items():
        p = Path(args.out) / ATTEMPT / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        if args.print:
            binary = rel.endswith(".safetensors")
            print(f"<!-- file: {rel} ({len(data)} bytes) -->")
            print("```" + ("text" if binary else "json"))
            print(hexdump(data) if binary else data.decode().rstrip("\n"))
            print("```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
