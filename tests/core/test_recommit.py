"""A lost commit record rebuilt from the writer indexes (spec §15.4, ``portable-ckpt recommit``).

A committed version whose ``manifest.json`` was lost and of which no copy holds one could not
be restored by any tool (listed open since the incident reviews): its data files and writer
indexes were intact. Real two-writer versions on real files, the real CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.cli.main import main
from portable_ckpt.format.manifest import Continuation
from portable_ckpt.io.annotations import write_verification_record
from portable_ckpt.io.commit import commit
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.storage import open_storage

W = np.arange(4000, dtype=np.float32).reshape(40, 100)


def _version(root: Path, step: int = 5) -> Path:
    """Two writers, rows split, a per-rank entry of two ranks; a sampled pass recorded."""
    storage = open_storage(root, create=True)
    attempt = new_attempt_id(step)
    ws = [ShardWriter(storage, attempt, i) for i in range(2)]
    for i in range(2):
        ws[i].add_tensor("w", W[i * 20:(i + 1) * 20], offsets=(i * 20, 0), global_shape=W.shape)
        ws[i].add_entry("rng", {"seed": i}, scope="per_rank", rank=i,
                        world_size_policy="require_same")
    idx = [x.finish() for x in ws]
    commit(storage, attempt, step=step, indexes=idx, expected_writers=[0, 1],
           continuation=Continuation("exact", 2, None))
    write_verification_record(storage, attempt, ok=True, mode="sample", fraction=0.5, chunks=2)
    return root / attempt


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_lost_commit_record_is_rebuilt_from_the_writer_indexes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    v = _version(tmp_path / "root")
    original = json.loads((v / "manifest.json").read_text())
    (v / "manifest.json").unlink()
    [info] = portable_ckpt.list_versions(tmp_path / "root")
    assert info.status == "invalid"  # kept by gc, restored by nothing
    code, out, err = _cli(capsys, "recommit", str(v), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["continuation"] == {"contract": "statistical", "world_size": 2, "mesh": None}
    rebuilt = json.loads((v / "manifest.json").read_text())
    assert rebuilt["tensors"] == original["tensors"] and rebuilt["entries"] == original["entries"]
    assert set(rebuilt["files"]) == set(original["files"])
    assert rebuilt["producer"]["name"] == "portable-ckpt recommit"
    ck = portable_ckpt.open(v)
    assert np.array_equal(ck.read("w"), W) and ck.entry("rng", rank=1, world_size=2) == {"seed": 1}
    assert _cli(capsys, "verify", str(v), "--deep")[0] == 0
    # It has a record now: a second recommit changes nothing.
    code, _, err = _cli(capsys, "recommit", str(v))
    assert code == 1 and "has a commit record" in err


@pytest.mark.parametrize("lost", [0, 1])
def test_a_missing_writer_index_refuses_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lost: int
) -> None:
    """On-call review 4, R1: the highest-numbered writer's index lost went unseen (only holes
    between indexes were looked for): a DDP job's rank 1 was dropped from the record and
    `verify --deep` said OK. Its data and per-rank entry files name it."""
    v = _version(tmp_path / "root")
    (v / "manifest.json").unlink()
    (v / "index" / f"w{lost:05d}.json").unlink()
    code, _, err = _cli(capsys, "recommit", str(v))
    assert code == 1 and "[PCK-WRITER-MISSING]" in err and f"writers [{lost}]" in err, err
    assert not (v / "manifest.json").exists()


def test_a_writer_number_from_a_planted_name_costs_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On-call review 4, R2: a 14-byte ``index/w9999999999.json`` made recommit build a set of
    ten billion numbers. Holes are counted, not enumerated."""
    v = _version(tmp_path / "root")
    (v / "manifest.json").unlink()
    (v / "index" / "w9999999999.json").write_text("{}")
    code, _, err = _cli(capsys, "recommit", str(v))
    assert code == 1 and "writers [2, 3, 4, 5, 6, 7, 8, 9] ..." in err, err
    (v / "index" / "w9999999999.json").unlink()
    (v / "index" / "w000001.json").write_text("{}")  # not a canonical name (§14.1): no index
    code, _, err = _cli(capsys, "recommit", str(v))
    assert code == 1 and "1 file(s) no writer index lists (index/w000001.json)" in err, err
    (v / "index" / "w000001.json").unlink()  # what the message says to do with a stray file
    assert _cli(capsys, "recommit", str(v))[0] == 0


