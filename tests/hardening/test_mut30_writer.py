"""Mutation audit 30, the shard writer (``io/writer.py``): argument bounds and the memory a
write may use, which the round-trip tests pass through without looking at.

Each test names the mutant it kills (table in the audit's ``mutants.md``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.storage import open_storage


def _writer(root: Path, **kw: object) -> ShardWriter:
    return ShardWriter(open_storage(root, create=True), new_attempt_id(1), 0, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("shape, offsets, global_shape", [
    ((4,), (0, 0), (4, 4)),  # offsets of the tensor's rank, an array of another rank
    ((4,), (0,), (4, 4)),
    ((2, 2), (0, 0), (4,)),
], ids=["array-rank-differs", "offsets-rank-differs", "both-differ"])
def test_a_chunk_of_another_rank_is_a_range_bounds_error(
    tmp_path: Path, shape: tuple[int, ...], offsets: tuple[int, ...],
    global_shape: tuple[int, ...]
) -> None:
    """A chunk must have its tensor's rank, said as PCK-RANGE-BOUNDS like every chunk that
    does not fit. Found while classifying mutant W11: a 1-d array given 2-d offsets of a 2-d
    tensor raised a bare ``ValueError`` from ``zip(strict=True)`` inside ``Box.within``."""
    from portable_ckpt.errors import RangeBoundsError

    w = _writer(tmp_path)
    with pytest.raises(RangeBoundsError, match="does not fit the global shape"):
        w.add_tensor("x", np.ones(shape, np.float32), offsets=offsets, global_shape=global_shape)
