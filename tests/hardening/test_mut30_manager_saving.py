"""Mutation audit 30, the manager's save phase (docs/torch.md "When it saves", "Async save"):
a synchronous save (preemption) starts once the pending async save has ended.

Real managers on a local root; the slow write is the real one behind a pause.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import portable_ckpt

torch = pytest.importorskip("torch")
pckt = pytest.importorskip("portable_ckpt.torch")


def test_a_preemption_save_starts_after_the_pending_async_save_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A preemption save is synchronous and the manager first waits for the async save in
    flight (``_settle_pending``): two saves of one job never write at once, and the
    preemption's step is the last to commit. Mutant: the synchronous save started beside the
    slow async save of step 1, and committed first."""
    import portable_ckpt.torch.manager as manager_module
    import portable_ckpt.torch.saving as saving

    real_write = saving.RankWrite.__call__
    calls: list[int] = []

    def slow_first(self: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            time.sleep(1.0)  # step 1's write is still running when step 2 is saved
        return real_write(self)

    monkeypatch.setattr(saving.RankWrite, "__call__", slow_first)
    real_save = manager_module.save
    pending_done: list[bool] = []
    root = tmp_path / "r"
    with pckt.CheckpointManager(root, save_every=1, async_save=True, handle_sigterm=False,
                                continuation="statistical") as mgr:
        mgr.maybe_save(1, {"w": torch.arange(8.0)})
        first = mgr._pending
        assert first is not None

        def sync_save(*a: Any, **k: Any) -> Any:
            pending_done.append(first.committed.done())
            return real_save(*a, **k)

        monkeypatch.setattr(manager_module, "save", sync_save)
        mgr.request_preemption()
        assert mgr.maybe_save(2, {"w": torch.arange(8.0) * 2})
        assert mgr.preempted
    assert pending_done == [True]
    versions = portable_ckpt.list_versions(root)
    assert [v.step for v in versions] == [1, 2]
    assert versions[0].committed_at is not None and versions[1].committed_at is not None
    assert versions[0].committed_at < versions[1].committed_at  # ISO times sort as text


def test_a_preemption_save_is_tried_after_max_failed_saves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/torch.md "Failed saves": after ``max_failed_saves`` durable checkpoints failed in a
    row the next agreement raises, but "a preemption save is still attempted" (the last
    chance to keep the training since the last checkpoint). Mutant: the preemption's
    agreement raised like any other, and the job ended without its preemption save."""
    import contextlib

    from portable_ckpt.errors import StorageError
    from portable_ckpt.storage.local import LocalStorage

    real = LocalStorage.open_writer

    def step_1_fails(self: Any, path: str, **kw: Any) -> Any:
        if path.startswith("s000000000001-"):
            raise StorageError(f"write {path}: Input/output error [injected]", path=path)
        return real(self, path, **kw)

    monkeypatch.setattr(LocalStorage, "open_writer", step_1_fails)
    root = tmp_path / "r"
    with pckt.CheckpointManager(root, save_every=1, max_failed_saves=1, handle_sigterm=False,
                                continuation="statistical") as mgr:
        mgr.maybe_save(1, {"w": torch.arange(8.0)})
        with contextlib.suppress(StorageError):
            mgr.wait()  # the failure is counted: the next agreement would raise
        mgr.request_preemption()
        assert mgr.maybe_save(2, {"w": torch.arange(8.0) * 2})
        assert mgr.preempted
    assert [v.step for v in portable_ckpt.list_versions(root) if v.status == "committed"] == [2]


def _post_save_done(mgr: Any) -> None:
    """Wait until the post-save work queued so far ended, without ``wait()``."""
    deadline = time.monotonic() + 60
    while not all(f.done() for f in mgr._post):
        assert time.monotonic() < deadline, "the post-save work did not end"
        time.sleep(0.01)


def _durable_fails_at(monkeypatch: pytest.MonkeyPatch, steps: set[int]) -> None:
    """Every write of these steps' attempts fails (a transient I/O error)."""
    from portable_ckpt.errors import StorageError
    from portable_ckpt.storage.local import LocalStorage

    real = LocalStorage.open_writer

    def fails(self: Any, path: str, **kw: Any) -> Any:
        if path[:1] == "s" and int(path[1:13]) in steps:
            raise StorageError(f"write {path}: Input/output error [injected]", path=path)
        return real(self, path, **kw)

    monkeypatch.setattr(LocalStorage, "open_writer", fails)


def test_the_job_stops_at_exactly_max_failed_saves_and_raises_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/torch.md "Failed saves": after ``max_failed_saves`` durable checkpoints failed in a
    row the next agreement raises; the failure it names is surfaced there, not again by
    ``wait()``/``close()``. Mutants: the stop came one failure later; ``last_error`` was kept,
    and ``close()`` raised it a second time."""
    from portable_ckpt.errors import StorageError

    _durable_fails_at(monkeypatch, {1, 2})
    root = tmp_path / "r"
    mgr = pckt.CheckpointManager(root, save_every=1, max_failed_saves=2, handle_sigterm=False,
                                 continuation="statistical")
    try:
        for step in (1, 2):
            assert mgr.maybe_save(step, {"w": torch.arange(8.0)})
            _post_save_done(mgr)  # counted, and left in last_error (no wait())
        with pytest.raises(StorageError, match="2 durable checkpoints in a row failed"):
            mgr.maybe_save(3, {"w": torch.arange(8.0)})
    finally:
        mgr.close()  # no raise: the failure was surfaced by the stop
    assert not [v for v in portable_ckpt.list_versions(root) if v.status == "committed"]


def test_wait_raises_a_post_save_failure_of_a_save_before_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``wait()`` raises "the first unexpected failure of post-commit work": a save prunes the
    finished post-save futures, and keeps those that raised (soak review F4). Mutants: the
    pruning dropped the failed one too, or ``wait()`` raised only ``last_error``; either way
    step 1's failure was never raised."""
    import portable_ckpt.torch.manager as manager_module

    real = manager_module.after_save

    def fails_for_step_1(mgr: Any, step: int, *a: Any, **k: Any) -> None:
        real(mgr, step, *a, **k)
        if step == 1:
            raise RuntimeError("post-save work of step 1 failed [injected]")

    monkeypatch.setattr(manager_module, "after_save", fails_for_step_1)
    mgr = pckt.CheckpointManager(tmp_path / "r", save_every=1, handle_sigterm=False,
                                 continuation="statistical")
    try:
        mgr.maybe_save(1, {"w": torch.arange(8.0)})
        _post_save_done(mgr)
        mgr.maybe_save(2, {"w": torch.arange(8.0)})  # prunes the finished futures
        with pytest.raises(RuntimeError, match="step 1 failed"):
            mgr.wait()
        mgr.wait()  # raised once
    finally:
        mgr.close()


def test_saving_again_a_step_whose_save_failed_is_no_repeat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A step whose save failed was not saved: saving it again (a retry) is not the "step N is
    not after this manager's last save" that a cell run again gets (notebook review F4).
    Mutant: the failed step stayed counted as saved, and the retry was said to be a repeat."""
    import contextlib

    from portable_ckpt.errors import StorageError

    _durable_fails_at(monkeypatch, {2})
    root = tmp_path / "r"
    with pckt.CheckpointManager(root, save_every=1, handle_sigterm=False,
                                continuation="statistical") as mgr:
        mgr.maybe_save(1, {"w": torch.arange(8.0)})
        mgr.maybe_save(2, {"w": torch.arange(8.0)})
        with contextlib.suppress(StorageError):
            mgr.wait()
        monkeypatch.undo()  # the storage works again
        capsys.readouterr()
        mgr.save(2, {"w": torch.arange(8.0)})  # the retry
    assert "is not after this manager's last save" not in capsys.readouterr().err
    assert [v.step for v in portable_ckpt.list_versions(root) if v.status == "committed"] == [1, 2]


def test_a_stop_names_no_failure_from_before_the_last_durable_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop after ``max_failed_saves`` names "this rank's last error": the failure still
    waiting, else the one ``wait()`` raised last, but never one from before a durable commit
    (a published version supersedes it). Step 1 fails (raised by ``wait()``), step 2
    commits, steps 3 and 4 fail synchronously (raised to the caller, not kept). Mutant: the
    commit left step 1's error as the last raised one, and the stop named it."""
    import contextlib

    from portable_ckpt.errors import StorageError

    _durable_fails_at(monkeypatch, {1, 3, 4})
    with pckt.CheckpointManager(tmp_path / "r", save_every=1, max_failed_saves=2,
                                handle_sigterm=False, continuation="statistical") as mgr:
        mgr.maybe_save(1, {"w": torch.arange(8.0)})
        with contextlib.suppress(StorageError):
            mgr.wait()
        mgr.maybe_save(2, {"w": torch.arange(8.0)})
        mgr.wait()
        mgr.async_save = False  # steps 3 and 4 are synchronous: their errors reach the caller
        for step in (3, 4):
            with pytest.raises(StorageError):
                mgr.maybe_save(step, {"w": torch.arange(8.0)})
        with pytest.raises(portable_ckpt.CheckpointError, match="in a row failed") as stop:
            mgr.maybe_save(5, {"w": torch.arange(8.0)})
    assert "steps 3, 4; each was raised to the caller of its save)" in str(stop.value)


def test_a_synchronous_save_of_an_unstorable_state_raises_and_stops_nothing(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """docs/torch.md: a value no save can store stops the job at the next save, "not when the
    caller was told": a synchronous save raises it to the caller, who may change the state and
    save again. Mutants P33 (the synchronous failure marked the state unstorable: the fixed
    state's save raised "no save can store") and P36 (the failure the caller got was also
    printed on stderr as a background failure)."""
    from portable_ckpt.errors import UnsupportedValueError
    from tests.manager.test_manager_usage import _Config

    state: dict[str, Any] = {"cfg": _Config(), "w": torch.ones(2)}
    with pckt.CheckpointManager(tmp_path, save_every=1, async_save=False,
                                continuation="statistical", handle_sigterm=False) as mgr:
        capfd.readouterr()
        with pytest.raises(UnsupportedValueError):
            mgr.maybe_save(1, state)
        err = capfd.readouterr().err
        assert "FAILED" not in err and "No save can store" not in err, err
        state["cfg"] = {"lr": 0.1}
        assert mgr.maybe_save(2, state)
    assert [v.step for v in portable_ckpt.list_versions(str(tmp_path))] == [2]


def test_keep_best_says_nothing_of_a_fast_tier_save_without_the_metric(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """keep_best ranks the durable root's versions only: a fast-tier save without the metric
    is no unranked version, and the warning (said once) is kept for a durable one. Mutant M16
    (the fast tier's save warned, and the durable save's missing metric was then never said)."""
    state = {"w": torch.arange(4.0)}
    with pckt.CheckpointManager(str(tmp_path / "durable"), fast_root=str(tmp_path / "fast"),
                                fast_every=1, save_every=2, keep_best=("loss", 1, "min"),
                                async_save=False, continuation="statistical",
                                handle_sigterm=False) as mgr:
        capsys.readouterr()
        mgr.maybe_save(1, state)  # fast tier, no metric: nothing to say
        assert "keep_best" not in capsys.readouterr().err
        mgr.maybe_save(2, state, metrics={"acc": 0.5})  # durable, no 'loss'
    err = capsys.readouterr().err
    assert "the save of step 2 carries no finite 'loss' value" in err, err
