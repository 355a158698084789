"""A restore with changed optimizer hyper-parameters says so, and the caller chooses (L3).

Manager review L3: a job restarted with a new ``weight_decay`` (or ``lr``, ``betas``, ``eps``)
in its config got the stored values back from the optimizer's ``load_state_dict``, silently, and
trained on with the old ones. Rank 0 now names each difference once (stderr, and a WARNING of
event ``load.optimizer_hyperparameters``), ``LoadInfo.changed_hyperparameters`` lists them, and
``optimizer_hyperparameters="current"`` keeps the config's values instead of the stored ones.
The members an LR scheduler of the state sets are its own: restored, never reported.

Real optimizers and real saves to temporary roots; the two-rank case runs FSDP2 on gloo.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

import portable_ckpt
import portable_ckpt.torch as pckt
from portable_ckpt.errors import UsageError
from portable_ckpt.logs import EVENT_ATTR
from portable_ckpt.torch.launch import GroupResult, run_group

pytestmark = pytest.mark.torch

ROOT = str(Path(__file__).resolve().parents[2])
HEADER = "optimizer hyper-parameter(s) stored in the version differ"


def _job(**hp: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    kw: dict[str, Any] = {"lr": 0.01, "weight_decay": 0.1, "eps": 1e-8}
    kw.update(hp)
    return model, torch.optim.AdamW(model.parameters(), **kw)


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any = None) -> None:
    opt.zero_grad()
    model(torch.ones(4, 6)).pow(2).mean().backward()
    opt.step()
    if sched is not None:
        sched.step()


def _saved(root: Path, sched: Any = None, **hp: Any) -> tuple[torch.nn.Module, Any]:
    """A manager's versions of steps 2 and 4 of a job trained with ``hp``."""
    model, opt = _job(**hp)
    state: dict[str, Any] = {"train": pckt.ModelOptimizerState(model, opt)}
    if sched is not None:
        sched = sched(opt)
        state["sched"] = sched
    with pckt.CheckpointManager(str(root), save_every=2, async_save=False) as mgr:
        for step in range(1, 5):
            _train(model, opt, sched)
            mgr.maybe_save(step, state)
    return model, opt


def _restore(
    root: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
    sched: Any = None, choice: str | None = None, **hp: Any,
) -> tuple[Any, torch.optim.Optimizer, Any, list[logging.LogRecord], str]:
    """Restore into a job built with ``hp``: info, optimizer, scheduler, records, stderr."""
    capsys.readouterr()
    caplog.clear()
    model, opt = _job(**hp)
    state: dict[str, Any] = {"train": pckt.ModelOptimizerState(model, opt)}
    if sched is not None:
        sched = sched(opt)
        state["sched"] = sched
    kwargs = {} if choice is None else {"optimizer_hyperparameters": choice}
    with caplog.at_level(logging.INFO, logger="portable_ckpt"), \
            pckt.CheckpointManager(str(root), save_every=2) as mgr:
        info = mgr.restore(state, **kwargs)
    records = [r for r in caplog.records
               if getattr(r, EVENT_ATTR, {}).get("event") == "load.optimizer_hyperparameters"]
    return info, opt, sched, records, capsys.readouterr().err


