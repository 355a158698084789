"""The cyclic collector is paused around loads, saves and planned reads (portable_ckpt._gc)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt._gc import paused_gc
from portable_ckpt.errors import CheckpointError
from portable_ckpt.io.reader import ReadRequest


@contextmanager
def _enabled() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        if not was:
            gc.disable()


@contextmanager
def _collections(threshold: tuple[int, int, int] = (50, 1, 1)) -> Iterator[list[int]]:
    """Record the generation of every collection while the block runs, with low thresholds
    (so that work allocating a few thousand containers triggers dozens of collections)."""
    seen: list[int] = []

    me = threading.get_ident()

    def cb(phase: str, info: dict[str, Any]) -> None:
        # Collections triggered by this thread (a background writer's are its own business).
        if phase == "start" and threading.get_ident() == me:
            seen.append(int(info["generation"]))

    old = gc.get_threshold()
    # Counts left by earlier work (pytest's own, an import) would make the first allocation
    # in the block collect an old generation that the block did not cause: start from zero.
    gc.collect()
    gc.set_threshold(*threshold)
    gc.callbacks.append(cb)
    try:
        yield seen
    finally:
        gc.callbacks.remove(cb)
        gc.set_threshold(*old)


def _allocate() -> list[dict[str, int]]:
    return [{"i": i} for i in range(5000)]


def test_recorder_sees_full_collections_without_a_pause(tmp_path: Path) -> None:
    with _enabled(), _collections() as seen:
        _allocate()
    assert len(seen) >= 20, seen  # the control: the thresholds make this work collect often
    _many_tensor_checkpoint(tmp_path / "ck")
    ck = portable_ckpt.open(tmp_path / "ck")
    reqs = [ReadRequest(k) for k in sorted(ck.tensors)]
    _, seen = _quiet(lambda: type(ck).read_many.__wrapped__(ck, reqs))  # the same read, unpaused
    assert len(seen) >= 20, seen


def test_pause_stops_automatic_collection_and_restores_it() -> None:
    with _enabled():
        with _collections() as seen, paused_gc():
            before = len(seen)
            assert not gc.isenabled()
            _allocate()
            inside = seen[before:]
        assert inside == []
        assert gc.isenabled()


def test_pause_nests_and_keeps_a_disabled_collector_disabled() -> None:
    with _enabled():
        with paused_gc():
            with paused_gc():
                assert not gc.isenabled()
            assert not gc.isenabled()  # the outer pause is still running
        assert gc.isenabled()
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()  # the caller's choice survives the pause
    finally:
        gc.enable()


def test_pause_is_restored_when_the_block_raises() -> None:
    with _enabled():
        with pytest.raises(ValueError), paused_gc():
            raise ValueError("boom")
        assert gc.isenabled()


def test_only_the_main_thread_pauses_the_collector() -> None:
    """A background thread's pause (a verification, a copy, a save stuck on a hung file system)
    must not turn collection off for the training loop; the main thread's pause is its own."""
    seen: list[bool] = []
    inside = threading.Event()
    leave = threading.Event()

    def other() -> None:
        with paused_gc():
            seen.append(gc.isenabled())
            inside.set()
            leave.wait(10)
        seen.append(gc.isenabled())

    with _enabled():
        t = threading.Thread(target=other)
        t.start()
        assert inside.wait(10)
        with paused_gc():  # the main thread pauses while the other thread is still inside
            seen.append(gc.isenabled())
        seen.append(gc.isenabled())
        leave.set()
        t.join(10)
    assert seen == [True, False, True, True]


def test_a_due_young_collection_runs_when_the_pause_ends() -> None:
    with _enabled(), _collections((700, 10, 10)) as seen:
        with paused_gc():
            start = len(seen)
            kept = _allocate()  # 5,000 live containers: past the young generation threshold
            during = len(seen) - start
        after = seen[start + during :]
    assert during == 0 and after[:1] == [0] and len(kept) == 5000


def _many_tensor_checkpoint(root: Path) -> None:
    arrays = {f"layers.{i}.{n}": np.full((4, 4), i, np.float32) for i in range(150)
              for n in ("weight", "bias")}
    portable_ckpt.save_arrays(root, arrays, step=1)


def _quiet(fn: Callable[[], Any]) -> tuple[Any, list[int]]:
    """``fn()`` and the generations collected while it ran (low thresholds: unpaused work of
    this size collects dozens of times; code around the pause may collect once or twice)."""
    with _enabled(), _collections() as seen:
        out = fn()
        during = list(seen)
        assert gc.isenabled()
    return out, during


def test_read_many_runs_without_collections(tmp_path: Path) -> None:
    _many_tensor_checkpoint(tmp_path / "ck")
    ck = portable_ckpt.open(tmp_path / "ck")
    reqs = [ReadRequest(k) for k in sorted(ck.tensors)]
    outs, seen = _quiet(lambda: ck.read_many(reqs))
    assert len(seen) <= 2, seen
    assert len(outs) == 300 and float(outs[-1][0, 0]) == 99.0


def test_torch_save_and_load_run_without_collections(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import portable_ckpt.torch as pckt

    state = {f"layers.{i}.weight": torch.full((4, 4), float(i)) for i in range(300)}
    state["meta"] = {"epoch": 3, "names": [f"n{i}" for i in range(200)]}
    _, seen_save = _quiet(lambda: pckt.save(state, tmp_path / "ck", step=7))
    target = {k: torch.zeros(4, 4) for k in state if k != "meta"}
    target["meta"] = {"epoch": 0, "names": []}
    info, seen_load = _quiet(lambda: pckt.load(target, tmp_path / "ck"))
    assert 2 not in seen_save and 2 not in seen_load, (seen_save, seen_load)
    assert len(seen_save) <= 4 and len(seen_load) <= 4, (seen_save, seen_load)
    assert info.step == 7 and float(target["layers.299.weight"][0, 0]) == 299.0
    with _enabled():  # a failed load restores the collector too
        with pytest.raises(CheckpointError):
            pckt.load(target, tmp_path / "missing")
        assert gc.isenabled()


def test_async_save_pauses_only_while_staging(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import portable_ckpt.torch as pckt

    state = {f"layers.{i}.weight": torch.full((4, 4), float(i)) for i in range(300)}
    with _enabled():
        with _collections() as seen:
            handle = pckt.async_save(state, tmp_path / "ck", step=1)
            staged = list(seen)
            assert gc.isenabled()  # training resumes with its collector on
        handle.committed.result(60)
        assert gc.isenabled()
    assert len(staged) <= 4, staged
