"""Ctrl-C of a harness that runs several adapters at once (``--jobs``): shared by its tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["assert_an_interrupt_kills_every_adapter"]

REPO = Path(__file__).resolve().parents[2]

_SLEEPER = """
import os, sys, time
open(os.path.join(os.environ["PCK_TEST_PIDS"], str(os.getpid())), "w").close()
time.sleep(120)
"""


def assert_an_interrupt_kills_every_adapter(tmp_path: Path, *harness: str) -> None:
    """Run ``python -m conformance HARNESS... --jobs 2 -- SLEEPER`` until both adapters run,
    send SIGINT: the run must end 130 within 15 s, no adapter outlive it, none start after."""
    pids = tmp_path / "pids"
    pids.mkdir()
    script = tmp_path / "sleeper.py"
    script.write_text(_SLEEPER)
    proc = subprocess.Popen(
        [sys.executable, "-m", "conformance", *harness, "--jobs", "2", "--", sys.executable,
         str(script)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PCK_TEST_PIDS": str(pids)})
    deadline = time.monotonic() + 60
    while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    started = [int(p.name) for p in pids.iterdir()]
    assert len(started) == 2, "the two adapters were not seen running"
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and time.monotonic() - t0 < 15, (proc.returncode, err)
    assert "interrupted" in err and "Traceback" not in err, err
    time.sleep(0.5)  # (reaped by init once the harness is gone)
    for pid in started:
        alive = Path(f"/proc/{pid}").exists() and "Z" not in Path(
            f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        assert not alive, f"adapter {pid} outlived the interrupted run"
    assert len(list(pids.iterdir())) == 2  # no adapter started after the interrupt
