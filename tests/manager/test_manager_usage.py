"""CheckpointManager arguments and one-time warnings found by the outside user review.

Single-process managers (no process group): real saves on real files.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import numpy as np
import torch

import portable_ckpt
import portable_ckpt.torch as pckt
from portable_ckpt.errors import TensorMissingError, UsageError

pytestmark = pytest.mark.torch


def test_a_backend_object_is_refused_naming_the_url_way(tmp_path: Path) -> None:
    """Backend review B5: the manager and convert take a root's text; a backend object got
    "a root is a path or URL string" (convert: a raw TypeError). Both name the fix now."""
    from portable_ckpt.convert import convert
    from portable_ckpt.storage import LocalStorage

    store = LocalStorage(str(tmp_path / "r"), create=True)
    with pytest.raises(UsageError, match="register the backend's URL scheme"):
        pckt.CheckpointManager(store, save_every=1)
    with pytest.raises(UsageError, match="register the backend's URL scheme"):
        convert(store, tmp_path / "out", dst_format="hf")


def test_fast_every_without_fast_root_is_refused(tmp_path: Path) -> None:
    """Finding 8: it was accepted and never saved anything."""
    with pytest.raises(UsageError, match=r"fast_every= needs fast_root="):
        pckt.CheckpointManager(str(tmp_path / "r"), fast_every=2)
    assert not (tmp_path / "r").exists()  # refused before anything was touched
    mgr = pckt.CheckpointManager(str(tmp_path / "r"), fast_every=2, fast_root=str(tmp_path / "f"))
    mgr.close()


@pytest.mark.parametrize("spelling", ["same", "slash", "url", "dot"])
def test_fast_root_equal_to_root_is_refused(tmp_path: Path, spelling: str) -> None:
    """Mutation audit B N14 (mut-17): a fast_root naming the durable root (however spelled)
    is refused with PCK-USAGE: both tiers' retention would run on one root, the fast tier's
    keep deleting durable versions."""
    root = tmp_path / "r"
    fast = {
        "same": str(root),
        "slash": str(root) + "/",
        "url": root.as_uri(),
        "dot": str(tmp_path / "." / "r"),
    }[spelling]
    with pytest.raises(UsageError, match="fast_root must differ from root"):
        pckt.CheckpointManager(str(root), save_every=1, fast_every=1, fast_root=fast)


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "3"])
def test_max_failed_saves_must_be_a_positive_int_or_none(tmp_path: Path, bad: object) -> None:
    with pytest.raises(UsageError, match="max_failed_saves must be an int >= 1 or None"):
        pckt.CheckpointManager(
            str(tmp_path),
            save_every=1,
            max_failed_saves=bad,  # type: ignore[arg-type]
        )
    pckt.CheckpointManager(str(tmp_path), save_every=1, max_failed_saves=None).close()


def test_keep_best_without_the_metric_warns_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Finding 7: versions without the metric are never deleted; now the user is told (once)."""
    root = str(tmp_path / "r")
    state = {"w": torch.arange(4.0)}
    with pckt.CheckpointManager(
        root, save_every=1, keep_last=1, keep_best=("loss", 1, "min"), async_save=False
    ) as mgr:
        mgr.maybe_save(1, state, metrics={"loss": 2.0})
        assert "keep_best" not in capsys.readouterr().err
        mgr.maybe_save(2, state, metrics={"acc": 0.5})  # no 'loss'
        mgr.save(3, state)  # no metrics at all
        mgr.maybe_save(4, state, metrics={"loss": float("nan")})
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "keep_best" in line]
    assert len(lines) == 1, err
    assert lines[0].startswith("portable_ckpt: keep_best=('loss', 1, 'min')")
    assert "the save of step 2 carries no finite 'loss' value (metrics given: ['acc'])" in lines[0]
    assert "never deletes such a version" in lines[0]
    # As documented: the unranked versions stay, keep_last=1 notwithstanding.
    assert [v.step for v in portable_ckpt.list_versions(root)] == [1, 2, 3, 4]


def test_stale_optimizer_dict_nested_in_a_dict_is_flagged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Finding 12b: {"train": {"model": msd, "optim": osd}} was not flagged."""
    import logging

    from torch.distributed.checkpoint.state_dict import get_state_dict

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    msd, osd = get_state_dict(model, opt)
    with caplog.at_level(logging.WARNING, logger="portable_ckpt"):
        with pckt.CheckpointManager(str(tmp_path), save_every=1, async_save=False) as mgr:
            mgr.save(1, {"train": {"model": msd, "optim": osd}})
            mgr.save(2, {"train": {"model": msd, "optim": osd}})
            mgr.save(3, {"a": {"b": {"c": {"d": {"optim": osd}}}}})  # deeper than 4: not looked at
    warned = [r.getMessage() for r in caplog.records if "optimizer state dict" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("state['train']['optim'] is an optimizer")


def test_a_job_saving_below_newer_steps_keeps_its_save_and_is_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Operator review: a job that did not restore, in a root holding an earlier run's newer
    steps, had each save deleted by its own keep_last right after the commit, silently."""
    root = str(tmp_path / "r")
    state = {"w": torch.arange(4.0)}
    with pckt.CheckpointManager(root, save_every=1, keep_last=2, async_save=False) as mgr:
        for step in (10, 20, 30):
            mgr.save(step, state)
    capsys.readouterr()
    with pckt.CheckpointManager(root, save_every=1, keep_last=2, async_save=False) as mgr:
        for step in (1, 2, 3):  # a fresh run, no restore()
            mgr.save(step, state)
    steps = [v.step for v in portable_ckpt.list_versions(root)]
    assert 3 in steps and 1 not in steps and {20, 30} <= set(steps)  # its newest save is kept
    said = [line for line in capsys.readouterr().err.splitlines() if "already holds newer" in line]
    assert len(said) == 1 and "step 1" in said[0] and "[20, 30]" in said[0], said
    # a rollback (restore(step=)) says it at the restore; its saves are not told again
    with pckt.CheckpointManager(root, save_every=1, keep_last=2, async_save=False) as mgr:
        mgr.restore(state, step=20)
        mgr.save(21, state)
    err = capsys.readouterr().err
    assert "restored step 20, but this job also holds newer steps [30]" in err
    assert "already holds newer" not in err


def test_a_jobs_own_save_below_newer_steps_committed_by_a_clock_ahead_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """mutation audit 22 B2-30: an earlier run on a host whose clock was an hour ahead left
    newer steps whose commit records are stamped after this job's saves, so no rollback-branch
    rule covers them: a fresh job's save is outside keep_last, and only its own retention's
    "this job's newest save" keeps it (it was deleted right after its commit)."""
    import datetime as dt

    import portable_ckpt.io.commit as commit

    root = str(tmp_path / "r")
    state = {"w": torch.arange(4.0)}
    real = commit.commit_time

    def ahead(storage: Any, attempt_id: str, now: Any = None) -> str:  # the earlier host's clock
        return real(storage, attempt_id, dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))

    with monkeypatch.context() as m:
        m.setattr(commit, "commit_time", ahead)
        with pckt.CheckpointManager(root, save_every=1, keep_last=2, async_save=False,
                                    handle_sigterm=False, continuation="statistical") as mgr:
            for step in (10, 20):
                mgr.save(step, state)
    capsys.readouterr()
    with pckt.CheckpointManager(root, save_every=1, keep_last=2, async_save=False,
                                handle_sigterm=False, continuation="statistical") as mgr:
        mgr.save(3, state)  # a fresh run, no restore()
        assert [v.step for v in portable_ckpt.list_versions(root)] == [3, 10, 20]
    assert "already holds newer" in capsys.readouterr().err


