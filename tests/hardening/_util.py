"""Shared helpers of the hardening tests (also used by bench/fuzz_long.py and bench/kill_matrix_long.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import tracemalloc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.errors import CheckpointError
from portable_ckpt.io.commit import commit
from portable_ckpt.io.reader import Checkpoint
from portable_ckpt.io.versions import latest, list_versions, load_manifest
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.storage import Storage, open_storage


def json_values(doc: Any) -> int:
    """JSON values of a parsed document (containers and scalars; member names not)."""
    if isinstance(doc, dict):
        return 1 + sum(json_values(v) for v in doc.values())
    if isinstance(doc, list):
        return 1 + sum(json_values(v) for v in doc)
    return 1


def json_depth(doc: Any) -> int:
    """Nesting depth of a parsed document (the top-level container counts 1; a scalar 0)."""
    if isinstance(doc, dict):
        return 1 + max((json_depth(v) for v in doc.values()), default=0)
    if isinstance(doc, list):
        return 1 + max((json_depth(v) for v in doc), default=0)
    return 0


#: Per-input time bound of the fuzz targets (seconds). Generous: a healthy rejection takes ms.
PER_INPUT_SECONDS = 5.0
#: Bound on the Python-heap peak (tracemalloc, numpy buffers included) of one fuzz input.
PEAK_BYTES = 64 << 20


class Hang(BaseException):
    """Raised by :func:`time_bound` when an input runs past its time bound."""


@contextlib.contextmanager
def time_bound(seconds: float = PER_INPUT_SECONDS) -> Iterator[None]:
    """Raise :class:`Hang` in the main thread if the body runs longer than ``seconds``.

    Uses SIGALRM (checked between bytecodes: a hang inside one long C call is caught when it
    returns; the long-run fuzzer also runs inputs in a child with a hard watchdog).
    """
    with _timer(signal.SIGALRM, signal.ITIMER_REAL, seconds, f"input exceeded {seconds} s"):
        yield


@contextlib.contextmanager
def cpu_bound(seconds: float = PER_INPUT_SECONDS) -> Iterator[None]:
    """Raise :class:`Hang` once the body has used ``seconds`` of CPU time (user + system).

    SIGPROF on the process's CPU clock: a machine shared by many jobs stretches wall time, not
    CPU time. Pair it with a generous :func:`time_bound` to catch blocking hangs too.
    """
    with _timer(signal.SIGPROF, signal.ITIMER_PROF, seconds,
                f"input used more than {seconds} s of CPU"):
        yield


@contextlib.contextmanager
def _timer(sig: int, which: int, seconds: float, message: str) -> Iterator[None]:
    """Raise :class:`Hang` (``message``) when interval timer ``which`` fires ``sig`` in the body.

    Signals reach the main thread only: elsewhere the body runs unbounded.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _fire(signum: int, frame: Any) -> None:
        raise Hang(message)

    old = signal.signal(sig, _fire)
    signal.setitimer(which, seconds)
    try:
        yield
    finally:
        signal.setitimer(which, 0)
        signal.signal(sig, old)


@contextlib.contextmanager
def memory_bound(limit: int = PEAK_BYTES) -> Iterator[list[int]]:
    """Measure the tracemalloc peak of the body; the list it yields receives the peak."""
    out: list[int] = []
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        yield out
    finally:
        peak = tracemalloc.get_traced_memory()[1] - base
        if started:
            tracemalloc.stop()
        out.append(peak)
    if peak > limit:
        raise AssertionError(f"peak Python/numpy heap {peak} bytes exceeds the bound {limit}")


#: Other writers also declare the 0-d tensor they do not store. Off while the core bug
#: "parse_writer_index rejects a declared-but-unstored 0-d tensor" is open (see test_hostile.py).
DECLARE_UNSTORED_SCALAR = True


