"""Arguments that are not what the API takes fail with PCK-USAGE, never a bare Python error.

Found by an outside review: a NUL in a root raised ``ValueError``, ``open(5)`` ``TypeError``,
``offsets="ab"`` ``ValueError``, and float or bool offsets were truncated, so a caller's bug
read another box. Messages about odd roots and parents say what is wrong.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.cli.main import main
from portable_ckpt.errors import CheckpointError, NotFoundError, StorageError, UsageError
from portable_ckpt.io.gc import gc
from portable_ckpt.storage import open_storage


@pytest.mark.parametrize("root", ["base\x00x", 5, b"bytes-root", None, 1.5])
def test_roots_that_are_no_path(root: Any) -> None:
    for call in (
        lambda: portable_ckpt.open(root),
        lambda: portable_ckpt.list_versions(root),
        lambda: portable_ckpt.save_arrays(root, {"w": np.zeros(2)}, step=1),
        lambda: open_storage(root),
    ):
        with pytest.raises(UsageError, match=r"NUL|a root is a path"):
            call()


@pytest.mark.parametrize("offsets", ["ab", [0.5, 0], [True, 0], 5, [None, 0], [1.0, 0]])
def test_box_arguments_must_be_integers(tmp_path: Path, offsets: Any) -> None:
    portable_ckpt.save_arrays(tmp_path, {"w": np.arange(12.0).reshape(3, 4)}, step=1)
    ck = portable_ckpt.open(tmp_path)
    with pytest.raises(UsageError, match="offsets must be a sequence of integers"):
        ck.read("w", offsets=offsets, lengths=[1, 2])
    with pytest.raises(UsageError, match="lengths must be a sequence of integers"):
        ck.read("w", offsets=[0, 0], lengths=offsets)


def test_numpy_integers_are_integers(tmp_path: Path) -> None:
    portable_ckpt.save_arrays(tmp_path, {"w": np.arange(12.0).reshape(3, 4)}, step=1)
    got = portable_ckpt.open(tmp_path).read(
        "w", offsets=[np.int64(1), np.int32(0)], lengths=np.array([1, 2])
    )
    assert got.tolist() == [[4.0, 5.0]]
    # Any iterable, read once: a generator of ints is a box; one holding a bool is not.
    ck = portable_ckpt.open(tmp_path)
    assert ck.read("w", offsets=iter([1, 0]), lengths=(n for n in (1, 2))).tolist() == [[4.0, 5.0]]
    with pytest.raises(UsageError, match="offsets must be a sequence of integers"):
        ck.read("w", offsets=iter([True, 0]), lengths=[1, 2])


def test_a_root_that_is_a_file_or_fifo_is_not_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "plain").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    for name in ("plain", "fifo"):
        with pytest.raises(NotFoundError, match="is not a directory"):
            gc(tmp_path / name, keep=1)
        for argv in (["gc", str(tmp_path / name), "--keep", "1"], ["ls", str(tmp_path / name)]):
            assert main(argv) == 1
            assert "is not a directory" in capsys.readouterr().err
    with pytest.raises(NotFoundError, match="does not exist"):
        gc(tmp_path / "missing", keep=1)


def test_a_parent_that_is_a_file_is_named(tmp_path: Path) -> None:
    store = open_storage(tmp_path, create=True)
    (tmp_path / "copies").write_text("x")
    with pytest.raises(StorageError, match="/copies' exists and is not a directory"):
        store.create_if_absent("copies/c.json", b"{}")
    with pytest.raises(StorageError, match="/copies' exists and is not a directory") as info:
        store.open_writer("copies/a/b.bin")  # was "file already exists; ... never overwrite"
    assert str(tmp_path / "copies" / "a" / "b.bin") in str(info.value)


def test_local_storage_errors_name_the_full_path(tmp_path: Path) -> None:
    """With two roots at work (a copy), a relative path alone would not say which one failed."""
    store = open_storage(tmp_path, create=True)
    (tmp_path / "d").mkdir()
    with pytest.raises(CheckpointError) as info:
        store.read_into("d", 0, memoryview(bytearray(4)))
    assert str(tmp_path) in str(info.value)
    (tmp_path / "short").write_bytes(b"ab")
    with pytest.raises(CheckpointError) as info:
        store.read_into("short", 0, memoryview(bytearray(4)))
    assert repr(str(tmp_path / "short")) in str(info.value) and info.value.path == "short"


def test_a_mistyped_root_is_named_as_such(tmp_path: Path) -> None:
    """``open``, ``inspect`` and ``verify`` say the root is missing, not that it has no version."""
    (tmp_path / "plain").write_text("x")
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotFoundError, match="does not exist"):
        portable_ckpt.open(tmp_path / "typo")
    with pytest.raises(NotFoundError, match="is not a directory"):
        portable_ckpt.open(tmp_path / "plain")
    with pytest.raises(NotFoundError, match="no committed version for any step"):
        portable_ckpt.open(tmp_path / "empty")
    for cmd in ("inspect", "verify"):
        assert main([cmd, str(tmp_path / "typo")]) == 1


def test_step_bound_is_exactly_max_step(tmp_path: Path) -> None:
    """mutation audit 22 A-61: steps are 0 to MAX_STEP (10^12 - 1, twelve digits of an attempt
    id): new_attempt_id and save refuse MAX_STEP + 1 with PCK-USAGE, writing nothing, and take
    MAX_STEP."""
    from portable_ckpt.format.naming import MAX_STEP, new_attempt_id, parse_attempt_step

    assert MAX_STEP == 10**12 - 1
    assert parse_attempt_step(new_attempt_id(MAX_STEP)) == MAX_STEP
    with pytest.raises(UsageError, match="step must be an int in"):
        new_attempt_id(MAX_STEP + 1)
    root = tmp_path / "root"
    with pytest.raises(portable_ckpt.CheckpointError) as ei:
        portable_ckpt.save_arrays(root, {"w": np.ones(2, np.float32)}, step=MAX_STEP + 1)
    assert ei.value.code == "PCK-USAGE"
    assert not root.exists() or not any(root.iterdir())
    m = portable_ckpt.save_arrays(root, {"w": np.ones(2, np.float32)}, step=MAX_STEP)
    assert portable_ckpt.open(root).id == m.attempt_id
