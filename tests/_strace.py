"""The ``strace`` binary for tests that watch or fault a real process's system calls."""

from __future__ import annotations

import os
import shutil

import pytest


def strace_or_skip() -> str:
    """Its path; skip without it, except on CI (``.ci/run`` installs it), where that fails."""
    path = shutil.which("strace")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("strace is missing on CI (.ci/run installs it)")
        pytest.skip("strace is not installed")
    return path
