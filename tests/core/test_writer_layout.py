"""Writer layout choices for cheap reads: per-file checksum block size, smallest chunks first,
whole tensors apart from pieces."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import portable_ckpt
from portable_ckpt.io.checksum import (
    AUTO_FILE_BLOCKS,
    DEFAULT_BLOCK_SIZE,
    MIN_BLOCK_SIZE,
    auto_block_size,
    file_blocks_for,
)
from portable_ckpt.io.commit import commit
from portable_ckpt.io.reader import ReadRequest
from portable_ckpt.io.writer import (
    SMALL_PIECE_BYTES,
    ShardWriter,
    WriteStats,
    _joined,
    new_attempt_id,
)
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.base import StreamWriter
from portable_ckpt.storage.local import LocalStorage


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 1 << 40), st.integers(1, 1 << 20))
def test_auto_block_size_is_the_smallest_fitting_power_of_two(nbytes: int, blocks: int) -> None:
    bs = auto_block_size(nbytes, blocks)
    assert MIN_BLOCK_SIZE <= bs <= DEFAULT_BLOCK_SIZE and bs & (bs - 1) == 0
    # At most `blocks` blocks unless capped at 256 KiB; one size smaller would need more.
    assert -(-nbytes // bs) <= blocks or bs == DEFAULT_BLOCK_SIZE
    assert bs == MIN_BLOCK_SIZE or -(-nbytes // (bs // 2)) > blocks


def test_job_budget_shares_blocks_between_writers() -> None:
    assert file_blocks_for(1) == file_blocks_for(4) == AUTO_FILE_BLOCKS
    assert file_blocks_for(4096) == 1024 and file_blocks_for(10**6) == 64
    # A 200 MB shard of a 4,096-writer job keeps 256 KiB blocks (the manifest does not grow).
    assert auto_block_size(200 << 20, file_blocks_for(4096)) == DEFAULT_BLOCK_SIZE
    # The realistic state's 235 MiB shards on 4 ranks get 64 KiB blocks, 6 MB ones 4 KiB.
    assert auto_block_size(235 << 20, file_blocks_for(4)) == 64 << 10
    assert auto_block_size(6 << 20, file_blocks_for(4)) == 4 << 10


def _header(path) -> list[tuple[str, int]]:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    doc = json.loads(raw[8 : 8 + n])
    doc.pop("__metadata__")
    return sorted(((k, v["data_offsets"][0]) for k, v in doc.items()), key=lambda kv: kv[1])


def test_shards_store_small_chunks_first_with_a_per_file_block_size(tmp_path) -> None:
    storage = open_storage(tmp_path, create=True)
    aid = new_attempt_id(1)
    w = ShardWriter(storage, aid, 0)
    big = np.arange(300_000, dtype=np.float32)
    w.add_tensor("a.big", big)
    steps = {f"s{i}.step": np.array(float(i), np.float32) for i in range(50)}
    for k, v in steps.items():
        w.add_tensor(k, v)
    w.add_tensor("a.bias", np.arange(700, dtype=np.float32))
    idx = w.finish()
    commit(storage, aid, step=1, indexes=[idx])
    ck = portable_ckpt.open(tmp_path)
    (rel, rec), = [(p, r) for p, r in ck.manifest.files.items() if p.startswith("data/")]
    assert rec.checksum.block_size == auto_block_size(rec.size) == 4096
    order = [k.split("@")[0] for k, _ in _header(tmp_path / aid / rel)]
    assert order[:50] == list(steps) and order[50:] == ["a.bias", "a.big"]  # stable, by size
    # Entry and index files get their own (small) blocks too.
    assert all(r.checksum.block_size == MIN_BLOCK_SIZE for p, r in ck.manifest.files.items()
               if not p.startswith("data/"))
    # Every step scalar lies in the header's blocks: reading them costs no read past those.
    got = ck.read_many([ReadRequest(k) for k in steps])
    assert [float(g) for g in got] == [float(v) for v in steps.values()]
    header_blocks = -(-(ck._headers[rel].data_start + 50 * 4) // 4096) * 4096
    assert ck.stats.bytes_read <= header_blocks
    np.testing.assert_array_equal(ck.read("a.big"), big)


def test_whole_tensors_get_a_file_of_their_own_beside_pieces(tmp_path) -> None:
    """Replicated values beside a sharded state: the other ranks read a small header for them."""
    storage = open_storage(tmp_path, create=True)
    aid = new_attempt_id(1)
    idxs = []
    steps = {f"p{i}.step": np.array(float(i), np.float32) for i in range(40)}
    for rank in range(2):
        w = ShardWriter(storage, aid, rank)
        for i in range(40):  # 40 weights sharded over 2 writers, rows [rank*8, rank*8+8)
            w.add_tensor(f"p{i}.w", np.full((8, 64), rank * 100 + i, np.float32),
                         offsets=(rank * 8, 0), global_shape=(16, 64))
        if rank == 0:  # only writer 0 holds the replicated step counters
            for k, v in steps.items():
                w.add_tensor(k, v)
        idxs.append(w.finish())
    commit(storage, aid, step=1, indexes=idxs)
    ck = portable_ckpt.open(tmp_path)
    files = {k: {r.file for r in t.ranges} for k, t in ck.tensors.items()}
    pieces0 = files["p0.w"] - {f for f in files["p0.w"] if "w00001" in f}
    whole = set().union(*(files[k] for k in steps))
    assert len(whole) == 1 and whole.isdisjoint(pieces0)  # rank 0: two files
    assert sorted(p for p in ck.manifest.files if p.startswith("data/w00001")) == [
        "data/w00001-0000.safetensors"]  # pieces only: one file, as before
    # A rank-1 reader of its rows and every step counter touches none of rank 0's pieces file.
    got = ck.read_many([ReadRequest(f"p{i}.w", (8, 0), (8, 64)) for i in range(40)]
                       + [ReadRequest(k) for k in steps])
    assert [float(g) for g in got[40:]] == [float(v) for v in steps.values()]
    assert all((g == 100 + i).all() for i, g in enumerate(got[:40]))
    (pieces_file,) = pieces0
    assert pieces_file not in ck._headers
    # A writer of whole tensors only keeps one file.
    w = ShardWriter(storage, new_attempt_id(2), 0)
    w.add_tensor("a", np.zeros(3, np.float32))
    w.add_tensor("b", np.zeros(5, np.float32))
    assert len([p for p in w.finish().files if p.startswith("data/")]) == 1


def test_explicit_block_size_is_kept(tmp_path) -> None:
    storage = open_storage(tmp_path, create=True)
    aid = new_attempt_id(1)
    w = ShardWriter(storage, aid, 0, block_size=1 << 16)
    w.add_tensor("w", np.zeros(10, np.float32))
    idx = w.finish()
    assert {r.checksum.block_size for r in idx.files.values()} == {1 << 16}


class _CountingStorage(LocalStorage):
    """A local root that counts the ``write`` calls each file receives (the real files)."""

    def __init__(self, root: str) -> None:
        super().__init__(root, create=True)
        self.writes: dict[str, list[int]] = {}

    def open_writer(self, path: str, *, defer_sync: bool = False) -> StreamWriter:
        inner = super().open_writer(path, defer_sync=defer_sync)
        sizes = self.writes.setdefault(path, [])

        class Counting(StreamWriter):
            def write(self, data: memoryview | bytes) -> None:
                sizes.append(len(data))
                inner.write(data)

            def close(self) -> None:
                inner.close()

            def abort(self) -> None:
                inner.abort()

        return Counting()


def test_small_chunks_are_joined_into_few_writes(tmp_path) -> None:
    """300 tiny chunks (mixed dtypes, one strided) reach the file in one write, not 300."""
    storage = _CountingStorage(str(tmp_path))
    aid = new_attempt_id(1)
    w = ShardWriter(storage, aid, 0)
    dtypes = (np.float32, np.int64, bool)
    tiny = {f"t{i}": (np.arange(i % 7 + 1) % 2).astype(dtypes[i % 3]) for i in range(300)}
    tiny["strided"] = np.arange(64, dtype=np.float64).reshape(8, 8)[:, ::2]
    mid = np.arange(300 << 8, dtype=np.float32)  # 300 KiB: written on its own
    big = np.arange(1 << 18, dtype=np.float32)  # 1 MiB
    for k, v in tiny.items():
        w.add_tensor(k, v)
    w.add_tensor("mid", mid)
    w.add_tensor("big", big)
    commit(storage, aid, step=1, indexes=[w.finish()])
    (data, sizes), = [(p, s) for p, s in storage.writes.items() if "/data/" in p]
    assert len(sizes) == 4, sizes  # header, the joined tiny chunks, mid, big
    assert sum(sizes) == (tmp_path / data).stat().st_size
    ck = portable_ckpt.open(tmp_path)
    assert ck.verify(deep=True) == []
    for k, v in {**tiny, "mid": mid, "big": big}.items():
        np.testing.assert_array_equal(ck.read(k), v)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0, 1, 100, SMALL_PIECE_BYTES - 1, SMALL_PIECE_BYTES,
                                 300 << 10, 700 << 10]), max_size=12))
def test_joining_keeps_the_bytes_and_their_order(sizes: list[int]) -> None:
    pieces = [memoryview(bytes([i % 251]) * n) for i, n in enumerate(sizes)]
    out = list(_joined(iter(pieces), WriteStats()))
    assert b"".join(out) == b"".join(pieces)
    # Large pieces pass through as they are (no copy), in order; the rest are joined runs.
    big = [p for p in pieces if len(p) >= SMALL_PIECE_BYTES]
    passed = [p for p in out if any(p is q for q in big)]
    assert len(passed) == len(big) and all(a is b for a, b in zip(passed, big, strict=True))
    joined = [p for p in out if not any(p is q for q in big)]
    assert all(0 < len(p) < (1 << 20) + SMALL_PIECE_BYTES for p in joined)  # bounded buffers


def test_a_failed_write_leaves_no_empty_attempt(tmp_path: Path) -> None:
    """Resource review R7: a save that failed removed its files but left its attempt's empty
    directories; a job whose saves kept failing (a flapping disk) piled them up until a later
    run's gc. A file-size limit (RLIMIT_FSIZE, EFBIG) makes a real write fail here."""
    import subprocess
    import sys
    import textwrap

    root = tmp_path / "root"
    code = textwrap.dedent(f"""
        import resource, numpy as np, portable_ckpt
        portable_ckpt.save_arrays({str(root)!r}, {{"w": np.ones(8, np.float32)}}, step=1)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, resource.RLIM_INFINITY))
        try:
            portable_ckpt.save_arrays({str(root)!r}, {{"w": np.ones(1 << 18, np.float32)}},
                                      step=2)
        except portable_ckpt.CheckpointError as e:
            print(e.code)
    """)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120, check=False)
    assert p.stdout.strip() == "PCK-STORAGE", p.stdout + p.stderr
    (only,) = sorted(d.name for d in root.iterdir())  # the committed step 1, nothing else
    assert only.startswith("s000000000001-"), only