def test_newer_steps_that_failed_verification_are_not_named_as_resumed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Incident review R7: after a restore fell back past damaged steps, the first save said
    "restore() resumes step 12 ... to start afresh, use an empty root", though step 12 had
    failed verification and no restore takes it."""
    from portable_ckpt.io.annotations import write_verification_record
    from portable_ckpt.storage import open_storage

    root = str(tmp_path / "r")
    state = {"w": torch.arange(4.0)}
    with pckt.CheckpointManager(root, save_every=1, keep_last=3, async_save=False) as mgr:
        for step in (10, 20, 30):
            mgr.save(step, state)
    for v in portable_ckpt.list_versions(root):
        if v.step in (20, 30):  # found damaged
            write_verification_record(open_storage(root), v.id, ok=False, mode="deep",
                                      fraction=None, chunks=1, verifier="test",
                                      errors=[{"code": "PCK-CHECKSUM", "message": "x"}])
    capsys.readouterr()
    with pckt.CheckpointManager(root, save_every=1, keep_last=3, async_save=False) as mgr:
        assert mgr.restore(state).step == 10
        mgr.save(11, state)
    assert "already holds newer" not in capsys.readouterr().err
    assert 11 in [v.step for v in portable_ckpt.list_versions(root)]


def test_restore_strict_false_takes_a_seed_without_per_rank_entries(tmp_path: Path) -> None:
    """Operator review: a converted checkpoint has no RNG or data position; the documented seed
    path failed with advice (strict=False) that restore() did not take."""
    seed = tmp_path / "seed"
    portable_ckpt.save_arrays(seed, {"train/w": torch.full((4,), 7.0).numpy()}, step=5)
    state = {"train": {"w": torch.zeros(4)}, "rng": pckt.RNGState()}
    with pckt.CheckpointManager(str(tmp_path / "r"), save_every=1, async_save=False) as mgr:
        with pytest.raises(portable_ckpt.CheckpointError, match="rng"):
            mgr.restore(state, checkpoint=portable_ckpt.open(seed).path)
        info = mgr.restore(state, checkpoint=portable_ckpt.open(seed).path, strict=False)
    assert info is not None and info.missing_keys == ["rng"]
    assert torch.equal(state["train"]["w"], torch.full((4,), 7.0))


def test_a_run_seeded_from_another_runs_version_saves_its_own_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fine-tuning review F1: after ``restore(checkpoint=<another run's step-50 version>)`` a
    fine-tune counting from 1 saved nothing up to step 50, preemption included, silently. The
    seed's step is this job's last save only when the seed is one of its own versions; then a
    rule step below it is said once."""
    from portable_ckpt.io.versions import list_versions

    seed = tmp_path / "seed"
    portable_ckpt.save_arrays(seed, {"w": np.full(4, 7.0, np.float32)}, step=50)
    state = {"w": torch.zeros(4)}
    ft = tmp_path / "ft"
    seed_log = tmp_path / "seed-events.jsonl"
    with pckt.CheckpointManager(str(ft), save_every=5, async_save=False, events=seed_log) as mgr:
        mgr.restore(state, checkpoint=portable_ckpt.open(seed).path)
        assert torch.equal(state["w"], torch.full((4,), 7.0))
        saved = [s for s in range(1, 11) if mgr.maybe_save(s, state)]
        mgr.request_preemption()
        assert mgr.maybe_save(11, state) and mgr.preempted
    assert saved == [5, 10] and [v.step for v in list_versions(str(ft))] == [5, 10, 11]
    assert '"event": "resume"' in seed_log.read_text() and '"step": 50' in seed_log.read_text()
    capsys.readouterr()
    # The job's own version, given explicitly: its step is the last save, as with restore().
    own = next(v for v in list_versions(str(ft)) if v.step == 10)
    with pckt.CheckpointManager(str(ft), save_every=5, async_save=False) as mgr:
        mgr.restore(state, checkpoint=str(ft / own.id))
        assert [s for s in range(1, 11) if mgr.maybe_save(s, state)] == []
    err = capsys.readouterr().err
    assert err.count("step 5 is not saved (save_every): this root's last version is step 10") == 1
    # The root itself, given as checkpoint= (its newest version): the job's own too (review D2)
    log = tmp_path / "events.jsonl"
    with pckt.CheckpointManager(str(ft), save_every=5, async_save=False, events=log) as mgr:
        info = mgr.restore(state, checkpoint=str(ft) + "/")
        assert info is not None and info.step == 11
        assert [s for s in range(1, 12) if mgr.maybe_save(s, state)] == []
        assert mgr.maybe_save(15, state)
    import json

    events = [json.loads(line) for line in log.read_text().splitlines()]
    resumed = [e for e in events if e.get("event") == "resume"]
    assert [e["step"] for e in resumed] == [11], events  # review D3: None after a seed


def test_a_failed_save_never_replaces_the_exception_leaving_the_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The storage breaks under a pending save and the loop raises its own error: the caller
    got the save's StorageError instead (its own only as ``__context__``)."""
    import shutil

    root = tmp_path / "root"
    model = torch.nn.Linear(4, 4)
    state = {"w": model.weight}
    with pytest.raises(ValueError, match="the loop's own error"):
        with pckt.CheckpointManager(str(root), save_every=1) as mgr:
            mgr.save(1, state)
            mgr.wait()  # nothing of the manager's runs in the root now
            shutil.rmtree(root)
            root.write_text("the disk went away")  # the next save cannot write
            mgr.maybe_save(2, state)
            raise ValueError("the loop's own error")
    assert mgr.last_error is not None and mgr.last_error.code == "PCK-STORAGE"
    err = capsys.readouterr().err
    assert "while leaving the manager's block on ValueError" in err and "PCK-STORAGE" in err
    # Without an exception in flight the save's error is still raised by close().
    root.unlink()
    mgr2 = pckt.CheckpointManager(str(root), save_every=1)
    mgr2.save(1, state)
    mgr2.wait()
    shutil.rmtree(root)
    root.write_text("gone")
    mgr2.maybe_save(2, state)
    with pytest.raises(portable_ckpt.CheckpointError):
        mgr2.close()


@pytest.mark.parametrize("bad", ["3", 2.0, -1, True, None])
def test_the_step_is_checked_before_any_collective(tmp_path: Path, bad: object) -> None:
    """``maybe_save("3")`` was a bare TypeError from the policy code."""
    with pckt.CheckpointManager(str(tmp_path / "r"), save_every=1) as mgr:
        for call in (mgr.maybe_save, mgr.save):
            with pytest.raises(UsageError, match="step must be a non-negative int"):
                call(bad, {"w": torch.zeros(1)})  # type: ignore[arg-type]


def test_broadcast_from_rank0_is_refused_before_it_can_hang(tmp_path: Path) -> None:
    """``set_state_dict`` broadcasting from rank 0 while the other ranks were in the load's next
    collective hung until the 30-minute timeout (framework review F9): refused up front."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    model = torch.nn.Linear(2, 2)
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True, broadcast_from_rank0=True)
    with pytest.raises(UsageError, match="broadcast_from_rank0"):
        pckt.ModelOptimizerState(model, torch.optim.SGD(model.parameters()), options=opts)
    pckt.ModelOptimizerState(model, options=StateDictOptions(full_state_dict=True))


def test_restore_names_stored_tensors_the_state_no_longer_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A layer removed since the save: ``strict`` covers the state's keys only (as dcp.load),
    so the restore succeeded without a word (framework review F3); rank 0 now names them."""
    root = str(tmp_path / "r")
    with pckt.CheckpointManager(root, save_every=1) as mgr:
        mgr.save(3, {"model": {"w": torch.ones(2), "gone.weight": torch.ones(3)}})
    state = {"model": {"w": torch.zeros(2)}}
    with pckt.CheckpointManager(root, save_every=1) as mgr:
        info = mgr.restore(state)
    assert info is not None and info.unexpected_keys == ["model/gone.weight"]
    assert torch.equal(state["model"]["w"], torch.ones(2))
    err = capsys.readouterr().err
    assert "1 stored key(s) (tensors and plain values) are in no rank's state" in err
    assert "'model/gone.weight'" in err


_TWO_MANAGERS = """
import os, signal, sys, time
import torch
import portable_ckpt.torch as pckt
a, b = sys.argv[1], sys.argv[2]
state = {"w": torch.ones(4)}
ma = pckt.CheckpointManager(a, save_every=100, async_save=False)
mb = pckt.CheckpointManager(b, save_every=100, async_save=False)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.2)
print(ma.maybe_save(1, state), ma.preempted, mb.maybe_save(1, state), mb.preempted, flush=True)
ma.close()
mb.close()
print(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, flush=True)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(2)
print("still alive", flush=True)
"""


def test_every_open_manager_sees_a_preemption_and_closed_ones_leave_no_handler(
    tmp_path: Path,
) -> None:
    """Async review F12: with two managers only the newest saw a SIGTERM (the first one's
    preemption save was lost); closed in creation order, a closed manager's handler stayed
    installed, swallowed the next SIGTERM and recursed on the one after."""
    import signal
    import subprocess
    import sys

    script = tmp_path / "two.py"
    script.write_text(_TWO_MANAGERS)
    res = subprocess.run([sys.executable, str(script), str(tmp_path / "a"), str(tmp_path / "b")],
                         capture_output=True, text=True, timeout=300)
    lines = res.stdout.split("\n")
    assert lines[0] == "True True True True", (res.stdout, res.stderr)  # both saved
    assert lines[1] == "True", res.stdout  # the process's own disposition is back
    assert res.returncode == -signal.SIGTERM and "still alive" not in res.stdout, res.stderr
    for root in ("a", "b"):
        assert [v.step for v in portable_ckpt.list_versions(tmp_path / root)] == [1]


