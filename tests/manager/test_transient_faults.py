"""A fault seen once is not damage (multi-job review F10, F12; attack review 2 F12).

A failed verification is kept for ever (R-DRILL-8): one bit flipped on its way (a flaky NIC, a
bad DIMM), one 404 of an inconsistent store or one EIO of a failover condemned an intact version,
and the restore resumed the step before it. A finding is now read again before it is recorded,
and a restore tries the same version once more before it falls back; a storage error that
persists stops the restore (R-ID-5) instead of resuming an older step.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.errors import ChecksumError, FileMissingError, StorageError
from portable_ckpt.io.damage import confirm_damage
from portable_ckpt.io.versions import list_versions
from portable_ckpt.storage.local import LocalStorage
from tests._corrupt import flip_read_buffer

torch = pytest.importorskip("torch")
pckt = pytest.importorskip("portable_ckpt.torch")

_READS = ("read_into", "read_into_many", "read_extents")


def _fault_once(monkeypatch: pytest.MonkeyPatch, kind: str, times: int = 1) -> list[int]:
    """The next ``times`` reads of a data file flip a bit in memory, or fail with EIO."""
    return _faults(monkeypatch, [kind] * times)


def _faults(monkeypatch: pytest.MonkeyPatch, kinds: list[str]) -> list[int]:
    """The next reads of a data file, one each of ``kinds`` in order: ``flip`` or ``eio``."""
    left = [len(kinds)]

    def kind() -> str:
        return kinds[len(kinds) - left[0]]

    for name in _READS:
        orig = getattr(LocalStorage, name)

        def wrapped(self: Any, path: str, *a: Any, _orig: Any = orig, **k: Any) -> Any:
            hit = left[0] > 0 and "/data/" in path
            if hit and kind() == "eio":
                left[0] -= 1
                raise StorageError(f"read {path!r}: Input/output error (errno 5)", path=path)
            out = _orig(self, path, *a, **k)
            if hit and flip_read_buffer(a[-1]):
                left[0] -= 1
            return out

        monkeypatch.setattr(LocalStorage, name, wrapped)
    return left


def _two_versions(root: Path) -> dict[str, Any]:
    state = {"w": torch.arange(4096.0), "rng": pckt.RNGState()}
    with pckt.CheckpointManager(root, save_every=1, async_save=False) as mgr:
        for step in (1, 2):
            state["w"] += 1
            mgr.maybe_save(step, state)
    return {"w": torch.zeros(4096), "rng": pckt.RNGState()}


@pytest.mark.parametrize("kind", ["flip", "eio"])
def test_a_restore_reads_a_version_again_before_it_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    root = tmp_path / "r"
    target = _two_versions(root)
    left = _fault_once(monkeypatch, kind)
    with pckt.CheckpointManager(root, save_every=100, async_save=False) as mgr:
        info = mgr.restore(target)
    assert left == [0] and info is not None and info.step == 2
    assert target["w"][0].item() == 2.0
    assert "reading it once more" in capsys.readouterr().err
    assert not any(v.verification_failed for v in list_versions(root))


def test_damage_that_repeats_is_recorded_and_a_storage_error_that_persists_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "r"
    target = _two_versions(root)
    _fault_once(monkeypatch, "flip", times=3)  # both loads of step 2 and the check again
    with pckt.CheckpointManager(root, save_every=100, async_save=False) as mgr:
        info = mgr.restore(target)
    assert info is not None and info.step == 1  # the damage came back: recorded, fell back
    assert [v.step for v in list_versions(root) if v.verification_failed] == [2]
    monkeypatch.undo()

    # Attack review 3 F7: an EIO, then one flip (two different faults, each once) recorded
    # an intact version as failed and resumed step 1. The flip is not found by a third read:
    # a storage problem, so the restore stops (R-ID-5) and records nothing.
    root3 = tmp_path / "r3"
    target = _two_versions(root3)
    _fault_once(monkeypatch, "eio")
    flips = _fault_once(monkeypatch, "flip")
    with pckt.CheckpointManager(root3, save_every=100, async_save=False) as mgr:
        with pytest.raises(StorageError, match="not found again by a third read"):
            mgr.restore(target)
    assert flips == [0] and not any(v.verification_failed for v in list_versions(root3))
    monkeypatch.undo()

    root2 = tmp_path / "r2"
    target = _two_versions(root2)
    _fault_once(monkeypatch, "eio", times=2)
    with pckt.CheckpointManager(root2, save_every=100, async_save=False) as mgr:
        with pytest.raises(StorageError, match="failed twice on a storage error"):
            mgr.restore(target)
    assert not any(v.verification_failed for v in list_versions(root2))


def test_damage_whose_third_read_fails_stops_the_restore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutation audit 27, MR22 (untested): both loads of the newest version meet damage and
    the third read, which would confirm it, fails with EIO. Nothing is known of the bytes: the
    restore stops (R-ID-5) and records nothing, never resumes the step before."""
    root = tmp_path / "r"
    target = _two_versions(root)
    left = _faults(monkeypatch, ["flip", "flip", "eio"])
    with pckt.CheckpointManager(root, save_every=100, async_save=False) as mgr:
        with pytest.raises(StorageError, match="failed twice") as caught:
            mgr.restore(target)
    assert left == [0], left
    assert "would silently lose the training since" in caught.value.message
    assert target["w"][0].item() == 0.0  # step 1 was not loaded instead
    assert not any(v.verification_failed for v in list_versions(root))


