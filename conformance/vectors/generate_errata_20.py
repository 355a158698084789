#!/usr/bin/env python3
"""Generate the retention vectors of errata 20 (run once; the output is frozen and committed).

Errata 20 (spec §20.1) adds a second kind of golden vector: a root, a gc policy and, for every
attempt of the root, its class (§15.1) and what a gc run with that policy does with it. A case
is ``<name>/root/``; its ``setup`` dates the files (the modification times a gc measures ages
by are not something git keeps): ``{"op": "age", "path", "seconds"}`` sets the modification
time of the file ``path`` (relative to the case directory), or of every file below the
directory ``path``, to the time of the copy minus ``seconds``; ``{"op": "mkdir", "path"}``
creates a directory git cannot carry (an empty one). Every case first dates every file a day
back, so that only what a case dates otherwise is recent.

Uses the builders of ``generate_1_0.py`` (standard library, numpy, crc32c). Refuses to touch an
existing vector directory unless ``--force`` is given.

Usage: python conformance/vectors/generate_errata_20.py [--out DIR] [--force]
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
    spec = importlib.util.spec_from_file_location(f"pck_{stem}_for_errata_20", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


G = _load("generate_1_0")
E1 = _load("generate_errata_1")  # its command line writes this set too
DAY = 86400
HOUR = 3600
#: The policy a case uses unless it says otherwise (the reference gc's defaults, ``keep`` 1).
POLICY: dict[str, Any] = {"keep": 1, "grace_seconds": 3600, "delete_invalid": False,
                          "retire_abandoned": False}
OUTCOMES = ("keep", "should-keep", "delete", "either")


def aid(step: int, n: int = 0, day: str = "20260101") -> str:
    """An attempt id of ``step`` created on ``day`` (``n`` seconds after midnight)."""
    return f"s{step:012d}-{day}T0000{n:02d}000000Z-{0x0123456789abcdef + 16 * step + n:016x}"


def stamp(seconds: int) -> str:
    """``2026-01-01T00:00:00Z`` plus ``seconds``, as the format writes times."""
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"2026-01-01T{h:02d}:{m:02d}:{s:02d}.000000Z"


class Root:
    """Builder of one case's root: versions, records, pins and other files."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.attempts: dict[str, dict[str, Any]] = {}
        self.untouched: list[str] = []
        self.setup: list[dict[str, Any]] = []

    def version(self, step: int, n: int = 0, *, committed: int = 1, outcome: str, cls: str =
                "committed", why: str, day: str = "20260101", manifest: bool = True,
                format_version: str = "1.0") -> str:
        """A version of one tensor (``w``: int64[2]); ``committed``: seconds after T0."""
        v = G.V(step, n)
        v.id = aid(step, n, day)
        v.tensor("w", "int64", [2], [step, n])
        v.extra = {"created_at": stamp(committed - 1), "committed_at": stamp(committed),
                   "format_version": format_version}
        G.write_version(self.path, v, no_manifest=not manifest)
        return self.attempt(v.id, cls=cls, outcome=outcome, why=why)

    def find(self, prefix: str) -> str:
        """The one attempt id that starts with ``prefix`` (e.g. ``s000000000020-``)."""
        (found,) = [a for a in self.attempts if a.startswith(prefix)]
        return found

    def attempt(self, attempt_id: str, *, cls: str, outcome: str, why: str) -> str:
        """Record what is expected of an attempt written by hand."""
        assert outcome in OUTCOMES, outcome
        self.attempts[attempt_id] = {"class": cls, "outcome": outcome, "why": why}
        return attempt_id

    def write(self, rel: str, data: bytes | str | dict[str, Any]) -> None:
        """A file below the root (JSON for a dict)."""
        p = self.path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, dict):
            data = json.dumps(data, indent=1) + "\n"
        p.write_bytes(data.encode() if isinstance(data, str) else data)

    def drill(self, attempt_id: str, did: str = "d20260102T000000000000Z-00d0d0d0", *,
              ok: bool = True, name: str | None = None) -> None:
        """A drill record of ``attempt_id`` stored as ``drills/<name or did>.json``."""
        self.write(f"{attempt_id}/drills/{name or did}.json", {
            "format": "portable-ckpt-drill", "format_version": "1.0", "attempt_id": attempt_id,
            "drill_id": did, "ok": ok, "started_at": "2026-01-02T00:00:00.000000Z",
            "finished_at": "2026-01-02T00:00:01.000000Z", "world_size": 1,
            "saved_world_size": 1, "contract": "exact", "measurements": {},
            "error": None if ok else {"code": "PCK-CONTRACT", "message": "drill failed"}})

    def verification(self, attempt_id: str, *, ok: bool, major: int = 1,
                     vid: str = "v20260102T000000000000Z-0badf00d") -> None:
        """A deep verification record of ``attempt_id`` (failed unless ``ok``)."""
        self.write(f"{attempt_id}/verifications/{vid}.json", {
            "format": "portable-ckpt-verification", "format_version": f"{major}.0",
            "attempt_id": attempt_id, "verification_id": vid,
            "verified_at": "2026-01-02T00:00:00.000000Z", "ok": ok, "mode": "deep",
            "fraction": None, "chunks": 1, "seed": None,
            "errors": [] if ok else [{"code": "PCK-CHECKSUM", "message":
                                      "data/w00000-0000.safetensors: block 0 damaged"}]})

    def pin(self, attempt_id: str, pid: str = "p20260102T000000000000Z-4d5e6f70", *,
            name: str | None = None, **changes: Any) -> None:
        """A pin record of ``attempt_id`` stored as ``pins/<name or pid>.json``."""
        rec: dict[str, Any] = {"format": "portable-ckpt-pin", "format_version": "1.0",
                               "pin_id": pid, "attempt_id": attempt_id,
                               "pinned_at": "2026-01-02T00:00:00.000000Z",
                               "reason": "errata-20 vector"}
        rec.update(changes)
        rec = {k: v for k, v in rec.items() if v is not None}
        self.write(f"pins/{name or pid}.json", rec)
        self.untouched.append(f"pins/{name or pid}.json")

    def mark(self, attempt_id: str, gid: str = "g20260102T000000000000Z-5e1ec7ed", *,
             name: str | None = None, names: str | None = None, **changes: Any) -> None:
        """A deletion mark in ``attempt_id`` (naming ``names`` or it), ``deleting/<gid>.json``."""
        rec: dict[str, Any] = {"format": "portable-ckpt-deletion", "format_version": "1.0",
                               "deletion_id": gid, "attempt_id": names or attempt_id,
                               "started_at": "2026-01-02T00:00:00.000000Z",
                               "reason": "retention", "by": "errata-20 vector"}
        rec.update(changes)
        rec = {k: v for k, v in rec.items() if v is not None}
        self.write(f"{attempt_id}/deleting/{name or gid}.json", rec)

    def data_only(self, step: int, n: int = 0, *, day: str = "20260101", outcome: str,
                  cls: str = "incomplete", why: str) -> str:
        """An attempt holding one data file and no commit record (a save that stopped)."""
        a = aid(step, n, day)
        self.write(f"{a}/data/w00000-0000.safetensors",
                   G.st_file([("w@0", "I64", [2], G.encode("int64", [step, n]))]))
        return self.attempt(a, cls=cls, outcome=outcome, why=why)

    def age(self, rel: str, seconds: int) -> None:
        """Date the file (or the files below the directory) ``rel`` ``seconds`` back."""
        self.setup.append({"op": "age", "path": f"root/{rel}" if rel else "root",
                          "seconds": seconds})


