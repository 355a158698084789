"""Conversion review 30: the message of a user's slip names the fix.

``convert state.pt root --from hf`` (a torch.save file said to be safetensors) read the zip's
first 8 bytes as a header length: "header length 578712552184433488 is absurd", as for a
damaged download.
"""

# ruff: noqa: E402
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from test_dcp import _cli

pytestmark = pytest.mark.torch


def test_a_torch_save_file_given_as_hf_names_from_torch(tmp_path: Path) -> None:
    torch.save({"w": torch.ones(2)}, tmp_path / "state.pt")
    proc = _cli("convert", str(tmp_path / "state.pt"), str(tmp_path / "root"), "--from", "hf")
    assert proc.returncode == 1 and "[PCK-SHARD-HEADER]" in proc.stderr
    assert "not a safetensors file (it starts as a zip, as a torch.save file does: pass --from torch)" in proc.stderr
    assert not (tmp_path / "root").exists()