def test_removing_an_attempts_empty_directories_follows_no_link(tmp_path: Path) -> None:
    """Last review L5: an attempt directory swapped for a link to elsewhere had the empty
    directories below the link's target removed by an aborting writer."""
    from portable_ckpt.storage.local import LocalStorage

    outside = tmp_path / "outside"
    (outside / "keep" / "empty1").mkdir(parents=True)
    (outside / "empty2").mkdir()
    (outside / "keep" / "file").write_text("x")
    root = tmp_path / "root"
    root.mkdir()
    attempt = "s000000000001-20260101T000000000000Z-0123456789abcdef"
    (root / attempt).symlink_to(outside)
    LocalStorage(str(root)).remove_empty_dirs(attempt)
    assert (outside / "empty2").is_dir() and (outside / "keep" / "empty1").is_dir()
    (root / attempt).unlink()
    (root / attempt / "data").mkdir(parents=True)
    LocalStorage(str(root)).remove_empty_dirs(attempt)
    assert not (root / attempt).exists()


def test_a_writers_own_failure_leaves_the_attempts_directories(tmp_path: Path) -> None:
    """Last review L6: a writer aborting on its own failure removed the attempt's empty
    directories while a peer could be between creating one and a file in it (a spurious
    ENOENT listed first). Only an abort after the failure is known everywhere removes them."""
    from portable_ckpt.io.writer import ShardWriter
    from portable_ckpt.storage.local import LocalStorage

    storage = LocalStorage(str(tmp_path))
    attempt = "s000000000001-20260101T000000000000Z-0123456789abcdef"
    (tmp_path / attempt / "data").mkdir(parents=True)  # a peer's, about to hold its file
    ShardWriter(storage, attempt, 1).abort()
    assert (tmp_path / attempt / "data").is_dir()
    ShardWriter(storage, attempt, 1).abort(dirs=True)
    assert not (tmp_path / attempt).exists()


