"""Mutation audit 31a, the storage's clock and its probes (spec §15.2; ``io/clock.py``): which
time a probe gives, and whether two URLs name one root (``None`` when it cannot tell).

Each test names the mutant it kills.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from portable_ckpt.io.clock import same_root, storage_clock
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.faults import Fault, FaultyStorage


def test_two_roots_are_told_apart_and_one_root_is_told_by_another_spelling(
    tmp_path: Path,
) -> None:
    """A probe put through one root shows in the other only when they are one root. Mutant
    C04 (every pair "the same root"): ``gc --require-copy`` would count no copy anywhere."""
    a, b = open_storage(tmp_path / "a", create=True), open_storage(tmp_path / "b", create=True)
    assert same_root(a, b) is False
    assert same_root(a, open_storage(f"{tmp_path}/b/../a")) is True
    assert [p.name for p in (tmp_path / "a").iterdir()] == []  # the probe is removed


def test_a_root_that_cannot_be_asked_is_undecided_not_another_root(tmp_path: Path) -> None:
    """``None`` when the other root refuses the probe, or the root cannot say whether it shows
    it: nothing is known. Mutants C05 and C09 (``False``): a root that could not be asked was
    taken for an independent copy."""
    a, b = open_storage(tmp_path / "a", create=True), open_storage(tmp_path / "b", create=True)
    refusing = FaultyStorage(b, [Fault(op=("open", "write", "create"), path="*", error="EROFS")])
    assert same_root(a, refusing) is None
    mute = FaultyStorage(a, [Fault(op="exists", path="*", error="EIO")])
    assert same_root(mute, a) is None


def test_the_clock_is_the_time_of_its_own_probe(tmp_path: Path) -> None:
    """Another probe the listing shows (one dated ahead by another host's clock, younger than
    an hour's leftovers) is not the storage's time now. Mutant C08 (the newest probe listed):
    the root's clock read a day ahead, and gc aged every attempt by a day."""
    storage = open_storage(tmp_path, create=True)
    other = tmp_path / ".pck-clock-00112233445566ff"
    other.write_bytes(b"")
    ahead = time.time() + 86_400
    os.utime(other, (ahead, ahead))
    now = storage_clock(storage)
    assert now is not None and abs(now - time.time()) < 600
    assert other.exists()  # not a leftover: kept
