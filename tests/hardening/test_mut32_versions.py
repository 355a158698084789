"""Mutation audit 32 of ``io/versions.py``: which attempts are versions, how a commit record is
classified, ``latest`` and what a restore passes over (spec §3, §4.1, §15.1, §16.2), on real
roots written by the library.

Each test names the mutant it kills (the audit's table is in its report).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.errors import (
    ManifestMissingError,
    NotFoundError,
    PassedOverWarning,
    StorageError,
    UsageError,
)
from portable_ckpt.io.annotations import write_verification_record
from portable_ckpt.io.copy import copy_version
from portable_ckpt.io.gc import gc
from portable_ckpt.io.pins import pin
from portable_ckpt.io.versions import (
    classify_attempt,
    enclosing_version,
    foreign_keys,
    latest,
    likely_record,
    list_versions,
    refuse_root_in_version,
    restore_decision,
)
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.faults import Fault, FaultyStorage


def _save(root: Path, step: int) -> str:
    return portable_ckpt.save_arrays(root, {"w": np.arange(8.0) + step}, step=step).attempt_id


def _set_record(root: Path, aid: str, **members: object) -> None:
    path = root / aid / "manifest.json"
    doc = json.loads(path.read_text())
    doc.update(members)
    path.write_text(json.dumps(doc))


def test_a_newer_foreign_record_claiming_no_valid_time_is_still_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """R-COMMIT-1: a foreign attempt of the answer's step whose ``committed_at`` is no timestamp
    claims no time, so nothing shows it older than the answer: a restore names it. ``ls`` shows
    no time for it. Mutant V06 (``_claimed_time`` keeps any string): its "time" ordered before
    every version, the restore passed over it silently, and ``ls`` showed the text as a time."""
    good = _save(tmp_path, 5)
    newer = _save(tmp_path, 5)
    _set_record(tmp_path, newer, format_version="2.0", committed_at="next tuesday")
    listed = {v.id: (v.status, v.committed_at) for v in list_versions(tmp_path)}
    assert listed[newer] == ("foreign", None) and listed[good][0] == "committed"
    with caplog.at_level(logging.WARNING, logger="portable_ckpt"), \
            pytest.warns(PassedOverWarning, match=newer):
        assert portable_ckpt.open(tmp_path).id == good


def test_opening_a_version_whose_record_was_lost_says_so_and_names_the_repair(
    tmp_path: Path,
) -> None:
    """A version opened by its path whose ``manifest.json`` is gone while its copy record
    remains was committed (only a committed version gets one, §14): the error says the record
    is lost and how to put it back, not that the attempt was never committed. Mutant V13
    (``_read_record`` drops the lost-record branch): "the attempt was never committed", and
    the repair went unsaid."""
    src = tmp_path / "src"
    aid = _save(src, 3)
    assert copy_version(str(src / aid), tmp_path / "dst").record is not None
    (src / aid / "manifest.json").unlink()
    with pytest.raises(ManifestMissingError) as info:
        portable_ckpt.open(src / aid)
    assert "is lost" in info.value.message and "recommit" in info.value.message
    assert "never committed" not in info.value.message


def _lost_record(root: Path, step: int) -> str:
    """A committed version that lost its ``manifest.json`` and kept its copy record."""
    aid = _save(root, step)
    assert copy_version(str(root / aid), root.parent / f"copy{step}").record is not None
    (root / aid / "manifest.json").unlink()
    return aid


def test_an_attempt_whose_listing_fails_is_unreadable_and_gc_keeps_it(tmp_path: Path) -> None:
    """R-GC-6: an attempt without a commit record whose directories cannot be listed (one
    ``EIO``) may be a version that lost its record: nothing is known about it. It is
    ``unreadable``, gc neither deletes nor counts it, and says so. Mutant V21 (a listing error
    in ``_without_record`` gives ``incomplete``): gc deleted the version's data as garbage."""
    root = tmp_path / "r"
    keep = _save(root, 1)
    lost = _lost_record(root, 2)
    faulty = FaultyStorage(open_storage(root), [Fault(op="list", path=f"{lost}/data/", error="EIO")])
    c = classify_attempt(faulty, lost)
    assert c.status == "unreadable" and c.error is not None and c.error.code == "PCK-STORAGE"
    report = gc(faulty, keep=1, grace_seconds=0.0)
    assert [u["id"] for u in report.unknown] == [lost] and not report.complete
    assert report.deleted == [] and report.abandoned == []
    assert (root / lost / "data").is_dir() and any((root / lost / "data").iterdir())
    assert {v.id: v.status for v in list_versions(root)} == {keep: "committed", lost: "invalid"}


