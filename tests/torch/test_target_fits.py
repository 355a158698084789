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
