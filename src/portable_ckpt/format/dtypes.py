"""The format's dtype table (spec §7): format name ↔ safetensors dtype ↔ numpy dtype.

numpy has no bfloat16 or float8; their numpy dtypes come from ``ml_dtypes``, imported on first
use: its import costs ~1.4 s of CPU here, paid by every process (each CLI call, each rank) that
never touches such a tensor.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field

import numpy as np

from portable_ckpt.errors import DtypeUnsupportedError

__all__ = ["DTYPES", "DType", "dtype_by_safetensors", "dtype_name", "itemsize", "numpy_dtype"]


@dataclass(frozen=True)
class DType:
    """One row of the dtype table."""

    name: str
    safetensors: str
    itemsize: int
    #: ``"<f4"``-style numpy code, or ``"ml_dtypes:<name>"`` (resolved on first use).
    spec: str = field(repr=False)
    #: The format MINOR that added the row, and the extension a document using it lists in
    #: ``must_understand`` (R-VERSION-7): every row of 1.0 has none. A reader refuses the row
    #: in a document of an earlier version or without the extension (maintainer review M3).
    since: str = "1.0"
    extension: str | None = None

    @property
    def numpy(self) -> np.dtype[np.generic]:
        """The numpy dtype (``ml_dtypes`` for bfloat16 and float8)."""
        dt = _RESOLVED.get(self.name)
        return dt if dt is not None else _resolve(self)


_RESOLVED: dict[str, np.dtype[np.generic]] = {}


def _resolve(row: DType) -> np.dtype[np.generic]:
    module, _, attr = row.spec.rpartition(":")
    dt: np.dtype[np.generic] = np.dtype(
        getattr(importlib.import_module(module), attr) if module else attr
    )
    _RESOLVED[row.name] = dt
    return dt


#: Format dtype name → :class:`DType`. Byte order on disk is always little-endian.
DTYPES: dict[str, DType] = {
    r.name: r
    for r in (
        DType("float64", "F64", 8, "<f8"),
        DType("float32", "F32", 4, "<f4"),
        DType("float16", "F16", 2, "<f2"),
        DType("bfloat16", "BF16", 2, "ml_dtypes:bfloat16"),
        DType("int64", "I64", 8, "<i8"),
        DType("int32", "I32", 4, "<i4"),
        DType("int16", "I16", 2, "<i2"),
        DType("int8", "I8", 1, "i1"),
        DType("uint8", "U8", 1, "u1"),
        DType("uint16", "U16", 2, "<u2"),
        DType("uint32", "U32", 4, "<u4"),
        DType("uint64", "U64", 8, "<u8"),
        DType("bool", "BOOL", 1, "?"),
        DType("float8_e4m3fn", "F8_E4M3", 1, "ml_dtypes:float8_e4m3fn"),
        DType("float8_e5m2", "F8_E5M2", 1, "ml_dtypes:float8_e5m2"),
        # Format 1.3: each row is announced by its own extension (R-VERSION-7), named as
        # spec §16.2 says; a released row's position (its tensor-table code) never changes.
        DType("float8_e8m0fnu", "F8_E8M0", 1, "ml_dtypes:float8_e8m0fnu",
              since="1.3", extension="dtype-float8-e8m0fnu"),
        DType("float8_e4m3fnuz", "F8_E4M3FNUZ", 1, "ml_dtypes:float8_e4m3fnuz",
              since="1.3", extension="dtype-float8-e4m3fnuz"),
        DType("float8_e5m2fnuz", "F8_E5M2FNUZ", 1, "ml_dtypes:float8_e5m2fnuz",
              since="1.3", extension="dtype-float8-e5m2fnuz"),
        DType("complex64", "C64", 8, "<c8", since="1.3", extension="dtype-complex64"),
    )
}
_PLAIN = [r for r in DTYPES.values() if ":" not in r.spec]
_LAZY = [r for r in DTYPES.values() if ":" in r.spec]

_BY_ST = {r.safetensors: r for r in DTYPES.values()}
_BY_NUMPY = {r.numpy: r.name for r in _PLAIN}


def _by_numpy(dt: np.dtype[np.generic]) -> str | None:
    name = _BY_NUMPY.get(dt)
    # A caller holding an ml_dtypes dtype has imported ml_dtypes: only then resolve its rows.
    if name is None and "ml_dtypes" in sys.modules:
        _BY_NUMPY.update({r.numpy: r.name for r in _LAZY})
        name = _BY_NUMPY.get(dt)
    return name


def _lookup(name: str) -> DType:
    try:
        return DTYPES[name]
    except (KeyError, TypeError):
        raise DtypeUnsupportedError(
            f"dtype {name!r} is not in the format's dtype table ({', '.join(DTYPES)})"
        ) from None


def numpy_dtype(name: str) -> np.dtype[np.generic]:
    """Return the numpy dtype of format dtype ``name``."""
    return _lookup(name).numpy


def itemsize(name: str) -> int:
    """Return the element size in bytes of format dtype ``name``."""
    return _lookup(name).itemsize


def dtype_by_safetensors(code: str) -> DType:
    """Return the table row of a safetensors dtype code (``"F32"``, ``"BF16"``, ...)."""
    try:
        return _BY_ST[code]
    except (KeyError, TypeError):
        raise DtypeUnsupportedError(
            f"safetensors dtype {code!r} is not in the format's table"
        ) from None


def dtype_name(dtype: object) -> str:
    """Return the format dtype name of a numpy dtype (big-endian inputs are refused)."""
    dt = np.dtype(dtype)  # type: ignore[call-overload]
    if dt.byteorder == ">":
        raise DtypeUnsupportedError(
            f"big-endian dtype {dt} is not supported; convert to little-endian"
        )
    dt = dt.newbyteorder("<") if dt.byteorder == "=" and dt.itemsize > 1 else dt
    name = _by_numpy(dt)
    if name is None:
        raise DtypeUnsupportedError(
            f"numpy dtype {dt} has no format dtype (supported: {', '.join(DTYPES)})"
        )
    return name