def test_empty_record_directories_do_not_make_an_attempt_a_lost_version(tmp_path: Path) -> None:
    """Only records count as evidence that an attempt was committed (§15.1), not an empty
    ``drills/`` or ``copies/`` directory (a tool that made one and stopped, a hand's mkdir):
    such an attempt without a commit record is ``incomplete``, deleted after the grace period.
    Mutant V19 (directories count, files or not): it was ``invalid``, kept for ever."""
    root = tmp_path / "r"
    keep = _save(root, 1)
    aid = _save(root, 2)
    (root / aid / "manifest.json").unlink()
    (root / aid / "drills").mkdir()
    (root / aid / "copies").mkdir()
    assert {v.id: v.status for v in list_versions(root)} == {keep: "committed", aid: "incomplete"}
    report = gc(root, keep=1, grace_seconds=0.0)
    assert report.abandoned == [aid] and not (root / aid).exists()


def test_a_record_changed_in_place_to_the_same_length_is_classified_again(tmp_path: Path) -> None:
    """Listings keep classifications by the record's bytes (ops review F11): a record changed
    in place without changing its length (a digit flipped by a disk or a hand) is a new record,
    classified again. Mutant V58 (kept by attempt and length only): the listing went on
    calling the damaged record ``committed``, and gc counted it."""
    root = tmp_path / "r"
    ids = [_save(root, s) for s in (1, 2)]
    assert [v.status for v in list_versions(root)] == ["committed", "committed"]
    record = root / ids[1] / "manifest.json"
    raw = record.read_bytes()
    assert raw.count(b'"step":2,') == 1
    record.write_bytes(raw.replace(b'"step":2,', b'"step":7,'))  # same length
    assert {v.id: v.status for v in list_versions(root)} == {ids[0]: "committed", ids[1]: "invalid"}


def test_a_root_that_is_a_file_or_missing_is_named_as_such(tmp_path: Path) -> None:
    """A mistyped root is not a root without versions: ``latest`` (``open``) says that it does
    not exist, or that it is a file, not "no committed version". Mutant V26 (``latest`` does
    not look at the root when it lists no attempt) and V61 (``root_must_exist`` does not tell a
    file): the error named no version, or called the file missing."""
    (tmp_path / "afile").write_text("not a root")
    with pytest.raises(NotFoundError, match="is not a directory; a root is the directory"):
        latest(open_storage(tmp_path / "afile"))
    with pytest.raises(NotFoundError, match=r"does not exist \(no directory"):
        latest(open_storage(tmp_path / "missing"))
    with pytest.raises(NotFoundError, match="no committed version for any step"):
        latest(open_storage(tmp_path, create=True))


def test_an_empty_commit_record_is_no_likely_record(tmp_path: Path) -> None:
    """``likely_record`` names a record of an allowed size only: an empty ``manifest.json`` (a
    disk that lost the record's bytes) is none, and the older record is not named either (it is
    not the greatest). Mutant V59 (size 0 allowed): the empty record was named likely."""
    root = tmp_path / "r"
    _save(root, 1)
    two = _save(root, 2)
    assert likely_record(open_storage(root)) == (two, (root / two / "manifest.json").stat().st_size)
    (root / two / "manifest.json").write_bytes(b"")
    assert likely_record(open_storage(root)) is None


def test_an_unreadable_attempt_of_the_answers_step_stops_latest(tmp_path: Path) -> None:
    """R-ID-5: an attempt of the newest committed version's own step whose commit record cannot
    be read may have been committed after it: ``latest`` raises PCK-STORAGE rather than return
    the version it can read. Mutant V32 (only a level without an answer stops): the restore took
    the older commit of the step, silently."""
    root = tmp_path / "r"
    good = _save(root, 5)
    newer = _save(root, 5)
    faulty = FaultyStorage(open_storage(root),
                           [Fault(op="read", path=f"{newer}/manifest.json", error="EIO")])
    with pytest.raises(StorageError, match=f"cannot tell whether .*{newer} is the latest") as info:
        latest(faulty)
    assert info.value.retryable
    assert latest(open_storage(root))[0] == newer and good != newer


def test_a_remote_root_named_like_an_attempt_is_a_root() -> None:
    """A save into an object-store root whose last component is named like an attempt id (a
    person's choice) writes into that root; only a version found there, or an attempt-named
    component with more below it, is refused (framework review 26, F1). Mutant V63 (the last
    component counted as a version): every save into such a root was refused as PCK-USAGE."""
    aid = "s000000000001-20261203T000000000000Z-00000000000000aa"
    refuse_root_in_version(f"s3://bucket/runs/{aid}")  # nothing says it is a version: a root
    with pytest.raises(UsageError, match=f"lies in the version directory s3://bucket/runs/{aid}"):
        refuse_root_in_version(f"s3://bucket/runs/{aid}/inner")


def test_a_local_root_named_like_an_attempt_is_a_root_until_it_holds_a_versions_parts(
    tmp_path: Path,
) -> None:
    """Locally, a directory named like an attempt id is a version only when it holds what an
    attempt holds (§2.1): an empty one, or one holding attempts, is a root a save may use.
    Mutant V62 (any attempt-named directory): a save into such a root was refused."""
    aid = "s000000000001-20261203T000000000000Z-00000000000000aa"
    root = tmp_path / aid
    root.mkdir()
    refuse_root_in_version(root)
    _save(root, 1)  # it holds attempts now: still a root
    refuse_root_in_version(root)
    (root / "data").mkdir()  # what a version holds
    with pytest.raises(UsageError, match="is a version directory"):
        refuse_root_in_version(root)


