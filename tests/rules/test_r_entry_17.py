"""A scheduler's state names its class, and another class refuses it (spec §12.5, R-ENTRY-17,
errata 15; fine-tuning review F5: the documented seed applied a ``CosineAnnealingLR``'s state to
the fine-tune's ``LinearLR`` without a word, its epoch set and a stray ``T_max`` left)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

import portable_ckpt.torch as pckt
from portable_ckpt.errors import EntrySchemaError, EntryTargetError
from portable_ckpt.format.schemas import validate_entry_value

pytestmark = pytest.mark.torch

SPEC = Path(__file__).resolve().parents[2] / "spec"
SCHED = "torch.optim.lr_scheduler"


def _opt() -> torch.optim.Optimizer:
    return torch.optim.AdamW(torch.nn.Linear(2, 2).parameters(), lr=0.1)


def _cosine(steps: int) -> Any:
    """A CosineAnnealingLR of its own optimizer, stepped ``steps`` times."""
    opt = _opt()
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 10)
    for _ in range(steps):
        opt.step()
        sched.step()
    return sched


def _sequential(opt: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.SequentialLR(
        opt,
        [torch.optim.lr_scheduler.LinearLR(opt, 0.5, total_iters=2),
         torch.optim.lr_scheduler.CosineAnnealingLR(opt, 9)],
        milestones=[2],
    )


def test_a_saved_value_names_each_schedulers_class_and_keeps_its_schema() -> None:
    opt = _opt()
    value = pckt.LRSchedulerState(_sequential(opt)).capture()
    assert value["class"] == f"{SCHED}.SequentialLR"
    assert [v["class"] for v in value["_schedulers"]] == [
        f"{SCHED}.LinearLR", f"{SCHED}.CosineAnnealingLR"]
    validate_entry_value(value, {"id": "pck:lr-scheduler/1"}, name="sched")
    example = json.loads((SPEC / "examples" / "entries" / "lr-scheduler--class.json").read_text())
    validate_entry_value(example, {"id": "pck:lr-scheduler/1"}, name="example")


def test_r_entry_17_another_class_is_refused_before_the_scheduler_changes() -> None:
    """R-ENTRY-17: PCK-ENTRY-SCHEMA, the scheduler untouched."""
    cosine = _cosine(steps=3)
    value = pckt.LRSchedulerState(cosine).capture()
    linear = torch.optim.lr_scheduler.LinearLR(_opt(), 0.1, total_iters=100)
    before = linear.state_dict()
    with pytest.raises(EntryTargetError, match=r"CosineAnnealingLR.*the target is a torch\.optim"
                       r"\.lr_scheduler\.LinearLR") as err:
        pckt.LRSchedulerState(linear).restore(value)
    assert err.value.code == "PCK-ENTRY-SCHEMA" and isinstance(err.value, EntrySchemaError)
    assert linear.state_dict() == before  # nothing applied: no epoch, no stray T_max


def test_r_entry_17_a_nested_schedulers_class_is_compared_too() -> None:
    value = pckt.LRSchedulerState(_sequential(_opt())).capture()
    opt = _opt()
    other = torch.optim.lr_scheduler.SequentialLR(
        opt,
        [torch.optim.lr_scheduler.LinearLR(opt, 0.5, total_iters=2),
         torch.optim.lr_scheduler.StepLR(opt, 3)],
        milestones=[2],
    )
    before = other.state_dict()
    with pytest.raises(EntryTargetError, match=r"_schedulers\[1\].*CosineAnnealingLR.*StepLR"):
        pckt.LRSchedulerState(other).restore(value)
    assert other.state_dict() == before


def test_r_entry_17_the_same_class_restores_without_the_member() -> None:
    """``class`` never reaches the scheduler (MUST NOT hand it): its next state_dict() would
    carry the stored name, whatever scheduler it is."""
    opt = _opt()
    sched = _sequential(opt)
    for _ in range(4):
        opt.step()
        sched.step()
    value = pckt.LRSchedulerState(sched).capture()
    again = _sequential(_opt())
    pckt.LRSchedulerState(again).restore(value)
    assert again.last_epoch == sched.last_epoch == 4
    assert "class" not in again.__dict__
    assert all("class" not in s.__dict__ for s in again._schedulers)
    assert again.state_dict()["_schedulers"][1]["last_epoch"] == sched._schedulers[1].last_epoch


def test_r_entry_17_module_moves_old_values_and_non_strings_apply() -> None:
    cosine = _cosine(steps=2)
    value = pckt.LRSchedulerState(cosine).capture()
    for stored in ("myjob.schedules.CosineAnnealingLR", 7, None):
        v = dict(value)
        if stored is None:
            del v["class"]  # a value written before errata 15
        else:
            v["class"] = stored
        target = torch.optim.lr_scheduler.CosineAnnealingLR(_opt(), 10)
        pckt.LRSchedulerState(target).restore(v)
        assert target.last_epoch == 2 and "class" not in target.__dict__


def test_a_load_names_the_entry_and_a_manager_does_not_fall_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every version of the job holds the same class: a manager raises instead of trying
    older versions (and telling the caller each failed)."""
    def state(sched_cls: str) -> dict[str, Any]:
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        sched = (torch.optim.lr_scheduler.CosineAnnealingLR(opt, 10) if sched_cls == "cos"
                 else torch.optim.lr_scheduler.LinearLR(opt, 0.1, total_iters=10))
        return {"model": model, "optim": opt, "sched": sched}

    root = str(tmp_path / "r")
    with pckt.CheckpointManager(root, save_every=1, async_save=False,
                                continuation="statistical") as mgr:
        s = state("cos")
        for step in (1, 2):
            s["model"](torch.ones(1, 3)).sum().backward()
            s["optim"].step()
            s["sched"].step()
            mgr.maybe_save(step, s)
    with pytest.raises(EntryTargetError, match=r"entry 'sched' of .*s000000000002.*"
                       r"CosineAnnealingLR.*LinearLR"):
        pckt.load(state("lin"), root)
    capsys.readouterr()
    with pckt.CheckpointManager(root, save_every=1, async_save=False) as mgr:
        with pytest.raises(EntryTargetError, match="s000000000002"):
            mgr.restore(state("lin"))
    err = capsys.readouterr().err
    assert "s000000000001" not in err  # the older version was not tried
    info = pckt.load(state("cos"), root)
    assert info.step == 2


