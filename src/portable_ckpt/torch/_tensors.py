"""Zero-copy views between torch tensors and numpy arrays, and the dtype mapping.

bfloat16 and float8 tensors have no numpy dtype in numpy itself; they are viewed through an
integer dtype of the same width and re-typed with ``ml_dtypes`` (imported on first use, see
:mod:`portable_ckpt.format.dtypes`), so no bytes are copied:
``t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from portable_ckpt.errors import UnsupportedValueError
from portable_ckpt.format.dtypes import numpy_dtype

__all__ = ["format_dtype", "numpy_view", "torch_dtype", "torch_from_numpy"]

# torch dtype -> (format name, integer torch dtype to view through or None, numpy dtype;
# None: the format table's, resolved on first use)
_MAP: dict[torch.dtype, tuple[str, torch.dtype | None, Any]] = {
    torch.float64: ("float64", None, np.float64),
    torch.float32: ("float32", None, np.float32),
    torch.float16: ("float16", None, np.float16),
    torch.bfloat16: ("bfloat16", torch.int16, None),
    torch.int64: ("int64", None, np.int64),
    torch.int32: ("int32", None, np.int32),
    torch.int16: ("int16", None, np.int16),
    torch.int8: ("int8", None, np.int8),
    torch.uint8: ("uint8", None, np.uint8),
    torch.bool: ("bool", None, np.bool_),
    torch.float8_e4m3fn: ("float8_e4m3fn", torch.uint8, None),
    torch.float8_e5m2: ("float8_e5m2", torch.uint8, None),
}
for _name in ("uint16", "uint32", "uint64"):
    _td = getattr(torch, _name, None)
    if isinstance(_td, torch.dtype):
        _signed = {"uint16": torch.int16, "uint32": torch.int32, "uint64": torch.int64}[_name]
        _MAP[_td] = (_name, _signed, np.dtype(_name))

_BY_NAME: dict[str, torch.dtype] = {v[0]: k for k, v in _MAP.items()}


def format_dtype(dtype: torch.dtype, *, key: str = "?") -> str:
    """Return the format's dtype name for a torch dtype.

    Raises:
        UnsupportedValueError: the dtype (e.g. complex) has no format dtype.

    """
    try:
        return _MAP[dtype][0]
    except KeyError:
        raise UnsupportedValueError(
            f"tensor {key!r}: dtype {dtype} has no format-1.0 dtype; convert it (e.g. complex → "
            f"view_as_real) before saving"
        ) from None


def torch_dtype(name: str) -> torch.dtype:
    """Return the torch dtype of a format dtype name."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnsupportedValueError(f"format dtype {name!r} has no torch dtype here") from None


def numpy_view(t: torch.Tensor, *, key: str = "?") -> np.ndarray[Any, Any]:
    """Return a numpy array sharing memory with the CPU tensor ``t`` (any strides).

    Raises:
        UnsupportedValueError: ``t`` is not on the CPU or has an unsupported dtype.

    """
    if t.device.type != "cpu":
        raise UnsupportedValueError(
            f"tensor {key!r}: numpy_view needs a CPU tensor, got {t.device}"
        )
    try:
        name, via, np_dtype = _MAP[t.dtype]
    except KeyError:
        format_dtype(t.dtype, key=key)
        raise
    t = t.detach()
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    if via is None:
        return t.numpy()
    arr: np.ndarray[Any, Any] = t.view(via).numpy().view(np_dtype or numpy_dtype(name))
    return arr


def torch_from_numpy(arr: np.ndarray[Any, Any]) -> torch.Tensor:
    """Return a CPU tensor sharing memory with ``arr`` (bfloat16/float8 through integer views)."""
    name = arr.dtype.name
    if name == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    if name in ("float8_e4m3fn", "float8_e5m2"):
        return torch.from_numpy(arr.view(np.uint8)).view(getattr(torch, name))
    return torch.from_numpy(arr)