def test_a_file_in_a_versions_data_directory_names_the_version(tmp_path: Path) -> None:
    """``enclosing_version`` looks up to two directories above a path: a shard file given where
    a root belongs (``<version>/data/<file>``) names its version (maintainer review M9).
    Mutant V64 (one directory up): a shard's path named nothing. Only a directory is a version:
    mutant V68 (a file named like an attempt id too) named a stray file as a version."""
    root = tmp_path / "r"
    aid = _save(root, 1)
    shard = next((root / aid / "data").iterdir())
    assert enclosing_version(str(shard)) == str(root / aid)
    assert enclosing_version(str(root / aid / "data")) == str(root / aid)
    assert enclosing_version(str(root)) is None
    stray = tmp_path / "s000000000001-20261203T000000000000Z-00000000000000aa"
    stray.write_text("a file named like an attempt")
    assert enclosing_version(str(stray)) is None


def test_a_version_deleted_while_its_record_is_read_is_incomplete(tmp_path: Path) -> None:
    """A version a gc deletes between the test of its commit record and the read of it: the
    storage answered that the record does not exist, which is no storage failure: the attempt
    is classified as without a record (here nothing is left: ``incomplete``), not
    ``unreadable`` (which stops ``ls`` and ``latest``). Mutant V65 (only ManifestMissingError
    taken as absence): it was ``unreadable``."""
    root = tmp_path / "r"
    aid = _save(root, 1)

    def gc_deletes_it(op: str, path: str) -> None:
        shutil.rmtree(root / aid)

    faulty = FaultyStorage(open_storage(root), [
        Fault(op="read", path=f"{aid}/manifest.json", times=1, error=None, callback=gc_deletes_it)])
    c = classify_attempt(faulty, aid)
    assert (c.status, c.manifest) == ("incomplete", None)


def test_pins_are_the_formats_not_a_foreign_key(tmp_path: Path) -> None:
    """``pins/`` at the top of a root holds the format's pin records (§15.3): ``foreign_keys``
    (``ls --json``) names only what the format did not write. Mutant V44: every pinned root
    reported ``pins/`` as a foreign entry."""
    root = tmp_path / "r"
    aid = _save(root, 1)
    pin(root, aid, reason="release")
    (root / "notes.txt").write_text("a person's notes")
    assert foreign_keys(open_storage(root)) == ["notes.txt"]


@pytest.mark.parametrize("kind", ["clock", "probe"])
def test_a_probe_left_at_the_root_is_the_formats_not_a_foreign_key(tmp_path: Path,
                                                                     kind: str) -> None:
    """A probe gc or copy left (``.pck-clock-<16 hex>``, asking the storage's clock; or the S3
    backend's ``.pck-probe-<16 hex>``; a store that refused its delete) is the format's (spec
    §15.2): ``foreign_keys`` does not name it, and a name off the pattern stays foreign. Mutant
    V45 (probes not told from other keys) survived: only ``.pck-probe-`` had a test."""
    root = tmp_path / "r"
    _save(root, 1)
    (root / f".pck-{kind}-0123456789abcdef").write_bytes(b"")
    (root / f".pck-{kind}-0123456789abcdef.bak").write_bytes(b"")
    assert foreign_keys(open_storage(root)) == [f".pck-{kind}-0123456789abcdef.bak"]


def test_list_versions_orders_a_step_by_commit_time_not_by_id(tmp_path: Path) -> None:
    """R-ID-4: ``list_versions`` is oldest first by step, then commit time, then id; the ids
    order a step by when its attempts started. Here the attempt started first committed last
    (its record says so). Mutant V51 (the listing's order left as the ids'): ``ls`` and
    retention took it for the older one."""
    root = tmp_path / "r"
    first = _save(root, 5)
    second = _save(root, 5)
    _set_record(root, first, committed_at="2999-01-01T00:00:00.000000Z")
    assert [v.id for v in list_versions(root)] == [second, first]


def test_a_failed_listing_of_a_version_still_reads_each_kind_of_record(tmp_path: Path) -> None:
    """When the one listing of a version's directory fails, each kind of post-commit record
    is asked for by itself (and its error kept): a failed verification stays seen, and the
    version is not what a restore takes. Mutant V55 (no kind asked): the failed version looked
    verified by nothing and failed by nothing, and a restore took it."""
    root = tmp_path / "r"
    _save(root, 1)
    two = _save(root, 2)
    write_verification_record(open_storage(root), two, ok=False, mode="deep", fraction=None,
                              chunks=1, errors=[{"code": "PCK-CHECKSUM", "message": "block 0"}])
    faulty = FaultyStorage(open_storage(root),
                           [Fault(op="list", path=f"{two}/", times=1, error="EIO")])
    [v2] = [v for v in list_versions(faulty) if v.id == two]
    assert v2.verification_failed and restore_decision(v2) == "skip"
