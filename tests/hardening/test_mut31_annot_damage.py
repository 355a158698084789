"""Mutation audit 31a, the second look at damage before it is recorded for ever (R-DRILL-8;
``io/damage.py``): a finding is recorded only when a second read of its file finds it again,
and every finding that is there again is confirmed, whatever order the findings came in.

Each test names the mutant it kills.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.errors import ChecksumError, FileMissingError
from portable_ckpt.format.manifest import Continuation
from portable_ckpt.io.commit import commit
from portable_ckpt.io.damage import (
    PLACEMENT_ENTRY,
    absent_by_design,
    confirm_damage,
    confirmed_findings,
    elsewhere,
    record_read_damage,
    writer_of,
)
from portable_ckpt.io.reader import Checkpoint
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.faults import Fault, FaultyStorage

from ..core.test_deep_verify_damage import BS, _damage, _files, _version


def _finding(full: str, block: int) -> ChecksumError:
    return ChecksumError(f"{full}: block {block} damaged", path=full,
                         span=(block * BS, (block + 1) * BS))


def test_findings_named_last_block_first_are_all_confirmed(tmp_path: Path) -> None:
    """A reader's findings arrive in any order (ranks, threads): the second read goes to the
    end of the furthest bytes named. Mutant D05 (the last finding's end, not the furthest):
    the read stopped after the first 1 MiB window, and the damage past it was called a
    transient fault and never recorded."""
    vdir = _version(tmp_path, u_elems=400_000)
    ck, f0, _ = _files(vdir)
    far = ck.manifest.files[f0].size // BS - 2
    assert far * BS > (1 << 20) + BS  # beyond the first window of a local pass
    _damage(vdir, f0, [3, far])
    full = f"{vdir.name}/{f0}"
    out = confirm_damage(ck.storage, vdir.name, ck.manifest.files,
                         [_finding(full, far), _finding(full, 3)])
    assert [(e.code, e.span) for e in out] == [  # type: ignore[attr-defined]
        ("PCK-CHECKSUM", (far * BS, (far + 1) * BS)), ("PCK-CHECKSUM", (3 * BS, 4 * BS))]


def test_a_finding_without_bytes_reads_the_file_to_its_damage(tmp_path: Path) -> None:
    """A finding naming no bytes (a restore's message) is confirmed by damage anywhere in its
    file, even when a finding with bytes of the same file, named after it, is not found again.
    Mutant D06 (each finding with bytes sets how far the file is read): the read stopped after
    the bytes of the transient finding, and the real damage past them went unrecorded."""
    vdir = _version(tmp_path, u_elems=400_000)
    ck, f0, _ = _files(vdir)
    far = ck.manifest.files[f0].size // BS - 2
    _damage(vdir, f0, [far])  # block 3 is intact: its finding was a fault of the first read
    full = f"{vdir.name}/{f0}"
    whole = ChecksumError(f"{full}: damaged", path=full)
    out = confirm_damage(ck.storage, vdir.name, ck.manifest.files, [whole, _finding(full, 3)])
    assert [e.code for e in out] == ["PCK-CHECKSUM", "PCK-STORAGE"]
    assert out[0] is whole and "not found again" in out[1].message


def test_damage_found_again_before_the_read_failed_is_confirmed(tmp_path: Path) -> None:
    """The second read found a finding's block damaged, then failed further on (EIO): that
    finding is confirmed; the one past the failure is not ("could not be read a second
    time"). Mutant D08 (what the read ended with, for every finding): the damage found again
    was taken for a storage error, and never recorded."""
    vdir = _version(tmp_path, u_elems=400_000)
    ck, f0, _ = _files(vdir)
    far = ck.manifest.files[f0].size // BS - 2
    _damage(vdir, f0, [3, far])
    full = f"{vdir.name}/{f0}"
    storage = FaultyStorage(ck.storage, [
        Fault(op="read", path=full, error="EIO", after_bytes=(1 << 20) + 16 * BS)])
    out = confirm_damage(storage, vdir.name, ck.manifest.files,
                         [_finding(full, 3), _finding(full, far)])
    assert storage.faults[0].fired == 1
    assert [e.code for e in out] == ["PCK-CHECKSUM", "PCK-STORAGE"]
    assert "could not be read a second time" in out[1].message


def test_a_finding_told_by_its_message_names_the_longest_file_it_holds(tmp_path: Path) -> None:
    """Another rank's finding arrives as text: its file is the longest file name of the
    version the message holds (``data/x`` is in a message about ``old/data/x``). Mutant D13
    (the shortest): the intact file was read again, and the damage never recorded."""
    from ..rules._util import edit_manifest

    vdir = _version(tmp_path)
    _, f0, _ = _files(vdir)
    (vdir / "old" / "data").mkdir(parents=True)
    shutil.copyfile(vdir / f0, vdir / "old" / f0)  # the same bytes: the same record
    edit_manifest(vdir, lambda d: d["files"].__setitem__(f"old/{f0}", d["files"][f0]))
    _damage(vdir, f"old/{f0}", [3])
    ck = portable_ckpt.open(vdir)
    kept, notes = confirmed_findings(ck.storage, vdir.name, ck.manifest.files, [
        ("PCK-CHECKSUM", f"rank 1: {vdir.name}/old/{f0}: block 3 damaged", None)])
    assert [k["code"] for k in kept] == ["PCK-CHECKSUM"] and notes == []
    assert f"old/{f0}" in kept[0]["message"]


def test_a_finding_with_its_path_needs_no_file_name_in_its_message(tmp_path: Path) -> None:
    """A finding's path names its file; its message need not. Mutant D14 (the file told by
    the message only): a finding whose message names no file was never recorded."""

    vdir = _version(tmp_path)
    _, f0, _ = _files(vdir)
    _damage(vdir, f0, [3])
    ck = portable_ckpt.open(vdir)
    kept, notes = confirmed_findings(ck.storage, vdir.name, ck.manifest.files, [
        ("PCK-CHECKSUM", "block 3 damaged", f"{vdir.name}/{f0}")])
    assert [k["code"] for k in kept] == ["PCK-CHECKSUM"] and notes == []


def test_a_reader_that_met_no_damage_records_nothing_and_says_none(tmp_path: Path) -> None:
    """Only damage codes are a reader's damage: a storage error it met is not (R-DRILL-8).
    Mutant D15 (every finding taken): the verdict was "unconfirmed" (damage a second read
    did not find), which a drill reports as a transient fault of the version's bytes."""

    vdir = _version(tmp_path)
    _, f0, _ = _files(vdir)
    ck = portable_ckpt.open(vdir)
    verdict, path, notes = record_read_damage(
        ck.storage, vdir.name, ck.manifest,
        [("PCK-STORAGE", f"{vdir.name}/{f0}: EIO", f"{vdir.name}/{f0}")], verifier="test")
    assert (verdict, path, notes) == ("none", None, [])
    assert not (vdir / "verifications").exists()


def _node_root(
    tmp_path: Path, nodes: int = 2, everywhere: tuple[int, ...] = ()
) -> tuple[Checkpoint, str]:
    """Node 0's root of a two-writer version of ``nodes`` nodes (spec §14.7): writer 1's
    files are on node 1's root.

    Returns the version and the path of node 1's data file.
    """
    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(3)
    ws = [ShardWriter(storage, attempt, i) for i in range(2)]
    for i, w in enumerate(ws):
        w.add_tensor("w", np.full((2, 4), i, np.float32), offsets=(2 * i, 0), global_shape=(4, 4))
    ws[0].add_entry(PLACEMENT_ENTRY, {"nodes": nodes, "node_of_rank": [0, 1], "replicas": 0,
                                      "everywhere": list(everywhere)})
    commit(storage, attempt, step=3, indexes=[w.finish() for w in ws], expected_writers=[0, 1],
           continuation=Continuation("exact", 2, None))
    ck = portable_ckpt.open(tmp_path / attempt)
    [other] = [p for p in ck.manifest.files if p.startswith("data/w00001-")]
    for rel in (other, "index/w00001.json"):
        (tmp_path / attempt / rel).unlink()
    return ck, other


def test_a_stray_file_named_like_another_nodes_shard_spares_the_node_root(
    tmp_path: Path,
) -> None:
    """A node root of a node-local version (spec §14.7) holds its own writers' files; a file
    the version does not list, named like another node's shard, says nothing about which
    node's root it is. Mutant D16 (every file here counted): the root looked like no node's,
    the other node's file missing by design was recorded as damage, and the intact version
    was never restored again (R-DRILL-8)."""
    ck, other = _node_root(tmp_path)
    attempt = ck.id
    (tmp_path / attempt / "data" / "w00001-0009.safetensors").write_bytes(b"stray")
    full = f"{attempt}/{other}"
    got = record_read_damage(ck.storage, attempt, ck.manifest,
                             [("PCK-FILE-MISSING", f"{full}: missing", full)], verifier="test")
    assert got == ("elsewhere", None, [])
    assert not (tmp_path / attempt / "verifications").exists()


def test_damage_in_a_node_roots_own_files_does_not_unspare_the_other_nodes(
    tmp_path: Path,
) -> None:
    """Only files answered missing are missing: a node root whose own files are all damaged
    is still node 0's root, node 1's file absent by design. Mutant D24 (every finding's file
    taken as missing): nothing here was node 0's, and node 1's file became damage too."""
    ck, other = _node_root(tmp_path)
    mine = sorted(p for p in ck.manifest.files if "w00000" in p)
    found = [ChecksumError(f"{ck.id}/{p}: damaged", path=f"{ck.id}/{p}") for p in mine]
    gone = [FileMissingError(f"{ck.id}/{p}: missing", path=f"{ck.id}/{p}")
            for p in (other, "index/w00001.json")]
    kept, away = elsewhere(ck.storage, ck.id, ck.manifest, [*found, *gone])
    assert kept == found and away == sorted([other, "index/w00001.json"])


@pytest.mark.parametrize(("nodes", "everywhere"), [(3, ()), (2, (2,))])
def test_an_inconsistent_placement_spares_nothing(
    tmp_path: Path, nodes: int, everywhere: tuple[int, ...]
) -> None:
    """``pck.placement`` is taken only when consistent: its nodes are exactly the nodes of its
    ranks, and each writer it keeps everywhere is one of its ranks (§14.7). Else it is no
    proof that the version was written to node roots, and a missing file is damage. Mutants
    D25 (three nodes for two ranks taken) and D26 (writer 2 of two taken): writer 1's file,
    missing from what may be a durable copy, was spared as another node's."""
    ck, other = _node_root(tmp_path, nodes, everywhere)
    gone = [FileMissingError(f"{ck.id}/{p}: missing", path=f"{ck.id}/{p}")
            for p in (other, "index/w00001.json")]
    assert elsewhere(ck.storage, ck.id, ck.manifest, gone) == (gone, [])


def test_files_two_nodes_may_lack_are_spared_only_when_both_lack_them() -> None:
    """Three nodes, each keeping its own writer and the one before (``replicas: 1``): writer
    0's files alone can be node 0's root (lacking writer 2's) or node 1's (lacking writer
    1's), so neither missing file is spared. Mutant D30 (spared when any such node lacks it):
    both were, and a copy that lost two writers passed as a node root."""
    value = {"nodes": 3, "node_of_rank": [0, 1, 2], "replicas": 1, "everywhere": []}
    missing = {"data/w00001-0000.safetensors", "data/w00002-0000.safetensors"}
    assert absent_by_design(value, missing, {"data/w00000-0000.safetensors"}) == set()
    # the control: writers 0 and 2 here are node 0's root, which lacks writer 1
    assert absent_by_design(value, {"data/w00001-0000.safetensors"}, {
        "data/w00000-0000.safetensors", "data/w00002-0000.safetensors"}) == {
        "data/w00001-0000.safetensors"}


def test_a_writer_is_told_by_a_whole_recommended_name_only() -> None:
    """Only a whole recommended name gives a file's writer (§2.1, §14.7): a file
    that merely contains one (another tool's ``old/data/w00001-…``, ``index/w00001.json.bak``)
    belongs to no writer and is never spared as another node's. Mutant D32 (a name found
    anywhere in the path): such files were given writer 1."""
    assert writer_of("data/w00001-0000.safetensors") == 1
    assert writer_of("index/w123456.json") == 123456
    assert writer_of("entries/cfg-0123abcd.r00003.json.zst") == 3
    for rel in ("old/data/w00001-0000.safetensors", "index/w00001.json.bak",
                "entries/cfg-0123abcd.g.json", "entries/x/data/w00001-y.json"):
        assert writer_of(rel) is None, rel


def test_a_missing_file_whose_directory_cannot_be_listed_is_not_called_transient(
    tmp_path: Path,
) -> None:
    """A file answered absent on the second read is checked against a listing of its
    directory; when that listing fails, nothing is known either way. Mutant D21 (the failed
    listing taken as "intact"): the finding was called a transient fault of the first read
    ("not found again"), not a look that could not be made."""
    vdir = _version(tmp_path)
    ck, f0, _ = _files(vdir)
    (vdir / f0).unlink()
    full = f"{vdir.name}/{f0}"
    storage = FaultyStorage(ck.storage, [Fault(op="list", path=f"{vdir.name}/data*")])
    out = confirm_damage(storage, vdir.name, ck.manifest.files,
                         [FileMissingError(f"{full}: missing", path=full)])
    assert [e.code for e in out] == ["PCK-STORAGE"]
    assert "could not be read a second time" in out[0].message, out[0].message
