"""Mutation audit 24, conformance/committer.py: the refusal checks that need no trace.

Without strace (``--tracing auto`` on a machine without it, or macOS) the committer cases still
hold a committer to R-COMMIT-4 (no ``manifest.json`` left by a refusal) and R-COMMIT-9 (an
existing ``manifest.json`` left as it was: bytes, inode, modification time). Each committer
below is the minimal writer with one such defect, run untraced as a real process.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conformance.committer import (
    REFUSALS,
    run_commit_same_step,
    run_commit_twice,
    run_refusal,
    run_valid_commit,
    run_wide_commit,
)
from conformance.harness import run_save_case
from conformance.procs import Adapter
from conformance.verify import HarnessFailure

from .conftest import BAD_WRITER, REPO, explicit_case, needs_tracing

REFUSAL = {r.name: r for r in REFUSALS}

#: the minimal writer with a defect chosen by PCK_MUT24_MODE
ADAPTER = '''
import importlib.util, json, os, shutil, sys, time
from pathlib import Path
spec = importlib.util.spec_from_file_location("minimal_writer", MINIMAL)
mw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mw)
MODE = os.environ["PCK_MUT24_MODE"]
orig_commit, orig_publish = mw.do_commit, mw.publish

def check_after_publish(job):
    """Publishes first, checks after: a refusal that leaves its manifest.json behind."""
    checks = mw.check_coverage, mw.check_entries, mw.check_files
    mw.check_coverage = mw.check_entries = mw.check_files = lambda *a: None
    try:
        orig_commit(job)
    finally:
        mw.check_coverage, mw.check_entries, mw.check_files = checks
    mw.publish = lambda *a: None
    orig_commit(job)  # the checks now raise the code of the broken rule

def publish(adir, data, fail_at):
    """Before its link() fails, rewrites an existing manifest.json with the same bytes."""
    m = adir / "manifest.json"
    if m.exists():
        old = m.read_bytes()
        time.sleep(0.01)
        if MODE == "rewrite-same":  # same bytes, same inode, a new mtime
            m.write_bytes(old)
        elif MODE == "replace-same":  # same bytes, same mtime, a new inode
            tmp = adir / "manifest.json.copy"
            shutil.copy2(m, tmp)
            os.replace(tmp, m)
    orig_publish(adir, data, fail_at)

def records_writers(adir, data, fail_at):
    """Checks per-rank entries against the job's world size, records the number of writers."""
    doc = json.loads(data)
    doc["continuation"]["world_size"] = len(list((adir / "index").glob("w*.json")))
    orig_publish(adir, mw.dumps(doc), fail_at)

orig_merge, orig_epoch = mw.merge_indexes, mw._epoch_us

def per_writer_coverage(job, adir):
    """Refuses an index that declares a non-empty tensor without storing any of it (§14.1)."""
    for p in sorted((adir / "index").glob("w*.json")):
        for key, t in json.loads(p.read_bytes())["tensors"].items():
            if not t["ranges"] and all(t["shape"]):
                raise mw.Fail("PCK-COVERAGE-GAP", f"{p.name} stores none of {key}")
    return orig_merge(job, adir)

def empty_declared_once(job, adir):
    """Takes a zero-size tensor declared by two writers for a metadata conflict."""
    seen = set()
    for p in sorted((adir / "index").glob("w*.json")):
        for key, t in json.loads(p.read_bytes())["tensors"].items():
            if not all(t["shape"]):
                if key in seen:
                    raise mw.Fail("PCK-METADATA-CONFLICT", f"{key} declared twice")
                seen.add(key)
    return orig_merge(job, adir)

if MODE == "check-after-publish":
    mw.do_commit = check_after_publish
elif MODE == "empty-declared-once":
    mw.merge_indexes = empty_declared_once
elif MODE == "per-writer-coverage":
    mw.merge_indexes = per_writer_coverage
elif MODE == "no-plus-one":  # R-COMMIT-16 without its microsecond: the newest stamp, tied
    mw._epoch_us = lambda stamp: None if orig_epoch(stamp) is None else orig_epoch(stamp) - 1
elif MODE == "records-writers":
    mw.publish = records_writers
else:
    mw.publish = publish