Generator = Callable[[Root], None]
CASES: list[dict[str, Any]] = []


def case(name: str, feature: str, *, reports: bool | None = False, requires: str | None = None,
         reported: tuple[int, ...] = (), **policy: Any) -> Callable[[Generator], Generator]:
    """Register a case: ``policy`` changes :data:`POLICY`.

    ``reports``: gc MUST report (True), has nothing to report (False), or may (None: a stray
    attempt, reported or not); ``reported``: the steps of the attempts its report MUST name.
    """
    def deco(fn: Generator) -> Generator:
        CASES.append({"name": name, "feature": feature, "policy": {**POLICY, **policy},
                      "reports": reports, "requires": requires, "fn": fn,
                      "reported": [f"s{step:012d}-" for step in reported]})
        return fn
    return deco


def four(r: Root, keep: set[int], *, why_keep: str = "R-GC-1: among the keep greatest",
         why_delete: str = "not among the keep greatest, not the newest drilled version",
         ) -> dict[int, str]:
    """Versions of steps 10, 20, 30 and 40; those of ``keep`` kept."""
    return {s: r.version(s, outcome="keep" if s in keep else "delete",
                         why=why_keep if s in keep else why_delete)
            for s in (10, 20, 30, 40)}


# ------------------------------------------------------------------------- R-GC-1: keep
@case("keep-two-of-four", "R-GC-1: keep 2 of four committed versions: the two greatest stay, "
      "the two others go", keep=2)
