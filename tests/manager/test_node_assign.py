"""The node-local replication/verification plan: every held file to exactly one of its holders."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from hypothesis import given
from hypothesis import strategies as st

from portable_ckpt.format.manifest import Checksum, FileRecord
from portable_ckpt.torch._manager_nodelocal import assign_files

pytestmark = pytest.mark.torch


def _rec(path: str, size: int) -> FileRecord:
    return FileRecord(path, size, Checksum("crc32c", 1 << 20, "00000000"))


@given(
    st.integers(1, 6).flatmap(
        lambda world: st.tuples(
            st.just(world),
            st.lists(
                st.tuples(
                    st.integers(0, 9), st.integers(0, 1000), st.sets(st.integers(0, world - 1))
                ),
                max_size=20,
            ),
        )
    )
)
def test_each_held_file_goes_to_one_holder_own_writer_first(case: tuple[int, list]) -> None:  # type: ignore[type-arg]
    world, specs = case
    files = {
        f"data/w{w:05d}-{i:04d}.safetensors": _rec(f"data/w{w:05d}-{i:04d}.safetensors", n)
        for i, (w, n, _) in enumerate(specs)
    }
    held: list[list[str]] = [[] for _ in range(world)]
    holders = {}
    for i, (w, _, hs) in enumerate(specs):
        path = f"data/w{w:05d}-{i:04d}.safetensors"
        holders[path] = hs
        for r in hs:
            held[r].append(path)
    share, missing = assign_files(files, held)
    assert missing == sorted(p for p, hs in holders.items() if not hs)
    assigned = [p for s in share for p in s]
    assert sorted(assigned) == sorted(p for p, hs in holders.items() if hs)  # exactly once
    for r, paths in enumerate(share):
        for p in paths:
            assert r in holders[p]
            writer = int(p[6:11])
            assert writer not in holders[p] or writer == r  # the writer handles its own file
    assert assign_files(files, held) == (share, missing)  # deterministic