def test_a_failed_saves_deferred_fsync_does_not_fail_the_next_save(
    tmp_path, monkeypatch
) -> None:
    """Re-attack 28, 3: a save whose first shard's deferred fsync failed (EDQUOT) and whose
    second shard's write failed left that fsync's error pending in the storage; the next
    save on the same storage object (a manager's tier keeps one) failed with it, though the
    failed save's abort had deleted the file. An error of a file deleted since is nobody's."""
    import errno

    import portable_ckpt.storage.local as L
    from portable_ckpt.errors import StorageError
    from portable_ckpt.io.writer import ShardWriter, new_attempt_id

    storage = open_storage(tmp_path / "r")
    first = new_attempt_id(1)
    real_fsync, real_write = L._fsync_close, L._LocalWriter.write

    def bad_fsync(fd: int, rel: str, full: str) -> None:
        if first in rel and "w00000-0000" in rel:
            os.close(fd)
            raise L._os_error("fsync", rel, OSError(errno.EDQUOT, "Disk quota exceeded"), full)
        real_fsync(fd, rel, full)

    def bad_write(self, data):  # type: ignore[no-untyped-def]
        if first in self._rel and "w00000-0001" in self._rel:
            raise L._os_error("write", self._rel, OSError(errno.EDQUOT, "Disk quota exceeded"),
                              self._full)
        return real_write(self, data)

    monkeypatch.setattr(L, "_fsync_close", bad_fsync)
    monkeypatch.setattr(L._LocalWriter, "write", bad_write)
    w = ShardWriter(storage, first, 0, max_file_bytes=5000)
    for i in range(3):
        w.add_tensor(f"t{i}", np.arange(1000, dtype=np.float32), offsets=(0,),
                     global_shape=(1000,))
    try:
        w.finish()
    except StorageError:
        w.abort(dirs=True)  # as a failed save does
    else:
        raise AssertionError("the injected write failure did not fail the save")
    assert not (tmp_path / "r" / first / "data").exists()
    monkeypatch.undo()  # the quota is raised
    w2 = ShardWriter(storage, new_attempt_id(2), 0)
    w2.add_tensor("t", np.arange(10, dtype=np.float32), offsets=(0,), global_shape=(10,))
    assert w2.finish().files  # no error of the first save's deleted file
