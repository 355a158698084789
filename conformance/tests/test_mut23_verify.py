"""Mutation audit 23: what ``verify_saved`` and the suite's reader hold a saved version to.

One version of ``explicit_case`` is saved through the reference adapter (a real writer and
committer process); each test then compares it with a job it does not match, or damages one
thing, and expects the harness's verdict (:class:`HarnessFailure`) or its absence.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from conformance.cases import EntrySpec, SaveCase
from conformance.craft import file_record
from conformance.harness import run_save_case
from conformance.reader import latest_committed
from conformance.spec import TABLE_EXTENSION
from conformance.verify import HarnessFailure, publish_invariants, verify_saved

from .conftest import REFERENCE_ADAPTER, adapter, explicit_case


@pytest.fixture(scope="module")
def saved_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("saved")
    run_save_case(adapter(REFERENCE_ADAPTER, trace=False), explicit_case(), work)
    return work / "root"


@pytest.fixture
def saved(saved_once: Path, tmp_path: Path) -> tuple[Path, str]:
    """A private copy of the saved root and its attempt id."""
    root = tmp_path / "root"
    shutil.copytree(saved_once, root, symlinks=True)
    (aid,) = [p.name for p in root.iterdir() if p.is_dir()]
    return root, aid


def test_the_saved_version_matches_its_job(saved: tuple[Path, str]) -> None:
    root, aid = saved
    assert verify_saved(root, aid, explicit_case()) == []


def _other_job(edit: str) -> SaveCase:
    case = explicit_case()
    if edit == "shape":  # V07: [4, 3] saved, [3, 4] asked: the same bytes (same seed and size)
        case.tensors[0] = replace(case.tensors[0], shape=[3, 4],
                                  boxes=[([0, 0], [3, 4], 0)])
    elif edit == "fewer-tensors":  # V06: the version holds a tensor the job did not ask for
        case.tensors = case.tensors[:1]
    elif edit == "fewer-entries":  # V09: the version holds an entry the job did not ask for
        case.entries = []
    return case


@pytest.mark.parametrize("edit", ["shape", "fewer-tensors", "fewer-entries"])
def test_a_version_that_is_not_its_job(edit: str, saved: tuple[Path, str]) -> None:
    root, aid = saved
    with pytest.raises(HarnessFailure):
        verify_saved(root, aid, _other_job(edit))


@pytest.mark.parametrize(("damage", "rule"), [
    ("1.1", r"R-VERSION-2"),  # V13, C63: 1.1 without a tensor table (R-VERSION-2)
    ("extension", r"has no tensor_table"),  # C64: the table extension without a table
    ("stray", r"'data/extra\.bin' is not listed in files"),  # C65: R-FILES-1
], ids=["1.1", "extension", "stray"])
def test_what_check_warns_of_is_a_writer_fault(damage: str, rule: str,
                                               saved: tuple[Path, str]) -> None:
    """``check`` only warns of these on a root of unknown history; the harness, where only the
    writer under test wrote the attempt, fails them."""
    root, aid = saved
    m = root / aid / "manifest.json"
    doc = json.loads(m.read_text())
    if damage == "stray":
        (root / aid / "data" / "extra.bin").write_bytes(b"lock")
    else:
        doc["format_version"] = "1.1"
        if damage == "extension":
            doc["must_understand"] = [TABLE_EXTENSION]
    m.write_text(json.dumps(doc))
    with pytest.raises(HarnessFailure, match=rule):
        verify_saved(root, aid, explicit_case())


def test_a_leftover_temporary_manifest_is_allowed(saved: tuple[Path, str]) -> None:
    """V12: a committer killed while publishing leaves ``manifest.json.<x>.tmp`` (R-COMMIT-7),
    which readers ignore; the unlisted-file warning it causes is no writer fault."""
    root, aid = saved
    (root / aid / "manifest.json.0123abcd.tmp").write_text("{}")
    warned = verify_saved(root, aid, explicit_case())
    assert any("is not listed in files" in w for w in warned)


def test_publish_invariants_name_an_unexpected_or_wrong_latest_version(
        saved: tuple[Path, str]) -> None:
    """V14, V15: a committed version nobody asked for; a latest version that is not expected."""
    root, aid = saved
    publish_invariants(root, {aid: explicit_case()}, aid)
    with pytest.raises(HarnessFailure, match="unexpected committed version"):
        publish_invariants(root, {}, aid)
    other = "s000000000007-20260101T000000000000Z-0123456789abcdef"
    with pytest.raises(HarnessFailure, match="latest committed version"):
        publish_invariants(root, {aid: explicit_case()}, other)


def _manifest(root: Path, aid: str, step: int, committed_at: str, named: str | None = None) -> None:
    (root / aid).mkdir(parents=True)
    (root / aid / "manifest.json").write_text(json.dumps(
        {"attempt_id": named or aid, "step": step, "committed_at": committed_at}))


def test_latest_is_by_step_then_commit_time_then_attempt_id(tmp_path: Path) -> None:
    """R01, R04, R06: the spec's order (step, committed_at, attempt_id); a fraction of a second
    compares as a number (.5 is .50), so the attempt id decides between them."""
    a = "s000000000005-20260101T000000000000Z-00000000000000ff"
    b = "s000000000005-20260101T000000000000Z-0000000000000000"
    _manifest(tmp_path, a, 5, "2026-01-01T00:00:01.5Z")
    _manifest(tmp_path, b, 5, "2026-01-01T00:00:01.50Z")
    latest = latest_committed(tmp_path)
    assert latest is not None and latest.name == a
    c = "s000000000005-20260101T000000000000Z-0000000000000001"
    _manifest(tmp_path, c, 5, "2026-01-01T00:00:02Z")  # later commit, smaller id
    latest = latest_committed(tmp_path)
    assert latest is not None and latest.name == c


def test_latest_skips_a_manifest_of_another_attempt(tmp_path: Path) -> None:
    """R02: a manifest whose attempt_id is not its directory's is no version there."""
    a = "s000000000005-20260101T000000000000Z-0000000000000000"
    b = "s000000000009-20260101T000000000000Z-0000000000000000"
    _manifest(tmp_path, a, 5, "2026-01-01T00:00:01Z")
    _manifest(tmp_path, b, 9, "2026-01-01T00:00:01Z", named=a)
    latest = latest_committed(tmp_path)
    assert latest is not None and latest.name == a