def test_a_durable_failure_superseded_by_a_commit_does_not_fail_close(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Async review F16: a job whose newest durable save committed exited 1 at close() for an
    earlier failed save (said on stderr when it happened); the fast tier already worked so."""
    import dataclasses

    from portable_ckpt.storage.faults import Fault, FaultyStorage

    state = {"w": torch.ones(4)}
    mgr = pckt.CheckpointManager(str(tmp_path / "r"), save_every=1)
    tier = mgr.tiers["durable"]
    mgr.tiers["durable"] = dataclasses.replace(
        tier, storage=FaultyStorage(tier.storage, [Fault(op="write", path="*/data/*", error="EIO")])
    )
    mgr.maybe_save(1, state)
    for fut in list(mgr._post):
        fut.result()
    assert mgr.last_error is not None and "FAILED" in capsys.readouterr().err
    mgr.tiers["durable"] = tier
    mgr.maybe_save(2, state)
    mgr.close()  # step 2 committed: nothing to raise
    assert mgr.last_error is None
    versions = portable_ckpt.list_versions(tmp_path / "r")
    assert [(v.step, v.status) for v in versions] == [(1, "incomplete"), (2, "committed")]


def test_a_second_sigterm_says_the_process_stops_before_it_does(tmp_path: Path) -> None:
    """Async review F13: a second SIGTERM (a scheduler and torchrun both signal) stopped the
    process without a word while a save could be in flight."""
    import signal
    import subprocess
    import sys

    script = tmp_path / "twice.py"
    script.write_text(
        "import os, signal, sys, time\n"
        "import portable_ckpt.torch as pckt\n"
        "mgr = pckt.CheckpointManager(sys.argv[1], save_every=100)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(0.2)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(5)\n"
        "print('still alive')\n"
    )
    res = subprocess.run([sys.executable, str(script), str(tmp_path / "r")], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == -signal.SIGTERM and "still alive" not in res.stdout
    assert "a second SIGTERM: the process stops now" in res.stderr, res.stderr


def test_retention_never_deletes_this_jobs_attempts_but_removes_older_runs_ones(
    tmp_path: Path,
) -> None:
    """Chaos review F1: with a short grace, the retention after one async save deleted the next
    save's files while its writers wrote them (21 of 60 saves failed, PCK-FILE-MISSING). An
    attempt this job created is never its own retention's; an older run's goes after the grace."""
    from portable_ckpt.io.gc import gc
    from portable_ckpt.io.versions import list_versions
    from portable_ckpt.io.writer import ShardWriter, new_attempt_id
    from portable_ckpt.storage import open_storage

    root = tmp_path / "r"
    portable_ckpt.save_arrays(root, {"w": np.zeros(2)}, step=1)
    storage = open_storage(root)

    def unfinished(attempt: str) -> None:  # a writer that wrote its file and no index yet
        w = ShardWriter(storage, attempt, 0, write_index=False)
        w.add_tensor("w", np.ones(4))
        w.finish()

    stale = "s000000000099-20200101T000000000000Z-00000000000000aa"  # an earlier run's crash
    unfinished(stale)
    state = {"w": torch.arange(4.0)}
    with pckt.CheckpointManager(root, save_every=1, keep_last=1, async_save=False,
                                grace_seconds=0.0) as mgr:
        in_flight = new_attempt_id(7)  # as this job's next save, still being written
        unfinished(in_flight)
        for step in (2, 3):
            mgr.maybe_save(step, state)
    left = {v.id: v.status for v in list_versions(root)}
    assert in_flight in left and left[in_flight] == "incomplete"
    assert stale not in left  # an earlier run's leftover is still cleaned up
    assert sorted(v.step for v in list_versions(root) if v.status == "committed") == [3]
    # The core gc: spare_since leaves it alone too; without it a grace of 0 deletes it.
    rep = gc(root, keep=1, grace_seconds=0.0, spare_since=mgr._started)
    assert in_flight in [g["id"] for g in rep.in_grace] and not rep.abandoned
    assert gc(root, keep=1, grace_seconds=0.0).abandoned == [in_flight]


def test_a_restore_checks_the_files_it_did_not_need_and_records_their_damage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Chaos review F2: a damaged writer index (or an entry the load does not read) left the
    restored version "passed" while a deep verify failed it. The restore goes on from the bytes
    it proved; the rest is checked in the background, said and recorded."""
    from portable_ckpt.io.versions import list_versions

    root = tmp_path / "r"
    state = {"w": torch.arange(4.0), "rng": pckt.RNGState()}
    with pckt.CheckpointManager(root, save_every=1, async_save=False) as mgr:
        for step in (1, 2):
            mgr.maybe_save(step, state)
    newest = max(list_versions(root), key=lambda v: v.step)
    index = next((root / newest.id / "index").iterdir())
    data = bytearray(index.read_bytes())
    data[10] ^= 0xFF  # one flipped byte, the file's size unchanged
    index.write_bytes(bytes(data))
    capsys.readouterr()
    target = {"w": torch.zeros(4), "rng": pckt.RNGState()}
    with pckt.CheckpointManager(root, save_every=100, async_save=False) as mgr:
        info = mgr.restore(target)
        assert info is not None and info.step == 2 and target["w"].tolist() == [0, 1, 2, 3]
    err = capsys.readouterr().err
    assert "files the restore did not need are damaged" in err and "PCK-CHECKSUM" in err
    by_step = {v.step: v for v in list_versions(root)}
    assert by_step[2].verification_failed and not by_step[1].verification_failed
    with pckt.CheckpointManager(root, save_every=100, async_save=False) as mgr:
        again = mgr.restore({"w": torch.zeros(4), "rng": pckt.RNGState()})
        assert again is not None and again.step == 1  # never chosen again (R-DRILL-8)


@pytest.mark.parametrize("replace", ["declared", "symlink"])
def test_the_background_check_is_bounded_by_bytes_present_and_a_link_is_damage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], replace: str
) -> None:
    """Attack review 2 F3, F9. A record that declares files of 1 GiB (with 1 GiB blocks) that
    are not there made the background check after a restore allocate 1 GiB per file, kept alive
    by the errors' tracebacks, until the process was OOM-killed; now the size is asked first.
    A listed file replaced by a symlink (readers never follow one) went unnoticed, while a FIFO
    or a directory in its place was damage; it is damage too."""
    import json
    import resource

    from portable_ckpt.io.versions import list_versions

    root = tmp_path / "r"
    state = {"w": torch.arange(4.0), "rng": pckt.RNGState()}
    with pckt.CheckpointManager(root, save_every=1, async_save=False) as mgr:
        mgr.maybe_save(1, state)
    vdir = next(root.iterdir())
    if replace == "declared":
        record = json.loads((vdir / "manifest.json").read_text())
        for i in range(8):  # 8 GiB declared, nothing there
            record["files"][f"index/w{i + 1:05d}.json"] = {"size": 1 << 30, "checksum": {
                "algorithm": "crc32c", "block_size": 1 << 30, "blocks": "00000000"}}
        (vdir / "manifest.json").write_text(json.dumps(record))
        code = "PCK-FILE-MISSING"
    else:
        index = next((vdir / "index").iterdir())
        moved = tmp_path / "elsewhere.json"
        index.rename(moved)
        index.symlink_to(moved)
        code = "PCK-PATH-UNSAFE"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    capsys.readouterr()
    target = {"w": torch.zeros(4), "rng": pckt.RNGState()}
    with pckt.CheckpointManager(root, save_every=100, async_save=False) as mgr:
        info = mgr.restore(target)
        assert info is not None and info.step == 1 and target["w"].tolist() == [0, 1, 2, 3]
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
    assert grown_mib < 256, f"peak RSS grew by {grown_mib:.0f} MiB"
    err = capsys.readouterr().err
    assert "files the restore did not need are damaged" in err and code in err
    assert list_versions(root)[0].verification_failed


