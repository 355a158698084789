"""Staging into one anonymous shared-memory segment, which the writer process maps.

The segment is a ``memfd`` (see :func:`portable_ckpt.io.writer_process.anonymous_fd`): no name in
``/dev/shm`` or anywhere else, passed to the writer by file descriptor, freed by the kernel when
the last process unmaps it — also when either process is killed. It is kept across saves (no
page faults after the first one) and replaced only when the state needs more room, or less than
half of it. Pieces sit at 64-byte-aligned offsets, in plan order. For CUDA sources the segment
is page-locked with ``cudaHostRegister``, so device-to-host copies run at full speed.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Sequence
from typing import Any

import torch

from portable_ckpt.io.writer_process import anonymous_fd
from portable_ckpt.torch._tensors import numpy_view
from portable_ckpt.torch.staging import Buffer, register

__all__ = ["SHARED", "Segment", "SharedStaging"]

_ALIGN = 64
_MIN_BYTES = 1 << 16


class Segment:
    """One mapped memfd: ``base`` is a uint8 tensor over all of it; ``fd`` goes to the writer."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.fd = anonymous_fd(size)
        try:
            m = mmap.mmap(self.fd, size)
            # The tensor holds the mapping; it is unmapped when the last view of it is gone.
            self.base = torch.frombuffer(m, dtype=torch.uint8)
        except BaseException:
            os.close(self.fd)
            raise
        self.pinned = False

    def pin(self) -> None:
        """Page-lock the segment for CUDA copies (once)."""
        if not self.pinned:
            rc = int(_cudart().cudaHostRegister(self.base.data_ptr(), self.size, 0))
            if rc != 0:
                raise RuntimeError(f"cudaHostRegister of the staging segment failed ({rc})")
            self.pinned = True

    def close(self) -> None:
        """Unpin, close the descriptor and drop this process's mapping (views may outlive it)."""
        if self.pinned:
            _cudart().cudaHostUnregister(self.base.data_ptr())
            self.pinned = False
        os.close(self.fd)
        del self.base


def _cudart() -> Any:
    return torch.cuda.cudart()  # type: ignore[no-untyped-call]


def _layout(wanted: Sequence[tuple[str, torch.Tensor]]) -> tuple[list[int], int]:
    offsets, end = [], 0
    for _, like in wanted:
        offsets.append(end)
        end += -(-(like.numel() * like.element_size()) // _ALIGN) * _ALIGN
    return offsets, end


class SharedStaging:
    """The staging of ``mode="process"`` async saves: one segment, offsets per piece slot."""

    def __init__(self) -> None:
        self.segment: Segment | None = None
        self.offsets: dict[str, int] = {}
        # The last layout handed out (the plan's, or slot, shape, dtype, device per piece), its
        # segment and views.
        self._last: tuple[Any, Segment, list[Buffer]] | None = None

    def buffers(
        self, wanted: Sequence[tuple[str, torch.Tensor]], prune: bool, layout: Any = None
    ) -> list[Buffer]:
        """Views of the segment, one per ``(slot, like)`` (the segment grows or shrinks first).

        The same layout as last time, in the same segment, gets the same views back: a save
        runs only after the previous one finished, so no writer still reads them. ``layout``
        names it where the caller knows it (else it is made of ``wanted``).
        """
        if layout is None:
            layout = tuple((s, like.shape, like.dtype, like.device.type) for s, like in wanted)
        last = self._last
        if last is not None and last[1] is self.segment and last[0] == layout:
            return last[2]
        offsets, total = _layout(wanted)
        seg = self._segment(max(total, _MIN_BYTES))
        if any(like.device.type == "cuda" for _, like in wanted):
            seg.pin()
        self.offsets = {slot: off for (slot, _), off in zip(wanted, offsets, strict=True)}
        out = []
        for (slot, like), off in zip(wanted, offsets, strict=True):
            n = like.numel() * like.element_size()
            view = seg.base[off : off + n].view(like.dtype).view(like.shape)
            out.append((view, numpy_view(view, key=slot)))
        self._last = (layout, seg, out)
        return out

    def _segment(self, need: int) -> Segment:
        seg = self.segment
        if seg is None or seg.size < need or seg.size > 2 * need:
            if seg is not None:
                seg.close()
            self.segment = None
            seg = self.segment = Segment(need)
        return seg

    def release(self) -> None:
        """Give the segment back (the next save allocates a new one)."""
        if self.segment is not None:
            self.segment.close()
            self.segment = None
        self.offsets = {}
        self._last = None

    @property
    def nbytes(self) -> int:
        """Bytes of the segment."""
        return 0 if self.segment is None else self.segment.size


#: This process's shared staging (created empty; the first process-mode save allocates it).
SHARED = SharedStaging()
register(SHARED)


def _forget_after_fork() -> None:
    # The segment belongs to the parent, whose writer may be reading it: a forked child's own
    # process-mode save stages into a segment of its own (async review F10), and the child
    # holds none of the parent's memory (F18: a DataLoader worker kept a replaced segment
    # alive while it lived). Dropping the child's views unmaps its copy of the mapping (and
    # closes the mapping's own descriptor); the segment's descriptor is closed here.
    seg = SHARED.segment
    if seg is not None:
        with contextlib.suppress(OSError):
            os.close(seg.fd)
    SHARED.segment, SHARED.offsets, SHARED._last = None, {}, None


os.register_at_fork(after_in_child=_forget_after_fork)
