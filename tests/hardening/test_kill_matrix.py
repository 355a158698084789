"""Randomized SIGKILL matrix (CI subset; bench/kill_matrix_long.py runs >= 200 trials).

Each trial saves with two writer processes, a committer process and a gc process; one of them is
SIGKILLed at a phase reached through a storage hook (no sleeps). After each trial: every version
listed committed verifies (deep) and restores exactly, and the previous version still restores.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.hardening._killmatrix import PHASES, run_matrix

TRIALS = int(os.environ.get("PCK_KILL_TRIALS", "6"))


def test_kill_matrix_randomized(tmp_path: Path) -> None:
    results = run_matrix(str(tmp_path / "root"), TRIALS, seed=int(os.environ.get("PCK_KILL_SEED", "8")))
    assert len(results) == TRIALS
    assert any(t.killed for t in results)


@pytest.mark.parametrize("phase", [p["name"] for p in PHASES])
def test_kill_each_phase_once(tmp_path: Path, phase: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every phase at least once, deterministically (the randomized run samples them)."""
    from tests.hardening import _killmatrix

    monkeypatch.setattr(_killmatrix, "PHASES", [p for p in PHASES if p["name"] == phase])
    # Only the kill here: a read fault could leave gc nothing to delete (the randomized run and
    # bench/kill_matrix_long.py combine both).
    monkeypatch.setattr(_killmatrix, "gc_fault_spec", lambda *a: None)
    (t,) = _killmatrix.run_matrix(str(tmp_path / "root"), 1, seed=1)
    assert t.killed, f"phase {phase} was never reached"


TORCH_PHASES = [
    {"name": "torch-mid-file", "op": "write", "path": "*/data/*", "after_bytes": 40},
    {"name": "torch-before-create", "op": "create", "path": "*/manifest.json"},
    {"name": "torch-after-publish", "os": "unlink"},
]


# One torch phase in CI (each costs two torch imports); PCK_HARDENING_LONG=1 runs all three.
_TORCH = TORCH_PHASES if os.environ.get("PCK_HARDENING_LONG") else TORCH_PHASES[1:2]


@pytest.mark.torch
@pytest.mark.parametrize("phase", _TORCH, ids=[p["name"] for p in _TORCH])
def test_kill_torch_save(tmp_path: Path, phase: dict) -> None:  # type: ignore[type-arg]
    """portable_ckpt.torch.save killed mid-save: committed versions verify and restore exactly."""
    pytest.importorskip("torch")
    pt = pytest.importorskip("portable_ckpt.torch")
    if not hasattr(pt, "save"):
        pytest.skip("portable_ckpt.torch.save not available yet")
    import numpy as np

    import portable_ckpt
    from tests.hardening._killmatrix import run_child

    root = str(tmp_path / "root")
    killed_prev, _ = run_child(root, "torch", "-", 1, None)
    assert not killed_prev
    killed, out = run_child(root, "torch", "-", 2, phase)
    assert killed, out
    versions = [v for v in portable_ckpt.list_versions(root) if v.status == "committed"]
    assert {v.step for v in versions} == ({1, 2} if phase["name"] == "torch-after-publish" else {1})
    for v in versions:
        ck = portable_ckpt.open(v.path)
        assert ck.verify(deep=True) == []
        w = next(k for k in ck.tensors if k.endswith("w"))
        assert np.array_equal(ck.read(w), np.arange(12.0, dtype=np.float32).reshape(3, 4) * v.step)
