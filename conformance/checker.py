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

Reading a JSON document and its schema pass are :mod:`conformance.documents`; exactly-once
coverage by box arithmetic is :mod:`conformance.coverage`.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.coverage import check_coverage
from conformance.documents import JsonPath, Located, load_json, same_json, schema_check
from conformance.reader import timestamp_key as _ts_key
from conformance.regex import BadPattern, compiled, patterns_of
from conformance.schemas import (
    SCHEMA_BASE_UNITS,
    SCHEMA_UNITS_PER_VALUE,
    BudgetExceeded,
    OtherDialect,
    SchemaSet,
    load_schemas,
    without_dialect,
)
from conformance.spec import (
    ATTEMPT_ID_RE,
    BUILTIN_SCHEMA_FILES,
    BUILTIN_SCHEMA_IDS,
    DELETION_NAME_RE,
    DTYPE_SINCE,
    DTYPES,
    FORMAT_VERSIONS,
    KNOWN_EXTENSIONS,
    MAX_NDIM,
    MAX_SIZE,
    NEWEST_FORMAT_VERSION,
    NEWEST_MINOR,
    TABLE_EXTENSION,
    dtype_not_allowed,
    has_control_chars,
    newer_minor,
    path_problem,
)
from conformance.store import (
    ZSTD_HEADER_MAX,
    FileRecord,
    Problem,
    StHeader,
    VersionFiles,
    mode_kind,
    parse_file_record,
    parse_safetensors_header,
    read_regular,
    zstd_check_header,
    zstd_decode,
)
from conformance.strictjson import MAX_VALUES, StrictJsonError, loads_strict
from conformance.table import TensorTable, load_table

__all__ = ["Finding", "Report", "check", "check_version", "find_versions"]

MANIFEST_MAX_BYTES = 1 << 30
ENTRY_MAX_BYTES = 64 << 20
#: R-SEC-11: any JSON document other than a manifest (writer indexes, drill, copy and
#: verification records) is rejected above 64 MiB, before it is read in full.
DOC_MAX_BYTES = 64 << 20
#: A well-formed format_version: MAJOR.MINOR, decimal without leading zeros, any digits (§16.1).
_VERSION_RE = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\Z")


@dataclass
class Finding:
    """One violation: spec error code, message, and the version it was found in."""

    code: str
    message: str
    version: str = ""  # the version directory it was found in ("" for the root)

    def to_json(self) -> dict[str, str]:
        """``{"code", "message", "version"}`` as printed by ``--json``."""
        return {"code": self.code, "message": self.message, "version": self.version}


