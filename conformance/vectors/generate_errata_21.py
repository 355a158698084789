#!/usr/bin/env python3
"""Generate the golden vectors of errata 21 (run once; the output is frozen and committed).

Errata 21 (spec §23) adds cases for R-CKSUM-3 and R-CKSUM-4 in files of several checksum
blocks. Every earlier case with a bad checksum was a file of one 4 KiB block, so a reader that
verified only the first block of each read, or only the blocks of a shard header, passed every
vector and returned damaged bytes (an outside team's CI review, session 27). Here the damaged
block is never a file's first:

* a data block in the middle of a tensor's range, and the last block of a file;
* a block inside a ``zstd`` frame that is not its first (the bytes are verified before they
  are decoded: ``PCK-CHECKSUM``, never a codec error or damaged values): a frame stored raw,
  which decodes unverified to one changed byte, and a compressed one whose damaged block makes
  decoding fail (a reader that decodes first says ``PCK-CODEC``), once in a block that the
  frame shares with another range and once in a block of its own bytes only, which no other
  read verifies first;
* the second block of an entry value, changed so that it is still valid JSON;
* a later block of a tensor table (format 1.1).

Three valid cases hold the same kinds of files intact. Every damaged byte but the table's and the
compressed frame's is one that a reader which skips the check returns or decodes without
another error (those two fail another check, under another code). Uses the builders of
``generate_1_0.py``, ``generate_1_1.py`` and ``generate_errata_1.py`` (standard library, numpy,
crc32c, zstandard). Refuses to touch an existing vector directory unless ``--force`` is given.

Usage: python conformance/vectors/generate_errata_21.py [--out DIR] [--force]
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _load(stem: str) -> Any:
    """A generator of the same directory (its builders are reused)."""
    path = Path(__file__).resolve().with_name(f"{stem}.py")
    spec = importlib.util.spec_from_file_location(f"pck_{stem}_for_errata_21", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


G = _load("generate_1_0")
T = _load("generate_1_1")
E1 = _load("generate_errata_1")  # its command line writes this set too

Generator = Callable[[Path], Any]
CASES: list[dict[str, Any]] = []
case: Callable[..., Callable[[Generator], Generator]] = E1.registry(CASES)

BLOCK = G.BLOCK  # 4096: every file of these cases spans several blocks
SHARD = "data/w00000-0000.safetensors"
ENTRY = "entries/history.g.json"


def _pattern(n: int, seed: int) -> list[int]:
    """``n`` bytes of a fixed pseudo-random sequence (incompressible: zstd keeps their size)."""
    x, out = seed, []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2**31
        out.append((x >> 16) & 0xFF)
    return out


def _multi(step: int = 10) -> Any:
    """A 1.0 version whose files each span several blocks.

    ``bias`` (16 bytes) and ``w`` (uint8, 2 x 9,000, one range a row) share one shard of five
    blocks; ``z`` (6,000 incompressible bytes, one ``zstd`` range, stored raw by zstd) and ``c``
    (12,000 compressible bytes, one ``zstd`` range, compressed) share writer 1's shard; the
    entry ``history`` holds 1,500 integers (about 8 KiB of JSON).
    """
    v = G.V(step, world_size=2)
    v.tensor("bias", "float32", [4], [0.5, 1.5, 2.5, 3.5])
    v.tensor("w", "uint8", [2, 9000], [i % 251 for i in range(18000)],
             [([0, 0], [1, 9000], 0), ([1, 0], [1, 9000], 0)])
    v.tensor("z", "uint8", [6000], _pattern(6000, 21), [([0], [6000], 1)], codec="zstd")
    v.tensor("c", "uint8", [12000], [x % 33 for x in _pattern(12000, 7)], [([0], [12000], 1)],
             codec="zstd")
    v.entry("history", list(range(1500)))
    return v


def _range_span(files: dict[str, bytes], fname: str, name: str) -> tuple[int, int]:
    """The absolute byte span of header entry ``name`` in shard ``fname``."""
    import json
    import struct

    data = files[fname]
    (n,) = struct.unpack("<Q", data[:8])
    lo, hi = json.loads(data[8:8 + n])[name]["data_offsets"]
    return 8 + n + lo, 8 + n + hi


def _flip(files: dict[str, bytes], fname: str, at: int, mask: int = 0x01) -> None:
    """Flip bits of the byte at ``at`` of ``fname`` (after its checksums were computed)."""
    b = bytearray(files[fname])
    b[at] ^= mask
    files[fname] = bytes(b)


def _first_breaking(
    data: bytes, lo: int, hi: int, candidates: range, size: int
) -> tuple[int, int]:
    """``(byte, bit mask)``: the first change that makes a zstd frame fail to decode.

    The frame is ``data[lo:hi]`` (``size`` bytes decoded); bytes are tried in ``candidates``.
    """
    import zstandard

    frame = data[lo:hi]

    def breaks(at: int, mask: int) -> bool:
        bad = bytearray(frame)
        bad[at - lo] ^= mask
        try:
            zstandard.ZstdDecompressor().decompress(bytes(bad), max_output_size=size)
        except zstandard.ZstdError:
            return True
        return False

    return next((a, 1 << b) for a in candidates for b in range(8) if breaks(a, 1 << b))


@case("valid-multi-block-files", "R-CKSUM-3 (errata 21): a 1.0 version whose shards, zstd "
      "frame and entry value each span several 4 KiB checksum blocks, intact: a reader "
      "verifies every block it reads and reads them all")
def _(root: Path) -> Any:
    v = _multi()
    G.write_version(root, v)
    return v


@case("invalid-checksum-middle-block-of-a-range", "R-CKSUM-3, R-CKSUM-4 (errata 21): one "
      "bit of an element in block 3 of a five-block shard, inside the second range of "
      "`w` (neither the range's first block nor its last): a reader that verifies only the "
      "first block of a read returns the changed value; PCK-CHECKSUM, block 3",
      code="PCK-CHECKSUM", deep=True)
def _(root: Path) -> None:
    def ar(files: dict[str, bytes], m: dict[str, Any]) -> None:
        lo, hi = _range_span(files, SHARD, "w@1,0")
        at = 3 * BLOCK + 100
        assert lo < 3 * BLOCK and at < hi and hi > 4 * BLOCK, (lo, hi)
        _flip(files, SHARD, at, 0x10)
    G.write_version(root, _multi(), after_records=ar)


@case("invalid-checksum-last-block", "R-CKSUM-3, R-CKSUM-4 (errata 21): one bit of the last "
      "byte of a five-block shard (its last, short block); PCK-CHECKSUM, block 4", code="PCK-CHECKSUM", deep=True)
def _(root: Path) -> None:
    def ar(files: dict[str, bytes], m: dict[str, Any]) -> None:
        size = len(files[SHARD])
        assert 4 * BLOCK < size < 5 * BLOCK, size
        _flip(files, SHARD, size - 1, 0x01)
    G.write_version(root, _multi(), after_records=ar)


@case("invalid-checksum-later-block-of-a-zstd-frame", "R-CKSUM-3, R-CKSUM-4, R-TENSOR-10 "
      "(errata 21): one bit in block 1 of the shard of `z`, inside its zstd frame (a "
      "6,000-byte frame of incompressible bytes, stored raw by zstd: decoded unverified it "
      "gives one changed byte, no codec error). The bytes are verified before they are "
      "decoded: PCK-CHECKSUM, block 1, not PCK-CODEC (not deep: the block also holds the "
      "frame header of `c`, which a metadata check reads and so verifies)", code="PCK-CHECKSUM")
def _(root: Path) -> None:
    def ar(files: dict[str, bytes], m: dict[str, Any]) -> None:
        fname = "data/w00001-0000.safetensors"
        lo, hi = _range_span(files, fname, "z@0")
        at = BLOCK + 500
        assert lo + 18 < BLOCK < at < hi, (lo, hi)
        _flip(files, fname, at, 0x01)
    G.write_version(root, _multi(), after_records=ar)


@case("invalid-checksum-undecodable-zstd-frame", "R-CKSUM-3, R-CKSUM-4, R-TENSOR-10 "
      "(errata 21): one bit in block 1 of writer 1's shard, in the compressed zstd frame of "
      "`c` just past its frame header (its first block's header and literal tables), so that "
      "decoding the unverified bytes fails: a reader that decodes before it verifies reports "
      "PCK-CODEC; the bytes are verified before they are decoded: PCK-CHECKSUM, block 1 (not "
      "deep: the block holds the frame's header, which a metadata check reads)",
      code="PCK-CHECKSUM")
def _(root: Path) -> None:
    def ar(files: dict[str, bytes], m: dict[str, Any]) -> None:
        fname = "data/w00001-0000.safetensors"
        lo, hi = _range_span(files, fname, "c@0")
        assert BLOCK < lo < 2 * BLOCK - 512, (lo, hi)
        # The first byte and bit past the frame header (18 bytes, metadata: R-TENSOR-10) whose
        # change breaks decoding: the first block's header and literal tables.
        at, mask = _first_breaking(files[fname], lo, hi, range(lo + 18, lo + 512), 12000)
        assert at // BLOCK == 1, at
        _flip(files, fname, at, mask)
    G.write_version(root, _multi(), after_records=ar)


def _long_frame(step: int = 10) -> Any:
    """A 1.0 version of one writer whose shard holds one ``zstd`` range, ``m``.

    40,000 bytes of sixteen values (about 20 KiB compressed: the frame spans five 4 KiB
    blocks, four of them holding nothing but its bytes).
    """
    v = G.V(step, world_size=1)
    v.tensor("m", "uint8", [40000], [x % 16 for x in _pattern(40000, 11)], [([0], [40000], 0)],
             codec="zstd")
    return v


@case("valid-long-zstd-frame", "R-CKSUM-3, R-TENSOR-10 (errata 21): a zstd frame of five "
      "4 KiB blocks, intact")
def _(root: Path) -> Any:
    v = _long_frame()
    G.write_version(root, v)
    return v


@case("invalid-checksum-undecodable-zstd-frame-own-block", "R-CKSUM-3, R-CKSUM-4, "
      "R-TENSOR-10 (errata 21): one bit in the last block of a shard whose only range is the "
      "compressed zstd frame of `m` (a block of the frame's bytes alone, not the one it "
      "shares with the shard header), chosen so that decoding the unverified frame fails. "
      "No other read "
      "touches that block, so a reader that decodes a frame before it verifies it reports "
      "PCK-CODEC whatever order it reads in (`invalid-checksum-undecodable-zstd-frame` shares "
      "its block with `z`, read first in the manifest's order); the bytes are verified before "
      "they are decoded: PCK-CHECKSUM", code="PCK-CHECKSUM", deep=True)
def _(root: Path) -> None:
    def ar(files: dict[str, bytes], m: dict[str, Any]) -> None:
        lo, hi = _range_span(files, SHARD, "m@0")
        first = -(-lo // BLOCK) * BLOCK  # the frame's first block of its own bytes only
        assert first + 2 * BLOCK < hi, (lo, hi)
        # The first byte and bit past the frame's first two blocks of its own bytes whose change
        # breaks decoding (in its last block: the ends of its Huffman streams and sequences).
        at, mask = _first_breaking(files[SHARD], lo, hi, range(first + 2 * BLOCK, hi), 40000)
        assert at // BLOCK * BLOCK >= lo and len(files[SHARD]) == hi, (lo, at, hi)
        _flip(files, SHARD, at, mask)
    G.write_version(root, _long_frame(), after_records=ar)


@case("invalid-checksum-second-block-of-an-entry", "R-CKSUM-3, R-CKSUM-4 (errata 21): a "
      "digit in block 1 of the entry value `history` changed into another digit (still "
      "valid JSON: a reader that verifies only the first block returns the changed list); "
      "PCK-CHECKSUM, block 1 (entry values are read by a metadata check too: not deep)",
      code="PCK-CHECKSUM")
def _(root: Path) -> None:
    def ar(files: dict[str, bytes], m: dict[str, Any]) -> None:
        data = files[ENTRY]
        at = next(i for i in range(BLOCK + 200, len(data)) if data[i:i + 1] in b"0123")
        _flip(files, ENTRY, at, 0x04)  # '0'..'3' -> '4'..'7'
    G.write_version(root, _multi(), after_records=ar)


def _tabled(step: int = 10) -> Any:
    """A 1.1 version whose tensor table (codec none) spans several blocks: 600 one-row boxes."""
    v = T.V(step, table="none")
    v.tensor("rows", "uint8", [600, 4], [i % 251 for i in range(2400)],
             [([r, 0], [1, 4], 0) for r in range(600)])
    return v


@case("valid-multi-block-table", "R-CKSUM-3 (errata 21): a 1.1 version whose tensor table "
      "(codec none, 600 records) spans several 4 KiB blocks, intact")
def _(root: Path) -> Any:
    v = _tabled()
    T.write_version(root, v)
    return v


@case("invalid-checksum-later-block-of-a-table", "R-CKSUM-3, R-CKSUM-4, R-TABLE-4 (errata "
      "21): one bit in the last block of a tensor table of six blocks (the last record's last "
      "length, 4 read as 5: unverified, the records describe another layout); the table is "
      "verified before it is decoded: PCK-CHECKSUM", code="PCK-CHECKSUM")
def _(root: Path) -> None:
    v = _tabled()

    def ar(files: dict[str, bytes], m: dict[str, Any]) -> None:
        fname = T.TABLE_NONE
        lo, hi = _range_span(files, fname, "range.lengths")
        at = hi - 8  # the low byte of the last record's last length (4 -> 5)
        last = (len(files[fname]) - 1) // BLOCK
        assert lo < last * BLOCK <= at, (lo, at, last)
        _flip(files, fname, at, 0x01)
    T.write_version(root, v, after_records=ar)


DESCRIPTION = ("Golden vectors of errata 21 (spec §20): damaged checksum blocks that are not "
               "a file's first (R-CKSUM-3, R-CKSUM-4): the middle block of a range, the last "
               "block of a shard, a later block of a zstd frame (stored raw, and compressed, "
               "also in a block no other read touches), "
               "the second block of an entry "
               "value, a later block of a tensor table; and three versions with the same kinds "
               "of multi-block files intact.")


def main(argv: list[str] | None = None) -> int:
    """Write every case below ``--out`` (default: ``errata-21`` next to this script)."""
    return int(E1.write_set(argv, CASES, "errata-21", DESCRIPTION, __doc__))


if __name__ == "__main__":
    sys.exit(main())