def _(r: Root) -> None:
    four(r, {30, 40})


@case("keep-more-than-there-are", "R-GC-1: keep 5 of three committed versions: every one stays",
      keep=5)
def _(r: Root) -> None:
    for s in (10, 20, 30):
        r.version(s, outcome="keep", why="R-GC-1: among the keep greatest")


@case("same-step-ordered-by-commit-time", "R-GC-1, R-ID-4: two versions of step 20; the one "
      "committed later is the greater (§3) and stays with keep 1")
def _(r: Root) -> None:
    r.version(10, outcome="delete", why="not among the keep greatest")
    r.version(20, 0, committed=1, outcome="delete",
              why="the lesser of two versions of step 20 (committed first)")
    r.version(20, 1, committed=5, outcome="keep", why="R-GC-1: the greatest (committed last)")


# ------------------------------------------------------------------ R-GC-2: drilled versions
@case("newest-drilled-kept", "R-GC-2: step 20 is the only drilled version: it stays beside the "
      "keep greatest (40); 10 and 30 go")
def _(r: Root) -> None:
    v = four(r, {40})
    r.attempts[v[20]].update(outcome="keep", why="R-GC-2: the newest drilled version")
    r.drill(v[20])


@case("older-drilled-released", "R-GC-2: 10 and 20 are drilled; only the newest drilled (20) "
      "is protected")
def _(r: Root) -> None:
    v = {s: r.version(s, outcome="delete", why="an older drilled version")
         for s in (10, 20, 30)}
    r.attempts[v[30]].update(outcome="keep", why="R-GC-1: the greatest")
    r.attempts[v[20]].update(outcome="keep", why="R-GC-2: the newest drilled version")
    r.drill(v[10])
    r.drill(v[20])


@case("failed-drill-does-not-count", "R-DRILL-4, R-GC-2: a drill record of 20 with ok false "
      "does not make 20 drilled: no version is drilled, the newest (30) stays, 10 and 20 go")
def _(r: Root) -> None:
    v = {s: r.version(s, outcome="delete", why="not drilled (the record says ok: false)")
         for s in (10, 20)}
    r.version(30, outcome="keep", why="R-GC-1, R-GC-2: the greatest and newest")
    r.drill(v[20], ok=False)


@case("misnamed-drill-does-not-count", "R-DRILL-1, R-DRILL-4: a passed drill record of 20 "
      "stored under another name than its drill_id does not count: 20 goes")
def _(r: Root) -> None:
    v = {s: r.version(s, outcome="delete", why="not drilled (the record is misnamed)")
         for s in (10, 20)}
    r.version(30, outcome="keep", why="R-GC-1, R-GC-2: the greatest and newest")
    r.drill(v[20], name="d20260102T000000000000Z-11111111")


# ------------------------------------------------------------ R-GC-9: failed verification
@case("newest-failed-verification", "R-GC-9, R-GC-1: the greatest version (40) failed "
      "verification: it stays (R-GC-1), and the greatest one that did not fail (30) should too "
      "(a SHOULD: no version is drilled)")
def _(r: Root) -> None:
    v = four(r, {40})
    r.attempts[v[30]].update(outcome="should-keep",
                             why="R-GC-9: the greatest version that did not fail")
    r.verification(v[40], ok=False)


@case("cleared-by-passed-record-of-1-0-does-not-clear", "R-GC-9, §14.5: 40 holds a failed and a "
      "passed record of 1.0 (which clears nothing): it still failed; 30 should stay")
def _(r: Root) -> None:
    v = four(r, {40})
    r.attempts[v[30]].update(outcome="should-keep",
                             why="R-GC-9: the greatest version that did not fail")
    r.verification(v[40], ok=False)
    r.verification(v[40], ok=True, vid="v20260103T000000000000Z-600dc0de")


# ------------------------------------------------------------------------ R-GC-11: pins
@case("pinned-old-version", "R-GC-11: a pin of 10 keeps it whatever keep says")
def _(r: Root) -> None:
    v = four(r, {40})
    r.attempts[v[10]].update(outcome="keep", why="R-GC-11: pinned")
    r.pin(v[10])


