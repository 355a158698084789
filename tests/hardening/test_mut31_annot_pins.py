"""Mutation audit 31a, pins of a newer format (spec §15.3, R-PIN-2; ``io/pins.py``): a pin this
tool cannot validate still pins, whatever newer MAJOR it claims.

Each test names the mutant it kills.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from portable_ckpt.io.pins import read_pins

from ..rules.test_r_pin import _root


@pytest.mark.parametrize("version", ["2.0", "3.1", "10.0"])
def test_a_pin_of_any_newer_major_pins(tmp_path: Path, version: str) -> None:
    """Mutant P05 (only MAJOR 2 taken for newer): a pin of format 3.x or 10.x was validated
    as a 1.x record, failed, and unpinned the version; gc could delete it."""
    root, ids = _root(tmp_path, 2)
    pid = "p20200101T000000000000Z-33333333"
    (root / "pins").mkdir()
    (root / "pins" / f"{pid}.json").write_text(json.dumps({
        "format": "portable-ckpt-pin", "format_version": version, "attempt_id": ids[0],
        "pin_id": pid, "something": "else"}))
    assert list(read_pins(root)) == [ids[0]]


def test_a_record_of_another_format_in_pins_is_no_pin(tmp_path: Path) -> None:
    """A record of another format (here a newer major's) under a pin's name is no pin: only
    ``portable-ckpt-pin`` records pin. Mutant A80 (the format not looked at): it pinned."""
    root, ids = _root(tmp_path, 2)
    pid = "p20200101T000000000000Z-44444444"
    (root / "pins").mkdir()
    (root / "pins" / f"{pid}.json").write_text(json.dumps({
        "format": "portable-ckpt-drill", "format_version": "2.0", "attempt_id": ids[0],
        "pin_id": pid}))
    assert read_pins(root) == {}