def test_a_per_rank_declaration_with_another_policy(tmp_path: Path) -> None:
    """V11: the declaration is the job's, world_size_policy included (a per-rank entry saved
    with ``require_same`` is not the job's ``modulo`` one)."""
    case = explicit_case()
    case.entries.append(EntrySpec("rng", {"id": "pck:json/1"}, "per_rank", "json",
                                  values=[{"seed": 0}, {"seed": 1}], policy="require_same"))
    run_save_case(adapter(REFERENCE_ADAPTER, trace=False), case, tmp_path)
    root = tmp_path / "root"
    (aid,) = [p.name for p in root.iterdir() if p.is_dir()]
    case.entries[-1].policy = "modulo"
    with pytest.raises(HarnessFailure, match="declaration"):
        verify_saved(root, aid, case)


def test_the_saved_version_is_checked_deeply(saved: tuple[Path, str]) -> None:
    """V16: a listed file no range or entry reads, whose checksum is wrong, is found only by the
    deep check (R-CKSUM): the harness checks what a writer saved with ``--deep``."""
    root, aid = saved
    (root / aid / "notes.txt").write_bytes(b"written by the writer")
    m = root / aid / "manifest.json"
    doc = json.loads(m.read_text())
    doc["files"]["notes.txt"] = file_record(b"written by the writer")
    doc["files"]["notes.txt"]["checksum"]["blocks"] = "00000000"
    m.write_text(json.dumps(doc))
    with pytest.raises(HarnessFailure, match="PCK-CHECKSUM"):
        verify_saved(root, aid, explicit_case())
