"""save() keyword errors name save(), not the internal options class (outside review 12c)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

import portable_ckpt
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


def test_ctrl_c_between_tracking_and_starting_an_async_save_leaves_no_phantom(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Race review F9: a KeyboardInterrupt after the save was tracked and before its job was
    submitted left an in-flight save that nothing ran: every later save waited for it for
    ever, and the exit waited exit_timeout. The interrupted save is failed; the next works."""
    import portable_ckpt.torch.async_saving as asv

    real = asv._background
    calls = [0]

    def interrupted(job: Any) -> None:
        calls[0] += 1
        if calls[0] == 1:
            raise KeyboardInterrupt  # Ctrl-C right before the job is submitted
        real(job)

    monkeypatch.setattr(asv, "_background", interrupted)
    state = {"w": torch.arange(8.0)}
    with pytest.raises(KeyboardInterrupt):
        pckt.async_save(state, tmp_path, step=1, continuation="statistical")
    h = pckt.async_save(state, tmp_path, step=2, continuation="statistical", if_busy="wait")
    assert h.result(timeout=60).step == 2
    assert [v.step for v in portable_ckpt.list_versions(tmp_path)] == [2]


def test_ctrl_c_after_the_commit_record_is_linked_keeps_the_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Notebook review F1: a KeyboardInterrupt after the commit record was linked (its
    directory sync, or the commit's return, still running) was taken for a failed save: every
    data, entry and index file was removed and the record stayed, so `load(root)` and
    `ls --latest` took a version without its data. The outcome is unknown there: nothing is
    removed, the version stays whole and loads; the interrupt reaches the caller."""
    import portable_ckpt.storage.local as local

    real = local.LocalStorage.create_if_absent
    calls = [0]

    def linked_then_interrupted(self: Any, path: str, data: bytes) -> bool:
        created = real(self, path, data)
        if path.endswith("/manifest.json"):
            calls[0] += 1
            if calls[0] == 1:
                raise KeyboardInterrupt  # Ctrl-C right after the link
        return created

    monkeypatch.setattr(local.LocalStorage, "create_if_absent", linked_then_interrupted)
    state = {"w": torch.arange(8.0)}
    with pytest.raises(KeyboardInterrupt):
        pckt.save(state, tmp_path, step=1, continuation="statistical")
    back = {"w": torch.zeros(8)}
    info = pckt.load(back, tmp_path)
    assert info.step == 1 and torch.equal(back["w"], state["w"])
    assert portable_ckpt.open(tmp_path).verify(deep=True) == []
