"""Staging: giving every planned piece the bytes to write, copied into reused host buffers or not.

A synchronous save of CPU tensors writes straight from the live tensors (no copy). An async save,
and any save of device tensors, copies each piece into a host buffer kept across saves (pinned
for CUDA), so the caller may mutate its state as soon as staging returns.
"""

from __future__ import annotations

import time

import torch

from portable_ckpt.torch._tensors import numpy_view
from portable_ckpt.torch.plan import SavePlan

__all__ = ["StagingPool", "POOL", "stage", "staging_bytes"]


class StagingPool:
    """Host buffers reused across saves, one per piece slot (reallocated when shape/dtype change)."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def get(self, key: str, like: torch.Tensor) -> torch.Tensor:
        """A host buffer of ``like``'s shape and dtype for ``key``."""
        buf = self._buffers.get(key)
        if buf is None or buf.shape != like.shape or buf.dtype != like.dtype:
            pin = like.device.type == "cuda"
            buf = torch.empty(like.shape, dtype=like.dtype, device="cpu", pin_memory=pin)
            self._buffers[key] = buf
        return buf

    def retain_only(self, keys: set[str]) -> None:
        """Free the buffers of every key not in ``keys``."""
        for k in [k for k in self._buffers if k not in keys]:
            del self._buffers[k]

    @property
    def nbytes(self) -> int:
        """Bytes held by the buffers."""
        return sum(b.numel() * b.element_size() for b in self._buffers.values())


#: This process's staging buffers.
POOL = StagingPool()


def staging_bytes() -> int:
    """Bytes held by this process's reusable staging buffers."""
    return POOL.nbytes


def stage(plan: SavePlan, copy: bool) -> float:
    """Give every owned piece a numpy array: a view of the live tensor, or a staged copy.

    Returns the seconds it took (device copies included).
    """
    t0 = time.perf_counter()
    keys: set[str] = set()
    for p in plan.pieces:
        if p.source is None:
            continue
        src = p.source.detach()
        if copy or src.device.type != "cpu":
            buf = POOL.get(p.slot, src)
            buf.copy_(src, non_blocking=src.device.type == "cuda")
            keys.add(p.slot)
            p.array = numpy_view(buf, key=p.key)
        else:
            p.array = numpy_view(src, key=p.key)
        p.source = None  # drop the reference to live state
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()
    if copy:
        POOL.retain_only(keys)
    return time.perf_counter() - t0
