#!/usr/bin/env python3
"""Generate the golden vectors of format 1.2 (run once; the output is frozen and committed).

Format 1.2 adds one optional member to verification records (spec §14.5): ``clears``, the ids of
failed verification records of the same version that a passed deep verification clears
(R-DRILL-10). A conformance checker reads every file of ``verifications/`` named like a
verification record and validates it against ``schemas/1.2/verification.schema.json``, which
constrains ``clears`` in a passed deep record of format 1.2 or later (an empty ``clears`` or a
malformed id is ``PCK-SCHEMA``, and the record does not count); in any other record the member
is ignored (unknown in 1.0 and 1.1, R-VERSION-6), and in a failed or sampled 1.2 record the
checker reports it (``PCK-SCHEMA``) while the record counts as what it says. Each case says in
``failed_verification`` whether the version has failed verification (R-VERSION-14). Records are
not part of the version: readers read it as usual.

Uses the builders of ``generate_1_0.py`` (standard library, numpy, crc32c). Refuses to touch an existing vector directory unless ``--force`` is given.

Usage: python conformance/vectors/generate_1_2.py [--out DIR] [--force]
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
    spec = importlib.util.spec_from_file_location(f"pck_{stem}_for_1_2", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


G = _load("generate_1_0")
E1 = _load("generate_errata_1")  # its command line writes this set too
FAILED_ID = "v20260101T000003000000Z-0badf00d"
CLEARING_ID = "v20260101T000009000000Z-600dc0de"

#: A case's generator: writes the case below a root; returns its version builder or None.
Generator = Callable[[Path], Any]
CASES: list[dict[str, Any]] = []
case: Callable[..., Callable[[Generator], Generator]] = E1.registry(CASES)


def _record(m: dict[str, Any], rid: str, **changes: Any) -> dict[str, Any]:
    """A verification record of the version of manifest ``m``: a passed deep one by default."""
    rec: dict[str, Any] = {
        "format": "portable-ckpt-verification", "format_version": "1.0",
        "attempt_id": m["attempt_id"], "verification_id": rid,
        "verified_at": f"2026-01-01T00:00:{rid[14:16]}.000000Z", "ok": True, "mode": "deep",
        "fraction": 1.0, "chunks": 1, "seed": None, "errors": []}
    rec.update(changes)
    return rec


def _one_tensor() -> Any:
    """``w`` (int64[4], one range) and one global entry."""
    v = G.V(10)
    v.tensor("w", "int64", [4], [3, -1, 4, 1])
    v.entry("meta", {"note": "1.2"})
    return v


def _failed(rid: str = FAILED_ID) -> dict[str, Any]:
    return _record({"attempt_id": ""}, rid, ok=False, errors=[{
        "code": "PCK-CHECKSUM", "message": "data/w00000-0000.safetensors: block 0 damaged"}])


def _verified(root: Path, *records: dict[str, Any], moved: tuple[str, ...] = (),
              base: bool = True, names: dict[str, str] | None = None) -> Any:
    """One version, a failed deep verification of it (unless not ``base``), then ``records``.

    ``moved``: the ids of records stored in ``verifications/cleared/`` instead (history, §14.5);
    ``names``: a record's file name by its id, where it is not its own; a record's
    ``attempt_id`` is the version's unless it gives one.
    """
    v = _one_tensor()
    vdir = G.write_version(root, v)
    m = json.loads((vdir / "manifest.json").read_text())
    (vdir / "verifications").mkdir()
    for rec in ((_failed(),) if base else ()) + records:
        rec = dict(rec, attempt_id=rec.get("attempt_id") or m["attempt_id"])
        rid = rec["verification_id"]
        sub = vdir / "verifications" / ("cleared" if rid in moved else "")
        sub.mkdir(exist_ok=True)
        name = (names or {}).get(rid, rid)
        (sub / f"{name}.json").write_text(json.dumps(rec, indent=1) + "\n")
    return v


def _clearing(**changes: Any) -> dict[str, Any]:
    rec = _record({"attempt_id": ""}, CLEARING_ID, format_version="1.2", clears=[FAILED_ID])
    rec.update(changes)
    return rec


@case("valid-verification-cleared", "§14.5, R-DRILL-8, R-DRILL-10: a version with a failed deep "
      f"verification record ({FAILED_ID}) and a passed deep 1.2 record whose clears lists it: "
      "both records are valid; the version has not failed verification; readers read it "
      "(records are not part of it, §14.3)", failed_verification=False)
def _(root: Path) -> Any:
    return _verified(root, _clearing())


@case("valid-verification-cleared-and-moved", "§14.5, R-DRILL-10: the failed record cleared and "
      "moved to verifications/cleared/, history that counts for no tool; the version has not "
      "failed verification", failed_verification=False)
def _(root: Path) -> Any:
    return _verified(root, _clearing(), moved=(FAILED_ID,))


@case("valid-verification-one-of-two-cleared", "§14.5, R-DRILL-8: two failed records, the 1.2 "
      "record clears one: the other still fails the version", failed_verification=True)
def _(root: Path) -> Any:
    return _verified(root, _failed("v20260101T000005000000Z-0badf00e"), _clearing())


@case("valid-verification-1-0-with-clears", "R-VERSION-6, §14.5: a 1.0 verification record with "
      "a member clears: unknown in 1.0, ignored (it clears nothing); the record is valid and the "
      "version has failed verification", failed_verification=True)
def _(root: Path) -> Any:
    return _verified(root, _clearing(format_version="1.0"))


@case("verification-clears-in-failed-record", "R-DRILL-10: a 1.2 record with ok false and "
      "clears: PCK-SCHEMA for a checker (a writer's mistake); readers ignore the member, so the "
      "record still fails the version, and read it", code="PCK-SCHEMA", reader="accept",
      failed_verification=True)
def _(root: Path) -> Any:
    return _verified(root, dict(_failed("v20260101T000009000000Z-600dc0de"),
                                format_version="1.2", clears=[FAILED_ID]))


@case("verification-clears-in-sample-record", "R-DRILL-10: a passed 1.2 record of mode sample "
      "with clears (only a deep pass clears): PCK-SCHEMA for a checker; it clears nothing, the "
      "version has failed verification; readers read it", code="PCK-SCHEMA", reader="accept",
      failed_verification=True)
def _(root: Path) -> Any:
    return _verified(root, _clearing(mode="sample", fraction=0.5, seed=7))


@case("verification-clears-empty", "R-DRILL-10, schemas/1.2/verification.schema.json: a passed "
      "deep 1.2 record whose clears is []: PCK-SCHEMA for a checker; the record does not count, "
      "the version has failed verification; readers read it", code="PCK-SCHEMA",
      reader="accept", failed_verification=True)
def _(root: Path) -> Any:
    return _verified(root, _clearing(clears=[]))


@case("verification-only-failed-record-carries-clears", "R-DRILL-8, R-DRILL-10, §14.3: the only "
      "failed record is a 1.2 record with clears (a writer's mistake): PCK-SCHEMA for a checker, "
      "yet the record counts and the version has failed verification", code="PCK-SCHEMA",
      reader="accept", failed_verification=True)
def _(root: Path) -> Any:
    return _verified(root, dict(_failed(), format_version="1.2",
                                clears=["v20260101T000001000000Z-00000001"]), base=False)


@case("valid-verification-1-1-clearer", "R-VERSION-6, §14.5: a passed deep record of format 1.1 "
      "whose clears lists the failed record: unknown in 1.1, it clears nothing; the version has "
      "failed verification", failed_verification=True)
def _(root: Path) -> Any:
    return _verified(root, _clearing(format_version="1.1"))


@case("verification-clearer-misnamed", "R-DRILL-7, R-DRILL-10: the clearing record is stored "
      "under another name than its verification_id: PCK-SCHEMA for a checker; it does not "
      "count, so it clears nothing and the version has failed verification",
      code="PCK-SCHEMA", reader="accept", failed_verification=True)
def _(root: Path) -> Any:
    return _verified(root, _clearing(),
                     names={CLEARING_ID: "v20260101T000009000000Z-00000000"})


@case("verification-clearer-of-another-attempt", "R-DRILL-4, R-DRILL-10: the clearing record "
      "names another attempt: PCK-ATTEMPT-ID for a checker; it does not count, the version has "
      "failed verification", code="PCK-ATTEMPT-ID", reader="accept", failed_verification=True)
def _(root: Path) -> Any:
    return _verified(root, _clearing(
        attempt_id="s000000000009-20260101T000000000000Z-0123456789abcdef"))


@case("verification-clearer-with-a-bad-id", "R-DRILL-10, schemas/1.2/verification.schema.json: "
      "a passed deep 1.2 record whose clears holds the failed id and one that is no id: "
      "PCK-SCHEMA for a checker; the record does not count, the version has failed "
      "verification", code="PCK-SCHEMA", reader="accept", failed_verification=True)
def _(root: Path) -> Any:
    return _verified(root, _clearing(clears=[FAILED_ID, "not-an-id"]))


@case("valid-verification-moved-and-clearer-gone", "§14.5: the failed record below "
      "verifications/cleared/ and no clearing record (removed by a tool of 1.1): history, no "
      "record; the version has not failed verification", failed_verification=False)
def _(root: Path) -> Any:
    return _verified(root, moved=(FAILED_ID,))


@case("valid-verification-clearer-1-10", "§16.1, §14.5: a clearing record of format 1.10 "
      "(newer than 1.2, compared as numbers, not text): it clears; the version has not failed "
      "verification", failed_verification=False)
def _(root: Path) -> Any:
    return _verified(root, _clearing(format_version="1.10"))


DESCRIPTION = ("Golden vectors of format 1.2 (spec §20): verification records that clear failed "
               "ones (§14.5, R-DRILL-10), valid and invalid. Records are not part of the "
               "version: 'reader': 'accept' marks a rule readers do not check: a conformance "
               "checker reports 'code', a reader reads 'expected'. 'failed_verification': "
               "whether the version has failed verification (a tool that chooses versions to "
               "restore passes over it, R-DRILL-8).")


def main(argv: list[str] | None = None) -> int:
    """Write every case below ``--out`` (default: ``1.2`` next to this script)."""
    return int(E1.write_set(argv, CASES, "1.2", DESCRIPTION, __doc__, format_version="1.2"))


if __name__ == "__main__":
    sys.exit(main())
