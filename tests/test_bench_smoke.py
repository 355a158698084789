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


@pytest.mark.timeout(300)
def test_realistic_section_runs_every_phase(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--only", "realistic", "--out", str(out),
         "--name", "smoke", "--no-cold"],
        cwd=REPO, env={**_env()}, capture_output=True, text=True, timeout=280,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    sec = json.loads((out / "smoke.json").read_text())["sections"]["realistic"]
    assert not sec.get("failed")
    raw = sec["raw"][0]
    assert {r["owned_bytes"] > 0 for r in raw["save"]} == {True}
    assert set(raw["loads"]) == {"2", "1"} and "async" in raw
    # Both loaders delivered the same values on every rank (digests of the local tensors).
    for ranks in raw["loads"].values():
        for r in ranks:
            assert r["digests"]["portable_ckpt"] == r["digests"]["dcp"]
            assert all(x["rchar"] > 0 and x["seconds"] > 0 for x in r["rows"])
    assert any(t["name"].endswith("speed vs dcp.save") for t in sec["targets"])
    assert (out / "smoke-realistic-smoke.png").exists()


@pytest.mark.timeout(120)
def test_read_floor_times_every_pattern(tmp_path: Path) -> None:
    for i in range(2):
        (tmp_path / f"f{i}").write_bytes(os.urandom((3 << 20) + 4096 * i))
    p = subprocess.run(
        [sys.executable, "-m", "bench.read_floor", str(tmp_path), "--reps", "1", "--files", "2"],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert lines[0].startswith("2 parallel readers, 6 MiB, 1 repetitions")
    assert [ln.split()[0] for ln in lines[1:]] == ["dd16", "plain8", "plain16", "pipe"]
    assert all(float(ln.split()[1]) > 0 for ln in lines[1:])


def test_the_streams_ceiling_reads_each_byte_of_the_share_once(tmp_path: Path) -> None:
    """The realistic benchmark's "streams" reference reads exactly the rank's share, once."""
    from bench.realistic_ranks import _io, _share, _streams_read

    files = []
    for i in range(3):
        p = tmp_path / f"f{i}"
        p.write_bytes(os.urandom((5 << 20) + 4099 * i))
        files.append((str(p), p.stat().st_size))
    for rank in range(2):
        parts = _share(files, rank, 2)
        before = _io()["rchar"]
        _streams_read(parts, 3)
        extra = _io()["rchar"] - before - sum(c for _, _, c in parts)
        assert 0 <= extra < 512  # reading /proc/self/io counts itself (about 120 bytes)


@pytest.mark.torch
@pytest.mark.timeout(240)
def test_gpu_step_runs_its_contenders_without_a_gpu(tmp_path: Path) -> None:
    """bench/gpu_step.py (GPU step while a save is in flight) on the CPU: every contender runs,
    saves commit and are removed, and the report renders again from its JSON."""
    pytest.importorskip("torch")
    out = tmp_path / "step"
    p = subprocess.run(
        [sys.executable, "-m", "bench.gpu_step", "--device", "cpu", "--preset", "smoke",
         "--batch", "1", "--seq", "4", "--reps", "1", "--base", "2", "--max-steps", "20",
         "--out", str(out), "--scratch", str(tmp_path)],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=230,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.with_suffix(".json").read_text())
    assert [r["contender"] for r in res["rows"]] == [
        "no save", "portable_ckpt thread", "portable_ckpt process", "dcp thread", "dcp process"]
    for name, runs in res["runs"].items():
        assert len(runs) == 1 and runs[0]["during"], name
        assert runs[0]["block_s"] >= 0 and runs[0]["total_s"] > 0
    assert list(tmp_path.glob("pck-gpu-step-*")) == []  # the scratch saves are gone
    again = subprocess.run([sys.executable, "-m", "bench.gpu_step", "--from-json",
                            str(out.with_suffix(".json"))], cwd=REPO, env=_env(),
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and again.stdout == out.with_suffix(".md").read_text()
