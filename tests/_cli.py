"""The command-line tool as its users run it: a subprocess, optionally without root's powers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def unprivileged_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI without the capabilities that let root read any file (a chmod 0 then counts)."""
    argv = [sys.executable, "-m", "portable_ckpt.cli.main", *args]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("needs setpriv to drop CAP_DAC_OVERRIDE as root")
        drop = "-dac_override,-dac_read_search"
        argv = ["setpriv", f"--inh-caps={drop}", f"--bounding-set={drop}", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=cwd)
