#!/usr/bin/env python3
"""Generate the golden vectors of errata 1 (run once; the output is frozen and committed).

Errata 1 of formats 1.0/1.1 (spec §16.4, §20) states rules the text left to guessing and that
the reference tools did not agree on. Every case here is a checkpoint that was already valid,
or already broke a MUST of the text, before the errata; none needs a new format version. The
cases are file-level: shard headers and data areas (R-SHARD-1, R-SHARD-9, R-SHARD-10), zstd
frames (R-TENSOR-7), bool bytes (R-DTYPE-4), schema patterns (R-ENTRY-15, §18.7) and the
end-of-string pitfall of Python's ``$`` (format_version, timestamps, paths).

A case with ``"valid": false`` and ``"reader": "accept"`` breaks a rule that binds writers only
(R-SHARD-10): a conformance checker reports ``code``, a reader reads it (``expected``).

Uses only the standard library, numpy and crc32c: zstd frames are written by hand as one raw
block (RFC 8878 §3.1.1), so the bytes do not depend on a compressor's version. Refuses to touch
an existing vector directory unless ``--force`` is given.

Usage: python conformance/vectors/generate_errata_1.py [--out DIR] [--force]
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _load_1_0() -> Any:
    """The 1.0 generator (same directory): its builders and encoders are reused."""
    import importlib.util

    path = Path(__file__).resolve().with_name("generate_1_0.py")
    spec = importlib.util.spec_from_file_location("pck_generate_1_0_for_errata", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


G = _load_1_0()
V, write_version, encode = G.V, G.write_version, G.encode
SHARD = "data/w00000-0000.safetensors"
CASES: list[dict[str, Any]] = []


def raw_frame(data: bytes) -> bytes:
    """One zstd frame holding ``data`` in one raw block, with its content size (≤ 128 KiB).

    Magic ``28 b5 2f fd``; frame header descriptor ``0xa0`` (4-byte content size, single
    segment, no checksum, no dictionary); the content size; one block header (last block, raw,
    ``len(data)``: ``1 | len << 3`` as 3 little-endian bytes); the bytes themselves.
    """
    assert 0 < len(data) <= 128 << 10
    block = struct.pack("<I", 1 | (len(data) << 3))[:3]
    return b"\x28\xb5\x2f\xfd\xa0" + struct.pack("<I", len(data)) + block + data


def case(name: str, feature: str, *, code: str | None = None, deep: bool = False,
         reader: str | None = None) -> Callable[[Callable[[Path], Any]], Callable[[Path], Any]]:
    """Register a case generator (valid when ``code`` is None)."""
    def deco(fn: Callable[[Path], Any]) -> Callable[[Path], Any]:
        CASES.append({"name": name, "feature": feature, "code": code, "deep": deep,
                      "reader": reader, "fn": fn})
        return fn
    return deco


def two_tensors(step: int = 10) -> Any:
    """``a`` (int32[4]) and ``b`` (int32[4]) in one shard, one global entry."""
    v = V(step)
    v.tensor("a", "int32", [4], [1, 2, 3, 4])
    v.tensor("b", "int32", [4], [5, 6, 7, 8])
    v.entry("meta", {"note": "errata-1"})
    return v


def header_bytes(doc: dict[str, Any], *, pad: bytes = b" ", align: bool = True,
                 lead: bytes = b"") -> bytes:
    """``N`` and a header: JSON text, then padding (R-SHARD-2 unless told otherwise)."""
    h = lead + json.dumps(doc, separators=(",", ":")).encode()
    if align:
        h += pad * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h


def shard(items: list[tuple[str, str, list[int], int, int]], data: bytes, **kw: Any) -> bytes:
    """A safetensors file with explicit spans: (name, dtype, shape, begin, end)."""
    doc: dict[str, Any] = {"__metadata__": {"format": "pt", "portable_ckpt": "1.0"}}
    for name, dt, shape, b, e in items:
        doc[name] = {"dtype": dt, "shape": shape, "data_offsets": [b, e]}
    return header_bytes(doc, **kw) + data


A = encode("int32", [1, 2, 3, 4])
B = encode("int32", [5, 6, 7, 8])


def with_shard(v: Any, data: bytes) -> Callable[[dict[str, bytes]], None]:
    """A ``mutate_files`` hook that replaces the version's only shard by ``data``."""
    del v

    def mf(files: dict[str, bytes]) -> None:
        files[SHARD] = data
    return mf


