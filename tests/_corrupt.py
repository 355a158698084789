"""Damage a stored file in place, the way the corruption tests of every layer need it."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["flip_byte", "flip_read_buffer"]


def flip_byte(path: str | os.PathLike[str], offset: int, mask: int = 0xFF) -> None:
    """XOR the byte at ``offset`` of ``path`` with ``mask`` (a negative offset counts from the end)."""
    with open(path, "r+b") as f:
        pos = offset if offset >= 0 else os.fstat(f.fileno()).st_size + offset
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ mask]))


def flip_read_buffer(bufs: Any) -> bool:
    """Flip one bit in the middle of what a storage read just filled; False when it was empty.

    ``bufs`` is the last argument of a ``Storage`` read: one buffer, a list of buffers, or a
    list of ``(offset, buffers)`` pairs (vectored reads).
    """
    if isinstance(bufs, list) and bufs and isinstance(bufs[0], tuple):
        bufs = [b for _, bl in bufs for b in bl]
    b = bufs[0] if isinstance(bufs, list) else bufs
    if not len(b):
        return False
    b[len(b) // 2] ^= 0x01
    return True