def expected_arrays(step: int, writer: int | None = None) -> dict[str, np.ndarray[Any, Any]]:
    """Deterministic tensors of a save at ``step`` (the values a restore must reproduce).

    With ``writer``, only the shards of that writer of a two-writer save.
    """
    rng = np.random.default_rng(step)
    full = {
        "model.w": rng.standard_normal((64, 48)).astype(np.float32),
        "model.b": rng.integers(-1000, 1000, size=(48,), dtype=np.int64),
        "opt.m": rng.standard_normal((40, 33)).astype(np.float16),
        "scalar": np.array(step, dtype=np.int64),
    }
    del writer  # every writer derives its rows from the same full arrays
    return full


def write_share(
    storage: Storage, attempt: str, step: int, writer: int, nwriters: int, *, codec: str = "none",
    block_size: int = 4096,
) -> Any:
    """Write writer ``writer``'s share (rows split between ``nwriters``) of :func:`expected_arrays`."""
    arrays = expected_arrays(step)
    w = ShardWriter(storage, attempt, writer, codec=codec, block_size=block_size, max_file_bytes=4096)
    for key, arr in arrays.items():
        if arr.ndim == 0:
            if writer == 0:
                w.add_tensor(key, arr)
            elif DECLARE_UNSTORED_SCALAR:
                w.declare_tensor(key, portable_ckpt_dtype(arr), ())
            continue
        n = arr.shape[0]
        lo, hi = n * writer // nwriters, n * (writer + 1) // nwriters
        offs = (lo,) + (0,) * (arr.ndim - 1)
        w.add_tensor(key, arr[lo:hi], offsets=offs, global_shape=arr.shape)
    if writer == 0:
        w.add_entry("step", {"step": step}, schema="pck:step/1")
        w.add_entry("sched", {"lr": 0.5, "milestones": [1, 2, 3]}, compress=True)
    w.add_entry("rng", {"rank": writer, "seed": step * 10 + writer}, scope="per_rank", rank=writer,
                world_size_policy="modulo")
    return w.finish()


def portable_ckpt_dtype(arr: np.ndarray[Any, Any]) -> str:
    from portable_ckpt.format.dtypes import dtype_name

    return dtype_name(arr.dtype)


def make_version(
    root: str | Storage, step: int, *, nwriters: int = 2, codec: str = "none", block_size: int = 4096
) -> str:
    """Save one complete version (``nwriters`` writers in this process) and return its attempt id."""
    storage = open_storage(root, create=True) if not isinstance(root, Storage) else root
    attempt = new_attempt_id(step)
    idx = [write_share(storage, attempt, step, w, nwriters, codec=codec, block_size=block_size)
           for w in range(nwriters)]
    commit(storage, attempt, step=step, indexes=idx, expected_writers=list(range(nwriters)),
           continuation=portable_ckpt.Continuation("exact", nwriters, None))
    return attempt


def check_restores(storage: Storage, attempt: str, step: int | None = None) -> None:
    """Assert that the committed ``attempt`` verifies deeply and restores exactly."""
    man = load_manifest(storage, attempt)
    ck = Checkpoint(storage, attempt, man)
    errors = ck.verify(deep=True)
    assert errors == [], f"{attempt} is listed committed but does not verify: {errors}"
    want = expected_arrays(man.step if step is None else step)
    assert set(ck.tensors) == set(want), (attempt, sorted(ck.tensors))
    for key, arr in want.items():
        got = ck.read(key)
        assert got.dtype == arr.dtype and got.shape == arr.shape, (attempt, key)
        assert np.array_equal(got, arr), f"{attempt}: {key} differs from what was saved"
    assert ck.entry("step") == {"step": man.step}
    nranks = man.continuation.world_size
    for r in range(nranks):
        assert ck.entry("rng", rank=r) == {"rank": r, "seed": man.step * 10 + r}


def check_root(root: str | Storage) -> list[str]:
    """Assert that every version listed committed verifies and restores; return their ids."""
    storage = open_storage(root) if not isinstance(root, Storage) else root
    ids = []
    for v in list_versions(storage):
        if v.status == "committed":
            check_restores(storage, v.id)
            ids.append(v.id)
    if ids:
        best, _ = latest(storage)
        assert best in ids
    return ids