# ------------------------------------------------------------------------------------ valid
@case("valid-shard-unsorted-header", "R-SHARD-1 rule 4: the header lists tensors out of data "
      "order and has a zero-size tensor between them; the spans still tile the data area")
def _(root: Path) -> Any:
    v = two_tensors()
    data = shard([("b@0", "I32", [4], 16, 32), ("z", "F32", [0, 3], 16, 16),
                  ("a@0", "I32", [4], 0, 16)], A + B)
    write_version(root, v, mutate_files=with_shard(v, data))
    return v


@case("valid-zstd-raw-block", "a zstd range stored as one raw block with its content size (the "
      "frame of the worked example, §21)")
def _(root: Path) -> Any:
    v = V()
    v.tensor("z", "float32", [2, 2], [1.0, 2.0, 3.0, 4.0], [([0, 0], [1, 2], 0),
                                                            ([1, 0], [1, 2], 0)])
    frame = raw_frame(encode("float32", [3.0, 4.0]))
    v.st[SHARD][1] = ("z@1,0", "U8", [len(frame)], frame)
    v.tensors["z"]["ranges"][1]["codec"] = "zstd"
    write_version(root, v)
    return v


@case("valid-bool-zstd", "bool tensor in a none range and a zstd range, bytes 0x00/0x01 only")
def _(root: Path) -> Any:
    v = V()
    v.tensor("m", "bool", [2, 3], [True, False, True, False, False, True],
             [([0, 0], [1, 3], 0), ([1, 0], [1, 3], 0)])
    frame = raw_frame(bytes([0, 0, 1]))
    v.st[SHARD][1] = ("m@1,0", "U8", [len(frame)], frame)
    v.tensors["m"]["ranges"][1]["codec"] = "zstd"
    write_version(root, v)
    return v


@case("valid-embedded-patterns", "embedded schema patterns of the portable subset (§18.7): "
      "escapes \\u00e9 and \\x41, a named group, \\s with U+00A0, and ^(a+)+$ on a long value")
def _(root: Path) -> Any:
    v = V()
    v.tensor("w", "float32", [1], [1.0])
    schema = {"type": "object", "required": ["a", "b", "c", "d"], "properties": {
        "a": {"pattern": "^(a+)+$"}, "b": {"pattern": "^caf\\u00e9 \\x41$"},
        "c": {"pattern": "^(?<y>[0-9]{4})-[0-9]{2}$"}, "d": {"pattern": "^x\\sy$"}},
        "patternProperties": {"^e[0-9]$": {"type": "integer"}}}
    v.entry("patterns", {"a": "a" * 4096, "b": "café A", "c": "2026-01", "d": "x\u00a0y",
                         "e1": 7}, schema={"json_schema": schema})
    write_version(root, v)
    return v


# ---------------------------------------------------------------------------------- invalid
@case("invalid-shard-hole", "8 bytes between two tensors that no tensor owns (R-SHARD-9)",
      code="PCK-SHARD-HEADER")
def _(root: Path) -> None:
    v = two_tensors()
    data = shard([("a@0", "I32", [4], 0, 16), ("b@0", "I32", [4], 24, 40)], A + bytes(8) + B)
    write_version(root, v, mutate_files=with_shard(v, data))


@case("invalid-shard-overlap", "two tensors share 8 bytes of the data area (R-SHARD-9)",
      code="PCK-SHARD-HEADER")
def _(root: Path) -> None:
    v = two_tensors()
    data = shard([("a@0", "I32", [4], 0, 16), ("b@0", "I32", [4], 8, 24)], A + B[8:])
    write_version(root, v, mutate_files=with_shard(v, data))


@case("invalid-shard-trailing-bytes", "4 bytes after the last tensor (R-SHARD-9)",
      code="PCK-SHARD-HEADER")
def _(root: Path) -> None:
    v = two_tensors()
    data = shard([("a@0", "I32", [4], 0, 16), ("b@0", "I32", [4], 16, 32)], A + B + bytes(4))
    write_version(root, v, mutate_files=with_shard(v, data))


@case("invalid-shard-header-array", "the header is a JSON array, not an object (R-SHARD-5)",
      code="PCK-SHARD-HEADER")
