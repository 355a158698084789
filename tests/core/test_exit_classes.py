"""What the CLI's exit status tells a cron job: 0 done, 1 a person must look, 75 retry, 69 `ls
--latest` cannot answer (SRE review of the exit classes, backend-author review)."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.cli.main import main as cli_main
from portable_ckpt.errors import VersionDeletedError
from portable_ckpt.io.copy import copy_version
from portable_ckpt.storage import LocalStorage, register_scheme
from portable_ckpt.storage.faults import Fault, FaultyStorage
from tests._cli import unprivileged_cli

_SEQ = iter(range(10**6))


def _save(root: Path, *steps: int) -> list[str]:
    return [portable_ckpt.save_arrays(root, {"w": np.arange(16.0)}, step=s).attempt_id
            for s in steps]


class _Remote(FaultyStorage):
    """A local directory seen as a store without a local root (a registered scheme's)."""

    def local_root(self) -> str | None:
        return None


def _scheme(faults: list[Fault] | None = None, **caps: Any) -> str:
    """A fresh URL scheme opening :class:`_Remote` over the directory after ``scheme://``.

    Every opened store injects ``faults`` as the list holds them when it is opened.
    """
    name = f"remote{os.getpid()}x{next(_SEQ)}"
    shared = faults if faults is not None else []

    def opener(url: str) -> _Remote:
        store = _Remote(LocalStorage(url.split("://", 1)[1], create=True), list(shared))
        store.url = url
        if caps:
            store.capabilities = dataclasses.replace(store.capabilities, **caps)
        return store

    register_scheme(name, opener)
    return name


def test_a_permission_on_the_newest_record_is_1_and_ls_latest_69(tmp_path: Path) -> None:
    """SRE review S1, S2: a permission error on the newest commit record, wrapped in a new
    StorageError on the way, lost its class and exited 75 ("retry") from verify, copy and
    inspect given a root; `ls --latest` said 75 for it too, and a restart wrapper retried for
    ever. A permission needs a person: 1, and 69 from `ls --latest` (never 1, "none")."""
    root = tmp_path / "r"
    newest = _save(root, 1, 2)[-1]
    record = root / newest / "manifest.json"
    os.chmod(record, 0)
    try:
        runs = {what: unprivileged_cli(*args) for what, args in {
            "verify": ("verify", str(root), "--sample", "1", "--no-record"),
            "copy": ("copy", str(root), str(tmp_path / "backup")),
            "inspect": ("inspect", str(root)),
            "latest": ("ls", str(root), "--latest", "--json"),
        }.items()}
    finally:
        os.chmod(record, 0o644)
    for what in ("verify", "copy", "inspect"):
        assert runs[what].returncode == 1, (what, runs[what].stdout, runs[what].stderr)
        assert "ermission denied" in runs[what].stdout + runs[what].stderr
    latest = runs["latest"]
    assert latest.returncode == 69, (latest.stdout, latest.stderr)
    assert json.loads(latest.stdout)["error"]["retryable"] is False


def test_ls_latest_is_never_1_when_it_cannot_answer(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """SRE review S2, S9: `ls --latest` exits 1 for "no version" only. An attempt it cannot
    read is 75 when the cause may pass (EIO); a root whose committed versions all failed
    verification is 69 (a manager refuses to start afresh over them too), naming them, where
    it said "no committed version", and a restart wrapper started the job from step 0."""
    root = tmp_path / "r"
    first, newest = _save(root, 1, 2)
    scheme = _scheme([Fault(op="read", path=f"{newest}/manifest.json", error="EIO")])
    assert cli_main(["ls", f"{scheme}://{root}", "--latest", "--json"]) == 75
    assert json.loads(capsys.readouterr().out)["error"]["retryable"] is True
    from portable_ckpt.io.annotations import write_verification_record

    for attempt in (first, newest):
        write_verification_record(LocalStorage(str(root)), attempt, ok=False, mode="deep",
                                  fraction=None, chunks=1, verifier="test",
                                  errors=[{"code": "PCK-CHECKSUM", "message": "x"}])
    assert cli_main(["ls", str(root), "--latest", "--json"]) == 69
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert doc["error"]["failed_verification"] == [newest, first], doc
    assert "failed verification" in out.err and "start afresh" in out.err
    assert cli_main(["ls", str(tmp_path / "empty"), "--latest"]) == 1  # none: start afresh
    assert "PCK-NOT-FOUND" in capsys.readouterr().err


def test_gc_that_left_files_of_a_deleted_version_is_75(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """SRE review S5: an EIO while gc deleted a version's data files, after its commit record
    (the version is gone, its files are left for the next gc), exited 1 and paged someone."""
    root = tmp_path / "r"
    _save(root, 1, 2, 3)
    scheme = _scheme([Fault(op="delete", path="*/data/*", error="EIO")])
    assert cli_main(["gc", f"{scheme}://{root}", "--keep", "1", "--json"]) == 75
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["left_behind"]) == 2 and all(d["retryable"] for d in doc["left_behind"])
    assert cli_main(["gc", str(root), "--keep", "1", "--grace", "0"]) == 0  # the next deletes them
    assert len(list(root.iterdir())) == 1


@pytest.mark.parametrize(("error", "code"), [("EIO", 75), ("EACCES", 1)])
def test_copy_whose_record_could_not_be_written_is_75_when_it_may_pass_else_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], error: str, code: int
) -> None:
    """Mutation audit B C07/C08 (mut-18, mut-19): the copy is made but its record in the
    source cannot be written: never exit 0 (``ls`` and ``gc --require-copy`` see no copy), and
    75 when the cause may pass by itself (the source store's EIO), 1 when a person must act
    (EACCES) (multi-job review F4, scripting review F6)."""
    root, backup = tmp_path / "r", tmp_path / "b"
    [aid] = _save(root, 1)
    scheme = _scheme([Fault(op="create", path="*/copies/*", error=error)])
    capsys.readouterr()
    assert cli_main(["copy", f"{scheme}://{root}", str(backup), "-q"]) == code
    err = capsys.readouterr().err
    assert "the copy is made, but its record was not written" in err, err
    if code == 75:
        assert "run the copy again to record it" in err
    else:  # waiting cannot mend it: what the missing record means (fault review 27, F9)
        assert "`gc --require-copy` does not count this copy" in err, err
    assert (backup / aid / "manifest.json").exists()
    assert [v.copies for v in portable_ckpt.list_versions(root)] == [[]]


