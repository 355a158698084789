#!/usr/bin/env python3
"""Generate the golden vectors of format 1.3 (run once; the output is frozen and committed).

Format 1.3 adds four rows to the dtype table (spec §7): ``float8_e8m0fnu`` (``F8_E8M0``, the
scales of OCP microscaling formats), ``float8_e4m3fnuz`` and ``float8_e5m2fnuz``
(``F8_E4M3FNUZ``, ``F8_E5M2FNUZ``: FP8 with one NaN and no negative zero) and ``complex64``
(``C64``). Each is a dtype only of a document of format 1.3 or later whose ``must_understand``
lists its extension (``dtype-`` and its name with ``-`` for ``_``; R-DTYPE-3, R-VERSION-7);
anywhere else it is ``PCK-DTYPE-UNSUPPORTED``. In a tensor table the rows are codes 15 … 18
(§8.5). The cases: each row in JSON and in tables (codecs ``none`` and ``zstd``), a 1.3 document
that uses none of them, and each way to use a row where it is not defined.

Builds on the released generators (``generate_1_0.py`` for values and files,
``generate_1_1.py`` for tables, ``generate_errata_1.py`` for the command line); they are frozen,
so the rows of 1.3 are added to this process's copy of their tables only. Standard library,
numpy, crc32c and zstandard. Refuses to touch an existing vector directory unless ``--force``
is given.

Usage: python conformance/vectors/generate_1_3.py [--out DIR] [--force]
"""

from __future__ import annotations

