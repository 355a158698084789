#!/usr/bin/env python3
"""Generate the golden vectors of errata 4 (run once; the output is frozen and committed).

Errata 4 adds the cases for rules of the text that the conformance checker did not enforce, or
enforced where the text does not, found by an outside team that used the suite as a CI gate:

* R-INDEX-6 for every stored writer index: one whose number has six digits (``index/w<writer:05d>``
  means at least five, §2.1), one that declares an entry with ``{"const": 1}`` where the manifest
  has ``{"const": true}`` (declarations are JSON values: ``true`` is not ``1``), and versions with
  tensor tables, whose indexes are now compared tensor by tensor like JSON ones (§14.2);
* R-DRILL-1 / R-DRILL-6: drill and copy records stored under a name other than their id;
* R-SEC-2: a symbolic link in an attempt (created at test time, ``setup``), which no document
  references;
* R-SHARD-1 rule 3: a zero-size tensor of a shard header with a dimension above MAXINT;
* R-LAYOUT-4: a root with children that are no attempts (one holds a ``manifest.json``, others
  are named ``data`` and ``index``), and R-FILES-1: a file named ``manifest.jsonl``, which
  ``files`` may list (only ``manifest.json`` and ``manifest.json.<anything>`` are forbidden).

Every case marked ``"reader": "accept"`` breaks a rule that readers do not check (they never read
writer indexes, drill or copy records, R-INDEX-5, or a file that no document references,
R-LAYOUT-4): a checker reports ``code``, a reader reads ``expected``.

Uses the builders of ``generate_1_0.py`` and ``generate_1_1.py`` (standard library, numpy,
crc32c; they import zstandard, but no case here holds a zstd frame, so the bytes do not depend
on a compressor's version). Refuses to touch an existing vector directory unless ``--force`` is
given.

Usage: python conformance/vectors/generate_errata_4.py [--out DIR] [--force]
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
    spec = importlib.util.spec_from_file_location(f"pck_{stem}_for_errata_4", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


G = _load("generate_1_0")
E1 = _load("generate_errata_1")  # its command line writes this set too
T = _load("generate_1_1")
V, write_version, file_record = G.V, G.write_version, G.file_record
SHARD = "data/w00000-0000.safetensors"
VALUES = [-7, 993, 1993, 2993]
CASES: list[dict[str, Any]] = []


def case(name: str, feature: str, *, code: str | None = None, reader: str | None = None,
         target: str = "version", setup: list[dict[str, str]] | None = None) -> Callable[
        [Callable[[Path], Any]], Callable[[Path], Any]]:
    """Register a case generator (valid when ``code`` is None).

    ``target`` is ``"version"`` (the root's only attempt) or ``"root"``; ``setup`` paths start
    with ``VERSION/``, replaced by the attempt's path below the case directory.
    """
    def deco(fn: Callable[[Path], Any]) -> Callable[[Path], Any]:
        CASES.append({"name": name, "feature": feature, "code": code, "reader": reader,
                      "target": target, "setup": setup or [], "fn": fn})
        return fn
    return deco


def one_tensor(step: int = 10) -> Any:
    """``w`` (int64[4], one range) and one global entry."""
    v = V(step)
    v.tensor("w", "int64", [4], VALUES)
    v.entry("meta", {"note": "errata-4"})
    return v


def _index(m: dict[str, Any], writer: int, *, tensors: dict[str, Any] | None = None,
           entries: dict[str, Any] | None = None, files: list[str] | None = None
           ) -> dict[str, Any]:
    """A 1.0 writer index of the version of manifest ``m``.

    It lists ``files`` (default: all of the manifest's), ``tensors`` and ``entries`` (default:
    the manifest's).
    """
    return {"format": "portable-ckpt-writer-index", "format_version": "1.0",
            "attempt_id": m["attempt_id"], "writer": writer,
            "files": {k: m["files"][k] for k in (list(m["files"]) if files is None else files)},
            "tensors": json.loads(json.dumps(m["tensors"] if tensors is None else tensors)),
            "entries": json.loads(json.dumps(m["entries"] if entries is None else entries))}


def _store_index(files: dict[str, bytes], m: dict[str, Any], rel: str,
                 index: dict[str, Any]) -> None:
    """Store ``index`` at ``rel`` and list it in the manifest's files (R-FILES-1)."""
    files[rel] = (json.dumps(index, indent=1) + "\n").encode()
    m["files"][rel] = file_record(files[rel])
    m["files"] = dict(sorted(m["files"].items()))


# ------------------------------------------------------------------------------------ valid
@case("valid-root-non-attempt-children", "R-LAYOUT-4: a root holding, besides its version, a "
      "child notes/ with a manifest.json ({}), and children data/ and index/ with files in "
      "them: none is an attempt (their names do not match the pattern), all are ignored",
      target="root")
def _(root: Path) -> Any:
    v = one_tensor()
    write_version(root, v)
    (root / "notes").mkdir()
    (root / "notes" / "manifest.json").write_text("{}\n")
    (root / "data").mkdir()
    (root / "data" / "README.txt").write_text("not an attempt\n")
    (root / "index").mkdir()
    (root / "index" / "w00000.json").write_text("{}\n")
    return v


@case("valid-files-manifest-jsonl", "R-FILES-1, §19.2: a file manifest.jsonl, listed in files "
      "with its checksum: only manifest.json and manifest.json.<anything> are forbidden keys")
def _(root: Path) -> Any:
    v = one_tensor()
    v.files["manifest.jsonl"] = b'{"line": 1}\n{"line": 2}\n'
    write_version(root, v)
    return v


@case("valid-table-manifest-json-index", "R-INDEX-6 across forms: a 1.1 manifest with a tensor "
      "table and a stored 1.0 writer index with JSON tensors whose ranges carry the implied "
      "names of the table's records (R-TABLE-7): the index is part of the manifest")
def _(root: Path) -> Any:
    v = T.basic("none")

    def ar(files: dict[str, bytes], m: dict[str, Any]) -> None:
        own = [k for k in m["files"] if k != v.table_file()]
        _store_index(files, m, "index/w00000.json",
                     _index(m, 0, tensors=v.tensors, files=own))

    T.write_version(root, v, after_records=ar)
    return v


# ---------------------------------------------------------------------------------- invalid
@case("writer-index-6-digits-disagrees", "R-INDEX-6, §2.1: a stored writer index "
      "index/w123456.json (writer 123456: at least five digits), listed in files, declares "
      "tensor w as int32 where the manifest says int64: a checker reads it as an index and "
      "reports PCK-METADATA-CONFLICT; readers never read indexes (R-INDEX-5)",
      code="PCK-METADATA-CONFLICT", reader="accept")
def _(root: Path) -> Any:
    v = one_tensor()

    def ar(files: dict[str, bytes], m: dict[str, Any]) -> None:
        tensors = json.loads(json.dumps(m["tensors"]))
        tensors["w"]["dtype"] = "int32"
        _store_index(files, m, "index/w123456.json", _index(m, 123456, tensors=tensors))

    write_version(root, v, after_records=ar)
    return v


@case("writer-index-const-true-vs-1", "R-INDEX-6: the manifest declares entry cfg with the "
      "embedded schema {\"const\": true}, a stored index with {\"const\": 1}: declarations are "
      "JSON values, and true is not 1 (PCK-METADATA-CONFLICT; readers never read indexes)",
      code="PCK-METADATA-CONFLICT", reader="accept")
def _(root: Path) -> Any:
    v = V()
    v.tensor("w", "int64", [4], VALUES)
    v.entry("cfg", True, schema={"json_schema": {"const": True}})

    def ar(files: dict[str, bytes], m: dict[str, Any]) -> None:
        entries = json.loads(json.dumps(m["entries"]))
        entries["cfg"]["schema"] = {"json_schema": {"const": 1}}
        _store_index(files, m, "index/w00000.json", _index(m, 0, entries=entries))

    write_version(root, v, after_records=ar)
    return v


@case("writer-index-table-disagrees", "R-INDEX-6 for tensor tables: a 1.1 writer index, listed "
      "in files, holds its tensors in a table of its own (listed in its files and in the "
      "manifest's) whose record of model.w is one box [0, 0] + [4, 3]; the manifest's table has "
      "two row blocks: the index's range is not the manifest's (PCK-METADATA-CONFLICT; readers "
      "never read indexes)", code="PCK-METADATA-CONFLICT", reader="accept")
def _(root: Path) -> Any:
    v = T.basic("none")

    def mf(files: dict[str, bytes]) -> None:
        whole = json.loads(json.dumps(v.tensors))
        r0 = whole["model.w"]["ranges"][0]
        whole["model.w"]["ranges"] = [dict(r0, offsets=[0, 0], lengths=[4, 3])]
        T.table_index(v, files, whole)

    T.write_version(root, v, mutate_files=mf)
    return v


def _record(kind: str, m: dict[str, Any], rid: str) -> dict[str, Any]:
    if kind == "drill":
        return {"format": "portable-ckpt-drill", "format_version": "1.0",
                "attempt_id": m["attempt_id"], "drill_id": rid, "ok": True,
                "started_at": "2026-01-01T00:00:02Z", "finished_at": "2026-01-01T00:00:03Z",
                "world_size": 1, "saved_world_size": 1, "contract": "exact",
                "measurements": {"restore_seconds": 0.5}, "error": None}
    return {"format": "portable-ckpt-copy", "format_version": "1.0",
            "attempt_id": m["attempt_id"], "copy_id": rid,
            "destination": "s3://ckpt-archive/runs/errata-4",
            "verified_at": "2026-01-01T00:00:04Z", "ok": True}


@case("drill-record-misnamed", "R-DRILL-1: a valid drill record of the version stored as "
      "drills/d20260101T000009000000Z-00000000.json, but its drill_id is "
      "d20260101T000002000000Z-0123abcd: PCK-SCHEMA for a checker; a drill record is not part "
      "of the version (§14.3), readers read it as usual", code="PCK-SCHEMA", reader="accept")
def _(root: Path) -> Any:
    return _misnamed(root, "drill", "d20260101T000009000000Z-00000000",
                     "d20260101T000002000000Z-0123abcd")


@case("copy-record-misnamed", "R-DRILL-6: a valid copy record of the version stored as "
      "copies/c20260101T000009000000Z-00000000.json, but its copy_id is "
      "c20260101T000004000000Z-5e6f7a8b: PCK-SCHEMA for a checker; readers read the version",
      code="PCK-SCHEMA", reader="accept")
def _(root: Path) -> Any:
    return _misnamed(root, "copy", "c20260101T000009000000Z-00000000",
                     "c20260101T000004000000Z-5e6f7a8b")


def _misnamed(root: Path, kind: str, name: str, record_id: str) -> Any:
    """One version, with a valid ``kind`` record of id ``record_id`` stored as ``name``."""
    v = one_tensor()
    vdir = write_version(root, v)
    m = json.loads((vdir / "manifest.json").read_text())
    sub = {"drill": "drills", "copy": "copies"}[kind]
    (vdir / sub).mkdir()
    (vdir / sub / f"{name}.json").write_text(
        json.dumps(_record(kind, m, record_id), indent=1) + "\n")
    return v


@case("writer-symlink-in-attempt", "R-SEC-2: data/link.safetensors is a symbolic link to "
      "w00000-0000.safetensors in the same directory (created at test time, see setup); no "
      "document references it: a checker reports PCK-PATH-UNSAFE, readers ignore the file "
      "(R-LAYOUT-4) and read the version", code="PCK-PATH-UNSAFE", reader="accept",
      setup=[{"op": "symlink", "path": "VERSION/data/link.safetensors",
              "target": "w00000-0000.safetensors"}])
def _(root: Path) -> Any:
    v = one_tensor()
    write_version(root, v)
    return v


@case("invalid-shard-shape-above-maxint", "R-SHARD-1 rule 3: the shard header holds, besides "
      "the range, a zero-size tensor of shape [0, 2^60]: a dimension above MAXINT = 2^53 - 1, "
      "although its span is 0 bytes", code="PCK-SHARD-HEADER")
def _(root: Path) -> None:
    v = one_tensor()

    def mf(files: dict[str, bytes]) -> None:
        data = G.encode("int64", VALUES)
        hdr = {"w@0": {"dtype": "I64", "shape": [4], "data_offsets": [0, 32]},
               "junk": {"dtype": "F32", "shape": [0, 2**60], "data_offsets": [32, 32]}}
        h = json.dumps(hdr, separators=(",", ":")).encode()
        h += b" " * (-len(h) % 8)
        files[SHARD] = struct.pack("<Q", len(h)) + h + data

    write_version(root, v, mutate_files=mf)


DESCRIPTION = ("Golden vectors of errata 4 (spec §20): R-INDEX-6 for every stored writer index "
               "(six-digit numbers, JSON identity of declarations, tensor tables), drill and "
               "copy records under another name, a symbolic link in an attempt, a shard header "
               "dimension above MAXINT, non-attempt children of a root and a files key "
               "manifest.jsonl. 'target' is relative to the case directory. 'reader': 'accept' "
               "marks a rule readers do not check: a conformance checker reports 'code', a "
               "reader reads 'expected'.")


def main(argv: list[str] | None = None) -> int:
    """Write every case below ``--out`` (default: ``errata-4`` next to this script)."""
    return int(E1.write_set(argv, CASES, "errata-4", DESCRIPTION, __doc__))


if __name__ == "__main__":
    sys.exit(main())
