#!/usr/bin/env python3
"""Generate the golden vectors of errata 11 (run once; the output is frozen and committed).

Errata 11 adds pins (spec §15.3): records ``pins/<pin_id>.json`` at a root that keep a version
from every gc. Readers ignore them (R-LAYOUT-4); a conformance checker given the root reads
every ``pins/*.json`` as a pin record (R-PIN-1): one that does not validate, or is stored under
another name than its ``pin_id``, is ``PCK-SCHEMA``. Every case targets the root.

Uses the builders of ``generate_1_0.py`` and ``generate_errata_4.py`` (standard library, numpy,
crc32c). Refuses to touch an existing vector directory unless ``--force`` is given.

Usage: python conformance/vectors/generate_errata_11.py [--out DIR] [--force]
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _load(stem: str) -> Any:
    """A generator of the same directory (its builders are reused)."""
    path = Path(__file__).resolve().with_name(f"{stem}.py")
    spec = importlib.util.spec_from_file_location(f"pck_{stem}_for_errata_11", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


G = _load("generate_1_0")
E1 = _load("generate_errata_1")  # its command line writes this set too
E4 = _load("generate_errata_4")
PIN_ID = "p20260101T000005000000Z-4d5e6f70"

#: A case's generator: writes the case below a root; returns its version builder or None.
Generator = Callable[[Path], Any]
CASES: list[dict[str, Any]] = []
# every case targets the root
case: Callable[..., Callable[[Generator], Generator]] = E1.registry(CASES, target="root")


def _pinned(root: Path, name: str, **changes: Any) -> Any:
    """One version, and a pin record of it stored as ``pins/<name>.json`` with ``changes``."""
    v = E4.one_tensor()
    G.write_version(root, v)
    rec = {"format": "portable-ckpt-pin", "format_version": "1.0", "pin_id": PIN_ID,
           "attempt_id": v.id, "pinned_at": "2026-01-01T00:00:05.000000Z",
           "reason": "paper results", "by": "errata-11"}
    rec.update(changes)
    rec = {k: val for k, val in rec.items() if val is not None}
    (root / "pins").mkdir()
    (root / "pins" / f"{name}.json").write_text(json.dumps(rec, indent=1) + "\n")
    return v


@case("valid-root-with-pin", "§15.3, R-PIN-1, R-PIN-2: a root with one version and a pin record "
      "of it, pins/<pin_id>.json: readers ignore pins/ (R-LAYOUT-4) and read the version")
def _(root: Path) -> Any:
    return _pinned(root, PIN_ID)


@case("pin-record-misnamed", "R-PIN-1: a valid pin record of the version stored as "
      "pins/p20260101T000009000000Z-00000000.json, but its pin_id is "
      f"{PIN_ID}: PCK-SCHEMA for a checker; readers read the version",
      code="PCK-SCHEMA", reader="accept")
def _(root: Path) -> Any:
    return _pinned(root, "p20260101T000009000000Z-00000000")


@case("pin-record-without-attempt-id", "R-PIN-1, pin.schema.json: a pin record without "
      "attempt_id, under its own pin_id: PCK-SCHEMA for a checker; it pins nothing (R-PIN-2), "
      "readers read the version", code="PCK-SCHEMA", reader="accept")
def _(root: Path) -> Any:
    return _pinned(root, PIN_ID, attempt_id=None)


DESCRIPTION = ("Golden vectors of errata 11 (spec §20): pin records at a root (§15.3), a valid "
               "one, one stored under another name and one without attempt_id. Every case "
               "targets the root. 'reader': 'accept' marks a rule readers do not check: a "
               "conformance checker reports 'code', a reader reads 'expected'.")


def main(argv: list[str] | None = None) -> int:
    """Write every case below ``--out`` (default: ``errata-11`` next to this script)."""
    return int(E1.write_set(argv, CASES, "errata-11", DESCRIPTION, __doc__))


if __name__ == "__main__":
    sys.exit(main())