@case("pinned-takes-no-place", "R-GC-11: keep 2 with the greatest (40) pinned: the pin takes no "
      "place among the keep greatest, so 30 and 20 stay too", keep=2)
def _(r: Root) -> None:
    v = four(r, {20, 30})
    r.attempts[v[40]].update(outcome="keep", why="R-GC-11: pinned")
    r.pin(v[40])


@case("pinned-drilled-releases-nothing", "R-GC-11, R-GC-2 (errata 19): 20 and 30 are drilled, "
      "30 is also pinned: R-GC-2 applies to the unpinned versions, so 20 stays as the newest "
      "unpinned drilled version")
def _(r: Root) -> None:
    v = four(r, {40})
    r.attempts[v[30]].update(outcome="keep", why="R-GC-11: pinned")
    r.attempts[v[20]].update(outcome="keep",
                             why="R-GC-2: the newest drilled version that is not pinned")
    r.drill(v[20])
    r.drill(v[30])
    r.pin(v[30])


@case("pin-misnamed-does-not-count", "R-PIN-2: a pin record of 10 stored under another name "
      "than its pin_id pins nothing: 10 goes")
def _(r: Root) -> None:
    v = four(r, {40}, why_delete="not among the keep greatest; the pin record does not count")
    r.pin(v[10], name="p20260102T000000000000Z-00000000")


@case("pin-of-newer-major-counts", "R-PIN-2: a pin record of format_version 2.0 with format "
      "portable-ckpt-pin, under its own pin_id, naming 10, counts (a tool keeps what it cannot "
      "validate): 10 stays")
def _(r: Root) -> None:
    v = four(r, {40})
    r.attempts[v[10]].update(outcome="keep", why="R-GC-11: pinned (a pin of a newer MAJOR)")
    r.pin(v[10], format_version="2.0", expires="2027-01-01", reason=None)


@case("pin-of-newer-major-without-format", "R-PIN-2 (errata 19): a record of format_version 2.0 "
      "without format pins nothing: 10 goes")
def _(r: Root) -> None:
    v = four(r, {40}, why_delete="not among the keep greatest; the record without format pins "
             "nothing")
    r.pin(v[10], format_version="2.0", format=None)


@case("pin-of-missing-attempt", "R-PIN-2: a pin naming an attempt that does not exist is "
      "harmless: retention as without it")
def _(r: Root) -> None:
    four(r, {40})
    r.pin(aid(50))


@case("pins-not-a-directory", "R-GC-11: the root child pins is a regular file: a pin of any "
      "version may be unreadable, so no attempt with a commit record is deleted; an abandoned "
      "attempt without one still goes", reports=True)
def _(r: Root) -> None:
    for s in (10, 20, 30):
        r.version(s, outcome="keep", why="R-GC-11: the pins cannot be read")
    r.data_only(40, outcome="delete", why="R-GC-4: abandoned a day ago (no commit record)")
    r.write("pins", "not a directory\n")
    r.untouched.append("pins")


@case("pin-entry-is-a-directory", "R-GC-11: pins/<pin_id>.json is a directory: a pin record "
      "that could not be read; no attempt with a commit record is deleted", reports=True)
def _(r: Root) -> None:
    for s in (10, 20, 30):
        r.version(s, outcome="keep", why="R-GC-11: a pin record cannot be read")
    r.write("pins/p20260102T000000000000Z-4d5e6f70.json/x", "a file inside\n")
    r.untouched.append("pins/p20260102T000000000000Z-4d5e6f70.json/x")


@case("pins-unreadable-keep-a-marked-attempt", "R-GC-11, R-GC-13 (errata 20): while the pins "
      "cannot be read (pins is a file), an attempt without commit record that holds a deletion "
      "mark (a version being deleted, which a pin keeps as it is) is kept too", reports=True)
def _(r: Root) -> None:
    r.version(10, outcome="keep", why="R-GC-11: the pins cannot be read")
    a = r.data_only(20, outcome="keep", why="R-GC-11: may be a pinned version being deleted")
    r.drill(a)
    r.mark(a)
    r.write("pins", "not a directory\n")
    r.untouched.append("pins")


# ------------------------------------------------------------- R-GC-4: grace, activity
@case("abandoned-attempt-deleted", "§15.1, R-GC-4: an attempt without commit record whose files "
      "are a day old is abandoned: it goes")
