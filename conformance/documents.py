"""A format document read by the checker: strictly decoded JSON, validated against its schema.

:func:`load_json` reads and decodes a document within its size limit (R-SEC-11, R-SEC-16);
:func:`schema_check` validates it against ``spec/schemas`` and maps each violation to the most
specific code the spec has for its location, remembering those locations (:class:`Located`) so
that the checks in code do not report them again (R-VERSION-13).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conformance.schemas import SchemaSet, SchemasUnavailable
from conformance.spec import path_problem
from conformance.store import Problem, VersionFiles, read_regular
from conformance.strictjson import StrictJsonError, loads_strict

if TYPE_CHECKING:
    from conformance.checker import Report

__all__ = ["JsonPath", "Located", "load_json", "same_json", "schema_check", "schema_version"]


JsonPath = tuple[str | int, ...]


class Located(Problem):
    """A problem at a JSON location of the manifest (``at``), for de-duplication.

    The schema pass reports some defects with their specific codes (an unknown dtype or codec,
    an unsafe path, ...) and the checks in code meet the same defects again; a problem whose
    location the schema pass already reported is not reported twice (R-VERSION-13).
    """

    def __init__(self, code: str, message: str, at: JsonPath) -> None:
        super().__init__(code, message)
        self.at = at


def _bad_path(keyword: str, instance: Any) -> bool:
    """A violation of the path definition: its pattern, length, or (errata 1) its ``not``."""
    return keyword in ("pattern", "maxLength") or (keyword == "not"
                                                   and path_problem(instance) is not None)


def _classify_schema_error(path: list[str | int], keyword: str, doc: Any,
                           instance: Any = None) -> str:
    """Map a schema violation to the most specific code the spec has for that location.

    The error table has specific codes for rules that the schemas also express (dtype enum,
    path patterns, box rank, lengths >= 1, ...); those take precedence over PCK-SCHEMA.
    ``instance`` is the value that failed (for a ``files`` key: the key).
    """
    if not path:
        return "PCK-SCHEMA"
    top = path[0]
    n = len(path)
    if top == "attempt_id":
        return "PCK-ATTEMPT-ID"
    if top == "tensor_table" and n == 2:
        if path[1] == "codec" and keyword in ("enum", "const"):
            return "PCK-CODEC"
        if path[1] == "file" and _bad_path(keyword, instance):
            return "PCK-PATH-UNSAFE"
    if top == "files":
        if n == 1 and _bad_path(keyword, instance):
            return "PCK-PATH-UNSAFE"
        if n == 3 and path[2] == "size" and keyword == "maximum":
            return "PCK-LIMIT"
    if top == "tensors" and n >= 3:
        if path[2] == "dtype" and keyword in ("enum", "const"):
            return "PCK-DTYPE-UNSUPPORTED"
        if path[2] == "shape" and keyword in ("maxItems", "maximum"):
            return "PCK-LIMIT"
        if path[2] == "ranges":
            if n == 3 and keyword == "minItems":
                return "PCK-COVERAGE-GAP"
            if n == 3 and keyword == "maxItems":
                t = doc.get("tensors", {}).get(path[1], {}) if isinstance(doc, dict) else {}
                shape = t.get("shape") if isinstance(t, dict) else None
                if isinstance(shape, list) and 0 in shape:
                    return "PCK-RANGE-BOUNDS"
                return "PCK-COVERAGE-OVERLAP"
            if n >= 5 and path[4] == "file" and _bad_path(keyword, instance):
                return "PCK-PATH-UNSAFE"
            if n >= 5 and path[4] == "codec" and keyword in ("enum", "const"):
                return "PCK-CODEC"
            if n >= 5 and path[4] in ("offsets", "lengths") and keyword == "maximum":
                return "PCK-LIMIT"
            if n >= 5 and path[4] in ("offsets", "lengths") and keyword in (
                    "maxItems", "minimum"):
                return "PCK-RANGE-BOUNDS"
    if top == "entries" and n >= 3:
        if path[2] == "values" and n == 3 and keyword == "minItems":
            return "PCK-ENTRY-MISSING"
        if n >= 5 and path[2] == "values" and path[4] == "file" and _bad_path(keyword,
                                                                               instance):
            return "PCK-PATH-UNSAFE"
        if path[2] == "schema" and n == 3:
            e = doc.get("entries", {}).get(path[1], {}) if isinstance(doc, dict) else {}
            sch = e.get("schema") if isinstance(e, dict) else None
            if isinstance(sch, dict) and set(sch) == {"id"} and isinstance(sch["id"], str):
                return "PCK-ENTRY-SCHEMA"
    return "PCK-SCHEMA"


def schema_version(doc: Any) -> str:
    """Which schema set a format document is validated against: ``"1.0"``, ``"1.1"``, ``"1.3"``.

    1.0 documents use the 1.0 schemas; 1.1 and 1.2 documents, and any document that has a
    ``tensor_table`` member (which R-TABLE-2 forbids in 1.0 and the 1.1 schema rejects there),
    use the 1.1 schemas, which extend the 1.0 ones; documents of 1.3 and later use the 1.3
    schemas, whose dtype list is longer (§7).
    """
    if not isinstance(doc, dict):
        return "1.0"
    fv = doc.get("format_version")
    m = re.fullmatch(r"1\.(0|[1-9][0-9]*)", fv) if isinstance(fv, str) else None
    if m is not None and (len(m.group(1)), m.group(1)) >= (1, "3"):
        return "1.3"
    if "tensor_table" in doc or (isinstance(fv, str) and fv.startswith("1.") and fv != "1.0"):
        return "1.1"
    return "1.0"


#: the documents that have schemas of later formats (spec/schemas/1.1/, spec/schemas/1.3/)
_SCHEMAS_1_1 = ("manifest", "writer-index")


def schema_check(schemas: SchemaSet, name: str, doc: Any, where: str,
                  report: Report, found: set[JsonPath] | None = None) -> bool:
    """Validate ``doc`` against ``<name>.schema.json``; return False on a generic violation.

    Integer members must be integer tokens (R-SEC-18: Draft 2020-12 calls 42.0 an integer, a
    format document does not; ``SchemaSet.validator(integer_tokens=True)``). ``found`` collects
    the locations reported with a specific code (a ``files`` key as ``("files", key)``), which
    the checks in code then do not report again.
    """
    version = schema_version(doc)
    if name == "verification":
        # Every verification record, of any version: the 1.2 schema is the 1.0 one plus the
        # rules of ``clears`` in records of 1.2 and later (spec §14.5, §19).
        version = "1.2"
    elif name not in _SCHEMAS_1_1:
        version = "1.0"  # drill, copy and pin records have no later schema of their own
    schema = schemas.document(name, version)
    label = f"{name}.schema.json" if version == "1.0" else f"{version}/{name}.schema.json"
    if schema is None:  # never after require_complete(): a check never skips validation
        raise SchemasUnavailable(f"{label} not found in {schemas.root}")
    validator = schemas.validator(schema, integer_tokens=True)
    generic = False
    n = 0
    for err in validator.iter_errors(doc):
        path = list(err.absolute_path)
        if name == "manifest" or (path and path[0] == "tensor_table"):
            code = _classify_schema_error(path, str(err.validator), doc, err.instance)
        elif name == "writer-index" and path[:1] == ["tensors"] and path[2:3] == ["dtype"]:
            # §7 (errata 14): a dtype not in the table, a writer index's included, is
            # PCK-DTYPE-UNSUPPORTED (a 1.0 index holding complex64 was PCK-SCHEMA here)
            code = _classify_schema_error(path, str(err.validator), doc, err.instance)
        else:
            code = "PCK-SCHEMA"
        generic |= code == "PCK-SCHEMA"
        if found is not None and code != "PCK-SCHEMA" and path:
            at: JsonPath = tuple(path)
            if at == ("files",) and isinstance(err.instance, str):
                at = ("files", err.instance)  # a key of files (its property name)
            found.add(at)
        loc = "/".join(str(p) for p in path) or "(root)"
        report.error(code, f"{where}: schema {label} violated at {loc}: "
                     f"{err.message[:300]}")
        n += 1
        if n >= 20:
            break
    return not generic


def same_json(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are the same JSON value: same types, member order free.

    ``true`` is not ``1`` and ``1`` is not ``1.0`` (Python's ``==`` says both are).
    """
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def load_json(vf: VersionFiles, rel: str, report: Report, *, max_bytes: int,
               verified: bool, path: Path | None = None) -> Any:
    """Read and strictly decode a JSON file; record problems; return None on failure.

    The size limit (R-SEC-11) is applied before the file is read: from its record when it is
    listed (``verified``: every block checked), otherwise from ``fstat`` of the descriptor. An
    unlisted file (``path``, or ``rel`` resolved) is opened without following a final
    symbolic link and without waiting on a FIFO; anything but a regular file is
    PCK-FILE-MISSING (R-SEC-16).
    """
    try:
        if verified:
            size = vf.records[rel].size
            if size > max_bytes:
                raise Problem("PCK-JSON-INVALID", f"{rel!r} is {size} bytes, larger than the "
                              f"limit of {max_bytes} (R-SEC-11)")
            data = vf.read(rel)
        else:
            data = read_regular(path if path is not None else vf.resolve(rel), repr(rel),
                                max_bytes=max_bytes, follow=False)
        return loads_strict(data, max_bytes=max_bytes)
    except Problem as exc:
        report.error(exc.code, f"{vf.vdir.name}/{rel}: {exc.message}")
    except StrictJsonError as exc:
        report.error("PCK-JSON-INVALID", f"{vf.vdir.name}/{rel}: {exc}")
    except OSError as exc:
        report.error("PCK-STORAGE", f"{vf.vdir.name}/{rel}: {exc}")
    return None
