"""The version checker's checks of entries (§12).

Each declaration, its values per scope, and each value strictly decoded and valid against its
declared schema.
"""

from __future__ import annotations

import itertools
from typing import Any

from conformance._check_base import CheckerBase, is_int
from conformance.documents import Located
from conformance.regex import BadPattern, compiled, patterns_of
from conformance.schemas import (
    SCHEMA_BASE_UNITS,
    SCHEMA_UNITS_PER_VALUE,
    BudgetExceeded,
    OtherDialect,
    json_values,
    without_dialect,
)
from conformance.spec import (
    BUILTIN_SCHEMA_FILES,
    BUILTIN_SCHEMA_IDS,
    has_control_chars,
    path_problem,
)
from conformance.store import Problem, zstd_decode
from conformance.strictjson import MAX_VALUES, StrictJsonError, loads_strict

__all__ = ["ENTRY_MAX_BYTES", "EntryChecks"]

ENTRY_MAX_BYTES = 64 << 20


class EntryChecks(CheckerBase):
    """Entries: declarations, values per scope, and each value against its schema."""

    def check_entry(self, name: str, e: Any, ws: int | None, step: Any) -> None:
        """Entry ``name``: its declaration, values per scope, and each value's file (§12)."""
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
            if not all(is_int(r) and r >= 0 for r in ranks):
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
                units = SCHEMA_BASE_UNITS + SCHEMA_UNITS_PER_VALUE * json_values(value)
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
        """The schema an entry declares, and its builtin id (None for an embedded schema)."""
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