def test_an_index_under_a_non_canonical_name_stands_in_for_no_writer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """mutation audit 22 A-49: only ``index/wNNNNN.json`` is writer N's index (§14.1): writer
    1's index lost and its bytes under ``index/w000001.json`` still leave writer 1 without an
    index, named as such, and nothing is published."""
    v = _version(tmp_path / "root")
    (v / "manifest.json").unlink()
    (v / "index" / "w00001.json").rename(v / "index" / "w000001.json")
    code, _, err = _cli(capsys, "recommit", str(v))
    assert code == 1 and "[PCK-WRITER-MISSING]" in err, err
    assert "have no index as a regular file here (writers [1]: index/w00001.json" in err, err
    assert not (v / "manifest.json").exists()


def test_a_recorded_copy_holds_the_record_to_put_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On-call review 4, R4: recommit threw away the original record when a copy recorded right
    there held it; the copies then disagreed with the root (PCK-COMMIT-CONFLICT at every
    nightly copy)."""
    v = _version(tmp_path / "root")
    backup = tmp_path / "backup"
    assert _cli(capsys, "copy", str(v), str(backup))[0] == 0
    (v / "manifest.json").unlink()
    code, _, err = _cli(capsys, "recommit", str(v))
    assert code == 1 and f"a copy is recorded at {backup} (verified when made, not since)" in err, err
    assert f"cp {backup / v.name}/manifest.json" in err and "--copies-lost" in err
    code, out, _ = _cli(capsys, "recommit", str(v), "--copies-lost", "--json")
    doc = json.loads(out)
    assert code == 0 and (doc["writers"], doc["tensors"], doc["entries"]) == (2, 1, 1), doc


def test_another_version_of_the_step_is_not_undone_silently(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On-call review 4, R6: a recommitted record is dated now, after a newer branch's version
    of the same step, and the next restart switched back to the old branch without a word."""
    root = tmp_path / "root"
    v = _version(root)
    _version(root)  # the job trained step 5 again
    (v / "manifest.json").unlink()
    code, _, err = _cli(capsys, "recommit", str(v))
    assert code == 1 and "also holds step 5" in err and "--newest-of-step" in err, err
    assert _cli(capsys, "recommit", str(v), "--newest-of-step")[0] == 0
    assert portable_ckpt.list_versions(root)[-1].id == v.name  # what the flag said


