#!/usr/bin/env python3
"""Generate the golden vectors of errata 3 (run once; the output is frozen and committed).

Errata 3 adds the cases that no earlier set had for rules of the text that a conformance
checker did not enforce:

* R-TENSOR-10 (§8.3): a stored zstd frame is at most ``ZSTD_COMPRESSBOUND(m)`` bytes long
  (``m = prod(lengths) × itemsize``, or the declared size of an entry value's frame) and its
  window is at most 2^27 bytes, decided from the frame's first 18 bytes;
* R-TENSOR-6 / R-TENSOR-7 as a frame header shows them: a declared content size other than
  ``m``, a skippable frame first. R-VERIFY-2 makes the frame header metadata, so these cases are
  not ``deep``: a checker that reads no data blocks still reads each frame's header and must
  report them (the ``errata-1`` skippable-frame case, frozen, says ``deep: true``; it is the
  same defect);
* an integer member written as a number with a fraction part, ``"step": 42.0``: not an integer
  (``PCK-SCHEMA``), before the attempt id is compared with the step;
* R-SEC-9 for integer tokens (an integer that overflows a double), R-COMMIT-18 (timestamps
  are patterns, not calendar dates), R-TENSOR-6's n >= 1 for a zstd range, and R-INDEX-6 (a
  stored writer index is part of its manifest; ``reader: "accept"``: readers never read it).

Every invalid case already broke R-TENSOR-6, R-TENSOR-7, R-TENSOR-10 or the manifest's integer
types before the errata; the valid cases sit exactly at the limits (a frame of
``ZSTD_COMPRESSBOUND(m)`` bytes, a 2^27 window).

Uses only the standard library, numpy and crc32c: every zstd frame is written by hand from raw
blocks (RFC 8878 §3.1.1), so the bytes do not depend on a compressor's version. Refuses to touch
an existing vector directory unless ``--force`` is given.

Usage: python conformance/vectors/generate_errata_3.py [--out DIR] [--force]
"""

from __future__ import annotations

