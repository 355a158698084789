"""The dtype table of format 1.0: format name ↔ safetensors dtype ↔ numpy dtype."""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from portable_ckpt.errors import DtypeUnsupportedError

__all__ = ["DTYPES", "DType", "dtype_by_safetensors", "dtype_name", "itemsize", "numpy_dtype"]


@dataclass(frozen=True)
class DType:
    """One row of the dtype table."""

    name: str
    safetensors: str
    itemsize: int
    numpy: np.dtype[np.generic]


def _row(name: str, st: str, np_dtype: object) -> DType:
    dt = np.dtype(np_dtype)  # type: ignore[call-overload]
    return DType(name, st, dt.itemsize, dt)


#: Format dtype name → :class:`DType`. Byte order on disk is always little-endian.
DTYPES: dict[str, DType] = {
    r.name: r
    for r in (
        _row("float64", "F64", "<f8"),
        _row("float32", "F32", "<f4"),
        _row("float16", "F16", "<f2"),
        _row("bfloat16", "BF16", ml_dtypes.bfloat16),
        _row("int64", "I64", "<i8"),
        _row("int32", "I32", "<i4"),
        _row("int16", "I16", "<i2"),
        _row("int8", "I8", "i1"),
        _row("uint8", "U8", "u1"),
        _row("uint16", "U16", "<u2"),
        _row("uint32", "U32", "<u4"),
        _row("uint64", "U64", "<u8"),
        _row("bool", "BOOL", "?"),
        _row("float8_e4m3fn", "F8_E4M3", ml_dtypes.float8_e4m3fn),
        _row("float8_e5m2", "F8_E5M2", ml_dtypes.float8_e5m2),
    )
}

_BY_ST = {r.safetensors: r for r in DTYPES.values()}
_BY_NUMPY = {r.numpy: r.name for r in DTYPES.values()}


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
    try:
        return _BY_NUMPY[dt]
    except KeyError:
        raise DtypeUnsupportedError(
            f"numpy dtype {dt} has no format dtype (supported: {', '.join(DTYPES)})"
        ) from None
