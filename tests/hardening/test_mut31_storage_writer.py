"""Mutation audit 31, the local backend's stream writer after ``close``.

A real writer on a real directory; each test names the mutants it kills
(``/work/tmp/mut31s/mutants.md`` of the audit).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from portable_ckpt.errors import StorageError
from portable_ckpt.storage.local import LocalStorage


def test_a_closed_writer_refuses_writes(tmp_path: Path) -> None:
    """``write`` after ``close`` is a PCK-STORAGE naming the file, not a bare ``TypeError``
    from ``os.write(None, ...)`` (mutant L16), and the file keeps its bytes."""
    st = LocalStorage(tmp_path / "root", create=True)
    with st.open_writer("v/data/f") as w:
        w.write(b"abc")
        w.close()
        with pytest.raises(StorageError, match="writer is closed") as info:
            w.write(b"more")
        assert info.value.path == "v/data/f"
    w.close()
    assert st.read_all("v/data/f", max_size=10) == b"abc"



def test_sync_passes_over_what_was_removed_since(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sync`` makes durable what is still there. A deferred file whose fsync failed and
    that its save's abort removed since is nobody's to make durable (mutant L41 raised its
    error on the next save of a storage kept across saves); the directories of a removed
    attempt are no longer there to fsync (mutant L44 raised FileNotFoundError)."""
    import errno

    from portable_ckpt.storage import local

    real = local._fsync_close

    def fsync_close(fd: int, rel: str, full: str) -> None:  # the real close; fsync says EIO
        if rel != "gone/data/f":
            return real(fd, rel, full)
        os.close(fd)
        raise local._os_error("fsync", rel, OSError(errno.EIO, os.strerror(errno.EIO)), full)

    monkeypatch.setattr(local, "_fsync_close", fsync_close)
    st = LocalStorage(tmp_path / "root", create=True)
    with st.open_writer("gone/data/f", defer_sync=True) as w:
        w.write(b"x")
    st.put("scratch/deep/g", b"y")
    for path, prefix in (("gone/data/f", "gone"), ("scratch/deep/g", "scratch")):
        assert st.delete(path) is True
        st.remove_empty_dirs(prefix)
    st.sync()
    assert sorted(os.listdir(tmp_path / "root")) == []
