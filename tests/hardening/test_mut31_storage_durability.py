"""Mutation audit 31, durability of what ``create_if_absent`` publishes on a local root.

The real system calls of the real backend, logged through ``tests/rules/_trace.py`` (wrappers
that perform every call).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.io.pins import pin
from portable_ckpt.storage import open_storage

from ..rules._trace import trace_posix


def test_a_first_pin_makes_the_new_pins_directory_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bug (audit 31): a root's first pin created ``pins/`` and fsynced only ``pins/`` after
    the link, never the root that names it: a crash after ``pin()`` returned could lose the
    directory and the pin with it, and gc would delete the pinned version. Every directory a
    create makes has its name fsynced in its parent before it returns (R-COMMIT-17)."""
    root = tmp_path / "root"
    m = portable_ckpt.save_arrays(root, {"w": np.ones(2)}, step=1)
    storage = open_storage(root)
    log = trace_posix(monkeypatch)
    rel = pin(storage, m.attempt_id)
    monkeypatch.undo()
    i_link = log.index("link", lambda p: p.endswith(f" -> {root / rel}"))
    after = [p for c, p, _ in log.events[i_link:] if c == "fsync"]
    assert str(root / "pins") in after and str(root) in after, after
