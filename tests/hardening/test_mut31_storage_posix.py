"""Mutation audit 31, ``storage/_posix.py``: the opener every local reader and conversion
source uses (component walk below a directory, bounded whole-file reads, source kinds).

Real files under ``tmp_path``; each test names the mutants it kills
(``/work/tmp/mut31s/mutants.md`` of the audit).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from portable_ckpt.errors import FileMissingError, LimitError, PathUnsafeError
from portable_ckpt.storage._posix import file_kind, open_regular, read_regular


def test_a_walk_below_a_directory_refuses_dot_dot_and_empty_components(tmp_path: Path) -> None:
    """``open_regular(rel, below=d)`` is the confinement of conversion sources (a DCP
    checkpoint's ``relative_path``): ``..`` and empty components are refused before any open,
    even where they would name an existing file. Mutants P12 (``..`` walked: the file beside
    the directory was opened) and P13 (``a//x``: FileMissingError, not PathUnsafeError)."""
    below = tmp_path / "ckpt"
    (below / "a").mkdir(parents=True)
    (below / "a" / "x").write_bytes(b"inside")
    (tmp_path / "secret").write_bytes(b"outside")
    for rel in ("../secret", "a/../../secret", "a//x", "a/./x", "/a/x"):
        with pytest.raises(PathUnsafeError):
            open_regular(rel, below=str(below))
    fd = open_regular("a/x", below=str(below))
    try:
        assert os.read(fd, 16) == b"inside"
    finally:
        os.close(fd)


def test_read_regular_reads_a_file_of_exactly_the_limit(tmp_path: Path) -> None:
    """``max_size`` bytes are allowed; one more is refused by its size before a byte is read.
    Mutants P08 (``>=``: a file of exactly the limit refused), P09 (``<``: refused after
    reading it, as grown) and P10 (no size check: read, then refused as grown)."""
    path = tmp_path / "index.json"
    path.write_bytes(b"x" * 100)
    assert read_regular(str(path), max_size=100) == b"x" * 100
    with pytest.raises(LimitError, match="100 bytes, above the limit of 99"):
        read_regular(str(path), max_size=99)


def test_a_source_is_a_file_or_a_directory_and_nothing_else(tmp_path: Path) -> None:
    """``file_kind`` of ``file/sub`` (a regular file used as a directory, ENOTDIR): the source
    does not exist, FileMissingError like any missing path (mutant P06: a lasting PCK-STORAGE
    "Not a directory"); a FIFO is neither kind, refused by its type before anything opens it
    (mutant P07 called it a file)."""
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(FileMissingError, match="does not exist"):
        file_kind(str(tmp_path / "model.safetensors" / "sub"))
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(FileMissingError, match="is a FIFO, not a regular file or a directory"):
        file_kind(str(tmp_path / "fifo"))
    assert file_kind(str(tmp_path)) == "dir"
    assert file_kind(str(tmp_path / "model.safetensors")) == "file"
