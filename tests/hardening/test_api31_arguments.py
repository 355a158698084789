"""save_arrays refuses arguments of the wrong kind at the call, before the root is made.

Found by the API review 31: ``arrays`` given as a list of pairs or a generator, ``entries`` as a
list, or a tile as a bare int raised ``TypeError``/``AttributeError`` from inside the writer,
after the root was created (and, for ``entries``, after the tensors' files were written).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.errors import UsageError

W = np.arange(12.0).reshape(3, 4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"arrays": [("w", W)]}, r"save_arrays: arrays must be a dict \(name → value\), got list"),
        ({"arrays": (a for a in [W])}, "save_arrays: arrays must be a dict .*got generator"),
        ({"arrays": None}, "save_arrays: arrays must be a dict .*got NoneType"),
        ({"entries": [1]}, r"save_arrays: entries must be a dict \(name → value\) or None"),
        ({"tiles": [(2, 2)]}, "save_arrays: tiles must be a dict .*got list"),
        ({"tiles": {"w": 2}}, r"tensor 'w': tile 2 must be a sequence of one positive int"),
        ({"tiles": {"w": "22"}}, r"tensor 'w': tile '22' must be a sequence"),
    ],
)
def test_wrong_kinds_are_refused_before_the_root_exists(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    root = tmp_path / "root"
    call: dict[str, Any] = {"arrays": {"w": W}} | kwargs
    with pytest.raises(UsageError, match=message):
        portable_ckpt.save_arrays(root, call.pop("arrays"), step=1, **call)
    assert not root.exists()


def test_tiles_as_a_numpy_array_and_any_mapping_are_taken(tmp_path: Path) -> None:
    from types import MappingProxyType

    tiles: dict[str, Any] = {"w": np.array([2, 2])}
    portable_ckpt.save_arrays(
        tmp_path, MappingProxyType({"w": W}),  # type: ignore[arg-type]
        step=1, tiles=tiles, entries=MappingProxyType({"e": 1}),  # type: ignore[arg-type]
    )
    ck = portable_ckpt.open(tmp_path)
    assert ck.read("w").tolist() == W.tolist()
    assert len(ck.tensors["w"].ranges) == 4 and ck.entry("e") == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"progress": 5}, "gc: progress must be a callable or None, got int"),
        ({"now": 5.0}, "gc: now must be a callable or None, got float"),
        ({"spare_since": "x"}, "gc: spare_since must be epoch seconds"),
        ({"spare_since": float("nan")}, "gc: spare_since must be epoch seconds"),
        ({"require_copy": 1}, "gc: require_copy must be True, False or a root URL, got 1"),
    ],
)
def test_gc_refuses_what_it_would_trip_on_part_way(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    """``progress=5`` raised ``TypeError`` after gc had deleted the first version."""
    for step in (1, 2, 3):
        portable_ckpt.save_arrays(tmp_path, {"w": W}, step=step)
    with pytest.raises(UsageError, match=message):
        portable_ckpt.gc(tmp_path, keep=1, grace_seconds=0, **kwargs)
    assert [v.step for v in portable_ckpt.list_versions(tmp_path)] == [1, 2, 3]
    done: list[tuple[int, int]] = []
    report = portable_ckpt.gc(tmp_path, keep=1, progress=lambda d, t: done.append((d, t)))
    assert len(report.deleted) == 2 and done[-1] == (2, 2)


def test_verify_refuses_a_progress_that_is_no_callable(tmp_path: Path) -> None:
    """It raised ``TypeError`` from inside the deep pass, after the other checks ran."""
    portable_ckpt.save_arrays(tmp_path, {"w": W}, step=1)
    ck = portable_ckpt.open(tmp_path)
    with pytest.raises(UsageError, match="verify: progress must be a callable or None, got int"):
        ck.verify(deep=True, progress=5)  # type: ignore[arg-type]
    # deep="no" is truthy: it ran the deep pass; a flag that is no bool is refused (review 31)
    for deep in ("no", 1, None):
        with pytest.raises(UsageError, match="verify: deep must be True or False"):
            ck.verify(deep=deep)  # type: ignore[arg-type]
    done: list[tuple[int, int]] = []
    assert ck.verify(deep=True, progress=lambda d, t: done.append((d, t))) == []
    assert done and done[-1][0] == done[-1][1]


def test_shard_writer_and_commit_refuse_arguments_of_the_wrong_kind(tmp_path: Path) -> None:
    """A path as the storage, a dict of indexes or a generator of writers was an
    ``AttributeError``/``TypeError`` from inside; ``max_file_bytes=0`` was taken."""
    from portable_ckpt.io.commit import commit
    from portable_ckpt.io.writer import ShardWriter, new_attempt_id
    from portable_ckpt.storage import open_storage

    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(1)
    with pytest.raises(UsageError, match="ShardWriter takes a storage backend, got PosixPath"):
        ShardWriter(tmp_path, attempt)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="max_file_bytes must be >= 1, got 0"):
        ShardWriter(storage, attempt, max_file_bytes=0)
    w = ShardWriter(storage, attempt, 0)
    w.add_tensor("w", W)
    index = w.finish()
    bad: list[tuple[dict[str, Any], str]] = [
        ({"indexes": {0: index}}, "commit: indexes must be a list of WriterIndex .*got dict"),
        ({"expected_writers": iter([0])}, "commit: expected_writers must be a list of writer"),
        ({"expected_writers": [0.0]}, "commit: expected_writers item must be an integer"),
    ]
    for kwargs, message in bad:
        with pytest.raises(UsageError, match=message):
            commit(storage, attempt, step=1, **kwargs)
    with pytest.raises(UsageError, match="commit takes a storage backend, got str"):
        commit(str(tmp_path), attempt, step=1, indexes=[index])  # type: ignore[arg-type]
    assert portable_ckpt.list_versions(tmp_path)[0].status == "incomplete"
    commit(storage, attempt, step=1, indexes=[index], expected_writers=range(1))
    assert portable_ckpt.open(tmp_path).read("w").tolist() == W.tolist()


def test_a_zstd_level_outside_zstd_and_a_compress_that_is_no_bool_are_refused(tmp_path: Path) -> None:
    """``ShardWriter(zstd_level=99)`` was taken (zstd clamps it without a word) and
    ``add_entry(compress="no")`` compressed (a non-empty string is true): api review 31, left by
    the reviewer."""
    from portable_ckpt.io.writer import ShardWriter, new_attempt_id
    from portable_ckpt.storage import open_storage

    storage = open_storage(str(tmp_path), create=True)
    for level, says in ((99, "at most 22"), (1.5, "must be an integer"), (-(1 << 18), "must be >=")):
        with pytest.raises(UsageError, match=says):
            ShardWriter(storage, new_attempt_id(1), 0, codec="zstd", zstd_level=level)
    assert ShardWriter(storage, new_attempt_id(1), 0, codec="zstd", zstd_level=-5).zstd_level == -5
    w = ShardWriter(storage, new_attempt_id(1), 0)
    with pytest.raises(UsageError, match="compress must be True or False, got 'no'"):
        w.add_entry("meta", {"a": 1}, schema="pck:json/1", compress="no")  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []  # nothing written by the refusals
