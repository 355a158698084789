"""Mutation audit 30, the manager's retention passes after a copy to the durable root
(``replicate=True``, docs/torch.md "What it keeps", "Room to save", "One job per root").

Real managers on local roots; a slow gc is the real one behind a pause.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import portable_ckpt
import portable_ckpt.io.gc as gc_module
import portable_ckpt.torch._manager_post as post
from tests._corrupt import flip_byte
from tests.manager.test_retention_owed import (
    _copy_of_step_2_ended_then_hold,
    _first_save_then_hold,
    _until_the_copies_ended,
)

torch = pytest.importorskip("torch")
pckt = pytest.importorskip("portable_ckpt.torch")


def _committed(root: Path) -> list[int]:
    return [v.step for v in portable_ckpt.list_versions(root) if v.status == "committed"]


def test_wait_returns_after_the_retention_pass_a_copy_queued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``wait()`` "waits for the pending save, its verification, copy and retention": with
    ``replicate=True`` the durable root's pass is queued by the copy's callback. Mutant: those
    passes were not in the futures ``wait()`` settles, and it returned while the durable
    root's gc (slow here) still ran: keep_last=1 held two versions after ``wait()``."""
    durable = tmp_path / "durable"
    real = gc_module.gc

    def slow(storage: Any, **kw: Any) -> Any:
        if str(storage.url).startswith(str(durable)):
            time.sleep(0.5)
        return real(storage, **kw)

    monkeypatch.setattr(gc_module, "gc", slow)
    with pckt.CheckpointManager(durable, fast_root=tmp_path / "fast", replicate=True,
                                save_every=1, keep_last=1, async_save=False,
                                handle_sigterm=False, continuation="statistical") as mgr:
        for step in (1, 2):
            mgr.maybe_save(step, {"w": torch.arange(8.0) * step})
            mgr.wait()
            assert _committed(durable) == [step]


def test_wait_returns_after_the_copys_callback_reported_it(tmp_path: Path) -> None:
    """``wait()`` waits for the future that ends once the copy's callback has run, not for
    the copy itself (race review F1). Mutant: that future was set before the callback
    reported the copy (its event, slow here) and queued the retention passes: ``wait()``
    returned with the durable root not yet pruned (keep_last=1 held two versions)."""
    durable = tmp_path / "durable"
    with pckt.CheckpointManager(durable, fast_root=tmp_path / "fast", replicate=True,
                                save_every=1, keep_last=1, async_save=False,
                                handle_sigterm=False, continuation="statistical") as mgr:
        real = mgr.telemetry.emit

        def emit(event: str, **kw: Any) -> Any:
            if event == "replicate":
                time.sleep(0.5)  # a slow events file
            return real(event, **kw)

        mgr.telemetry.emit = emit  # type: ignore[method-assign]
        for step in (1, 2):
            mgr.maybe_save(step, {"w": torch.arange(8.0) * step})
            mgr.wait()
            assert _committed(durable) == [step]


