"""The committer publishes nothing unless every check passes."""

from __future__ import annotations

import os

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.errors import (
    CommitConflictError,
    CoverageGapError,
    CoverageOverlapError,
    EntryMissingError,
    FileMissingError,
    FileSizeError,
    MetadataConflictError,
    NotFoundError,
    ShardMismatchError,
    WriterMissingError,
)
from portable_ckpt.format.manifest import Continuation
from portable_ckpt.io.commit import commit
from portable_ckpt.io.versions import list_versions
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.storage import open_storage


def two_writers(root, step=1, *, second_offset=4, second_dtype=np.float32, second_shape=(8,)):
    storage = open_storage(root, create=True)
    aid = new_attempt_id(step)
    w0 = ShardWriter(storage, aid, 0)
    w0.add_tensor("x", np.arange(4, dtype=np.float32), offsets=(0,), global_shape=(8,))
    w1 = ShardWriter(storage, aid, 1)
    w1.add_tensor(
        "x", np.arange(4, dtype=second_dtype), offsets=(second_offset,), global_shape=second_shape
    )
    return storage, aid, w0, w1


def assert_nothing_published(root, aid) -> None:
    assert not os.path.exists(os.path.join(root, aid, "manifest.json"))
    versions = list_versions(root)
    assert all(v.status == "incomplete" for v in versions if v.id == aid)
    with pytest.raises(NotFoundError):
        portable_ckpt.open(root)


def test_commit_reads_indexes_from_storage(tmp_path) -> None:
    storage, aid, w0, w1 = two_writers(tmp_path)
    w0.finish()
    w1.finish()
    m = commit(storage, aid, step=1, expected_writers=[0, 1])
    assert "index/w00000.json" in m.files and "index/w00001.json" in m.files
    ck = portable_ckpt.open(tmp_path)
    np.testing.assert_array_equal(
        ck.read("x"), np.r_[np.arange(4), np.arange(4)].astype(np.float32)
    )
    assert ck.verify(deep=True) == []


def test_missing_writer_publishes_nothing(tmp_path) -> None:
    storage, aid, w0, w1 = two_writers(tmp_path)
    w0.finish()  # writer 1 "died"
    with pytest.raises(WriterMissingError, match="writer 1"):
        commit(storage, aid, step=1, expected_writers=[0, 1])
    assert_nothing_published(tmp_path, aid)


def test_shape_disagreement_publishes_nothing(tmp_path) -> None:
    storage, aid, w0, w1 = two_writers(tmp_path, second_shape=(9,), second_offset=5)
    w0.finish()
    w1.finish()
    with pytest.raises(MetadataConflictError, match=r"\[9\]"):
        commit(storage, aid, step=1, expected_writers=[0, 1])
    assert_nothing_published(tmp_path, aid)


def test_coverage_gap_and_overlap(tmp_path) -> None:
    storage, aid, w0, w1 = two_writers(tmp_path / "gap", second_offset=3)
    with pytest.raises(CoverageOverlapError):
        commit(storage, aid, step=1, indexes=[w0.finish(), w1.finish()])
    assert_nothing_published(tmp_path / "gap", aid)
    storage = open_storage(tmp_path / "g2", create=True)
    aid = new_attempt_id(1)
    w = ShardWriter(storage, aid, 0)
    w.add_tensor("x", np.arange(4, dtype=np.float32), offsets=(0,), global_shape=(8,))
    with pytest.raises(CoverageGapError, match=r"\[4:8\]"):
        commit(storage, aid, step=1, indexes=[w.finish()])
    assert_nothing_published(tmp_path / "g2", aid)


def test_dtype_disagreement(tmp_path) -> None:
    storage, aid, w0, w1 = two_writers(tmp_path, second_dtype=np.float64)
    with pytest.raises(MetadataConflictError, match="float64"):
        commit(storage, aid, step=1, indexes=[w0.finish(), w1.finish()])
    assert_nothing_published(tmp_path, aid)