def test_a_generator_of_the_other_kind_is_the_targets_error() -> None:
    """The same for a GeneratorState given a NumPy generator's state: the target's error, so a
    manager raises it at once (an unknown kind stays a damaged value)."""
    import numpy as np

    value = pckt.GeneratorState(np.random.default_rng(1)).capture()
    with pytest.raises(EntryTargetError, match="stored state is a numpy generator's, this is torch"):
        pckt.GeneratorState(torch.Generator()).restore(value)
    with pytest.raises(EntrySchemaError) as err:
        pckt.GeneratorState(torch.Generator()).restore({**value, "kind": "jax"})
    assert not isinstance(err.value, EntryTargetError)


def test_a_different_number_of_nested_schedulers_is_refused() -> None:
    """Fine-tuning review 21, M3: a 3-scheduler SequentialLR took a 2-scheduler state silently
    (its milestones went from [5, 50] to [5], ``class`` handed to the inner schedulers), and a
    1-scheduler target failed inside torch on an index."""
    value = pckt.LRSchedulerState(_sequential(_opt())).capture()
    for n in (1, 3):
        opt = _opt()
        inner = [torch.optim.lr_scheduler.LinearLR(opt, 0.5, total_iters=2) for _ in range(n)]
        target = torch.optim.lr_scheduler.SequentialLR(opt, inner, milestones=list(range(5, 5 * n, 5)))
        before = target.state_dict()
        with pytest.raises(EntryTargetError, match=f"holds 2 nested schedulers, the target .* holds {n}"):
            pckt.LRSchedulerState(target).restore(value)
        assert target.state_dict() == before
    old = {k: v for k, v in value.items() if k != "class"}  # before errata 15: refused as well
    opt = _opt()
    three = torch.optim.lr_scheduler.SequentialLR(
        opt, [torch.optim.lr_scheduler.LinearLR(opt, 0.5, total_iters=2) for _ in range(3)],
        milestones=[5, 50])
    with pytest.raises(EntryTargetError, match="holds 2 nested schedulers"):
        pckt.LRSchedulerState(three).restore(old)


