"""``torch.save`` files (``.pt``/``.bin`` state dicts) → the portable format.

The file is a zip; its ``data.pkl`` is interpreted symbolically by
:mod:`portable_ckpt.convert._pickle_scan` (nothing is imported or called — strictly safer than
``torch.load(weights_only=True)``, and it needs no torch), and each tensor's bytes are mapped
(``mmap``, no copy) from its storage member one tensor at a time, so memory stays at one tensor. Recognised
structure: dicts/OrderedDicts (string or int keys), lists/tuples, tensors (``_rebuild_tensor_v2``
/``v3``, ``nn.Parameter``), ``torch.Size`` and plain JSON scalars. Nested containers are
flattened to dotted keys (``"state.0.exp_avg"``); a list or dict without tensors below it becomes
one ``pck:json/1`` entry. Anything else is reported and skipped.

Files in the legacy (pre-1.6, non-zip) format, or whose pickle uses constructs the scanner does not
interpret, fall back to ``torch.load(path, weights_only=True, mmap=True)`` (needs torch; tensors are
copied out one at a time).
"""

from __future__ import annotations

import math
import os
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np

from portable_ckpt.convert._dcp_meta import DICT_CTORS, NotJsonError, json_key, symbolic_to_json
from portable_ckpt.convert._model import (
    ChunkSpec,
    ConvertWarning,
    EntrySpec,
    SourcePlan,
    TensorSpec,
)
from portable_ckpt.convert._pickle_scan import Call, Global
from portable_ckpt.convert._torchzip import (
    TORCH_DTYPE_NAMES,
    TorchTensorLayout,
    is_tensor_node,
    map_torch_tensor,
    open_torch_archive,
    tensor_layout,
)
from portable_ckpt.errors import (
    CheckpointError,
    DtypeUnsupportedError,
    ShardHeaderError,
    UsageError,
)
from portable_ckpt.format.dtypes import DTYPES
from portable_ckpt.storage._posix import open_regular

__all__ = ["read_torch_source"]


def _children(node: Any) -> list[tuple[str, Any]] | None:
    """Return (name, child) pairs of a container node, or None for a leaf."""
    if isinstance(node, dict):
        return [(json_key(k), v) for k, v in node.items()]
    if isinstance(node, Call) and isinstance(node.func, Global) and node.func.qualname in DICT_CTORS:
        return [(json_key(k), v) for k, v in node.setitems]
    if isinstance(node, list | tuple):
        return [(str(i), v) for i, v in enumerate(node)]
    return None


def _unwrap_param(node: Any) -> Any:
    while (
        isinstance(node, Call)
        and isinstance(node.func, Global)
        and node.func.qualname in ("torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state")
        and node.args
    ):
        node = node.args[0]
    return node


def _has_tensor(node: Any, depth: int = 0) -> bool:
    node = _unwrap_param(node)
    if depth > 200:
        return False
    if is_tensor_node(node):
        return True
    kids = None
    try:
        kids = _children(node)
    except NotJsonError:
        return False
    return any(_has_tensor(v, depth + 1) for _, v in kids or [])