def test_confirm_damage_reads_the_file_again(tmp_path: Path) -> None:
    root = tmp_path / "r"
    m = portable_ckpt.save_arrays(root, {"w": np.arange(1000.0)}, step=1)
    data = next(p for p in m.files if p.startswith("data/"))
    full = f"{m.attempt_id}/{data}"
    storage = portable_ckpt.open(root).storage
    seen = [ChecksumError(f"{full}: block 0: a bit flipped on its way", path=full),
            FileMissingError(f"{full}: 404 once", path=full)]
    out = confirm_damage(storage, m.attempt_id, m.files, seen)
    assert [e.code for e in out] == ["PCK-STORAGE", "PCK-STORAGE"]
    assert "not found again when the file was read a second time" in out[0].message
    # Attack review 3 F8: a second read that fails is not "not found again".
    from portable_ckpt.storage.faults import Fault, FaultyStorage

    faulty = FaultyStorage(storage, [Fault(op=("read", "size"), path=full, error="EIO")])
    [out1] = confirm_damage(faulty, m.attempt_id, m.files, seen[:1])
    assert out1.code == "PCK-STORAGE" and "not found again" not in out1.message
    assert "could not be read a second time" in out1.message and "run the verif" in out1.message
    blob = bytearray((root / full).read_bytes())
    blob[-1] ^= 1
    (root / full).write_bytes(bytes(blob))
    assert [e.code for e in confirm_damage(storage, m.attempt_id, m.files, seen[:1])] == [
        "PCK-CHECKSUM"]
    (root / full).unlink()
    assert [e.code for e in confirm_damage(storage, m.attempt_id, m.files, seen[1:])] == [
        "PCK-FILE-MISSING"]


