"""Work per tensor of save and load, by call counts (issue 13: many small tensors).

A state of thousands of small tensors (biases, norms, adapters, optimizer steps) pays every
per-tensor step of a save or load thousands of times. These tests count the steps that were
made twice or needlessly (time is `python -m bench.small_tensors`'s, never asserted here); the
checks themselves still run once, and the values still round-trip exactly.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

import portable_ckpt.torch as pckt
from portable_ckpt.format import manifest
from portable_ckpt.format.manifest import WriterIndex
from portable_ckpt.io import _read_plan
from portable_ckpt.torch import _hyperparameters, _load_values

pytestmark = pytest.mark.torch

N = 40  # parameters: 3 tensors each (weight, two moments) and a step


def _state(fill: float) -> dict[str, Any]:
    model = {f"layers.{i}.w": torch.full((4, 8), fill + i) for i in range(N)}
    optim = {k: {"exp_avg": torch.full((4, 8), fill), "exp_avg_sq": torch.full((4, 8), fill),
                 "step": torch.tensor(fill)} for k in model}
    groups = [{"lr": 0.1, "betas": [0.9, 0.999], "params": sorted(model)}]
    return {"model": model, "optim": {"state": optim, "param_groups": groups}}


def _count(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[int]:
    calls = [0]
    real = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_save_parses_each_tensor_entry_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The committer's own index stays in memory: not encoded, sent to itself, decoded and
    validated again (each tensor entry was parsed twice per save: the index and the record)."""
    state = _state(1.0)
    tensors = 4 * N
    transports = _count(monkeypatch, WriterIndex, "from_transport")
    entries = _count(monkeypatch, manifest, "_tensor")
    pckt.save(state, str(tmp_path), step=1, continuation="statistical")
    assert transports[0] == 0
    assert entries[0] == tensors  # the record is still parsed as a reader parses it
    target = _state(0.0)
    pckt.load(target, str(tmp_path))
    assert all(torch.equal(target["model"][k], state["model"][k]) for k in state["model"])
    assert torch.equal(target["optim"]["state"]["layers.3.w"]["step"], torch.tensor(1.0))


def test_planner_boxes_are_not_converted_again() -> None:
    """A tuple of ints (every box the planner makes) is taken as it is; other sequences are
    converted, and bools and floats refused, as before."""
    box = (0, 4, 8)
    assert _read_plan._indices(box, "offsets", "k") is box
    assert _read_plan._indices([0, 4], "offsets", "k") == (0, 4)
    for bad in ((0, True), (0, 0.5), [1.0]):
        with pytest.raises(Exception, match="must be a sequence of integers"):
            _read_plan._indices(bad, "offsets", "k")


class _Counted:
    def __init__(self, pattern: re.Pattern[str]) -> None:
        self.pattern, self.texts = pattern, list[str]()

    def match(self, text: str) -> re.Match[str] | None:
        self.texts.append(text)
        return self.pattern.match(text)


def test_load_matches_param_group_pattern_only_on_group_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The param-group pattern (whose leading ``(.*)/`` backtracks over a key) runs on keys
    holding ``param_groups/``, not on every tensor's key; groups still load."""
    pckt.save(_state(1.0), str(tmp_path), step=1, continuation="statistical")
    counted = _Counted(_hyperparameters.GROUP_MEMBER)
    monkeypatch.setattr(_hyperparameters, "GROUP_MEMBER", counted)
    monkeypatch.setattr(_load_values, "GROUP_MEMBER", counted)
    target = _state(0.0)
    target["optim"]["param_groups"][0]["lr"] = 0.5
    pckt.load(target, str(tmp_path))
    assert target["optim"]["param_groups"][0]["lr"] == 0.1
    assert counted.texts  # the group members were matched ...
    assert all("param_groups/" in t for t in counted.texts)  # ... and no tensor's key
