"""Mutation audit 30, the shard writer (``io/writer.py``): argument bounds and the memory a
write may use, which the round-trip tests pass through without looking at.

Each test names the mutant it kills (table in the audit's ``mutants.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.errors import UsageError
from portable_ckpt.io.commit import commit
from portable_ckpt.io.writer import SMALL_PIECE_BYTES, ShardWriter, new_attempt_id
from portable_ckpt.storage import open_storage


@pytest.mark.parametrize("block_size", [2048, 6144, 4097, 1 << 31, True])
def test_a_block_size_outside_the_format_is_refused_before_any_write(
    tmp_path: Path, block_size: int
) -> None:
    """Spec §6.2: a checksum block size is a power of two in [4 KiB, 1 GiB]. Mutants W05
    (2048 accepted), W06 (2^31 accepted), W07 (no power-of-two check): the writer would
    store files whose records every reader refuses, and the refusal came at the commit."""
    storage = open_storage(tmp_path, create=True)
    with pytest.raises(UsageError, match="power of two in \\[4096, 2\\^30\\]"):
        ShardWriter(storage, new_attempt_id(1), 0, block_size=block_size)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("block_size", [4096, 1 << 30])
def test_the_block_size_bounds_themselves_are_accepted(tmp_path: Path, block_size: int) -> None:
    """The bounds of §6.2 are inclusive: 4 KiB and 1 GiB blocks make valid versions."""
    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(1)
    w = ShardWriter(storage, attempt, 0, block_size=block_size)
    w.add_tensor("x", np.arange(3000, dtype=np.float32))
    m = commit(storage, attempt, step=1, indexes=[w.finish()])
    assert {f.checksum.block_size for p, f in m.files.items() if p.startswith("data/")} == {
        block_size}
    ck = portable_ckpt.open(tmp_path)
    np.testing.assert_array_equal(ck.read("x"), np.arange(3000, dtype=np.float32))
    assert ck.verify(deep=True) == []


def test_joined_small_pieces_stay_within_their_buffer_bound(tmp_path: Path) -> None:
    """``_joined``: runs of small pieces are joined into buffers of about 1 MiB (each handed
    to the I/O thread once full). 3,000 biases of 1 KiB (3 MiB, no piece large) must never be
    joined into one 3 MiB buffer. Mutant W02 (a run was handed over only before a large
    piece): the whole file's small pieces were copied into one buffer."""
    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(1)
    w = ShardWriter(storage, attempt, 0)
    arrays = {f"b{i:04d}": np.full(256, i, np.float32) for i in range(3000)}
    for k, a in arrays.items():
        w.add_tensor(k, a)
    idx = w.finish()
    assert (1 << 20) <= w.stats.peak_scratch_bytes < (1 << 20) + SMALL_PIECE_BYTES
    commit(storage, attempt, step=1, indexes=[idx])
    ck = portable_ckpt.open(tmp_path)
    for k in ("b0000", "b1499", "b2999"):
        np.testing.assert_array_equal(ck.read(k), arrays[k])


def _writer(root: Path, **kw: object) -> ShardWriter:
    return ShardWriter(open_storage(root, create=True), new_attempt_id(1), 0, **kw)  # type: ignore[arg-type]


def _per_rank(w: ShardWriter, value: int, rank: int, schema: object = "pck:json/1") -> None:
    w.add_entry("e", value, schema, scope="per_rank", rank=rank,  # type: ignore[arg-type]
                world_size_policy="require_same")


def _redeclared_shape(w: ShardWriter) -> None:
    w.declare_tensor("x", "float32", [4])
    w.declare_tensor("x", "float32", [5])


def _same_rank_twice(w: ShardWriter) -> None:
    _per_rank(w, 1, 0)
    _per_rank(w, 2, 0)


def _entry_redeclared(w: ShardWriter) -> None:
    _per_rank(w, 1, 0)
    _per_rank(w, 2, 1, {"type": "integer"})