def test_an_attempt_nothing_shows_was_committed_needs_the_operators_word(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    v = _version(tmp_path / "root")
    (v / "manifest.json").unlink()
    for rec in (v / "verifications").iterdir():
        rec.unlink()
    [info] = portable_ckpt.list_versions(tmp_path / "root")
    assert info.status == "incomplete"  # a save that may never have finished
    code, _, err = _cli(capsys, "recommit", str(v))
    assert code == 1 and "--was-committed" in err and not (v / "manifest.json").exists()
    assert _cli(capsys, "recommit", str(v), "--was-committed")[0] == 0
    assert portable_ckpt.list_versions(tmp_path / "root")[0].status == "committed"


def test_damage_found_by_the_checks_of_a_commit_publishes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    v = _version(tmp_path / "root")
    (v / "manifest.json").unlink()
    data = sorted((v / "data").iterdir())[0]
    data.write_bytes(data.read_bytes()[:-10])  # a truncated shard
    code, _, err = _cli(capsys, "recommit", str(v))
    assert code == 1 and not (v / "manifest.json").exists(), err


def test_recommit_names_a_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _version(tmp_path / "root")
    code, _, err = _cli(capsys, "recommit", str(tmp_path / "root"))
    assert code == 2 and "ROOT/ID" in err


def test_a_root_or_attempt_that_does_not_exist_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    v = _version(tmp_path / "root")
    code, _, err = _cli(capsys, "recommit", str(tmp_path / "nowhere" / v.name))
    assert code == 1 and "[PCK-NOT-FOUND]" in err and "does not exist" in err, err
    other = v.name.replace("s000000000005", "s000000000009")
    code, _, err = _cli(capsys, "recommit", str(tmp_path / "root" / other))
    assert code == 1 and f"[PCK-NOT-FOUND] {other}: no such attempt" in err, err


def test_a_copy_onto_a_version_whose_record_was_lost_deletes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On-call review 4, R3: `copy BACKUP/ID ROOT` onto a version whose manifest was lost took
    its intact files for leftovers of an interrupted copy and deleted them first; with the
    backup's copy damaged, both copies were lost. The copy refuses and says how to put the
    record back."""
    v = _version(tmp_path / "root")
    backup = tmp_path / "backup"
    assert _cli(capsys, "copy", str(v), str(backup))[0] == 0
    (v / "manifest.json").unlink()
    before = sorted(p.relative_to(v) for p in v.rglob("*") if p.is_file())
    for force in ([], ["--force"]):
        code, _, err = _cli(capsys, "copy", str(backup / v.name), str(tmp_path / "root"), *force)
        assert code == 1 and "commit record was lost" in err and "nothing was deleted" in err
    assert sorted(p.relative_to(v) for p in v.rglob("*") if p.is_file()) == before
    assert f"cp {backup / v.name}/manifest.json {v}/manifest.json" in err, err


def test_gc_reports_its_own_deletion_of_a_version_whose_record_was_lost(
    tmp_path: Path,
) -> None:
    """On-call review 4, R5 (side bug): `gc --delete-invalid` reported the lost-record version
    it deleted itself as deleted by another process, and the cron log showed no deletion."""
    from portable_ckpt.io.gc import gc

    root = tmp_path / "root"
    v = _version(root)
    _version(root, step=6)
    (v / "manifest.json").unlink()
    report = gc(root, keep=1, grace_seconds=0, delete_invalid=True)
    assert v.name in report.abandoned and v.name not in report.gone and not v.exists(), report


def test_the_summary_counts_writers_in_a_tensor_table_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On-call review 5, Q3: a tensor-table version lists its tables under index/ too; the
    summary counted them as writers (4 for a 2-writer job), the number the runbook says to
    check."""
    root = tmp_path / "root"
    storage = open_storage(root, create=True)
    attempt = new_attempt_id(3)
    ws = [ShardWriter(storage, attempt, i, tensor_table=True) for i in range(2)]
    for i in range(2):
        ws[i].add_tensor("w", W[i * 20:(i + 1) * 20], offsets=(i * 20, 0), global_shape=W.shape)
    idx = [x.finish() for x in ws]
    commit(storage, attempt, step=3, indexes=idx, expected_writers=[0, 1],
           continuation=Continuation("exact", 2, None), tensor_table=True)
    assert len([p for p in (root / attempt / "index").iterdir()]) == 4  # indexes and tables
    write_verification_record(storage, attempt, ok=True, mode="sample", fraction=0.5, chunks=2)
    (root / attempt / "manifest.json").unlink()
    code, out, err = _cli(capsys, "recommit", str(root / attempt), "--json")
    assert code == 0, err
    assert json.loads(out)["writers"] == 2
    assert np.array_equal(portable_ckpt.open(root / attempt).read("w"), W)


def test_a_rebuilt_record_meets_the_original_in_a_copy_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On-call review 5, R4: after `--copies-lost`, a copy to the backup that holds the original
    failed with "different commit record" and nothing more."""
    v = _version(tmp_path / "root")
    backup = tmp_path / "backup"
    assert _cli(capsys, "copy", str(v), str(backup))[0] == 0
    (v / "manifest.json").unlink()
    assert _cli(capsys, "recommit", str(v), "--copies-lost")[0] == 0
    code, _, err = _cli(capsys, "copy", str(v), str(backup))
    assert code == 1 and "rebuilt by `portable-ckpt recommit`" in err, err
    assert f"cp {backup / v.name}/manifest.json {v}/manifest.json" in err, err


def test_a_lost_writers_files_that_do_not_name_it_are_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Final review 20, 2: writer 1 wrote a global entry (``….g.json``, named by no writer);
    its index lost, recommit published a record without the entry, on one rank, and
    `verify --deep` passed. A file no surviving index lists is a lost writer's."""
    root = tmp_path / "root"
    storage = open_storage(root, create=True)
    attempt = new_attempt_id(4)
    ws = [ShardWriter(storage, attempt, i) for i in range(2)]
    ws[0].add_tensor("w", W, offsets=(0, 0), global_shape=W.shape)
    ws[1].add_entry("cfg", {"lr": 0.1}, scope="global")
    idx = [x.finish() for x in ws]
    commit(storage, attempt, step=4, indexes=idx, expected_writers=[0, 1],
           continuation=Continuation("exact", 2, None))
    write_verification_record(storage, attempt, ok=True, mode="sample", fraction=0.5, chunks=1)
    v = root / attempt
    (v / "manifest.json").unlink()
    (v / "index" / "w00001.json").unlink()
    code, _, err = _cli(capsys, "recommit", str(v))
    assert code == 1 and "no writer index lists (entries/" in err, err
    assert not (v / "manifest.json").exists()


def test_one_writer_with_values_for_many_ranks_is_no_missing_writer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Final review 20, 3: a per-rank entry's ``rNNNNN`` is a rank: one writer that saved the
    values of 4 ranks was refused as "writers [1, 2, 3] have no index"."""
    root = tmp_path / "root"
    storage = open_storage(root, create=True)
    attempt = new_attempt_id(4)
    w = ShardWriter(storage, attempt, 0)
    w.add_tensor("w", W, offsets=(0, 0), global_shape=W.shape)
    for r in range(4):
        w.add_entry("rng", {"seed": r}, scope="per_rank", rank=r,
                    world_size_policy="require_same")
    commit(storage, attempt, step=4, indexes=[w.finish()], expected_writers=[0],
           continuation=Continuation("exact", 4, None))
    write_verification_record(storage, attempt, ok=True, mode="sample", fraction=0.5, chunks=1)
    (root / attempt / "manifest.json").unlink()
    code, out, err = _cli(capsys, "recommit", str(root / attempt), "--json")
    assert code == 0, err
    assert json.loads(out)["continuation"]["world_size"] == 4


def test_a_rollback_branch_is_not_undone_by_a_rebuilt_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Final review 20, 1: the first run's step 5, abandoned by a rollback that went on from
    step 3, rebuilt and dated now, made the new branch's step 4 look abandoned: `gc --keep 1`
    deleted it."""
    import time as _time

    root = tmp_path / "root"
    old5 = _version(root, step=5)
    _time.sleep(0.01)
    _version(root, step=4)  # the rollback's branch, committed after step 5 began
    (old5 / "manifest.json").unlink()
    code, _, err = _cli(capsys, "recommit", str(old5))
    assert code == 1 and "a rollback's branch" in err and "--newest-of-step" in err, err


def test_a_copy_that_cannot_tell_what_the_destination_holds_deletes_nothing(
    tmp_path: Path,
) -> None:
    """Final review 20, 5: one failed listing made the destination's lost-record version
    'unreadable', not 'invalid', and the copy cleared it as leftovers. Only an attempt
    positively classified as a copy's leftovers is cleared."""
    import os
    import time

    from portable_ckpt.errors import CheckpointError, StorageError
    from portable_ckpt.io.copy import copy_version
    from portable_ckpt.storage.local import LocalStorage

    v = _version(tmp_path / "root")
    backup = tmp_path / "backup"
    copy_version(v, backup)
    (v / "manifest.json").unlink()
    old = time.time() - 3600  # older than a copy's grace period: "leftovers"
    for p in v.rglob("*"):
        os.utime(p, (old, old))
    before = sorted(p.relative_to(v) for p in v.rglob("*") if p.is_file())
    calls = {"n": 0}

    class OneFailedListing(LocalStorage):
        def list_dirs(self, prefix: str = "") -> list[str]:
            if prefix == f"{v.name}/":
                calls["n"] += 1
                if calls["n"] == 2:  # the classification's (EIO once)
                    raise StorageError(f"{prefix}: injected EIO", retryable=True)
            return super().list_dirs(prefix)

    with pytest.raises(CheckpointError):
        copy_version(backup / v.name, OneFailedListing(str(tmp_path / "root")))
    assert calls["n"] >= 2
    assert sorted(p.relative_to(v) for p in v.rglob("*") if p.is_file()) == before


def test_files_deleted_while_the_record_is_published_take_the_record_away_again(
    tmp_path: Path,
) -> None:
    """On-call review 4, R5 and review 5, R5: a gc or a job's retention that deletes the
    attempt while recommit publishes its record left a record over nothing, which `ls --latest`
    named. The record is removed again and the error names the files that went. Test audit
    21b, RC05: that check could go with the suite green (no test deleted files in the race)."""
    from portable_ckpt.errors import CommitConflictError
    from portable_ckpt.io.recommit import recommit
    from portable_ckpt.storage.faults import Fault, FaultyStorage

    v = _version(tmp_path / "root")
    (v / "manifest.json").unlink()
    [shard] = (v / "data").glob("w00001-*")

    def gc_deletes(op: str, path: str) -> None:
        shard.unlink()

    storage = FaultyStorage(open_storage(tmp_path / "root"), [Fault(
        op="create", path="*/manifest.json", error=None, times=1, callback=gc_deletes)])
    with pytest.raises(CommitConflictError, match=f"1 of the files its new commit record names "
                       f"went while it was published \\(data/{shard.name}, "):
        recommit(storage, v.name)
    assert storage.faults[0].fired == 1
    assert not (v / "manifest.json").exists()  # removed again: no record over missing files
    [info] = portable_ckpt.list_versions(tmp_path / "root")
    assert info.status == "invalid"


def test_a_record_put_back_while_files_went_is_not_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mutation audit 22 A-45: when files went while recommit published its record, it removes
    the record again only if it is still its own: a copy's record put back meanwhile stays
    (final review 20, 6)."""
    import portable_ckpt.io.commit as commit_mod
    from portable_ckpt.errors import CommitConflictError
    from portable_ckpt.io.recommit import recommit

    v = _version(tmp_path / "root")
    copys = (v / "manifest.json").read_bytes()  # the record a copy holds, byte-identical
    (v / "manifest.json").unlink()
    [shard] = (v / "data").glob("w00001-*")
    real_commit = commit_mod.commit

    def commit_then_race(*args: object, **kwargs: object) -> object:
        m = real_commit(*args, **kwargs)  # the real publication, then the race around it:
        shard.unlink()  # a gc deletes a file ...
        (v / "manifest.json").write_bytes(copys)  # ... and an operator puts the copy's back
        return m

    monkeypatch.setattr(commit_mod, "commit", commit_then_race)
    with pytest.raises(CommitConflictError, match="went while it was published"):
        recommit(open_storage(tmp_path / "root"), v.name)
    assert (v / "manifest.json").read_bytes() == copys  # not this run's record: it stays
