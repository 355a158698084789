"""The node-local replication/verification plan: every held file to exactly one of its holders."""

from __future__ import annotations

from pathlib import Path

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


def test_a_node_root_holds_only_files_of_their_recorded_size(tmp_path: Path) -> None:
    """Mutation audit B N11 (mut-10): a file whose node-root copy is shorter or longer than
    its record (a truncated copy) is not held: counted as held, the copy or verify share of
    that file went to the node with the bad copy instead of the one with the whole file. A
    missing file is not held either; one a storage error answered for is unasked."""
    import numpy as np

    import portable_ckpt
    from portable_ckpt.io.versions import load_manifest
    from portable_ckpt.storage import open_storage
    from portable_ckpt.storage.faults import Fault, FaultyStorage
    from portable_ckpt.torch._manager_nodelocal import _held

    root = tmp_path / "node0"
    m = portable_ckpt.save_arrays(root, {"w": np.arange(1000.0)}, step=1)
    storage = open_storage(str(root))
    manifest = load_manifest(storage, m.attempt_id)
    paths = sorted(manifest.files)
    assert _held(storage, m.attempt_id, manifest) == [paths, []]
    data = [p for p in paths if p.startswith("data/")]
    assert data, paths
    vdir = root / m.attempt_id
    for how in ("shorter", "longer", "missing"):
        f = vdir / data[0]
        whole = f.read_bytes()
        if how == "missing":
            f.unlink()
        else:
            f.write_bytes(whole[:-1] if how == "shorter" else whole + b"\0")
        others = [p for p in paths if p != data[0]]
        assert _held(storage, m.attempt_id, manifest) == [others, []], how
        f.write_bytes(whole)
    eio = FaultyStorage(storage, [Fault(op="size", path=f"*/{data[0]}", error="EIO")])
    assert _held(eio, m.attempt_id, manifest) == [[p for p in paths if p != data[0]], [data[0]]]
