"""read_many reads FILE_LANES files at a time, each lane with its own I/O thread, when cold.

Files are dealt to the lanes by size (largest first, to the lane with the fewest bytes).

Invariants: the values are those of a one-file-at-a-time read for any layout, every block is
verified once, a corrupt block anywhere fails the read with its own error after every lane has
stopped, and the scratch of lanes alive together is counted together. Files the storage says are
in memory are read one at a time. The tests write their files, so the page cache holds them:
``cold`` makes the storage answer "not in memory" (what it answers after the cache is dropped,
which needs root; ``test_local_storage_tells_cached_from_cold`` does that where it can).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import portable_ckpt
from portable_ckpt._threads import worker
from portable_ckpt.errors import ChecksumError
from portable_ckpt.io import _read_plan, reader
from portable_ckpt.io.commit import commit
from portable_ckpt.io.reader import ReadRequest
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.local import LocalStorage

from .helpers import sample_array, save_sharded


def _save(root: Path, writers: int, parts: int, seed: int = 0) -> dict[str, np.ndarray]:
    arrays = {
        "a": sample_array("float32", (96, 40), seed=seed),
        "b": sample_array("int16", (513,), seed=seed + 1),
        "c": sample_array("bfloat16", (7, 9, 5), seed=seed + 2),
    }
    save_sharded(root, {k: (v, (parts,) + (1,) * (v.ndim - 1)) for k, v in arrays.items()},
                 writers=writers, block_size=4096)
    return arrays


@pytest.fixture
def cold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LocalStorage, "cached", lambda self, path, offset, length: False)


class _Threads:
    """Names of the threads that read data files (wrapping the real method)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.names: set[str] = set()
        real = LocalStorage.read_extents

        def seen(storage: LocalStorage, path: str, *args: Any, **kwargs: Any) -> Any:
            if "/data/" in path:
                self.names.add(threading.current_thread().name)
            return real(storage, path, *args, **kwargs)

        monkeypatch.setattr(LocalStorage, "read_extents", seen)


def test_files_are_read_on_two_lanes_with_their_own_io_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cold: None
) -> None:
    arrays = _save(tmp_path, writers=4, parts=4)
    ck = portable_ckpt.open(tmp_path)
    assert len(ck.manifest.files) >= 4
    threads = _Threads(monkeypatch)
    got = ck.read_many([ReadRequest(k) for k in arrays])
    for k, a in arrays.items():
        np.testing.assert_array_equal(got[list(arrays).index(k)], a)
    lanes = {n.rsplit("_", 1)[0] for n in threads.names}
    # Files of one window are read by the lane itself: the calling thread and lane 1.
    assert lanes == {"MainThread", "pck-lane1"}


def test_a_small_file_between_two_large_ones_leaves_them_on_two_lanes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cold: None
) -> None:
    """A 4 -> 2 load's rank 0: writer 0's pieces, its whole tensors, writer 1's pieces."""
    st_ = open_storage(tmp_path, create=True)
    aid = new_attempt_id(1)
    big = sample_array("float32", (64, 1024), seed=1)
    idxs = []
    for w in range(2):
        sw = ShardWriter(st_, aid, w, block_size=4096)
        sw.add_tensor("w", big[w * 32 : (w + 1) * 32], offsets=(w * 32, 0), global_shape=(64, 1024))
        if w == 0:
            sw.add_tensor("step", np.array(3.0, np.float32))
        idxs.append(sw.finish())
    commit(st_, aid, step=1, indexes=idxs)
    ck = portable_ckpt.open(tmp_path)
    data = sorted(p for p in ck.manifest.files if p.startswith("data/"))
    assert len(data) == 3  # w00000-0000 (pieces) < w00000-0001 (whole) < w00001-0000 (pieces)
    readers: dict[str, set[str]] = {p: set() for p in data}
    real = LocalStorage.read_extents

    def seen(storage: LocalStorage, path: str, *args: Any, **kwargs: Any) -> Any:
        if "/data/" in path:  # the shard headers are read on the calling thread, while planning
            readers[path.split("/", 1)[1]].add(threading.current_thread().name.split("_")[0])
        return real(storage, path, *args, **kwargs)

    monkeypatch.setattr(LocalStorage, "read_extents", seen)
    got = ck.read_many([ReadRequest("w"), ReadRequest("step")])
    np.testing.assert_array_equal(got[0], big)
    assert float(got[1]) == 3.0
    # The two large files are read side by side: one on the second lane. Dealt by name, both
    # went to the first lane, and the second read only the small file.
    second = {"pck-lane1", "pck-io1"}
    assert [bool(readers[p] & second) for p in (data[0], data[2])].count(True) == 1, readers


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 1 << 30), min_size=1, max_size=12), lanes=st.integers(1, 4))
def test_balanced_lanes_hold_every_file_once_within_the_largest_file_of_even(
    sizes: list[int], lanes: int
) -> None:
    paths = [f"data/f{i:02d}" for i in range(len(sizes))]
    nbytes = dict(zip(paths, sizes, strict=True))
    share = _read_plan.balanced(paths, nbytes, lanes)
    assert len(share) == lanes
    assert sorted(p for s in share for p in s) == paths
    assert all(s == sorted(s) for s in share)
    loads = [sum(nbytes[p] for p in s) for s in share]
    # Greedy, largest first: no lane exceeds the even share by more than the largest file.
    assert max(loads) <= sum(sizes) / lanes + max(sizes)
    assert max(loads) - min(loads) <= max(sizes)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(writers=st.integers(1, 5), parts=st.integers(1, 6), seed=st.integers(0, 3),
       lo=st.integers(0, 95), n=st.integers(1, 96))