def test_save_every_seconds_survives_a_clock_stepped_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Multi-job review F9: the interval was measured on the wall clock; an NTP step back of an
    hour stopped time-based saves for an hour. Intervals are monotonic now."""
    import time

    real = time.time
    with pckt.CheckpointManager(tmp_path / "r", save_every_seconds=0.2, async_save=False) as mgr:
        saved = []
        for step in range(1, 41):
            if step == 3:
                monkeypatch.setattr(time, "time", lambda: real() - 3600.0)
            if mgr.maybe_save(step, {"w": torch.ones(2)}):
                saved.append(step)
            time.sleep(0.05)
    assert len(saved) >= 4, saved


def test_retention_that_cannot_delete_says_so_and_the_manager_keeps_no_backlog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Multi-job review F14: a version retention could not delete was said nowhere (the event
    said ok). Soak review F3, F4: the event history and the list of post-save futures grew by
    every save of the job."""
    from portable_ckpt.errors import StorageError
    from portable_ckpt.manager.telemetry import HISTORY_KEPT
    from portable_ckpt.storage.local import LocalStorage

    real = LocalStorage.delete_prefix
    stuck: list[str] = []

    def delete_prefix(self: LocalStorage, prefix: str) -> None:
        if stuck and prefix.startswith(stuck[0]):
            raise StorageError(f"delete {prefix!r}: Permission denied (errno 13)", path=prefix)
        real(self, prefix)

    monkeypatch.setattr(LocalStorage, "delete_prefix", delete_prefix)
    with pckt.CheckpointManager(tmp_path / "r", save_every=1, keep_last=1,
                                async_save=False) as mgr:
        mgr.maybe_save(1, {"w": torch.ones(2)})
        stuck.append(mgr.telemetry.history[-1].get("checkpoint_id") or next(
            e["checkpoint_id"] for e in reversed(mgr.telemetry.history) if "checkpoint_id" in e))
        for step in range(2, 30):
            mgr.maybe_save(step, {"w": torch.ones(2)})
        assert len(mgr._post) <= 2
        events = [e for e in mgr.telemetry.history if e["event"] == "retention"]
    bad = [e for e in events if not e["ok"]]
    assert bad and all(e["failed"][0]["id"] == stuck[0] for e in bad)
    assert all(len(e["kept"]) == e["kept_count"] for e in events)
    err = capsys.readouterr().err
    assert err.count(f"retention could not delete {stuck[0]}") == 1
    for i in range(3 * HISTORY_KEPT):
        mgr.telemetry.emit("x", i=i)
    assert len(mgr.telemetry.history) <= 2 * HISTORY_KEPT
    assert mgr.telemetry.history[-1]["i"] == 3 * HISTORY_KEPT - 1


def test_a_restore_that_passes_over_a_newer_foreign_version_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Multi-job review F6: after an image rollback, a newer library's version is foreign and
    skipped (R-COMMIT-1); the job resumed an older step with nothing on stderr."""
    import json

    from portable_ckpt.io.versions import list_versions

    root = tmp_path / "r"
    with pckt.CheckpointManager(root, save_every=1, async_save=False) as mgr:
        for step in (2, 3):
            mgr.maybe_save(step, {"w": torch.full((2,), float(step))})
    newest = max(list_versions(root), key=lambda v: v.step)
    record = root / newest.id / "manifest.json"
    doc = json.loads(record.read_text())
    doc["format_version"] = "2.0"
    record.write_text(json.dumps(doc))
    capsys.readouterr()
    target = {"w": torch.zeros(2)}
    with pckt.CheckpointManager(root, save_every=100, async_save=False) as mgr:
        info = mgr.restore(target)
    assert info is not None and info.step == 2
    err = capsys.readouterr().err
    assert "1 newer version(s) were written by a format version this library does not read" in err
    assert newest.id in err


def test_close_waits_for_the_copy_callbacks_and_their_retention(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Race review F1: ``wait()`` woke when a replication copy ended, before its callback had
    queued the retention passes; ``close()`` then shut the pool down under the callback
    ("cannot schedule new futures after shutdown") and keep_last=1 kept two versions."""
    import logging
    import sys
    import time

    import portable_ckpt.io.copy as pcopy

    real = pcopy.copy_version

    def slow(src: Any, dst: Any, **kw: Any) -> Any:
        time.sleep(0.02)
        return real(src, dst, **kw)

    monkeypatch.setattr(pcopy, "copy_version", slow)
    caplog.set_level(logging.ERROR, logger="concurrent.futures")
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads interleave as on a loaded host
    try:
        for i in range(8):
            root = tmp_path / f"r{i}"
            m = pckt.CheckpointManager(root / "durable", fast_root=root / "fast",
                                       replicate=True, save_every=1, keep_last=1,
                                       handle_sigterm=False, continuation="statistical")
            for s in (1, 2, 3):
                m.maybe_save(s, {"w": torch.arange(16.0)})
                m.wait()
            m.maybe_save(4, {"w": torch.arange(16.0)})
            m.close()
            steps = [v.step for v in portable_ckpt.list_versions(root / "durable")]
            assert steps == [4], (i, steps)
    finally:
        sys.setswitchinterval(switch)
    assert "cannot schedule new futures" not in caplog.text


class _Interrupted:
    """A stateful object whose state_dict is interrupted by Ctrl-C."""

    def state_dict(self) -> dict[str, Any]:
        raise KeyboardInterrupt

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        raise KeyboardInterrupt


@pytest.mark.parametrize("mode", ["sync", "thread", "process"])
def test_ctrl_c_during_a_save_stops_the_loop(tmp_path: Path, mode: str) -> None:
    """Race review F3: a KeyboardInterrupt while the state was gathered became a background
    "FAILED" line (async) or a PCK-DISTRIBUTED error (sync), and training went on."""
    kw: dict[str, Any] = {"async_save": False} if mode == "sync" else {"async_mode": mode}
    with pckt.CheckpointManager(tmp_path, save_every=1, handle_sigterm=False,
                                continuation="statistical", **kw) as mgr:
        with pytest.raises(KeyboardInterrupt):
            mgr.maybe_save(1, {"m": _Interrupted(), "w": torch.zeros(2)})
        mgr.maybe_save(2, {"w": torch.zeros(2)})  # the manager still works
    assert [v.step for v in portable_ckpt.list_versions(tmp_path)] == [2]


def test_a_process_forked_under_an_open_manager_dies_by_its_first_sigterm(tmp_path: Path) -> None:
    """Race review F6: a child forked while a manager was open inherited its SIGTERM handler
    and swallowed the first SIGTERM (it only set a flag of a manager the child never polls)."""
    import multiprocessing as mp
    import signal
    import time

    with pckt.CheckpointManager(tmp_path, save_every=100) as mgr:
        assert mgr._preemption.signals == [signal.SIGTERM]
        child = mp.get_context("fork").Process(target=time.sleep, args=(30,))
        child.start()
        time.sleep(0.3)
        child.terminate()  # SIGTERM
        child.join(10)
        assert child.exitcode == -signal.SIGTERM


def test_an_infinite_decision_interval_is_the_largest_gap(tmp_path: Path) -> None:
    """Review of the change D4: decision_interval=inf was accepted, then every maybe_save after
    the first raised OverflowError."""
    import math

    with pckt.CheckpointManager(tmp_path, save_every=3, decision_interval=math.inf,
                                handle_sigterm=False, continuation="statistical") as mgr:
        saved = [s for s in range(1, 8) if mgr.maybe_save(s, {"w": torch.zeros(2)})]
    assert saved == [3, 6]


