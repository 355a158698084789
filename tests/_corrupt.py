"""Damage a stored file in place, the way the corruption tests of every layer need it."""

from __future__ import annotations

import os

__all__ = ["flip_byte"]


def flip_byte(path: str | os.PathLike[str], offset: int, mask: int = 0xFF) -> None:
    """XOR the byte at ``offset`` of ``path`` with ``mask`` (a negative offset counts from the end)."""
    with open(path, "r+b") as f:
        pos = offset if offset >= 0 else os.fstat(f.fileno()).st_size + offset
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ mask]))
