"""Conversion review 30: Hugging Face safetensors -> DCP -> back.

An HF source's ``__metadata__`` (``{"format": "pt"}``, kept as the entry
``hf/safetensors_metadata``) was written to a DCP target as the byte items
``hf.safetensors_metadata.format``: DCP -> HF then refused them as values with no place in
safetensors (exit 1), and DCP's own ``dcp_to_torch_save`` gave a state dict with an ``hf`` key
that ``load_state_dict`` refuses. A mapped torch target already leaves it out.
"""

# ruff: noqa: E402
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import load_file, save_file
from test_dcp import _assert_same_nested
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from portable_ckpt.convert import convert

pytestmark = pytest.mark.torch


def test_hf_to_dcp_holds_the_weights_only_and_comes_back_to_hf(tmp_path: Path) -> None:
    torch.manual_seed(0)
    weights = {
        "model.embed.weight": torch.randn(5, 4),
        "model.norm.weight": torch.randn(4).to(torch.bfloat16),
        "lm_head.weight": torch.randn(5, 4),
    }
    (tmp_path / "hf").mkdir()
    save_file(weights, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})

    out = tmp_path / "dcp"
    convert(tmp_path / "hf", out, dst_format="dcp")
    md = FileSystemReader(str(out)).read_metadata()
    assert set(md.state_dict_metadata) == set(weights)
    assert set(md.planner_data or {}) <= set(weights)
    dcp_to_torch_save(str(out), str(tmp_path / "whole.pt"))
    # exactly the weights' names: what a model's load_state_dict takes
    _assert_same_nested(torch.load(tmp_path / "whole.pt", weights_only=True), weights)

    back = tmp_path / "back"
    rep = convert(out, back, dst_format="hf", trust_pickle=True, strict=True)
    assert rep.warnings == []
    _assert_same_nested(load_file(back / "model.safetensors"), weights)


def test_a_dcp_export_counts_the_entries_it_wrote_as_a_torch_export_does(tmp_path: Path) -> None:
    """Conversion review 30, F10: the summary of a DCP export said "0 entries" while the
    version's values and scheduler state were written as DCP items (read as "dropped")."""
    import portable_ckpt.torch as pckt

    w = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(w.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    state = {"model": w.state_dict(), "step": 7, "sched": sched}
    pckt.save(state, tmp_path / "root", step=7, continuation="statistical")
    to_dcp = convert(tmp_path / "root", tmp_path / "dcp", dst_format="dcp")
    to_torch = convert(tmp_path / "root", tmp_path / "t.pt", dst_format="torch")
    assert to_torch.entries >= 2  # the values and the scheduler
    assert to_dcp.entries == to_torch.entries
    md = FileSystemReader(str(tmp_path / "dcp")).read_metadata()
    assert "step" in md.state_dict_metadata  # what is counted was written


@pytest.mark.parametrize("target", ["dcp", "torch"])
def test_an_export_counts_the_values_not_the_record_of_their_dcp_items(
    tmp_path: Path, target: str
) -> None:
    """Re-attack 30: a version converted from torch.save holds ``torch.values`` and
    ``torch.dcp_items``; the summary counted both ("2 entries") though only the values are the
    job's, and a DCP export of ``{"w": ..., "scaler": {}}`` writes no value item at all."""
    torch.save({"w": torch.ones(2), "scaler": {}}, tmp_path / "s.pt")
    root = convert(tmp_path / "s.pt", tmp_path / "root")
    assert root.entries == 2  # a portable target carries both entries as they are
    rep = convert(tmp_path / "root", tmp_path / f"out.{target}", dst_format=target)
    assert rep.entries == 1
