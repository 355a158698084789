"""examples/train_fsdp2.py under torchrun: SIGTERM or Ctrl-C mid-run saves and stops; resume."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

import portable_ckpt
from tests.manager._reap import Children, children

pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "train_fsdp2.py"


def _cmd(nproc: int, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(nproc),
        str(SCRIPT),
        *args,
    ]


def _lines(text: str) -> list[dict[str, object]]:
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def _run_and_preempt(
    kids: Children, common: list[str], events: Path, nproc: int = 2, ctrl_c: bool = False
) -> int:
    """Train, SIGTERM the launcher (or Ctrl-C) at step 5; return the step the job stopped at."""
    proc = kids.start(_cmd(nproc, *common, "--steps", "500", "--step-sleep", "0.2"))
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + 240
    for line in proc.stdout:
        seen.append(line)
        if line.startswith('{"step": 5,'):
            if ctrl_c:  # what a terminal does: SIGINT to the foreground process group
                os.killpg(proc.pid, signal.SIGINT)
            else:
                os.kill(proc.pid, signal.SIGTERM)  # the launcher forwards it to every worker
            break
        assert time.monotonic() < deadline, "".join(seen[-20:])
    rest, _ = proc.communicate(timeout=180)
    out = _lines("".join(seen) + rest)
    done = [d for d in out if "done" in d]
    assert done and done[0]["preempted"] is True, "".join(seen) + rest
    stopped = int(done[0]["done"])  # type: ignore[call-overload]
    assert 5 <= stopped < 500
    pre = [json.loads(x) for x in events.read_text().splitlines()]
    saves = [e for e in pre if e["event"] == "save"]
    assert saves[-1]["reason"] == "preemption" and saves[-1]["step"] == stopped
    assert saves[-1]["tier"] == "durable"
    return stopped


def test_example_sigterm_then_resume_on_another_world_size(tmp_path: Path) -> None:
    ckpt, fast, events = tmp_path / "d", tmp_path / "f", tmp_path / "ev.jsonl"
    common = [
        "--ckpt",
        str(ckpt),
        "--fast",
        str(fast),
        "--save-every",
        "4",
        "--fast-every",
        "2",
        "--events",
        str(events),
        "--dim",
        "32",
        "--layers",
        "1",
    ]
    with children() as kids:
        stopped = _run_and_preempt(kids, common, events)
        assert portable_ckpt.open(ckpt).step == stopped
        # Resume on one rank (statistical continuation) and run two more steps.
        res = kids.start(_cmd(1, *common, "--steps", str(stopped + 2), "--resize"))
        text, _ = res.communicate(timeout=240)
        assert res.returncode == 0, text[-3000:]
        assert kids.left() == []
    out2 = _lines(text)
    assert out2[0] == {"world": 1, "restored_step": stopped}
    assert out2[-1] == {"done": stopped + 2, "preempted": False}
    restore = [json.loads(x) for x in events.read_text().splitlines() if '"restore"' in x][-1]
    assert restore["ok"] and restore["step"] == stopped and restore["contract"] == "statistical"


def test_example_ctrl_c_saves_the_step(tmp_path: Path) -> None:
    """Finding 5 of the user review: Ctrl-C killed the workers and nothing was saved."""
    ckpt, events = tmp_path / "d", tmp_path / "ev.jsonl"
    common = ["--ckpt", str(ckpt), "--save-every", "100", "--events", str(events)]
    with children() as kids:
        stopped = _run_and_preempt(kids, [*common, "--dim", "16", "--layers", "1"], events, 1, True)
        assert kids.left() == []
    assert portable_ckpt.open(ckpt).step == stopped
    pre = [json.loads(x) for x in events.read_text().splitlines() if '"preempted"' in x]
    assert [e["signal"] for e in pre] == ["SIGINT"]


def test_example_batch_shares_cover_the_global_batch_on_any_world_size() -> None:
    """Finding 9: shares are a partition of the global batch (empty beyond it), for any world."""
    import argparse
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("train_fsdp2", SCRIPT)
    assert spec is not None and spec.loader is not None
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    args = argparse.Namespace(seed=0, vocab=256, batch=8, ctx=4)
    data = ex.pckt.DataPosition(0, 16)
    whole = ex.batch(data, args, 0, 1)
    assert whole.shape == (8, 5)
    for world in range(1, 11):
        shares = [ex.batch(data, args, r, world) for r in range(world)]
        assert torch.equal(torch.cat(shares), whole), world
        assert max(len(s) for s in shares) - min(len(s) for s in shares) <= 1