def test_lanes_read_what_one_file_at_a_time_reads(
    tmp_path_factory: pytest.TempPathFactory, cold: None, writers: int, parts: int, seed: int,
    lo: int, n: int
) -> None:
    root = tmp_path_factory.mktemp("lanes")
    arrays = _save(root, writers=writers, parts=parts, seed=seed)
    n = min(n, 96 - lo)
    reqs = [ReadRequest("a", (lo, 3), (n, 30)), ReadRequest("b"), ReadRequest("c", (1, 0, 2),
                                                                               (5, 9, 3))]
    outs = {}
    for lanes in (1, reader.FILE_LANES):
        ck = portable_ckpt.open(root)
        saved, reader.FILE_LANES = reader.FILE_LANES, lanes
        try:
            outs[lanes] = (ck.read_many(reqs), ck.stats.blocks_verified, ck.stats.bytes_read)
        finally:
            reader.FILE_LANES = saved
    (one, blocks1, bytes1), (two, blocks2, bytes2) = outs.values()
    for x, y in zip(one, two, strict=True):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(two[0], arrays["a"][lo : lo + n, 3:33])
    assert (blocks1, bytes1) == (blocks2, bytes2)


@pytest.mark.parametrize("victim", [0, 1, 2, 3])
def test_a_corrupt_block_in_any_lane_fails_after_every_lane_stopped(
    tmp_path: Path, victim: int, cold: None
) -> None:
    arrays = _save(tmp_path, writers=4, parts=4)
    ck = portable_ckpt.open(tmp_path)
    files = sorted(p for p in ck.manifest.files if p.startswith("data/"))
    path = tmp_path / ck.id / files[victim]
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF  # in the last tensor bytes of the file
    path.write_bytes(bytes(data))
    with pytest.raises(ChecksumError) as exc:
        portable_ckpt.open(tmp_path).read_many([ReadRequest(k) for k in arrays])
    assert files[victim] in str(exc.value)
    # Nothing still runs on the lanes: each answers a new job at once.
    for name in ("pck-lane1", "pck-io", "pck-io1"):
        assert worker(name).submit(lambda: 7).result(timeout=5) == 7


def test_scratch_of_lanes_alive_together_is_summed(tmp_path: Path, cold: None) -> None:
    """Strided targets need scratch windows; two lanes may hold theirs at once."""
    a = sample_array("float32", (256, 64), seed=5)
    save_sharded(tmp_path, {"a": (a, (2, 1))}, writers=2, block_size=4096)
    outs = {}
    for lanes in (1, 2):
        ck = portable_ckpt.open(tmp_path)
        saved, reader.FILE_LANES = reader.FILE_LANES, lanes
        try:
            got = ck.read_many([ReadRequest("a", (0, 1), (256, 63))])  # rows not contiguous
        finally:
            reader.FILE_LANES = saved
        np.testing.assert_array_equal(got[0], a[:, 1:])
        outs[lanes] = ck.stats.peak_scratch_bytes
    assert outs[1] > 0
    assert outs[2] > outs[1]  # both files need scratch: their sum, not the larger


def test_files_in_memory_are_read_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arrays = _save(tmp_path, writers=4, parts=4)
    ck = portable_ckpt.open(tmp_path)
    threads = _Threads(monkeypatch)
    probes: list[bool | None] = []
    real = LocalStorage.cached

    def seen(self: LocalStorage, path: str, offset: int, length: int) -> bool | None:
        probes.append(real(self, path, offset, length))
        return probes[-1]

    monkeypatch.setattr(LocalStorage, "cached", seen)
    got = ck.read_many([ReadRequest(k) for k in arrays])
    np.testing.assert_array_equal(got[0], arrays["a"])
    if not probes or not all(probes):
        pytest.skip(f"this file system does not tell what is cached (probes: {probes})")
    assert {n.rsplit("_", 1)[0] for n in threads.names} == {"MainThread"}


def test_local_storage_tells_cached_from_cold(tmp_path: Path) -> None:
    st = LocalStorage(tmp_path, create=True)
    st.put("f", os.urandom(1 << 20))
    st.read_all("f", max_size=1 << 21)
    if st.cached("f", 0, 4096) is None:
        pytest.skip("no RWF_NOWAIT here: the storage cannot tell")
    assert st.cached("f", (1 << 20) - 4096, 4096) is True
    assert st.cached("missing", 0, 4096) is None
    assert st.cached("f", 0, 0) is None
    if os.geteuid() != 0:
        return  # dropping the page cache needs root
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1")
    except OSError:
        return
    assert st.cached("f", (1 << 20) - 4096, 4096) is False