def expect_code(code: str, fn: Any, *args: Any, **kwargs: Any) -> CheckpointError:
    """Call ``fn`` and check that it raises the :class:`CheckpointError` of ``code``."""
    with pytest.raises(CheckpointError) as info:
        fn(*args, **kwargs)
    assert info.value.code == code, f"expected {code}, got {info.value.code}: {info.value}"
    return info.value


def only_checkpoint_errors(fn: Any, *args: Any, **kwargs: Any) -> CheckpointError | None:
    """Run ``fn``; return the CheckpointError it raised (None if none); anything else propagates."""
    try:
        fn(*args, **kwargs)
    except CheckpointError as exc:
        assert exc.code.startswith("PCK-"), exc
        return exc
    return None


def open_version(root: str, attempt: str) -> Any:
    """``portable_ckpt.open`` on a version directory."""
    return portable_ckpt.open(os.path.join(root, attempt))


def exercise_version(root: str, attempt: str) -> list[str]:
    """Open, read, entry-load and verify one version like a restoring job would; return codes.

    Every ``CheckpointError`` is caught and its code collected; any other exception propagates.
    """
    codes: list[str] = []

    def step(fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CheckpointError as exc:
            codes.append(exc.code)
            return None

    ck = step(portable_ckpt.open, os.path.join(root, attempt))
    step(portable_ckpt.open, root)
    step(list_versions, root)
    if ck is None:
        return codes
    for key, t in list(ck.tensors.items()):
        step(ck.read, key)
        if t.shape and all(s >= 2 for s in t.shape) and t.nbytes < 1 << 24:
            step(ck.read, key, [1] * len(t.shape), [s - 1 for s in t.shape])
    for name, e in list(ck.entries.items()):
        if e.scope == "global":
            step(ck.entry, name)
        else:
            step(ck.entry, name, rank=0)
            step(ck.entry, name, rank=1, world_size=3)
    for err in ck.verify(deep=True):
        codes.append(err.code)
    for err in ck.verify(sample=1.0, seed=0):
        codes.append(err.code)
    return codes


def load_header_file(path: str, file_size: int | None = None) -> Any:
    """``load_header`` on a local file, whatever the core's current signature."""
    import inspect

    from portable_ckpt.io import safetensors_io

    size = os.path.getsize(path) if file_size is None else file_size
    params = list(inspect.signature(safetensors_io.load_header).parameters)
    if params[0] == "storage":
        st = open_storage(os.path.dirname(path))
        return safetensors_io.load_header(st, os.path.basename(path), file_size=size, what=path)

    def read(lo: int, hi: int) -> bytes:
        # What is there, read in pieces: f.read(n) allocates n bytes before it reads, and a
        # fuzzed file that is shorter than a lying ``file_size`` says (the reader checks that
        # size against storage first) made this helper, not the reader, allocate a declared
        # ~100 MB header (the fuzz test failed when the mutations drew that case).
        with open(path, "rb") as f:
            f.seek(lo)
            parts, want = [], hi - lo
            while want > 0 and (part := f.read(min(want, 1 << 20))):
                parts.append(part)
                want -= len(part)
            data = b"".join(parts)
        if len(data) != hi - lo:
            from portable_ckpt.errors import FileSizeError

            raise FileSizeError(f"{path}: short read [{lo}:{hi}]", path=path)
        return data

    return safetensors_io.load_header(read, file_size=size, what=path)


def rechecksum(version_dir: str, rel: str) -> None:
    """Recompute the manifest's size and checksum record of ``rel`` (an attacker controls both)."""
    import json

    from portable_ckpt.io.checksum import BlockHasher

    man = os.path.join(version_dir, "manifest.json")
    with open(man, "rb") as f:
        doc = json.loads(f.read())
    with open(os.path.join(version_dir, rel), "rb") as f:
        data = f.read()
    rec = doc["files"][rel]
    h = BlockHasher(rec["checksum"]["block_size"])
    h.update(data)
    rec["size"] = len(data)
    rec["checksum"]["blocks"] = h.blocks()
    with open(man, "wb") as f:
        f.write(json.dumps(doc).encode())
