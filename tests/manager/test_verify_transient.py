"""A storage error during the manager's after-save verification proves nothing about the bytes.

Found by an attack review (F1): one transient EIO while the manager sampled a fresh version
recorded it as failed; no manager would restore it, and ``keep_last`` retention deleted the
intact version after the next save. Only damage (``DAMAGE_CODES``) fails a version now.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import portable_ckpt  # noqa: E402
from portable_ckpt.errors import StorageError  # noqa: E402
from portable_ckpt.io.versions import list_versions  # noqa: E402
from portable_ckpt.storage.local import LocalStorage  # noqa: E402
from portable_ckpt.torch import CheckpointManager  # noqa: E402


def _fail_first_shard_read_of(monkeypatch: pytest.MonkeyPatch, step: int) -> dict[str, bool]:
    """One EIO on the first data read of ``step``'s version after its commit record exists."""
    state = {"armed": False, "fired": False}
    reads = {n: getattr(LocalStorage, n) for n in ("read_into", "read_into_many", "read_extents")}
    create = LocalStorage.create_if_absent

    def wrap(name: str) -> Any:
        def read(self: LocalStorage, path: str, *a: Any, **k: Any) -> Any:
            if state["armed"] and not state["fired"] and path.endswith(".safetensors"):
                state["fired"] = True
                raise StorageError(f"read {path!r}: Input/output error (errno 5)", path=path)
            return reads[name](self, path, *a, **k)
        return read

    def arm(self: LocalStorage, path: str, data: bytes) -> bool:
        done = create(self, path, data)
        if path.endswith("/manifest.json") and path.startswith(f"s{step:012d}-"):
            state["armed"] = True
        return done

    for name in reads:
        monkeypatch.setattr(LocalStorage, name, wrap(name))
    monkeypatch.setattr(LocalStorage, "create_if_absent", arm)
    return state


def test_a_transient_read_error_after_a_save_fails_no_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(tmp_path / "r")
    fault = _fail_first_shard_read_of(monkeypatch, 2)
    mgr = CheckpointManager(root, save_every=1, keep_last=3, async_save=False, verify_sample=1.0,
                            handle_sigterm=False)
    try:
        for step in (1, 2, 3):
            mgr.save(step, {"model": {"w": torch.arange(1000.0) * step}})
            mgr.wait()
    finally:
        mgr.close()
    assert fault["fired"]
    versions = {v.step: v for v in list_versions(root, annotations=True)}
    assert sorted(versions) == [1, 2, 3]  # keep_last=3 kept the intact step 2
    assert not versions[2].verification_failed and versions[2].verifications == []
    assert portable_ckpt.open(f"{root}/{versions[2].id}").verify(deep=True) == []
    target = {"model": {"w": torch.zeros(1000)}}
    info = CheckpointManager(root, handle_sigterm=False).restore(target, step=2)
    assert info is not None and torch.equal(target["model"]["w"], torch.arange(1000.0) * 2)


def test_a_durable_save_whose_fast_copy_is_damaged_is_a_failed_durable_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """``replicate=True``: a durable step's fast-tier version that failed its verification was
    never copied, never counted, never said; the job ran with an empty durable root and exited
    0 (tier review F1). It is a failed durable save now: counted, kept for wait(), on stderr."""
    from portable_ckpt.errors import ChecksumError
    from portable_ckpt.io.reader import Checkpoint

    def damaged(self: Checkpoint, *a: Any, **k: Any) -> list[Any]:
        return [ChecksumError(f"{self.id}: block 0 differs [injected]")]

    monkeypatch.setattr(Checkpoint, "verify", damaged)
    durable, fast = str(tmp_path / "durable"), str(tmp_path / "fast")
    mgr = CheckpointManager(durable, fast_root=fast, replicate=True, save_every=1,
                            async_save=False, verify_sample=1.0, max_failed_saves=None,
                            handle_sigterm=False)
    for step in (1, 2):
        mgr.save(step, {"model": {"w": torch.arange(100.0) * step}})
    with pytest.raises(ChecksumError, match="not copied to the durable root"):
        mgr.wait()
    mgr.close()
    assert list_versions(durable) == []
    assert mgr._failed_saves == 2 and mgr._failed_steps == [1, 2]
    err = capfd.readouterr().err
    assert "not copied to the durable root" in err and "FAILED" in err, err


