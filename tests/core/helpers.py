"""Small helpers shared by the core tests."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from portable_ckpt.format.dtypes import DTYPES
from portable_ckpt.format.manifest import Continuation, Manifest
from portable_ckpt.io.commit import commit
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.storage import open_storage


def sample_array(dtype: str, shape: Sequence[int], seed: int = 0) -> np.ndarray:
    """Deterministic values of any table dtype, exactly representable in the rows of 1.0.

    A row without a sign or a zero (as ``float8_e8m0fnu`` would be) rounds some of them: compare
    such arrays by their bytes (contributor review D7).
    """
    rng = np.random.default_rng(seed)
    np_dtype = DTYPES[dtype].numpy
    n = int(np.prod(shape)) if shape else 1
    if dtype == "bool":
        raw = rng.integers(0, 2, n).astype(bool)
    elif dtype.startswith(("int", "uint")):
        info = np.iinfo(np_dtype)
        raw = rng.integers(max(info.min, -1000), min(info.max, 1000), n, endpoint=True).astype(
            np_dtype
        )
    else:
        raw = (rng.integers(-64, 64, n) / 4).astype(np.float32).astype(np_dtype)
    return raw.reshape(tuple(shape))


def grid_boxes(
    shape: Sequence[int], parts: Sequence[int]
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Uneven grid split of ``shape`` into ``parts`` pieces per dimension."""
    cuts = [[s * i // p for i in range(p + 1)] for s, p in zip(shape, parts)]
    out = []
    for idx in itertools.product(*[range(len(c) - 1) for c in cuts]):
        offs = tuple(c[i] for c, i in zip(cuts, idx))
        lens = tuple(c[i + 1] - c[i] for c, i in zip(cuts, idx))
        if all(n > 0 for n in lens):
            out.append((offs, lens))
    return out


def save_sharded(
    root: Any,
    tensors: dict[str, tuple[np.ndarray, Sequence[int]]],
    *,
    step: int = 1,
    writers: int = 2,
    codec: str = "none",
    block_size: int = 4096,
    entries: dict[str, Any] | None = None,
    continuation: Continuation | None = None,
    max_file_bytes: int = 4 << 30,
    writer_tables: bool | Sequence[int] = False,
    tensor_table: bool | None = None,
) -> Manifest:
    """Save each tensor split on a grid (``parts`` per dim), chunks dealt round-robin to writers.

    ``writer_tables`` makes all (``True``) or the listed writers describe their records in a
    tensor table (spec §8.5); ``tensor_table`` is passed to :func:`commit`.
    """
    storage = open_storage(root, create=True)
    attempt = new_attempt_id(step)
    tabled = set(range(writers)) if writer_tables is True else set(writer_tables or ())
    ws = [
        ShardWriter(
            storage,
            attempt,
            w,
            codec=codec,
            block_size=block_size,
            max_file_bytes=max_file_bytes,
            tensor_table=w in tabled,
        )
        for w in range(writers)
    ]
    n = 0
    for key, (arr, parts) in tensors.items():
        boxes = grid_boxes(arr.shape, parts) if arr.ndim else [((), ())]
        if arr.size == 0:
            ws[0].declare_tensor(key, _name(arr), arr.shape)
        for offs, lens in boxes:
            sl = tuple(slice(o, o + ln) for o, ln in zip(offs, lens))
            ws[n % writers].add_tensor(key, arr[sl], offsets=offs, global_shape=arr.shape)
            n += 1
    for name, value in (entries or {}).items():
        ws[0].add_entry(name, value)
    idx = [w.finish() for w in ws]
    return commit(
        storage,
        attempt,
        step=step,
        indexes=idx,
        expected_writers=list(range(writers)),
        continuation=continuation,
        tensor_table=tensor_table,
    )


def _name(arr: np.ndarray) -> str:
    from portable_ckpt.format.dtypes import dtype_name

    return dtype_name(arr.dtype)