sys.exit(mw.main(sys.argv))
'''


@pytest.fixture
def committer(tmp_path: Path) -> Adapter:
    script = tmp_path / "committer.py"
    minimal = REPO / "conformance" / "examples" / "minimal_writer.py"
    script.write_text(ADAPTER.replace("MINIMAL", repr(str(minimal))))
    return Adapter([sys.executable, str(script)], timeout=60, trace=False)


def test_a_refusal_that_leaves_a_manifest_fails(committer: Adapter, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Right exit status, right code, but the attempt was published before the checks ran."""
    monkeypatch.setenv("PCK_MUT24_MODE", "check-after-publish")
    with pytest.raises(HarnessFailure, match=r"left a manifest\.json"):
        run_refusal(committer, REFUSAL["coverage-gap"], tmp_path / "w")


@pytest.mark.parametrize("mode", ["rewrite-same", "replace-same"])
def test_an_existing_manifest_rewritten_unchanged_fails(mode: str, committer: Adapter,
                                                        tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """R-COMMIT-9: rewritten in place (new mtime) or replaced by a copy (new inode), same bytes,
    then PCK-COMMIT-CONFLICT: untraced, the stat comparison is all that catches it."""
    monkeypatch.setenv("PCK_MUT24_MODE", mode)
    with pytest.raises(HarnessFailure, match=r"modified or replaced \(R-COMMIT-9\)"):
        run_refusal(committer, REFUSAL["manifest-exists"], tmp_path / "w")


def test_a_second_commit_that_rewrites_the_manifest_fails(committer: Adapter, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit-twice case holds the committer's own manifest to R-COMMIT-9 as well."""
    monkeypatch.setenv("PCK_MUT24_MODE", "rewrite-same")
    with pytest.raises(HarnessFailure, match=r"modified or replaced \(R-COMMIT-9\)"):
        run_commit_twice(committer, tmp_path / "w")


@pytest.mark.parametrize("mode", ["check-after-publish", "rewrite-same"])
def test_the_defective_committers_pass_what_they_get_right(mode: str, committer: Adapter,
                                                           tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The same committers pass the refusals they get right (no false alarm)."""
    monkeypatch.setenv("PCK_MUT24_MODE", mode)
    run_refusal(committer, REFUSAL["manifest-exists" if mode == "check-after-publish"
                                   else "coverage-gap"], tmp_path / "w")


def test_the_wide_commit_checks_the_recorded_world_size(committer: Adapter, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """R-COMMIT-5: a committer that checks rng against the job's 3 ranks but records its 2
    writers as the world size fails the committer case of a 3-rank job (the version it commits
    is verified, not only its exit status); with 2 ranks it commits what it should."""
    monkeypatch.setenv("PCK_MUT24_MODE", "records-writers")
    with pytest.raises(HarnessFailure, match=r"does not conform .*ranks \[2\] >= world_size 2"):
        run_wide_commit(committer, tmp_path / "wide")
    case, _, _ = run_valid_commit(committer, tmp_path / "plain")
    assert case.ranks() == 2


@pytest.mark.parametrize(("mode", "code"), [("per-writer-coverage", "PCK-COVERAGE-GAP"),
                                            ("empty-declared-once", "PCK-METADATA-CONFLICT")])
def test_a_committer_that_refuses_a_declaration_without_ranges_fails(
        mode: str, code: str, committer: Adapter, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """§14.1: a writer may declare a tensor it stores none of, and two writers may declare the
    same zero-size tensor. The valid committer case is the only one that hands the committer
    such indexes; a committer that refuses them fails there, though it saves every state of
    the save suite."""
    monkeypatch.setenv("PCK_MUT24_MODE", mode)
    with pytest.raises(HarnessFailure, match=f"refused a conforming attempt .*{code}"):
        run_valid_commit(committer, tmp_path / "valid")
    run_save_case(committer, explicit_case(), tmp_path / "save")


def test_a_second_version_tied_with_the_first_fails(committer: Adapter, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """R-COMMIT-16: one microsecond after every version of the step. A committed_at equal to the
    first version's leaves the two versions unordered: not after is a failure."""
    monkeypatch.setenv("PCK_MUT24_MODE", "no-plus-one")
    with pytest.raises(HarnessFailure, match=r"has committed_at '2099-01-01T00:00:00.000000Z', "
                                             r"not after"):
        run_commit_same_step(committer, tmp_path / "w")


@needs_tracing
def test_the_valid_commit_case_checks_the_committers_system_calls(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The committer case that asks for a tensor table is the one that always exercises
    R-COMMIT-17 (a drawn save asks for a table only sometimes): its trace is checked."""
    monkeypatch.setenv("PCK_BAD_MODE", "table-name-unsynced")
    traced = Adapter(BAD_WRITER, timeout=60, trace=True)
    with pytest.raises(HarnessFailure, match="R-COMMIT-17"):
        run_valid_commit(traced, tmp_path / "t", tables=True)


@needs_tracing
def test_a_workdir_behind_a_symbolic_link(tmp_path: Path) -> None:
    """The committer API used with a work directory reached through a symbolic link (macOS's
    /var/folders, a symlinked /tmp): a conforming committer passes the valid commit case (it
    failed: the root was handed over unresolved and its trace compared with the real path)."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    minimal = [sys.executable, str(REPO / "conformance" / "examples" / "minimal_writer.py")]
    run_valid_commit(Adapter(minimal, timeout=60, trace=True), tmp_path / "link" / "w")


@needs_tracing
def test_a_manifest_touched_behind_a_symbolic_link_still_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other side of the same bug: with the work directory behind a symbolic link, a
    committer that opens the existing manifest.json for writing (R-COMMIT-9) passed the
    ``manifest-exists`` refusal (its trace named the real path, the check the link's)."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.setenv("PCK_BAD_MODE", "touch-manifest")
    with pytest.raises(HarnessFailure):
        run_refusal(Adapter(BAD_WRITER, timeout=60, trace=True), REFUSAL["manifest-exists"],
                    tmp_path / "link" / "w")