def _(root: Path) -> None:
    v = two_tensors()
    body = b"[1,2,3] "
    write_version(root, v, mutate_files=with_shard(v, struct.pack("<Q", 8) + body + A + B))


@case("invalid-shard-dtype-unknown", "a header entry with dtype F128 (R-SHARD-5)",
      code="PCK-SHARD-HEADER")
def _(root: Path) -> None:
    v = two_tensors()
    data = shard([("a@0", "I32", [4], 0, 16), ("b@0", "F128", [1], 16, 32)], A + B)
    write_version(root, v, mutate_files=with_shard(v, data))


@case("invalid-shard-span-size", "a header entry spans 12 bytes for an int32[4] (R-SHARD-6)",
      code="PCK-SHARD-HEADER")
def _(root: Path) -> None:
    v = two_tensors()
    data = shard([("a@0", "I32", [4], 0, 12), ("b@0", "I32", [4], 12, 28)], A[:12] + B)
    write_version(root, v, mutate_files=with_shard(v, data))


@case("invalid-shard-metadata-not-strings", "__metadata__ maps a name to a number (R-SHARD-5)",
      code="PCK-SHARD-HEADER")
def _(root: Path) -> None:
    v = two_tensors()
    doc = {"__metadata__": {"format": "pt", "n": 1},
           "a@0": {"dtype": "I32", "shape": [4], "data_offsets": [0, 16]},
           "b@0": {"dtype": "I32", "shape": [4], "data_offsets": [16, 32]}}
    write_version(root, v, mutate_files=with_shard(v, header_bytes(doc) + A + B))


@case("invalid-zstd-trailing-bytes", "a zstd range holds its frame and then 3 more bytes "
      "(R-TENSOR-6, R-TENSOR-7)", code="PCK-CODEC", deep=True)
def _(root: Path) -> None:
    v = V()
    v.tensor("z", "float32", [2], [1.0, 2.0])
    frame = raw_frame(encode("float32", [1.0, 2.0])) + b"\x00\x00\x00"
    v.st[SHARD][0] = ("z@0", "U8", [len(frame)], frame)
    v.tensors["z"]["ranges"][0]["codec"] = "zstd"
    write_version(root, v)


@case("invalid-zstd-skippable-frame", "a skippable frame before the zstd frame (R-TENSOR-6)",
      code="PCK-CODEC", deep=True)
def _(root: Path) -> None:
    v = V()
    v.tensor("z", "float32", [2], [1.0, 2.0])
    frame = b"\x50\x2a\x4d\x18" + struct.pack("<I", 4) + b"skip" + raw_frame(
        encode("float32", [1.0, 2.0]))
    v.st[SHARD][0] = ("z@0", "U8", [len(frame)], frame)
    v.tensors["z"]["ranges"][0]["codec"] = "zstd"
    write_version(root, v)


@case("invalid-zstd-truncated", "the frame's only block is cut short (R-TENSOR-7)",
      code="PCK-CODEC", deep=True)
def _(root: Path) -> None:
    v = V()
    v.tensor("z", "float32", [2], [1.0, 2.0])
    frame = raw_frame(encode("float32", [1.0, 2.0]))[:-2]
    v.st[SHARD][0] = ("z@0", "U8", [len(frame)], frame)
    v.tensors["z"]["ranges"][0]["codec"] = "zstd"
    write_version(root, v)


@case("invalid-bool-byte", "a bool element stored as 0x02 (R-DTYPE-2, R-DTYPE-4)",
      code="PCK-DTYPE-VALUE", deep=True)
def _(root: Path) -> None:
    v = V()
    v.tensor("m", "bool", [4], [True, False, True, True])
    v.st[SHARD][0] = ("m@0", "BOOL", [4], bytes([1, 0, 2, 1]))
    write_version(root, v)


@case("invalid-bool-byte-zstd", "a zstd range decoding to a bool byte 0xff (R-DTYPE-4)",
      code="PCK-DTYPE-VALUE", deep=True)
def _(root: Path) -> None:
    v = V()
    v.tensor("m", "bool", [4], [True, False, True, True])
    frame = raw_frame(bytes([1, 0, 1, 255]))
    v.st[SHARD][0] = ("m@0", "U8", [len(frame)], frame)
    v.tensors["m"]["ranges"][0]["codec"] = "zstd"
    write_version(root, v)


