"""Static conformance check of a checkpoint root or version directory (``python -m conformance check``).

The checks are written from the spec, independently of :mod:`portable_ckpt`:

* every JSON document is decoded strictly (duplicate keys, NaN, depth) and validated against its
  JSON Schema from ``spec/schemas`` (an integer member must be an integer token: 42.0 is not);
  a defect the schema pass reports with a specific code is not reported again by the code;
* commit-record rules: ``format``/``format_version`` (major 1), ``must_understand``, ``attempt_id``
  equal to the directory name and consistent with ``step``;
* every path is safe and stays inside the attempt (no symlinks out); every file in ``files`` exists
  with its recorded size; checksums of the blocks read (all blocks with ``deep``);
* every tensor: dtype known, shape within limits, every range in bounds, exactly-once coverage
  (sweep over boxes plus a volume count), range records agree with the safetensors headers;
  every zstd range's frame header (its first 18 bytes: magic, no dictionary, declared size,
  window, stored length against ``ZSTD_COMPRESSBOUND``; R-TENSOR-10, R-VERIFY-2), and with
  ``deep`` its decoding to the right size;
* format 1.1 tensor tables (§8.5): the ``tensor_table`` reference (R-TABLE-1, R-TABLE-2), the
  table file read whole with every block verified and decoded (R-TABLE-3 … R-TABLE-6, see
  :mod:`conformance.table`), then every tensor it defines through the same per-tensor rules,
  with the implied range names of R-TABLE-7; a writer index's table is decoded and validated too;
* every entry: declaration, the values per scope, each value strictly decoded and valid against
  its declared schema (builtin ids resolve to ``spec/schemas/entries`` and take integer tokens;
  an embedded schema's ``$schema`` must name Draft 2020-12, whose integers it keeps).

The commit record and its files are checked here; tensors, ranges and tensor tables in
:mod:`conformance._check_tensors`, entries in :mod:`conformance._check_entries`, writer indexes
and the records added after the commit in :mod:`conformance._check_records` (one class each,
on the state of :mod:`conformance._check_base`). Reading a JSON document and its schema pass
are :mod:`conformance.documents`; exactly-once coverage by box arithmetic is
:mod:`conformance.coverage`; :class:`Report` and :class:`Finding` are
:mod:`conformance.findings`.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conformance._check_base import is_int
from conformance._check_entries import EntryChecks
from conformance._check_records import DOC_MAX_BYTES, RecordChecks, record_kind
from conformance.documents import Located, load_json, schema_check
from conformance.findings import Finding, Report
from conformance.schemas import (
    SchemaSet,
    load_schemas,
)
from conformance.spec import (
    ATTEMPT_ID_RE,
    FORMAT_VERSIONS,
    KNOWN_EXTENSIONS,
    newer_minor,
    path_problem,
)
from conformance.store import (
    FileRecord,
    Problem,
    mode_kind,
    parse_file_record,
    read_regular,
)
from conformance.strictjson import StrictJsonError, loads_strict

__all__ = ["Finding", "Report", "check", "check_version", "find_versions"]

MANIFEST_MAX_BYTES = 1 << 30
#: A well-formed format_version: MAJOR.MINOR, decimal without leading zeros, any digits (§16.1).
_VERSION_RE = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\Z")


class _VersionChecker(RecordChecks, EntryChecks):
    """Every check of one version: the commit record and its files here, the rest inherited."""

    # -- commit record -------------------------------------------------------------------------
    def run(self) -> None:
        self.errors_before = len(self.r.errors)
        mpath = self.vdir / "manifest.json"
        if mpath.is_symlink():
            self.err("PCK-PATH-UNSAFE", "manifest.json is a symlink")
            return
        if not mpath.is_file():
            self.err("PCK-MANIFEST-MISSING", "no manifest.json: the attempt is not committed")
            return
        m = load_json(self.vf, "manifest.json", self.r, max_bytes=MANIFEST_MAX_BYTES,
                       verified=False)
        if m is None:
            return
        if not isinstance(m, dict):
            self.err("PCK-SCHEMA", "manifest.json is not a JSON object")
            return
        if m.get("format") != "portable-ckpt":
            self.err("PCK-SCHEMA", f"manifest format is {m.get('format')!r}, not 'portable-ckpt'")
            return
        fv = m.get("format_version")
        mv = _VERSION_RE.match(fv) if isinstance(fv, str) else None
        if mv is None:
            self.err("PCK-SCHEMA", f"format_version {fv!r:.60} is not 'MAJOR.MINOR'")
            return
        if mv.group(1) != "1":  # as text: CPython converts at most 4,300 digits to an int
            self.err("PCK-VERSION-UNSUPPORTED", f"format_version {fv:.60} has major version "
                     f"{mv.group(1):.40}; this checker implements 1.x")
            return
        mu = m.get("must_understand")
        if isinstance(mu, list):
            unknown = [x for x in mu if x not in KNOWN_EXTENSIONS]
            if unknown:
                self.err("PCK-FEATURE-UNSUPPORTED", f"must_understand names extensions this "
                         f"checker does not implement: {unknown!r}")
                return
        minor = mv.group(2)
        newer = newer_minor(minor)  # newer than NEWEST_FORMAT_VERSION: maybe a foreign record
        before = len(self.r.errors)
        valid = schema_check(self.schemas, "manifest", m, f"{self.name}/manifest.json", self.r,
                              self.schema_at)
        if newer and len(self.r.errors) > before:
            # A specific code (a dtype, a codec) is still a failed check of 1.1: the record is
            # foreign, PCK-VERSION-UNSUPPORTED (R-VERSION-10; conformance review C3).
            valid = False
        if valid and newer and not self.record_only:
            # The rules of this text on the record alone (§16.3, errata 8), in a pass of their
            # own: a newer record failing one is foreign, whatever its other files hold.
            alone = _VersionChecker(self.vdir, Report(), self.schemas, False, record_only=True)
            alone.schema_at = self.schema_at
            alone.check_manifest(m)
            self.r.errors.extend(alone.r.errors)
            valid = not alone.r.errors
        if not valid:
            if newer:  # a foreign record (R-VERSION-10): its one code is this one
                first = self.r.errors[before]
                del self.r.errors[before:]
                self.err("PCK-VERSION-UNSUPPORTED", f"format_version {fv:.60} is newer than the "
                         f"versions this checker implements ({', '.join(FORMAT_VERSIONS)}), and "
                         f"the record fails their checks ({first.message}); a checker of that "
                         "version can judge it (spec §16.2, R-VERSION-10)")
            return
        self.check_manifest(m)

    def check_manifest(self, m: dict[str, Any]) -> None:
        self.doc_version, self.doc_must_understand = m.get("format_version"), m.get(
            "must_understand")
        aid, step = m.get("attempt_id"), m.get("step")
        am = ATTEMPT_ID_RE.match(aid) if isinstance(aid, str) else None
        if am is None:
            if not self.reported(("attempt_id",)):
                self.err("PCK-ATTEMPT-ID", f"attempt_id {aid!r} is malformed")
        elif aid != self.name:
            self.err("PCK-ATTEMPT-ID", f"attempt_id {aid!r} differs from its directory name")
        elif not is_int(step):  # 42.0: not an integer token, before the attempt id (A4)
            self.err("PCK-SCHEMA", f"step {step!r} is not an integer")
        elif int(am.group(1)) != step:
            self.err("PCK-ATTEMPT-ID", f"attempt_id {aid!r} does not encode step {step!r}")
        cont = m.get("continuation")
        ws: Any = cont.get("world_size") if isinstance(cont, dict) else None
        if not is_int(ws) or ws < 1:
            self.err("PCK-SCHEMA", f"continuation.world_size {ws!r} must be an integer >= 1")
            ws = None
        mesh = cont.get("mesh") if isinstance(cont, dict) else None
        if isinstance(mesh, dict) and ws is not None:
            ms, names = mesh.get("shape"), mesh.get("dim_names")
            if (not isinstance(ms, list) or not isinstance(names, list) or len(ms) != len(names)
                    or not all(is_int(x) for x in ms) or math.prod(ms) != ws):
                self.err("PCK-SCHEMA", f"continuation.mesh {mesh} does not match world_size {ws}"
                         " (R-CONTRACT-2)")
        files = m.get("files")
        if not isinstance(files, dict):
            self.err("PCK-SCHEMA", "files must be an object")
            return
        self.check_files(files)
        tensors = m.get("tensors")
        if not isinstance(tensors, dict):
            self.err("PCK-SCHEMA", "tensors must be an object")
        else:
            for key, t in tensors.items():
                try:
                    self.check_tensor(key, t)
                except Problem as exc:
                    self.problem(exc, f"tensor {key!r}: ")
        self.check_version_use(m)
        used: set[str] = {t["dtype"] for t in tensors.values() if isinstance(t, dict) and
                          isinstance(t.get("dtype"), str)} if isinstance(tensors, dict) else set()
        if "tensor_table" in m and self.check_table_member(m) and not self.record_only:
            table = self.table = self.read_table(m, "manifest.json")
            if table is not None:
                used.update(table.dtypes)
                for t, key in enumerate(table.keys):
                    try:
                        self.check_tensor(key, table.tensor(t))
                    except Problem as exc:
                        self.err(exc.code, f"tensor {key!r} (tensor table): {exc.message}")
        if not self.record_only:
            self.check_dtype_version_use(m, used)
        entries = m.get("entries", {})
        if not isinstance(entries, dict):
            self.err("PCK-SCHEMA", "entries must be an object")
        else:
            for name, e in entries.items():
                try:
                    self.check_entry(name, e, ws, step)
                except Problem as exc:
                    self.problem(exc, f"entry {name!r}: ")
        if not self.record_only:
            self.check_side_documents(aid, m)

    def check_files(self, files: dict[str, Any]) -> None:
        for rel, rec in files.items():
            why = path_problem(rel)
            if why is not None:
                if not self.reported(("files", rel)):
                    self.err("PCK-PATH-UNSAFE", f"files: {why}")
                self.bad_files.add(rel)
                continue
            if _FORBIDDEN_FILES.match(rel):  # not manifest.jsonl: only manifest.json[.<any>]
                self.err("PCK-SCHEMA", f"files must not list {rel!r} (R-FILES-1)")
            try:
                try:
                    fr: FileRecord = parse_file_record(rel, rec)
                except Problem as exc:
                    raise Located(exc.code, exc.message, ("files", rel)) from None
                if self.record_only:
                    self.vf.records[rel] = fr
                    continue
                size = self.vf.stat_size(rel)
                if size != fr.size:
                    raise Problem("PCK-FILE-SIZE", f"{rel!r} has {size} bytes, recorded "
                                  f"{fr.size} (truncated or extended)")
                self.vf.records[rel] = fr
                if self.deep:
                    self.vf.verify_all(rel)
            except Problem as exc:
                self.problem(exc, "")
                self.bad_files.add(rel)
            except OSError as exc:
                self.err("PCK-STORAGE", f"{rel!r}: {exc}")
                self.bad_files.add(rel)
        if self.record_only:
            return
        # What the attempt holds, links never followed: a symbolic link anywhere in it breaks
        # R-SEC-2; files present but not listed are allowed for readers (they ignore them,
        # R-LAYOUT-4) and flagged.
        listed = set(files)
        for rel, mode in _walk(self.vdir):
            if stat.S_ISLNK(mode):
                if rel not in self.bad_files and not any(b.startswith(rel + "/")
                                                         for b in self.bad_files):
                    # (a listed path through a link leaving the attempt is reported already)
                    self.err("PCK-PATH-UNSAFE", f"{rel!r} is a symbolic link: writers never "
                             "create symbolic links in an attempt (R-SEC-2)")
                    self.content_errors += 1
                continue
            if rel == "manifest.json" or rel in listed:
                continue
            if rel in _RECORD_DIRS and not stat.S_ISDIR(mode):
                # Every record of its kind would be stored below it: none can be, and a damage
                # a verification finds is never recorded (attack review 12, A6).
                what = "a regular file" if stat.S_ISREG(mode) else mode_kind(mode)
                self.err("PCK-SCHEMA", f"{rel!r} is {what}, not a directory: no record of "
                         "that kind can be stored in the version (§14.3–§14.5)")
                self.content_errors += 1
                continue
            record = record_kind(rel)
            if record is not None and record != "index":
                continue  # records added after the commit (R-FILES-1), read below
            if not stat.S_ISREG(mode):
                if record is None:  # a record's name is read as one and reported there
                    self.r.warn(f"{self.name}: {rel!r} is {mode_kind(mode)}, not a regular "
                                "file: a foreign entry, never read (R-LAYOUT-7)")
                continue
            if record == "index":
                # A stored writer index is a file of the version (R-FILES-1, R-INDEX-1).
                self.err("PCK-SCHEMA", f"writer index {rel!r} is not listed in files "
                         "(R-FILES-1)")
                self.content_errors += 1
                continue
            if _SIDE_DIRS.match(rel):
                continue  # not named like a record: drills/, copies/ and verifications/ are
                # not part of the version (§14.3)
            self.r.warn(f"{self.name}: {rel!r} is not listed in files")


#: ``files`` keys the schema forbids (§19.2): ``manifest.json``, ``manifest.json.<anything>``,
#: anything below ``drills/`` or ``copies/``; ``manifest.jsonl`` is a file like any other.
_FORBIDDEN_FILES = re.compile(r"manifest\.json(?:\..*)?\Z|drills/|copies/", re.DOTALL)
#: the directories of the records added after the commit (not part of the version, §14.3).
_SIDE_DIRS = re.compile(r"(?:drills|copies|verifications|deleting)/")

#: The directories of the records added after a commit (§14.3–§14.5).
_RECORD_DIRS = frozenset({"drills", "copies", "verifications", "verifications/cleared"})


def _walk(top: Path) -> Iterator[tuple[str, int]]:
    """``(relative path, lstat mode)`` of everything below ``top`` but directories, sorted.

    Symbolic links are yielded, never followed (a link to a directory included); directories
    are descended into. Entries that vanish or cannot be listed meanwhile are skipped.
    """
    todo = [top]
    while todo:
        d = todo.pop()
        try:
            with os.scandir(d) as it:
                entries = sorted(it, key=lambda e: e.name, reverse=True)
        except OSError:
            continue
        for e in entries:
            try:
                mode = e.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            if stat.S_ISDIR(mode):
                todo.append(Path(e.path))
            else:
                yield Path(e.path).relative_to(top).as_posix(), mode

def find_versions(root: Path) -> tuple[list[Path], list[Path]]:
    """Return (committed candidate dirs, uncommitted attempt dirs) below a root.

    Only children whose names match the attempt-id pattern are attempts: readers ignore the
    others (R-LAYOUT-4), whatever they hold; symbolic links are foreign (R-LAYOUT-7).
    """
    committed, pending = [], []
    if root.is_dir():
        for p in sorted(root.iterdir()):
            if not p.is_dir() or p.is_symlink() or not ATTEMPT_ID_RE.match(p.name):
                continue
            if (p / "manifest.json").exists() or (p / "manifest.json").is_symlink():
                committed.append(p)
            else:
                pending.append(p)
    return committed, pending


def _check_pins(root: Path, schemas: SchemaSet, report: Report) -> None:
    """Every ``pins/*.json`` of a root is a pin record under its own ``pin_id`` (§15.3, R-PIN-1).

    A pin names a version of the root only by its id: one that names no attempt is harmless
    (R-PIN-2), so it is not reported.
    """
    d = root / "pins"
    if d.is_symlink() or (d.exists() and not d.is_dir()):
        # §15.3: pins that cannot be read (gc then deletes no version, R-GC-11)
        report.error("PCK-PATH-UNSAFE", "pins: not a directory of the root's own (a symbolic "
                     "link, a file or a FIFO): its pins cannot be read (§15.3, R-GC-11)")
        return
    if not d.is_dir():
        return
    for p in sorted(d.glob("*.json")):
        where = f"pins/{p.name}"
        if p.is_symlink() or not p.is_file():  # the library's code for it (§15.3)
            report.error("PCK-PATH-UNSAFE", f"{where}: not a regular file (a symbolic link, a "
                         "FIFO or a directory): a pin that cannot be read (§15.3, R-GC-11)")
            continue
        try:
            doc = loads_strict(read_regular(p, repr(where), max_bytes=DOC_MAX_BYTES,
                                            follow=False), max_bytes=DOC_MAX_BYTES)
        except Problem as exc:
            report.error(exc.code, f"{where}: {exc.message}")
            continue
        except StrictJsonError as exc:
            report.error("PCK-JSON-INVALID", f"{where}: {exc}")
            continue
        except OSError as exc:
            report.error("PCK-STORAGE", f"{where}: {exc}")
            continue
        if not isinstance(doc, dict) or doc.get("format") != "portable-ckpt-pin":
            report.error("PCK-SCHEMA", f"{where}: format must be 'portable-ckpt-pin' (R-PIN-1)")
            continue
        if not schema_check(schemas, "pin", doc, where, report):
            continue
        if p.name != f"{doc.get('pin_id')}.json":
            report.error("PCK-SCHEMA", f"{where}: pin_id {doc.get('pin_id')!r} is not its file "
                         "name (R-PIN-1)")


def _ignored_children(root: Path) -> list[str]:
    """Directories of a root that are no attempts (names off the pattern, R-LAYOUT-4).

    ``pins/`` is the format's (§15.3): checked by :func:`_check_pins`, not ignored.
    """
    try:
        return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.is_symlink()
                      and not ATTEMPT_ID_RE.match(p.name) and p.name != "pins")
    except OSError:
        return []


def check_version(vdir: Path, *, deep: bool = False, schemas: SchemaSet | None = None,
                  report: Report | None = None) -> Report:
    """Check one version (attempt) directory."""
    report = report or Report()
    schemas = schemas or load_schemas()
    schemas.require_complete()  # never a pass with validation skipped
    report.versions.append(vdir.name)
    first_error, first_warning = len(report.errors), len(report.warnings)
    _VersionChecker(vdir, report, schemas, deep).run()
    for f in report.errors[first_error:] + report.warnings[first_warning:]:
        f.version = vdir.name  # reports group findings by version
    return report


def check(path: str | Path, *, deep: bool = False, schema_dir: str | None = None) -> Report:
    """Check a checkpoint root (every committed version) or one version directory.

    Args:
        path: A root directory or an attempt directory.
        deep: Verify every checksum block and decompress every zstd range.
        schema_dir: Directory of the spec's JSON Schemas (default ``spec/schemas``).

    Returns:
        A :class:`Report`; ``report.ok`` is True when the path conforms.

    Raises:
        SchemasUnavailable: the normative schemas are missing or incomplete.

    """
    p = Path(path)
    schemas = load_schemas(schema_dir)
    schemas.require_complete()
    report = Report()
    if not p.exists():
        report.error("PCK-NOT-FOUND", f"{p} does not exist")
        return report
    if not p.is_dir():
        report.error("PCK-USAGE", f"{p} is not a directory")
        return report
    # A version: it holds a manifest, or is named like an attempt. A root's own data/ or index/
    # child is no sign of a version: readers ignore what is not an attempt (R-LAYOUT-4).
    is_version = (p / "manifest.json").exists() or (p / "manifest.json").is_symlink() or \
        ATTEMPT_ID_RE.match(p.name) is not None
    if is_version:
        return check_version(p, deep=deep, schemas=schemas, report=report)
    committed, pending = find_versions(p)
    for v in committed:
        check_version(v, deep=deep, schemas=schemas, report=report)
    if pending:
        report.warn(f"{len(pending)} uncommitted attempt(s) (invisible to readers): "
                    f"{[q.name for q in pending][:5]}")
    _check_pins(p, schemas, report)
    ignored = _ignored_children(p)
    if ignored:
        report.warn(f"{len(ignored)} child director(y/ies) of the root ignored, their names "
                    f"are not attempt ids (R-LAYOUT-4): {ignored[:5]}")
    if not committed:
        report.error("PCK-NOT-FOUND", f"no committed version under {p}")
    return report
