"""save() keyword errors name save(), not the internal options class (outside review 12c)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

import torch

import portable_ckpt.torch as pckt
from portable_ckpt.errors import UsageError

pytestmark = pytest.mark.torch


def test_save_without_step_names_save(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"save\(\) needs the keyword argument step=") as e:
        pckt.save({"w": torch.zeros(2)}, str(tmp_path))  # type: ignore[call-arg]
    assert "SaveOptions" not in str(e.value)
    assert list(tmp_path.iterdir()) == []  # refused before anything was touched
    assert pckt.save({"w": torch.zeros(2)}, str(tmp_path), step=1).step == 1


def test_async_save_without_step_names_async_save(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"async_save\(\) needs the keyword argument step="):
        pckt.async_save({"w": torch.zeros(2)}, str(tmp_path))  # type: ignore[call-arg]
    assert list(tmp_path.iterdir()) == []
    handle = pckt.async_save({"w": torch.zeros(2)}, str(tmp_path), step=2)
    assert handle.committed.result(timeout=60).step == 2
