"""Golden vectors of the format (``vectors/<format version>/``) and helpers to use them.

``vectors/1.0/`` holds the vectors of format 1.0, ``vectors/1.1/`` those added by format 1.1
(tensor tables, spec §8.5), ``vectors/errata-1/`` the file-level cases of errata 1 (spec §20:
shard data areas and headers, zstd frames, bool bytes, schema patterns), ``vectors/errata-2/``
those of errata 2 (entry value file names at the limits of §2.2, §12.1), ``vectors/errata-3/``
those of errata 3 (zstd frame headers: R-TENSOR-6, R-TENSOR-7 and R-TENSOR-10 from the first 18
bytes, R-VERIFY-2; an integer member written as ``42.0``), ``vectors/errata-4/`` those of errata 4
(R-INDEX-6 for six-digit and table writer indexes, misnamed drill and copy records, a symbolic
link in an attempt, a shard dimension above MAXINT, non-attempt children of a root),
``vectors/errata-6/`` those of errata 6 (schema rules of the manifest a reader must apply, schema
bounds that are PCK-SCHEMA and not PCK-LIMIT, integer tokens in built-in entry schemas, the
dialect of embedded schemas, ``$ref`` into a resource that declares ``$schema``, a 9-digit
MINOR), ``vectors/errata-10/`` those of errata 10 (a writer index that lists a file with
another size, zero-size shard tensors at and inside a span), ``vectors/errata-11/`` those of
errata 11 (pin records at a root), ``vectors/errata-12/`` those of errata 12 (a grid and a
non-grid layout of more than 12,000 boxes each, R-COVER-4), ``vectors/1.2/`` those of format 1.2
(verification records that clear failed ones, R-DRILL-10), ``vectors/errata-16/`` those of
errata 16 (mesh dimension names outside the schema's pattern, R-CONTRACT-8; verification records
of a newer MAJOR, R-DRILL-12; a clearing dated before the failure it clears; a header entry no
record uses, R-SHARD-6), ``vectors/errata-21/`` those of errata 21 (damaged checksum blocks
that are not a file's first: in a range, a zstd frame, an entry value, a tensor table;
R-CKSUM-3), ``vectors/1.3/`` those of format 1.3 (the dtypes ``float8_e8m0fnu``,
``float8_e4m3fnuz``, ``float8_e5m2fnuz`` and ``complex64``, spec §7, in JSON and in tensor
tables, and where they are not defined). Errata 5, 7, 8, 9, 13, 14, 15, 17, 18 and 19 have no
vectors. All are frozen (R-VERSION-9); a reader of 1.3 passes all of them
(:data:`VECTOR_DIRS`, :func:`all_cases`; :func:`materialize` finds a case's set by its name).

``cases.json`` lists every case: ``name``, ``feature``, ``valid``, ``target`` (path to open,
relative to the case directory), for valid cases ``expected`` (expected.json with every tensor's
dtype, shape, values and exact little-endian bytes as hex, and every entry value; per_rank
entries as ``{"per_rank": {"<rank>": value}}``), for invalid ones ``code`` (the error a reader
must report) and ``deep`` (the defect is only visible when data blocks are read); an invalid
case with ``"reader": "accept"`` breaks a rule that binds writers only: a conformance checker
reports ``code`` and a reader reads ``expected``. From set 1.2 on, ``failed_verification`` on a
case a reader lists: whether the version has failed verification (``true``, ``false``), or, from
set ``errata-16`` on, ``null``: its verification status is unknown to a tool of format 1.x (a
tool that restores automatically takes neither it nor an older version, R-DRILL-12). Optional
``setup`` operations to apply to a copy before use (``{"op": "symlink", "path", "target"}``:
create a symbolic link that git cannot be trusted to carry).

``vectors/errata-20/`` holds vectors of another kind, **retention** (spec §20.1; not in
:data:`VECTOR_DIRS`, which hold the reader and checker cases): a root, a gc ``policy``
(``keep``, ``grace_seconds``, ``delete_invalid``, ``retire_abandoned``) and, for every attempt,
its ``class`` (§15.1) and ``outcome`` (``keep``, ``should-keep``, ``delete``, ``either``);
``untouched``: root files outside attempts; ``reports``: the gc must report an attempt; their
``setup`` dates the files (``{"op": "age", "path", "seconds"}``) and makes empty directories
(``{"op": "mkdir", "path"}``) (:data:`RETENTION_DIRS`, :func:`retention_cases`).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

__all__ = ["VECTOR_DIR", "VECTOR_DIRS", "VECTOR_DIR_1_1", "VECTOR_DIR_ERRATA_1",
           "VECTOR_DIR_ERRATA_2", "VECTOR_DIR_ERRATA_3", "VECTOR_DIR_ERRATA_4",
           "VECTOR_DIR_ERRATA_6", "VECTOR_DIR_ERRATA_10", "VECTOR_DIR_ERRATA_11",
           "VECTOR_DIR_ERRATA_12", "VECTOR_DIR_1_2", "VECTOR_DIR_ERRATA_16",
           "VECTOR_DIR_ERRATA_21", "VECTOR_DIR_1_3", "RETENTION_DIRS",
           "all_cases", "load_cases", "materialize", "retention_cases", "vector_dir_of"]

VECTOR_DIR = Path(__file__).resolve().parent / "1.0"
VECTOR_DIR_1_1 = Path(__file__).resolve().parent / "1.1"
VECTOR_DIR_ERRATA_1 = Path(__file__).resolve().parent / "errata-1"
VECTOR_DIR_ERRATA_2 = Path(__file__).resolve().parent / "errata-2"
VECTOR_DIR_ERRATA_3 = Path(__file__).resolve().parent / "errata-3"
VECTOR_DIR_ERRATA_4 = Path(__file__).resolve().parent / "errata-4"
VECTOR_DIR_ERRATA_6 = Path(__file__).resolve().parent / "errata-6"
VECTOR_DIR_ERRATA_10 = Path(__file__).resolve().parent / "errata-10"
VECTOR_DIR_ERRATA_11 = Path(__file__).resolve().parent / "errata-11"
VECTOR_DIR_ERRATA_12 = Path(__file__).resolve().parent / "errata-12"
VECTOR_DIR_1_2 = Path(__file__).resolve().parent / "1.2"
VECTOR_DIR_ERRATA_16 = Path(__file__).resolve().parent / "errata-16"
VECTOR_DIR_ERRATA_21 = Path(__file__).resolve().parent / "errata-21"
VECTOR_DIR_1_3 = Path(__file__).resolve().parent / "1.3"
#: every vector set (a format version, or an errata set of one) by name, oldest first.
VECTOR_DIRS: dict[str, Path] = {"1.0": VECTOR_DIR, "1.1": VECTOR_DIR_1_1,
                                "errata-1": VECTOR_DIR_ERRATA_1, "errata-2": VECTOR_DIR_ERRATA_2,
                                "errata-3": VECTOR_DIR_ERRATA_3, "errata-4": VECTOR_DIR_ERRATA_4,
                                "errata-6": VECTOR_DIR_ERRATA_6,
                                "errata-10": VECTOR_DIR_ERRATA_10,
                                "errata-11": VECTOR_DIR_ERRATA_11,
                                "errata-12": VECTOR_DIR_ERRATA_12, "1.2": VECTOR_DIR_1_2,
                                "errata-16": VECTOR_DIR_ERRATA_16,
                                "errata-21": VECTOR_DIR_ERRATA_21, "1.3": VECTOR_DIR_1_3}
#: the retention vector sets (spec §20.1), by name: another kind of case, not in VECTOR_DIRS.
RETENTION_DIRS: dict[str, Path] = {"errata-20": Path(__file__).resolve().parent / "errata-20"}


def load_cases(vector_dir: Path = VECTOR_DIR) -> list[dict[str, Any]]:
    """Return the case records of ``cases.json``."""
    doc = json.loads((vector_dir / "cases.json").read_text(encoding="utf-8"))
    cases: list[dict[str, Any]] = doc["cases"]
    return cases


def all_cases() -> list[tuple[str, Path, dict[str, Any]]]:
    """``(format version, vector directory, case)`` for every case of every version."""
    return [(version, d, c) for version, d in VECTOR_DIRS.items() for c in load_cases(d)]


def retention_cases() -> list[tuple[str, Path, dict[str, Any]]]:
    """``(set, vector directory, case)`` for every retention case (spec §20.1)."""
    return [(name, d, c) for name, d in RETENTION_DIRS.items() for c in load_cases(d)]


def vector_dir_of(name: str) -> Path:
    """The directory of the set that holds the case ``name`` (names are unique across sets).

    Raises ``KeyError`` for a name no set has.
    """
    dirs = _case_dirs()
    if name not in dirs:
        raise KeyError(f"no vector set has a case named {name!r}")
    return dirs[name]


_CASE_DIRS: dict[str, Path] = {}


def _case_dirs() -> dict[str, Path]:
    """Every case name of every set (retention too) and its set's directory (read once)."""
    if not _CASE_DIRS:
        for _, d, case in all_cases() + retention_cases():
            _CASE_DIRS.setdefault(case["name"], d)
    return _CASE_DIRS