def _embedded(root: Path, schema: dict[str, Any], value: Any) -> None:
    v = V()
    v.tensor("w", "float32", [1], [1.0])
    v.entry("cfg", value, schema={"json_schema": schema})
    write_version(root, v)


@case("invalid-pattern-lookahead", "an embedded schema pattern with a lookahead, which no value "
      "reaches (R-ENTRY-15, §18.7)", code="PCK-ENTRY-SCHEMA")
def _(root: Path) -> None:
    _embedded(root, {"type": "object", "properties": {"x": {"pattern": "(?=a)b"}}}, {})


@case("invalid-pattern-rejects-value", "40 a's and a '!' against ^(a+)+$: refused, in linear "
      "time (R-ENTRY-15)", code="PCK-ENTRY-SCHEMA")
def _(root: Path) -> None:
    _embedded(root, {"type": "string", "pattern": "^(a+)+$"}, "a" * 40 + "!")


@case("invalid-pattern-dollar-newline", "\"abc\\n\" against ^[a-z]+$: $ is the end of the input "
      "(§18.7; Python's re would accept it)", code="PCK-ENTRY-SCHEMA")
def _(root: Path) -> None:
    _embedded(root, {"type": "string", "pattern": "^[a-z]+$"}, "abc\n")


@case("invalid-pattern-unicode-word", "\"é\" against ^\\w$: \\w is ASCII (§18.7)",
      code="PCK-ENTRY-SCHEMA")
def _(root: Path) -> None:
    _embedded(root, {"type": "string", "pattern": "^\\w$"}, "é")


@case("invalid-format-version-newline", "format_version \"1.0\\n\" (R-COMMIT-15; a $ pitfall)",
      code="PCK-SCHEMA")
def _(root: Path) -> None:
    write_version(root, two_tensors(), mutate_manifest=lambda m: m.update(
        format_version="1.0\n"))


@case("invalid-timestamp-newline", "committed_at ends with \"\\n\" (R-COMMIT-15)",
      code="PCK-SCHEMA")
def _(root: Path) -> None:
    write_version(root, two_tensors(), mutate_manifest=lambda m: m.update(
        committed_at="2026-01-01T00:00:01.000000Z\n"))


@case("invalid-timestamp-month-13", "created_at in month 13 (R-COMMIT-15)", code="PCK-SCHEMA")
def _(root: Path) -> None:
    write_version(root, two_tensors(), mutate_manifest=lambda m: m.update(
        created_at="2026-13-01T00:00:00.000000Z"))


@case("invalid-path-newline", "an entry value file whose path ends with \"\\n\": refused "
      "before any storage operation, so no such file exists (R-LAYOUT-6)",
      code="PCK-PATH-UNSAFE")
def _(root: Path) -> None:
    def ar(files: dict[str, bytes], m: dict[str, Any]) -> None:
        del files["entries/meta.g.json"]
        m["files"]["entries/meta.g.json\n"] = m["files"].pop("entries/meta.g.json")
        m["entries"]["meta"]["values"][0]["file"] = "entries/meta.g.json\n"
    write_version(root, two_tensors(), after_records=ar)


# ------------------------------------------------------- writer rules that readers do not check
@case("writer-header-unaligned", "the header length N is not a multiple of 8 (R-SHARD-2): a "
      "checker reports it, a reader reads the shard (R-SHARD-10)", code="PCK-SHARD-HEADER", reader="accept")
def _(root: Path) -> Any:
    v = two_tensors()
    data = shard([("a@0", "I32", [4], 0, 16), ("b@0", "I32", [4], 16, 32)], A + B, align=False)
    write_version(root, v, mutate_files=with_shard(v, data))
    return v


@case("writer-header-newline-padding", "the header is padded with 0x0a, not spaces (R-SHARD-2)",
      code="PCK-SHARD-HEADER", reader="accept")
def _(root: Path) -> Any:
    v = two_tensors()
    data = shard([("a@0", "I32", [4], 0, 16), ("b@0", "I32", [4], 16, 32)], A + B, pad=b"\n")
    write_version(root, v, mutate_files=with_shard(v, data))
    return v


@case("writer-header-leading-space", "the header starts with a space before '{' (R-SHARD-2)",
      code="PCK-SHARD-HEADER", reader="accept")