def test_truncated_or_missing_file(tmp_path) -> None:
    storage, aid, w0, w1 = two_writers(tmp_path)
    i0, i1 = w0.finish(), w1.finish()
    path = os.path.join(tmp_path, aid, "data", "w00001-0000.safetensors")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 3)
    with pytest.raises(FileSizeError, match="w00001"):
        commit(storage, aid, step=1, indexes=[i0, i1])
    os.unlink(path)
    with pytest.raises(FileMissingError, match="w00001"):
        commit(storage, aid, step=1, indexes=[i0, i1])
    assert_nothing_published(tmp_path, aid)


def test_header_disagreement(tmp_path) -> None:
    storage, aid, w0, w1 = two_writers(tmp_path)
    i0, i1 = w0.finish(), w1.finish()
    # Claim writer 1's chunk is a different name than the one in its safetensors header.
    rec = i1.tensors["x"].ranges[0]
    from dataclasses import replace

    i1.tensors["x"].ranges[0] = replace(rec, name="x@999")
    with pytest.raises(ShardMismatchError, match="x@999"):
        commit(storage, aid, step=1, indexes=[i0, i1])


def test_commit_is_create_if_absent(tmp_path) -> None:
    storage, aid, w0, w1 = two_writers(tmp_path)
    idx = [w0.finish(), w1.finish()]
    commit(storage, aid, step=1, indexes=idx)
    before = open(os.path.join(tmp_path, aid, "manifest.json"), "rb").read()
    with pytest.raises(CommitConflictError):
        commit(storage, aid, step=1, indexes=idx)
    assert open(os.path.join(tmp_path, aid, "manifest.json"), "rb").read() == before


def test_per_rank_entries_need_every_rank(tmp_path) -> None:
    storage = open_storage(tmp_path, create=True)
    aid = new_attempt_id(1)
    ws = [ShardWriter(storage, aid, r) for r in range(3)]
    for r, w in enumerate(ws[:2]):
        w.add_entry("rng", {}, "pck:rng/1", scope="per_rank", rank=r, world_size_policy="modulo")
    with pytest.raises(EntryMissingError, match=r"\[2\]"):
        commit(
            storage,
            aid,
            step=1,
            indexes=[w.finish() for w in ws],
            continuation=Continuation("exact", 3),
        )
    assert_nothing_published(tmp_path, aid)


def test_aborted_writer_removes_its_files(tmp_path) -> None:
    storage, aid, w0, w1 = two_writers(tmp_path)
    w0.finish()
    w0b = ShardWriter(storage, aid, 5)
    w0b.add_tensor("y", np.ones(3, np.float32))
    w0b.finish()
    assert os.path.exists(os.path.join(tmp_path, aid, "data", "w00005-0000.safetensors"))
    w0b.abort()
    assert not os.path.exists(os.path.join(tmp_path, aid, "data", "w00005-0000.safetensors"))


def test_declared_tensor_without_ranges_is_a_gap_not_a_silent_drop(tmp_path) -> None:
    """A writer may declare a tensor it holds no part of; if nobody stored it, commit refuses."""
    storage = open_storage(tmp_path, create=True)
    aid = new_attempt_id(1)
    w = ShardWriter(storage, aid, 0)
    w.declare_tensor("lost", "float32", (4,))
    w.add_tensor("kept", np.zeros(2, np.float32))
    w.finish()
    with pytest.raises(CoverageGapError, match="lost"):
        commit(storage, aid, step=1, expected_writers=[0])
    assert_nothing_published(tmp_path, aid)


def test_per_rank_value_beyond_the_world_size_is_a_schema_error(tmp_path) -> None:
    """The committer applies the parser's entry rule (R-ENTRY-9): rank >= world_size is PCK-SCHEMA."""
    from portable_ckpt.errors import SchemaError

    storage = open_storage(tmp_path, create=True)
    aid = new_attempt_id(1)
    w = ShardWriter(storage, aid, 0)
    for r in (0, 1, 5):
        w.add_entry("rng", {}, "pck:rng/1", scope="per_rank", rank=r, world_size_policy="modulo")
    with pytest.raises(SchemaError, match=r"not below it: \[5\]"):
        commit(storage, aid, step=1, indexes=[w.finish()], continuation=Continuation("exact", 2))
    assert_nothing_published(tmp_path, aid)


