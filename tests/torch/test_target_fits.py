"""A target that finds none of its tensors in the version is refused, ``strict=False`` too.

Docs review 21, F1: docs/torch.md's fine-tune restored ``{"model": model}`` from a version the
documented job saved as ``train/model/...``; the load loaded nothing, reported success, and the
fine-tune trained from random weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

import torch

import portable_ckpt.torch as pckt
from portable_ckpt.errors import TensorMissingError

pytestmark = pytest.mark.torch


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))


def _saved(tmp_path: Path) -> tuple[str, torch.nn.Module]:
    model = _model(0)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    root = str(tmp_path / "pre")
    with pckt.CheckpointManager(root, save_every=1, async_save=False,
                                continuation="statistical") as mgr:
        mgr.maybe_save(1, {"train": pckt.ModelOptimizerState(model, opt)})
    return root, model


def test_none_found_is_refused_naming_the_prefix_and_the_nested_target_loads(
    tmp_path: Path,
) -> None:
    root, saved = _saved(tmp_path)
    fresh = _model(1)
    before = [p.clone() for p in fresh.parameters()]
    with pytest.raises(TensorMissingError, match=r"none of the target's 4 tensors") as err:
        pckt.load({"model": fresh}, root, strict=False)
    assert "holds 'model/0.weight' as 'train/model/0.weight': nest the target under 'train/'" in (
        err.value.message)
    assert all(torch.equal(a, b) for a, b in zip(before, fresh.parameters(), strict=True))
    # The documented way: nested as the job saved it; the fresh head's keys are reported.
    grown = torch.nn.Sequential(*_model(1), torch.nn.Linear(2, 3))  # a head of its own name
    info = pckt.load({"train": pckt.ModelOptimizerState(grown)}, root, strict=False)
    assert sorted(info.missing_keys) == ["train/model/2.bias", "train/model/2.weight"]
    assert torch.equal(grown[0].weight, saved[0].weight)


def test_a_manager_restore_raises_it_instead_of_reporting_a_restore(tmp_path: Path) -> None:
    root, _ = _saved(tmp_path)
    with pckt.CheckpointManager(str(tmp_path / "ft"), save_every=1, async_save=False) as mgr:
        with pytest.raises(TensorMissingError, match="none of the target's"):
            mgr.restore({"model": _model(1)}, checkpoint=root, strict=False,
                        allow_statistical=True)


def test_some_keys_absent_still_load_the_rest_with_strict_false(tmp_path: Path) -> None:
    """What strict=False is for: keys absent one by one (a new buffer, a new head)."""
    root, saved = _saved(tmp_path)
    target = {"train": pckt.ModelOptimizerState(_model(1)), "extra": torch.zeros(3)}
    info = pckt.load(target, root, strict=False)
    assert info.missing_keys == ["extra"]


def test_an_optimizer_in_the_target_does_not_hide_that_no_tensor_fits(tmp_path: Path) -> None:
    """Fine-tuning review 21, M1: a target with an optimizer counted every optimizer key of an
    unfound parameter as fresh state, so the refusal never came: the load reported success with
    nothing loaded and the optimizer's param_groups stripped of lr and betas (or failed inside
    torch, "a parameter group that doesn't match"). Refused before anything changes."""
    root, _ = _saved(tmp_path)

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone = _model(2)

    for tied in (False, True):
        model = Wrapped()
        if tied:
            model.backbone[1].weight = torch.nn.Parameter(model.backbone[0].weight[:2].clone())
        opt = torch.optim.AdamW(model.parameters(), lr=0.05)
        groups = [dict(g) for g in opt.state_dict()["param_groups"]]
        with pytest.raises(TensorMissingError, match="none of the target's") as err:
            pckt.load({"train": pckt.ModelOptimizerState(model, opt)}, root, strict=False)
        assert "train/model/0.weight" in err.value.message  # the stored keys that look alike
        assert opt.state_dict()["param_groups"] == groups  # untouched: lr, betas kept


def test_none_found_is_decided_over_the_group(tmp_path: Path) -> None:
    """Fine-tuning review 21, M2: a pipeline stage whose tensors are all new (a model grown by
    stages) is a partial target: the other stage loads, nothing fails. A target that no rank
    finds is refused on every rank alike (no rank waits for another), before anything changes."""
    from portable_ckpt.torch.launch import run_group

    res = run_group("tests.torch._fit_workers:stage_all_new", 2, (str(tmp_path / "a"), False),
                    timeout=180)
    res.raise_for_errors()
    r0, r1 = res.results
    assert r0 == {"code": None, "missing": [], "w": [0.0, 1.0, 2.0, 3.0]}
    assert r1 == {"code": None, "missing": ["stage1/w"], "w": [0.0, 0.0, 0.0, 0.0]}
    res = run_group("tests.torch._fit_workers:stage_all_new", 2, (str(tmp_path / "b"), True),
                    timeout=180)
    res.raise_for_errors()
    assert [r["code"] for r in res.results] == ["PCK-TENSOR-MISSING"] * 2
    assert all("none of the target's 1 tensors" in r["message"] for r in res.results)
    # Before anything changed: the plain value and the data position the version holds were
    # not applied (they were, until the twenty-second stop).
    assert [(r["seen"], r["pos"]) for r in res.results] == [(0, [0, 0, False])] * 2


def test_an_optimizer_of_another_class_is_refused_before_its_groups_change(tmp_path: Path) -> None:
    """Fine-tuning review 21, M7: an SGD loaded from an AdamW version took the pretraining
    run's learning rate and weight decay without a word. Told apart by the hyper-parameters
    each side's param groups hold; one side's extra member alone (a newer torch) is not."""
    from portable_ckpt.errors import EntryTargetError

    root, _ = _saved(tmp_path)  # AdamW(lr=0.1)
    model = _model(1)
    # (with momentum, strict=True stops earlier, at the momentum buffers the version lacks)
    sgd = torch.optim.SGD(model.parameters(), lr=0.05)
    with pytest.raises(EntryTargetError, match=r"param group 0 holds \['amsgrad', 'betas'.*"
                       r"the target's holds \['dampening', 'momentum', 'nesterov'\]"):
        pckt.load({"train": pckt.ModelOptimizerState(model, sgd)}, root, strict=False)
    assert sgd.param_groups[0]["lr"] == 0.05 and "betas" not in sgd.param_groups[0]
    model = _model(1)
    adam = torch.optim.Adam(model.parameters(), lr=0.05)  # the same members: loads
    pckt.load({"train": pckt.ModelOptimizerState(model, adam)}, root, strict=False)
    assert adam.param_groups[0]["lr"] == 0.1
    model = _model(1)
    newer = torch.optim.AdamW(model.parameters(), lr=0.05)
    newer.param_groups[0]["new_knob"] = 1  # a member the saving torch did not have
    info = pckt.load({"train": pckt.ModelOptimizerState(model, newer)}, root, strict=False)
    assert newer.param_groups[0]["lr"] == 0.1
    assert "train/optim/param_groups/0/new_knob" in info.missing_keys


def test_members_a_schedule_or_the_job_adds_tell_no_optimizer_apart(tmp_path: Path) -> None:
    """A pretraining run with OneCycleLR (``max_lr``, ``min_lr`` in its groups) and a group
    ``name`` seeds a fine-tune of the same optimizer under CyclicLR with a ``tag``: it loads."""
    model = _model(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt.param_groups[0]["name"] = "decay"  # a job's own member, to log by
    torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10)
    pckt.save({"train": pckt.ModelOptimizerState(model, opt)}, tmp_path, step=1,
              continuation="statistical")
    target = _model(1)
    sgd = torch.optim.SGD(target.parameters(), lr=0.05, momentum=0.9)
    torch.optim.lr_scheduler.CyclicLR(sgd, base_lr=0.01, max_lr=0.05)
    sgd.param_groups[0]["tag"] = "all"  # the fine-tune's own member
    pckt.load({"train": pckt.ModelOptimizerState(target)}, tmp_path)
    pckt.load({"train": pckt.ModelOptimizerState(target, sgd)}, tmp_path, strict=False)
    assert torch.equal(target[0].weight, model[0].weight)


def test_damage_beside_a_stage_of_new_layers_is_still_passed_over(tmp_path: Path) -> None:
    """Diff review 21, 2: on a rank whose tensors are all new, every error of the load was
    rewritten as PCK-TENSOR-MISSING, a caller's error: a damaged newest version stopped the
    restore on every rank instead of being passed over to the older one."""
    from portable_ckpt.torch.launch import run_group

    res = run_group("tests.torch._fit_workers:damaged_beside_a_new_stage", 2, (str(tmp_path),),
                    timeout=240)
    res.raise_for_errors()
    assert [r["step"] for r in res.results] == [1, 1]
    assert [r["pos"] for r in res.results] == [10, 11]


def test_the_targets_grown_below_an_empty_dict_hide_no_renamed_model(tmp_path: Path) -> None:
    """Diff review 21, 4: counted after the load grew them, the ``ema`` tensors below an empty
    dict made a renamed model load unloaded on two ranks, while one process refused it."""
    from portable_ckpt.torch.launch import run_group

    with pytest.raises(TensorMissingError, match="none of the target's 1 tensors"):
        pckt.load({"module": {"w": torch.zeros(4)}, "ema": {}},
                  _arrays(tmp_path / "one"), strict=False)
    res = run_group("tests.torch._fit_workers:renamed_beside_an_empty_dict", 2,
                    (str(tmp_path / "two"),), timeout=240)
    res.raise_for_errors()
    assert [r["code"] for r in res.results] == ["PCK-TENSOR-MISSING"] * 2


def _arrays(root: Path) -> str:
    import numpy as np

    import portable_ckpt

    portable_ckpt.save_arrays(str(root), {"model/w": np.ones(4, np.float32),
                                          "ema/w": np.ones(4, np.float32)}, step=1)
    return str(root)


def test_the_hint_names_a_prefix_the_target_has_and_the_version_not(tmp_path: Path) -> None:
    """The other direction of the hint: the target nests what the job saved at the top."""
    pckt.save({"0.weight": torch.ones(2)}, tmp_path, step=1, continuation="statistical")
    with pytest.raises(TensorMissingError, match=r"holds 'model/0\.weight' as '0\.weight': the "
                       r"target nests it under 'model/', the saving job did not"):
        pckt.load({"model": {"0.weight": torch.zeros(2)}}, tmp_path, strict=False)


def test_one_sides_extra_hyper_parameter_alone_loads(tmp_path: Path) -> None:
    """Diff review 21, 6: a member torch's optimizers take, on one side only (a newer or older
    torch's), is no other optimizer class: the version's extra one, or the target's."""
    model = _model(0)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    opt.param_groups[0]["momentum_decay"] = 0.004  # (a member another torch's AdamW has)
    pckt.save({"train": pckt.ModelOptimizerState(model, opt)}, tmp_path / "v", step=1,
              continuation="statistical")
    plain, _ = _saved(tmp_path)  # AdamW(lr=0.1), as this torch holds it
    for root, extra in ((str(tmp_path / "v"), False), (plain, True)):
        model = _model(1)
        target = torch.optim.AdamW(model.parameters(), lr=0.05)
        if extra:  # the target's alone
            target.param_groups[0]["nesterov"] = False
        pckt.load({"train": pckt.ModelOptimizerState(model, target)}, root, strict=False)
        assert target.param_groups[0]["lr"] == 0.1


def test_a_check_that_fails_on_one_rank_says_nothing_was_touched(tmp_path: Path) -> None:
    """Diff review 22, D2: the check step changes nothing; a peer's failure there was reported
    as "the ranks that succeeded hold a partly restored state; load again"."""
    from portable_ckpt.torch.launch import run_group

    res = run_group("tests.torch._fit_workers:check_fails_on_one_rank", 2, (str(tmp_path / "r"),),
                    timeout=180)
    res.raise_for_errors()
    r0, r1 = res.results
    assert r1["code"] == "PCK-CONTRACT" and "injected" in r1["message"]
    assert r0["code"] == "PCK-DISTRIBUTED", r0
    assert "not touched" in r0["message"] and "partly restored" not in r0["message"], r0
    assert [(r["w"], r["seen"]) for r in res.results] == [([0.0] * 4, 0)] * 2
