"""Conversion review 30: a torch.save state with an empty dict, exported to DCP.

``torch.save({"model": ..., "optim": ..., "scaler": GradScaler(enabled=False).state_dict()})``
holds ``"scaler": {}``. The conversion keeps the empty dict (for the way back to torch.save),
and the DCP view of the version showed it as an item ``scaler``, which DCP's own flattening
never writes. The extra item sends ``dcp.load`` into its pre-2.4 key scheme, where the
optimizer's param groups are one item ``optim``: stock ``dcp.load`` of the job's state failed
with "Missing key in checkpoint state_dict: optim", through ``convert --to dcp`` and through
``PortableStorageReader`` alike.
"""

# ruff: noqa: E402
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from test_dcp import _assert_same_nested, _zeros_like_nested
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from portable_ckpt.convert import convert
from portable_ckpt.torch.dcp import PortableStorageReader

pytestmark = pytest.mark.torch


def _job_state() -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optim = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(4, 3)).sum().backward()
    optim.step()
    scaler = torch.amp.GradScaler("cpu", enabled=False)  # AMP off: its state_dict() is {}
    return {"model": model.state_dict(), "optim": optim.state_dict(), "scaler": scaler.state_dict()}


def test_an_empty_dict_is_no_dcp_item_and_stock_dcp_load_reads_the_export(tmp_path: Path) -> None:
    state = _job_state()
    assert state["scaler"] == {}
    torch.save(state, tmp_path / "ckpt.pt")
    dcp_save(state, checkpoint_id=str(tmp_path / "stock"), no_dist=True)

    out = tmp_path / "exported"
    convert(tmp_path / "ckpt.pt", out, dst_format="dcp")
    stock_md = FileSystemReader(str(tmp_path / "stock")).read_metadata()
    out_md = FileSystemReader(str(out)).read_metadata()
    assert set(out_md.state_dict_metadata) == set(stock_md.state_dict_metadata)
    assert "scaler" not in out_md.state_dict_metadata

    target = _zeros_like_nested(state)
    dcp_load(target, checkpoint_id=str(out), no_dist=True)
    _assert_same_nested(target, state)


def test_a_converted_version_with_an_empty_dict_loads_through_the_storage_reader(
    tmp_path: Path,
) -> None:
    state = _job_state()
    torch.save(state, tmp_path / "ckpt.pt")
    root = tmp_path / "root"
    convert(tmp_path / "ckpt.pt", root)

    target = _zeros_like_nested(state)
    dcp_load(target, storage_reader=PortableStorageReader(str(root)), no_dist=True)
    _assert_same_nested(target, state)
    # the version keeps the empty dict: the way back to torch.save gives it
    convert(root, tmp_path / "back.pt", dst_format="torch")
    assert torch.load(tmp_path / "back.pt", weights_only=True)["scaler"] == {}