_REFUSED: dict[str, tuple[Callable[[ShardWriter], object], str]] = {
    # W08: a negative dimension; W09: one dimension more than MAX_NDIM (64).
    "negative-dimension": (lambda w: w.declare_tensor("x", "float32", [4, -1]),
                           "invalid global shape"),
    "65-dimensions": (lambda w: w.declare_tensor("x", "float32", [1] * 65),
                      "invalid global shape"),
    # W10: one writer declaring a tensor twice with another shape.
    "redeclared-shape": (_redeclared_shape,
                         "declared as float32\\[4\\] and now as float32\\[5\\]"),
    # W17: a per-rank value for a negative rank; W18: a global entry with a policy.
    "negative-rank": (lambda w: _per_rank(w, 1, -1), "need rank="),
    "global-with-policy": (lambda w: w.add_entry("e", 1, world_size_policy="require_same"),
                           "take no rank or world_size_policy"),
    # W19: two values of one rank; W20: one entry declared with two schemas.
    "same-rank-twice": (_same_rank_twice, "already has a value for rank 0"),
    "entry-redeclared": (_entry_redeclared, "declared twice with different"),
}


@pytest.mark.parametrize("case", sorted(_REFUSED))
def test_writer_planning_refuses_what_readers_or_the_committer_would(
    tmp_path: Path, case: str
) -> None:
    """Each refusal of the planning calls (no I/O yet), with its message: left to the commit,
    the same mistakes cost every byte of the save first, or (a per-rank value of rank -1, a
    global entry with a policy) made records that readers refuse. Mutants W08-W10, W17-W20."""
    from portable_ckpt.errors import CheckpointError

    call, message = _REFUSED[case]
    w = _writer(tmp_path)
    with pytest.raises(CheckpointError, match=message) as exc:
        call(w)
    assert exc.value.code in ("PCK-USAGE", "PCK-METADATA-CONFLICT")
    assert not list(tmp_path.rglob("*.safetensors")) and not list(tmp_path.rglob("*.json"))


def test_a_finished_writer_takes_nothing_more(tmp_path: Path) -> None:
    """A writer is used once: tensors added after ``finish()`` would never be written, and a
    second ``finish()`` would write every file again. Mutants W38 (``add_tensor`` did not
    check) and W40 (``finish`` did not check)."""
    w = _writer(tmp_path)
    w.add_tensor("x", np.ones(4, np.float32))
    w.finish()
    with pytest.raises(UsageError, match="already finished or aborted"):
        w.add_tensor("y", np.ones(4, np.float32))
    with pytest.raises(UsageError, match="already finished or aborted"):
        w.finish()


@pytest.mark.parametrize("kw, message", [
    ({"max_file_blocks": 0}, "max_file_blocks must be at least 1"),
    ({"write_index": True, "sync_on_finish": False}, "write_index needs sync_on_finish"),
], ids=["zero-blocks", "index-without-sync"])
def test_writer_options_that_cannot_work_are_refused(
    tmp_path: Path, kw: dict[str, object], message: str
) -> None:
    """``max_file_blocks=0`` and an index over files not yet durable (R-COMMIT-6) are refused
    at construction. Mutants W37, W35."""
    with pytest.raises(UsageError, match=message):
        _writer(tmp_path, **kw)


@pytest.mark.parametrize("shape, offsets, global_shape", [
    ((4,), (0, 0), (4, 4)),  # offsets of the tensor's rank, an array of another rank
    ((4,), (0,), (4, 4)),
    ((2, 2), (0, 0), (4,)),
], ids=["array-rank-differs", "offsets-rank-differs", "both-differ"])
def test_a_chunk_of_another_rank_is_a_range_bounds_error(
    tmp_path: Path, shape: tuple[int, ...], offsets: tuple[int, ...],
    global_shape: tuple[int, ...]
) -> None:
    """A chunk must have its tensor's rank, said as PCK-RANGE-BOUNDS like every chunk that
    does not fit. Found while classifying mutant W11: a 1-d array given 2-d offsets of a 2-d
    tensor raised a bare ``ValueError`` from ``zip(strict=True)`` inside ``Box.within``."""
    from portable_ckpt.errors import RangeBoundsError

    w = _writer(tmp_path)
    with pytest.raises(RangeBoundsError, match="does not fit the global shape"):
        w.add_tensor("x", np.ones(shape, np.float32), offsets=offsets, global_shape=global_shape)


