"""Smoke test of the benchmark harness: tiny sizes, real subprocesses, real files (< 30 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO), env.get("PYTHONPATH", "")])
    return env


def _bench(tmp_path: Path, *args: str, timeout: float = 280) -> dict[str, Any]:
    """``python -m bench --smoke --no-cold --name smoke ARGS`` into ``tmp_path/out``: its JSON."""
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--no-cold", "--name", "smoke", "--out",
         str(out), *args],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=timeout,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    doc: dict[str, Any] = json.loads((out / "smoke.json").read_text())
    return doc


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
    doc = _bench(tmp_path, "--quick", "--only", "core,scaling", timeout=120)
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
    sec = _bench(tmp_path, "--only", "realistic")["sections"]["realistic"]
    assert not sec.get("failed")
    raw = sec["raw"][0]
    assert {r["owned_bytes"] > 0 for r in raw["save"]} == {True}
    assert set(raw["loads"]) == {"2", "1"} and "async" in raw
    # Both loaders delivered the same values on every rank, after every timed load (digests of
    # the local tensors against the first load of ours, itself checked against DCP's).
    for ranks in raw["loads"].values():
        for r in ranks:
            assert r["digests"]["reference"] == r["digests"]["dcp"]
            assert r["digests"]["mismatches"] == []
            assert all(x["rchar"] > 0 and x["seconds"] > 0 for x in r["rows"])
    assert any(t["name"].endswith("speed vs dcp.save") for t in sec["targets"])
    # DCP with a stager kept across saves ran beside its defaults.
    assert "dcp-thread-cached" in raw["async"][0]["block_s"]
    # What a later reader needs to rerun it was taken when it ran.
    prov = raw["provenance"]
    assert prov["git"] != "?" and prov["machine"]["cores"] >= 1 and prov["wall_s"] > 0
    assert (tmp_path / "out" / "smoke-realistic-smoke.png").exists()


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
        "no save", "portable_ckpt thread", "portable_ckpt process", "dcp thread", "dcp process",
        "dcp thread, reused stager", "dcp process, reused stager"]
    assert res["provenance"]["command"].startswith("python -m bench.gpu_step --device cpu")
    for name, runs in res["runs"].items():
        assert len(runs) == 1 and runs[0]["during"], name
        assert runs[0]["block_s"] >= 0 and runs[0]["total_s"] > 0
    assert list(tmp_path.glob("pck-gpu-step-*")) == []  # the scratch saves are gone
    again = subprocess.run([sys.executable, "-m", "bench.gpu_step", "--from-json",
                            str(out.with_suffix(".json"))], cwd=REPO, env=_env(),
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and again.stdout == out.with_suffix(".md").read_text()


def test_gpu_step_counts_the_blocking_call_and_subtracts_the_controls_bias() -> None:
    """The training time a save cost: blocking + the steps in flight beyond the pace before it
    (the steps right after a cleanup left out), less the no-save control's excess per step."""
    from bench.gpu_step import SETTLE, rows

    settle = [0.5] * SETTLE  # slow steps after the previous cleanup: not the pace
    runs = {
        "no save": [{"base": settle + [0.020] * 8, "during": [0.021] * 10, "block_s": 0.0,
                     "total_s": 0.2}],
        "ours": [{"base": settle + [0.020] * 8, "during": [0.030] * 4 + [0.021] * 16,
                  "block_s": 0.025, "total_s": 0.5}],
    }
    by = {r["contender"]: r for r in rows(runs)}
    assert abs(by["no save"]["lost ms per save"]) < 1e-9
    # 25 ms blocking + (4 × 10 + 16 × 1) ms in flight − 20 steps × 1 ms of control bias = 61 ms.
    assert abs(by["ours"]["lost ms per save"] - 61.0) < 1e-6
    assert abs(by["ours"]["blocking ms"] - 25.0) < 1e-9
    assert abs(by["ours"]["control bias ms per step"] - 1.0) < 1e-9


def test_a_speed_target_is_met_only_by_both_statistics() -> None:
    from bench.realistic import _ceiling_row, _speed

    # Paired ratios 2.0, 2.0, 0.5 (median 2.0); medians 1.0 against 0.5... of the times below.
    paired, of_medians, verdict = _speed([2.0, 2.0, 1.0], [1.0, 1.0, 2.0])
    assert (paired, of_medians, verdict) == (2.0, 2.0, 2.0)
    paired, of_medians, verdict = _speed([1.6, 1.6, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0])
    assert paired == 1.3 and of_medians == 1.3 and verdict == 1.3
    paired, of_medians, verdict = _speed([3.0, 1.4, 1.6], [2.0, 1.0, 1.0])
    assert paired == 1.5 and abs(of_medians - 1.6) < 1e-9 and verdict == 1.5
    # The ceiling is the faster raw reader of the run, whichever it is.
    ranks = [{"dd_bytes": 100}]
    row = _ceiling_row("4→4", ranks, {"streams": [2.0], "dd": [1.0], "dcp": [4.0],
                                      "portable_ckpt": [2.0]}, 100)
    assert row["portable_ckpt / ceiling"] == 0.5 and row["1.5 × dcp / ceiling"] == 0.375


def test_the_node_streams_are_spread_over_the_ranks() -> None:
    from bench.realistic_ranks import NODE_STREAMS, _streams_of

    for world in range(1, 10):
        per = [_streams_of(r, world) for r in range(world)]
        assert sum(per) == max(NODE_STREAMS, world) and max(per) - min(per) <= 1


@pytest.mark.timeout(300)
def test_small_tensors_section_measures_every_operation(tmp_path: Path) -> None:
    """`--only small` (issue 13): every operation on 1 and 2 ranks, the 2→1 load, DCP's ratio."""
    pytest.importorskip("torch")
    sec = _bench(tmp_path, "--only", "small", "--scratch", str(tmp_path))["sections"]["small"]
    assert not sec.get("failed"), sec
    done = {(r["world"], r["op"]) for r in sec["rows"]}
    ops = {"save", "async", "dcp_save", "load", "restore", "dcp_load"}
    assert done == {(w, op) for w in (1, 2) for op in ops} | {(2, "load_2to1")}
    assert all(r["cpu_ms_per_1k"] > 0 for r in sec["rows"])
    assert all(r["vs_dcp_cpu"] > 0 for r in sec["rows"] if r["op"] in ("save", "load"))
