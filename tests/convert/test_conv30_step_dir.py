"""Conversion review 30: a file's step from the directory that holds it.

The Hugging Face Trainer writes ``checkpoint-500/model.safetensors`` and DeepSpeed
``global_step100/mp_rank_00_model_states.pt``. Converting the directory gave step 500, the file
in it step 0: a batch that converts each checkpoint's file into one root committed every one at
step 0, so the root's latest version was the last converted, not the newest step.
"""

# ruff: noqa: E402
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import save_file

import portable_ckpt
from portable_ckpt.convert import convert

pytestmark = pytest.mark.torch


def test_a_file_takes_the_step_of_its_checkpoint_directory(tmp_path: Path) -> None:
    hf = tmp_path / "checkpoint-500" / "model.safetensors"
    hf.parent.mkdir()
    save_file({"w": torch.ones(2)}, hf)
    ds = tmp_path / "global_step100" / "mp_rank_00_model_states.pt"
    ds.parent.mkdir()
    torch.save({"module": {"w": torch.ones(2)}}, ds)
    root = tmp_path / "root"

    rep = convert(ds, root)
    assert (rep.step, rep.step_source) == (100, "the name of the source's directory 'global_step100'")
    rep = convert(hf, root)
    assert (rep.step, rep.step_source) == (500, "the name of the source's directory 'checkpoint-500'")
    assert portable_ckpt.open(root).step == 500  # the newest step is the root's latest version


def test_the_file_name_and_a_recorded_step_come_first(tmp_path: Path) -> None:
    d = tmp_path / "checkpoint-500"
    d.mkdir()
    torch.save({"w": torch.ones(2)}, d / "step_7.pt")
    torch.save({"w": torch.ones(2), "global_step": 9}, d / "state.pt")
    (tmp_path / "run").mkdir()
    torch.save({"w": torch.ones(2)}, tmp_path / "run" / "state.pt")

    assert convert(d / "step_7.pt", tmp_path / "a").step == 7
    assert convert(d / "state.pt", tmp_path / "b").step == 9
    rep = convert(tmp_path / "run" / "state.pt", tmp_path / "c")
    assert rep.step == 0 and "records no step" in rep.step_source
