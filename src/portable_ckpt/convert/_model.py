"""The neutral description of a source checkpoint that every reader produces and every sink eats.

A source is a list of tensors, each with its stored chunks (box + a loader that reads just that
chunk), plus non-tensor entries with JSON values. Loaders are called one at a time by the sink, so
a conversion holds at most one batch of chunks in memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from portable_ckpt.errors import CheckpointError
from portable_ckpt.ranges import Box, check_coverage

__all__ = [
    "ChunkSpec",
    "ConvertWarning",
    "EntrySpec",
    "SourcePlan",
    "TensorSpec",
    "check_plan",
    "to_json_value",
]


@dataclass
class ChunkSpec:
    """One stored chunk of a tensor.

    Attributes:
        offsets: the chunk's offsets in the global tensor.
        lengths: the chunk's shape.
        nbytes: bytes of the chunk's elements.
        where: file (and item) it is stored in, for messages.
        load: returns the chunk as a numpy array of shape ``lengths`` (any strides).

    """

    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    nbytes: int
    where: str
    load: Callable[[], np.ndarray[Any, Any]]


@dataclass
class TensorSpec:
    """A tensor of the source: key, format dtype name, global shape and its chunks."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    chunks: list[ChunkSpec]


@dataclass
class EntrySpec:
    """A non-tensor value of the source, stored as an entry with ``schema`` (default any JSON)."""

    name: str
    value: Any
    schema: str = "pck:json/1"


@dataclass
class ConvertWarning:
    """Something the conversion skipped or changed, reported in the summary."""

    item: str
    message: str

    def to_json(self) -> dict[str, str]:
        """Return ``{"item": ..., "message": ...}``."""
        return {"item": self.item, "message": self.message}


@dataclass
class SourcePlan:
    """Everything a sink needs to write a source."""

    format: str
    tensors: list[TensorSpec]
    entries: list[EntrySpec] = field(default_factory=list)
    warnings: list[ConvertWarning] = field(default_factory=list)
    world_size: int = 1
    close: Callable[[], None] = lambda: None

    @property
    def total_bytes(self) -> int:
        """Return the bytes of all tensor elements."""
        return sum(c.nbytes for t in self.tensors for c in t.chunks)

    @property
    def largest_chunk(self) -> int:
        """Return the size in bytes of the largest stored chunk."""
        return max((c.nbytes for t in self.tensors for c in t.chunks), default=0)


def check_plan(plan: SourcePlan) -> None:
    """Check that every tensor's chunks cover it exactly once (before anything is written).

    Raises:
        CoverageGapError, CoverageOverlapError, RangeBoundsError: the layout is broken; the
            message names the tensor and the files of its chunks.

    """
    for t in plan.tensors:
        boxes = [Box.of(c.offsets, c.lengths) for c in t.chunks]
        try:
            check_coverage(t.shape, boxes, key=t.key)
        except CheckpointError as exc:
            files = sorted({c.where for c in t.chunks})
            exc.message = f"{exc.message} (chunks stored in {', '.join(files[:4])})"
            exc.args = (exc.message,)
            raise


def to_json_value(value: Any, depth: int = 0) -> Any:
    """Return the Python value ``value`` as plain JSON data, or raise ``ValueError``.

    Recognised: ``None``, bools, ints, finite floats, strings, and lists/tuples/dicts (string or
    int keys; int keys become strings) of these. Tuples become lists.
    """
    if depth > 64:
        raise ValueError("nested too deeply")
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"non-finite float {value!r}")
        return float(value)
    if isinstance(value, list | tuple):
        return [to_json_value(v, depth + 1) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                if isinstance(k, int) and not isinstance(k, bool):
                    k = str(k)
                else:
                    raise ValueError(f"dict key {k!r} is not a string")
            out[k] = to_json_value(v, depth + 1)
        return out
    raise ValueError(f"value of type {type(value).__name__} is not JSON data")
