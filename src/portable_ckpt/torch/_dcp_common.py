"""What the DCP storage writer and reader share: root arguments, strided DTensor checks."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from portable_ckpt.errors import (
    UnsupportedValueError,
    UsageError,
)
from portable_ckpt.storage import Storage
from portable_ckpt.torch.layout import Piece, dtensor_layout, is_dtensor

__all__ = ["Root", "check_root", "refuse_one_box_view", "strided_pieces"]

Root = str | os.PathLike[str] | Storage


def strided_pieces(state: Mapping[str, Any]) -> dict[str, tuple[Piece, ...]]:
    """DTensors of a flattened state whose local data is several boxes (strided layouts)."""
    out: dict[str, tuple[Piece, ...]] = {}
    for fqn, obj in state.items():
        if is_dtensor(obj) and obj.device_mesh.get_coordinate() is not None:
            lay = dtensor_layout(obj, key=fqn)
            if len(lay.pieces) > 1:
                out[fqn] = lay.pieces
    return out


def refuse_one_box_view(planner: Any, fqns: Iterable[str], ours: type) -> None:
    """DCP's default planners describe a DTensor's local data as one box: refuse where it is not.

    ``ours``: this library's planner for the call (``PortableSavePlanner`` or
    ``PortableLoadPlanner``), which describes every box.
    """
    if isinstance(planner, ours):
        return
    what = ours.__name__
    state = getattr(planner, "state_dict", None)
    if not isinstance(state, Mapping):
        return
    wanted = set(fqns)
    bad = strided_pieces({k: v for k, v in state.items() if k in wanted})
    if bad:
        fqn, pieces = next(iter(bad.items()))
        raise UnsupportedValueError(
            f"DCP item {fqn!r}: this rank holds {len(pieces)} separate boxes of the tensor "
            f"(a strided layout) but {type(planner).__name__} describes them as one; pass "
            f"planner={what}() to dcp.{'save' if 'Save' in what else 'load'}"
        )


def check_root(root: Any) -> Root:
    """``root`` as given when it is a path, a URL or a storage backend (``UsageError`` else)."""
    if isinstance(root, Storage | str | os.PathLike):
        return root
    raise UsageError(f"root must be a path, an s3:// URL or a Storage, got {type(root).__name__}")