def test_pin_kept_pins_the_best_and_the_milestones_against_a_platform_gc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Multi-job review F7 (spec §15.3): a platform's `gc --keep 2` deleted the manager's best
    and milestone versions. With pin_kept they are pinned; a best that is beaten is unpinned
    and deleted by the manager's own retention; an operator's pin is never removed."""
    from portable_ckpt.cli.main import main as cli_main
    from portable_ckpt.io.pins import pin, read_pins
    from portable_ckpt.manager.pinning import MANAGER_PIN_BY

    root = str(tmp_path / "r")
    state = {"w": torch.arange(4.0)}
    losses = {1: 5.0, 2: 0.5, 3: 4.0, 4: 3.0, 5: 2.9, 6: 2.8}
    with pytest.raises(UsageError, match="pin_kept"):
        pckt.CheckpointManager(root, save_every=1, keep_last=2, pin_kept=True)
    with pckt.CheckpointManager(root, save_every=1, keep_last=2, keep_every=4,
                                keep_best=("loss", 1, "min"), pin_kept=True,
                                async_save=False) as mgr:
        for step, loss in losses.items():
            mgr.maybe_save(step, state, metrics={"loss": loss})
        ids = {v.step: v.id for v in portable_ckpt.list_versions(root)}
        pin(root, ids[5], by="alice")  # an operator's own pin
    assert sorted(ids) == [2, 4, 5, 6]
    by_manager = {aid for aid, recs in read_pins(root).items()
                  if any(r.get("by") == MANAGER_PIN_BY for r in recs)}
    assert by_manager == {ids[2], ids[4]}  # the best loss and the milestone
    assert cli_main(["gc", root, "--keep", "1"]) == 0  # the platform's cron
    capsys.readouterr()
    assert sorted(v.step for v in portable_ckpt.list_versions(root)) == [2, 4, 5, 6]
    # A new best: the manager unpins step 2 (its own pin) and its retention deletes it;
    # alice's pin of step 5 stays.
    with pckt.CheckpointManager(root, save_every=1, keep_last=2, keep_every=4,
                                keep_best=("loss", 1, "min"), pin_kept=True,
                                async_save=False) as mgr:
        mgr.maybe_save(7, state, metrics={"loss": 0.1})
    pinned = read_pins(root)
    steps = {v.id: v.step for v in portable_ckpt.list_versions(root)}
    assert sorted(steps.values()) == [4, 5, 6, 7]
    assert {steps[a] for a in pinned} == {4, 5, 7}
    assert [r["by"] for r in pinned[ids[5]]] == ["alice"]
    # On-call review 23, F7: a relaunch without pin_kept leaves the manager's pins (removing
    # them would let this retention delete the milestones at once) and says so, once.
    capsys.readouterr()
    with pckt.CheckpointManager(root, save_every=1, keep_last=1, async_save=False) as mgr:
        mgr.maybe_save(8, state, metrics={"loss": 0.2})
        mgr.maybe_save(9, state, metrics={"loss": 0.3})
    err = capsys.readouterr().err
    assert err.count("2 version(s) stay pinned by an earlier run's pin_kept=True") == 1, err
    assert "portable-ckpt unpin" in err and ids[4] in err
    assert {steps.get(a) for a in read_pins(root)} == {4, 5, 7}


@pytest.mark.parametrize("pin_kept", [False, True])
def test_retention_held_by_unreadable_pins_is_said_and_not_ok(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], pin_kept: bool
) -> None:
    """Attack review 5 F5: with the root's `pins` a symbolic link (pins cannot be read, so gc
    deletes no committed version, R-GC-11), every retention event said ok and nothing was
    said while every version stayed: the disk filled."""
    import json

    root = tmp_path / "r"
    root.mkdir()
    (tmp_path / "shared").mkdir()
    (root / "pins").symlink_to(tmp_path / "shared")
    events = tmp_path / "events.jsonl"
    policy: dict[str, Any] = {"pin_kept": True, "keep_every": 100} if pin_kept else {}
    with pckt.CheckpointManager(str(root), save_every=1, keep_last=2, async_save=False,
                                events=str(events), continuation="statistical",
                                **policy) as mgr:
        for step in range(1, 5):
            mgr.maybe_save(step, {"w": torch.arange(4.0)})
    assert [v.step for v in portable_ckpt.list_versions(root)] == [1, 2, 3, 4]
    ret = [e for e in map(json.loads, events.read_text().splitlines())
           if e["event"] == "retention"]
    assert ret and all(not e["ok"] and e["held"][0]["code"] == "PCK-PATH-UNSAFE" for e in ret)
    err = capfd.readouterr().err
    assert err.count("retention deletes no committed version while the root's pins") == 1


def test_retention_whose_pins_cannot_be_written_is_not_ok(tmp_path: Path) -> None:
    """mutation audit 22 B2-36: with pin_kept, a pass whose pins could not be written (the
    root's `pins` directory refuses new records) still deleted by the policy, and its event
    said ok: the milestone it meant to pin was open to the next platform gc."""
    import dataclasses
    import json

    from portable_ckpt.io.pins import read_pins
    from portable_ckpt.storage.faults import Fault, FaultyStorage

    root, events = tmp_path / "r", tmp_path / "events.jsonl"
    with pckt.CheckpointManager(str(root), save_every=1, keep_last=1, keep_every=2,
                                pin_kept=True, async_save=False, events=str(events),
                                continuation="statistical") as mgr:
        tier = mgr.tiers["durable"]
        mgr.tiers["durable"] = dataclasses.replace(tier, storage=FaultyStorage(
            tier.storage, [Fault(op="create", path="pins/*", error="EACCES")]))
        for step in (1, 2):
            mgr.maybe_save(step, {"w": torch.arange(4.0)})
    assert not read_pins(str(root))  # the milestone (step 2) could not be pinned
    ret = [e for e in map(json.loads, events.read_text().splitlines())
           if e["event"] == "retention"]
    last = ret[-1]
    assert last["pin_error"]["code"] and "pinned" not in last, last
    assert last["ok"] is False, last


def test_a_bit_flipped_while_the_post_save_verification_opens_a_table_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack review 4 A5: damage met while the sampled verification *opened* the version (the
    tensor table of a large job) skipped the second look: one bit flipped in transit recorded
    an intact version as failed for good, and restore() resumed the step before."""
    import threading

    import portable_ckpt.torch._manager_post as post
    import portable_ckpt.torch.saving as saving
    from portable_ckpt.storage.local import LocalStorage

    monkeypatch.setattr(saving, "TABLE_THRESHOLD", 0)  # tables, as a job of > 65,536 pieces
    armed, flips = threading.Event(), []
    real_read = LocalStorage.read_extents

    def flaky(self: Any, path: str, extents: Any) -> Any:
        out = real_read(self, path, extents)
        if armed.is_set() and "tensor-table" in path and not flips:
            buf = extents[0][1][-1]
            mv = buf.cast("B") if buf.format != "B" else buf
            mv[len(mv) // 2] ^= 0x10  # one bit flipped on its way
            flips.append(path)
        return out

    monkeypatch.setattr(LocalStorage, "read_extents", flaky)
    real_verify = post.verify

    def verify_step_2(mgr: Any, tier: Any, attempt: str) -> Any:
        if attempt.startswith("s000000000002"):
            armed.set()
        try:
            return real_verify(mgr, tier, attempt)
        finally:
            armed.clear()

    monkeypatch.setattr(post, "verify", verify_step_2)
    root = str(tmp_path / "r")
    with pckt.CheckpointManager(root, save_every=1, keep_last=1, verify_sample=1.0,
                                async_save=False, continuation="statistical",
                                handle_sigterm=False) as mgr:
        for step in (1, 2):
            mgr.maybe_save(step, {"w": torch.arange(1000.0) * step})
    assert flips, "the fault was never injected"
    [v] = [v for v in portable_ckpt.list_versions(root) if v.step == 2]
    assert not v.verification_failed and not v.verifications
    state = {"w": torch.zeros(1000)}
    with pckt.CheckpointManager(root, handle_sigterm=False, continuation="statistical") as m:
        assert m.restore(state).step == 2
    assert torch.equal(state["w"], torch.arange(1000.0) * 2)


def test_model_optimizer_state_takes_several_optimizers_and_resumes_exactly(
    tmp_path: Path,
) -> None:
    """Integrator review F2: ModelOptimizerState(model, [opt_a, opt_b]) (one model, two
    optimizers over disjoint parameters) crashed every save with AttributeError. Saved at step
    0 (no optimizer state yet) and later, it resumes to the same numbers as a run never stopped."""
    def build() -> tuple[Any, Any, Any]:
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        return m, torch.optim.AdamW(m[0].parameters(), lr=0.01), \
            torch.optim.SGD(m[1].parameters(), lr=0.1, momentum=0.9)

    def train(m: Any, opts: Any, steps: range) -> None:
        for s in steps:
            x = torch.full((3, 4), float(s))
            loss = m(x).square().mean()
            loss.backward()
            for o in opts:
                o.step()
                o.zero_grad()

    root = str(tmp_path / "r")
    m, a, b = build()
    with pckt.CheckpointManager(root, async_save=False, handle_sigterm=False) as mgr:
        mgr.save(0, {"train": pckt.ModelOptimizerState(m, [a, b])})
        assert not a.state and not b.state  # saving made no state of its own
        train(m, (a, b), range(1, 4))
        mgr.save(3, {"train": pckt.ModelOptimizerState(m, (a, b))})
    train(m, (a, b), range(4, 7))
    for at, start in ((0, 1), (3, 4)):
        m2, a2, b2 = build()
        with pckt.CheckpointManager(root, handle_sigterm=False) as mgr:
            info = mgr.restore({"train": pckt.ModelOptimizerState(m2, [a2, b2])},
                               step=at)
        assert info.step == at
        train(m2, (a2, b2), range(start, 7))
        for p, q in zip(m.parameters(), m2.parameters(), strict=True):
            assert torch.equal(p, q), at
    with pytest.raises(UsageError, match="list of them"):
        pckt.ModelOptimizerState(m, [a, "not an optimizer"])


@pytest.mark.parametrize("kind", ["copies", "drills", "verifications"])
def test_only_unreadable_verification_records_stop_a_restore(tmp_path: Path, kind: str) -> None:
    """Attack review 4 A4: a copy (or drill) record of a newer major format version beside the
    newest version stopped every restart and `ls --latest` ("retry", which never helped),
    though those records do not decide what is restored. A verification record still does:
    R-DRILL-12, a record of a newer MAJOR that names the version makes its status unknown, and
    the restore neither takes it nor an older version."""
    import json
    import subprocess
    import sys

    root = tmp_path / "r"
    for step in (1, 2):
        pckt.save({"w": torch.arange(4.0) + step}, str(root), step=step,
                  continuation="statistical")
    [v] = sorted(root.glob("s000000000002-*"))
    letter, id_member = {"copies": ("c", "copy_id"), "drills": ("d", "drill_id"),
                         "verifications": ("v", "verification_id")}[kind]
    rid = f"{letter}20261204T131003962047Z-a8af8db4"
    (v / kind).mkdir()
    (v / kind / f"{rid}.json").write_text(json.dumps({
        "format": f"portable-ckpt-{'copy' if kind == 'copies' else kind[:-1]}",
        "format_version": "2.0", "attempt_id": v.name, id_member: rid}))
    p = subprocess.run([sys.executable, "-m", "portable_ckpt", "ls", "--latest", str(root)],
                       capture_output=True, text=True, timeout=60)
    state = {"w": torch.zeros(4)}
    with pckt.CheckpointManager(str(root), handle_sigterm=False) as m:
        if kind == "verifications":  # it may say the version failed: nothing is decided
            with pytest.raises(portable_ckpt.CheckpointError, match="verifications records"):
                m.restore(state)
            # cannot tell; a newer format is mended by an upgrade, not by waiting (SRE S2)
            assert p.returncode == 69 and "could not be read" in p.stderr, p
            return
        assert m.restore(state).step == 2
    assert p.returncode == 0 and p.stdout.strip() == str(v), p
    [listed] = [x for x in portable_ckpt.list_versions(root) if x.step == 2]
    assert listed.annotations_unreadable and not listed.known  # gc stays careful


def test_a_parameter_without_optimizer_state_when_saved_restores_exactly(tmp_path: Path) -> None:
    """Integrator review F8: a parameter that had no gradient yet when saved (an unused branch,
    an expert not routed yet) has no optimizer state in the version, but a fresh optimizer's
    template has: every restore failed with PCK-TENSOR-MISSING. Now the fresh state stays and
    the resumed run equals one never stopped; a real gap still fails.

    The gap is a stored parameter with part of its state missing, in a real optimizer's
    template (``param_groups`` beside ``state``): AdamW switched to ``amsgrad=True`` wants
    ``max_exp_avg_sq``, which no stored parameter has. Test audit 21b, L13: this clause used a
    dict without ``param_groups``, refused as no optimizer at all (review F5), so the rule
    that a parameter with some state stored is no fresh state could go with the suite green,
    and such a restore kept the zero ``max_exp_avg_sq`` and reported success."""

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)

        def forward(self, x: Any, step: int) -> Any:  # b is used from step 5 on
            return self.b(self.a(x)) if step >= 5 else self.a(x)

    def make() -> tuple[Any, Any, dict[str, Any]]:
        torch.manual_seed(0)
        m = M()
        o = torch.optim.AdamW(m.parameters(), lr=0.1)
        return m, o, {"train": pckt.ModelOptimizerState(m, o), "rng": pckt.RNGState()}

    def step(m: Any, o: Any, i: int) -> None:
        o.zero_grad()
        m(torch.randn(2, 3), i).pow(2).sum().backward()
        o.step()

    root = str(tmp_path / "r")
    m, o, st = make()
    for i in (1, 2):
        step(m, o, i)
    assert len(o.state) == 2  # a's weight and bias only
    with pckt.CheckpointManager(root, async_save=False, handle_sigterm=False) as mgr:
        mgr.save(2, st)
    for i in range(3, 7):
        step(m, o, i)
    m2, o2, st2 = make()
    with pckt.CheckpointManager(root, handle_sigterm=False) as mgr:
        info = mgr.restore(st2)
    assert info.missing_keys == [] and sorted(info.fresh_optimizer_state) == sorted(
        f"train/optim/state/b.{p}/{s}" for p in ("weight", "bias")
        for s in ("step", "exp_avg", "exp_avg_sq"))
    for i in range(3, 7):
        step(m2, o2, i)
    assert all(torch.equal(p, q) for p, q in zip(m.parameters(), m2.parameters(), strict=True))
    # A parameter with part of its state missing is no fresh state: refused as before, by
    # the manager too (b's state, which the version lacks as a whole, is not what fails).
    m3 = M()
    o3 = torch.optim.AdamW(m3.parameters(), lr=0.1, amsgrad=True)
    with pckt.CheckpointManager(root, handle_sigterm=False) as mgr, pytest.raises(
        TensorMissingError, match=r"'train/optim/state/a\.weight/max_exp_avg_sq' is in the target"
    ):
        mgr.restore({"train": pckt.ModelOptimizerState(m3, o3)})


def test_a_0d_tensor_metric_ranks_keep_best_without_a_false_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Integrator review F7: metrics={"loss": torch.tensor(x)} was stored and ranked, but the
    warning said the save carried no finite 'loss' value."""
    root = str(tmp_path / "r")
    with pckt.CheckpointManager(root, save_every=1, keep_last=1, keep_best=("loss", 1, "min"),
                                async_save=False, handle_sigterm=False) as mgr:
        for step, loss in enumerate((3.0, 0.5, 2.0, 4.0), start=1):
            mgr.maybe_save(step, {"w": torch.arange(4.0)}, metrics={"loss": torch.tensor(loss)})
    assert "keep_best" not in capsys.readouterr().err
    assert [v.step for v in portable_ckpt.list_versions(root)] == [2, 4]


def test_replicated_durable_saves_go_direct_while_the_fast_tier_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """SRE review F4: with replicate=True every durable save went to the fast tier first, so a
    full fast disk failed every durable checkpoint and stopped the job (max_failed_saves), the
    durable root healthy. While fast saves fail, durable saves now go to the durable root."""
    from portable_ckpt.errors import StorageError
    from portable_ckpt.storage.local import LocalStorage

    fast = str(tmp_path / "fast")
    real = LocalStorage.open_writer

    def full_from_step_3(self: Any, path: str, **kw: Any) -> Any:
        if self.root.startswith(fast) and int(path[1:13]) >= 3:
            raise StorageError(f"write {path}: No space left on device (errno 28) [injected]",
                               path=path)
        return real(self, path, **kw)

    monkeypatch.setattr(LocalStorage, "open_writer", full_from_step_3)
    root = str(tmp_path / "durable")
    with pckt.CheckpointManager(root, fast_root=fast, replicate=True, save_every=2,
                                fast_every=1, max_failed_saves=2, continuation="statistical",
                                handle_sigterm=False) as mgr:
        for step in range(1, 11):
            mgr.maybe_save(step, {"w": torch.arange(4.0) * step})
            with contextlib.suppress(portable_ckpt.CheckpointError):
                mgr.wait()  # the failure is known before the next step (a fast save failed)
    durable = [v.step for v in portable_ckpt.list_versions(root) if v.status == "committed"]
    assert durable == [2, 4, 6, 8, 10], durable
    err = capsys.readouterr().err
    assert "to the fast tier FAILED" in err and "durable checkpoint(s) failed" in err


def test_keys_a_fallback_lacks_but_a_failed_candidate_held_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SRE review F7: a restore (strict=False) that fell back from a damaged newer version to
    one without a key left that key as the failed partial load wrote it (another step's values
    on some ranks) and said nothing: LoadInfo.missing_keys made it look fresh everywhere."""
    root = str(tmp_path / "r")
    with pckt.CheckpointManager(root, async_save=False, handle_sigterm=False,
                                continuation="statistical") as mgr:
        mgr.save(1, {"w": torch.arange(4.0)})
        mgr.save(2, {"w": torch.arange(4.0) * 2, "e": torch.ones(1000)})
    [v2] = [v for v in portable_ckpt.list_versions(root) if v.step == 2]
    [shard] = Path(v2.path).glob("data/*.safetensors")
    data = bytearray(shard.read_bytes())
    data[-8:] = b"\xff" * 8  # a bad sector at the end of the shard
    shard.write_bytes(bytes(data))
    state = {"w": torch.zeros(4), "e": torch.zeros(1000)}
    with pckt.CheckpointManager(root, handle_sigterm=False) as mgr:
        info = mgr.restore(state, strict=False)
    assert info.step == 1 and info.missing_keys == ["e"] and info.left_from_failed == ["e"]
    err = capsys.readouterr().err
    assert "failed part way" in err and "'e'" in err and "LoadInfo.left_from_failed" in err


@pytest.mark.parametrize("warm_up", ["none", "zeroed grads", "pending grads"])
def test_gradients_before_restore_do_not_hide_the_optimizer_state(
    tmp_path: Path, warm_up: str
) -> None:
    """Integrator review F15: with a gradient on any parameter before restore() (a warm-up
    backward, zero_grad(set_to_none=False)), get_state_dict made no optimizer state for the
    template: the restore reported success and loaded none of the saved AdamW state."""
    def make() -> tuple[Any, Any, dict[str, Any]]:
        torch.manual_seed(0)
        m = torch.nn.Linear(3, 2)
        o = torch.optim.AdamW(m.parameters(), lr=0.1)
        return m, o, {"train": pckt.ModelOptimizerState(m, o)}

    root = str(tmp_path / "r")
    m, o, st = make()
    for _ in range(3):
        o.zero_grad()
        m(torch.ones(2, 3)).sum().backward()
        o.step()
    with pckt.CheckpointManager(root, async_save=False, handle_sigterm=False) as mgr:
        mgr.save(3, st)
    m2, o2, st2 = make()
    if warm_up != "none":
        m2(torch.ones(2, 3)).sum().backward()
        if warm_up == "zeroed grads":
            o2.zero_grad(set_to_none=False)
    grads = [None if p.grad is None else p.grad.clone() for p in m2.parameters()]
    with pckt.CheckpointManager(root, handle_sigterm=False) as mgr:
        info = mgr.restore(st2)
    assert info.unexpected_keys == []
    assert [float(s["step"]) for s in o2.state.values()] == [3.0, 3.0]
    for p, q in zip(o.state.values(), o2.state.values(), strict=True):
        assert torch.equal(p["exp_avg"], q["exp_avg"])
    for p, g in zip(m2.parameters(), grads, strict=True):  # the gradients are given back
        assert (p.grad is None and g is None) or torch.equal(p.grad, g)


def test_full_state_dict_with_cpu_offload_is_refused_with_the_reason() -> None:
    """Integrator review F14: both options give the state to rank 0 only; every save then
    failed with a conflict that spoke of DTensors."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    with pytest.raises(UsageError, match="rank 0 only"):
        pckt.ModelOptimizerState(torch.nn.Linear(2, 2), options=StateDictOptions(
            full_state_dict=True, cpu_offload=True))


def test_a_start_from_scratch_beside_uncommitted_attempts_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SRE review F5: with only an incomplete attempt of step 20 left (a copy killed part way),
    restore() returned None without a word and the job started at step 1."""
    from portable_ckpt.io.writer import ShardWriter, new_attempt_id

    root = tmp_path / "r"
    aid = new_attempt_id(20)
    from portable_ckpt.storage import open_storage

    w = ShardWriter(open_storage(str(root), create=True), aid, 0)
    w.add_tensor("w", np.zeros(4, np.float32))
    w.finish()  # its files, no commit record
    with pckt.CheckpointManager(str(root), handle_sigterm=False) as mgr:
        assert mgr.restore({"w": torch.zeros(4)}) is None
    err = capsys.readouterr().err
    assert "starting from scratch" in err and "step 20, incomplete" in err and aid in err


@pytest.mark.parametrize("keep", [2, 3])
def test_after_a_rollback_the_managers_keep_last_keeps_n_of_the_new_branch(
    tmp_path: Path, keep: int
) -> None:
    """Docs review F12: counted by step, the abandoned step 20 took one of keep_last's places:
    keep_last=2 left the new branch a single version, where gc --keep 2 keeps two."""
    root = str(tmp_path / "r")
    t = {"w": torch.ones(4)}
    with pckt.CheckpointManager(root, save_steps=[5, 10, 20], keep_last=3, async_save=False,
                                handle_sigterm=False) as m:
        for s in (5, 10, 20):
            m.maybe_save(s, t)
    with pckt.CheckpointManager(root, save_every=1, keep_last=keep, async_save=False,
                                handle_sigterm=False) as m:
        assert m.restore(t, step=10).step == 10
        for s in range(11, 16):
            m.maybe_save(s, t)
            m.wait()
    steps = sorted(v.step for v in portable_ckpt.list_versions(root) if v.status == "committed")
    branch = [s for s in steps if 10 < s < 20]
    assert branch == list(range(16 - keep, 16)) and 20 in steps, steps


def test_a_state_shaped_dict_that_is_no_optimizer_keeps_strict(tmp_path: Path) -> None:
    """Review of the change F5: the fresh-optimizer-state rule went by key shape alone, and a
    real gap in any {"state": {x: {...}}} dict passed strict=True silently."""
    root = str(tmp_path / "r")
    pckt.save({"env": {"state": {"agent0": {"h": torch.ones(2)}}}}, root, step=1)
    target = {"env": {"state": {"agent0": {"h": torch.zeros(2)},
                                "agent1": {"h": torch.full((2,), 7.0)}}}}
    with pytest.raises(portable_ckpt.CheckpointError, match="agent1"):
        pckt.load(target, root)


def test_the_fast_tier_is_tried_again_after_a_transient_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review of the change F2: with replicate=True and no fast-only saves, one transient
    fast-tier failure sent every later durable save around the fast tier for good."""
    from portable_ckpt.errors import StorageError
    from portable_ckpt.storage.local import LocalStorage

    fast = str(tmp_path / "fast")
    real = LocalStorage.open_writer

    def fails_at_step_2(self: Any, path: str, **kw: Any) -> Any:
        if self.root.startswith(fast) and int(path[1:13]) == 2:
            raise StorageError(f"write {path}: Input/output error [injected]", path=path)
        return real(self, path, **kw)

    monkeypatch.setattr(LocalStorage, "open_writer", fails_at_step_2)
    root = str(tmp_path / "durable")
    with pckt.CheckpointManager(root, fast_root=fast, replicate=True, save_every=1,
                                fast_keep=20, continuation="statistical",
                                handle_sigterm=False) as mgr:
        for step in range(1, 13):
            mgr.maybe_save(step, {"w": torch.arange(4.0) * step})
            with contextlib.suppress(portable_ckpt.CheckpointError):
                mgr.wait()
    on_fast = [v.step for v in portable_ckpt.list_versions(fast) if v.status == "committed"]
    durable = [v.step for v in portable_ckpt.list_versions(root) if v.status == "committed"]
    assert on_fast[0] == 1 and on_fast[-1] == 12 and 3 not in on_fast, on_fast
    assert durable == [1, *range(3, 13)], durable


def test_a_second_manager_on_the_root_is_named_and_its_restore_sees_the_first_ones_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Notebook review F3: a setup cell run again made a second manager on the root while the
    first one's async save was in flight; its restore listed the root before that save
    committed and answered None (the loop restarted at step 1), and nothing was said."""
    import time

    import portable_ckpt.torch.saving as saving

    real = saving.RankWrite.__call__

    def slow(self: Any) -> Any:
        time.sleep(0.5)  # the write phase of the first manager's save is still running
        return real(self)

    monkeypatch.setattr(saving.RankWrite, "__call__", slow)
    state = {"w": torch.arange(4.0)}
    first = pckt.CheckpointManager(tmp_path, save_every=1, continuation="statistical")
    try:
        first.maybe_save(2, state)
        second = pckt.CheckpointManager(tmp_path, save_every=1, continuation="statistical")
        try:
            assert "another CheckpointManager on" in capsys.readouterr().err
            info = second.restore({"w": torch.zeros(4)})
            assert info is not None and info.step == 2
        finally:
            second.close()
    finally:
        first.close()


def test_saving_a_step_again_is_said_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Notebook review F4: a cell run again saved step 2 twice, two committed versions, the
    later one restored, and nothing was said."""
    state = {"w": torch.arange(4.0)}
    with pckt.CheckpointManager(tmp_path, save_every=1, async_save=False,
                                continuation="statistical") as mgr:
        mgr.maybe_save(2, state)
        assert "not after" not in capsys.readouterr().err
        mgr.save(2, state)
        mgr.save(1, state)
    err = capsys.readouterr().err
    assert err.count("is not after this manager's last save") == 1, err
    assert "step 2 is not after this manager's last save (step 2)" in err


def test_a_manager_root_under_home_is_the_one_load_and_the_cli_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Notebook review F6: CheckpointManager("~/ckpts/run1") wrote into ./~/ckpts/run1 of the
    working directory (made absolute before "~" was expanded): a restart from elsewhere found
    nothing and trained from step 1, while load("~/...") and the CLI read $HOME."""
    import os

    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    state = {"w": torch.arange(4.0)}
    with pckt.CheckpointManager("~/ckpts/run1", save_every=1, async_save=False,
                                continuation="statistical", events="~/events.jsonl") as mgr:
        mgr.maybe_save(3, state)
    assert not (work / "~").exists() and (home / "events.jsonl").exists()
    back = {"w": torch.zeros(4)}
    assert pckt.load(back, "~/ckpts/run1").step == 3
    assert os.path.isdir(home / "ckpts" / "run1")


def test_ctrl_c_in_close_leaves_the_manager_open_to_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Notebook review F5: a Ctrl-C while close() waited marked the manager closed: a second
    close() returned at once with the save still running, its queued retention was cancelled
    and a later failure of it was one stderr line (exit status 0)."""
    import time

    import portable_ckpt.torch.saving as saving

    real = saving.RankWrite.__call__

    def slow(self: Any) -> Any:
        time.sleep(0.5)
        return real(self)

    monkeypatch.setattr(saving.RankWrite, "__call__", slow)
    mgr = pckt.CheckpointManager(tmp_path, save_every=1, continuation="statistical")
    mgr.maybe_save(1, {"w": torch.arange(4.0)})
    _ctrl_c_in_first_close(mgr, monkeypatch)
    mgr.maybe_save(2, {"w": torch.arange(4.0)})  # still open: the job may go on
    mgr.close()
    assert [v.step for v in portable_ckpt.list_versions(tmp_path)] == [1, 2]


def test_the_stop_after_failed_saves_names_the_failure_wait_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Notebook review F7: on one process, a wait() between the failed saves took the last
    error away, and the max_failed_saves stop said "last error: None" with PCK-DISTRIBUTED."""
    import portable_ckpt.torch.saving as saving
    from portable_ckpt.errors import CheckpointError, StorageError

    def full(self: Any) -> Any:
        raise StorageError("the disk is full (test)", path="data/w00000-0000.safetensors")

    monkeypatch.setattr(saving.RankWrite, "__call__", full)
    state = {"w": torch.arange(4.0)}
    mgr = pckt.CheckpointManager(tmp_path, save_every=1, max_failed_saves=2,
                                 continuation="statistical")
    try:
        stop = None
        for step in range(1, 6):
            try:
                mgr.maybe_save(step, state)
                mgr.wait()
            except CheckpointError as e:
                if "in a row failed" in str(e):
                    stop = e
                    break
        assert stop is not None
        assert stop.code == "PCK-STORAGE" and "the disk is full (test)" in str(stop), stop
    finally:
        with contextlib.suppress(CheckpointError):
            mgr.close()


@pytest.mark.parametrize("kind", ["prom", "jsonl"])
def test_events_files_are_not_written_through_planted_symlinks(tmp_path: Path, kind: str) -> None:
    """Tenant review F2: the Prometheus file was written through `<path>.<pid>.tmp` and the
    JSON lines appended with a plain open: symlinks planted there by another user who can
    write the directory made the job write the files they named."""
    import os

    from portable_ckpt.manager.telemetry import Telemetry

    victim = tmp_path / "precious"
    victim.write_text("keep me\n")
    path = tmp_path / f"events.{kind}"
    if kind == "prom":
        for pid in range(os.getpid(), os.getpid() + 50):  # the old temporary names
            os.symlink(victim, f"{path}.{pid}.tmp")
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root to give the symlink to another user")
        os.symlink(victim, path)
        os.lchown(path, 12345, 12345)  # planted by another user
    tel = Telemetry(str(path), 0)
    tel.emit("save", tier="durable", ok=True, step=1)
    assert victim.read_text() == "keep me\n"
    if kind == "prom":
        assert not path.is_symlink() and "step" in path.read_text()
        assert oct(path.stat().st_mode & 0o777) != oct(0o600)  # open()'s mode, not mkstemp's


def test_after_ctrl_c_in_close_the_manager_still_handles_sigterm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Last review F3: close() had put SIGTERM back to the default before it waited; after a
    Ctrl-C there the manager stayed open but a SIGTERM killed the job, no preemption save."""
    import signal

    mgr = pckt.CheckpointManager(tmp_path, save_every=100, async_save=False,
                                 continuation="statistical")
    try:
        _ctrl_c_in_first_close(mgr, monkeypatch)
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)
        signal.raise_signal(signal.SIGTERM)  # handled: the next maybe_save saves
        mgr.maybe_save(3, {"w": torch.arange(4.0)})
        assert [v.step for v in portable_ckpt.list_versions(tmp_path)] == [3]
    finally:
        mgr.close()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_step_saved_again_after_its_save_failed_is_not_called_a_repeat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Last review F4: a failed save counted as saved: its retry warned of two versions."""
    import portable_ckpt.torch.saving as saving
    from portable_ckpt.errors import CheckpointError, StorageError

    real = saving.RankWrite.__call__
    calls = [0]

    def once_full(self: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            raise StorageError("the disk is full (test)", path="data/x")
        return real(self)

    monkeypatch.setattr(saving.RankWrite, "__call__", once_full)
    with pckt.CheckpointManager(tmp_path, save_every=1, async_save=False,
                                continuation="statistical") as mgr:
        with pytest.raises(CheckpointError):
            mgr.save(5, {"w": torch.arange(4.0)})
        mgr.save(5, {"w": torch.arange(4.0)})
    assert "is not after this manager's last save" not in capsys.readouterr().err


def test_restore_does_not_wait_for_a_save_to_another_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Last review F5: a manager's restore waited for any async save of the process, to any
    root (8 s for an unrelated one; for ever for one stuck on hung storage)."""
    import time

    import portable_ckpt.torch.saving as saving

    real = saving.RankWrite.__call__

    def slow(self: Any) -> Any:
        time.sleep(3.0)
        return real(self)

    monkeypatch.setattr(saving.RankWrite, "__call__", slow)
    h = pckt.async_save({"w": torch.arange(4.0)}, tmp_path / "a", step=1,
                        continuation="statistical")
    with pckt.CheckpointManager(tmp_path / "b", save_every=1) as mgr:
        t0 = time.monotonic()
        assert mgr.restore({"w": torch.zeros(4)}) is None
        assert time.monotonic() - t0 < 2.0
    h.result(timeout=60)


def test_an_events_path_that_is_the_jobs_own_symlink_is_followed(tmp_path: Path) -> None:
    """Last review 4 F2: O_NOFOLLOW dropped every event written to /dev/stdout or to a log
    linked elsewhere, and the package logger (silent by default) was all that said so."""
    import json
    import os

    from portable_ckpt.manager.telemetry import Telemetry

    target = tmp_path / "logs" / "events.jsonl"
    target.parent.mkdir()
    link = tmp_path / "events.jsonl"
    os.symlink(target, link)
    Telemetry(str(link), 0).emit("save", tier="durable", ok=True, step=1)
    assert json.loads(target.read_text())["event"] == "save"


def _ctrl_c_in_first_close(mgr: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Close ``mgr`` with a Ctrl-C arriving in its first wait (the manager stays open)."""
    real_wait = mgr.wait
    calls = [0]

    def interrupted_wait(timeout: float | None = None) -> None:
        calls[0] += 1
        if calls[0] == 1:
            raise KeyboardInterrupt
        real_wait(timeout)

    monkeypatch.setattr(mgr, "wait", interrupted_wait)
    with pytest.raises(KeyboardInterrupt):
        mgr.close()


class _Config:
    """A value no save can store (no state_dict(), not JSON)."""


@pytest.mark.parametrize("limit", [3, None])
def test_a_state_no_save_can_store_stops_at_the_next_save(
    tmp_path: Path, limit: int | None, capfd: pytest.CaptureFixture[str]
) -> None:
    """Odd-states review O12: an unstorable value in the state failed each async save alike,
    said "Training continues", and stopped the job at the third failure in a row, or never with
    max_failed_saves=None. The next maybe_save raises; once the state is fixed, saves go on."""
    from portable_ckpt.errors import UnsupportedValueError

    state: dict[str, Any] = {"cfg": _Config(), "w": torch.ones(2)}
    mgr = pckt.CheckpointManager(tmp_path, save_every=1, async_save=True,
                                 max_failed_saves=limit, continuation="statistical")
    try:
        mgr.maybe_save(1, state)
        deadline = time.monotonic() + 60
        while mgr.last_error is None and time.monotonic() < deadline:  # a loop never waits
            time.sleep(0.05)
        with pytest.raises(UnsupportedValueError, match="no save can store"):
            mgr.maybe_save(2, state)
        assert "No save can store this state" in capfd.readouterr().err
        # Raised by wait() (the caller was told), the next save is tried as usual.
        mgr.maybe_save(3, state)
        with pytest.raises(UnsupportedValueError):
            mgr.wait()
        state["cfg"] = {"lr": 0.1}
        assert mgr.maybe_save(4, state)
        mgr.wait()
    finally:
        mgr.close()
    assert [v.step for v in portable_ckpt.list_versions(str(tmp_path))] == [4]
