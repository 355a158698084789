#!/usr/bin/env python3
"""Generate the golden vectors of errata 2 (run once; the output is frozen and committed).

Errata 2 corrects §12.1's rule for the file names of entry values: the RECOMMENDED name
``entries/<name>.<g|rNNNNN>.json[.zst]`` fits §2.2 only while the name's last part plus the
suffix has at most 255 characters and the name at most 7 parts, so the longest last part is
248 (``.g.json``), 244 (``.g.json.zst``), 243 (``.r00000.json``) or 239 (``.r00000.json.zst``)
characters; the old text gave 248 for every suffix. The rule that decides is §2.2's, which did
not change: every case here was valid, or already broke R-LAYOUT-5, before the errata.

Uses only the standard library, numpy and crc32c (zstd values are one raw block, as in
errata 1). Refuses to touch an existing vector directory unless ``--force`` is given.

Usage: python conformance/vectors/generate_errata_2.py [--out DIR] [--force]
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _load(stem: str) -> Any:
    """A generator of the same directory (its builders are reused)."""
    path = Path(__file__).resolve().with_name(f"{stem}.py")
    spec = importlib.util.spec_from_file_location(f"pck_{stem}_for_errata_2", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


E1 = _load("generate_errata_1")
V, write_version, raw_frame = E1.V, E1.write_version, E1.raw_frame
CASES: list[dict[str, Any]] = []
#: the suffixes of §2.1's RECOMMENDED entry file names and the longest last part each allows.
LIMITS = {".g.json": 248, ".g.json.zst": 244, ".r00000.json": 243, ".r00000.json.zst": 239}


def case(name: str, feature: str, *, code: str | None = None) -> Callable[
        [Callable[[Path], Any]], Callable[[Path], Any]]:
    """Register a case generator (valid when ``code`` is None)."""
    def deco(fn: Callable[[Path], Any]) -> Callable[[Path], Any]:
        CASES.append({"name": name, "feature": feature, "code": code, "deep": False,
                      "reader": None, "fn": fn})
        return fn
    return deco


def entry(v: Any, name: str, values: list[Any], *, per_rank: bool, zstd: bool,
          files: list[str] | None = None) -> None:
    """Add entry ``name`` stored under its recommended file names (or ``files``)."""
    ext = ".json.zst" if zstd else ".json"
    rec: dict[str, Any] = {"schema": {"id": "pck:json/1"},
                           "scope": "per_rank" if per_rank else "global",
                           "encoding": "json+zstd" if zstd else "json", "values": []}
    if per_rank:
        rec["world_size_policy"] = "modulo"
    for i, value in enumerate(values):
        fname = (files[i] if files else
                 f"entries/{name}.r{i:05d}{ext}" if per_rank else f"entries/{name}.g{ext}")
        raw = json.dumps(value).encode()
        v.files[fname] = raw_frame(raw) if zstd else raw
        rec["values"].append({"rank": i, "file": fname} if per_rank else {"file": fname})
    v.entries[name] = rec
    v.expected_entries[name] = {"per_rank": {str(i): x for i, x in enumerate(values)}} \
        if per_rank else values[0]


def base() -> Any:
    """World size 2, one small tensor."""
    v = V(12, world_size=2)
    v.tensor("w", "int32", [2], [1, 2])
    return v


@case("valid-entry-names-at-the-limit", "§12.1 (errata 2): each recommended entry file name at "
      "its longest, a 255-character last component: a 248-character name with .g.json, 244 with "
      ".g.json.zst, 243 with .r00000.json, 239 with .r00000.json.zst, and a 7-part name (8 path "
      "components, R-LAYOUT-5)")
def _(root: Path) -> Any:
    v = base()
    for letter, (suffix, limit) in zip("ghij", LIMITS.items(), strict=True):
        per_rank, zstd = suffix.startswith(".r"), suffix.endswith(".zst")
        entry(v, letter * limit, [{"n": 0}, {"n": 1}] if per_rank else [{"n": limit}],
              per_rank=per_rank, zstd=zstd)
    entry(v, "p/q/r/s/t/u/v", [{"parts": 7}], per_rank=False, zstd=False)
    write_version(root, v)
    return v


@case("valid-entry-name-too-long-for-its-file", "§12.1 (errata 2): a 240-character per-rank "
      "json+zstd entry, whose recommended file name would have a 256-character component, "
      "stored under another safe name, as a writer must")
def _(root: Path) -> Any:
    v = base()
    entry(v, "k" * 240, [{"n": 0}, {"n": 1}], per_rank=True, zstd=True,
          files=[f"entries/k-240-0c1d.r{r:05d}.json.zst" for r in (0, 1)])
    write_version(root, v)
    return v


@case("invalid-entry-file-component-256", "§12.1 (errata 2): the same 240-character entry "
      "under its recommended name: a 256-character path component (R-LAYOUT-5, R-LAYOUT-6), "
      "refused before any storage operation, so no such file exists", code="PCK-PATH-UNSAFE")
def _(root: Path) -> None:
    v = base()
    entry(v, "k" * 240, [{"n": 0}, {"n": 1}], per_rank=True, zstd=True)
    def ar(files: dict[str, bytes], m: dict[str, Any]) -> None:
        for k in [k for k in files if max(map(len, k.split("/"))) > 255]:
            del files[k]  # no file system stores a 256-character name (NAME_MAX is 255)
    write_version(root, v, after_records=ar)


@case("invalid-entry-file-9-components", "§12.1 (errata 2): an 8-part entry name under its "
      "recommended name: 9 path components (R-LAYOUT-5, R-LAYOUT-6)", code="PCK-PATH-UNSAFE")
def _(root: Path) -> None:
    v = base()
    entry(v, "a/b/c/d/e/f/g/h", [{"parts": 8}], per_rank=False, zstd=False)
    write_version(root, v)


DESCRIPTION = ("Golden vectors of errata 2 (spec §20): the file names of entry values at the "
               "limits of §2.2 (§12.1). 'target' is relative to the case directory.")


def main(argv: list[str] | None = None) -> int:
    """Write every case below ``--out`` (default: ``errata-2`` next to this script)."""
    return int(E1.write_set(argv, CASES, "errata-2", DESCRIPTION, __doc__))


if __name__ == "__main__":
    sys.exit(main())