def test_gc_require_copy_when_the_backup_did_not_answer_is_75(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SRE review S6: `gc --require-copy` exited 1, "copies are missing ... make a copy
    elsewhere", when the backup store only failed to answer (EIO there): retry, 75."""
    root, backup = tmp_path / "r", tmp_path / "b"
    ids = _save(root, 1, 2, 3)
    faults: list[Fault] = []
    scheme = _scheme(faults)
    assert copy_version(str(root / ids[-1]), f"{scheme}://{backup}").record is not None
    faults.append(Fault(op="exists", path="*", error="EIO"))  # the backup stops answering
    capsys.readouterr()
    assert cli_main(["gc", str(root), "--keep", "1", "--require-copy"]) == 75
    err = capsys.readouterr().err
    assert "kept for want of a verified copy" in err and "did not answer" in err
    assert len(portable_ckpt.list_versions(root)) == 3


def test_the_same_root_under_another_name_is_no_copy(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Backend review B2: a registered scheme's root spelt another way (``x:///w/./q``) was
    an independent copy: `copy` said "already present", wrote a copy record, and `gc
    --require-copy` then deleted the older versions. A probe put into the destination that
    shows in the source refuses the copy; gc counts no copy there."""
    root = tmp_path / "q"
    ids = _save(root, 1, 2, 3)
    scheme = _scheme()
    src, alias = f"{scheme}://{root}", f"{scheme}://{tmp_path}/./q"
    assert cli_main(["copy", src, alias]) == 2
    assert "same root" in capsys.readouterr().err
    # A copy record written by an older version of the tool names the alias: no copy.
    from portable_ckpt.io.copy import CopyResult, _write_record

    _write_record(LocalStorage(str(root)), ids[-1], alias, CopyResult(
        attempt_id=ids[-1], step=3, source=f"{root}/{ids[-1]}", destination=alias,
        destination_version=f"{alias}/{ids[-1]}"))
    assert cli_main(["gc", src, "--keep", "1", "--require-copy", alias]) == 1
    assert "names the collected root" in capsys.readouterr().err
    assert len(portable_ckpt.list_versions(root)) == 3
    assert not [p for p in root.iterdir() if p.name.startswith(".pck-clock-")]  # no probe left


def test_copy_into_a_store_without_atomic_create_is_refused(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    """Backend review B4: a save's commit refuses a store whose create-if-absent is not
    atomic; `copy` published into it anyway. Refused before anything is copied, exit 1 (a
    setting of the store: no retry mends it)."""
    root = tmp_path / "r"
    _save(root, 1)
    scheme = _scheme(atomic_create=False)
    assert cli_main(["copy", str(root), f"{scheme}://{tmp_path}/b", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"]["retryable"] is False and "atomically" in doc["error"]["message"]
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())


def test_a_version_deleted_while_copied_is_not_damage(tmp_path: Path) -> None:
    """SRE review S8: gc deleting the source version during a copy made the copy fail with
    PCK-FILE-MISSING, the code of a damaged version."""
    root = tmp_path / "r"
    ids = _save(root, 1, 2)
    gone = threading.Event()

    def delete_version(op: str, path: str) -> None:
        if not gone.is_set():
            gone.set()
            (root / ids[-1] / "manifest.json").unlink()
            for f in (root / ids[-1] / "data").iterdir():
                f.unlink()

    scheme = _scheme([Fault(op="read", path=f"{ids[-1]}/data/*", error=None,
                            callback=delete_version)])
    with pytest.raises(VersionDeletedError, match="deleted while it was read"):
        copy_version(f"{scheme}://{root}/{ids[-1]}", str(tmp_path / "b"))


def test_an_error_of_another_package_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Backend review B6: a backend's raw client exception was "a bug of portable-ckpt",
    which sent its user to the wrong project."""
    import argparse
    import sys

    (tmp_path / "fakeclient.py").write_text(
        "class ClientError(Exception):\n    pass\n\n"
        "def call():\n    raise ClientError('SlowDown: please reduce your request rate')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import fakeclient  # type: ignore[import-not-found]

    from portable_ckpt.cli.main import _run

    assert _run(argparse.Namespace(func=lambda args: fakeclient.call(), json=False)) == 1
    err = capsys.readouterr().err
    assert "error in fakeclient (ClientError: SlowDown" in err and "bug of portable-ckpt" not in err
    sys.modules.pop("fakeclient", None)
    # Raised by portable-ckpt itself (here the standard library it called): still its bug.
    import functools

    assert _run(argparse.Namespace(func=functools.partial(os.path.join, 1, 2), json=False)) == 1
    assert "internal error (TypeError" in capsys.readouterr().err


def test_a_root_that_cannot_be_searched_is_not_none(tmp_path: Path) -> None:
    """Diff review 8, D1: a root whose parent cannot be searched (a permission, a stale NFS
    handle) "did not exist": `ls --latest` exited 1, and a restart script started afresh (as
    for a file given as the root)."""
    parent = tmp_path / "p"
    _save(parent / "r", 1)
    os.chmod(parent, 0)
    try:
        latest = unprivileged_cli("ls", str(parent / "r"), "--latest")
        listing = unprivileged_cli("ls", str(parent / "r"))
    finally:
        os.chmod(parent, 0o755)
    assert latest.returncode == 69 and "ermission denied" in latest.stderr, latest.stderr
    assert listing.returncode == 1 and "does not exist" not in listing.stderr, listing.stderr
    # A file where the root should be is no fresh root either.
    (tmp_path / "file").write_text("x")
    assert cli_main(["ls", str(tmp_path / "file"), "--latest"]) == 69


def test_a_probe_left_behind_is_not_a_foreign_entry(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Diff review 8, D3: a store that refuses deletes kept copy's same-root probes, and `ls`
    listed them as entries "not this format's" (spec §15.2: readers ignore them)."""
    root = tmp_path / "r"
    _save(root, 1)
    (root / ".pck-clock-0123456789abcdef").write_bytes(b"")
    (root / "notes.txt").write_text("mine")
    assert cli_main(["ls", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["foreign_keys"] == ["notes.txt"]


def test_a_version_that_lost_its_commit_record_is_kept_not_abandoned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Disaster-recovery review R1: a committed version whose manifest.json alone was lost was
    an incomplete attempt, and gc deleted it once the grace period passed, though its data
    was intact. Its verification record (written into committed versions only) says it was
    committed: it is invalid, kept and named (spec §15.1, R-GC-10)."""
    root = tmp_path / "r"
    older, newest = _save(root, 1, 2)
    assert cli_main(["verify", str(root / newest), "--deep"]) == 0  # records a verification
    (root / newest / "manifest.json").unlink()
    row = {v.id: v for v in portable_ckpt.list_versions(root)}[newest]
    assert row.status == "invalid" and row.error_code == "PCK-MANIFEST-MISSING"
    capsys.readouterr()
    assert cli_main(["gc", str(root), "--keep", "1", "--grace", "0", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [d["id"] for d in doc["damaged"]] == [newest] and doc["abandoned"] == []
    assert (root / newest / "data").is_dir()
    # A save in progress (no record, no post-commit records) is still incomplete.
    (root / older / "manifest.json").unlink()
    assert {v.id: v.status for v in portable_ckpt.list_versions(root)}[older] == "incomplete"


def test_copying_back_over_a_damaged_version_says_which_copy_is_damaged(tmp_path: Path) -> None:
    """Incident review R3: copying the good backup back over a damaged version was refused
    with a path both roots hold and "restore it from a copy", as if the backup were damaged.
    The message names the destination's copy and the procedure of docs/recovery.md, which
    then works."""
    import shutil

    from portable_ckpt.errors import ChecksumError

    root, backup = tmp_path / "r", tmp_path / "b"
    (attempt,) = _save(root, 1)
    copy_version(str(root / attempt), str(backup))
    data = next((root / attempt / "data").iterdir())
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF
    data.write_bytes(raw)
    with pytest.raises(ChecksumError, match=r"destination .* already holds .* damaged") as ei:
        copy_version(str(backup / attempt), str(root))
    assert "source was not found damaged" in ei.value.message
    assert f"move {root}/{attempt} elsewhere" in ei.value.message
    shutil.move(str(root / attempt), str(tmp_path / "aside"))
    copy_version(str(backup / attempt), str(root))
    assert portable_ckpt.open(root).verify(deep=True) == []


class _RawDeletes(_Remote):
    """A backend whose deletes raise its client's raw OSError (no StorageError)."""

    def delete(self, path: str) -> bool | None:
        raise OSError(errno.EIO, "the store answered an I/O error")


def test_a_backends_raw_oserror_in_gc_names_the_backend_not_a_save(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Backend review 27, L6: a backend's raw OSError with a resource errno reached the CLI as
    "nothing it was writing was published" (wrong for gc, which deletes) without naming the
    package that raised it. Now: which package, that a backend raises StorageError, and that
    the command stopped where it was. Exit 75 (the errno may pass)."""
    root = tmp_path / "r"
    _save(root, 1, 2, 3)
    name = f"rawdel{os.getpid()}"
    register_scheme(name, lambda url: _RawDeletes(LocalStorage(url.split("://", 1)[1]), []))
    rc = cli_main(["gc", f"{name}://{root}", "--keep", "1", "--grace", "0"])
    err = capsys.readouterr().err
    assert rc in (1, 75), err
    assert "Traceback" not in err
    assert "raised in tests" in err and "StorageError" in err, err
    assert "nothing it was writing was published" not in err


def test_a_copy_record_names_a_registered_schemes_root_by_its_backends_url(
    tmp_path: Path,
) -> None:
    """docs/storage-backends.md: copy records compare roots by the backend's ``url``, one
    spelling per root. A registered scheme's destination was recorded as typed
    (``scheme:///x/./back``: backend review 27, L10); now by the backend's url, which
    ``gc --require-copy`` given the other spelling counts."""
    root = tmp_path / "r"
    _save(root, 1, 2)
    name = f"tidy{os.getpid()}"

    def opener(url: str) -> _Remote:
        path = os.path.normpath(url.split("://", 1)[1])
        store = _Remote(LocalStorage(path, create=True), [])
        store.url = f"{name}://{path}"
        return store

    register_scheme(name, opener)
    typed = f"{name}://{tmp_path}/./back"
    assert cli_main(["copy", str(root), typed, "--json"]) == 0
    [record] = list((root).glob("*/copies/*.json"))
    assert json.loads(record.read_text())["destination"] == f"{name}://{tmp_path}/back"
    assert cli_main(["gc", str(root), "--keep", "1", "--require-copy", f"{name}://{tmp_path}/back",
                     "--dry-run", "--json"]) == 0


def test_gc_says_when_a_deleted_versions_directory_cannot_be_removed(tmp_path: Path) -> None:
    """Fault review 27, F8: in a root the process may not write (another user's), gc deleted
    each version's files, could not remove its directory, and said "deleted", exit 0; ``ls``
    then listed the empty directories as ``incomplete`` and later runs kept them in grace.
    Now each is named as left behind (its directory could not be removed), exit 1 (a person
    must act)."""
    from tests._cli import unprivileged_cli

    root = tmp_path / "r"
    ids = _save(root, 1, 2, 3)
    os.chmod(root, 0o555)
    try:
        run = unprivileged_cli("gc", str(root), "--keep", "1", "--json")
    finally:
        os.chmod(root, 0o755)
    assert run.returncode == 1, (run.stdout, run.stderr)
    doc = json.loads(run.stdout)
    assert sorted(d["id"] for d in doc["left_behind"]) == ids[:2], doc
    assert all("the directory could not be removed" in d["message"] and not d["retryable"]
               for d in doc["left_behind"])
    assert sorted(p.name for p in root.iterdir()) == ids  # the directories, emptied
    assert not any(p.is_file() for i in ids[:2] for p in (root / i).rglob("*"))