def _(root: Path) -> Any:
    v = two_tensors()
    data = shard([("a@0", "I32", [4], 0, 16), ("b@0", "I32", [4], 16, 32)], A + B, lead=b" ")
    write_version(root, v, mutate_files=with_shard(v, data))
    return v


DESCRIPTION = ("Golden vectors of errata 1 (spec §20): file-level cases for rules of formats 1.0 "
               "and 1.1 that the text now states. 'target' is relative to the case directory. "
               "'reader': 'accept' marks a writer-only rule: a conformance checker reports "
               "'code', a reader reads 'expected'.")


def main(argv: list[str] | None = None) -> int:
    """Write every case below ``--out`` (default: ``errata-1`` next to this script)."""
    return write_set(argv, CASES, "errata-1", DESCRIPTION, __doc__)


def registry(cases: list[dict[str, Any]], **defaults: Any) -> Callable[..., Any]:
    """The ``case`` decorator of a later errata set: registers its generators in ``cases``.

    ``case(name, feature, code=None, reader=None, **more)``: valid when ``code`` is None;
    ``defaults`` (e.g. ``target="root"``) and ``more`` are members of the case.
    """
    def case(name: str, feature: str, *, code: str | None = None, reader: str | None = None,
             **more: Any) -> Callable[[Callable[[Path], Any]], Callable[[Path], Any]]:
        def deco(fn: Callable[[Path], Any]) -> Callable[[Path], Any]:
            cases.append({"name": name, "feature": feature, "code": code, "reader": reader,
                          "target": "version", "setup": [], **defaults, **more, "fn": fn})
            return fn
        return deco
    return case


def write_set(argv: list[str] | None, cases: list[dict[str, Any]], set_name: str,
              description: str, doc: str | None, *, format_version: str = "1.1",
              write_case: Callable[[Path, dict[str, Any]], dict[str, Any]] | None = None,
              kind: str | None = None) -> int:
    """The command line of an errata set's generator: write ``cases`` as set ``set_name``.

    ``format_version``: the newest format version the set's cases use (``cases.json``);
    ``write_case(out, case)`` writes one case and returns its record (default: a reader and
    checker case); ``kind``: a set of another kind of case (``"retention"``, spec §20.1).
    """
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / set_name))
    ap.add_argument("--force", action="store_true", help="overwrite existing vectors")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if out.is_dir() and any(out.iterdir()) and not args.force:
        print(f"refusing to overwrite the vectors in {out}; published vectors are frozen",
              file=sys.stderr)
        return 1
    if args.force and out.is_dir():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    index = [(write_case or _write_case)(out, c) for c in cases]
    doc_out = {"format_version": format_version, "set": set_name,
               **({"kind": kind} if kind else {}), "description": description, "cases": index}
    (out / "cases.json").write_text(json.dumps(doc_out, indent=1) + "\n")
    print(f"wrote {len(index)} cases to {out}")
    return 0


def _write_case(out: Path, c: dict[str, Any]) -> dict[str, Any]:
    cdir = out / c["name"]
    root = cdir / "root"
    root.mkdir(parents=True)
    v = c["fn"](root)
    version = f"root/{sorted(p.name for p in root.iterdir() if p.is_dir())[0]}"
    # Later sets may target the root itself, and set a case up at test time (``setup`` paths
    # start with ``VERSION/``, the version's path below the case directory).
    target = "root" if c.get("target") == "root" else version
    rec: dict[str, Any] = {"name": c["name"], "feature": c["feature"],
                           "valid": c["code"] is None, "target": target}
    if c["code"]:
        rec["code"] = c["code"]
        rec["deep"] = c.get("deep", False)
    if c["reader"]:
        rec["reader"] = c["reader"]
    if "failed_verification" in c:  # (from set 1.2 on, §20)
        rec["failed_verification"] = c["failed_verification"]
    if c.get("setup"):
        rec["setup"] = [dict(s, path=s["path"].replace("VERSION", version)) for s in c["setup"]]
    if v is not None:
        (cdir / "expected.json").write_text(json.dumps(v.expected(), indent=1) + "\n")
        rec["expected"] = f"{c['name']}/expected.json"
    return rec


if __name__ == "__main__":
    sys.exit(main())