import importlib.util
import math
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _load(stem: str) -> Any:
    """A generator of the same directory (its builders are reused)."""
    path = Path(__file__).resolve().with_name(f"{stem}.py")
    spec = importlib.util.spec_from_file_location(f"pck_{stem}_for_1_3", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


G11 = _load("generate_1_1")
E1 = _load("generate_errata_1")  # its command line writes this set too

#: The rows of 1.3 (§7), in order: format dtype -> (safetensors dtype, itemsize, storage dtype).
ROWS_1_3 = {
    "float8_e8m0fnu": ("F8_E8M0", 1, "u1"),
    "float8_e4m3fnuz": ("F8_E4M3FNUZ", 1, "u1"),
    "float8_e5m2fnuz": ("F8_E5M2FNUZ", 1, "u1"),
    "complex64": ("C64", 8, "<c8"),
}
#: The extension that announces each row (§16.2).
EXTENSION = {name: "dtype-" + name.replace("_", "-") for name in ROWS_1_3}
#: Exactly representable values of each row; a complex value is ``[real, imaginary]``.
VALUES: dict[str, list[Any]] = {
    "float8_e8m0fnu": [1.0, 0.5, 2.0**127, 2.0**-127],
    "float8_e4m3fnuz": [0.0, -1.5, 240.0, 0.0078125],
    "float8_e5m2fnuz": [0.0, -1.5, 57344.0, 0.000030517578125],
    "complex64": [[1.0, -2.0], [0.0, 0.5], [-3.25, 0.0], [2.0**100, -(2.0**-100)]],
}

_encode_1_0 = G11.encode


def _fnuz(v: float, ebits: int, mbits: int) -> int:
    """An exact normal or zero value as FNUZ bits: exponent bias 2^(ebits-1), no -0 (0x80 NaN)."""
    if v == 0:
        return 0
    bias = 1 << (ebits - 1)
    m, e = math.frexp(abs(v))  # |v| = m * 2**e, 0.5 <= m < 1
    exp = e - 1 + bias
    mant = (m * 2 - 1) * (1 << mbits)
    if not 0 < exp < (1 << ebits) or mant != int(mant):
        raise ValueError(f"{v} is not an exact normal value of this type")
    return (1 << (ebits + mbits)) * (v < 0) | exp << mbits | int(mant)


def encode(dtype: str, values: list[Any]) -> bytes:
    """Little-endian bytes of exact ``values`` (flat list) in ``dtype``, the rows of 1.3 too."""
    if dtype == "float8_e8m0fnu":  # 2^(e - 127); no sign, no zero
        out = []
        for v in values:
            m, e = math.frexp(v)
            if m != 0.5 or not 0 <= e - 1 + 127 <= 254:
                raise ValueError(f"{v} is not a power of two e8m0 holds")
            out.append(e - 1 + 127)
        return bytes(out)
    if dtype == "float8_e4m3fnuz":
        return bytes(_fnuz(v, 4, 3) for v in values)
    if dtype == "float8_e5m2fnuz":
        return bytes(_fnuz(v, 5, 2) for v in values)
    if dtype == "complex64":
        packed = b"".join(struct.pack("<ff", re, im) for re, im in values)
        if [list(struct.unpack_from("<ff", packed, 8 * i)) for i in range(len(values))] != [
                [float(re), float(im)] for re, im in values]:
            raise ValueError("complex64 values must be exact")
        return packed
    return bytes(_encode_1_0(dtype, values))


# The released tables, extended in this process only (codes 15 … 18 follow §7's order).
G11.DT.update(ROWS_1_3)
G11.DTYPE_CODE.update({name: i for i, name in enumerate(G11.DT)})
G11.encode = encode

#: A case's generator: writes the case below a root; returns its version builder or None.
Generator = Callable[[Path], Any]
CASES: list[dict[str, Any]] = []
case: Callable[..., Callable[[Generator], Generator]] = E1.registry(CASES)


def _version(rows: list[str], *, table: str | None = None, version: str = "1.3",
             extensions: list[str] | None = None, codec: str = "none") -> Any:
    """One tensor per row (2x2, two row blocks; ``complex64`` split by column).

    The manifest's version and ``must_understand`` are by default what R-VERSION-2 and
    R-VERSION-7 ask of a writer.
    """
    v = G11.V(10, table=table)
    for dt in rows:
        vals = VALUES[dt]
        boxes = [([0, 0], [1, 2], 0), ([1, 0], [1, 2], 0)]
        if dt == "complex64":
            boxes = [([0, 0], [2, 1], 0), ([0, 1], [2, 1], 0)]
        v.tensor(f"t.{dt}", dt, [2, 2], vals if dt == "complex64" else [float(x) for x in vals],
                 boxes, codec=codec)
    v.entry("meta", {"note": "1.3"})
    ext = extensions if extensions is not None else sorted(EXTENSION[r] for r in rows
                                                           if r in EXTENSION)
    v.extra = {"format_version": version,
               "must_understand": sorted((["tensor-table"] if table else []) + ext)}
    return v


def _written(root: Path, v: Any) -> Any:
    G11.write_version(root, v)
    return v


for _row in ROWS_1_3:
    def _mk(root: Path, row: str = _row) -> Any:
        return _written(root, _version([row]))
    case(f"valid-dtype-{_row}", f"§7, R-DTYPE-3, R-VERSION-7: dtype {_row} (safetensors "
         f"{ROWS_1_3[_row][0]}) in a 1.3 manifest that lists {EXTENSION[_row]}",
         failed_verification=False)(_mk)


@case("valid-dtypes-1-3-zstd", "§7, §8.3: every row of 1.3 in one manifest, each range a zstd "
      "frame; must_understand lists the four extensions", failed_verification=False)
def _(root: Path) -> Any:
    return _written(root, _version(list(ROWS_1_3), codec="zstd"))


@case("valid-table-dtypes-1-3", "§8.5, R-TABLE-6: a tensor table (codec none) holding every row "
      "of §7, dtype codes 0 … 18; must_understand lists tensor-table and the four extensions",
      failed_verification=False)
def _(root: Path) -> Any:
    v = G11.V(10, table="none")
    for dt in G11.DT:
        vals = VALUES[dt] if dt in ROWS_1_3 else G11._fix_exact(dt, G11.DTYPE_VALUES[dt])
        if dt in ROWS_1_3 and dt != "complex64":
            vals = [float(x) for x in vals]
        v.tensor(f"t.{dt}", dt, [2, 2], vals, [([0, 0], [1, 2], 0), ([1, 0], [1, 2], 0)])
    v.extra = {"format_version": "1.3",
               "must_understand": sorted(["tensor-table", *EXTENSION.values()])}
    return _written(root, v)


@case("valid-table-complex64-zstd", "§8.5: a zstd tensor table holding a complex64 tensor "
      "(code 18) whose ranges are zstd frames", failed_verification=False)
def _(root: Path) -> Any:
    return _written(root, _version(["complex64"], table="zstd", codec="zstd"))


@case("valid-1-3-without-its-dtypes", "R-VERSION-4: a 1.3 manifest with none of the rows of 1.3 "
      "is read (a checker warns: writers record 1.0 there, R-VERSION-2)",
      failed_verification=False)
def _(root: Path) -> Any:
    v = _version([])
    v.tensor("model.w", "float32", [2, 2], [0.5, 1.5, 2.5, 3.5],
             [([0, 0], [1, 2], 0), ([1, 0], [1, 2], 0)])
    return _written(root, v)


# -------------------------------------------------------------------------------- invalid
@case("dtype-1-3-in-a-1-2-manifest", "R-DTYPE-3: complex64 in a manifest of format 1.2 that "
      "lists dtype-complex64: the row is not one of 1.2", code="PCK-DTYPE-UNSUPPORTED")
def _(root: Path) -> Any:
    return _written(root, _version(["complex64"], version="1.2"))


@case("dtype-1-3-without-its-extension", "R-DTYPE-3, R-VERSION-7: float8_e8m0fnu in a 1.3 "
      "manifest whose must_understand does not list dtype-float8-e8m0fnu (it lists another "
      "row's)", code="PCK-DTYPE-UNSUPPORTED")
def _(root: Path) -> Any:
    return _written(root, _version(["float8_e8m0fnu"], extensions=["dtype-complex64"]))


@case("table-code-of-1-3-without-its-extension", "R-DTYPE-3, R-TABLE-6: a 1.3 table holding "
      "code 16 (float8_e4m3fnuz) in a manifest that lists only tensor-table",
      code="PCK-DTYPE-UNSUPPORTED")
def _(root: Path) -> Any:
    return _written(root, _version(["float8_e4m3fnuz"], table="none", extensions=[]))


@case("table-code-of-1-3-in-a-1-1-manifest", "R-DTYPE-3, R-TABLE-6: a 1.1 table holding code 18 "
      "(complex64), the manifest listing tensor-table and dtype-complex64: the code is past the "
      "table of 1.1", code="PCK-DTYPE-UNSUPPORTED")
def _(root: Path) -> Any:
    return _written(root, _version(["complex64"], table="none", version="1.1"))


@case("table-code-past-the-rows", "R-TABLE-6: a 1.3 table holding dtype code 19, past the last "
      "row of §7", code="PCK-DTYPE-UNSUPPORTED")
def _(root: Path) -> Any:
    v = _version(["complex64"], table="none")

    def code_19(cols: Any) -> None:
        cols["tensor.dtype"][1] = [19 for _ in cols["tensor.dtype"][1]]
    v.mutate_columns = code_19
    return _written(root, v)


@case("dtype-1-3-shard-mismatch", "R-SHARD-3: the manifest says complex64, the shard stores the "
      "range as F32 of twice the columns (the same bytes)", code="PCK-SHARD-MISMATCH")
def _(root: Path) -> Any:
    v = _version(["complex64"])
    v.st = {f: [(n, "F32", [lens[0], 2 * lens[1]], data) if dt == "C64" else (n, dt, lens, data)
                for n, dt, lens, data in ts] for f, ts in v.st.items()}
    return _written(root, v)


DESCRIPTION = ("Golden vectors of format 1.3 (spec §20): the dtypes float8_e8m0fnu, "
               "float8_e4m3fnuz, float8_e5m2fnuz and complex64 (spec §7), in JSON and in tensor "
               "tables, and each way to use them where they are not defined (R-DTYPE-3, "
               "R-VERSION-7)")


def main(argv: list[str] | None = None) -> int:
    """Write every case below ``--out`` (default: ``1.3`` next to this script)."""
    return int(E1.write_set(argv, CASES, "1.3", DESCRIPTION, __doc__, format_version="1.3"))


if __name__ == "__main__":
    sys.exit(main())