def test_a_changed_weight_decay_is_said_once_and_the_stored_values_win(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    _saved(tmp_path / "ckpt")
    info, opt, _, records, err = _restore(tmp_path / "ckpt", caplog, capsys,
                                          weight_decay=0.05, eps=1e-6)
    assert info.step == 4
    group = opt.param_groups[0]
    assert group["weight_decay"] == 0.1 and group["eps"] == 1e-8  # as torch's load_state_dict
    assert info.changed_hyperparameters == [
        {"optimizer": "train/optim", "group": 0, "key": "eps", "stored": 1e-8, "current": 1e-6,
         "applied": "checkpoint"},
        {"optimizer": "train/optim", "group": 0, "key": "weight_decay", "stored": 0.1,
         "current": 0.05, "applied": "checkpoint"},
    ]
    assert err.count(HEADER) == 1, err
    assert "the stored ones were applied" in err
    assert "optimizer 'train/optim' group 0 weight_decay: stored 0.1, current 0.05" in err
    assert "optimizer 'train/optim' group 0 eps: stored 1e-08, current 1e-06" in err
    assert "optimizer_hyperparameters='current'" in err  # how to choose
    [record] = records
    assert record.levelno == logging.WARNING
    doc = getattr(record, EVENT_ATTR)
    assert doc["applied"] == "checkpoint" and doc["step"] == 4
    assert doc["changed"] == info.changed_hyperparameters


def test_current_keeps_the_configs_values_and_the_next_save_stores_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ckpt"
    model, saved = _saved(root)
    info, opt, _, records, err = _restore(root, caplog, capsys, choice="current",
                                          weight_decay=0.05, lr=0.02, betas=(0.8, 0.99))
    group = opt.param_groups[0]
    assert group["weight_decay"] == 0.05 and group["lr"] == 0.02
    assert group["betas"] == (0.8, 0.99) and group["eps"] == 1e-8
    assert {r["key"]: (r["stored"], r["current"], r["applied"])
            for r in info.changed_hyperparameters} == {
        "lr": (0.01, 0.02, "current"), "betas": ([0.9, 0.999], [0.8, 0.99], "current"),
        "weight_decay": (0.1, 0.05, "current"),
    }
    # the optimizer's state is the stored one all the same
    for p, q in zip(saved.param_groups[0]["params"], group["params"], strict=True):
        assert torch.equal(saved.state[p]["exp_avg"], opt.state[q]["exp_avg"])
    assert "the current ones were kept" in err and err.count(HEADER) == 1
    [record] = records
    assert record.levelno == logging.INFO
    # trained on and saved: the version holds the config's values, a restart says nothing
    model2, opt2 = _job(weight_decay=0.05, lr=0.02, betas=(0.8, 0.99))
    with pckt.CheckpointManager(str(root), save_every=2, async_save=False) as mgr:
        mgr.restore({"train": pckt.ModelOptimizerState(model2, opt2)},
                    optimizer_hyperparameters="current")
        _train(model2, opt2)
        mgr.save(5, {"train": pckt.ModelOptimizerState(model2, opt2)})
    values = portable_ckpt.open(str(root)).entry("torch.values")
    assert values["train/optim/param_groups/0/weight_decay"] == 0.05
    info, opt, _, records, err = _restore(root, caplog, capsys,
                                          weight_decay=0.05, lr=0.02, betas=(0.8, 0.99))
    assert info.step == 5 and info.changed_hyperparameters == [] and not records
    assert HEADER not in err


def _warmup(opt: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.25, total_iters=8)


def _one_cycle(opt: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=20)


@pytest.mark.parametrize("sched", [_warmup, _one_cycle])
def test_an_lr_scheduler_owns_lr_which_is_restored_and_never_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
    sched: Any,
) -> None:
    """A fresh scheduler sets ``lr`` (and ``initial_lr``; OneCycleLR ``betas`` too) at
    construction: they differ from the stored ones at every restart, and the restored scheduler
    goes on from the stored ones, whatever the choice."""
    root = tmp_path / "ckpt"
    _, saved = _saved(root, sched)
    stored = dict(saved.param_groups[0])
    info, opt, s, records, err = _restore(root, caplog, capsys, sched)
    assert opt.param_groups[0]["lr"] == stored["lr"] and s.last_epoch == 4
    assert info.changed_hyperparameters == [] and not records and HEADER not in err
    info, opt, s, records, err = _restore(root, caplog, capsys, sched, choice="current",
                                          weight_decay=0.05)
    group = opt.param_groups[0]
    assert group["weight_decay"] == 0.05
    assert group["lr"] == stored["lr"] and group["initial_lr"] == stored["initial_lr"]
    assert group["betas"] == stored["betas"]
    assert [(r["key"], r["stored"], r["current"]) for r in info.changed_hyperparameters] == [
        ("weight_decay", 0.1, 0.05)]
    assert "group 0 weight_decay: stored 0.1, current 0.05" in err and " lr:" not in err


