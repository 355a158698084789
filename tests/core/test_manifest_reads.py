"""A version's commit record is read once by a copy (its bytes are republished as read)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.io.copy import copy_version
from portable_ckpt.storage.local import LocalStorage


def test_copy_reads_the_source_record_once_and_republishes_its_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    portable_ckpt.save_arrays(src, {"w": np.arange(24.0).reshape(4, 6)}, step=2)
    attempt = portable_ckpt.open(src).id
    reads: list[str] = []
    real = LocalStorage.read_all

    def counting(self: LocalStorage, path: str, *args: Any, **kwargs: Any) -> bytes:
        if self.root == str(src) and path.endswith("manifest.json"):
            reads.append(path)
        return real(self, path, *args, **kwargs)

    monkeypatch.setattr(LocalStorage, "read_all", counting)
    copy_version(str(src), str(tmp_path / "dst"))
    assert reads == [f"{attempt}/manifest.json"]
    got = (tmp_path / "dst" / attempt / "manifest.json").read_bytes()
    assert got == (src / attempt / "manifest.json").read_bytes()
    ck = portable_ckpt.open(tmp_path / "dst")
    assert ck.id == attempt and ck.verify(deep=True) == []
