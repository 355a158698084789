"""Exit safety: a process that exits with an async save in flight finishes it (torchrun, 2 ranks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

import portable_ckpt

pytestmark = pytest.mark.torch

HERE = Path(__file__).resolve().parent


def _torchrun(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(HERE.parents[1]),
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


MODES = ["manager", "plain"]


def test_exit_with_pending_async_save_finishes_it(tmp_path: Path) -> None:
    proc = _torchrun(str(HERE / "_exit_script.py"), str(tmp_path), *MODES)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "terminate called" not in out and "ABANDONED" not in out
    assert "exiting with saves in flight" in out
    for mode in MODES:
        root = str(tmp_path / mode)
        versions = portable_ckpt.list_versions(root)
        assert [(v.step, v.status) for v in versions] == [(1, "committed")], (mode, out[-3000:])
        assert portable_ckpt.open(root).verify(deep=True) == []
