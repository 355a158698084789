"""Mutation audit 30, checksummed files (``io/checksum.py``): the block size a writer picks at
its boundaries, and the bounds of a verified read or a whole-file verification on their own
(callers check them too, so the suite never reached these).

Each test names the mutant it kills (the audit's ``mutants.md``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.errors import FileSizeError
from portable_ckpt.format.manifest import FileRecord
from portable_ckpt.io.checksum import (
    AUTO_FILE_BLOCKS,
    DEFAULT_BLOCK_SIZE,
    MIN_BLOCK_SIZE,
    auto_block_size,
    read_verified,
    verify_file,
)
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.base import Storage


@pytest.mark.parametrize("nbytes, expected", [
    (0, MIN_BLOCK_SIZE),
    (MIN_BLOCK_SIZE * AUTO_FILE_BLOCKS, MIN_BLOCK_SIZE),  # exactly 4,096 blocks of 4 KiB
    (MIN_BLOCK_SIZE * AUTO_FILE_BLOCKS + 1, 2 * MIN_BLOCK_SIZE),
    (DEFAULT_BLOCK_SIZE * AUTO_FILE_BLOCKS + 1, DEFAULT_BLOCK_SIZE),  # the cap, not 512 KiB
    (1 << 40, DEFAULT_BLOCK_SIZE),
])
def test_auto_block_size_is_the_smallest_that_fits_up_to_the_cap(nbytes: int,
                                                                 expected: int) -> None:
    """"The smallest power of two that cuts the file into at most ``max_blocks`` blocks,
    within [4 KiB, 256 KiB]". Mutants K01 (the cap let through once more: 512 KiB blocks for
    files above 1 GiB, doubling what a small read over-reads) and K02 (``<=``: a file of
    exactly 4,096 blocks got blocks twice as large)."""
    assert auto_block_size(nbytes) == expected
    assert auto_block_size(nbytes, max_blocks=AUTO_FILE_BLOCKS) == expected


def _shard(root: Path) -> tuple[Storage, str, FileRecord]:
    m = portable_ckpt.save_arrays(root, {"w": np.arange(3000.0)}, step=1)
    rel = next(p for p in m.files if p.startswith("data/"))
    return open_storage(root), f"{m.attempt_id}/{rel}", m.files[rel]


@pytest.mark.parametrize("lo, past", [(8, 1), (-1, 0)], ids=["past-the-end", "negative"])
def test_a_verified_read_outside_the_record_is_a_file_size_error(
    tmp_path: Path, lo: int, past: int
) -> None:
    """``read_verified`` refuses a span outside the recorded size itself (PCK-FILE-SIZE).
    Mutant K09 (only ``lo <= hi`` checked): one byte past the end reached the read planner,
    whose ``ValueError`` is no checkpoint error."""
    storage, path, rec = _shard(tmp_path)
    hi = rec.size + past
    with pytest.raises(FileSizeError, match="outside its"):
        read_verified(storage, path, rec, lo, hi, memoryview(bytearray(max(0, hi - lo))))


def test_verify_file_reports_a_file_longer_than_its_record(tmp_path: Path) -> None:
    """``verify_file`` asks the file's size first: bytes appended after the record was made
    are as wrong as bytes missing ("extended"). Mutant K10 (only a shorter file refused):
    the appended bytes, outside every checksum block, passed."""
    storage, path, rec = _shard(tmp_path)
    with open(tmp_path / path, "ab") as f:
        f.write(b"\0" * 3)
    with pytest.raises(FileSizeError, match="extended"):
        verify_file(storage, path, rec)


def test_a_one_byte_verified_read_is_read(tmp_path: Path) -> None:
    """Only an empty span is answered without a read. Mutant K13 (``hi == lo + 1``): a
    one-byte read returned without filling its buffer (zeros instead of the file's byte)."""
    storage, path, rec = _shard(tmp_path)
    raw = (tmp_path / path).read_bytes()
    for lo in (0, 7, rec.size - 1):
        buf = bytearray(b"\xa5")
        read_verified(storage, path, rec, lo, lo + 1, memoryview(buf))
        assert buf == raw[lo : lo + 1], lo