import importlib.util
import json
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _load(stem: str) -> Any:
    """A generator of the same directory (its builders are reused)."""
    path = Path(__file__).resolve().with_name(f"{stem}.py")
    spec = importlib.util.spec_from_file_location(f"pck_{stem}_for_errata_3", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


E1 = _load("generate_errata_1")
V, write_version, encode, raw_frame = E1.V, E1.write_version, E1.encode, E1.raw_frame
SHARD = E1.SHARD
CASES: list[dict[str, Any]] = []
MAGIC = b"\x28\xb5\x2f\xfd"
#: the values of the 32-byte tensor every frame case stores (int64[4]).
VALUES = [-7, 993, 1993, 2993]
DATA = encode("int64", VALUES)


def zstd_bound(n: int) -> int:
    """``ZSTD_COMPRESSBOUND(n)`` as §8.3 states it."""
    return n + n // 256 + ((131072 - n) // 2048 if n < 131072 else 0)


def block(data: bytes, *, last: bool) -> bytes:
    """A raw block (RFC 8878 §3.1.1.2): ``last | 0 << 1 | len << 3`` as 3 bytes, then ``data``."""
    return struct.pack("<I", int(last) | (len(data) << 3))[:3] + data


def padded_frame(data: bytes, empty_blocks: int) -> bytes:
    """A valid frame of ``empty_blocks`` empty raw blocks, then one holding ``data``.

    Single-segment, with a 1-byte content size (``data`` < 256 bytes); each empty block adds
    3 bytes to the frame and nothing to its output.
    """
    assert 0 < len(data) < 256
    head = MAGIC + bytes([0x20, len(data)])  # FCS_flag 0 + Single_Segment: 1-byte content size
    return head + block(b"", last=False) * empty_blocks + block(data, last=True)


def windowed_frame(data: bytes, window_descriptor: int) -> bytes:
    """A frame that is not single-segment, with ``window_descriptor`` and one raw block.

    It declares a 4-byte content size. Window_Size = 2^(10 + Exponent) × (1 + Mantissa / 8)
    (RFC 8878 §3.1.1.1.2).
    """
    return MAGIC + bytes([0x80, window_descriptor]) + struct.pack("<I", len(data)) + \
        block(data, last=True)


def case(name: str, feature: str, *, code: str | None = None, deep: bool = False,
         reader: str | None = None) -> Callable[
        [Callable[[Path], Any]], Callable[[Path], Any]]:
    """Register a case generator (valid when ``code`` is None)."""
    def deco(fn: Callable[[Path], Any]) -> Callable[[Path], Any]:
        CASES.append({"name": name, "feature": feature, "code": code, "deep": deep,
                      "reader": reader, "fn": fn})
        return fn
    return deco


def zstd_version(root: Path, frame: bytes, *, step: int = 10) -> Any:
    """One version: ``w`` (int64[4], 32 bytes, one range) stored as ``frame``, codec zstd."""
    v = V(step)
    v.tensor("w", "int64", [4], VALUES)
    v.st[SHARD][0] = ("w@0", "U8", [len(frame)], frame)
    v.tensors["w"]["ranges"][0]["codec"] = "zstd"
    write_version(root, v)
    return v


# ------------------------------------------------------------------------------------ valid
@case("valid-zstd-frame-at-bound", "R-TENSOR-10: a 95-byte frame (18 empty raw blocks, then "
      "one raw block) for 32 decoded bytes: exactly ZSTD_COMPRESSBOUND(32) = 95, allowed")
def _(root: Path) -> Any:
    frame = padded_frame(DATA, 18)
    assert len(frame) == zstd_bound(len(DATA)) == 95
    return zstd_version(root, frame)


@case("valid-zstd-window-2-27", "R-TENSOR-10: Window_Descriptor 0x88 (a 2^27-byte window, the "
      "largest allowed) on a frame that is not single-segment and declares its 32 bytes")
def _(root: Path) -> Any:
    return zstd_version(root, windowed_frame(DATA, 0x88))


# ---------------------------------------------------------------------------------- invalid
@case("invalid-zstd-frame-over-bound", "R-TENSOR-10: a 131-byte frame (30 empty raw blocks, "
      "then one raw block) that decodes to the 32 bytes of the range, more than "
      "ZSTD_COMPRESSBOUND(32) = 95; decided from the header and the stored length",
      code="PCK-CODEC")
def _(root: Path) -> None:
    frame = padded_frame(DATA, 30)
    assert len(frame) == 131 > zstd_bound(len(DATA))
    zstd_version(root, frame)


@case("invalid-zstd-window-2-28", "R-TENSOR-10: Window_Descriptor 0x90 (a 2^28-byte window) "
      "on a frame that is not single-segment and declares its 32 bytes (libzstd decodes it "
      "in one shot; the window is above 2^27)", code="PCK-CODEC")
def _(root: Path) -> None:
    zstd_version(root, windowed_frame(DATA, 0x90))


@case("invalid-zstd-declared-size", "R-TENSOR-7: a valid frame whose header declares 24 "
      "decoded bytes for a range of 32 (int64[4]); visible from the frame header (R-VERIFY-2)",
      code="PCK-CODEC")
def _(root: Path) -> None:
    zstd_version(root, raw_frame(DATA[:24]))


@case("invalid-zstd-skippable-first", "R-TENSOR-6: a skippable frame (magic 5F 2A 4D 18, the "
      "last of the skippable range) before the zstd frame; visible from the first 4 bytes "
      "(R-VERIFY-2)", code="PCK-CODEC")
def _(root: Path) -> None:
    zstd_version(root, b"\x5f\x2a\x4d\x18" + struct.pack("<I", 4) + b"skip" + raw_frame(DATA))


@case("invalid-entry-zstd-over-bound", "R-TENSOR-10 through R-ENTRY-6: a json+zstd entry value "
      "whose frame declares its 8 bytes and is 74 bytes long (19 empty raw blocks), more than "
      "ZSTD_COMPRESSBOUND(8) = 71", code="PCK-CODEC")
def _(root: Path) -> None:
    v = V()
    v.tensor("w", "int64", [4], VALUES)
    v.entry("meta", {"n": 1}, zstd=True)
    raw = json.dumps({"n": 1}).encode()
    frame = padded_frame(raw, 19)
    assert len(frame) == 74 > zstd_bound(len(raw)) == 71
    v.files["entries/meta.g.json.zst"] = frame
    write_version(root, v)


@case("invalid-step-float", "\"step\": 42.0: an integer member written with a fraction part is "
      "not an integer (PCK-SCHEMA), whatever its value; reported as such, not as an attempt id "
      "that does not encode the step", code="PCK-SCHEMA")
def _(root: Path) -> None:
    v = V(42)
    v.tensor("w", "int64", [4], VALUES)
    write_version(root, v, mutate_manifest=lambda m: m.update(step=42.0))


@case("valid-timestamp-fields", "R-COMMIT-18: timestamps are patterns compared field by "
      "field, not calendar dates: committed_at 2026-02-31T00:00:00Z (no such day) and earlier "
      "than created_at is a valid version")
def _(root: Path) -> Any:
    v = V()
    v.tensor("w", "int64", [4], VALUES)
    v.extra.update(created_at="2026-03-01T00:00:00Z", committed_at="2026-02-31T00:00:00Z")
    write_version(root, v)
    return v


@case("invalid-entry-integer-overflow", "R-SEC-9: an entry value holds the integer token 1 "
      "followed by 400 zeros, which overflows a double as 1e400 does (decided by the value, not "
      "by a parser's digit limit)", code="PCK-JSON-INVALID")
def _(root: Path) -> None:
    v = V()
    v.tensor("w", "int64", [4], VALUES)
    v.entry("big", {"n": 1})
    v.files["entries/big.g.json"] = b'{"n": 1' + b"0" * 400 + b"}"
    write_version(root, v)


@case("invalid-zstd-empty-range", "R-TENSOR-6: a zstd range stored as a U8 tensor of 0 bytes "
      "(n >= 1 is required): PCK-SHARD-MISMATCH, from the shard header alone",
      code="PCK-SHARD-MISMATCH")
def _(root: Path) -> None:
    zstd_version(root, b"")


@case("writer-index-disagrees", "R-INDEX-6: a stored writer index, listed in files, declares "
      "tensor w as int32 where the manifest says int64: a checker reports "
      "PCK-METADATA-CONFLICT; readers never read indexes (R-INDEX-5) and read the version",
      code="PCK-METADATA-CONFLICT", reader="accept")
def _(root: Path) -> Any:
    v = V()
    v.tensor("w", "int64", [4], VALUES)

    def with_index(files: dict[str, bytes], m: dict[str, Any]) -> None:
        tensors = json.loads(json.dumps(m["tensors"]))
        tensors["w"]["dtype"] = "int32"
        index = {"format": "portable-ckpt-writer-index", "format_version": "1.0",
                 "attempt_id": m["attempt_id"], "writer": 0,
                 "files": {SHARD: m["files"][SHARD]}, "tensors": tensors, "entries": {}}
        files["index/w00000.json"] = (json.dumps(index, indent=1) + "\n").encode()
        m["files"]["index/w00000.json"] = E1.G.file_record(files["index/w00000.json"])

    write_version(root, v, after_records=with_index)
    return v


DESCRIPTION = ("Golden vectors of errata 3 (spec §20): zstd frame headers (R-TENSOR-6, "
               "R-TENSOR-7, R-TENSOR-10; visible without reading data blocks, R-VERIFY-2) and "
               "an integer member written as 42.0. 'target' is relative to the case directory.")


def main(argv: list[str] | None = None) -> int:
    """Write every case below ``--out`` (default: ``errata-3`` next to this script)."""
    return int(E1.write_set(argv, CASES, "errata-3", DESCRIPTION, __doc__))


if __name__ == "__main__":
    sys.exit(main())
