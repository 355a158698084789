"""Mutation audit 30, durability of the write and commit path (``io/writer.py``,
``io/commit.py``, ``storage/local.py``): the fsyncs the suite did not watch.

The real system calls of the real local backend are logged through ``tests/rules/_trace.py``
(wrappers that perform every call); each test names the mutant it kills.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from portable_ckpt.io.commit import commit
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.storage import open_storage

from ..rules._trace import trace_posix


def test_a_writer_index_name_is_durable_before_finish_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-COMMIT-6: once ``finish()`` returns, another process may commit the attempt from the
    index it stored, so the index's name must survive a crash as well as its bytes. Mutant W26
    (the ``sync()`` after the index's ``put`` dropped): the index was fsynced but the
    directory ``index/`` that names it never was."""
    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(1)
    w = ShardWriter(storage, attempt, 0)
    w.add_tensor("x", np.ones(4, dtype=np.float32))
    log = trace_posix(monkeypatch)
    w.finish()
    monkeypatch.undo()
    vdir = str(tmp_path / attempt)
    i_index = log.index("open", lambda p: p == f"{vdir}/index/w00000.json")
    later = [p for c, p, _ in log.events[i_index:] if c == "fsync"]
    assert f"{vdir}/index/w00000.json" in later
    assert f"{vdir}/index" in later, "the index's directory was not fsynced after it was created"


def test_deferred_writer_files_are_durable_before_the_commit_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sync_on_finish=False`` leaves the fsyncs to the commit ("which syncs the storage
    first", R-COMMIT-6/17): every data file and the directories naming them are fsynced before
    ``manifest.json`` is linked. Mutant C32 (the commit's ``storage.sync()`` dropped): the
    record was published while the data directory's names were not yet durable."""
    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(1)
    log = trace_posix(monkeypatch)
    idx = []
    for w in (0, 1):
        sw = ShardWriter(storage, attempt, w, write_index=False, sync_on_finish=False)
        sw.add_tensor("x", np.full(4, w, np.float32), offsets=(4 * w,), global_shape=(8,))
        idx.append(sw.finish())
    commit(storage, attempt, step=1, indexes=idx, expected_writers=[0, 1])
    monkeypatch.undo()
    vdir = str(tmp_path / attempt)
    i_link = log.index("link", lambda p: p.endswith(f" -> {vdir}/manifest.json"))
    before = {p for c, p, _ in log.events[:i_link] if c == "fsync"}
    files = sorted(str(p) for p in (tmp_path / attempt / "data").iterdir())
    assert len(files) == 2
    for f in files:
        assert f in before, f"{f} not fsynced before the commit record"
    assert {f"{vdir}/data", vdir, str(tmp_path)} <= before, (
        "a directory naming the data files was not fsynced before the commit record")
