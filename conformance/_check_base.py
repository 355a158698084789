"""What every part of the version checker shares (:class:`CheckerBase`).

The version's files, the report, the schema pass's locations, and how a problem is reported
once.

The checks themselves are split by what they check: the commit record and its files
(:mod:`conformance.checker`), tensors, ranges and tensor tables
(:mod:`conformance._check_tensors`), entries (:mod:`conformance._check_entries`), and the
records beside the manifest, writer indexes and verifications among them
(:mod:`conformance._check_records`). ``_VersionChecker`` in :mod:`conformance.checker` is all
of them over one version.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.documents import JsonPath, Located
from conformance.findings import Report
from conformance.schemas import SchemaSet
from conformance.store import Problem, StHeader, VersionFiles
from conformance.table import TensorTable

__all__ = ["CheckerBase", "is_int"]


def is_int(v: Any) -> bool:
    """An integer token of JSON (``True`` is not one)."""
    return isinstance(v, int) and not isinstance(v, bool)


class CheckerBase:
    """The state of one version's check, and reporting."""

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
        # errors in the report before this version's (R-INDEX-6 compares only when the
        # manifest has none of its own; set by run)
        self.errors_before = len(report.errors)

    def err(self, code: str, msg: str) -> None:
        """Report a violation in this version."""
        self.r.error(code, f"{self.name}: {msg}")

    def reported(self, at: JsonPath) -> bool:
        """Whether the schema pass reported a defect at ``at``, inside it or around it."""
        return any(p[:len(at)] == at or at[:len(p)] == p for p in self.schema_at)

    def problem(self, exc: Problem, prefix: str) -> None:
        """Report ``exc`` unless the schema pass already reported its location."""
        if isinstance(exc, Located) and self.reported(exc.at):
            return
        self.err(exc.code, f"{prefix}{exc.message}")