def test_a_fast_tier_failure_does_not_fail_a_run_whose_durable_saves_work(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """close() raised a fast-tier failure of step 3 at the end of a run whose durable step 4 had
    committed, and the job exited 1 (tier review F10). A durable save that works clears it; the
    failure was said on stderr."""
    durable, fast = str(tmp_path / "durable"), tmp_path / "fast"
    mgr = CheckpointManager(durable, fast_root=str(fast), fast_every=1, save_every=2,
                            handle_sigterm=False)
    shutil.rmtree(fast, ignore_errors=True)
    fast.write_text("the fast tier's disk is gone")  # every fast save fails from now on
    for step in (1, 2, 3, 4, 5, 6):
        mgr.maybe_save(step, {"model": {"w": torch.arange(10.0) * step}})
    mgr.close()  # no raise: the newest checkpoint, durable step 6, exists
    assert [v.step for v in list_versions(durable)][-1] == 6
    err = capfd.readouterr().err
    assert "step 5" in err and "FAILED" in err, err


def test_a_slow_replication_is_no_earlier_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """``replicate=True``: this job's own fast saves committed while step 3 was copied were
    called "newer steps (an earlier run's, or a rolled-back branch)" (tier review F6)."""
    import time

    import portable_ckpt.io.copy as copy_module

    copy = copy_module.copy_version

    def slow(*a: Any, **k: Any) -> Any:
        time.sleep(1.5)  # later fast saves commit meanwhile
        return copy(*a, **k)

    monkeypatch.setattr(copy_module, "copy_version", slow)
    mgr = CheckpointManager(str(tmp_path / "durable"), fast_root=str(tmp_path / "fast"),
                            replicate=True, save_every=3, fast_every=1, keep_last=2, fast_keep=2,
                            async_save=False, handle_sigterm=False)
    for step in range(1, 6):  # 4 and 5 commit on the fast tier while 3 is being copied
        mgr.maybe_save(step, {"model": {"w": torch.arange(10.0) * step}})
    mgr.close()
    assert "already holds newer steps" not in capfd.readouterr().err
    assert [v.step for v in list_versions(str(tmp_path / "durable"))] == [3]


def test_fast_retention_waits_for_a_copy_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """mutation audit 22 B2-27: ``replicate=True``, ``fast_keep=1``: while step 3 is copied to
    the durable root, the fast saves of steps 4 and 5 commit; their fast-tier retention must
    not delete step 3's fast version under the copy (the copy then failed, and the durable
    root never got step 3). Once the copy is done, the fast tier is pruned to its keep."""
    import time

    import portable_ckpt.io.copy as copy_module

    copy = copy_module.copy_version

    def slow(*a: Any, **k: Any) -> Any:
        time.sleep(1.0)  # later fast saves commit meanwhile
        return copy(*a, **k)

    monkeypatch.setattr(copy_module, "copy_version", slow)
    fast = str(tmp_path / "fast")
    mgr = CheckpointManager(str(tmp_path / "durable"), fast_root=fast, replicate=True,
                            save_every=3, fast_every=1, fast_keep=1, async_save=False,
                            handle_sigterm=False)
    for step in range(1, 6):
        mgr.maybe_save(step, {"model": {"w": torch.arange(10.0) * step}})
    mgr.close()
    assert "FAILED" not in capfd.readouterr().err
    assert [v.step for v in list_versions(str(tmp_path / "durable"))] == [3]
    assert [v.step for v in list_versions(fast) if v.status == "committed"] == [5]


def test_a_copy_that_works_resets_the_failed_durable_saves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mutation audit 22 B2-32: ``replicate=True``: a durable save exists once its copy is done,
    so a copy that works ends a run of failed durable saves; two copies that failed with one
    that worked between them are not two failures in a row (max_failed_saves=2 stopped the job).
    """
    import portable_ckpt.io.copy as copy_module

    copy = copy_module.copy_version

    def fails_for_odd_steps(src: Any, dst: Any, **k: Any) -> Any:
        if int(str(src).rstrip("/").rsplit("/", 1)[-1][1:13]) % 2:
            raise StorageError(f"write {dst}: Input/output error [injected]", path=str(dst))
        return copy(src, dst, **k)

    monkeypatch.setattr(copy_module, "copy_version", fails_for_odd_steps)
    durable = str(tmp_path / "durable")
    mgr = CheckpointManager(durable, fast_root=str(tmp_path / "fast"), replicate=True,
                            save_every=1, max_failed_saves=2, async_save=False,
                            continuation="statistical", handle_sigterm=False)
    try:
        for step in (1, 2, 3):
            mgr.maybe_save(step, {"model": {"w": torch.arange(10.0) * step}})
            try:
                mgr.wait()
            except StorageError:
                pass
        assert mgr._failed_steps == [3] and mgr._failed_saves == 1
    finally:
        mgr.close()
    assert [v.step for v in list_versions(durable)] == [2]
