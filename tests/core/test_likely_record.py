"""The record a distributed load reads together: ``likely_record`` and ``known`` records.

A load names the attempt ``latest`` will most likely return before classifying anything, its
ranks read that record together, and ``latest`` / ``load_manifest`` take the bytes as read
(``known``). These tests pin that naming decides nothing and that known bytes are checked
exactly as bytes read from storage.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.errors import CheckpointError
from portable_ckpt.format import jsonio
from portable_ckpt.format.naming import new_attempt_id
from portable_ckpt.io.versions import latest, likely_record, load_manifest
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.local import LocalStorage


def _save(root: Path, step: int, value: float) -> str:
    portable_ckpt.save_arrays(root, {"w": np.full(4, value)}, step=step)
    return max(p.name for p in root.iterdir() if p.name.startswith(f"s{step:012d}-"))


class _Counting(LocalStorage):
    """A local storage that records which commit records were read whole."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.records: list[str] = []

    def read_all(self, path: str, *, max_size: int) -> bytes:
        if path.endswith("/manifest.json"):
            self.records.append(path.split("/")[0])
        return super().read_all(path, max_size=max_size)


def test_the_likely_record_is_the_newest_attempt_that_has_one(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path))
    assert likely_record(storage) is None  # an empty root
    a = _save(tmp_path, 1, 1.0)
    b = _save(tmp_path, 2, 2.0)
    size_b = (tmp_path / b / "manifest.json").stat().st_size
    assert likely_record(storage) == (b, size_b)
    assert likely_record(storage, 1) == (a, (tmp_path / a / "manifest.json").stat().st_size)
    assert likely_record(storage, 7) is None
    (tmp_path / new_attempt_id(9)).mkdir()  # a newer attempt that was never committed
    assert likely_record(storage) == (b, size_b)
    assert likely_record(storage, tries=1) is None  # only the newest was looked at


def test_a_record_above_the_limit_is_not_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = _save(tmp_path, 2, 2.0)
    size = (tmp_path / b / "manifest.json").stat().st_size
    monkeypatch.setattr(jsonio, "MAX_MANIFEST_BYTES", size - 1)
    assert likely_record(open_storage(str(tmp_path))) is None


def test_known_bytes_are_not_read_again_and_give_the_same_answer(tmp_path: Path) -> None:
    _save(tmp_path, 1, 1.0)
    b = _save(tmp_path, 2, 2.0)
    raw = (tmp_path / b / "manifest.json").read_bytes()
    plain = _Counting(str(tmp_path))
    found, man = latest(plain)
    assert plain.records == [b]
    given = _Counting(str(tmp_path))
    found2, man2 = latest(given, known={b: raw})
    assert given.records == [] and (found2, man2) == (found, man) and man2.source == raw
    assert load_manifest(given, b, known={b: raw}) == man and given.records == []


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: raw[: len(raw) // 2],  # cut short
        lambda raw: raw.replace(b'"step":2', b'"step":2,"step":3'),  # a duplicate key
    ],
)
def test_known_bytes_are_checked_as_bytes_read(tmp_path: Path, damage: Any) -> None:
    a = _save(tmp_path, 1, 1.0)
    b = _save(tmp_path, 2, 2.0)
    bad = damage((tmp_path / b / "manifest.json").read_bytes())
    storage = _Counting(str(tmp_path))
    # The newest record does not validate: latest goes on to the older version, as it would
    # with those bytes on storage.
    found, man = latest(storage, known={b: bad})
    assert found == a and man.step == 1 and storage.records == [a]
    with pytest.raises(CheckpointError) as err:
        load_manifest(storage, b, known={b: bad})
    assert err.value.code == "PCK-JSON-INVALID"


def test_known_bytes_of_a_deleted_version_still_decide_nothing_alone(tmp_path: Path) -> None:
    a = _save(tmp_path, 1, 1.0)
    b = _save(tmp_path, 2, 2.0)
    raw = (tmp_path / b / "manifest.json").read_bytes()
    shutil.rmtree(tmp_path / b)  # gone since the ranks read it: latest lists what is there
    found, _ = latest(open_storage(str(tmp_path)), known={b: raw})
    assert found == a
