"""What is left of a process's session once the process itself has ended."""

from __future__ import annotations

import subprocess
import time


def left_in_session(sid: int, seconds: float = 10.0) -> str:
    """The pids still in session ``sid`` after waiting up to ``seconds`` for it to empty.

    A fork server and a resource tracker follow their parent out a moment after it exits.
    """
    deadline, left = time.monotonic() + seconds, "?"
    while time.monotonic() < deadline:
        left = subprocess.run(["pgrep", "-s", str(sid)], capture_output=True,
                              text=True).stdout.strip()
        if not left:
            break
        time.sleep(0.2)
    return left
