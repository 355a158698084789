"""Mutation audit 31, the local backend's vectored reads (``preadv`` in runs of IOV_MAX).

A real file read into many small buffers; each test names the mutants it kills
(``/work/tmp/mut31s/mutants.md`` of the audit).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from portable_ckpt.errors import FileMissingError, FileSizeError
from portable_ckpt.storage.local import _IOV_MAX, LocalStorage
from portable_ckpt.testing.storage import payload


def test_more_buffers_than_one_preadv_takes_read_consecutive_bytes(tmp_path: Path) -> None:
    """A table of many small tensors is read into more buffers than Linux's UIO_MAXIOV: they
    go in runs of IOV_MAX, each run from where the last ended. Mutants L53 (runs larger than
    IOV_MAX: EINVAL) and L57 (every run read from the first offset)."""
    st = LocalStorage(tmp_path / "root", create=True)
    n = 2 * _IOV_MAX + 5
    data = payload(3 * n + 10)
    st.put("v/obj", data)
    bufs = [memoryview(bytearray(3)) for _ in range(n)]
    st.read_into_many("v/obj", 7, bufs)
    assert b"".join(b.tobytes() for b in bufs) == data[7 : 7 + 3 * n]
    again = [memoryview(bytearray(3)) for _ in range(n)]
    st.read_extents("v/obj", [(0, again[:1]), (10, again[1:])])
    assert again[0].tobytes() == data[:3]
    assert b"".join(b.tobytes() for b in again[1:]) == data[10 : 10 + 3 * (n - 1)]
    with pytest.raises(FileSizeError):  # the last run ends 2 bytes past the end
        st.read_into_many("v/obj", 12, bufs)


def test_a_read_below_a_file_is_a_missing_file(tmp_path: Path) -> None:
    """``data/f/x`` where ``data/f`` is a file: the object does not exist (FileMissingError, as
    ``size`` and ``exists`` say), not a lasting PCK-STORAGE "Not a directory". Mutants P16
    (the read's open) and L62 (``exists``' lstat)."""
    st = LocalStorage(tmp_path / "root", create=True)
    st.put("v/data/f", b"0123")
    assert not st.exists("v/data/f/x")
    for read in (lambda: st.read_all("v/data/f/x", max_size=10),
                 lambda: st.read_range("v/data/f/x", 0, 1),
                 lambda: st.size("v/data/f/x")):
        with pytest.raises(FileMissingError):
            read()
