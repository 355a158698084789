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

from portable_ckpt.errors import UnsupportedValueError, UsageError
from portable_ckpt.format.dtypes import DTYPES, numpy_dtype

__all__ = [
    "as_bits", "format_dtype", "numpy_view", "target_dtype", "torch_dtype", "torch_from_numpy"
]

# torch dtype -> (format name, integer torch dtype to view through or None, numpy dtype;
# None: the format table's, resolved on first use). Built from the format's one dtype table:
# a row whose numpy type comes from ml_dtypes (bfloat16, float8) crosses to torch through an
# integer view of its size, as do the unsigned types wider than a byte (torch's own are young).
_VIA = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def as_bits(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` viewed as integers of its element's width: its bits, any strides, no copy.

    ``None`` for a width without such an integer type. Bitwise comparisons (a tie's values,
    a sub-mesh copy's sample) compare these: -0.0 and 0.0 differ, NaN payloads count.
    """
    via = _VIA.get(t.element_size())
    return None if via is None else t.view(via)


_MAP: dict[torch.dtype, tuple[str, torch.dtype | None, Any]] = {}
for _row in DTYPES.values():
    _td = getattr(torch, _row.name, None)
    if not isinstance(_td, torch.dtype):
        continue  # a format dtype this torch lacks: loads of it say so (torch_dtype)
    _lazy = ":" in _row.spec
    _via = _VIA[_row.itemsize] if _lazy or _row.name in ("uint16", "uint32", "uint64") else None
    _MAP[_td] = (_row.name, _via, None if _lazy else np.dtype(_row.spec))

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
            f"tensor {key!r}: dtype {dtype} has no dtype in the format's table; convert it (e.g. complex → "
            f"view_as_real) before saving"
        ) from None


def target_dtype(dtype: torch.dtype, *, key: str, stored: str) -> str:
    """Return the format's dtype name of a load target's torch dtype.

    Raises:
        UsageError: the target's dtype (``complex128``, ``complex32``) has no format dtype, so
            nothing stored loads into it; the message names the stored dtype to build it with
            (it said "convert it ... before saving" to a load).

    """
    try:
        return _MAP[dtype][0]
    except KeyError:
        raise UsageError(
            f"tensor {key!r}: the target's dtype {dtype} has no dtype in the format's table, "
            f"so no stored tensor loads into it; this one is stored as {stored}: build the "
            f"target with that dtype and convert it after the load"
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


def as_tensor(arr: np.ndarray[Any, Any]) -> torch.Tensor:
    """A CPU tensor sharing memory with an array :meth:`Checkpoint.read` returned.

    ``torch.from_numpy`` refuses bfloat16 and float8 arrays (numpy has no such types; the read
    API returns ``ml_dtypes`` arrays): here they cross through an integer view of the same
    bytes, so ``as_tensor(ck.read("model/w"))`` is the stored tensor whatever its dtype::

        ck = portable_ckpt.open(root)
        w = pckt.as_tensor(ck.read("model/w"))   # torch.bfloat16, no copy

    Raises:
        UsageError: ``arr`` is not a numpy array.

    """
    if not isinstance(arr, np.ndarray):
        raise UsageError(f"as_tensor takes a numpy array, got {type(arr).__name__}")
    return torch_from_numpy(arr)


def torch_from_numpy(arr: np.ndarray[Any, Any]) -> torch.Tensor:
    """Return a CPU tensor sharing memory with ``arr`` (bfloat16/float8 through integer views)."""
    row = DTYPES.get(arr.dtype.name)
    if row is not None and ":" in row.spec:  # an ml_dtypes type: torch.from_numpy refuses it
        via = _VIA[row.itemsize]
        return torch.from_numpy(arr.view(_NP_INT[via])).view(torch_dtype(row.name))
    return torch.from_numpy(arr)


_NP_INT = {torch.uint8: np.uint8, torch.int16: np.int16, torch.int32: np.int32,
           torch.int64: np.int64}