def test_commit_returns_its_report_and_switches_layout_without_rechecking(
    tmp_path, monkeypatch
) -> None:
    """commit() returns a CommittedManifest with its report; a JSON manifest too large for
    readers switches to a table in place (R-TABLE-9): every file's size is checked once and
    the checks already made stay in the report."""
    from portable_ckpt.format import jsonio
    from portable_ckpt.io.commit import CommittedManifest
    from portable_ckpt.storage.faults import FaultyStorage

    storage, aid, w0, w1 = two_writers(tmp_path / "a")
    m = commit(storage, aid, step=1, indexes=[w0.finish(), w1.finish()])
    assert isinstance(m, CommittedManifest) and m.tensor_table is None
    r = m.report
    assert (r.writers, r.files, r.tensors, r.ranges) == (2, 4, 1, 2)
    assert r.checks == ["coverage", "files", "headers"] and r.bytes == sum(
        f.size for f in m.files.values()
    )
    real = (tmp_path / "a" / aid / "manifest.json").stat().st_size
    monkeypatch.setattr(jsonio, "MAX_MANIFEST_BYTES", real - 1)
    inner, aid2, w0, w1 = two_writers(tmp_path / "b")
    counted = FaultyStorage(inner)
    m2 = commit(counted, aid2, step=1, indexes=[w0.finish(), w1.finish()])
    assert m2.tensor_table is not None and m2.format_version == "1.1"
    assert m2.report.checks == ["coverage", "files", "headers", "tensor-table"]
    assert len(counted.ops_for("size")) == 4  # the four writer files, once each
    assert len(counted.ops_for("create", "*/manifest.json")) == 1
    np.testing.assert_array_equal(
        portable_ckpt.open(tmp_path / "b").read("x"), np.r_[np.arange(4), np.arange(4)]
    )


def test_oversized_table_manifest_is_refused_before_anything_is_written(
    tmp_path, monkeypatch
) -> None:
    """PCK-LIMIT when even the table manifest is too large; no orphan table file is left."""
    from portable_ckpt.errors import LimitError
    from portable_ckpt.format import jsonio

    monkeypatch.setattr(jsonio, "MAX_MANIFEST_BYTES", 100)
    storage, aid, w0, w1 = two_writers(tmp_path)
    with pytest.raises(LimitError, match="1 GiB"):
        commit(storage, aid, step=1, indexes=[w0.finish(), w1.finish()], tensor_table=True)
    assert not list((tmp_path / aid).glob("tensor-table-*"))
    assert_nothing_published(tmp_path, aid)


@pytest.mark.parametrize("bad", ["gap", "overlap"])
def test_a_shared_coverage_proof_never_hides_a_bad_layout(tmp_path, bad: str) -> None:
    """Tensors of one layout share a proof; one of the same shape with other boxes is checked."""
    storage = open_storage(tmp_path, create=True)
    aid = new_attempt_id(1)
    writers = [ShardWriter(storage, aid, r) for r in range(2)]
    for i in range(20):  # twenty tensors laid out alike, split between two writers
        for r, w in enumerate(writers):
            w.add_tensor(f"layer{i}", np.ones(4, np.float32), offsets=(4 * r,), global_shape=(8,))
    start, length = {"overlap": (3, 4), "gap": (5, 3)}[bad]  # [0,4) + [3,7) or [0,4) + [5,8)
    writers[0].add_tensor("odd", np.ones(4, np.float32), offsets=(0,), global_shape=(8,))
    writers[1].add_tensor("odd", np.ones(length, np.float32), offsets=(start,), global_shape=(8,))
    error = CoverageOverlapError if bad == "overlap" else CoverageGapError
    with pytest.raises(error, match="odd"):
        commit(storage, aid, step=1, indexes=[w.finish() for w in writers])
    assert_nothing_published(str(tmp_path), aid)


