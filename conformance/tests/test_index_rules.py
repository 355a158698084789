"""The checker holds stored writer indexes to R-FILES-1 and R-INDEX-6 (errata 3).

Before, an index present but not listed in ``files`` was a warning, and an index that
disagreed with the manifest (another dtype, a range the manifest does not have) passed.
Verification records, added after the commit like drill and copy records, are not flagged.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conformance.checker import check
from conformance.craft import file_record
from portable_ckpt.io.annotations import write_verification_record
from portable_ckpt.io.commit import commit
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.storage import open_storage


def _two_writers(root: Path, *, per_rank_entry: bool = False) -> Path:
    """Two writers with stored indexes: ``t`` of 8 int64 split in halves (and, if asked, a
    per-rank entry ``rng`` and a continuation of 2 ranks)."""
    from portable_ckpt.format.manifest import Continuation

    storage = open_storage(root, create=True)
    attempt = new_attempt_id(3)
    for w in (0, 1):
        sw = ShardWriter(storage, attempt, w, sync_on_finish=True)
        sw.add_tensor("t", np.arange(4, dtype=np.int64) + 4 * w, offsets=(4 * w,),
                      global_shape=(8,))
        if per_rank_entry:
            sw.add_entry("rng", {"seed": w}, scope="per_rank", rank=w,
                         world_size_policy="require_same")
        sw.finish()
    commit(storage, attempt, step=3, expected_writers=[0, 1],
           continuation=Continuation(world_size=2) if per_rank_entry else None)
    return root / attempt


def _rerecord(vdir: Path, rel: str) -> None:
    """Record ``rel``'s new size and checksums in the manifest (the file is intact again)."""
    data = (vdir / rel).read_bytes()
    _edit_json(vdir / "manifest.json", lambda m: m["files"].update({rel: file_record(data)}))


def _edit_json(path: Path, fn: object) -> None:
    doc = json.loads(path.read_text())
    fn(doc)  # type: ignore[operator]
    path.write_text(json.dumps(doc))


def test_a_stored_index_version_is_conformant(tmp_path: Path) -> None:
    vdir = _two_writers(tmp_path)
    assert sorted(p.name for p in (vdir / "index").iterdir()) == ["w00000.json", "w00001.json"]
    rep = check(vdir, deep=True)
    assert rep.codes == set() and rep.warnings == []


def test_an_index_not_listed_in_files_is_an_error(tmp_path: Path) -> None:
    """R-FILES-1: a stored writer index is a file of the version."""
    vdir = _two_writers(tmp_path)
    _edit_json(vdir / "manifest.json", lambda m: m["files"].pop("index/w00001.json"))
    assert check(vdir).codes == {"PCK-SCHEMA"}
    assert any("index/w00001.json" in e.message for e in check(vdir).errors)


def test_an_index_that_disagrees_with_the_manifest_is_a_conflict(tmp_path: Path) -> None:
    """R-INDEX-6: an index is part of the manifest (dtype, shape, ranges, entries)."""
    def grow(i: dict[str, object]) -> None:  # a size the file does not have (audit F3)
        rec = next(iter(i["files"].values()))  # type: ignore[attr-defined]
        rec["size"] += 1

    for n, edit in enumerate((
        lambda i: i["tensors"]["t"].update(dtype="int32"),
        lambda i: i["tensors"]["t"]["ranges"][0].update(name="t@renamed"),
        lambda i: i["files"].update({"data/w00009-0000.safetensors": next(iter(i["files"].values()))}),
        grow,
    )):
        vdir = _two_writers(tmp_path / str(n))
        _edit_json(vdir / "index" / "w00001.json", edit)
        _rerecord(vdir, "index/w00001.json")  # the index file itself is intact
        assert check(vdir, deep=True).codes == {"PCK-METADATA-CONFLICT"}, n


def test_a_broken_manifest_is_one_report_not_one_per_index(tmp_path: Path) -> None:
    """R-INDEX-6 is checked on a manifest without errors of its own (R-VERSION-13)."""
    vdir = _two_writers(tmp_path)
    _edit_json(vdir / "manifest.json", lambda m: m["tensors"]["t"].update(dtype="int32"))
    assert check(vdir).codes == {"PCK-SHARD-MISMATCH"}


def test_verification_records_are_not_unlisted_files(tmp_path: Path) -> None:
    vdir = _two_writers(tmp_path)
    write_verification_record(open_storage(tmp_path), vdir.name, ok=True, mode="deep",
                              fraction=None, chunks=2)
    rep = check(vdir, deep=True)
    assert rep.codes == set() and rep.warnings == []
    (vdir / "verifications" / "v20260101T000000000000Z-00000000.json").write_text("{}")
    assert check(vdir).codes == {"PCK-SCHEMA"}  # a record that is no verification record


@pytest.mark.parametrize(("table", "older"), [(False, "1.0"), (True, "1.1")], ids=["json", "table"])
def test_an_index_older_than_its_dtypes_is_refused(tmp_path: Path, table: bool,
                                                   older: str) -> None:
    """R-DTYPE-3: a writer index of 1.0 (JSON) or 1.1 (a tensor table, code 18) may not hold
    complex64, a dtype of 1.3. The index's table codes were not checked against its version
    (its JSON tensors are, by the schema): such a version was called conformant."""
    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(1)
    sw = ShardWriter(storage, attempt, 0, tensor_table=table, sync_on_finish=True)
    sw.add_tensor("z", np.arange(2, dtype=np.complex64))
    sw.finish()
    commit(storage, attempt, step=1, expected_writers=[0], tensor_table=table)
    vdir = tmp_path / attempt
    assert check(vdir, deep=True).codes == set()
    _edit_json(vdir / "index" / "w00000.json", lambda i: i.update(format_version=older))
    _rerecord(vdir, "index/w00000.json")  # the index file itself is intact
    rep = check(vdir, deep=True)
    assert rep.codes == {"PCK-DTYPE-UNSUPPORTED"}, rep.errors
    assert any("complex64" in e.message and "index/w00000.json" in e.message
               for e in rep.errors), rep.errors
