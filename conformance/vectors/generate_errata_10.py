#!/usr/bin/env python3
"""Generate the golden vectors of errata 10 (run once; the output is frozen and committed).

Errata 10's items that a checker or reader decides on the bytes of one version:

* R-INDEX-6 compares a stored writer index's file records with the manifest's by path **and
  size**: an index that lists a file it wrote with another size than the manifest is not part
  of the manifest (``PCK-METADATA-CONFLICT`` for a checker; readers never read indexes);
* §11.1: a zero-size tensor of a shard header may sit at a boundary between the spans of the
  other tensors (valid), never inside a span (``PCK-SHARD-HEADER``).

Uses the builders of ``generate_1_0.py`` and ``generate_errata_4.py`` (standard library, numpy,
crc32c). Refuses to touch an existing vector directory unless ``--force`` is given.

Usage: python conformance/vectors/generate_errata_10.py [--out DIR] [--force]
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
    spec = importlib.util.spec_from_file_location(f"pck_{stem}_for_errata_10", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


G = _load("generate_1_0")
E1 = _load("generate_errata_1")  # its command line writes this set too
E4 = _load("generate_errata_4")
V, write_version, file_record = G.V, G.write_version, G.file_record
SHARD = "data/w00000-0000.safetensors"
A_VALUES = [-7, 993]
B_VALUES = [1.5, -2.25, 3.0, 0.125]

#: A case's generator: writes the case below a root; returns its version builder or None.
Generator = Callable[[Path], Any]
CASES: list[dict[str, Any]] = []
case: Callable[..., Callable[[Generator], Generator]] = E1.registry(CASES)


@case("writer-index-file-size-disagrees", "R-INDEX-6 (errata 10): a stored writer index, "
      "listed in files, lists the shard with the manifest's checksum but a size 8 bytes "
      "larger: file records are compared by path and size, so the index is not part of the "
      "manifest (PCK-METADATA-CONFLICT for a checker; readers never read indexes, R-INDEX-5)",
      code="PCK-METADATA-CONFLICT", reader="accept")
def _(root: Path) -> Any:
    v = E4.one_tensor()

    def ar(files: dict[str, bytes], m: dict[str, Any]) -> None:
        index = E4._index(m, 0, files=[SHARD])
        index["files"][SHARD] = dict(index["files"][SHARD], size=m["files"][SHARD]["size"] + 8)
        E4._store_index(files, m, "index/w00000.json", index)

    write_version(root, v, after_records=ar)
    return v


def _two_tensors_and_an_empty_one(empty_at: int) -> tuple[Any, Callable[[dict[str, bytes]], None]]:
    """``a`` (int64[2]) and ``b`` (float32[4]) in one shard, and a zero-size ``z`` at ``empty_at``."""
    v = V()
    v.tensor("a", "int64", [2], A_VALUES)
    v.tensor("b", "float32", [4], B_VALUES)

    def mf(files: dict[str, bytes]) -> None:
        a, b = G.encode("int64", A_VALUES), G.encode("float32", B_VALUES)
        hdr = {"a@0": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]},
               "z": {"dtype": "F32", "shape": [0], "data_offsets": [empty_at, empty_at]},
               "b@0": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}}
        h = json.dumps(hdr, separators=(",", ":")).encode()
        h += b" " * (-len(h) % 8)
        files[SHARD] = struct.pack("<Q", len(h)) + h + a + b

    return v, mf


@case("valid-shard-zero-size-between-spans", "§11.1 rule 4 (errata 10): the shard header holds, "
      "besides the ranges a@0 [0, 16) and b@0 [16, 32), a zero-size tensor z with data_offsets "
      "[16, 16]: at the boundary between two spans, which is valid")
def _(root: Path) -> Any:
    v, mf = _two_tensors_and_an_empty_one(16)
    write_version(root, v, mutate_files=mf)
    return v


@case("invalid-shard-zero-size-inside-span", "§11.1 rule 4 (errata 10): the shard header holds, "
      "besides the ranges a@0 [0, 16) and b@0 [16, 32), a zero-size tensor z with data_offsets "
      "[8, 8]: inside a@0's span, which no boundary is (PCK-SHARD-HEADER)",
      code="PCK-SHARD-HEADER")
def _(root: Path) -> None:
    v, mf = _two_tensors_and_an_empty_one(8)
    write_version(root, v, mutate_files=mf)


DESCRIPTION = ("Golden vectors of errata 10 (spec §20): a stored writer index that lists a "
               "file with another size than the manifest (R-INDEX-6), and zero-size shard "
               "tensors at a boundary between spans and inside one (§11.1). 'target' is "
               "relative to the case directory. 'reader': 'accept' marks a rule readers do not "
               "check: a conformance checker reports 'code', a reader reads 'expected'.")


def main(argv: list[str] | None = None) -> int:
    """Write every case below ``--out`` (default: ``errata-10`` next to this script)."""
    return int(E1.write_set(argv, CASES, "errata-10", DESCRIPTION, __doc__))


if __name__ == "__main__":
    sys.exit(main())