def _(r: Root) -> None:
    r.version(10, outcome="keep", why="R-GC-1: the greatest")
    r.data_only(20, outcome="delete", why="R-GC-4: no activity for a day")


@case("attempt-in-grace-kept", "R-GC-4: an attempt without commit record written to 60 s ago "
      "(a save in progress) stays for the grace period")
def _(r: Root) -> None:
    r.version(10, outcome="keep", why="R-GC-1: the greatest")
    a = r.data_only(20, outcome="keep", why="R-GC-4: written to 60 s ago, grace 3600 s")
    r.age(a, 60)


@case("newest-file-dates-the-attempt", "R-GC-4: one file of an attempt without commit record "
      "was written 60 s ago, another a day ago: the newest one dates it, and it stays")
def _(r: Root) -> None:
    r.version(10, outcome="keep", why="R-GC-1: the greatest")
    a = r.data_only(20, outcome="keep", why="R-GC-4: its newest file is 60 s old")
    r.write(f"{a}/data/w00001-0000.safetensors",
            G.st_file([("w@1", "I64", [1], G.encode("int64", [7]))]))
    r.age(f"{a}/data/w00001-0000.safetensors", 60)


@case("grace-zero", "R-GC-4: with a grace period of 0 an attempt written to 60 s ago goes",
      grace_seconds=0)
def _(r: Root) -> None:
    r.version(10, outcome="keep", why="R-GC-1: the greatest")
    a = r.data_only(20, outcome="delete", why="R-GC-4: grace 0 has passed")
    r.age(a, 60)


@case("attempt-id-ahead-of-the-clock", "R-GC-4: an attempt id dated 2099 (a host whose clock was "
      "ahead) is not the attempt's activity; its files, a day old, date it: it goes")
def _(r: Root) -> None:
    r.version(10, outcome="keep", why="R-GC-1: the greatest")
    r.data_only(20, day="20990101", outcome="delete",
                why="R-GC-4: its id is ahead of the clock; its files are a day old")


@case("grace-of-an-hour-passed", "R-GC-4: an attempt without commit record last written to 2 "
      "hours ago goes with the default grace (3600 s); one written to 30 minutes ago stays")
