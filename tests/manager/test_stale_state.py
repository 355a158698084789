"""The stale-state trap of issue 14, reproduced with the old pattern and impossible via the manager."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

pytest.importorskip("torch")

import torch

import portable_ckpt
import portable_ckpt.torch as pckt

pytestmark = pytest.mark.torch


def _job() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.002)
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.25, total_iters=4)
    return model, opt, warm


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, sched: object, steps: int) -> None:
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 6)).pow(2).mean().backward()
        opt.step()
        sched.step()  # type: ignore[attr-defined]


def _stored_lr(root: str, key: str) -> float:
    ck = portable_ckpt.open(root)
    values = ck.entry("torch.values")
    return float(values[key])


def test_old_pattern_stores_a_stale_lr(tmp_path: Path) -> None:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, opt, sched = _job()
    _train(model, opt, sched, 1)
    msd, osd = get_state_dict(model, opt)  # documented once, saved later: a snapshot
    state = {"model": msd, "optim": osd, "sched": sched}
    _train(model, opt, sched, 3)
    pckt.save(state, str(tmp_path / "old"), step=4)
    live = opt.param_groups[0]["lr"]
    stored = _stored_lr(str(tmp_path / "old"), "optim/param_groups/0/lr")
    assert stored != pytest.approx(live)  # the trap: the stored lr is the lr of step 1


def test_manager_saves_the_live_lr(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, opt, sched = _job()
    state = {"train": pckt.ModelOptimizerState(model, opt), "sched": sched}
    with pckt.CheckpointManager(str(tmp_path / "mgr"), save_every=2, async_save=True) as mgr:
        for step in range(1, 5):
            _train(model, opt, sched, 1)
            mgr.maybe_save(step, state)
            mgr.wait()
            live = opt.param_groups[0]["lr"]
            if step % 2 == 0:
                stored = _stored_lr(str(tmp_path / "mgr"), "train/optim/param_groups/0/lr")
                assert stored == pytest.approx(live)
        # The old pattern through the manager is flagged loudly (once).
        _, osd = get_state_dict(model, opt)
        with caplog.at_level(logging.WARNING, logger="portable_ckpt"):
            mgr.save(5, {"model": model.state_dict(), "optim": osd})
            mgr.save(6, {"model": model.state_dict(), "optim": osd})
        warned = [r for r in caplog.records if "optimizer state dict" in r.getMessage()]
        assert len(warned) == 1
    # Resume: the restored optimizer continues at the live lr of step 4, not a stale one.
    model2, opt2, sched2 = _job()
    mgr2 = pckt.CheckpointManager(str(tmp_path / "mgr"), save_every=2)
    info = mgr2.restore({"train": pckt.ModelOptimizerState(model2, opt2), "sched": sched2}, step=4)
    mgr2.close()
    assert info is not None and info.step == 4
    assert opt2.param_groups[0]["lr"] == pytest.approx(stored)
    assert sched2.last_epoch == 4


def test_manager_async_mode_process_saves_through_the_writer_process(tmp_path: Path) -> None:
    """``async_mode="process"``: the saves are written by the writer process, values and all."""
    from portable_ckpt.errors import UsageError
    from portable_ckpt.torch import _process_write

    with pytest.raises(UsageError, match="async_mode must be one of"):
        pckt.CheckpointManager(str(tmp_path / "x"), save_every=1, async_mode="fork")
    assert not (tmp_path / "x").exists()  # refused before anything was touched
    model, opt, sched = _job()
    state = {"train": pckt.ModelOptimizerState(model, opt), "sched": sched}
    with pckt.CheckpointManager(str(tmp_path / "mgr"), save_every=2, async_mode="process") as mgr:
        for step in range(1, 5):
            _train(model, opt, sched, 1)
            mgr.maybe_save(step, state)
        mgr.wait()
        assert mgr.last_error is None
        assert _process_write.writer_process().alive()
        expect = {k: v.clone() for k, v in model.state_dict().items()}
    assert [v.step for v in portable_ckpt.list_versions(str(tmp_path / "mgr"))] == [2, 4]
    model2, opt2, sched2 = _job()
    mgr2 = pckt.CheckpointManager(str(tmp_path / "mgr"), save_every=2)
    info = mgr2.restore({"train": pckt.ModelOptimizerState(model2, opt2), "sched": sched2})
    mgr2.close()
    assert info is not None and info.step == 4 and sched2.last_epoch == 4
    assert all(torch.equal(v, expect[k]) for k, v in model2.state_dict().items())


def _losses(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> list[float]:
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(torch.randn(4, 6, generator=g)).pow(2).mean()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
    lambda p: torch.optim.Adam(p, lr=0.01, amsgrad=True),
    lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9),
])
def test_a_save_before_the_first_step_changes_nothing(tmp_path: Path, make: object) -> None:
    """A save at step 0 (``maybe_save(0)`` with ``save_every``) made torch's ``get_state_dict``
    take a zero-gradient step that AdamW counts: every later step's bias correction shifted.
    The live optimizer keeps its empty state, and a job resumed from the version takes the
    steps of a job that never saved."""

    def job() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = torch.nn.Linear(6, 3)
        return model, make(model.parameters())  # type: ignore[operator]

    model, opt = job()
    want = _losses(model, opt, 4)
    model, opt = job()
    with pckt.CheckpointManager(str(tmp_path / "mgr"), save_every=5) as mgr:
        assert mgr.maybe_save(0, {"train": pckt.ModelOptimizerState(model, opt)})
    assert not opt.state and all(p.grad is None for p in model.parameters())
    assert _losses(model, opt, 4) == want
    model2, opt2 = job()
    with torch.no_grad():
        for p in model2.parameters():
            p.add_(1.0)  # the resumed job's own init: the version must replace it
    mgr2 = pckt.CheckpointManager(str(tmp_path / "mgr"), save_every=5)
    info = mgr2.restore({"train": pckt.ModelOptimizerState(model2, opt2)})
    mgr2.close()
    assert info is not None and info.step == 0
    assert _losses(model2, opt2, 4) == want