def test_zero_size_chunks_get_no_range_record(tmp_path: Path) -> None:
    """A chunk of no elements (an empty tensor, or a rank's empty share of a sharded one)
    carries nothing and gets no range record: ranges must be non-empty (R-COVER). Mutant W12
    (the early return dropped): the empty share became a record ``[8:8]`` and the commit of
    a valid save was refused with PCK-RANGE-BOUNDS."""
    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(1)
    w = ShardWriter(storage, attempt, 0)
    w.add_tensor("x", np.arange(8, dtype=np.float32))
    w.add_tensor("x", np.zeros(0, np.float32), offsets=(8,), global_shape=(8,))
    w.add_tensor("e", np.zeros((0, 3), np.float32))
    m = commit(storage, attempt, step=1, indexes=[w.finish()])
    assert [(r.offsets, r.lengths) for r in m.tensors["x"].ranges] == [((0,), (8,))]
    assert m.tensors["e"].ranges == [] and m.tensors["e"].shape == (0, 3)
    ck = portable_ckpt.open(tmp_path)
    np.testing.assert_array_equal(ck.read("x"), np.arange(8, dtype=np.float32))
    assert ck.read("e").shape == (0, 3)
    assert ck.verify(deep=True) == []


def test_a_file_is_cut_only_when_the_next_chunk_would_exceed_max_file_bytes(
    tmp_path: Path
) -> None:
    """``max_file_bytes``: "start a new shard file when one would *exceed* this"; chunks that
    fill it exactly share one file. Mutant W22 (``>=``): a second file was started at the
    limit itself."""
    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(1)
    w = ShardWriter(storage, attempt, 0, max_file_bytes=32)
    w.add_tensor("a", np.ones(4, np.float32))
    w.add_tensor("b", np.ones(4, np.float32))
    assert sorted(p for p in w.finish().files if p.startswith("data/")) == [
        "data/w00000-0000.safetensors"]
    w = ShardWriter(storage, new_attempt_id(2), 0, max_file_bytes=31)
    w.add_tensor("a", np.ones(4, np.float32))
    w.add_tensor("b", np.ones(4, np.float32))
    assert len([p for p in w.finish().files if p.startswith("data/")]) == 2


def test_a_failed_write_of_an_early_piece_fails_the_writer(tmp_path: Path) -> None:
    """Pieces are written by the I/O thread one at a time, each write's outcome collected
    before the next is handed over: an error of any piece, not only the last, fails
    ``finish()`` (and removes what was written). Mutant W31 (only the last write's outcome
    was collected): an EIO on the first of three 1 MiB pieces was lost and the index listed
    a file missing a megabyte."""
    from portable_ckpt.errors import StorageError
    from portable_ckpt.storage.faults import Fault, FaultyStorage

    # after_ops=1: the header's write succeeds, the first piece's fails, once.
    fault = Fault(op="write", path="*/data/*", error="EIO", after_ops=1, times=1)
    storage = FaultyStorage(open_storage(tmp_path, create=True), [fault])
    w = ShardWriter(storage, new_attempt_id(1), 0)
    for k in "abc":
        w.add_tensor(k, np.ones(1 << 18, np.float32))
    with pytest.raises(StorageError, match="write"):
        w.finish()
    assert fault.fired == 1
    assert not list(tmp_path.rglob("*.safetensors")) and not list(tmp_path.rglob("*.json"))


def test_a_refused_chunk_leaves_its_tensor_undeclared(tmp_path: Path) -> None:
    """Re-attack 30: a chunk refused as PCK-RANGE-BOUNDS (here a global shape of another
    rank) kept its tensor declared with that shape: the caller's corrected call was refused as
    PCK-METADATA-CONFLICT, and a writer that went on without it failed its commit with a
    coverage gap of a tensor it never stored."""
    from portable_ckpt.errors import RangeBoundsError

    attempt = new_attempt_id(1)
    storage = open_storage(tmp_path, create=True)
    w = ShardWriter(storage, attempt, 0)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    with pytest.raises(RangeBoundsError):
        w.add_tensor("x", a, global_shape=(6,))
    with pytest.raises(RangeBoundsError):
        w.add_tensor("y", a, global_shape=(6,))
    w.add_tensor("x", a, global_shape=(2, 3))  # the corrected call; "y" is left out
    commit(storage, attempt, step=1, indexes=[w.finish()])
    ck = portable_ckpt.open(tmp_path)
    assert list(ck.tensors) == ["x"]
    np.testing.assert_array_equal(ck.read("x"), a)
