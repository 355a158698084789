"""Deliver a box of a zstd-coded range from a stream, in bounded windows (spec §8.3, R-TENSOR-10).

The decoded range is the chunk's elements in C order. It is cut into windows of whole "rows" —
consecutive indices of the outermost dimension whose rows fit a window — so each window is a
small array whose intersection with the requested box is one numpy copy. Memory: one window,
whatever the range's size; time: one decode of the range.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from portable_ckpt.io.codec import FrameStream
from portable_ckpt.ranges.box import Box

__all__ = ["stream_box"]


def stream_box(
    stream: FrameStream,
    chunk_shape: Sequence[int],
    itemsize: int,
    rel: Box,
    dst: np.ndarray[Any, Any],
    window: int,
) -> int:
    """Decode the whole range from ``stream``, copying box ``rel`` of it into ``dst``.

    Args:
        stream: The range's frame (decodes to ``prod(chunk_shape) * itemsize`` bytes).
        chunk_shape: The range's lengths.
        itemsize: Bytes per element.
        rel: The box to deliver, relative to the range.
        dst: Destination of shape ``rel.lengths`` (any strides).
        window: Largest decoded window held at once (bytes; below ``itemsize``, one element).

    Returns:
        The scratch bytes used (0 when the range went straight into ``dst``).

    """
    # A window below one element would find no dimension whose rows fit (re-attack 26: a
    # StopIteration): one element is the least a window holds.
    window = max(window, itemsize)
    raw = np.dtype(f"u{itemsize}")
    out = dst.view(raw)
    shape = tuple(int(n) for n in chunk_shape)
    if rel.lengths == shape and out.flags.c_contiguous:
        flat = out.reshape(-1).view(np.uint8).data
        for lo in range(0, len(flat), window):
            stream.readinto(flat[lo : lo + window])
        stream.finish()
        return 0
    # d: the outermost dimension whose rows (elements of one index of d) fit in a window.
    d = next(i for i in range(len(shape) + 1) if math.prod(shape[i + 1 :]) * itemsize <= window)
    if d == len(shape):  # 0-d
        stream.readinto(out.reshape(-1).view(np.uint8).data)
        stream.finish()
        return 0
    unit = math.prod(shape[d + 1 :])
    per = max(1, window // (unit * itemsize))
    scratch = bytearray(min(per, shape[d]) * unit * itemsize)
    mv = memoryview(scratch)
    inner = tuple(
        slice(o, o + n) for o, n in zip(rel.offsets[d + 1 :], rel.lengths[d + 1 :], strict=True)
    )
    r0, r1 = rel.offsets[d], rel.offsets[d] + rel.lengths[d]
    prefix_bytes = shape[d] * unit * itemsize
    for prefix in np.ndindex(*shape[:d]):
        if not all(
            o <= p < o + n for p, o, n in zip(prefix, rel.offsets, rel.lengths, strict=False)
        ):
            stream.skip(prefix_bytes, mv)
            continue
        at = tuple(p - o for p, o in zip(prefix, rel.offsets, strict=False))
        for j0 in range(0, shape[d], per):
            j1 = min(shape[d], j0 + per)
            nbytes = (j1 - j0) * unit * itemsize
            a, b = max(j0, r0), min(j1, r1)
            if a >= b:
                stream.skip(nbytes, mv)
                continue
            stream.readinto(mv[:nbytes])
            rows = np.frombuffer(scratch, raw, count=(j1 - j0) * unit).reshape(
                (j1 - j0, *shape[d + 1 :])
            )
            out[(*at, slice(a - r0, b - r0))] = rows[(slice(a - j0, b - j0), *inner)]
    stream.finish()
    return len(scratch)