def test_a_copied_save_below_an_earlier_runs_newer_steps_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/torch.md "One job per root": a job that saves below newer steps of an earlier run
    "keeps the job's newest save and says so on stderr once per tier". With
    ``replicate=True`` the durable version is the copy's, and the durable root's pass is the
    one the copy queues, with the copied version as its own. Mutant: that pass ran without it
    (as a pass of nobody's save), and the durable root's warning was never said."""
    durable = tmp_path / "durable"
    state = {"w": torch.arange(8.0)}
    with pckt.CheckpointManager(durable, save_every=1, keep_last=2, async_save=False,
                                handle_sigterm=False, continuation="statistical") as mgr:
        for step in (10, 20):
            mgr.save(step, state)
    capsys.readouterr()
    with pckt.CheckpointManager(durable, fast_root=tmp_path / "fast", replicate=True,
                                save_every=1, keep_last=2, async_save=False,
                                handle_sigterm=False, continuation="statistical") as mgr:
        mgr.save(3, state)  # a fresh run, no restore()
    said = [line for line in capsys.readouterr().err.splitlines()
            if "already holds newer" in line and str(durable) in line]
    assert len(said) == 1 and "step 3" in said[0] and "[10, 20]" in said[0], said
    assert _committed(durable) == [3, 10, 20]


def test_an_earlier_runs_version_is_deleted_by_a_pass_beside_the_thread(tmp_path: Path) -> None:
    """A pass beside the background thread (queued saves, ``replicate=True``) keeps what this
    job committed after its own version, by commit order, and judges a version this job did
    not commit (an earlier run's, absent from the order) by the times in the ids. Mutant:
    "by commit order" also for one version of the two absent from the order: ``None > 3``
    raised in the pass, and ``wait()`` raised a TypeError."""
    root, fast = tmp_path / "durable", tmp_path / "fast"
    portable_ckpt.save_arrays(str(fast), {"w": torch.arange(4.0).numpy()}, step=0)  # earlier run
    state: dict[str, Any] = {"w": torch.arange(1024.0)}
    with pckt.CheckpointManager(root, fast_root=fast, replicate=True, save_every=1,
                                keep_last=2, fast_keep=2, async_save=True,
                                continuation="statistical") as mgr:
        gate = _first_save_then_hold(mgr, state)  # the fast root holds steps 0 and 1
        assert _committed(fast) == [0, 1]
        for step in range(2, 6):
            mgr.maybe_save(step, state)
        gate.set()
        mgr.wait()
    assert _committed(fast) == [4, 5] and _committed(root) == [4, 5]


def test_the_durable_roots_pass_runs_beside_the_thread_while_fast_saves_queue(
    tmp_path: Path,
) -> None:
    """docs/torch.md "Room to save": with ``replicate=True`` the pass of a commit with a save
    queued behind it runs on the ``pck-retention`` thread, "the durable root's too, which
    fast-tier saves queue behind" (the peers' collectives wait on the background thread).
    Here the copy of durable step 2 queues the durable root's pass, and fast step 3 is queued
    behind it. Mutants: only saves queued for the pass's own tier counted, and the durable
    root's pass ran on the background thread, ahead of step 3's post-save work; close() left
    the retention thread running."""
    root, fast = tmp_path / "durable", tmp_path / "fast"
    state: dict[str, Any] = {"w": torch.arange(1024.0)}
    threads: list[threading.Thread] = []
    with pckt.CheckpointManager(root, fast_root=fast, replicate=True, save_every=2,
                                fast_every=1, keep_last=1, fast_keep=1, async_save=True,
                                continuation="statistical") as mgr:
        real = mgr.telemetry.emit

        def emit(event: str, **kw: Any) -> Any:
            if event == "retention" and kw.get("tier") == "durable":
                threads.append(threading.current_thread())
            return real(event, **kw)

        mgr.telemetry.emit = emit  # type: ignore[method-assign]
        gate = _first_save_then_hold(mgr, state)  # fast step 1
        held = _copy_of_step_2_ended_then_hold(mgr, state)  # durable step 2: its copy
        gate.set()
        _until_the_copies_ended(mgr)
        mgr.maybe_save(3, state)  # fast: queued behind the copy's passes
        held.set()
        mgr.wait()
    assert [t.name.split("_")[0] for t in threads] == ["pck-retention"], threads
    assert _committed(root) == [2] and _committed(fast) == [3]
    # close() stops the retention thread too (mutant: it was left running, one per manager)
    assert not threads[0].is_alive()


def test_a_pass_beside_the_thread_waits_for_the_pass_lock(tmp_path: Path) -> None:
    """Passes of the background and retention threads never overlap (``_pass_lock``: two
    gc runs of one root at once each deleted what the other's listing still counted). Here
    the test holds the lock while step 2's commit queues its pass beside the thread (step 3
    is queued behind it). Mutant: the pass beside the thread took no lock and ran its gc."""
    root, fast = tmp_path / "durable", tmp_path / "fast"
    state: dict[str, Any] = {"w": torch.arange(1024.0)}
    during: list[str] = []
    held = threading.Event()
    with pckt.CheckpointManager(root, fast_root=fast, replicate=True, save_every=1,
                                keep_last=1, fast_keep=1, async_save=True,
                                continuation="statistical") as mgr:
        real = mgr.telemetry.emit

        def emit(event: str, **kw: Any) -> Any:
            if event == "retention" and held.is_set():
                during.append(threading.current_thread().name.split("_")[0])
            return real(event, **kw)

        mgr.telemetry.emit = emit  # type: ignore[method-assign]
        gate = _first_save_then_hold(mgr, state)
        mgr.maybe_save(2, state)
        mgr.maybe_save(3, state)
        with mgr._pass_lock:
            held.set()
            gate.set()
            deadline = time.monotonic() + 60
            while not mgr._aside_own and not during:
                assert time.monotonic() < deadline, "no pass was queued beside the thread"
                time.sleep(0.01)
            time.sleep(1.0)  # time for a pass that takes no lock to run
            held.clear()
        mgr.wait()
    assert during == [], during
    assert _committed(fast) == [3] and _committed(root) == [3]


def _earlier_run(root: Path, steps: tuple[int, ...]) -> None:
    """Versions an earlier job saved into ``root`` (keep_last=2, no fast tier)."""
    with pckt.CheckpointManager(root, save_every=1, keep_last=2, async_save=False,
                                handle_sigterm=False, continuation="statistical") as mgr:
        for step in steps:
            mgr.save(step, {"w": torch.arange(8.0) * step})


def test_an_earlier_runs_attempt_that_never_committed_is_no_newer_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Incident review R4: attempts that are no version (a save that never committed, a lost
    commit record) do not sort above this job's saves for a restore, and are not named as
    newer steps. Mutant: only failed verifications were left out, and the job was told that
    the root "already holds newer steps [20]" (an attempt without a commit record)."""
    root = tmp_path / "r"
    _earlier_run(root, (1, 20))
    (newest,) = [v.id for v in portable_ckpt.list_versions(root) if v.step == 20]
    (root / newest / "manifest.json").unlink()  # its commit never happened
    capsys.readouterr()
    with pckt.CheckpointManager(root, save_every=1, keep_last=2, async_save=False,
                                handle_sigterm=False, continuation="statistical") as mgr:
        mgr.save(2, {"w": torch.arange(8.0)})
    assert "already holds newer" not in capsys.readouterr().err
    assert _committed(root) == [1, 2]


def test_this_jobs_save_that_failed_verification_below_newer_steps_is_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention keeps this job's newest save when newer steps of an earlier run put it outside
    the policy, but "a version that failed its sampled verification is deleted all the same"
    (``_retention_pass``). The earlier run's clock was an hour ahead, so gc's own rule for a
    rollback's branch does not keep step 3 either (as in test_manager_usage's clock-ahead
    test); step 3's data is damaged before its verification. Mutant: the own version was kept
    whatever the policy's reason, and a version no restore takes stayed."""
    import datetime as dt

    import portable_ckpt.io.commit as commit

    root = tmp_path / "r"
    real_time = commit.commit_time

    def ahead(storage: Any, attempt_id: str, now: Any = None) -> str:
        return real_time(storage, attempt_id, dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))

    with monkeypatch.context() as m:
        m.setattr(commit, "commit_time", ahead)
        _earlier_run(root, (10, 20))
    real = post.verify

    def damaged_first(mgr: Any, tier: Any, attempt: str) -> Any:
        for f in (root / attempt / "data").iterdir():
            flip_byte(f, -1)  # the last byte of the tensor data
        return real(mgr, tier, attempt)

    monkeypatch.setattr(post, "verify", damaged_first)
    with pckt.CheckpointManager(root, save_every=1, keep_last=2, async_save=False,
                                verify_sample=1.0, handle_sigterm=False,
                                continuation="statistical") as mgr:
        mgr.save(3, {"w": torch.arange(8.0)})
    assert _committed(root) == [10, 20]