def read_torch_source(path: str, *, strict: bool = False) -> SourcePlan:
    """Describe the ``torch.save`` file ``path`` (see the module docstring).

    Raises:
        FileMissingError: the file does not exist.
        DtypeUnsupportedError: a tensor's dtype is outside the format's table.
        ShardHeaderError: the archive is damaged.

    """
    fd = open_regular(path, what=f"torch.save file {path}")  # a FIFO is refused, never waited on
    with os.fdopen(os.dup(fd), "rb") as f:
        is_zip = zipfile.is_zipfile(f)
    if not is_zip:
        os.close(fd)
        return _fallback(path, strict=strict, reason="legacy (non-zip) torch.save format")
    closed = False

    def close() -> None:
        nonlocal closed
        if not closed:
            os.close(fd)
            closed = True

    try:
        root, storages = open_torch_archive(fd, 0, os.fstat(fd).st_size, where=path)
        tensors: list[TensorSpec] = []
        entries: list[EntrySpec] = []
        warnings: list[ConvertWarning] = []

        def loader(layout: TorchTensorLayout, where: str) -> Callable[[], np.ndarray[Any, Any]]:
            return lambda: map_torch_tensor(fd, layout, where=where)

        def walk(prefix: str, node: Any, depth: int) -> None:
            node = _unwrap_param(node)
            name = prefix or "value"
            if is_tensor_node(node):
                where = f"{path} (tensor {name!r})"
                try:
                    layout = tensor_layout(node, storages, where=where)
                except DtypeUnsupportedError as exc:
                    raise DtypeUnsupportedError(exc.message, path=path) from None
                nbytes = math.prod(layout.shape) * DTYPES[layout.dtype].itemsize
                chunks = []
                if nbytes:
                    chunks.append(
                        ChunkSpec((0,) * len(layout.shape), layout.shape, nbytes, path, loader(layout, where))
                    )
                tensors.append(TensorSpec(name, layout.dtype, layout.shape, chunks))
                return
            kids = None
            if depth < 64 and _has_tensor(node):
                try:
                    kids = _children(node)
                except NotJsonError as exc:
                    warnings.append(ConvertWarning(name, f"{exc}; skipped"))
                    return
            if kids is not None:
                for k, v in kids:
                    walk(f"{prefix}.{k}" if prefix else k, v, depth + 1)
                return
            try:
                value = symbolic_to_json(node)
            except NotJsonError as exc:
                if strict:
                    raise ShardHeaderError(f"{path}: item {name!r}: {exc} is not supported", path=path) from None
                warnings.append(ConvertWarning(name, f"{path}: {exc} is not convertible; skipped"))
                return
            entries.append(EntrySpec(name, value))

        walk("", root, 0)
    except CheckpointError:
        close()
        raise
    except RecursionError:
        close()
        raise ShardHeaderError(f"{path}: data.pkl is nested too deeply", path=path) from None
    return SourcePlan("torch", tensors, entries, warnings, close=close)


def _fallback(path: str, *, strict: bool, reason: str) -> SourcePlan:
    try:
        import torch
    except ImportError:
        raise UsageError(f"{path}: {reason} needs torch to read: pip install 'portable-ckpt[torch]'") from None
    try:
        with os.fdopen(open_regular(path), "rb") as f:  # the checked descriptor, not the name
            obj = torch.load(f, map_location="cpu", weights_only=True)
    except CheckpointError:
        raise
    except Exception as exc:
        raise ShardHeaderError(f"{path}: torch.load(weights_only=True) failed: {exc}", path=path) from None
    tensors: list[TensorSpec] = []
    entries: list[EntrySpec] = []
    warnings: list[ConvertWarning] = [ConvertWarning(path, f"{reason}: loaded whole with torch.load")]

    def walk(prefix: str, node: Any) -> None:
        name = prefix or "value"
        if isinstance(node, torch.Tensor):
            t = node.detach()
            dtype = TORCH_DTYPE_NAMES.get(str(t.dtype).removeprefix("torch."))
            if dtype is None:
                raise DtypeUnsupportedError(f"{path}: tensor {name!r} has unsupported dtype {t.dtype}", path=path)
            shape = tuple(t.shape)
            nbytes = t.numel() * t.element_size()

            def load(t: Any = t, shape: tuple[int, ...] = shape, dtype: str = dtype) -> np.ndarray[Any, Any]:
                raw = t.contiguous().reshape(-1).view(torch.uint8).numpy()
                out: np.ndarray[Any, Any] = raw.view(DTYPES[dtype].numpy).reshape(shape)
                return out

            chunks = [ChunkSpec((0,) * len(shape), shape, nbytes, path, load)] if nbytes else []
            tensors.append(TensorSpec(name, dtype, shape, chunks))
        elif isinstance(node, dict) and any(isinstance(v, torch.Tensor | dict | list | tuple) for v in node.values()):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(node, list | tuple) and any(isinstance(v, torch.Tensor) for v in node):
            for i, v in enumerate(node):
                walk(f"{prefix}.{i}" if prefix else str(i), v)
        else:
            from portable_ckpt.convert._model import to_json_value

            try:
                entries.append(EntrySpec(name, to_json_value(node)))
            except ValueError as exc:
                if strict:
                    raise ShardHeaderError(f"{path}: item {name!r}: {exc}", path=path) from None
                warnings.append(ConvertWarning(name, f"{exc}; skipped"))

    walk("", obj)
    return SourcePlan("torch", tensors, entries, warnings)
