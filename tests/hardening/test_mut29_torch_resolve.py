"""Mutation audit 29, a load's first phase (:mod:`portable_ckpt.torch._load_resolve`).

The slices every rank reads of the commit record must join into the whole record, a short
read must count as a failure, a given attempt id must hold the step asked for, and a record
a rank read together but could not parse must fail the load where it is used.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import portable_ckpt.torch as pckt  # noqa: E402
from portable_ckpt.errors import CheckpointError, UsageError  # noqa: E402
from portable_ckpt.format.naming import ATTEMPT_ID_RE  # noqa: E402
from portable_ckpt.storage.local import LocalStorage  # noqa: E402
from portable_ckpt.torch._collectives import Comm  # noqa: E402
from portable_ckpt.torch._load_resolve import (  # noqa: E402
    _FAILED,
    _READ,
    MIN_SLICE,
    RecordShare,
    _slice,
    received,
)


def _record(tmp_path: Path, size: int) -> tuple[LocalStorage, bytes]:
    (tmp_path / "v").mkdir()
    data = bytes(i % 251 for i in range(size))
    (tmp_path / "v" / "manifest.json").write_bytes(data)
    return LocalStorage(tmp_path), data


def test_the_ranks_slices_join_into_the_whole_record(tmp_path: Path) -> None:
    """A size that three ranks do not divide: the slices round up (mutant R9 lost a byte)."""
    size = 3 * MIN_SLICE + 2
    storage, data = _record(tmp_path, size)
    parts = [_slice(storage, "v", size, rank, 3) for rank in range(3)]
    assert all(p[:1] == _READ for p in parts)
    assert b"".join(p[1:] for p in parts) == data


def test_a_slice_read_short_is_a_failed_slice(tmp_path: Path) -> None:
    """The record shrank after rank 0 sized it: the last slice cannot be read whole.

    (The storage refuses the short range itself: mutant R11, dropping the length check
    behind it, is equivalent with every storage of the package.)
    """
    storage, _ = _record(tmp_path, MIN_SLICE + 10)
    assert _slice(storage, "v", MIN_SLICE + 20, 1, 2) == _FAILED
    assert _slice(storage, "v", MIN_SLICE + 10, 1, 2)[:1] == _READ


def test_a_given_attempt_of_another_step_is_refused(tmp_path: Path) -> None:
    """``checkpoint_id`` and ``step`` must agree (mutant R1 loaded the id's step silently)."""
    info = pckt.save({"w": torch.ones(2)}, tmp_path, step=3, continuation="statistical")
    target = {"w": torch.zeros(2)}
    with pytest.raises(UsageError, match=f"version {info.checkpoint_id} holds step 3, not 4"):
        pckt.load(target, tmp_path, checkpoint_id=info.checkpoint_id, step=4)
    assert target["w"].tolist() == [0.0, 0.0]
    assert pckt.load(target, tmp_path, checkpoint_id=info.checkpoint_id, step=3).step == 3


def test_a_record_read_together_that_did_not_parse_fails_where_it_is_used(tmp_path: Path) -> None:
    """A rank > 0 keeps the parse error of the record it assembled; the load step raises it
    (mutant R14 handed the error on as the manifest)."""
    info = pckt.save({"w": torch.ones(2)}, tmp_path, step=1, continuation="statistical")
    attempt = info.checkpoint_id
    assert ATTEMPT_ID_RE.match(attempt)
    share = RecordShare(Comm(1, 2, None, [0, 1], 5.0))
    share.likely, share.record = attempt, b'{"format": '
    try:
        received(share.record, attempt)
    except CheckpointError as e:
        share._parsed = e
    with pytest.raises(CheckpointError, match="from rank 0"):
        share.manifest(attempt, b"")