def test_cli_verify_does_not_record_a_flip_it_cannot_find_again(tmp_path: Path) -> None:
    """Multi-job review F10: one in-memory flip during a cron ``verify --deep`` recorded the
    version as failed, for good; a later passing verify could not clear it."""
    root = tmp_path / "r"
    for step in (1, 2):
        portable_ckpt.save_arrays(root, {"w": np.full(5000, float(step))}, step=step)
    script = (
        "import sys\n"
        "from portable_ckpt.storage.local import LocalStorage\n"
        "orig = LocalStorage.read_extents\n"
        "left = [1]\n"
        "def flip(self, path, extents):\n"
        "    orig(self, path, extents)\n"
        "    if left[0] and '/data/' in path:\n"
        "        extents[0][1][0][0] ^= 1; left[0] = 0\n"
        "LocalStorage.read_extents = flip\n"
        "from portable_ckpt.cli.main import main\n"
        "sys.exit(main(['verify', sys.argv[1], '--deep']))\n"
    )
    res = subprocess.run([sys.executable, "-c", script, str(root)], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 75, res.stdout + res.stderr  # a transient fault: retry
    assert "not found again when the file was read a second time" in res.stdout
    assert "recorded" not in res.stderr
    assert not any(v.verification_failed for v in list_versions(root))


def _restore_with_faults(root: Path, target: dict[str, Any], *faults: Any) -> StorageError:
    """Restore ``root`` through a durable tier that injects ``faults``; the error it raises."""
    import dataclasses

    from portable_ckpt.storage.faults import FaultyStorage

    with pckt.CheckpointManager(root, save_every=100, async_save=False) as mgr:
        tier = mgr.tiers["durable"]
        mgr.tiers["durable"] = dataclasses.replace(
            tier, storage=FaultyStorage(tier.storage, list(faults)))
        with pytest.raises(StorageError) as info:
            mgr.restore(target)
    return info.value


@pytest.mark.parametrize(("error", "advice"), [("EACCES", "mend what the error names"),
                                                ("EIO", "retry the restore")])
def test_the_advice_of_a_restore_stopped_by_storage_errors_follows_their_class(
    tmp_path: Path, error: str, advice: str
) -> None:
    """On-call review 23, F12: a permission denied on the newest version stopped the restore
    with "retry the restore", and a restart loop would retry it for good (`ls --latest` said
    exit 69: a person must act). A permission is mended by a person; an EIO may pass."""
    from portable_ckpt.storage.faults import Fault

    root = tmp_path / "r"
    target = _two_versions(root)
    newest = list_versions(root)[-1].id
    err = _restore_with_faults(root, target, Fault(op="read", path=f"{newest}/data/*", error=error))
    assert "failed twice on a storage error" in str(err)
    assert advice in str(err) and err.retryable is (error == "EIO")
    assert not any(v.verification_failed for v in list_versions(root))


@pytest.mark.parametrize(("error", "advice"), [("EACCES", "mend what the error names"),
                                                ("EIO", ": retry;")])
def test_a_newest_record_that_cannot_be_read_advises_by_its_error_class(
    tmp_path: Path, error: str, advice: str
) -> None:
    """On-call review 23, F12 (its repro: `chmod 000` on the newest version): the newest
    version's commit record could not be read, and the restore said "retry" whatever the
    cause; a permission is not retryable (`ls --latest` exits 69 for it)."""
    from portable_ckpt.storage.faults import Fault

    root = tmp_path / "r"
    target = _two_versions(root)
    newest = list_versions(root)[-1].id
    err = _restore_with_faults(root, target, Fault(
        op=("read", "exists", "size"), path=f"{newest}/manifest.json", error=error))
    assert "cannot tell whether" in str(err)
    assert advice in str(err) and err.retryable is (error == "EIO"), str(err)


def test_a_durable_root_that_cannot_be_listed_gets_the_durable_tiers_way_out(
    tmp_path: Path,
) -> None:
    """S3 review 24, L1: a job without a fast tier whose bucket was gone was told "construct
    the manager without fast_root=". The way out names the tier that failed: for the durable
    root, a copy back from a backup or an explicit version."""
    from portable_ckpt.storage.faults import Fault

    root = tmp_path / "r"
    target = _two_versions(root)
    err = _restore_with_faults(root, target, Fault(op="list", path="*", error="EIO"))
    assert "not 'no checkpoint'" in str(err) and "fast_root=" not in str(err), str(err)
    assert "portable-ckpt copy BACKUP_ROOT ROOT" in str(err) and "checkpoint=" in str(err)


def test_damage_a_restore_cannot_record_is_said_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fault review 27, F6: on a full or read-only root a restore passed over a damaged
    version and could not record its failure; it said so only to the logger (silent in a
    training job), and every restart read the damaged version again without a word. Rank 0
    says it on stderr with what to do."""
    import os

    from portable_ckpt.storage import register_scheme
    from portable_ckpt.storage.faults import Fault, FaultyStorage

    root = tmp_path / "r"
    target = _two_versions(root)
    newest = max(list_versions(root), key=lambda v: v.step)
    data = sorted((root / newest.id / "data").glob("*.safetensors"))[0]
    raw = bytearray(data.read_bytes())
    raw[-100] ^= 0xFF
    data.write_bytes(bytes(raw))
    scheme = f"rofs{os.getpid()}"
    faults = [Fault(op=("create", "open"), path="*/verifications/*", error="EROFS")]
    register_scheme(scheme, lambda url: FaultyStorage(LocalStorage(url.split("://", 1)[1]),
                                                      faults))
    with pckt.CheckpointManager(f"{scheme}://{root}", save_every=100, async_save=False) as mgr:
        info = mgr.restore(target)
    assert info is not None and info.step == 1
    err = capsys.readouterr().err
    assert "is damaged, and that could not be recorded" in err and "EROFS" in err, err
    assert not any(v.verification_failed for v in list_versions(root))


def test_a_failed_verification_record_replaced_by_a_directory_stops_the_restore(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fault review 27, F10: a failed verification record replaced by a directory (a pin's
    was taken for an unreadable pin) was passed over as no record, and the version it failed
    became the one a restore takes again. An entry named like a record that is no plain file
    is a record that cannot be read: ``ls`` says so, ``ls --latest`` and a restore stop
    (R-ID-5) instead of taking it or an older one."""
    import shutil

    from portable_ckpt.cli.main import main as cli_main

    root = tmp_path / "r"
    target = _two_versions(root)
    newest = max(list_versions(root), key=lambda v: v.step)
    data = sorted((root / newest.id / "data").glob("*.safetensors"))[0]
    raw = bytearray(data.read_bytes())
    raw[-100] ^= 0xFF
    data.write_bytes(bytes(raw))
    assert cli_main(["verify", str(root / newest.id), "--deep"]) == 1
    [record] = list((root / newest.id / "verifications").glob("*.json"))
    data.write_bytes(bytes(raw[:-100]) + bytes([raw[-100] ^ 0xFF]) + bytes(raw[-99:]))  # mended
    record.unlink()
    record.mkdir()  # the failed record, now a directory
    capsys.readouterr()
    [v] = [v for v in list_versions(root) if v.id == newest.id]
    assert v.verifications_unreadable and "named like a record" in (v.error or "")
    assert cli_main(["ls", str(root), "--latest"]) == 69
    with pckt.CheckpointManager(root, save_every=100, async_save=False) as mgr:
        with pytest.raises(portable_ckpt.CheckpointError, match="named like a record"):
            mgr.restore(target)
    shutil.rmtree(record)
    assert cli_main(["ls", str(root), "--latest"]) == 0


@pytest.mark.parametrize("kind", ["symlink", "file", "fifo"])
def test_a_records_directory_that_is_no_directory_is_records_that_cannot_be_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """Re-attack 27, 2: a version's ``verifications/`` replaced by a symbolic link (its failed
    record intact behind it), a file or a FIFO hid the record: ``ls --latest`` named the failed
    version and ``gc --keep 1`` deleted the good one before it. Such a directory holds records
    that cannot be read: ``ls --latest`` exits 69, gc keeps both."""
    import os

    from portable_ckpt.cli.main import main as cli_main

    root = tmp_path / "r"
    _two_versions(root)
    older, newest = sorted(list_versions(root), key=lambda v: v.step)
    data = sorted((root / newest.id / "data").glob("*.safetensors"))[0]
    raw = bytearray(data.read_bytes())
    raw[-100] ^= 0xFF
    data.write_bytes(bytes(raw))
    assert cli_main(["verify", str(root / newest.id), "--deep"]) == 1
    records = root / newest.id / "verifications"
    if kind == "symlink":
        os.rename(records, tmp_path / "elsewhere")
        os.symlink(tmp_path / "elsewhere", records)
    else:
        for p in records.iterdir():
            p.unlink()
        records.rmdir()
        records.write_text("x") if kind == "file" else os.mkfifo(records)
    capsys.readouterr()
    assert cli_main(["ls", str(root), "--latest"]) == 69
    assert "verifications is no directory" in capsys.readouterr().err
    assert cli_main(["gc", str(root), "--keep", "1"]) == 1
    assert sorted(v.id for v in list_versions(root)) == [older.id, newest.id]