def _(r: Root) -> None:
    r.version(10, outcome="keep", why="R-GC-1: the greatest")
    a = r.data_only(20, outcome="delete", why="R-GC-4: 7200 s since its last write")
    r.age(a, 2 * HOUR)
    b = r.data_only(30, outcome="keep", why="R-GC-4: 1800 s since its last write")
    r.age(b, HOUR // 2)


@case("empty-attempt-directory", "§15.1, R-GC-4: an empty attempt directory (no file: what a "
      "save left before its first write, or a stopped gc) dated by its id (2026-01-01): it "
      "goes (an object store never shows one)")
def _(r: Root) -> None:
    r.version(10, outcome="keep", why="R-GC-1: the greatest")
    r.attempt(aid(20), cls="incomplete", outcome="delete",
              why="R-GC-4: no file, dated by its id (2026-01-01); nothing is left to delete")
    r.setup.append({"op": "mkdir", "path": f"root/{aid(20)}"})


# ------------------------------------------------------ §15.1 records, R-GC-10: invalid
@case("records-only-attempt", "§15.1 (errata 19): an attempt holding a drill record and nothing "
      "else is incomplete (a record written while the version was deleted): it goes")
def _(r: Root) -> None:
    r.version(10, outcome="keep", why="R-GC-1: the greatest")
    a = r.attempt(aid(20), cls="incomplete", outcome="delete",
                  why="R-GC-4: records only, a day old")
    r.drill(a)


@case("lost-commit-record-kept", "§15.1, R-GC-10: an attempt holding a drill record and a data "
      "file, no commit record, is invalid (a version whose record was lost): kept and reported",
      reports=True, reported=(20,))
def _(r: Root) -> None:
    r.version(10, outcome="keep", why="R-GC-1: the greatest")
    a = r.data_only(20, cls="invalid", outcome="keep", why="R-GC-10: invalid, not asked")
    r.drill(a)


@case("lost-commit-record-delete-invalid", "R-GC-10: the same with delete_invalid: it goes",
      delete_invalid=True)
def _(r: Root) -> None:
    r.version(10, outcome="keep", why="R-GC-1: the greatest")
    a = r.data_only(20, cls="invalid", outcome="delete",
                    why="R-GC-10: invalid, delete_invalid asked; R-GC-4: a day old")
    r.drill(a)


@case("invalid-record-takes-no-place", "R-GC-10: the greatest attempt's manifest.json is not "
      "JSON: it is invalid, kept and reported, and takes no place among the keep greatest, so "
      "20 stays", reports=True, reported=(30,))
def _(r: Root) -> None:
    r.version(10, outcome="delete", why="not among the keep greatest")
    r.version(20, outcome="keep", why="R-GC-1: the greatest valid version")
    a = r.version(30, outcome="keep", cls="invalid", why="R-GC-10: invalid, not asked")
    r.write(f"{a}/manifest.json", "{\"format\": \"portable-ckpt\", \n")


@case("invalid-record-delete-invalid", "R-GC-10: the same with delete_invalid: the invalid "
      "attempt goes", delete_invalid=True)
def _(r: Root) -> None:
    r.version(10, outcome="delete", why="not among the keep greatest")
    r.version(20, outcome="keep", why="R-GC-1: the greatest valid version")
    a = r.version(30, outcome="delete", cls="invalid",
                  why="R-GC-10: invalid, delete_invalid asked; R-GC-4: a day old")
    r.write(f"{a}/manifest.json", "{\"format\": \"portable-ckpt\", \n")


@case("invalid-in-grace", "R-GC-4, R-GC-10: an invalid attempt written to 60 s ago stays for "
      "the grace period even with delete_invalid (asked to delete invalid attempts, the gc has "
      "nothing to report)", delete_invalid=True)
def _(r: Root) -> None:
    r.version(10, outcome="keep", why="R-GC-1: the greatest valid version")
    a = r.version(20, outcome="keep", cls="invalid", why="R-GC-4: written to 60 s ago")
    r.write(f"{a}/manifest.json", "not json\n")
    r.age(a, 60)


# ------------------------------------------------------------- R-GC-13: deletion marks
@case("marked-attempt-is-incomplete", "§15.1, R-GC-13: an attempt without commit record holding "
      "a deletion mark, a drill record and a data file is incomplete (a version a gc began to "
      "delete): it goes")
def _(r: Root) -> None:
    r.version(10, outcome="keep", why="R-GC-1: the greatest")
    a = r.data_only(20, outcome="delete", why="R-GC-13: marked; R-GC-4: a day old")
    r.drill(a)
    r.mark(a)


@case("misnamed-mark-is-no-mark", "R-GC-13: a deletion mark stored under another name than its "
      "deletion_id is no mark: the attempt (drill record and data, no commit record) is "
      "invalid, kept", reports=True, reported=(20,))
def _(r: Root) -> None:
    r.version(10, outcome="keep", why="R-GC-1: the greatest")
    a = r.data_only(20, cls="invalid", outcome="keep", why="R-GC-10: invalid (no mark counts)")
    r.drill(a)
    r.mark(a, name="g20260102T000000000000Z-00000000")


@case("mark-of-another-attempt-is-no-mark", "R-GC-13: a mark naming another attempt is no mark: "
      "invalid, kept", reports=True, reported=(20,))
def _(r: Root) -> None:
    r.version(10, outcome="keep", why="R-GC-1: the greatest")
    a = r.data_only(20, cls="invalid", outcome="keep", why="R-GC-10: invalid (no mark counts)")
    r.drill(a)
    r.mark(a, names=aid(10))


@case("mark-of-newer-major-counts", "R-GC-13 (errata 19): a mark of format_version 2.0 with its "
      "format, under its own id, naming the attempt, counts: incomplete, it goes")
def _(r: Root) -> None:
    r.version(10, outcome="keep", why="R-GC-1: the greatest")
    a = r.data_only(20, outcome="delete", why="R-GC-13: marked (newer MAJOR); a day old")
    r.drill(a)
    r.mark(a, format_version="2.0", reason=None, phase="records")


@case("mark-of-newer-major-without-format", "R-GC-13 (errata 19): the same mark without format "
      "is no mark: invalid, kept", reports=True, reported=(20,))
def _(r: Root) -> None:
    r.version(10, outcome="keep", why="R-GC-1: the greatest")
    a = r.data_only(20, cls="invalid", outcome="keep", why="R-GC-10: invalid (no mark counts)")
    r.drill(a)
    r.mark(a, format_version="2.0", format=None)


@case("mark-beside-commit-record", "R-GC-13: a deletion mark beside a valid commit record "
      "changes nothing: the version is committed and the greatest, it stays")
def _(r: Root) -> None:
    r.version(10, outcome="delete", why="not among the keep greatest")
    a = r.version(20, outcome="keep", why="R-GC-1: the greatest (the mark changes nothing)")
    r.mark(a)


@case("mark-on-pinned-attempt", "R-GC-11, R-GC-13: a pinned attempt without commit record that "
      "holds a mark (a version being deleted when it was pinned) is kept as it is")
def _(r: Root) -> None:
    r.version(10, outcome="keep", why="R-GC-1: the greatest")
    a = r.data_only(5, outcome="keep", why="R-GC-11: pinned")
    r.drill(a)
    r.mark(a)
    r.pin(a)


@case("invalid-record-beside-a-mark", "§15.1, R-GC-10, R-GC-13: a manifest.json that is not "
      "JSON beside a valid deletion mark: the attempt has a record, so the mark does not make "
      "it incomplete; it is invalid, kept and reported", reports=True, reported=(20,))
def _(r: Root) -> None:
    r.version(10, outcome="keep", why="R-GC-1: the greatest valid version")
    a = r.version(20, outcome="keep", cls="invalid", why="R-GC-10: invalid, not asked")
    r.write(f"{a}/manifest.json", "{\"format\": \"portable-ckpt\", \n")
    r.mark(a)


# ------------------------------------------------------ R-GC-7, R-GC-12: what gc cannot read
@case("manifest-is-a-directory", "§15.1 (errata 20), R-LAYOUT-7: the greatest attempt's "
      "manifest.json is a directory: stray, no version, never deleted by gc and counted among "
      "no keep; 20 stays as the greatest version", reports=None)
def _(r: Root) -> None:
    r.version(10, outcome="delete", why="not among the keep greatest")
    r.version(20, outcome="keep", why="R-GC-1: the greatest version")
    a = r.version(30, manifest=False, outcome="keep", cls="stray",
                  why="R-LAYOUT-7: manifest.json is not a regular file")
    r.setup.append({"op": "mkdir", "path": f"root/{a}/manifest.json"})


@case("manifest-is-a-symbolic-link", "§15.1 (errata 20), R-LAYOUT-7: the greatest attempt's "
      "manifest.json is a symbolic link to a valid commit record beside it (a foreign entry): "
      "stray, never deleted by gc and counted among no keep; 20 stays", reports=None)
def _(r: Root) -> None:
    r.version(10, outcome="delete", why="not among the keep greatest")
    r.version(20, outcome="keep", why="R-GC-1: the greatest version")
    a = r.version(30, outcome="keep", cls="stray",
                  why="R-LAYOUT-7: manifest.json is a symbolic link (foreign)")
    (r.path / a / "manifest.json").rename(r.path / a / "record.json")
    r.setup.append({"op": "symlink", "path": f"root/{a}/manifest.json",
                   "target": "record.json"})



@case("foreign-version-takes-no-place", "R-GC-7: the greatest version claims format 2.0: "
      "foreign, never deleted nor counted among the keep greatest, so 30 stays")
def _(r: Root) -> None:
    v = four(r, {30})
    r.attempts[v[40]].update({"outcome": "keep", "class": "foreign", "why": "R-GC-7: foreign"})
    m = json.loads((r.path / v[40] / "manifest.json").read_text())
    m["format_version"] = "2.0"
    r.write(f"{v[40]}/manifest.json", m)


@case("verification-status-unknown", "R-GC-12, R-DRILL-12: the greatest version holds a "
      "verification record of format 2.0: its status is unknown, so it stays, takes no place "
      "among the keep greatest, and is reported; 30 stays", reports=True, reported=(40,))
def _(r: Root) -> None:
    v = four(r, {30})
    r.attempts[v[40]].update(outcome="keep", why="R-GC-12: verification status unknown")
    r.verification(v[40], ok=True, major=2)


# ------------------------------------------------------------------- R-GC-5: outside attempts
@case("other-root-children-untouched", "R-GC-5: files and directories at the root that are not "
      "attempts (a note, a directory named almost like an attempt, a stray manifest.json) are "
      "never deleted, however old")
def _(r: Root) -> None:
    four(r, {40})
    for rel in ("NOTES.txt", "s10-not-an-attempt/data/w00000-0000.safetensors",
                "backup/manifest.json",
                "S000000000010-20260101T000000000000Z-0123456789abcdef/x"):
        r.write(rel, "not the format's\n")
        r.untouched.append(rel)


# ------------------------------------------------ abandoned branches (optional, errata 19)
def _branch(r: Root, *, retire: bool, pin_30: bool = False) -> None:
    """10, 20, 30 committed an hour apart, then 20 again an hour later (a rollback to 10)."""
    when = {10: 1, 20: 1 + HOUR, 30: 1 + 2 * HOUR}
    v = {s: r.version(s, committed=t, outcome="delete", why="") for s, t in when.items()}
    b = r.version(20, 1, committed=1 + 3 * HOUR, outcome="keep", why="")
    for s, t in when.items():  # the storage's times agree with committed_at (§15.2)
        r.age(f"{v[s]}/manifest.json", 4 * HOUR - t + 1)
    r.age(f"{b}/manifest.json", HOUR)
    r.attempts[v[10]]["why"] = "not among the keep greatest"
    r.attempts[v[20]]["why"] = "abandoned by the later commit of step 20; not the greatest"
    if retire:
        r.attempts[v[30]].update(why="abandoned (20 was committed again later): retired")
        r.attempts[b]["why"] = "R-GC-1: the greatest once 30 is retired"
    else:
        r.attempts[v[30]].update(outcome="keep", why="R-GC-1: the greatest")
        r.attempts[b].update(outcome="either",
                             why="committed last, but not the greatest in the order of §3 "
                             "(step 20 < 30): the reference keeps it (a rollback's branch), "
                             "no rule asks for it")
    if pin_30:
        r.attempts[v[30]].update(outcome="keep", why="R-GC-11: pinned (not retired)")
        r.pin(v[30])


@case("rollback-without-retiring", "§15.2: a job went back to step 10 and committed 20 again: "
      "without retire_abandoned the first run's 30 stays the greatest")
def _(r: Root) -> None:
    _branch(r, retire=False)


@case("rollback-retired", "§15.2 abandoned branches (optional): with retire_abandoned, 30 and "
      "the first 20 are abandoned by the later commit of 20 and go; that 20 stays as the "
      "greatest", retire_abandoned=True, requires="retire_abandoned")
def _(r: Root) -> None:
    _branch(r, retire=True)


@case("rollback-retired-pinned", "§15.2, R-GC-11: with retire_abandoned, a pinned abandoned "
      "version (30) stays and is reported (the rollback's branch is not the latest); the later "
      "20 stays as the greatest unpinned version", retire_abandoned=True,
      requires="retire_abandoned", reports=True, reported=(30,))
def _(r: Root) -> None:
    _branch(r, retire=True, pin_30=True)


DESCRIPTION = ("Retention vectors of errata 20 (spec §20.1): a root, a gc policy, and for every "
               "attempt its class (§15.1) and what a gc run with the policy does with it: "
               "'keep' (a MUST of §15), 'should-keep' (a SHOULD), 'delete' (the rules let it "
               "go and a gc following §15 deletes it), 'either'. 'untouched' lists root files "
               "outside attempts no gc may change (R-GC-5); 'reports': true, the gc MUST report "
               "(a command-line gc exits non-zero), and names each attempt marked 'reported'; "
               "false, it has nothing to report (exit 0); null, either (a stray attempt). "
               "Apply 'setup' to a copy first: it dates the files.")


def _write_case(out: Path, c: dict[str, Any]) -> dict[str, Any]:
    cdir = out / c["name"]
    r = Root(cdir / "root")
    r.path.mkdir(parents=True)
    c["fn"](r)
    rec: dict[str, Any] = {"name": c["name"], "feature": c["feature"], "target": "root",
                           "policy": c["policy"], "reports": c["reports"]}
    if c["requires"]:
        rec["requires"] = c["requires"]
    rec["setup"] = [{"op": "age", "path": "root", "seconds": DAY}, *r.setup]
    for aid in c.get("reported", ()):
        r.attempts[r.find(aid)]["reported"] = True
    rec["attempts"] = dict(sorted(r.attempts.items()))
    rec["untouched"] = sorted(r.untouched)
    return rec


def main(argv: list[str] | None = None) -> int:
    """Write every case below ``--out`` (default: ``errata-20`` next to this script)."""
    return int(E1.write_set(argv, CASES, "errata-20", DESCRIPTION, __doc__,
                            format_version="1.2", write_case=_write_case, kind="retention"))


if __name__ == "__main__":
    sys.exit(main())
