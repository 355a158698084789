"""The version checker's checks of the records beside the manifest (§14).

Writer indexes (each one part of the manifest, R-INDEX-6), drill, copy and verification
records (the clearing of failed verifications, R-DRILL-10), and a gc's deletion marks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from conformance._check_base import is_int
from conformance._check_tensors import TensorChecks
from conformance.documents import load_json, same_json, schema_check
from conformance.reader import timestamp_key as _ts_key
from conformance.spec import DELETION_NAME_RE
from conformance.strictjson import StrictJsonError, loads_strict
from conformance.table import TensorTable

__all__ = ["DOC_MAX_BYTES", "RecordChecks", "record_kind"]

#: R-SEC-11: any JSON document other than a manifest (writer indexes, drill, copy and
#: verification records) is rejected above 64 MiB, before it is read in full.
DOC_MAX_BYTES = 64 << 20

#: File names of the records the checker reads as such (others are files like any other):
#: ``index/w<writer:05d>.json`` has at least five digits (§2.1), the number equal to ``writer``.
_INDEX_NAME = re.compile(r"w[0-9]{5,}\.json")
_VERIFICATION_NAME = re.compile(r"v[0-9]{8}T[0-9]{12}Z-[0-9a-f]{8}\.json")
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



class RecordChecks(TensorChecks):
    """Writer indexes, drill, copy and verification records, deletion marks (§14)."""

    def check_side_documents(self, aid: Any, manifest: dict[str, Any]) -> None:
        """Each record below the attempt named like one, against its schema and the manifest.

        Writer indexes, drill, copy and verification records, and deletion marks.
        """
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
                if record_kind(rel) != sub:
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
                    if not is_int(w) or p.name != f"w{w:05d}.json":
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
            if is_int(mine) and is_int(theirs) and mine != theirs:
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



def _history_record(path: Path) -> dict[str, Any] | None:
    """A cleared record kept below ``verifications/cleared/`` as a JSON object, if readable."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > (1 << 20):
            return None
        doc = loads_strict(path.read_bytes(), max_bytes=1 << 20)
    except (OSError, ValueError, StrictJsonError):
        return None
    return doc if isinstance(doc, dict) else None


def record_kind(rel: str) -> str | None:
    """The kind of record the checker reads ``rel`` as, or None.

    ``"index"``, ``"drills"``, ``"copies"``, ``"verifications"`` or ``"deleting"`` (a gc's
    deletion mark, R-GC-13) (:meth:`RecordChecks.check_side_documents`).
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
