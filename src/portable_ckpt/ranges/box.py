"""N-d boxes (offsets + lengths, in elements) and their arithmetic.

All arithmetic is on Python ints, so sizes from hostile documents cannot overflow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Box", "contiguous_prefix", "intersect", "strides_of"]


@dataclass(frozen=True, slots=True)
class Box:
    """A box of a tensor: ``offsets[i] <= index[i] < offsets[i] + lengths[i]``.

    A 0-d box has ``offsets == lengths == ()`` and holds one element.
    """

    offsets: tuple[int, ...]
    lengths: tuple[int, ...]

    @staticmethod
    def of(offsets: Sequence[int], lengths: Sequence[int]) -> Box:
        """Build a box from any int sequences."""
        return Box(tuple(int(o) for o in offsets), tuple(int(n) for n in lengths))

    @staticmethod
    def full(shape: Sequence[int]) -> Box:
        """The box covering a whole tensor of ``shape``."""
        return Box((0,) * len(shape), tuple(int(n) for n in shape))

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.offsets)

    @property
    def ends(self) -> tuple[int, ...]:
        """Exclusive upper corner."""
        return tuple(o + n for o, n in zip(self.offsets, self.lengths, strict=True))

    @property
    def volume(self) -> int:
        """Number of elements (1 for a 0-d box)."""
        return math.prod(self.lengths)

    def within(self, shape: Sequence[int]) -> bool:
        """Whether the box lies inside a tensor of ``shape`` (and has its rank)."""
        return len(shape) == self.ndim and all(
            o >= 0 and n >= 0 and o + n <= s
            for o, n, s in zip(self.offsets, self.lengths, shape, strict=True)
        )

    def relative_to(self, outer: Box) -> Box:
        """Return the box in the coordinates of ``outer`` (which must contain it)."""
        return Box(
            tuple(o - p for o, p in zip(self.offsets, outer.offsets, strict=True)), self.lengths
        )

    def slices(self, origin: Sequence[int] | None = None) -> tuple[slice, ...]:
        """Numpy slices selecting this box, optionally relative to ``origin``."""
        org = origin if origin is not None else (0,) * self.ndim
        return tuple(
            slice(o - p, o - p + n) for o, n, p in zip(self.offsets, self.lengths, org, strict=True)
        )

    def __str__(self) -> str:
        if len(self.offsets) != len(self.lengths):  # said by the error that names it, not a crash
            return f"[offsets {list(self.offsets)}, lengths {list(self.lengths)}]"
        return (
            "["
            + ", ".join(f"{o}:{o + n}" for o, n in zip(self.offsets, self.lengths, strict=True))
            + "]"
        )


def intersect(a: Box, b: Box) -> Box | None:
    """Return the intersection of two boxes of equal rank, or ``None`` if it is empty."""
    offs = []
    lens = []
    for ao, an, bo, bn in zip(a.offsets, a.lengths, b.offsets, b.lengths, strict=True):
        lo = ao if ao > bo else bo
        hi = min(ao + an, bo + bn)
        if hi <= lo:
            return None
        offs.append(lo)
        lens.append(hi - lo)
    return Box(tuple(offs), tuple(lens))


def strides_of(shape: Sequence[int]) -> tuple[int, ...]:
    """C-order element strides of ``shape``."""
    out = [1] * len(shape)
    acc = 1
    for i in range(len(shape) - 1, -1, -1):
        out[i] = acc
        acc *= shape[i]
    return tuple(out)


def contiguous_prefix(inner: Box, outer_shape: Sequence[int]) -> int:
    """Index of the first dimension from which ``inner`` is a contiguous run in C order.

    ``inner`` (relative to a tensor of ``outer_shape``) is stored as ``prod(lengths[:k])`` runs,
    each of ``prod(lengths[k:])`` contiguous elements, where ``k`` is the returned value. ``k`` is
    0 when the whole box is one contiguous run.
    """
    nd = len(outer_shape)
    k = nd
    # Walk from the innermost dimension while the box spans it fully.
    while k > 0 and inner.lengths[k - 1] == outer_shape[k - 1]:
        k -= 1
    # Dimension k-1 may be partial; all dims before it must have length 1 for one run.
    if k == 0:
        return 0
    j = k - 1
    while j > 0 and inner.lengths[j - 1] == 1:
        j -= 1
    return j