@dataclass
class Report:
    """Result of a check: errors (violations) and warnings (allowed but suspicious)."""

    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no error was found."""
        return not self.errors

    @property
    def codes(self) -> set[str]:
        """The set of error codes found."""
        return {e.code for e in self.errors}

    def error(self, code: str, message: str) -> None:
        """Record a violation."""
        self.errors.append(Finding(code, message))

    def warn(self, message: str) -> None:
        """Record a warning (not a violation)."""
        self.warnings.append(Finding("WARNING", message))

    def to_json(self) -> dict[str, Any]:
        """``{"ok", "errors", "warnings", "versions"}``."""
        return {"ok": self.ok, "errors": [e.to_json() for e in self.errors],
                "warnings": [w.message for w in self.warnings], "versions": self.versions}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class _VersionChecker:
    def __init__(self, vdir: Path, report: Report, schemas: SchemaSet, deep: bool,
                 record_only: bool = False) -> None:
        self.vdir = vdir
        # only the checks of the commit record alone (§4.1, errata 8): no other file is read
        self.record_only = record_only
        self.name = vdir.name
        self.r = report
        self.schemas = schemas
        self.deep = deep
        self.vf = VersionFiles(vdir)
        self.headers: dict[str, StHeader | None] = {}
        self.bad_files: set[str] = set()
        # coverage verdicts by (shape, boxes): every layer of a model with the same layout shares
        # one proof (most useful for tensor tables with thousands of tensors).
        self.coverage_cache: dict[tuple[Any, ...], Problem | None] = {}
        # locations of the manifest the schema pass reported with a specific code
        self.schema_at: set[JsonPath] = set()
        # the manifest's tensor table, once read and validated (R-INDEX-6 compares with it)
        self.table: TensorTable | None = None
        self._table_keys: dict[str, int] | None = None
        # errors about what the attempt holds besides the manifest's own record (an unlisted
        # index, a symbolic link): they do not stop the comparison of R-INDEX-6
        self.content_errors = 0
        # the manifest's format_version and must_understand: which rows of §7 its tensors may
        # use (R-DTYPE-3 per version; set by check_manifest)
        self.doc_version: Any = None
        self.doc_must_understand: Any = None

    def err(self, code: str, msg: str) -> None:
        self.r.error(code, f"{self.name}: {msg}")

    def reported(self, at: JsonPath) -> bool:
        """Whether the schema pass reported a defect at ``at``, inside it or around it."""
        return any(p[:len(at)] == at or at[:len(p)] == p for p in self.schema_at)

    def problem(self, exc: Problem, prefix: str) -> None:
        """Report ``exc`` unless the schema pass already reported its location."""
        if isinstance(exc, Located) and self.reported(exc.at):
            return
        self.err(exc.code, f"{prefix}{exc.message}")

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
        elif not _is_int(step):  # 42.0: not an integer token, before the attempt id (A4)
            self.err("PCK-SCHEMA", f"step {step!r} is not an integer")
        elif int(am.group(1)) != step:
            self.err("PCK-ATTEMPT-ID", f"attempt_id {aid!r} does not encode step {step!r}")
        cont = m.get("continuation")
        ws: Any = cont.get("world_size") if isinstance(cont, dict) else None
        if not _is_int(ws) or ws < 1:
            self.err("PCK-SCHEMA", f"continuation.world_size {ws!r} must be an integer >= 1")
            ws = None
        mesh = cont.get("mesh") if isinstance(cont, dict) else None
        if isinstance(mesh, dict) and ws is not None:
            ms, names = mesh.get("shape"), mesh.get("dim_names")
            if (not isinstance(ms, list) or not isinstance(names, list) or len(ms) != len(names)
                    or not all(_is_int(x) for x in ms) or math.prod(ms) != ws):
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
            record = _record_kind(rel)
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

    # -- tensor tables (format 1.1) --------------------------------------------------------------
    def check_version_use(self, m: dict[str, Any]) -> None:
        """R-VERSION-2 is a writer rule; a reader accepts any 1.x, so ``check`` warns.

        The writer harness, where only the writer under test wrote the attempt, fails it.
        """
        fv, mu = m.get("format_version"), m.get("must_understand")
        mv = re.fullmatch(r"1\.(0|[1-9][0-9]{0,8})", fv) if isinstance(fv, str) else None
        if mv is not None and int(mv.group(1)) > NEWEST_MINOR:
            # Valid for a reader (§16.2), but no writer of this text records it: a writer that
            # stamps a version it does not implement passed the harness (review C2).
            self.r.warn(f"{self.name}: format_version {fv} is newer than this checker's "
                        f"{NEWEST_FORMAT_VERSION} and was checked as {NEWEST_FORMAT_VERSION}; a "
                        "writer of this text records '1.0', '1.1' for a tensor table, or '1.3' "
                        "for a dtype of 1.3 (R-VERSION-2)")
        elif fv == "1.2":
            # 1.2 changes verification records only (spec §14.5): a manifest uses none of it.
            self.r.warn(f"{self.name}: format_version 1.2 in a manifest: 1.2 adds nothing to "
                        "manifests; a writer records '1.0', '1.1' for a tensor table, or '1.3' "
                        "for a dtype of 1.3 (R-VERSION-2)")
        if fv == "1.1" and "tensor_table" not in m:
            self.r.warn(f"{self.name}: format_version 1.1 without a tensor table: writers record "
                        "'1.0' in documents that use no 1.1 feature (R-VERSION-2)")
        if isinstance(mu, list) and TABLE_EXTENSION in mu and "tensor_table" not in m:
            self.r.warn(f"{self.name}: must_understand lists {TABLE_EXTENSION!r} but the "
                        "manifest has no tensor_table")

    def check_dtype_version_use(self, m: dict[str, Any], used: set[str]) -> None:
        """R-VERSION-2, R-VERSION-7 for the dtypes of 1.3 (a writer rule: ``check`` warns).

        ``used``: the dtypes of the manifest's tensors, its table's included.
        """
        fv, mu = m.get("format_version"), m.get("must_understand")
        later = {DTYPE_SINCE[d][1]: d for d in DTYPE_SINCE}
        if fv == "1.3" and not used & set(DTYPE_SINCE):
            self.r.warn(f"{self.name}: format_version 1.3 without a tensor of a dtype of 1.3: "
                        "writers record '1.0', or '1.1' for a tensor table (R-VERSION-2)")
        for ext in sorted(set(mu) & set(later) if isinstance(mu, list) else ()):
            if later[ext] not in used:
                self.r.warn(f"{self.name}: must_understand lists {ext!r} but the manifest has "
                            f"no tensor of dtype {later[ext]!r} (R-VERSION-2)")

    def check_table_member(self, m: dict[str, Any]) -> bool:
        """R-TABLE-1/-2 in code as well (the 1.1 schema encodes them; it may be absent)."""
        problems = []
        if m.get("tensors") != {}:
            problems.append("a manifest with a tensor_table must have tensors {} (R-TABLE-1)")
        mu = m.get("must_understand")
        if not isinstance(mu, list) or TABLE_EXTENSION not in mu:
            problems.append(f"a manifest with a tensor_table must list {TABLE_EXTENSION!r} in "
                            "must_understand (R-TABLE-2)")
        if m.get("format_version") == "1.0":
            problems.append("a manifest with a tensor_table must have format_version 1.1 or a "
                            "later 1.x (R-TABLE-2)")
        for msg in problems:
            self.err("PCK-SCHEMA", msg)
        return not problems

    def read_table(self, doc: dict[str, Any], what: str) -> TensorTable | None:
        """Load and validate the table of a manifest or writer index (R-TABLE-1, -3 … -6, -8).

        Problems already reported elsewhere (an unsafe path or unknown codec found by the schema,
        a table file with a bad record or size) are not reported twice.
        """
        ref = doc.get("tensor_table")
        files = doc.get("files")
        if not isinstance(ref, dict) or not isinstance(files, dict):
            return None  # the schema check has reported it
        rel, codec = ref.get("file"), ref.get("codec")
        if path_problem(rel) is not None or codec not in ("none", "zstd"):
            return None  # reported by the schema check with its specific code
        if rel in self.bad_files:
            return None
        try:
            return load_table(self.vf, ref, files, what)
        except Problem as exc:
            self.err(exc.code, exc.message)
        except OSError as exc:
            self.err("PCK-STORAGE", f"{what}: table {rel!r}: {exc}")
        return None

    def check_index_table(self, doc: dict[str, Any], rel: str) -> TensorTable | None:
        """A writer index's table: decoded and validated, every record's box in bounds.

        Returns the table, or None when it could not be read or breaks a rule (reported: its
        tensors are then not compared with the manifest's, one report per defect).
        """
        before = len(self.r.errors)
        table = self.read_table(doc, rel)
        if table is None:
            return None
        for dtype in sorted(set(table.dtypes)):
            # R-DTYPE-3 per version, as for the index's JSON tensors (which its schema checks)
            later = dtype_not_allowed(dtype, doc.get("format_version"), None)
            if later:
                self.err("PCK-DTYPE-UNSUPPORTED", f"{rel}: its tensor table: {later} (R-DTYPE-3)")
        for t, key in enumerate(table.keys):
            shape = table.shapes[t]
            isz = DTYPES[table.dtypes[t]][1]
            if math.prod(d for d in shape if d) * isz > MAX_SIZE:
                self.err("PCK-LIMIT", f"{rel}: tensor {key!r} of shape {list(shape)} exceeds the "
                         "format's limits (R-TENSOR-1)")
                continue
            offs, lens = table.boxes(t)
            for o, ln in zip(offs, lens, strict=True):
                if any(o[d] < 0 or ln[d] < 1 or o[d] + ln[d] > shape[d] for d in range(len(o))):
                    self.err("PCK-RANGE-BOUNDS", f"{rel}: tensor {key!r}: box offsets={o} "
                             f"lengths={ln} is empty or outside shape {list(shape)}")
                    break
        return table if len(self.r.errors) == before else None

    def header(self, rel: str) -> StHeader | None:
        if rel not in self.headers:
            try:
                self.headers[rel] = parse_safetensors_header(self.vf, rel)
            except Problem as exc:
                self.err(exc.code, exc.message)
                self.headers[rel] = None
        return self.headers[rel]

    # -- tensors -------------------------------------------------------------------------------
    def check_tensor(self, key: str, t: Any) -> None:
        if not key or len(key) > 1024 or has_control_chars(key):
            raise Problem("PCK-SCHEMA", "key must be 1..1024 characters without control characters")
        if not isinstance(t, dict):
            raise Problem("PCK-SCHEMA", "tensor record is not an object")
        dtype, shape, ranges = t.get("dtype"), t.get("shape"), t.get("ranges")
        at: JsonPath = ("tensors", key)
        if dtype not in DTYPES:
            raise Located("PCK-DTYPE-UNSUPPORTED", f"dtype {dtype!r} is not in the format's "
                           "table", (*at, "dtype"))
        later = dtype_not_allowed(dtype, self.doc_version, self.doc_must_understand)
        if later:
            raise Located("PCK-DTYPE-UNSUPPORTED", f"{later} (R-DTYPE-3)", (*at, "dtype"))
        st_dtype, itemsize = DTYPES[dtype]
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise Located("PCK-SCHEMA", f"shape {shape!r} must be a list of integers >= 0",
                           (*at, "shape"))
        # R-TENSOR-1: also the product of the non-zero dimensions (zero-size tensors included).
        if len(shape) > MAX_NDIM or any(d > MAX_SIZE for d in shape) or \
                math.prod(d for d in shape if d) * itemsize > MAX_SIZE:
            raise Located("PCK-LIMIT", f"shape {shape} exceeds the format's limits",
                           (*at, "shape"))
        if not isinstance(ranges, list):
            raise Located("PCK-SCHEMA", "ranges must be a list", (*at, "ranges"))
        ndim = len(shape)
        boxes: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
        for i, rr in enumerate(ranges):
            where = f"range {i}"
            rat: JsonPath = (*at, "ranges", i)
            if not isinstance(rr, dict):
                raise Located("PCK-SCHEMA", f"{where} is not an object", rat)
            offs, lens = rr.get("offsets"), rr.get("lengths")
            if (not isinstance(offs, list) or not isinstance(lens, list)
                    or not all(_is_int(x) for x in offs + lens)):
                raise Located("PCK-SCHEMA", f"{where}: offsets/lengths must be integer lists",
                               rat)
            if len(offs) != ndim or len(lens) != ndim:
                raise Located("PCK-RANGE-BOUNDS", f"{where}: box of rank "
                               f"{len(offs)}/{len(lens)} for a tensor of rank {ndim}", rat)
            for d in range(ndim):
                if offs[d] < 0 or lens[d] < 1 or offs[d] + lens[d] > shape[d]:
                    raise Located("PCK-RANGE-BOUNDS", f"{where}: box offsets={offs} "
                                   f"lengths={lens} is empty or outside shape {shape} (dim {d})",
                                   rat)
            boxes.append((tuple(offs), tuple(lens)))
            self.check_range_data(key, where, rr, st_dtype, itemsize, lens, rat)
        if self.record_only:
            return  # coverage is decided when the tensor is first read (§4.1, R-COVER-3)
        sig = (tuple(shape), tuple(boxes))
        if sig in self.coverage_cache:
            hit = self.coverage_cache[sig]
            if hit is not None:
                raise Located(hit.code, hit.message, (*at, "ranges"))
            return
        try:
            check_coverage(shape, boxes)
        except Problem as exc:
            self.coverage_cache[sig] = exc
            raise Located(exc.code, exc.message, (*at, "ranges")) from None
        self.coverage_cache[sig] = None

    def check_range_data(self, key: str, where: str, rr: dict[str, Any], st_dtype: str,
                         itemsize: int, lens: list[int], at: JsonPath = ()) -> None:
        rel, name, codec = rr.get("file"), rr.get("name"), rr.get("codec")
        if codec not in ("none", "zstd"):
            raise Located("PCK-CODEC", f"{where}: unknown codec {codec!r}", (*at, "codec"))
        why = path_problem(rel)
        if why is not None:
            raise Located("PCK-PATH-UNSAFE", f"{where}: {why}", (*at, "file"))
        assert isinstance(rel, str)
        if rel in self.bad_files:
            return  # already reported for the file itself
        if rel not in self.vf.records:
            raise Problem("PCK-SCHEMA", f"{where}: file {rel!r} is not listed in files "
                          "(R-FILES-2)")
        if self.record_only:
            return
        hdr = self.header(rel)
        if hdr is None:
            return
        if not isinstance(name, str) or name not in hdr.tensors:
            raise Problem("PCK-SHARD-MISMATCH", f"{where}: {rel!r} has no tensor named {name!r}")
        st = hdr.tensors[name]
        nbytes = math.prod(lens) * itemsize
        if codec == "none":
            if st.dtype != st_dtype or st.shape != lens:
                raise Problem("PCK-SHARD-MISMATCH", f"{where}: {rel!r}:{name} is {st.dtype}"
                              f"{st.shape}, the range record needs {st_dtype}{lens}")
            if self.deep and st_dtype == "BOOL":
                _check_bool_bytes(self.vf.read(rel, st.begin, st.end - st.begin),
                                  f"{where}: {rel!r}:{name}")
            return
        if st.dtype != "U8" or len(st.shape) != 1 or st.shape[0] < 1:
            raise Problem("PCK-SHARD-MISMATCH", f"{where}: zstd range {rel!r}:{name} must be a "
                          f"1-D U8 tensor of at least one byte, is {st.dtype}{st.shape}")
        stored = st.end - st.begin
        if self.deep:
            frame = self.vf.read(rel, st.begin, stored)
            raw = zstd_decode(frame, where=f"{where}: {rel!r}:{name}", limit=nbytes, exact=nbytes)
            if st_dtype == "BOOL":
                _check_bool_bytes(raw, f"{where}: {rel!r}:{name} (decoded)")
        else:
            # R-VERIFY-2: the frame header's declared size and bounds are metadata (R-TENSOR-7,
            # R-TENSOR-10), decided from the first 18 bytes; decoding is left to --deep.
            head = self.vf.read(rel, st.begin, min(ZSTD_HEADER_MAX, stored))
            zstd_check_header(head, stored=stored, where=f"{where}: {rel!r}:{name}",
                              limit=nbytes, exact=nbytes)

    # -- entries -------------------------------------------------------------------------------
    def check_entry(self, name: str, e: Any, ws: int | None, step: Any) -> None:
        if not name or len(name) > 256 or has_control_chars(name):
            raise Problem("PCK-SCHEMA", "entry name must be 1..256 chars without control chars")
        if not isinstance(e, dict):
            raise Problem("PCK-SCHEMA", "entry record is not an object")
        sch, scope, enc, values = e.get("schema"), e.get("scope"), e.get("encoding"), \
            e.get("values")
        try:
            schema_doc, schema_id = self.entry_schema(sch)
        except Problem as exc:
            raise Located(exc.code, exc.message, ("entries", name, "schema")) from None
        if enc not in ("json", "json+zstd"):
            raise Problem("PCK-SCHEMA", f"encoding {enc!r} is not 'json' or 'json+zstd'")
        if not isinstance(values, list) or not all(isinstance(v, dict) for v in values):
            raise Problem("PCK-SCHEMA", "values must be a list of objects")
        if scope == "global":
            if "world_size_policy" in e:
                raise Problem("PCK-SCHEMA", "world_size_policy is only allowed for per_rank")
            if not values:
                raise Located("PCK-ENTRY-MISSING", "global entry has no value",
                               ("entries", name, "values"))
            if len(values) != 1 or "rank" in values[0]:
                raise Problem("PCK-SCHEMA", "global entry must have exactly one value, no rank")
        elif scope == "per_rank":
            if e.get("world_size_policy") not in ("require_same", "modulo", "rank0", "drop"):
                raise Problem("PCK-SCHEMA", f"per_rank entry needs a world_size_policy, got "
                              f"{e.get('world_size_policy')!r}")
            ranks = [v.get("rank") for v in values]
            if not all(_is_int(r) and r >= 0 for r in ranks):
                raise Problem("PCK-SCHEMA", "every per_rank value needs an integer rank >= 0")
            if len(set(ranks)) != len(ranks):
                raise Problem("PCK-SCHEMA", f"duplicate ranks in {sorted(ranks)}")
            if ws is not None:
                extra = sorted(r for r in ranks if r >= ws)
                if extra:
                    raise Problem("PCK-SCHEMA", f"ranks {extra} >= world_size {ws}")
                if len(ranks) < ws:  # distinct and below ws: O(values), never range(ws)
                    have = set(ranks)
                    missing = list(itertools.islice((r for r in range(ws) if r not in have), 10))
                    raise Problem("PCK-ENTRY-MISSING", f"per_rank values missing for ranks "
                                  f"{missing} (world_size {ws})")
        else:
            raise Problem("PCK-SCHEMA", f"scope {scope!r} is not 'global' or 'per_rank'")
        for j, v in enumerate(values):
            rel = v.get("file")
            why = path_problem(rel)
            if why is not None:
                raise Located("PCK-PATH-UNSAFE", why, ("entries", name, "values", j, "file"))
            assert isinstance(rel, str)
            if rel in self.bad_files:
                continue
            if rel not in self.vf.records:
                raise Problem("PCK-SCHEMA", f"value file {rel!r} is not listed in files "
                              "(R-FILES-2)")
            if self.record_only:
                continue
            if enc == "json" and self.vf.records[rel].size > ENTRY_MAX_BYTES:
                raise Problem("PCK-JSON-INVALID", f"value file {rel!r} is "
                              f"{self.vf.records[rel].size} bytes, larger than the limit of "
                              f"{ENTRY_MAX_BYTES} (R-SEC-11)")
            raw = self.vf.read(rel)
            if enc == "json+zstd":
                raw = zstd_decode(raw, where=f"value file {rel!r}", limit=ENTRY_MAX_BYTES)
            try:
                value = loads_strict(raw, max_bytes=ENTRY_MAX_BYTES, max_values=MAX_VALUES)
            except StrictJsonError as exc:
                raise Problem("PCK-JSON-INVALID", f"value file {rel!r}: {exc}") from None
            if schema_doc is not None:
                units = SCHEMA_BASE_UNITS + SCHEMA_UNITS_PER_VALUE * _values_of(value)
                try:
                    # Built-in schemas take integer tokens (R-SEC-18, errata 6: {"step": 4.0}
                    # is no step); embedded ones keep Draft 2020-12's 1.0 == 1.
                    errs = self.schemas.validate(schema_doc, value, limit=3, budget=units,
                                                 integer_tokens=schema_id is not None)
                except BudgetExceeded:
                    raise Problem("PCK-ENTRY-SCHEMA", f"value {rel!r}: validating it against "
                                  f"its schema takes more than {units} units (R-ENTRY-16)"
                                  ) from None
                if errs:
                    raise Problem("PCK-ENTRY-SCHEMA", f"value {rel!r} violates its schema "
                                  f"{schema_id or 'json_schema'}: {'; '.join(errs)}")
            if schema_id == "pck:step/1" and _step_of(value) != step:
                raise Problem("PCK-STEP-MISMATCH", f"value {rel!r} holds step {value!r}, the "
                              f"manifest says {step!r}")

    def entry_schema(self, sch: Any) -> tuple[dict[str, Any] | None, str | None]:
        if not isinstance(sch, dict) or len(sch) != 1:
            raise Problem("PCK-SCHEMA", "schema must be {'id': ...} or {'json_schema': {...}}")
        if "id" in sch:
            sid = sch["id"]
            if sid not in BUILTIN_SCHEMA_IDS:
                raise Problem("PCK-ENTRY-SCHEMA", f"unknown builtin schema id {sid!r}")
            doc = self.schemas.by_file.get(BUILTIN_SCHEMA_FILES[sid])
            if doc is None:
                self.r.warn(f"builtin schema {sid} not found under {self.schemas.root}/entries")
            return doc, sid
        js = sch.get("json_schema")
        if not isinstance(js, (dict, bool)):
            raise Problem("PCK-SCHEMA", "json_schema must be a JSON Schema (object or boolean)")
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import SchemaError as JsSchemaError

        try:
            # "format": "regex" of the meta-schema would use Python's re: patterns are
            # checked against the portable subset (§18.7) below instead.
            Draft202012Validator.check_schema(js, format_checker=None)
        except JsSchemaError as exc:
            raise Problem("PCK-ENTRY-SCHEMA", f"json_schema is not a valid Draft 2020-12 "
                          f"schema: {exc.message[:200]}") from None
        if _has_remote_ref(js):
            raise Problem("PCK-ENTRY-SCHEMA", "json_schema uses a remote $ref")
        for pattern in patterns_of(js):
            try:
                compiled(pattern)
            except BadPattern as exc:
                raise Problem("PCK-ENTRY-SCHEMA", f"json_schema pattern {pattern[:80]!r}: "
                              f"{exc} (R-ENTRY-15)") from None
        try:
            # Another dialect is unusable (R-ENTRY-3, §12.1, errata 6); 2020-12's own $schema
            # is dropped so that evaluation keeps this suite's validator class (§22).
            js = without_dialect(js)
        except OtherDialect as exc:
            raise Problem("PCK-ENTRY-SCHEMA", f"json_schema: {exc} (§12.1)") from None
        return (js if isinstance(js, dict) else {"not": {}} if js is False else {}), None

    # -- writer indexes, drills ----------------------------------------------------------------
    def check_side_documents(self, aid: Any, manifest: dict[str, Any]) -> None:
        # R-INDEX-6 compares indexes with a manifest that has no error of its own (one code
        # per defect, R-VERSION-13).
        manifest_ok = len(self.r.errors) - self.content_errors == self.errors_before
        verifications: list[tuple[str, dict[str, Any]]] = []
        for sub, schema_name, fmt, id_key, rule in _SIDE_DOCUMENTS:
            d = self.vdir / sub
            if d.is_symlink() or not d.is_dir():
                continue  # a link is reported by check_files (R-SEC-2) and never followed
            for p in sorted(d.glob("*.json")):
                rel = f"{sub}/{p.name}"
                if _record_kind(rel) != sub:
                    continue  # not named like a record of its kind: a file like any other
                if p.is_symlink() or rel in self.bad_files:
                    continue  # reported: a link (R-SEC-2), or the listed file itself
                listed = rel in self.vf.records
                doc = load_json(self.vf, rel, self.r, max_bytes=DOC_MAX_BYTES,
                                 verified=listed, path=p)
                if doc is None:
                    continue
                where = f"{self.name}/{rel}"
                if not isinstance(doc, dict) or doc.get("format") != fmt:
                    self.r.error("PCK-SCHEMA", f"{where}: format must be {fmt!r}")
                    continue
                fv = doc.get("format_version")
                if isinstance(fv, str) and not fv.startswith("1."):
                    self.r.error("PCK-VERSION-UNSUPPORTED", f"{where}: format_version {fv!r}")
                    continue
                if not schema_check(self.schemas, schema_name, doc, where, self.r):
                    continue
                if doc.get("attempt_id") != aid:
                    self.r.error("PCK-ATTEMPT-ID", f"{where}: attempt_id {doc.get('attempt_id')!r}"
                                 f" differs from the manifest's {aid!r}")
                if id_key is not None and p.name != f"{doc.get(id_key)}.json":
                    self.r.error("PCK-SCHEMA", f"{where}: {id_key} {doc.get(id_key)!r} is not "
                                 f"its file name ({rule})")
                if sub == "verifications":
                    verifications.append((where, doc))
                if sub == "deleting":
                    self.r.warn(f"{where}: a gc began deleting this version and was stopped "
                                "before its commit record went, or could not delete it "
                                "(R-GC-13): the version is committed; a gc that keeps it "
                                "removes the mark")
                if sub == "index":
                    w = doc.get("writer")
                    if not _is_int(w) or p.name != f"w{w:05d}.json":
                        self.r.error("PCK-SCHEMA", f"{where}: writer {w!r} does not match the "
                                     "file name (R-INDEX-3)")
                    itable = self.check_index_table(doc, rel) if "tensor_table" in doc else None
                    if manifest_ok:
                        self.check_index_agrees(doc, itable, manifest, where)

        self.check_clears(verifications)

    def check_clears(self, records: list[tuple[str, dict[str, Any]]]) -> None:
        """R-DRILL-10, R-VERSION-2 (format 1.2): ``clears`` only in a passed deep record.

        The schema constrains ``clears`` in a passed deep record of 1.2 or later only: in any
        other record of 1.2 or later it is a writer's mistake, reported, while readers ignore
        the member (a failed record that carries it still counts as failed). What the text
        cannot make a schema say is warned: a 1.2 record without ``clears``, an id that names
        no failed record of the version, a failed record that is newer than the record that
        clears it (R-DRILL-10 lists only records read before the verification began).
        """
        failed = {str(d.get("verification_id")): d for _, d in records if d.get("ok") is False}
        moved = self.vdir / "verifications" / "cleared"  # cleared records kept as history
        history = ({p.name.removesuffix(".json") for p in moved.glob("*.json")}
                   if moved.is_dir() and not moved.is_symlink() else set())
        for where, d in records:
            fv = str(d.get("format_version"))
            newer = fv not in ("1.0", "1.1")
            if "clears" not in d:
                if fv == "1.2":
                    self.r.warn(f"{where}: format_version 1.2 without clears: a writer records "
                                "'1.0' in a verification record that clears nothing (R-VERSION-2)")
                continue
            if not newer:
                continue  # unknown in 1.0 and 1.1: ignored (R-VERSION-6)
            if d.get("ok") is not True or d.get("mode") != "deep":
                self.r.error("PCK-SCHEMA", f"{where}: clears in a record that is not a passed "
                             "deep verification (R-DRILL-10); readers ignore it there")
                continue
            for vid in d.get("clears") or ():
                f = failed.get(str(vid))
                if f is None and str(vid) in history:
                    # Moved: its time is read from the history, so that a clearing dated
                    # before the failure it lists is still reported (attack review 12, A3).
                    f = _history_record(moved / f"{vid}.json")
                    if f is None:
                        continue
                if f is None:
                    # A failure pruned by the writer of a later one while the clearing ran
                    # (R-DRILL-9) leaves such an id too: said, not taken for tampering.
                    self.r.warn(f"{where}: clears {vid!r}, which is no failed verification "
                                "record of this version, here or below verifications/cleared/ "
                                "(R-DRILL-10; a failure the writer of a later one pruned while "
                                "the clearing ran, R-DRILL-9, leaves one too)")
                elif _ts_key(f.get("verified_at")) > _ts_key(d.get("verified_at")):
                    self.r.warn(f"{where}: clears {vid!r}, which finished after this "
                                "verification did (R-DRILL-10: only records read before it "
                                "began)")

    def manifest_tensor(self, m: dict[str, Any], key: str) -> Any:
        """The manifest's tensor entry ``key`` (from its JSON ``tensors`` or its table)."""
        if "tensor_table" not in m:
            tensors = m.get("tensors")
            return tensors.get(key) if isinstance(tensors, dict) else None
        if self.table is None:
            return None
        if self._table_keys is None:
            self._table_keys = {k: t for t, k in enumerate(self.table.keys)}
        t = self._table_keys.get(key)
        return None if t is None else self.table.tensor(t)

    def check_index_agrees(self, idx: dict[str, Any], itable: TensorTable | None,
                           m: dict[str, Any], where: str) -> None:
        """§14.2: the manifest is the union of the indexes, so an index is part of it.

        Each file, tensor (dtype, shape, every range) and entry (declaration, every value) an
        index lists is the manifest's (PCK-METADATA-CONFLICT otherwise), compared as JSON
        values of the same types. Tensors are compared whatever form either document holds
        them in: JSON ``tensors`` or a tensor table (``itable``, the index's; the manifest's
        table as read by :meth:`check_manifest`), a table record with its implied range names
        (R-TABLE-7). Not every writer stores its index (R-INDEX-1), so the union is not
        required to be whole.
        """
        files, entries = (m.get(k) or {} for k in ("files", "entries"))
        # File records are compared by path and size: the file itself is checked against the
        # manifest's record, and block sizes may differ; a size cannot (traceability audit F3:
        # an index that lied about its files was conformant).
        for rel, rec in (idx.get("files") or {}).items():
            if rel not in files:
                self.r.error("PCK-METADATA-CONFLICT", f"{where}: file {rel!r} is not in the "
                             "manifest's files")
                continue
            mine, theirs = (r.get("size") if isinstance(r, dict) else None
                            for r in (rec, files[rel]))
            if _is_int(mine) and _is_int(theirs) and mine != theirs:
                self.r.error("PCK-METADATA-CONFLICT", f"{where}: file {rel!r} is {mine} bytes in "
                             f"the index, {theirs} in the manifest (R-INDEX-6)")
        its: Iterable[tuple[str, Any]]
        if "tensor_table" in idx:  # a table that breaks a rule is reported: not compared
            its = itable.items() if itable is not None else ()
        else:
            its = (idx.get("tensors") or {}).items()
        for key, t in its:
            mt = self.manifest_tensor(m, key)
            if not isinstance(mt, dict) or not isinstance(t, dict):
                self.r.error("PCK-METADATA-CONFLICT", f"{where}: tensor {key!r} is not in the "
                             "manifest")
                continue
            if not same_json([t.get("dtype"), t.get("shape")], [mt.get("dtype"),
                                                                  mt.get("shape")]):
                self.r.error("PCK-METADATA-CONFLICT", f"{where}: tensor {key!r} is "
                             f"{t.get('dtype')}{t.get('shape')} in the index, "
                             f"{mt.get('dtype')}{mt.get('shape')} in the manifest")
                continue
            stored = {json.dumps(r, sort_keys=True) for r in mt.get("ranges") or []}
            extra = [r for r in t.get("ranges") or []
                     if json.dumps(r, sort_keys=True) not in stored]
            if extra:
                self.r.error("PCK-METADATA-CONFLICT", f"{where}: tensor {key!r}: "
                             f"{len(extra)} range(s) of the index are not in the manifest")
        for name, e in (idx.get("entries") or {}).items():
            me = entries.get(name)
            if not isinstance(me, dict) or not isinstance(e, dict) or not all(
                    same_json(e.get(k), me.get(k))
                    for k in ("schema", "scope", "encoding", "world_size_policy")):
                self.r.error("PCK-METADATA-CONFLICT", f"{where}: entry {name!r} is not the "
                             "manifest's (declaration or presence)")
                continue
            values = {json.dumps(v, sort_keys=True) for v in me.get("values") or []}
            if any(json.dumps(v, sort_keys=True) not in values for v in e.get("values") or []):
                self.r.error("PCK-METADATA-CONFLICT", f"{where}: entry {name!r}: a value of "
                             "the index is not in the manifest")


#: File names of the records the checker reads as such (others are files like any other):
#: ``index/w<writer:05d>.json`` has at least five digits (§2.1), the number equal to ``writer``.
_INDEX_NAME = re.compile(r"w[0-9]{5,}\.json")
_VERIFICATION_NAME = re.compile(r"v[0-9]{8}T[0-9]{12}Z-[0-9a-f]{8}\.json")
#: ``files`` keys the schema forbids (§19.2): ``manifest.json``, ``manifest.json.<anything>``,
#: anything below ``drills/`` or ``copies/``; ``manifest.jsonl`` is a file like any other.
_FORBIDDEN_FILES = re.compile(r"manifest\.json(?:\..*)?\Z|drills/|copies/", re.DOTALL)
#: the directories of the records added after the commit (not part of the version, §14.3).
_SIDE_DIRS = re.compile(r"(?:drills|copies|verifications|deleting)/")
#: the documents below an attempt besides the manifest: (directory, schema, format, id member
#: that names the file, rule of that name).
_SIDE_DOCUMENTS: tuple[tuple[str, str, str, str | None, str], ...] = (
    ("index", "writer-index", "portable-ckpt-writer-index", None, "R-INDEX-1"),
    ("drills", "drill", "portable-ckpt-drill", "drill_id", "R-DRILL-1"),
    ("copies", "copy", "portable-ckpt-copy", "copy_id", "R-DRILL-6"),
    ("verifications", "verification", "portable-ckpt-verification", "verification_id",
     "R-DRILL-7"),
    ("deleting", "deletion", "portable-ckpt-deletion", "deletion_id", "R-GC-13"),
)


#: The directories of the records added after a commit (§14.3–§14.5).
_RECORD_DIRS = frozenset({"drills", "copies", "verifications", "verifications/cleared"})


def _history_record(path: Path) -> dict[str, Any] | None:
    """A cleared record kept below ``verifications/cleared/`` as a JSON object, if readable."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > (1 << 20):
            return None
        doc = loads_strict(path.read_bytes(), max_bytes=1 << 20)
    except (OSError, ValueError, StrictJsonError):
        return None
    return doc if isinstance(doc, dict) else None


def _record_kind(rel: str) -> str | None:
    """The kind of record the checker reads ``rel`` as, or None.

    ``"index"``, ``"drills"``, ``"copies"``, ``"verifications"`` or ``"deleting"`` (a gc's
    deletion mark, R-GC-13) (:meth:`_VersionChecker.check_side_documents`).
    """
    sub, _, name = rel.partition("/")
    if "/" in name or not name.endswith(".json"):
        return None
    if sub == "index":
        return sub if _INDEX_NAME.fullmatch(name) else None
    if sub == "verifications":
        return sub if _VERIFICATION_NAME.fullmatch(name) else None
    if sub == "deleting":  # (R-GC-13: only a file named like a mark is read as one)
        return sub if DELETION_NAME_RE.fullmatch(name) else None
    return sub if sub in ("drills", "copies") else None


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


def _check_bool_bytes(data: bytes, where: str) -> None:
    """R-DTYPE-4: a bool element is the byte 0x00 or 0x01."""
    bad = data.translate(None, b"\x00\x01")
    if bad:
        at = next(i for i, b in enumerate(data) if b > 1)
        raise Problem("PCK-DTYPE-VALUE", f"{where}: bool element {at} is stored as byte "
                      f"0x{data[at]:02x}, not 0x00 or 0x01 (R-DTYPE-2)")


def _values_of(value: Any) -> int:
    """JSON values of a decoded value (containers and scalars; R-SEC-15)."""
    n, todo = 0, [value]
    while todo:
        v = todo.pop()
        n += 1
        todo.extend(v.values() if isinstance(v, dict) else v if isinstance(v, list) else ())
    return n


def _step_of(value: Any) -> Any:
    if isinstance(value, dict) and "step" in value:
        return value["step"]
    return value


def _has_remote_ref(js: Any) -> bool:
    stack = [js]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            for k, x in v.items():
                if k in ("$ref", "$dynamicRef") and isinstance(x, str) and not x.startswith("#"):
                    return True
                stack.append(x)
        elif isinstance(v, list):
            stack.extend(v)
    return False


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
