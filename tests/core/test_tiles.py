"""Tiled storage: ``save_arrays(tiles=...)`` / ``ShardWriter.add_tiled`` and what a region read costs."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.errors import UsageError
from portable_ckpt.io.writer import MAX_TILES


def _matrix(n: int) -> np.ndarray:
    return np.arange(n * n, dtype=np.float32).reshape(n, n)


def test_tiled_round_trip_with_uneven_edge_tiles(tmp_path: Path) -> None:
    a = np.arange(100 * 70, dtype=np.int32).reshape(100, 70)
    v = np.arange(10, dtype=np.float64)
    s = np.array(3.5)
    m = portable_ckpt.save_arrays(tmp_path / "ck", {"a": a, "v": v, "s": s, "plain": a}, step=1,
                                  tiles={"a": (32, 16), "v": [3], "s": ()})
    assert len(m.tensors["a"].ranges) == 4 * 5  # ceil(100/32) x ceil(70/16)
    assert len(m.tensors["v"].ranges) == 4 and len(m.tensors["s"].ranges) == 1
    assert len(m.tensors["plain"].ranges) == 1
    ck = portable_ckpt.open(tmp_path / "ck")
    np.testing.assert_array_equal(ck.read("a"), a)
    np.testing.assert_array_equal(ck.read("a", (33, 15), (40, 30)), a[33:73, 15:45])
    np.testing.assert_array_equal(ck.read("v"), v)
    assert float(ck.read("s")) == 3.5
    assert portable_ckpt.open(tmp_path / "ck").verify(deep=True) == []


def test_a_square_of_a_tiled_matrix_reads_only_its_tiles(tmp_path: Path) -> None:
    a = _matrix(1024)  # 4 MiB, rows of 4 KiB: row-major, a 64 x 64 square touches 64 blocks
    portable_ckpt.save_arrays(tmp_path / "rows", {"m": a}, step=1, block_size=4096)
    portable_ckpt.save_arrays(tmp_path / "tiles", {"m": a}, step=1, block_size=4096,
                              tiles={"m": (64, 64)})
    got = {}
    for name in ("rows", "tiles"):
        ck = portable_ckpt.open(tmp_path / name)
        np.testing.assert_array_equal(ck.read("m", (300, 500), (64, 64)), a[300:364, 500:564])
        got[name] = ck.stats.bytes_read
        files = ck.manifest.files.values()
        assert {f.checksum.block_size for f in files} == {4096}
    assert got["rows"] >= 64 * 4096  # one block per row
    # 4 tiles of 16 KiB touched (each read in whole 4 KiB blocks around the needed rows)
    assert got["tiles"] <= 4 * 16384 + 4 * 4096, got
    assert got["tiles"] * 3 < got["rows"]


@pytest.mark.parametrize("tile", [(8,), (0, 8), (8, -1), (True, 8), (8.0, 8), ("8", 8)])
def test_a_bad_tile_is_refused_before_anything_is_written(
    tmp_path: Path, tile: tuple[object, ...]
) -> None:
    with pytest.raises(UsageError, match="tile"):
        portable_ckpt.save_arrays(tmp_path / "ck", {"m": _matrix(16)}, step=1, tiles={"m": tile})
    assert not os.path.exists(tmp_path / "ck")


def test_unknown_keys_and_too_many_tiles_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not arrays"):
        portable_ckpt.save_arrays(tmp_path / "ck", {"m": _matrix(4)}, step=1, tiles={"x": (2, 2)})
    big = np.zeros((MAX_TILES + 1,), np.uint8)
    with pytest.raises(UsageError, match="ranges"):
        portable_ckpt.save_arrays(tmp_path / "ck", {"b": big}, step=1, tiles={"b": (1,)})
    assert not os.path.exists(tmp_path / "ck")
