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


def _fsdp_job(world: int, weight_decay: float) -> tuple[Any, Any]:
    """An FSDP2 model over every rank and its AdamW (``lr`` 0.01), seeded alike on each rank."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=weight_decay)
    return model, opt


def hyperparameters_populate(rank: int, world: int, root: str) -> list[int]:
    """Versions of steps 2 and 4 of an FSDP2 job trained with ``weight_decay`` 0.1."""
    import torch

    model, opt = _fsdp_job(world, 0.1)
    with pckt.CheckpointManager(root, save_every=2, async_save=False, timeout=30) as mgr:
        for step in range(1, 5):
            opt.zero_grad()
            model(torch.ones(2, 8)).sum().backward()
            opt.step()
            mgr.maybe_save(step, {"train": pckt.ModelOptimizerState(model, opt)})
    return [2, 4]


def hyperparameters_restore(rank: int, world: int, root: str, choice: str) -> Any:
    """Restore the job with ``weight_decay`` 0.05 in its config; what each rank holds and said."""
    import torch

    model, opt = _fsdp_job(world, 0.05)
    with pckt.CheckpointManager(root, save_every=2, timeout=30) as mgr:
        with contextlib.redirect_stderr(io.StringIO()) as err:
            info = mgr.restore({"train": pckt.ModelOptimizerState(model, opt)},
                               optimizer_hyperparameters=choice)  # type: ignore[arg-type]
        assert info is not None
        moments = [opt.state[p]["exp_avg"].to_local().abs().sum().item() for p in model.parameters()]
        opt.zero_grad()
        model(torch.ones(2, 8)).sum().backward()
        opt.step()  # trains on
        return {
            "step": info.step,
            "weight_decay": [g["weight_decay"] for g in opt.param_groups],
            "lr": [g["lr"] for g in opt.param_groups],
            "moments": all(m > 0 for m in moments),
            "changed": info.changed_hyperparameters,
            "said": err.getvalue().splitlines(),
        }
