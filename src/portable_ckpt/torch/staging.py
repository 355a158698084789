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

    def buffers(
        self, wanted: Sequence[tuple[str, torch.Tensor]], prune: bool, layout: Any = None
    ) -> list[Buffer]:
        """Host buffers of each ``(slot, like)``'s shape and dtype (``prune``: free the rest).

        ``layout`` (not ``None``) names ``wanted``'s slots, shapes, dtypes and devices: a call
        with the layout of the last call may get the last call's list back without a lookup.
        """
        ...

    @property
    def nbytes(self) -> int:
        """Bytes held by the buffers."""
        ...


class StagingPool:
    """Host buffers reused across saves, one per piece slot (reallocated when shape/dtype change)."""

    def __init__(self) -> None:
        self._buffers: dict[str, Buffer] = {}
        self._nbytes = 0
        # The last buffers() answer and its layout and prune flag; dropped on any change of
        # the buffers (a lookup per slot was a third of a 400-tensor state's staging time).
        self._last: tuple[Any, bool, list[Buffer]] | None = None

    def get(self, key: str, like: torch.Tensor) -> Buffer:
        """A host buffer of ``like``'s shape and dtype for ``key``, and its numpy view."""
        hit = self._buffers.get(key)
        if hit is not None and hit[0].shape == like.shape and hit[0].dtype == like.dtype:
            return hit
        pin = like.device.type == "cuda"
        buf = torch.empty(like.shape, dtype=like.dtype, device="cpu", pin_memory=pin)
        self._drop(key)
        self._buffers[key] = new = (buf, numpy_view(buf, key=key))
        self._nbytes += buf.numel() * buf.element_size()
        return new

    def buffers(
        self, wanted: Sequence[tuple[str, torch.Tensor]], prune: bool, layout: Any = None
    ) -> list[Buffer]:
        """A buffer per ``(slot, like)``; with ``prune``, free the buffers of other slots."""
        last = self._last
        if layout is not None and last is not None and last[1] == prune and last[0] == layout:
            return last[2]
        out = [self.get(slot, like) for slot, like in wanted]
        if prune and len(self._buffers) != len(wanted):  # else: exactly the wanted slots
            self.retain_only({slot for slot, _ in wanted})
        self._last = None if layout is None else (layout, prune, out)
        return out

    def retain_only(self, keys: set[str]) -> None:
        """Free the buffers of every key not in ``keys``."""
        for k in [k for k in self._buffers if k not in keys]:
            self._drop(k)

    def _drop(self, key: str) -> None:
        old = self._buffers.pop(key, None)
        if old is not None:
            self._nbytes -= old[0].numel() * old[0].element_size()
            self._last = None

    @property
    def nbytes(self) -> int:
        """Bytes held by the buffers."""
        return self._nbytes


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
    copied = live if copy else [(p, src) for p, src in live if not src.is_cpu]
    layout = None if plan.layout is None else (plan.layout, copy)
    bufs = (  # a save that copies nothing keeps the pool and what it found for the last layout
        into.buffers([(p.slot, src) for p, src in copied], prune=copy, layout=layout)
        if copied or copy else []
    )
    host_to: list[torch.Tensor] = []
    host_from: list[torch.Tensor] = []
    with torch.no_grad():  # a copy is never part of an autograd graph
        for (p, src), (buf, view) in zip(copied, bufs, strict=True):
            if src.is_cpu:
                host_to.append(buf)
                host_from.append(src)
            else:
                buf.copy_(src, non_blocking=src.device.type == "cuda")
            p.array = view
        # One call for the host tensors: a state has hundreds of small ones, and copy_ per
        # tensor cost more in calls than in bytes.
        if host_to:  # (torch refuses an empty list)
            torch._foreach_copy_(host_to, host_from)
    for p, src in live:
        if p.array is None:
            p.array = numpy_view(src, key=p.key)
        p.source = None  # drop the reference to live state
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()
    return time.perf_counter() - t0
