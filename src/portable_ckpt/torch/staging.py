"""Staging: giving every planned piece the bytes to write, copied into reused host buffers or not.

A synchronous save of CPU tensors writes straight from the live tensors (no copy). An async save,
and any save of device tensors, copies each piece into a host buffer kept across saves (pinned
for CUDA), so the caller may mutate its state as soon as staging returns. Where the buffers live
is a :class:`Staging`: private tensors of this process (:data:`POOL`, the thread-mode writer
reads them) or one shared-memory segment that a writer process maps
(:class:`~portable_ckpt.torch._shm.SharedStaging`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch

from portable_ckpt.torch._tensors import numpy_view
from portable_ckpt.torch.plan import SavePlan

__all__ = ["POOL", "Buffer", "Staging", "StagingPool", "stage", "staging_bytes"]

#: A staging buffer and its numpy view (made once per buffer: a view costs tens of µs).
Buffer = tuple[torch.Tensor, np.ndarray[Any, Any]]


class Staging(Protocol):
    """Where staged copies live: one host buffer per piece slot, reused across saves."""

    def buffers(self, wanted: Sequence[tuple[str, torch.Tensor]], prune: bool) -> list[Buffer]:
        """Host buffers of each ``(slot, like)``'s shape and dtype (``prune``: free the rest)."""
        ...

    @property
    def nbytes(self) -> int:
        """Bytes held by the buffers."""
        ...


class StagingPool:
    """Host buffers reused across saves, one per piece slot (reallocated when shape/dtype change)."""

    def __init__(self) -> None:
        self._buffers: dict[str, Buffer] = {}

    def get(self, key: str, like: torch.Tensor) -> Buffer:
        """A host buffer of ``like``'s shape and dtype for ``key``, and its numpy view."""
        hit = self._buffers.get(key)
        if hit is not None and hit[0].shape == like.shape and hit[0].dtype == like.dtype:
            return hit
        pin = like.device.type == "cuda"
        buf = torch.empty(like.shape, dtype=like.dtype, device="cpu", pin_memory=pin)
        self._buffers[key] = new = (buf, numpy_view(buf, key=key))
        return new

    def buffers(self, wanted: Sequence[tuple[str, torch.Tensor]], prune: bool) -> list[Buffer]:
        """A buffer per ``(slot, like)``; with ``prune``, free the buffers of other slots."""
        out = [self.get(slot, like) for slot, like in wanted]
        if prune and len(self._buffers) != len(wanted):  # else: exactly the wanted slots
            self.retain_only({slot for slot, _ in wanted})
        return out

    def retain_only(self, keys: set[str]) -> None:
        """Free the buffers of every key not in ``keys``."""
        for k in [k for k in self._buffers if k not in keys]:
            del self._buffers[k]

    @property
    def nbytes(self) -> int:
        """Bytes held by the buffers."""
        return sum(b.numel() * b.element_size() for b, _ in self._buffers.values())


#: This process's private staging buffers (sync saves of device tensors, thread-mode async).
POOL = StagingPool()

#: Every staging of this process, for :func:`staging_bytes` (the shared one registers itself).
_ALL: list[Staging] = [POOL]


def staging_bytes() -> int:
    """Bytes held by this process's reusable staging buffers (private and shared)."""
    return sum(s.nbytes for s in _ALL)


def register(staging: Staging) -> None:
    """Count ``staging`` in :func:`staging_bytes`."""
    if all(s is not staging for s in _ALL):
        _ALL.append(staging)


def stage(plan: SavePlan, copy: bool, into: Staging | None = None) -> float:
    """Give every owned piece a numpy array: a view of the live tensor, or a staged copy.

    Args:
        plan: The rank's plan (each owned piece's ``source`` is the live tensor).
        copy: Copy every piece (async saves); else only pieces that are not on the CPU.
        into: Where the copies go (default :data:`POOL`).

    Returns:
        The seconds it took (device copies included).

    """
    t0 = time.perf_counter()
    into = POOL if into is None else into
    live = [(p, p.source) for p in plan.pieces if p.source is not None]
    copied = [(p, src) for p, src in live if copy or src.device.type != "cpu"]
    bufs = into.buffers([(p.slot, src) for p, src in copied], prune=copy)
    with torch.no_grad():  # a copy is never part of an autograd graph
        for (p, src), (buf, view) in zip(copied, bufs, strict=True):
            buf.copy_(src, non_blocking=src.device.type == "cuda")
            p.array = view
    for p, src in live:
        if p.array is None:
            p.array = numpy_view(src, key=p.key)
        p.source = None  # drop the reference to live state
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()
    return time.perf_counter() - t0
