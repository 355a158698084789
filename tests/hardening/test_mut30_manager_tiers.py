"""Mutation audit 30, the manager's tiers with ``replicate=True`` (docs/torch.md "Failed saves"):
where durable saves go once a fast-tier save failed, and when the fast tier is tried again.

Real managers on local roots; the failing fast-tier write is a real ``StorageError`` raised by
``LocalStorage.open_writer`` for one step, as in tests/manager/test_manager_usage.py.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

import portable_ckpt
from portable_ckpt.errors import StorageError
from portable_ckpt.storage.local import LocalStorage

torch = pytest.importorskip("torch")
pckt = pytest.importorskip("portable_ckpt.torch")


def _fast_fails_at(monkeypatch: pytest.MonkeyPatch, fast: str, step: int) -> None:
    """Every write of ``step``'s attempt to the fast root fails (a transient I/O error)."""
    real = LocalStorage.open_writer

    def fails(self: Any, path: str, **kw: Any) -> Any:
        if self.root.startswith(fast) and path[:1] == "s" and int(path[1:13]) == step:
            raise StorageError(f"write {path}: Input/output error [injected]", path=path)
        return real(self, path, **kw)

    monkeypatch.setattr(LocalStorage, "open_writer", fails)


def _committed(root: str) -> list[int]:
    return [v.step for v in portable_ckpt.list_versions(root) if v.status == "committed"]


def _run(mgr: Any, steps: range) -> None:
    for step in steps:
        mgr.maybe_save(step, {"w": torch.arange(4.0) * step})
        with contextlib.suppress(portable_ckpt.CheckpointError):
            mgr.wait()  # each save's outcome is counted before the next agreement


def test_the_fast_tier_is_tried_again_after_exactly_five_durable_saves_around_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/torch.md: "the fast tier is tried again after 5 durable saves written around it".
    Step 2's fast write fails: steps 3-7 go to the durable root directly, step 8 through the
    fast tier again. Mutants: ``_direct_saves > FAST_RETRY_AFTER`` and ``FAST_RETRY_AFTER = 6``
    (step 8 went around it too); the existing test checked only the first and last steps."""
    fast, root = str(tmp_path / "fast"), str(tmp_path / "durable")
    _fast_fails_at(monkeypatch, fast, 2)
    with pckt.CheckpointManager(root, fast_root=fast, replicate=True, save_every=1,
                                fast_keep=20, continuation="statistical",
                                handle_sigterm=False) as mgr:
        _run(mgr, range(1, 11))
    assert _committed(fast) == [1, 8, 9, 10]
    assert _committed(root) == [1, *range(3, 11)]


def test_a_fast_save_that_works_sends_the_next_durable_save_through_the_fast_tier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/torch.md: durable steps go to ``root`` directly "until a fast-tier save works
    again". Step 1's fast save fails, durable step 2 goes around it, fast step 3 works: durable
    step 4 goes through the fast tier (and is copied). Mutant: a fast save that worked left
    the tier failed, and step 4 (and 6) went around it until five durable saves had."""
    fast, root = str(tmp_path / "fast"), str(tmp_path / "durable")
    _fast_fails_at(monkeypatch, fast, 1)
    with pckt.CheckpointManager(root, fast_root=fast, replicate=True, fast_every=1,
                                save_every=2, fast_keep=20, continuation="statistical",
                                handle_sigterm=False) as mgr:
        _run(mgr, range(1, 7))
    assert _committed(fast) == [3, 4, 5, 6]
    assert _committed(root) == [2, 4, 6]


def test_a_durable_step_that_failed_on_the_fast_tier_counts_as_a_failed_durable_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/torch.md: with ``replicate=True`` "the durable step that was on its way through the
    fast tier counts as failed" (towards ``max_failed_saves``: its durable checkpoint does not
    exist). Mutant: only saves to the durable tier itself counted, and a job whose fast disk
    failed every durable step never stopped."""
    fast, root = str(tmp_path / "fast"), str(tmp_path / "durable")
    _fast_fails_at(monkeypatch, fast, 1)
    with pckt.CheckpointManager(root, fast_root=fast, replicate=True, save_every=1,
                                max_failed_saves=1, continuation="statistical",
                                handle_sigterm=False) as mgr:
        _run(mgr, range(1, 2))
        assert mgr._failed_steps == [1]
        with pytest.raises(StorageError, match="1 durable checkpoints in a row failed"):
            mgr.maybe_save(2, {"w": torch.arange(4.0)})
    assert _committed(root) == []
