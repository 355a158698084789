#!/usr/bin/env python3
"""Generate the golden vectors of errata 16 (run once; the output is frozen and committed).

Errata 16 (spec §23) clarifies rules on which two readers written from the text disagreed:

* R-CONTRACT-8: a reader accepts a mesh dimension name outside the schema's pattern (unique, 1
  to 64 characters, no C0 control character or DEL), and such a name fails no check of the
  commit record, so a root whose newest version has one resolves to it. A conformance checker
  reports the name (``PCK-SCHEMA``, ``"reader": "accept"``); the older version of each such
  root holds other values, which a reader that skipped the newer one would return. A name with
  a control character or DEL, or of 65 characters, is ``PCK-SCHEMA`` for readers too (those
  cases target the attempt: opened as part of a root, R-READ-1 skips it).
* R-DRILL-12: a verification record of a newer MAJOR (``"2.0"``) stored under its own
  ``verification_id`` and naming the version's ``attempt_id`` makes the version's verification
  status unknown: ``failed_verification`` is ``null``, and a tool that restores automatically
  neither takes the version nor passes over it to an older one (it fails with
  ``PCK-STORAGE``). Such a record naming another attempt, or stored under another name, does
  not count (``false``). A checker of 1.x reports the record (``PCK-VERSION-UNSUPPORTED``,
  R-VERSION-3); readers do not read records (``"reader": "accept"``).
* §14.5: the times of two records play no part in whether one clears the other; a clearing
  dated before the failure it lists clears it (``false``), and a checker warns of it (§18.5),
  also once the failure was moved below ``verifications/cleared/``: the cases are valid.
* R-SHARD-6 concerns every header entry: an entry no range record names whose span is not
  ``prod(shape) × itemsize``, though the spans tile the data area (R-SHARD-9), is
  ``PCK-SHARD-HEADER`` for readers too.

Uses the builders of ``generate_1_0.py``, ``generate_errata_1.py`` and ``generate_1_2.py``
(standard library, numpy, crc32c; no case holds a zstd frame). Refuses to touch an existing
vector directory unless ``--force`` is given.

Usage: python conformance/vectors/generate_errata_16.py [--out DIR] [--force]
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _load(stem: str) -> Any:
    """A generator of the same directory (its builders are reused)."""
    path = Path(__file__).resolve().with_name(f"{stem}.py")
    spec = importlib.util.spec_from_file_location(f"pck_{stem}_for_errata_16", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


G = _load("generate_1_0")
E1 = _load("generate_errata_1")  # its command line writes this set too
P = _load("generate_1_2")  # verification records
FAILED_ID = "v20260101T000009000000Z-0badf00d"
CLEARING_ID = "v20260101T000003000000Z-600dc0de"
MAJOR_2_ID = "v20260101T000005000000Z-20202020"
OTHER_ATTEMPT = "s000000000009-20260101T000000000000Z-0123456789abcdef"
#: 64 characters, a space and non-ASCII letters among them (65 bytes of UTF-8)
NAME_64 = "tensor parallel \u00fcber alles " + "x" * 37

#: A case's generator: writes the case below a root; returns its version builder or None.
Generator = Callable[[Path], Any]
CASES: list[dict[str, Any]] = []
case: Callable[..., Callable[[Generator], Generator]] = E1.registry(CASES)
root_case: Callable[..., Callable[[Generator], Generator]] = E1.registry(CASES, target="root")


# ----------------------------------------------------------- R-CONTRACT-8: mesh dimension names
def _meshed(step: int, n: int, names: list[str], shape: list[int]) -> Any:
    """A version of ``step`` saved on the mesh ``shape`` named ``names``: ``w`` is int64[4]."""
    ws = math.prod(shape)
    v = G.V(step, n, world_size=ws)
    v.tensor("w", "int64", [4], [step * 100 + i for i in range(4)])
    v.entry("meta", {"note": "errata-16", "step": step})
    v.extra = {"continuation": {"contract": "exact", "world_size": ws,
                                "mesh": {"shape": shape, "dim_names": names}}}
    return v


def _two_steps(root: Path, names: list[str], shape: list[int]) -> Any:
    """Step 1 with a mesh named like the schema asks, step 2 on ``names``; returns step 2."""
    G.write_version(root, _meshed(1, 0, ["dp_shard", "tp"][:len(shape)], shape))
    v = _meshed(2, 1, names, shape)
    G.write_version(root, v)
    return v


@root_case("mesh-dim-name-hyphen", "R-CONTRACT-8, §13: a root whose newest version (step 2) was "
           "saved on a mesh [2, 2] named [\"dp-shard\", \"tp\"] (a DeviceMesh's names, which the "
           "reference writer recorded unchanged before errata 3): outside the schema's pattern, "
           "PCK-SCHEMA for a checker; a reader accepts the name, the commit record is valid, "
           "and the root resolves to step 2 (a reader that rejected the name returned step 1, "
           "whose tensor differs)", code="PCK-SCHEMA", reader="accept")
def _(root: Path) -> Any:
    return _two_steps(root, ["dp-shard", "tp"], [2, 2])


@root_case("mesh-dim-name-64-characters", "R-CONTRACT-8, §13: the newest version's mesh "
           "dimension is named by 64 characters with spaces and a non-ASCII letter (65 bytes of "
           "UTF-8), no C0 control character or DEL: PCK-SCHEMA for a checker; a reader accepts "
           "it (characters are counted, not bytes) and the root resolves to step 2",
           code="PCK-SCHEMA", reader="accept")
def _(root: Path) -> Any:
    assert len(NAME_64) == 64 and len(NAME_64.encode()) == 65
    return _two_steps(root, [NAME_64], [4])


def _one_meshed(root: Path, names: list[str]) -> None:
    G.write_version(root, _meshed(2, 1, names, [4]))


@case("invalid-mesh-dim-name-control-character", "R-CONTRACT-8, R-COMMIT-15: a mesh dimension "
      "named \"dp\\tshard\" (a C0 control character): PCK-SCHEMA for readers too; the commit "
      "record is invalid, and a reader resolving the latest version of a root skips it "
      "(R-READ-1)", code="PCK-SCHEMA")
def _(root: Path) -> None:
    _one_meshed(root, ["dp\tshard"])


@case("invalid-mesh-dim-name-del", "R-CONTRACT-8, R-COMMIT-15: a mesh dimension named "
      "\"dp\\u007fshard\" (DEL): PCK-SCHEMA for readers too", code="PCK-SCHEMA")
def _(root: Path) -> None:
    _one_meshed(root, ["dp\x7fshard"])


@case("invalid-mesh-dim-name-65-characters", "R-CONTRACT-8, R-COMMIT-15: a mesh dimension "
      "named by 65 characters (a space among them): PCK-SCHEMA for readers too",
      code="PCK-SCHEMA")
def _(root: Path) -> None:
    _one_meshed(root, [NAME_64 + "x"])


# ------------------------------------------------------- R-DRILL-12: a status a tool cannot know
def _major_2(**changes: Any) -> dict[str, Any]:
    """A verification record of format 2.0 (its members mean what 2.0 says: unknown to 1.x)."""
    rec: dict[str, Any] = {
        "format": "portable-ckpt-verification", "format_version": "2.0", "attempt_id": "",
        "verification_id": MAJOR_2_ID, "verified_at": "2026-01-01T00:00:05.000000Z",
        "outcome": {"state": "damaged", "files": ["data/w00000-0000.safetensors"]}}
    rec.update(changes)
    return rec


@case("verification-record-of-major-2", "R-DRILL-12, R-VERSION-3, §14.5: the version's only "
      "verification record is of format 2.0, stored under its own verification_id and naming "
      "the version's attempt_id: PCK-VERSION-UNSUPPORTED for a checker of 1.x; readers read "
      "the version (records are not part of it, §14.3); its verification status is unknown "
      "(failed_verification null): a tool that restores automatically neither takes it nor an "
      "older version, and fails with PCK-STORAGE naming the record",
      code="PCK-VERSION-UNSUPPORTED", reader="accept", failed_verification=None)
def _(root: Path) -> Any:
    return P._verified(root, _major_2(), base=False)


@case("verification-record-of-major-2-other-attempt", "R-DRILL-12, R-DRILL-4: a 2.0 "
      "verification record under its own verification_id that names another attempt: "
      "PCK-VERSION-UNSUPPORTED for a checker; it does not count, the version has not failed "
      "verification and its status is known", code="PCK-VERSION-UNSUPPORTED", reader="accept",
      failed_verification=False)
def _(root: Path) -> Any:
    return P._verified(root, _major_2(attempt_id=OTHER_ATTEMPT), base=False)


@case("verification-record-of-major-2-misnamed", "R-DRILL-12, R-DRILL-7: a 2.0 verification "
      "record naming the version, stored as verifications/v20260101T000005000000Z-00000000.json "
      f"while its verification_id is {MAJOR_2_ID}: PCK-VERSION-UNSUPPORTED for a checker; it "
      "does not count, the version has not failed verification and its status is known",
      code="PCK-VERSION-UNSUPPORTED", reader="accept", failed_verification=False)
def _(root: Path) -> Any:
    return P._verified(root, _major_2(), base=False,
                       names={MAJOR_2_ID: "v20260101T000005000000Z-00000000"})


@case("verification-record-of-major-2-other-format", "R-DRILL-12, §14.5: a 2.0 record under its "
      "own verification_id naming the version, whose format member is another than 1.x's "
      "(portable-ckpt-verification-2): its members are read as in format 1 whatever its format "
      "says, and the version's status is unknown (null); a checker reports the format member "
      "first (§16.3: PCK-SCHEMA)",
      code="PCK-SCHEMA", reader="accept", failed_verification=None)
def _(root: Path) -> Any:
    return P._verified(root, _major_2(format="portable-ckpt-verification-2"), base=False)


@case("verification-record-of-major-2-beside-a-failure", "R-DRILL-12, R-DRILL-8, §14.5: a "
      f"failed deep 1.0 record ({FAILED_ID}) and a 2.0 record naming the version: the 2.0 "
      "record may clear the failure, so the status is unknown (null), not failed",
      code="PCK-VERSION-UNSUPPORTED", reader="accept", failed_verification=None)
def _(root: Path) -> Any:
    return P._verified(root, _failed_late(), _major_2(), base=False)


@case("verification-record-of-version-0-9", "R-DRILL-12, §16.1: a record naming the version "
      "under its own verification_id whose format_version 0.9 is of a MAJOR below 1, no newer "
      "MAJOR: it does not count (the version has not failed verification, its status is "
      "known); a checker reports the unknown MAJOR (R-VERSION-3)",
      code="PCK-VERSION-UNSUPPORTED", reader="accept", failed_verification=False)
def _(root: Path) -> Any:
    return P._verified(root, _major_2(format_version="0.9"), base=False)


# --------------------------------------------------------------- §14.5: times play no part
def _failed_late() -> dict[str, Any]:
    return dict(P._failed(FAILED_ID))


def _early_clearing() -> dict[str, Any]:
    return dict(P._record({"attempt_id": ""}, CLEARING_ID, format_version="1.2",
                          clears=[FAILED_ID]))


@case("valid-verification-clearing-dated-before-failure", "§14.5, R-DRILL-10, §18.5: a failed "
      f"deep verification record ({FAILED_ID}, verified at 00:00:09) and a passed deep 1.2 "
      f"record ({CLEARING_ID}, verified at 00:00:03) whose clears lists it: the times play no "
      "part, the failed record is cleared and the version has not failed verification; a "
      "checker warns of the clearing dated before the failure (no error)",
      failed_verification=False)
def _(root: Path) -> Any:
    return P._verified(root, _failed_late(), _early_clearing(), base=False)


@case("valid-verification-clearing-dated-before-moved-failure", "§14.5, R-DRILL-10, §18.5: the "
      "same records, the failed one moved to verifications/cleared/: the version has not "
      "failed verification; a checker still warns (no error)", failed_verification=False)
def _(root: Path) -> Any:
    return P._verified(root, _failed_late(), _early_clearing(), base=False, moved=(FAILED_ID,))


# ------------------------------------------------------------ R-SHARD-6: every header entry
@case("invalid-shard-unused-entry-span-size", "R-SHARD-6, §11.2: the shard's header holds, "
      "besides the two entries the range records name, an entry x (I32 [2]) that none names, "
      "whose span is 12 bytes, not 8; the three spans tile the data area (R-SHARD-9): "
      "PCK-SHARD-HEADER for readers too", code="PCK-SHARD-HEADER")
def _(root: Path) -> None:
    v = E1.two_tensors()
    data = E1.shard([("a@0", "I32", [4], 0, 16), ("b@0", "I32", [4], 16, 32),
                     ("x", "I32", [2], 32, 44)], E1.A + E1.B + bytes(12))
    G.write_version(root, v, mutate_files=E1.with_shard(v, data))


DESCRIPTION = ("Golden vectors of errata 16 (spec §20): mesh dimension names outside the "
               "schema's pattern (R-CONTRACT-8; at a root, its newest version), verification "
               "records of a newer MAJOR (R-DRILL-12), a clearing dated before the failure it "
               "clears (§14.5) and a header entry no record uses (R-SHARD-6). 'reader': "
               "'accept' marks a rule readers do not check: a conformance checker reports "
               "'code', a reader reads 'expected'. 'failed_verification': whether the version "
               "has failed verification; null: its status is unknown to a tool of 1.x (a tool "
               "that restores automatically stops there with PCK-STORAGE, R-DRILL-12).")


def main(argv: list[str] | None = None) -> int:
    """Write every case below ``--out`` (default: ``errata-16`` next to this script)."""
    return int(E1.write_set(argv, CASES, "errata-16", DESCRIPTION, __doc__,
                            format_version="1.2"))


if __name__ == "__main__":
    sys.exit(main())
