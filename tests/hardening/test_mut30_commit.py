"""Mutation audit 30, the committer (``io/commit.py``): checks the suite reached only through
another check, or only in the JSON layout.

Each test names the mutant it kills (table in the audit's ``mutants.md``). Real versions on
local roots, real writers; an index is edited on disk only where a writer cannot be made to
write the hostile value.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.format.manifest import Continuation, Mesh, WriterIndex
from portable_ckpt.io.commit import commit
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.storage import LocalStorage, open_storage
from portable_ckpt.storage.base import Storage

from ..rules._util import expect_code, rename_shard_member


def _two_writers(root: Path, *, tables: bool, dtype1: type = np.float32,
                 shape1: tuple[int, ...] = (8,)) -> tuple[Storage, str]:
    """Writers 0 and 1 each store half of ``x`` (float32[8]); writer 1 may declare it otherwise."""
    storage = open_storage(root, create=True)
    attempt = new_attempt_id(1)
    for w, (dt, shape) in enumerate([(np.float32, (8,)), (dtype1, shape1)]):
        sw = ShardWriter(storage, attempt, w, tensor_table=tables)
        sw.add_tensor("x", np.arange(4, dtype=dt), offsets=(4 * w,), global_shape=shape)
        sw.finish()
    return storage, attempt


@pytest.mark.parametrize("tables", [False, True], ids=["json", "tables"])
@pytest.mark.parametrize("disagree", ["dtype", "shape"])
def test_writers_that_disagree_on_a_declaration_are_a_metadata_conflict(
    tmp_path: Path, tables: bool, disagree: str
) -> None:
    """Every writer must agree on a tensor's dtype and shape, whether its records come as JSON
    or in a tensor table. Mutants C05/C06 (``_TensorIds.of`` compared only the dtype, or only
    the shape): with writer tables a disagreement was merged under the first declaration and
    reported, if at all, as a coverage problem of the wrong tensor shape."""
    if disagree == "dtype":
        storage, attempt = _two_writers(tmp_path, tables=tables, dtype1=np.int32)
    else:
        storage, attempt = _two_writers(tmp_path, tables=tables, shape1=(9,))
    err = expect_code("PCK-METADATA-CONFLICT", commit, storage, attempt, step=1,
                      expected_writers=[0, 1])
    assert "'x'" in err.message and "every writer must agree" in err.message
    assert not (tmp_path / attempt / "manifest.json").exists()


def test_an_index_naming_another_writer_is_a_schema_error(tmp_path: Path) -> None:
    """``index/w00001.json`` must name writer 1: an index under another writer's name is the
    schema error of that file, whatever the other indexes say. Mutant C02 (check dropped): it
    became "writer 0 reported twice", a conflict that blames two writers for one bad file."""
    storage, attempt = _two_writers(tmp_path, tables=False)
    p = tmp_path / attempt / "index" / "w00001.json"
    doc = json.loads(p.read_text())
    doc["writer"] = 0
    p.write_text(json.dumps(doc))
    err = expect_code("PCK-SCHEMA", commit, storage, attempt, step=1, expected_writers=[0, 1])
    assert "index/w00001.json" in err.message and "names writer 0" in err.message
    assert not (tmp_path / attempt / "manifest.json").exists()


def _save(root: Path, tensors: dict[str, tuple[tuple[int, ...], list[tuple[int, int]]]]) -> tuple[
        Storage, str, list[WriterIndex]]:
    """One writer per tensor storing its boxes: ``{key: (shape, [(offset, length), ...])}``
    of 1-d float32 tensors."""
    storage = open_storage(root, create=True)
    attempt = new_attempt_id(1)
    idx: list[WriterIndex] = []
    for key, (shape, boxes) in tensors.items():
        sw = ShardWriter(storage, attempt, len(idx))
        for o, n in boxes:
            sw.add_tensor(key, np.arange(o, o + n, dtype=np.float32), offsets=(o,),
                          global_shape=shape)
        idx.append(sw.finish())
    return storage, attempt, idx


def test_tensors_of_the_same_boxes_but_another_shape_are_proven_apart(tmp_path: Path) -> None:
    """R-COVER-2 for each tensor: tensors of one layout share one coverage proof, so the
    layout is keyed by the shape as well as the boxes. ``b`` has ``a``'s two boxes but 12
    elements, 8..11 uncovered. Mutant C22 (the key left out the shape): ``b`` was taken as
    proven by ``a`` and the version was published with a gap."""
    storage, attempt, idx = _save(tmp_path, {"a": ((8,), [(0, 4), (4, 4)]),
                                             "b": ((12,), [(0, 4), (4, 4)])})
    err = expect_code("PCK-COVERAGE-GAP", commit, storage, attempt, step=1, indexes=idx)
    assert "'b'" in err.message
    assert not (tmp_path / attempt / "manifest.json").exists()


def test_the_default_world_size_is_the_number_of_expected_writers(tmp_path: Path) -> None:
    """``continuation`` defaults to ``exact`` on as many ranks as writers are expected, also
    when the committer reads the indexes from storage (``indexes=None``). Mutant C36 (the
    default counted the indexes given: none, so one rank): a three-rank save was published as
    a one-rank one, and its per-rank values were refused as out of range."""
    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(1)
    for w in range(3):
        sw = ShardWriter(storage, attempt, w)
        sw.add_tensor("x", np.full(2, w, np.float32), offsets=(2 * w,), global_shape=(6,))
        sw.add_entry("seed", w, scope="per_rank", rank=w, world_size_policy="require_same")
        sw.finish()
    m = commit(storage, attempt, step=1, expected_writers=[0, 1, 2])
    assert (m.continuation.contract, m.continuation.world_size) == ("exact", 3)


@pytest.mark.parametrize("cont, message", [
    (Continuation("exact", 2, Mesh((2,), ("data parallel",))), "mesh dimension names"),
    (Continuation("exact", 0), "world_size"),
], ids=["mesh-name-readers-accept", "world-size-zero"])
def test_the_committer_checks_the_continuation_it_is_given(
    tmp_path: Path, cont: Continuation, message: str
) -> None:
    """``commit(continuation=...)`` is checked as writers check it (spec §13) before anything
    is read: a world size of 0 is a usage error, not a schema error of the record, and mesh
    labels that readers tolerate (R-CONTRACT-8) but writers never write are refused. Mutant
    C35 (the check dropped): the first became PCK-SCHEMA after every index was read, the
    second was published."""
    storage, attempt = _two_writers(tmp_path, tables=False)
    err = expect_code("PCK-USAGE", commit, storage, attempt, step=1, expected_writers=[0, 1],
                      continuation=cont)
    assert message in err.message
    assert not (tmp_path / attempt / "manifest.json").exists()


def _renamed_range(root: Path, writer: int = 0, attempt: str | None = None) -> tuple[
        Storage, str, WriterIndex]:
    """A JSON index of ``writer`` whose range of ``w`` is stored under ``w-first`` (a name
    another writer's convention may give it), its shard header and file record to match."""
    storage = open_storage(root, create=True)
    attempt = attempt or new_attempt_id(1)
    sw = ShardWriter(storage, attempt, writer, write_index=False)
    sw.add_tensor("w", np.arange(4, dtype=np.float32).reshape(2, 2))
    idx = sw.finish()
    (rel,) = idx.files
    idx.files[rel] = rename_shard_member(root / attempt / rel, rel, "w@0,0", "w-first",
                                         idx.files[rel].checksum.block_size)
    t = idx.tensors["w"]
    t.ranges[:] = [dataclasses.replace(t.ranges[0], name="w-first")]
    return storage, attempt, idx


def test_a_table_is_refused_for_ranges_not_under_their_implied_names(tmp_path: Path) -> None:
    """R-TABLE-7: a tensor table implies each record's safetensors name, so JSON records
    stored under other names cannot go into one: ``tensor_table=True`` is a conflict, even
    when the headers are not read. Mutant C39 (names never compared): the table was published
    naming ``w@0,0``, which the shard does not hold; the version could not be read."""
    storage, attempt, idx = _renamed_range(tmp_path)
    err = expect_code("PCK-METADATA-CONFLICT", commit, storage, attempt, step=1, indexes=[idx],
                      tensor_table=True, check_headers=False)
    assert "'w-first'" in err.message and "R-TABLE-7" in err.message
    assert not (tmp_path / attempt / "manifest.json").exists()
    # Without a table the records keep their names, and the version reads.
    m = commit(storage, attempt, step=1, indexes=[idx], tensor_table=None)
    assert m.tensor_table is None and m.tensors["w"].ranges[0].name == "w-first"
    np.testing.assert_array_equal(portable_ckpt.open(tmp_path).read("w"),
                                  np.arange(4, dtype=np.float32).reshape(2, 2))


def test_a_writer_table_beside_ranges_not_under_their_implied_names_is_a_conflict(
    tmp_path: Path
) -> None:
    """By default the manifest has a table when a writer sent one (``commit``'s
    ``tensor_table``); a JSON index of another writer whose records a table cannot describe
    makes that impossible, and the committer says so rather than quietly dropping the table
    the writer asked for. Mutant C40 (only ``tensor_table=True`` refused): published as JSON."""
    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(1)
    sw = ShardWriter(storage, attempt, 1, tensor_table=True, write_index=False)
    sw.add_tensor("v", np.ones(3, np.float32))
    with_table = sw.finish()
    _, _, renamed = _renamed_range(tmp_path, 0, attempt)
    err = expect_code("PCK-METADATA-CONFLICT", commit, storage, attempt, step=1,
                      indexes=[renamed, with_table])
    assert "writer 0" in err.message and "'w-first'" in err.message
    assert not (tmp_path / attempt / "manifest.json").exists()


def _faulty_commit(root: Path, fault: object) -> tuple[str, BaseException | None]:
    """Two finished writers, then a commit through ``FaultyStorage`` with ``fault``."""
    from portable_ckpt.storage.faults import FaultyStorage

    _, attempt = _two_writers(root, tables=False)
    storage = FaultyStorage(open_storage(root), [fault])  # type: ignore[list-item]
    try:
        commit(storage, attempt, step=1, expected_writers=[0, 1])
    except BaseException as exc:  # the test inspects what came out
        return attempt, exc
    return attempt, None


def test_a_create_whose_read_back_answered_404_is_looked_up_and_succeeds(tmp_path: Path) -> None:
    """A backend's own read-back of the record it just stored may answer 404
    (FileMissingError) although the create took effect; the committer looks the record up
    and, finding its own bytes, reports success (R-COMMIT-19). Mutant C47 (FileMissingError
    taken as a refusal): the commit failed while the version was committed."""
    from portable_ckpt.errors import FileMissingError
    from portable_ckpt.storage.faults import Fault

    fault = Fault(op="create", path="*/manifest.json", lost_answer=True,
                  raises=FileMissingError("read-back of manifest.json: 404"))
    attempt, exc = _faulty_commit(tmp_path, fault)
    assert exc is None, exc
    assert fault.fired == 1
    assert portable_ckpt.open(tmp_path).id == attempt


class _LaggingHead(LocalStorage):
    """A real local root whose ``exists`` answers 404 for commit records, as a store behind
    a lagging replica or a caching gateway does while its listing already shows them."""

    def exists(self, path: str) -> bool:
        return False if path.endswith("/manifest.json") else super().exists(path)


def test_a_record_a_stale_head_misses_but_a_listing_shows_is_found(tmp_path: Path) -> None:
    """After a create whose answer was lost, "absent" needs both the lookup and a listing
    (§15.1): the record listed and holding our bytes means the create took effect. Mutant C49
    (the lookup alone decided): the commit failed for a committed version."""
    from portable_ckpt.storage.faults import Fault, FaultyStorage

    _, attempt = _two_writers(tmp_path, tables=False)
    fault = Fault(op="create", path="*/manifest.json", lost_answer=True, error="EIO")
    storage = FaultyStorage(_LaggingHead(tmp_path), [fault])
    m = commit(storage, attempt, step=1, expected_writers=[0, 1])
    assert fault.fired == 1 and m.attempt_id == attempt
    assert portable_ckpt.open(tmp_path).id == attempt


def test_a_losing_committer_removes_its_own_tensor_table_only(tmp_path: Path) -> None:
    """Two committers of one attempt (a retried commit): the loser's tensor table, written
    under its own random name, is removed when its create finds a record there; the winner's
    stays. Mutant C45 (the loser's table kept): every retried commit left a table that no
    record lists, inside a committed version (R-LAYOUT-7 foreign file)."""
    storage, attempt = _two_writers(tmp_path, tables=True)
    first = commit(storage, attempt, step=1, expected_writers=[0, 1])
    expect_code("PCK-COMMIT-CONFLICT", commit, storage, attempt, step=1,
                expected_writers=[0, 1])
    assert first.tensor_table is not None
    tables = sorted(p.name for p in (tmp_path / attempt).glob("tensor-table-*"))
    assert tables == [first.tensor_table.file]
    assert portable_ckpt.open(tmp_path).verify(deep=True) == []


def test_indexes_sent_without_their_tables_have_them_read_from_storage(tmp_path: Path) -> None:
    """An index that crossed a process boundary (``to_transport``: the writer process's
    answer) names its tensor table but carries none; the committer reads and verifies each
    such table before merging. Mutant C58 (given indexes taken as they are): the commit of
    an async save with writer tables failed with "its tensor table was not loaded"."""
    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(1)
    sent = []
    for w in (0, 1):
        sw = ShardWriter(storage, attempt, w, tensor_table=True)
        sw.add_tensor("x", np.full(4, w, np.float32), offsets=(4 * w,), global_shape=(8,))
        sent.append(WriterIndex.from_transport(sw.finish().to_transport()))
    assert all(i.tensor_table is not None and i.table is None for i in sent)
    m = commit(storage, attempt, step=1, indexes=sent, expected_writers=[0, 1])
    assert m.tensor_table is not None and m.report.ranges == 2
    np.testing.assert_array_equal(portable_ckpt.open(tmp_path).read("x"),
                                  np.repeat(np.arange(2, dtype=np.float32), 4))



def test_the_writer_process_commit_checks_the_expected_writers(tmp_path: Path) -> None:
    """Rank 0's writer process commits from the indexes it is sent and the writers the job
    expects: one index missing is PCK-WRITER-MISSING, answered as the job's failure, and
    nothing is published. Mutant P01 (``expected_writers`` not passed on): the version was
    published with half the tensor. The service's ``handle`` runs here, in this process."""
    from portable_ckpt.io.writer_process import _Service

    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(1)
    transports = []
    for w in (0, 1):
        sw = ShardWriter(storage, attempt, w)
        sw.add_tensor("x", np.full(4, w, np.float32), offsets=(4 * w,), global_shape=(8,))
        transports.append(sw.finish().to_transport())
    reply = _Service().handle({
        "op": "commit", "storage": storage.process_spec(), "attempt": attempt, "step": 1,
        "expected_writers": [0, 1], "continuation": Continuation("exact", 2).to_json(),
        "transports": transports[:1],
    }, [])
    assert (reply["ok"], reply["code"]) == (False, "PCK-WRITER-MISSING"), reply
    assert not (tmp_path / attempt / "manifest.json").exists()


def test_the_shard_headers_are_checked_by_default_at_65536_records(tmp_path: Path) -> None:
    """``check_headers`` defaults to checking "when the version has at most 65,536 range
    records". Mutant C31 (``<``): a version of exactly 65,536 records was published with no
    shard header read. The version of ``test_r_table``'s threshold test (one uint8 tensor)."""
    from portable_ckpt.io.tensor_table import TABLE_THRESHOLD

    from ..rules.test_r_table import _many_records

    storage, attempt, idx, _ = _many_records(tmp_path, TABLE_THRESHOLD)
    m = commit(storage, attempt, step=1, indexes=[idx])
    assert m.report.ranges == TABLE_THRESHOLD
    assert "headers" in m.report.checks