def materialize(case: dict[str, Any], dest: Path, vector_dir: Path | None = None) -> Path:
    """Copy a case to ``dest/<name>``, apply its setup, and return the path to open.

    ``vector_dir`` is the directory of the case's set (the second element of an
    :func:`all_cases` record, or a value of :data:`VECTOR_DIRS`); without it the set is found
    by the case's name, which is unique across every set (:func:`vector_dir_of`).
    """
    if vector_dir is None:
        vector_dir = vector_dir_of(str(case["name"]))
    now = time.time()  # every "age" of a case counts back from one instant
    src = vector_dir / case["name"]
    out = dest / case["name"]
    shutil.copytree(src, out, symlinks=True)
    for op in case.get("setup", []):
        if op["op"] == "symlink":
            p = out / op["path"]
            if p.exists() or p.is_symlink():
                p.unlink()
            # git stores no empty directories: the link's directory may not exist in a clone.
            p.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(op["target"], p)
        elif op["op"] == "mkdir":
            (out / op["path"]).mkdir(parents=True, exist_ok=True)
        elif op["op"] == "age":
            _age(out / op["path"], now - float(op["seconds"]))
        else:  # pragma: no cover - future setup kinds
            raise ValueError(f"unknown setup op {op['op']!r}")
    target: Path = out / str(case["target"])
    return target


def _age(path: Path, when: float) -> None:
    """Set the modification time of ``path``, or of every file below it, to ``when``."""
    files = [path] if not path.is_dir() else [p for p in sorted(path.rglob("*")) if p.is_file()]
    for p in files:
        os.utime(p, (when, when), follow_symlinks=False)
