"""Loading the normative JSON Schemas from ``spec/schemas`` (Draft 2020-12)."""

from __future__ import annotations

import json
import os
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

from conformance.regex import BadPattern, compiled, patterns_of
from conformance.spec import BUILTIN_SCHEMA_FILES

__all__ = ["DRAFT_2020_12", "REQUIRED_SCHEMAS", "SCHEMA_BASE_UNITS", "SCHEMA_UNITS_PER_VALUE",
           "BudgetExceeded", "OtherDialect", "SchemaSet", "SchemasUnavailable", "default_schema_dir",
           "json_values", "load_schemas", "without_dialect"]

#: The dialect of the spec's schemas and of every embedded schema (spec §12.1, §19.2).
DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"

#: the errata schemas (spec §19.1) that replace released files: without them the released
#: patterns (lookahead, ``\\uHHHH``) are outside the portable subset of §18.7.
ERRATA_SCHEMAS: tuple[str, ...] = ("errata/common.schema.json", "errata/copy.schema.json")
#: every schema file a check uses (relative to the schema directory): the documents of 1.0 to
#: 1.3 (manifest, writer index, drill, copy and verification records), what they refer to
#: (common definitions, the 1.1 table reference), the errata and the built-in entry schemas.
#: Without any of them a check would have to skip validation or fail half-way, so their absence
#: is a hard error (:class:`SchemasUnavailable`), never a warning or a traceback.
REQUIRED_SCHEMAS: tuple[str, ...] = (
    "common.schema.json", "manifest.schema.json", "writer-index.schema.json",
    "drill.schema.json", "copy.schema.json", "verification.schema.json", "pin.schema.json",
    "deletion.schema.json",
    "1.1/manifest.schema.json", "1.1/writer-index.schema.json", "1.1/table-ref.schema.json",
    "1.2/verification.schema.json", "1.3/common.schema.json", "1.3/manifest.schema.json",
    "1.3/writer-index.schema.json", *ERRATA_SCHEMAS, *BUILTIN_SCHEMA_FILES.values(),
)


class SchemasUnavailable(Exception):
    """The normative schemas are missing or incomplete: nothing can be checked."""


class OtherDialect(ValueError):
    """An embedded schema names a dialect other than Draft 2020-12 in a ``$schema``."""


def without_dialect(schema: Any) -> Any:
    """A copy of ``schema`` without its ``$schema`` keywords, each checked to be 2020-12.

    jsonschema evaluates a subschema that declares ``$schema`` — reached through a ``$ref``
    into a whole resource (``"#"``, ``../1.0/manifest.schema.json``) or any applicator — with
    its *stock* validator class for that dialect, silently dropping the integer-token type
    check and the RE2 ``pattern`` of this suite (spec §22). Only keyword positions count (the
    subschemas ``referencing`` walks): ``{"const": {"$schema": 1}}`` is a value.

    Raises:
        OtherDialect: a ``$schema`` that is not :data:`DRAFT_2020_12` (errata 6: such an
            embedded schema is unusable, R-ENTRY-3).

    """
    from referencing.jsonschema import DRAFT202012

    if not isinstance(schema, dict):
        return schema
    out = json.loads(json.dumps(schema))
    todo = [out]
    while todo:
        node = todo.pop()
        if "$schema" in node:
            if node["$schema"] != DRAFT_2020_12:
                raise OtherDialect(f"$schema {node['$schema']!r:.100} is not Draft 2020-12 "
                                   f"({DRAFT_2020_12!r})")
            del node["$schema"]
        todo.extend(sub for sub in DRAFT202012.subresources_of(node) if isinstance(sub, dict))
    return out


def default_schema_dir() -> Path:
    """Where the normative schemas are, in this order.

    ``$PCK_SPEC_SCHEMAS``; the copy an installed package carries (``conformance/_schemas``, put
    there from ``spec/schemas`` when the wheel is built); ``<repo>/spec/schemas`` next to this
    package in a checkout.
    """
    env = os.environ.get("PCK_SPEC_SCHEMAS")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent
    packaged = here / "_schemas"
    if packaged.is_dir():
        return packaged
    return here.parent / "spec" / "schemas"