def test_a_file_system_without_hard_links_commits_by_renameat2_or_says_why_not(
    tmp_path, monkeypatch
) -> None:
    """Multi-job review F11: on a file system without hard links (FUSE mounts of object
    stores, SMB, exFAT) every save failed on manifest.json with a bare "Operation not
    permitted". renameat2(RENAME_NOREPLACE), which spec §4.3 allows, is tried; without it the
    error says what the file system lacks."""
    import ctypes
    import errno

    from portable_ckpt.errors import StorageError

    def no_link(src, dst):  # type: ignore[no-untyped-def]
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_link)
    m = portable_ckpt.save_arrays(tmp_path / "r", {"w": np.arange(4.0)}, step=1)
    assert portable_ckpt.open(tmp_path / "r").id == m.attempt_id
    assert not [p for p in os.listdir(tmp_path / "r" / m.attempt_id) if p.endswith(".tmp")]
    from portable_ckpt.storage import open_storage

    st = open_storage(tmp_path / "r")
    assert st.create_if_absent(f"{m.attempt_id}/manifest.json", b"other") is False  # no replace

    class NoRenameat2:
        def __init__(self, *a: object, **k: object) -> None:
            pass

    monkeypatch.setattr(ctypes, "CDLL", NoRenameat2)
    with pytest.raises(StorageError, match="supports neither hard links nor renameat2"):
        portable_ckpt.save_arrays(tmp_path / "r", {"w": np.arange(4.0)}, step=2)


def test_nothing_is_written_or_committed_into_a_version_directory(tmp_path) -> None:
    """Framework review 26, F1: a root inside a version (the version itself, its ``data/``) is
    refused by the writer before a byte is written and by the committer, on disk and on an
    object store's prefix (the root a reader of the outer root never sees)."""
    from portable_ckpt.errors import UsageError
    from portable_ckpt.io.versions import refuse_root_in_version

    m = portable_ckpt.save_arrays(tmp_path, step=1, arrays={"w": np.ones(2)})
    version = tmp_path / m.attempt_id
    for inner in (version, version / "data", version / "new-root"):
        storage = open_storage(inner, create=True) if inner.name == "new-root" else \
            open_storage(inner)
        with pytest.raises(UsageError, match=f"Save into the root, {tmp_path}$"):
            ShardWriter(storage, new_attempt_id(2), 0)
        with pytest.raises(UsageError, match="version directory"):
            commit(storage, new_attempt_id(2), step=2)
    with pytest.raises(UsageError, match="is a version directory"):
        portable_ckpt.save_arrays(version, step=2, arrays={"w": np.ones(2)})
    assert not any(p.name.startswith("s000000000002") for p in tmp_path.rglob("*"))
    aid = m.attempt_id
    for url in (f"s3://bkt/runs/{aid}/data/", f"s3://bkt/{aid}/x", f"s3://bkt/{aid}/a/b/c"):
        with pytest.raises(UsageError, match=f"in the version directory s3://bkt/[a-z/]*{aid}"):
            refuse_root_in_version(url)
    for fine in ("s3://bkt/runs", f"s3://{aid[:20]}/r", str(tmp_path), str(tmp_path / "other"),
                 f"s3://bkt/runs/{aid}"):  # (given as text; a storage is asked, below)
        refuse_root_in_version(fine)
    # re-attack 26: at any depth (3 levels were looked at), relative, through a link
    deep = version / "a" / "b" / "c"
    deep.mkdir(parents=True)
    (tmp_path / "link").symlink_to(version)
    for inner in (deep, tmp_path / "link" / "x", os.path.relpath(deep)):
        with pytest.raises(UsageError, match=f"lies in the version directory {version}"):
            refuse_root_in_version(str(inner))
    with pytest.raises(UsageError, match="is a version directory"):
        refuse_root_in_version(os.path.relpath(version))
    # a root a person named like an attempt id is a root: empty, then holding its versions
    named = tmp_path / "runs" / new_attempt_id(9)
    refuse_root_in_version(str(named))
    for step in (1, 2):
        portable_ckpt.save_arrays(named, step=step, arrays={"w": np.ones(2)})
    assert [v.step for v in list_versions(named)] == [1, 2]