def test_a_pass_beside_the_thread_keeps_a_version_whose_verification_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass beside the background thread keeps every version committed after its own: the
    background thread may be verifying or copying one. Here step 3's verification (slow) runs
    while step 2's pass runs beside it (step 4 queued). Mutant: the pass kept only the versions
    newer than the one whose post-save work began last (step 3), and deleted step 3 under its
    verification: its copy failed, and the durable root never got step 3."""
    root, fast = tmp_path / "durable", tmp_path / "fast"
    real = post.verify

    def slow(mgr: Any, tier: Any, attempt: str) -> Any:
        out = real(mgr, tier, attempt)
        time.sleep(1.0)  # the pass beside the thread runs meanwhile
        return out

    monkeypatch.setattr(post, "verify", slow)
    state: dict[str, Any] = {"w": torch.arange(1024.0)}
    failed: list[dict[str, Any]] = []
    with pckt.CheckpointManager(root, fast_root=fast, replicate=True, save_every=1,
                                keep_last=5, fast_keep=1, async_save=True, verify_sample=1.0,
                                continuation="statistical") as mgr:
        real_emit = mgr.telemetry.emit

        def emit(event: str, **kw: Any) -> Any:
            if event == "replicate" and not kw["ok"]:
                failed.append(kw)
            return real_emit(event, **kw)

        mgr.telemetry.emit = emit  # type: ignore[method-assign]
        gate = _first_save_then_hold(mgr, state)
        for step in (2, 3, 4):
            mgr.maybe_save(step, state)
        gate.set()
        mgr.wait()
    assert failed == []
    assert _committed(root) == [1, 2, 3, 4] and _committed(fast) == [4]


def test_a_version_whose_commit_record_retention_cannot_delete_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store that refuses to delete a version's commit record leaves the version whole (gc:
    "delete failed", nothing else of it deleted): the retention event is not ok, names it, and
    stderr says so once, as for files left behind. Mutant P101 (only files left behind were
    counted: the event said ok while the version stayed, the disk filling)."""
    from portable_ckpt.errors import StorageError
    from portable_ckpt.storage.local import LocalStorage

    real = LocalStorage.delete
    stuck: list[str] = []

    def delete(self: LocalStorage, path: str) -> Any:
        if stuck and path == f"{stuck[0]}/manifest.json":
            raise StorageError(f"delete {path!r}: Permission denied (errno 13)", path=path)
        return real(self, path)

    monkeypatch.setattr(LocalStorage, "delete", delete)
    root = tmp_path / "r"
    with pckt.CheckpointManager(root, save_every=1, keep_last=1, async_save=False,
                                continuation="statistical", handle_sigterm=False) as mgr:
        mgr.maybe_save(1, {"w": torch.ones(2)})
        stuck.append(portable_ckpt.list_versions(root)[0].id)
        capsys.readouterr()
        for step in (2, 3):
            mgr.maybe_save(step, {"w": torch.ones(2)})
        events = [e for e in mgr.telemetry.history if e["event"] == "retention"]
    bad = [e for e in events if not e["ok"]]
    assert bad and all(e["failed"][0]["id"] == stuck[0] for e in bad), events
    assert capsys.readouterr().err.count(f"retention could not delete {stuck[0]}") == 1
    assert stuck[0] in [v.id for v in portable_ckpt.list_versions(root)]  # still whole