class SchemaSet:
    """Every schema below a directory, addressable by file name and by ``$id``.

    A file ``errata/<rel>`` replaces ``<rel>`` (same ``$id``, spec §19.1): validators use the
    errata schemas, whose regular expressions are in the portable subset of §18.7.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.by_file: dict[str, dict[str, Any]] = {}
        self.by_id: dict[str, dict[str, Any]] = {}
        self.present: set[str] = set()  # files read, errata/ prefix kept
        self._problems: list[str] | None = None
        self._dialects: dict[str, str] = {}  # files that declare another dialect
        if root.is_dir():
            found = sorted(root.rglob("*.json"), key=lambda p: p.parts[len(root.parts)] == "errata")
            for p in found:
                try:
                    doc = json.loads(p.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    continue
                if not isinstance(doc, dict):
                    continue
                self.present.add(p.relative_to(root).as_posix())
                rel = p.relative_to(root).as_posix().removeprefix("errata/")
                try:
                    doc = without_dialect(doc)  # validators keep their class (spec §22)
                except Exception as exc:  # another dialect, or no schema at all
                    self._dialects[rel] = str(exc)[:200]
                self.by_file[rel] = doc
                sid = doc.get("$id")
                if isinstance(sid, str):
                    self.by_id[sid] = doc
        self._registry: Any = None
        self._validators: dict[tuple[int, bool, bool], Any] = {}

    def missing(self) -> list[str]:
        """The :data:`REQUIRED_SCHEMAS` this set lacks (or could not read as JSON objects)."""
        return [rel for rel in REQUIRED_SCHEMAS if rel not in self.present]

    def problems(self) -> list[str]:
        """Why the required schemas cannot be used, beyond a missing file (cached).

        Every pattern must be in the portable subset of §18.7 (a released pattern that an
        erratum replaces is not) and every ``$ref`` must resolve within the set; otherwise
        validation would stop half-way with an exception.
        """
        if self._problems is None:
            out: list[str] = []
            for rel in dict.fromkeys(r.removeprefix("errata/") for r in REQUIRED_SCHEMAS):
                doc = self.by_file.get(rel)  # an erratum in place of its released file
                if doc is None:
                    continue
                if rel in self._dialects:
                    out.append(f"{rel}: {self._dialects[rel]}")
                for pattern in patterns_of(doc):
                    try:
                        compiled(pattern)
                    except BadPattern as exc:
                        out.append(f"{rel}: pattern {pattern[:60]!r}: {exc}")
                out += [f"{rel}: {why}" for why in self._unresolved(doc)]
            self._problems = out
        return self._problems

    def _unresolved(self, doc: dict[str, Any]) -> list[str]:
        """The ``$ref`` values of ``doc`` that do not resolve within this set."""
        base = doc.get("$id") if isinstance(doc.get("$id"), str) else ""
        resolver = self.registry().resolver(base_uri=base)
        out, todo = [], [doc]
        while todo:
            node = todo.pop()
            if isinstance(node, dict):
                ref = node.get("$ref")
                if isinstance(ref, str):
                    try:
                        resolver.lookup(ref)
                    except Exception as exc:  # referencing's errors have no common base
                        out.append(f"$ref {ref!r} does not resolve ({type(exc).__name__})")
                todo.extend(node.values())
            elif isinstance(node, list):
                todo.extend(node)
        return out

    def require_complete(self) -> None:
        """Raise :class:`SchemasUnavailable` unless every required schema is present and usable."""
        missing = self.missing()
        if missing or not self.root.is_dir():
            where = "does not exist" if not self.root.is_dir() else f"lacks {', '.join(missing)}"
        elif self.problems():
            where = f"is incomplete or not the spec's ({'; '.join(self.problems()[:3])})"
        else:
            return
        raise SchemasUnavailable(
            f"schema directory {self.root} {where}: the normative schemas of spec/schemas are "
            "needed, errata/ and 1.1/ included (install the portable-ckpt-conformance package, "
            "which ships them, run from a checkout of the repository, or pass --schemas DIR / "
            "set $PCK_SPEC_SCHEMAS)")

    def validator(self, schema: dict[str, Any] | bool, *, metered: bool = False,
                  integer_tokens: bool = False) -> Any:
        """A (cached) Draft 2020-12 validator of ``schema`` resolving refs in this set only.

        Regular expressions run on RE2 with their ECMA-262 meaning (:mod:`conformance.regex`).
        ``metered``: every keyword charges the budget of :meth:`validate` (R-ENTRY-16).
        ``integer_tokens``: ``type: integer`` holds for integer tokens only, as in format
        documents and built-in entry schemas (R-SEC-18); otherwise 2020-12's ``1.0`` is one.
        ``schema`` must be free of ``$schema`` keywords (:func:`without_dialect`).
        """
        key = (id(schema), metered, integer_tokens)
        hit = self._validators.get(key)
        if hit is None or hit[0] is not schema:
            cls = _metered_validator_class(integer_tokens) if metered else \
                _re2_validator_class(integer_tokens)
            hit = (schema, cls(schema, registry=self.registry()))
            if len(self._validators) > 256:
                self._validators.clear()
            self._validators[key] = hit
        return hit[1]

    def registry(self) -> Any:
        """A ``referencing.Registry`` holding every schema (no remote retrieval)."""
        if self._registry is None:
            from referencing import Registry
            from referencing.jsonschema import DRAFT202012

            reg: Any = Registry()
            for rel, doc in self.by_file.items():
                res = DRAFT202012.create_resource(doc)  # its $schema was checked and dropped
                uri = doc.get("$id") if isinstance(doc.get("$id"), str) else rel
                reg = reg.with_resource(uri, res)
                if uri != rel:
                    reg = reg.with_resource(rel, res)
            self._registry = reg
        return self._registry

    def document(self, name: str, version: str = "1.0") -> dict[str, Any] | None:
        """Return the schema of a format document of a format version.

        ``("manifest", "1.0")`` is ``manifest.schema.json``; the 1.1 schemas live in ``1.1/``
        (``("manifest", "1.1")`` is ``1.1/manifest.schema.json``) and extend the 1.0 ones, as
        the 1.2 verification schema does; the 1.3 manifest and writer index restate them with
        the longer dtype list.
        """
        if version == "1.0":
            return self.by_file.get(f"{name}.schema.json")
        return self.by_file.get(f"{version}/{name}.schema.json")

    def entry_schema(self, schema_id: str) -> dict[str, Any] | None:
        """Return the builtin entry schema with ``schema_id`` (e.g. ``pck:rng/1``), or None."""
        doc = self.by_id.get(schema_id)
        if doc is not None:
            return doc
        # Fall back to a file-name convention: pck:rng/1 -> entries/rng-1.schema.json (or .1).
        if schema_id.startswith("pck:") and "/" in schema_id:
            base, ver = schema_id[4:].rsplit("/", 1)
            for cand in (f"entries/{base}-{ver}.schema.json", f"entries/{base}.{ver}.schema.json",
                         f"entries/{base}.schema.json", f"entries/{base}-v{ver}.schema.json"):
                if cand in self.by_file:
                    return self.by_file[cand]
        return None

    def validate(self, schema: dict[str, Any], instance: Any, *, limit: int = 20,
                 budget: int | None = None, integer_tokens: bool = False) -> list[str]:
        """Validate ``instance`` and return up to ``limit`` error messages (empty when valid).

        With ``budget``, validation stops with :class:`BudgetExceeded` after that many units
        (keywords applied, members walked, type checks; R-ENTRY-16). ``integer_tokens``: see
        :meth:`validator`.
        """
        validator = self.validator(schema, metered=budget is not None,
                                   integer_tokens=integer_tokens)
        out: list[str] = []
        _UNITS.left = budget
        try:
            for err in validator.iter_errors(instance):
                loc = "/".join(str(p) for p in err.absolute_path) or "(root)"
                out.append(f"at {loc}: {err.message[:300]}")
                if len(out) >= limit:
                    break
        finally:
            _UNITS.left = None
        return out


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    from jsonschema import ValidationError

    if validator.is_type(instance, "string") and not compiled(pattern).search(instance):
        yield ValidationError(f"{instance[:80]!r} does not match {pattern[:80]!r}")


def _pattern_properties(validator: Any, patterns: dict[str, Any], instance: Any,
                        schema: Any) -> Any:
    if validator.is_type(instance, "object"):
        for pattern, sub in patterns.items():
            rx = compiled(pattern)
            for k, v in instance.items():
                if rx.search(k):
                    yield from validator.descend(v, sub, path=k, schema_path=pattern)


def _additional_properties(validator: Any, extra: Any, instance: Any, schema: Any) -> Any:
    from jsonschema import ValidationError

    if not validator.is_type(instance, "object"):
        return
    named = schema.get("properties", {})
    rxs = [compiled(p) for p in schema.get("patternProperties", {})]
    rest = [k for k in instance if k not in named and not any(r.search(k) for r in rxs)]
    if validator.is_type(extra, "object"):
        for k in rest:
            yield from validator.descend(instance[k], extra, path=k)
    elif extra is False and rest:
        yield ValidationError(f"additional properties are not allowed: {rest[:5]!r}")


def _key(v: Any) -> Any:
    """A hashable stand-in with JSON Schema equality (1 == 1.0, true != 1, key order free)."""
    if isinstance(v, bool) or v is None:
        return ("lit", v)
    if isinstance(v, (int, float)):
        return ("num", int(v) if isinstance(v, float) and v.is_integer() else v)
    if isinstance(v, str):
        return ("str", v)
    if isinstance(v, list):
        return ("arr", tuple(_key(x) for x in v))
    return ("obj", frozenset((k, _key(x)) for k, x in v.items()))


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Any:
    from jsonschema import ValidationError

    if unique and validator.is_type(instance, "array"):
        keys = [_key(x) for x in instance]
        if len(set(keys)) != len(keys):  # hashing: linear, where pairwise compares are n^2
            yield ValidationError("array items are not unique")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@lru_cache(maxsize=2)
def _re2_validator_class(integer_tokens: bool = False) -> Any:
    """Draft 2020-12 with patterns on RE2 and ``uniqueItems`` by hashing (R-ENTRY-15).

    ``integer_tokens``: a float is no integer, whatever its value (R-SEC-18).
    """
    from jsonschema import Draft202012Validator, validators

    types = Draft202012Validator.TYPE_CHECKER
    if integer_tokens:
        types = types.redefine("integer", lambda _checker, v: _is_int(v))
    return validators.extend(Draft202012Validator, {
        "pattern": _pattern, "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties, "uniqueItems": _unique_items,
        "anyOf": _any_of, "oneOf": _one_of},
        type_checker=types)


def _first(validator: Any, instance: Any, sub: Any, index: int) -> Any:
    """The first error of ``instance`` under ``sub`` (``None``: valid), not all of them."""
    return next(iter(validator.descend(instance, sub, schema_path=index)), None)


def _any_of(validator: Any, any_of: Any, instance: Any, schema: Any) -> Any:
    # jsonschema's anyOf and oneOf list every error of each branch: a 4 MB manifest whose
    # oneOf branch holds a million-item array took 33 s and 3.5 GB (attack review 12b, B4).
    # Validity needs one error per branch; the report keeps that one as the branch's context.
    from jsonschema import ValidationError

    context = []
    for index, sub in enumerate(any_of):
        err = _first(validator, instance, sub, index)
        if err is None:
            return
        context.append(err)
    yield ValidationError(f"{json.dumps(instance)[:80]} is not valid under any of the given "
                          "schemas", context=context)


def _one_of(validator: Any, one_of: Any, instance: Any, schema: Any) -> Any:
    from jsonschema import ValidationError

    context, valid = [], []
    for index, sub in enumerate(one_of):
        err = _first(validator, instance, sub, index)
        if err is None:
            valid.append(index)
        else:
            context.append(err)
    if not valid:
        yield ValidationError(f"{json.dumps(instance)[:80]} is not valid under any of the "
                              "given schemas", context=context)
    elif len(valid) > 1:
        yield ValidationError(f"{json.dumps(instance)[:80]} is valid under each of the "
                              f"schemas {valid}")


# -- the validation budget of entry values (R-ENTRY-16) -------------------------------------
#: Units one entry value's validation may spend: BASE + PER_VALUE x its JSON values.
SCHEMA_BASE_UNITS = 2**18
SCHEMA_UNITS_PER_VALUE = 8
_REF_UNITS = 32
#: Characters of error message one unit pays for: jsonschema writes the instance's repr into
#: every error, and anyOf/oneOf keep their branches' errors (unmetered, a $ref fan-out against
#: a 5,000-item array formatted ~100 MB of messages within its unit budget).
_ERROR_CHARS_PER_UNIT = 16


class BudgetExceeded(Exception):
    """Validating the value would spend more than its budget of keyword evaluations."""


class _Units(threading.local):
    left: int | None = None


_UNITS = _Units()


def _charge(n: int) -> None:
    if _UNITS.left is not None:
        _UNITS.left -= n
        if _UNITS.left < 0:
            raise BudgetExceeded


def _metered(keyword: str, fn: Any) -> Any:
    def run(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        if keyword in ("$ref", "$dynamicRef"):
            cost = _REF_UNITS
        else:
            cost = 1 + (len(value) if isinstance(value, (list, dict)) and keyword not in
                        ("enum", "const") else 0)
            if isinstance(instance, (list, dict)):
                cost += len(instance)
        _charge(cost)
        for err in fn(validator, value, instance, schema) or ():
            if not getattr(err, "_pck_charged", False):  # charged once, where it is made
                err._pck_charged = True
                _charge(1 + len(err.message) // _ERROR_CHARS_PER_UNIT)
            yield err
    return run


def json_values(v: Any) -> int:
    """JSON values of a decoded value, containers and scalars alike (R-SEC-15)."""
    n, todo = 0, [v]
    while todo:
        x = todo.pop()
        n += 1
        todo.extend(x.values() if isinstance(x, dict) else x if isinstance(x, list) else ())
    return n


def _enum(validator: Any, enums: Any, instance: Any, schema: Any) -> Any:
    from jsonschema import ValidationError

    _charge(json_values(instance))
    if not isinstance(enums, list) or _key(instance) not in _enum_keys(enums):
        yield ValidationError(f"{instance!r:.80} is not one of the enumerated values")


_ENUMS: dict[int, tuple[list[Any], frozenset[Any]]] = {}


def _enum_keys(enums: list[Any]) -> frozenset[Any]:
    hit = _ENUMS.get(id(enums))
    if hit is None or hit[0] is not enums:  # the list is kept alive with its set
        if len(_ENUMS) > 1024:
            _ENUMS.clear()
        _charge(json_values(enums))
        hit = _ENUMS[id(enums)] = (enums, frozenset(_key(v) for v in enums))
    return hit[1]


def _const(validator: Any, const: Any, instance: Any, schema: Any) -> Any:
    from jsonschema import ValidationError

    _charge(json_values(instance) + json_values(const))
    if _key(instance) != _key(const):
        yield ValidationError(f"{instance!r:.80} is not the constant")


def _ok(validator: Any, instance: Any, schema: Any) -> bool:
    return next(iter(validator.descend(instance, schema)), None) is None


def _refs(validator: Any, schema: dict[str, Any]) -> list[tuple[Any, Any]]:
    out = []
    for kw in ("$ref", "$dynamicRef"):
        if isinstance(schema.get(kw), str):
            _charge(_REF_UNITS)
            res = validator._resolver.lookup(schema[kw])
            out.append((validator.evolve(schema=res.contents, _resolver=res.resolver),
                        res.contents))
    return out


def _seen_names(validator: Any, instance: dict[str, Any], schema: Any) -> set[str]:
    """Names ``schema`` evaluates (for ``unevaluatedProperties``): RE2 patterns, charged."""
    _charge(1 + len(instance))
    if not isinstance(schema, dict):
        return set()
    out: set[str] = set()
    for sub, target in _refs(validator, schema):
        out |= _seen_names(sub, instance, target)
    if isinstance(schema.get("properties"), dict):
        out |= schema["properties"].keys() & instance.keys()
    for kw in ("additionalProperties", "unevaluatedProperties"):
        if kw in schema:
            out |= {k for k, v in instance.items() if _ok(validator, v, schema[kw])}
    pats = schema.get("patternProperties")
    for p in pats if isinstance(pats, dict) else ():
        out |= {k for k in instance if compiled(p).search(k)}
    deps = schema.get("dependentSchemas")
    for name, sub in deps.items() if isinstance(deps, dict) else ():
        if name in instance:
            out |= _seen_names(validator, instance, sub)
    for kw in ("allOf", "oneOf", "anyOf"):
        for sub in schema.get(kw, []):
            if _ok(validator, instance, sub):
                out |= _seen_names(validator, instance, sub)
    if "if" in schema:
        taken = _ok(validator, instance, schema["if"])
        if taken:
            out |= _seen_names(validator, instance, schema["if"])
        out |= _seen_names(validator, instance, schema.get("then" if taken else "else", True))
    return out


def _seen_items(validator: Any, instance: list[Any], schema: Any) -> set[int]:
    """Indexes ``schema`` evaluates (for ``unevaluatedItems``), as a set, charged."""
    _charge(1 + len(instance))
    if not isinstance(schema, dict):
        return set()
    if "items" in schema:
        return set(range(len(instance)))
    out: set[int] = set()
    for sub, target in _refs(validator, schema):
        out |= _seen_items(sub, instance, target)
    if isinstance(schema.get("prefixItems"), list):
        out |= set(range(min(len(instance), len(schema["prefixItems"]))))
    if "if" in schema:
        taken = _ok(validator, instance, schema["if"])
        if taken:
            out |= _seen_items(validator, instance, schema["if"])
        out |= _seen_items(validator, instance, schema.get("then" if taken else "else", True))
    for kw in ("contains", "unevaluatedItems"):
        if kw in schema:
            out |= {i for i, v in enumerate(instance) if _ok(validator, v, schema[kw])}
    for kw in ("allOf", "oneOf", "anyOf"):
        for sub in schema.get(kw, []):
            if _ok(validator, instance, sub):
                out |= _seen_items(validator, instance, sub)
    return out


def _unevaluated_properties(validator: Any, rest: Any, instance: Any, schema: Any) -> Any:
    from jsonschema import ValidationError

    if validator.is_type(instance, "object"):
        seen = _seen_names(validator, instance, schema)
        bad = [k for k in instance if k not in seen and not _ok(validator, instance[k], rest)]
        if bad:
            yield ValidationError(f"unevaluated properties are not allowed: {sorted(bad)[:5]!r}")


def _unevaluated_items(validator: Any, rest: Any, instance: Any, schema: Any) -> Any:
    from jsonschema import ValidationError

    if validator.is_type(instance, "array"):
        seen = _seen_items(validator, instance, schema)
        if any(i not in seen and not _ok(validator, v, rest) for i, v in enumerate(instance)):
            yield ValidationError("unevaluated items are not allowed")


@lru_cache(maxsize=2)
def _metered_validator_class(integer_tokens: bool = False) -> Any:
    """:func:`_re2_validator_class`, every keyword and type check charged (R-ENTRY-16).

    ``enum`` and ``const`` compare hashed forms; ``unevaluated*`` collect what was evaluated
    as sets, with RE2 patterns (jsonschema's helpers use ``re`` and list lookups).
    """
    from jsonschema import validators

    base = _re2_validator_class(integer_tokens)
    kws = {**base.VALIDATORS, "enum": _enum, "const": _const,
           "unevaluatedProperties": _unevaluated_properties,
           "unevaluatedItems": _unevaluated_items}
    types = base.TYPE_CHECKER

    def typed(name: str) -> Any:
        def check(_checker: Any, instance: Any) -> bool:
            _charge(1)
            return bool(types.is_type(instance, name))
        return check

    names = ("array", "boolean", "integer", "null", "number", "object", "string")
    return validators.extend(base, {k: _metered(k, f) for k, f in kws.items()},
                             type_checker=types.redefine_many({n: typed(n) for n in names}))


@lru_cache(maxsize=4)
def load_schemas(root: str | None = None) -> SchemaSet:
    """Load (and cache) the schema set below ``root`` or the default directory."""
    return SchemaSet(Path(root) if root else default_schema_dir())
