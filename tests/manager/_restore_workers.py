"""Per-rank programs of test_restore_safety (run through portable_ckpt.torch.launch.run_group)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
from typing import Any

import portable_ckpt.torch as pckt
from portable_ckpt.errors import CheckpointError
from portable_ckpt.storage.faults import Fault, FaultyStorage
from tests.manager._workers import Trainer


def populate(rank: int, world: int, root: str) -> list[int]:
    """Versions of steps 2 and 4 in ``root``."""
    tr = Trainer(world)
    with pckt.CheckpointManager(root, save_every=2, async_save=False, timeout=30) as mgr:
        for step in range(1, 5):
            tr.step(step)
            mgr.maybe_save(step, {"model": tr})
    return [2, 4]


def restore(rank: int, world: int, root: str, fault: str | None, step: int | None) -> Any:
    """Restore ``root`` (through a storage with one injected ``fault``); the outcome."""
    tr = Trainer(world, salt=1000.0)
    mgr = pckt.CheckpointManager(root, save_every=2, timeout=30)
    if fault is not None:
        tier = mgr.tiers["durable"]
        op, path = fault.split(":", 1)
        faulty = FaultyStorage(tier.storage, [Fault(op=tuple(op.split("+")), path=path, times=1)])
        mgr.tiers["durable"] = dataclasses.replace(tier, storage=faulty)
    try:
        with contextlib.redirect_stderr(io.StringIO()) as err:
            info = mgr.restore({"model": tr}, step=step)
    except CheckpointError as e:
        out: dict[str, Any] = {"code": e.code, "message": e.message}
    else:
        ev = next(e for e in mgr.telemetry.history if e["event"] == "restore")
        out = {
            "step": None if info is None else info.step,
            "fallbacks": ev["fallbacks"],
            "said": err.getvalue().splitlines(),
        }
    mgr.close()
    return out


def restore_passed_over(rank: int, world: int, root: str) -> Any:
    """Restore ``root``; the step, ``LoadInfo.passed_over`` and what this rank said."""
    tr = Trainer(world, salt=1000.0)
    with pckt.CheckpointManager(root, save_every=2, timeout=30) as mgr:
        with contextlib.redirect_stderr(io.StringIO()) as err:
            info = mgr.restore({"model": tr})
        assert info is not None
        return {
            "step": info.step,
            "passed_over": getattr(info, "passed_over", None),
            "said": err.getvalue().splitlines(),
        }