def test_load_of_plain_optimizers_reports_only_what_no_scheduler_of_theirs_sets(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """``load`` itself: two optimizers, a scheduler on one: the other's ``lr`` is reported."""
    root = str(tmp_path / "ckpt")

    def job(lr: float) -> dict[str, Any]:
        torch.manual_seed(0)
        a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        opt_a = torch.optim.SGD(a.parameters(), lr=lr, momentum=0.9)
        opt_b = torch.optim.SGD(b.parameters(), lr=lr, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt_a, step_size=1, gamma=0.5)
        (a(torch.ones(1, 2)).sum() + b(torch.ones(1, 2)).sum()).backward()
        opt_a.step()
        opt_b.step()
        return {"a": a, "b": b, "opt_a": opt_a, "opt_b": opt_b, "sched": sched}

    first = job(0.1)
    first["sched"].step()
    pckt.save(first, root, step=1, continuation="statistical")
    state = job(0.3)
    capsys.readouterr()
    with caplog.at_level(logging.WARNING, logger="portable_ckpt"):
        info = pckt.load(state, root)
    assert [(r["optimizer"], r["key"], r["stored"], r["current"])
            for r in info.changed_hyperparameters] == [("opt_b", "lr", 0.1, 0.3)]
    assert state["opt_b"].param_groups[0]["lr"] == 0.1
    assert state["opt_a"].param_groups[0]["lr"] == 0.05  # the stored one: its scheduler's
    assert "optimizer 'opt_b' group 0 lr: stored 0.1, current 0.3" in capsys.readouterr().err
    state = job(0.3)
    info = pckt.load(state, root, optimizer_hyperparameters="current")
    assert state["opt_b"].param_groups[0]["lr"] == 0.3
    assert state["opt_a"].param_groups[0]["lr"] == 0.05


def test_one_change_of_many_groups_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Per-expert param groups all given a new weight decay: one line names the groups."""
    root = str(tmp_path / "ckpt")

    def job(wd: float, lr_last: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        experts = torch.nn.ModuleList(torch.nn.Linear(2, 2) for _ in range(5))
        groups = [{"params": e.parameters(), "weight_decay": wd} for e in experts]
        groups[-1]["lr"] = lr_last
        return experts, torch.optim.AdamW(groups, lr=0.01)

    experts, opt = job(0.1, 0.01)
    sum(e(torch.ones(1, 2)).sum() for e in experts).backward()  # type: ignore[union-attr]
    opt.step()
    pckt.save({"model": experts, "opt": opt}, root, step=3, continuation="statistical")
    experts, opt = job(0.05, 0.02)
    capsys.readouterr()
    info = pckt.load({"model": experts, "opt": opt}, root)
    assert len(info.changed_hyperparameters) == 6
    assert all(g["weight_decay"] == 0.1 for g in opt.param_groups)
    assert opt.param_groups[4]["lr"] == 0.01
    err = capsys.readouterr().err
    assert "6 optimizer hyper-parameter(s)" in err
    assert "optimizer 'opt' groups 0-4 weight_decay: stored 0.1, current 0.05" in err
    assert "optimizer 'opt' group 4 lr: stored 0.01, current 0.02" in err


def _t(*values: float) -> Any:
    """Tensor hyper-parameters: one 0-d tensor, or a tuple of them."""
    ts = tuple(torch.tensor(v) for v in values)
    return ts[0] if len(ts) == 1 else ts


@pytest.mark.parametrize("choice", ["checkpoint", "current"])
def test_tensor_members_are_compared_by_value_and_current_keeps_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
    choice: str,
) -> None:
    """A tensor ``lr`` (a fused or capturable optimizer's) and ``betas`` of tensors: compared
    by value and reported like any member; ``"current"`` keeps the config's (their values were
    loaded over, then copied back into the target's own tensors). Before, they were loaded as
    any tensor and never compared: "current" was silently ignored (review of the change, 1)."""
    root = tmp_path / "ckpt"
    _saved(root, lr=_t(0.01), betas=_t(0.9, 0.999), fused=True)
    info, opt, _, records, err = _restore(root, caplog, capsys, choice=choice,
                                          lr=_t(0.02), betas=_t(0.8, 0.999), fused=True)
    assert [(r["key"], r["stored"], r["current"], r["applied"])
            for r in info.changed_hyperparameters] == [
        ("lr", 0.01, 0.02, choice), ("betas", [0.9, 0.999], [0.8, 0.999], choice)]
    assert "group 0 lr: stored 0.01, current 0.02" in err
    assert "group 0 betas: stored [0.9, 0.999], current [0.8, 0.999]" in err
    [record] = records
    assert getattr(record, EVENT_ATTR)["changed"] == info.changed_hyperparameters
    group = opt.param_groups[0]
    lr, betas = (0.01, (0.9, 0.999)) if choice == "checkpoint" else (0.02, (0.8, 0.999))
    assert isinstance(group["lr"], torch.Tensor) and group["lr"].item() == pytest.approx(lr)
    assert all(isinstance(b, torch.Tensor) for b in group["betas"])
    assert [b.item() for b in group["betas"]] == pytest.approx(betas)
    assert group["fused"] is True
    before = [p.detach().clone() for p in group["params"]]
    opt.zero_grad()
    sum(p.pow(2).sum() for p in group["params"]).backward()
    opt.step()  # the fused step takes the tensors the group holds
    assert all(not torch.equal(a, b) for a, b in zip(before, group["params"], strict=True))
    # unchanged tensor members: nothing said
    info, _, _, records, err = _restore(root, caplog, capsys, lr=_t(0.01),
                                        betas=_t(0.9, 0.999), fused=True)
    assert info.changed_hyperparameters == [] and not records and HEADER not in err


def test_a_nan_member_and_implementation_flags_are_not_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """NaN is NaN: a member that is NaN before and after was said at every restart. ``foreach``
    and ``fused`` choose kernels, not the maths: never said, and the current optimizer keeps its
    own (torch's load_state_dict would apply the stored ones), whatever the choice."""
    root = str(tmp_path / "ckpt")

    def job(**hp: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        model, opt = _job(**hp)
        opt.param_groups[0]["clip"] = float("nan")  # a member of the user's own
        return model, opt

    model, opt = job(foreach=False)
    _train(model, opt)
    pckt.save({"m": model, "o": opt}, root, step=1, continuation="statistical")
    for choice in ("checkpoint", "current"):
        model, opt = job(fused=True, weight_decay=0.05)
        capsys.readouterr()
        info = pckt.load({"m": model, "o": opt}, root,
                         optimizer_hyperparameters=choice)  # type: ignore[arg-type]
        err = capsys.readouterr().err
        assert [r["key"] for r in info.changed_hyperparameters] == ["weight_decay"], err
        assert "clip" not in err and "foreach" not in err and "fused" not in err
        group = opt.param_groups[0]
        assert group["foreach"] is None and group["fused"] is True
        assert group["weight_decay"] == (0.1 if choice == "checkpoint" else 0.05)
        _train(model, opt)  # the fused step, on the state loaded


def test_an_unknown_choice_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    _saved(tmp_path / "ckpt")
    model, opt = _job(weight_decay=0.05)
    state = {"train": pckt.ModelOptimizerState(model, opt)}
    with pytest.raises(UsageError, match="optimizer_hyperparameters must be one of"):
        pckt.load(state, str(tmp_path / "ckpt"), optimizer_hyperparameters="config")  # type: ignore[arg-type]
    with pckt.CheckpointManager(str(tmp_path / "ckpt"), save_every=2) as mgr, \
            pytest.raises(UsageError, match="optimizer_hyperparameters must be one of"):
        mgr.restore(state, optimizer_hyperparameters="config")  # type: ignore[arg-type]
    assert opt.param_groups[0]["weight_decay"] == 0.05 and not opt.state


def _run(fn: str, *args: Any) -> list[Any]:
    res: GroupResult = run_group(f"tests.manager._restore_workers:{fn}", 2, args, timeout=120,
                                 pg_timeout=45, sys_path=[ROOT])
    res.raise_for_errors()
    return list(res.results)


def test_two_ranks_fsdp2_rank_zero_says_it_every_rank_applies_the_choice(tmp_path: Path) -> None:
    """FSDP2 on two ranks: rank 0 names the change once, every rank holds the chosen values.
    After a candidate that failed part way (rank 1's file damaged, rank 0 had loaded it, stored
    values and all), the change is still named: compared with the values before the restore."""
    root = tmp_path / "ckpt"
    _run("hyperparameters_populate", str(root))
    out = _run("hyperparameters_restore", str(root), "current")
    assert [o["step"] for o in out] == [4, 4]
    assert all(o["weight_decay"] == [0.05] and o["lr"] == [0.01] and o["moments"] for o in out)
    assert [[(r["key"], r["stored"], r["current"], r["applied"]) for r in o["changed"]]
            for o in out] == [[("weight_decay", 0.1, 0.05, "current")]] * 2
    said = [line for line in out[0]["said"] if HEADER in line]
    assert len(said) == 1 and "loaded step 4" in said[0] and "current ones were kept" in said[0]
    assert any("group 0 weight_decay: stored 0.1, current 0.05" in line for line in out[0]["said"])
    assert not [line for line in out[1]["said"] if "hyper-parameter" in line or "weight_decay" in line]
    _old, new = portable_ckpt.list_versions(root)
    for data in sorted((Path(new.path) / "data").glob("w00001*")):  # rank 1's shards only
        raw = bytearray(data.read_bytes())
        raw[-5] ^= 0xFF
        data.write_bytes(bytes(raw))
    out = _run("hyperparameters_restore", str(root), "checkpoint")
    assert [o["step"] for o in out] == [2, 2]
    assert all(o["weight_decay"] == [0.1] and o["moments"] for o in out)
    assert [[(r["key"], r["stored"], r["current"], r["applied"]) for r in o["changed"]]
            for o in out] == [[("weight_decay", 0.1, 0.05, "checkpoint")]] * 2
    said = [line for line in out[0]["said"] if HEADER in line]
    assert len(said) == 1 and "loaded step 2" in said[0]
    assert not [line for line in out[1]["said"] if HEADER in line]
