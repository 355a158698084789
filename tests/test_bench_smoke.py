"""Smoke test of the benchmark harness: tiny sizes, real subprocesses, real files (< 30 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO), env.get("PYTHONPATH", "")])
    return env


def test_runner_measures_a_child_and_a_command(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO))
    from bench.runner import run_child, run_command

    m = run_child("save", "save_pck", {"bytes": 4 << 20, "tensors": 2, "root": str(tmp_path / "ck")})
    assert m.ok, m.error
    assert m.seconds > 0 and m.maxrss_bytes > m.extra["bytes"]  # the state lives in that process
    assert m.extra["written"] >= m.extra["bytes"]
    d = run_command("dd", ["dd", "if=/dev/zero", f"of={tmp_path / 'dd'}", "bs=1M", "count=2", "conv=fsync"])
    assert d.ok and (tmp_path / "dd").stat().st_size == 2 << 20
    bad = run_child("bad", "no_such_op", {})
    assert not bad.ok and "unknown op" in bad.error


@pytest.mark.timeout(120)
def test_quick_core_sections_write_a_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", "core,scaling", "--out", str(out),
         "--name", "smoke", "--no-cold", "--smoke"],
        cwd=REPO, env={**_env()}, capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    doc = json.loads((out / "smoke.json").read_text())
    assert set(doc["sections"]) == {"save", "read", "verify", "checksum", "zstd", "scale"}
    assert not any(s.get("failed") for s in doc["sections"].values())
    rows = doc["sections"]["checksum"]["rows"]
    assert all(r["MiB/s"] and r["MiB/s"] > 0 for r in rows)
    md = (out / "smoke.md").read_text()
    assert "## Machine" in md and "## Targets" in md
    assert doc["machine"]["cores"] >= 1