def test_a_subclass_of_the_stored_class_restores_it() -> None:
    """Fine-tuning review 21, L11: a job's own subclass of the torch scheduler it saved with."""

    class WarmCosine(torch.optim.lr_scheduler.CosineAnnealingLR):
        pass

    cosine = _cosine(steps=3)
    target = WarmCosine(_opt(), 10)
    pckt.LRSchedulerState(target).restore(pckt.LRSchedulerState(cosine).capture())
    assert target.last_epoch == 3 and "class" not in target.__dict__
    back = pckt.LRSchedulerState(target).capture()  # it names its own class from now on
    assert back["class"].endswith("WarmCosine")
    with pytest.raises(EntryTargetError):  # the reverse: the stored subclass may hold more
        pckt.LRSchedulerState(torch.optim.lr_scheduler.CosineAnnealingLR(_opt(), 10)).restore(back)


def test_a_class_made_inside_a_function_restores_its_own_state() -> None:
    """Diff review 21, 1: the value names ``module.make.<locals>.WarmupLR`` and the check
    compared its last part with qualified names: every version of such a job was refused."""

    def make() -> type:
        class WarmupLR(torch.optim.lr_scheduler.LambdaLR):
            pass

        return WarmupLR

    cls = make()
    opt = _opt()
    sched = cls(opt, lambda s: min(1.0, (s + 1) / 10))
    for _ in range(3):
        opt.step()
        sched.step()
    value = pckt.LRSchedulerState(sched).capture()
    assert value["class"].endswith("make.<locals>.WarmupLR")
    again = cls(_opt(), lambda s: min(1.0, (s + 1) / 10))
    pckt.LRSchedulerState(again).restore(value)
    assert again.last_epoch == 3


def test_dcp_load_of_a_scheduler_that_holds_a_stale_class_attribute(tmp_path: Path) -> None:
    """Diff review 21, 7: DCP asks for the target's own keys only, so the member reaches no
    scheduler that lacks it; one an older release loaded keeps ``class`` as an attribute,
    and DCP asks for it: the stored value answers (stripping it failed that load)."""
    import torch.distributed.checkpoint as dcp

    from portable_ckpt.torch.dcp import PortableStorageReader

    sched = _cosine(steps=2)
    pckt.save({"sched": sched}, tmp_path, step=2, continuation="statistical")
    fresh = torch.optim.lr_scheduler.CosineAnnealingLR(_opt(), 10)
    dcp.load({"sched": fresh}, storage_reader=PortableStorageReader(str(tmp_path)))
    assert fresh.last_epoch == 2 and "class" not in fresh.__dict__
    stale = torch.optim.lr_scheduler.CosineAnnealingLR(_opt(), 10)
    stale.__dict__["class"] = "torch.optim.lr_scheduler.CosineAnnealingLR"  # an older release's
    dcp.load({"sched": stale}, storage_reader=PortableStorageReader(str(tmp_path)))
    assert stale.last_epoch == 2


def test_a_refused_entry_is_named_on_every_path_that_applies_it(tmp_path: Path) -> None:
    """The entry and the version are named where the value is applied after the tensors
    (generators and RNG, last) and where a DCP save's leaves rebuild it."""
    import numpy as np
    import torch.distributed.checkpoint as dcp

    from portable_ckpt.torch.dcp import PortableStorageWriter

    pckt.save({"w": torch.ones(2), "g": pckt.GeneratorState(np.random.default_rng(1))},
              tmp_path / "a", step=1, continuation="statistical")
    with pytest.raises(EntryTargetError, match=r"entry 'g' of .*s000000000001-.*numpy generator"):
        pckt.load({"w": torch.zeros(2), "g": pckt.GeneratorState(torch.Generator())},
                  tmp_path / "a")
    opt = _opt()
    sched = _sequential(opt)
    dcp.save({"w": torch.ones(2), "sched": sched.state_dict()},
             storage_writer=PortableStorageWriter(str(tmp_path / "b"), step=1,
                                                  continuation="statistical"))
    o2 = _opt()
    three = torch.optim.lr_scheduler.SequentialLR(
        o2, [torch.optim.lr_scheduler.LinearLR(o2, 0.5, total_iters=2) for _ in range(3)],
        milestones=[5, 50])
    with pytest.raises(EntryTargetError, match=r"entry 'sched' of .*holds 2 nested schedulers"):
        pckt.load({"w": torch.zeros(2), "sched": three}, tmp_path / "b")
