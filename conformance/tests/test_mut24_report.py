"""Mutation audit 24, conformance/report.py: the replay line is one copy-pasteable command."""

from __future__ import annotations

import shlex
import subprocess
import sys

from conformance.report import shell_join


def test_a_replay_line_survives_the_shell() -> None:
    """A case directory or adapter path with a space, a quote or a ``$`` (a CI workspace named
    after a branch) is one argument of the replay line, run as it was."""
    argv = [sys.executable, "-c", "import sys; print(repr(sys.argv[1:]))",
            "/ci/my work/case 0001", "it's", "$HOME", "a;b"]
    line = shell_join(argv)
    assert shlex.split(line) == argv
    out = subprocess.run(line, shell=True, capture_output=True, text=True, check=True).stdout
    assert out.strip() == repr(argv[3:])
