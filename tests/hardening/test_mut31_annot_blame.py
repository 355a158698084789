"""Mutation audit 31a, what a damaged checksum block held (``io/_blame.py``): the message of a
PCK-CHECKSUM finding names the tensor ranges, entry value or header the bytes hold, so that an
operator can judge what was lost (spec §10, R-VERIFY-5).

Each test names the mutant it kills.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.errors import ChecksumError
from portable_ckpt.format.manifest import Continuation
from portable_ckpt.io.commit import commit
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.storage import open_storage

from .._corrupt import flip_byte

BS = 4096


def _one_file(
    root: Path, tensors: dict[str, np.ndarray], codec: str = "none", per_rank: str = "",
    table: bool = False,
) -> tuple[Path, str]:
    """A one-writer version of ``tensors`` in one file of 4 KiB checksum blocks; ``per_rank``:
    the name of a per-rank entry it also stores (its value in a file of its own)."""
    storage = open_storage(root, create=True)
    attempt = new_attempt_id(1)
    w = ShardWriter(storage, attempt, 0, block_size=BS, codec=codec)
    if per_rank:
        w.add_entry(per_rank, {"seed": 7}, scope="per_rank", rank=0,
                    world_size_policy="require_same")
    for k, a in tensors.items():
        w.add_tensor(k, a, offsets=(0,) * a.ndim, global_shape=a.shape)
    commit(storage, attempt, step=1, indexes=[w.finish()], expected_writers=[0],
           continuation=Continuation("exact", 1, None), tensor_table=table or None)
    ck = portable_ckpt.open(root / attempt)
    [rel] = [p for p in ck.manifest.files if p.startswith("data/")]
    return root / attempt, rel


def test_a_block_of_many_tensors_names_eight_and_counts_the_rest(tmp_path: Path) -> None:
    """Twelve small tensors in the block of the shard header, damaged (so the exact ranges
    are unknown): the file's first eight tensors are named and the rest counted. Mutants B01
    (nine named) and B03 (the rest not counted: the message read as if the list were
    complete)."""
    vdir, rel = _one_file(tmp_path, {f"t{i:02d}": np.full(4, i, np.float32)
                                     for i in range(12)})
    assert (vdir / rel).stat().st_size < BS  # one block
    flip_byte(vdir / rel, 10)
    [err] = portable_ckpt.open(vdir).verify(deep=True)
    assert err.code == "PCK-CHECKSUM" and "the exact ranges are unknown" in err.message
    assert re.findall(r"tensor '(t\d\d)'", err.message) == [f"t{i:02d}" for i in range(8)]
    assert "tensor 't07'; and 4 more;" in err.message, err.message


def test_elements_a_block_holds_include_the_ones_it_cuts(tmp_path: Path) -> None:
    """float64 elements that start 4 bytes past a multiple of 8, so each 4 KiB block boundary
    cuts one in two: block 1 names both elements it cuts, block 2 the rest up to the tensor's
    end, and tensor c after it. Mutants B04 (the end rounded down: the last element cut by the block, its
    bytes damaged, not named) and B06 (the block's end, not the tensor's: elements past 1000
    named)."""
    vdir, rel = _one_file(tmp_path, {"a": np.ones(3, np.float32), "b": np.ones(1000, np.float64),
                                     "c": np.ones(2100, np.float32)})
    raw = (vdir / rel).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    start = 8 + n + json.loads(raw[8:8 + n])["b@0"]["data_offsets"][0]  # b's first byte
    assert start % 8 == 4 and start < BS and 2 * BS < start + 8000 < 3 * BS  # ends in block 2
    flip_byte(vdir / rel, BS + 100)
    [err] = portable_ckpt.open(vdir).verify(deep=True)
    lo, hi = (BS - start) // 8, (2 * BS - start) // 8 + 1
    assert f"tensor 'b' range offsets [0] lengths [1000] (elements [{lo}:{hi}] of its 1000" in (
        err.message), err.message
    flip_byte(vdir / rel, BS + 100)
    flip_byte(vdir / rel, 2 * BS + 10)
    [err] = portable_ckpt.open(vdir).verify(deep=True)
    assert f"(elements [{hi - 1}:1000] of its 1000, row-major); tensor 'c'" in err.message, (
        err.message)


def test_a_compressed_range_is_named_by_its_frame_and_codec(tmp_path: Path) -> None:
    """A zstd range's bytes are a frame, not elements: the message says which bytes of the
    frame and its codec. Mutant B19 (the codec left out)."""
    data = np.random.default_rng(0).random(3000)  # 24 KB that zstd cannot shrink much
    vdir, rel = _one_file(tmp_path, {"r": data}, codec="zstd")
    flip_byte(vdir / rel, 2 * BS + 10)
    [err] = portable_ckpt.open(vdir).verify(deep=True)
    assert re.search(r"tensor 'r' range offsets \[0\] lengths \[3000\] \(bytes \[\d+:\d+\] "
                     r"of its \d+-byte zstd frame\)", err.message), err.message


def test_a_per_rank_entry_value_is_named_with_its_rank(tmp_path: Path) -> None:
    """A damaged file of a per-rank entry's value names the entry and the rank whose value it
    is. Mutant B12 (the rank left out: which rank's state was lost was not said)."""
    vdir, _ = _one_file(tmp_path, {"t": np.ones(4, np.float32)}, per_rank="rng")
    [rel] = [p.relative_to(vdir).as_posix() for p in (vdir / "entries").iterdir()]
    flip_byte(vdir / rel, 5)
    [err] = portable_ckpt.open(vdir).verify(deep=True)
    assert "the block holds the value of entry 'rng' (rank 0)" in err.message, err.message


def test_a_damaged_header_names_each_tensor_of_its_own_file_once(tmp_path: Path) -> None:
    """The header of writer 0's file damaged: the file's tensors are named from the manifest,
    each once however many of its ranges the file holds, and none of another file. Mutants
    B07 (the records of every file walked: writer 1's tensor named too) and B09 (a tensor
    named once per range)."""
    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(1)
    w0, w1 = (ShardWriter(storage, attempt, i, block_size=BS) for i in range(2))
    a = np.arange(8, dtype=np.float32)
    w0.add_tensor("w", a[:4], offsets=(0,), global_shape=(8,))
    w0.add_tensor("w", a[4:], offsets=(4,), global_shape=(8,))
    w1.add_tensor("only1", np.ones(4, np.float32), offsets=(0,), global_shape=(4,))
    commit(storage, attempt, step=1, indexes=[w0.finish(), w1.finish()], expected_writers=[0, 1],
           continuation=Continuation("exact", 2, None))
    flip_byte(tmp_path / attempt / "data" / "w00000-0000.safetensors", 10)
    [err] = portable_ckpt.open(tmp_path / attempt).verify(deep=True)
    assert "the exact ranges are unknown; the file holds tensor 'w';" in err.message, err.message
    assert err.message.count("tensor '") == 1, err.message


def test_a_damaged_tensor_table_is_named_as_the_table(tmp_path: Path) -> None:
    """The tensor table (§8.5) holds every tensor's ranges: its damage is said to be the
    table's. Mutant B10 (the table not told apart): the message did not say that every
    tensor's ranges were lost with it."""
    vdir, _ = _one_file(tmp_path, {f"t{i}": np.ones(4, np.float32) for i in range(3)},
                        table=True)
    table = portable_ckpt.open(vdir).manifest.tensor_table
    assert table is not None
    flip_byte(vdir / table.file, 20)
    with pytest.raises(ChecksumError) as got:  # the table is read to open the version
        portable_ckpt.open(vdir)
    assert "the block holds part of the version's tensor table (every tensor's ranges)" in (
        got.value.message)
