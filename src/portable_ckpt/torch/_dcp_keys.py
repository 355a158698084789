"""How DCP's names and non-tensor items map onto portable keys and JSON values.

The mapping lives in :mod:`portable_ckpt.format.keys` (torch-free, shared with the converter);
this module binds it to torch: :func:`json_leaves` refuses tensors nested inside a value.
"""

from __future__ import annotations

from typing import Any

import torch

from portable_ckpt.format.keys import JsonTree, dcp_fqn, portable_key
from portable_ckpt.format.keys import json_leaves as _json_leaves

__all__ = ["JsonTree", "dcp_fqn", "json_leaves", "portable_key"]


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def json_leaves(key: str, value: Any, *, fqn: str) -> dict[str, Any]:
    """Split a non-tensor value into ``{portable key: JSON scalar}`` (empty containers as is).

    Raises:
        UnsupportedValueError: a value JSON cannot hold, or a tensor inside a tuple or a plain
            list (naming the DCP item and the key).

    """
    return _json_leaves(key, value, fqn=fqn, is_tensor=_is_tensor)
