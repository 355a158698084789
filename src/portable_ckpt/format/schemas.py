"""The JSON Schemas of the format (``spec/schemas``, the authority) and entry-value validation."""

from __future__ import annotations

import functools
import itertools
import json
import threading
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource
from referencing.jsonschema import DRAFT202012

from portable_ckpt.errors import EntrySchemaError, JsonInvalidError, SchemaError
from portable_ckpt.format import jsonio
from portable_ckpt.format._schema_inline import NotInlinable, inline_refs
from portable_ckpt.format.regex import PatternError, compile_pattern, schema_patterns

__all__ = [
    "BUILTIN_ENTRY_SCHEMA_FILES",
    "schema_dir",
    "validate_document",
    "validate_entry_value",
]

#: Built-in schema id → file under ``schemas/entries``.
BUILTIN_ENTRY_SCHEMA_FILES = {
    "pck:step/1": "step.schema.json",
    "pck:lr-scheduler/1": "lr-scheduler.schema.json",
    "pck:grad-scaler/1": "grad-scaler.schema.json",
    "pck:rng/1": "rng.schema.json",
    "pck:data-position/1": "data-position.schema.json",
    "pck:json/1": "json.schema.json",
}


#: Errata schemas (spec §19.1): ``errata/<rel>`` replaces ``<rel>``, with the same ``$id``.
ERRATA_DIR = "errata"
#: The only dialect of the format's schemas and of embedded schemas (spec §12.1, §19.2).
DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"


def schema_dir() -> Path:
    """Directory holding the JSON Schemas (the packaged copy of ``spec/schemas``)."""
    pkg = resources.files("portable_ckpt.format") / "schemas"
    return Path(str(pkg))


@functools.cache
def _load(rel: str) -> dict[str, Any]:
    # A released schema with an erratum is read from its errata file (R-VERSION-11).
    errata = schema_dir() / ERRATA_DIR / rel
    with open(errata if errata.is_file() else schema_dir() / rel, encoding="utf-8") as f:
        doc: dict[str, Any] = json.load(f)
    # Every schema of the spec is Draft 2020-12. Without its ``$schema`` a ``$ref`` into it
    # (``../1.0/manifest.schema.json``, lr-scheduler's ``#``) keeps this module's validator
    # class; with it, jsonschema switches to its stock class (spec §22, errata 6).
    if doc.pop("$schema", DRAFT_2020_12) != DRAFT_2020_12:
        raise RuntimeError(f"schema {rel} is not a Draft 2020-12 schema")
    return doc


@functools.cache
def _by_id() -> dict[str, str]:
    """``$id`` → schema file, for the released schemas (errata files share their ``$id``)."""
    root = schema_dir()
    rels = (p.relative_to(root).as_posix() for p in sorted(root.rglob("*.json")))
    return {_load(rel)["$id"]: rel for rel in rels if not rel.startswith(f"{ERRATA_DIR}/")}


def _no_remote(uri: str) -> Resource[Any]:
    # Schemas are resolved from the packaged files only; nothing is ever fetched.
    rel = _by_id().get(uri)
    if rel is None:
        raise NoSuchResource(uri)
    return DRAFT202012.create_resource(_load(rel))


@functools.cache
def _registry() -> Registry[Any]:
    # Every packaged schema, crawled once: a registry that retrieves on demand crawled the
    # schema again at each ``$ref`` of each validation (a listing validated every drill and
    # verification record at 5-9 ms each; soak review F2).
    known = [(uri, DRAFT202012.create_resource(_load(rel))) for uri, rel in _by_id().items()]
    return Registry(retrieve=_no_remote).with_resources(known).crawl()  # type: ignore[call-arg]


@functools.cache
def _validator(rel: str) -> jsonschema.protocols.Validator:
    # The spec's own schemas run on the same RE2-based validator as embedded ones (§18.7), with
    # integers as integer tokens (R-SEC-18: 4.0 is no integer in a format document).
    v: jsonschema.protocols.Validator = _DocumentValidator(_load(rel), registry=_registry())
    return v


def _integer_token(checker: Any, instance: Any) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


@functools.cache
def _inlined_validator(rel: str) -> jsonschema.protocols.Validator | None:
    """The document validator of ``rel`` on its references resolved once (None if it cannot be).

    The same keywords unmetered (the meter runs only for entry values): a listing validates
    every record of every version, and resolving each ``$ref`` at each use was most of it.
    """
    try:
        schema = inline_refs(_load(rel), _registry())
    except NotInlinable:
        return None
    v: jsonschema.protocols.Validator = _PlainDocumentValidator(schema, registry=Registry())
    return v


def validate_document(doc: Any, schema_file: str, *, what: str) -> None:
    """Validate a format document against ``schemas/<schema_file>`` (``SchemaError`` if not)."""
    fast = _inlined_validator(schema_file) if _METER.left is None else None
    if fast is not None and fast.is_valid(doc):
        return
    # Invalid (or not inlinable): the referencing validator decides and names the error, with
    # the schema paths and messages it always gave.
    v = _validator(schema_file)
    if v.is_valid(doc):
        return
    err = _first_errors(v, doc)
    if err is not None:
        loc = "/".join(str(p) for p in err.absolute_path) or "top level"
        raise SchemaError(f"{what}: {loc}: {err.message[:300]}", path=what)


#: Errors of an invalid document looked at for the one reported.
ERRORS_SEEN = 16


def _first_errors(v: Any, doc: Any) -> Any:
    """The most relevant of the first :data:`ERRORS_SEEN` errors of ``doc`` (or ``None``).

    Not all of them: jsonschema builds an error object per failing array item, and choosing
    among two million made turning away a 4 MB record take 100 s (attack review 12, A1).
    """
    return jsonschema.exceptions.best_match(itertools.islice(v.iter_errors(doc), ERRORS_SEEN))


# -- Embedded schemas come from the checkpoint: hostile input. Regular expressions run on RE2
# (linear time, no catastrophic backtracking) with their ECMA-262 meaning (format/regex.py), and
# uniqueItems is a hash-set check, not O(n^2).


def _re2(pattern: str) -> Any:
    try:
        return compile_pattern(pattern)
    except PatternError as exc:
        raise EntrySchemaError(
            f"schema pattern {pattern[:80]!r} is outside the portable subset of ECMA-262 and "
            f"RE2 (spec §18.7: no lookaround, backreferences or RE2-only syntax): {exc}"
        ) from None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    if validator.is_type(instance, "string") and not _re2(pattern).search(instance):
        yield jsonschema.ValidationError(f"{instance[:80]!r} does not match {pattern[:80]!r}")


def _pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, schema: Any
) -> Any:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        rx = _re2(pattern)
        for k, v in instance.items():
            if rx.search(k):
                yield from validator.descend(v, subschema, path=k, schema_path=pattern)


def _additional_properties(validator: Any, aP: Any, instance: Any, schema: Any) -> Any:
    if not validator.is_type(instance, "object"):
        return
    props = schema.get("properties", {})
    rxs = [_re2(p) for p in schema.get("patternProperties", {})]
    extras = [k for k in instance if k not in props and not any(rx.search(k) for rx in rxs)]
    if validator.is_type(aP, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], aP, path=extra)
    elif not aP and extras:
        yield jsonschema.ValidationError(
            f"additional properties are not allowed ({', '.join(map(repr, extras[:5]))})"
        )


def _canonical(value: Any) -> Any:
    # JSON Schema equality: 1 == 1.0, but true != 1; object member order does not matter.
    _spend(1)
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return (type(value).__name__, value)
    if isinstance(value, int | float):
        return ("num", float(value) if not float(value).is_integer() else int(value))
    if isinstance(value, list):
        return ("list", tuple(_canonical(v) for v in value))
    return ("obj", tuple(sorted((k, _canonical(v)) for k, v in value.items())))


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Any:
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[Any] = set()
    for item in instance:
        key = _canonical(item)
        if key in seen:
            yield jsonschema.ValidationError("array has non-unique elements")
            return
        seen.add(key)


# -- The validation budget (R-ENTRY-16): every keyword applied to a value costs one unit plus
# the members it walks, so no schema makes validation super-linear ($ref chains that fan out,
# an enum of n values against n items, ...). The count is deterministic, not a clock.

#: Units one validation may spend: ``SCHEMA_BASE_UNITS + SCHEMA_UNITS_PER_VALUE * values``.
SCHEMA_BASE_UNITS = 1 << 18
SCHEMA_UNITS_PER_VALUE = 8
#: Units of following one ``$ref`` (resolving it costs tens of plain keywords).
REF_UNITS = 32
#: Characters of error message one unit pays for. jsonschema's keywords write the instance's
#: ``repr`` into every error (each failing branch of an ``anyOf`` against a 5,000-item array
#: formats 20 KB, and ``anyOf``/``oneOf`` keep their branches' errors): unmetered, a ``$ref``
#: fan-out over such a value took 6.6 s and 230 MiB within its unit budget.
ERROR_CHARS_PER_UNIT = 16


class _OverBudget(Exception):
    """The validation spent its budget (reported as PCK-ENTRY-SCHEMA)."""


class _Meter(threading.local):
    left: int | None = None


_METER = _Meter()


def _spend(units: int) -> None:
    left = _METER.left
    if left is not None:
        _METER.left = left - units
        if left < units:
            raise _OverBudget


#: Keywords that walk the members of the instance they are applied to.
_WALKS_INSTANCE = frozenset({
    "items", "prefixItems", "contains", "additionalProperties", "patternProperties",
    "propertyNames", "unevaluatedItems", "unevaluatedProperties", "uniqueItems",
})


def _metered(keyword: str, fn: Any) -> Any:
    """``fn`` (a keyword of the validator) charging its units before it runs."""

    def run(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        units = 1 + (len(value) if isinstance(value, list | dict) else 0)
        if keyword in ("$ref", "$dynamicRef"):
            units = REF_UNITS
        elif keyword in ("enum", "const"):
            units = 1  # hashed: _canonical charges the instance's values
        if keyword in _WALKS_INSTANCE and isinstance(instance, list | dict):
            per = 1 + len(value) if keyword == "patternProperties" else 1
            units += len(instance) * per
        _spend(units)
        errors = fn(validator, value, instance, schema)
        for err in errors if errors is not None else ():
            _charge_error(err)
            yield err

    return run


def _charge_error(err: Any) -> None:
    """Charge an error's message once, where it is made (enclosing keywords re-yield it)."""
    if not getattr(err, "_pck_charged", False):
        err._pck_charged = True
        _spend(1 + len(err.message) // ERROR_CHARS_PER_UNIT)


def _enum(validator: Any, enums: Any, instance: Any, schema: Any) -> Any:
    # A set of canonical forms: one lookup per value, not one comparison per enum member.
    if not isinstance(enums, list) or _canonical(instance) not in _canonical_set(enums):
        yield jsonschema.ValidationError(
            f"{json.dumps(instance)[:80]} is not one of the allowed values"
        )


#: id(enum list) -> (the list, its canonical set); the cached validators keep the lists alive.
_ENUM_SETS: dict[int, tuple[list[Any], frozenset[Any]]] = {}


def _canonical_set(enums: list[Any]) -> frozenset[Any]:
    hit = _ENUM_SETS.get(id(enums))
    if hit is None or hit[0] is not enums:
        if len(_ENUM_SETS) > 4096:
            _ENUM_SETS.clear()
        hit = _ENUM_SETS[id(enums)] = (enums, frozenset(_canonical(v) for v in enums))
    return hit[1]


def _const(validator: Any, const: Any, instance: Any, schema: Any) -> Any:
    if _canonical(instance) != _canonical(const):
        yield jsonschema.ValidationError(f"{json.dumps(instance)[:80]} is not the constant value")


def _unevaluated_properties(validator: Any, uP: Any, instance: Any, schema: Any) -> Any:
    """The ``unevaluatedProperties`` keyword, names found by :func:`_evaluated_keys`."""
    if not validator.is_type(instance, "object"):
        return
    seen = _evaluated_keys(validator, instance, schema)
    extra = [
        k for k in instance
        if k not in seen and any(True for _ in validator.descend(instance[k], uP, path=k))
    ]
    if extra:
        yield jsonschema.ValidationError(
            f"unevaluated properties are not allowed ({', '.join(map(repr, sorted(extra)[:5]))})"
        )


def _evaluated_keys(validator: Any, instance: dict[str, Any], schema: Any) -> set[str]:
    """Member names that ``schema`` evaluates (jsonschema's rule, RE2 patterns, metered).

    jsonschema's own helper matches ``patternProperties`` with the backtracking ``re`` module,
    which R-ENTRY-15 forbids for embedded schemas.
    """
    _spend(1 + len(instance))
    if not isinstance(schema, dict):
        return set()
    keys: set[str] = set()
    for sub, target in _followed_refs(validator, schema):
        keys |= _evaluated_keys(sub, instance, target)
    if isinstance(schema.get("properties"), dict):
        keys |= schema["properties"].keys() & instance.keys()
    for kw in ("additionalProperties", "unevaluatedProperties"):
        if kw in schema:
            keys |= {k for k, v in instance.items() if _valid(validator, v, schema[kw])}
    patterns = schema.get("patternProperties")
    for pattern in patterns if isinstance(patterns, dict) else ():
        keys |= {k for k in instance if _re2(pattern).search(k)}
    deps = schema.get("dependentSchemas")
    for prop, sub in deps.items() if isinstance(deps, dict) else ():
        if prop in instance:
            keys |= _evaluated_keys(validator, instance, sub)
    for kw in ("allOf", "oneOf", "anyOf"):
        for sub in schema.get(kw, []):
            if _valid(validator, instance, sub):
                keys |= _evaluated_keys(validator, instance, sub)
    if "if" in schema:
        branch = "then" if _valid(validator, instance, schema["if"]) else "else"
        if branch == "then":
            keys |= _evaluated_keys(validator, instance, schema["if"])
        keys |= _evaluated_keys(validator, instance, schema.get(branch, True))
    return keys


def _followed_refs(validator: Any, schema: dict[str, Any]) -> list[tuple[Any, Any]]:
    """(validator, schema) of the ``$ref`` and ``$dynamicRef`` targets of ``schema``."""
    out = []
    for kw in ("$ref", "$dynamicRef"):
        if isinstance(schema.get(kw), str):
            _spend(REF_UNITS)
            resolved = validator._resolver.lookup(schema[kw])
            sub = validator.evolve(schema=resolved.contents, _resolver=resolved.resolver)
            out.append((sub, resolved.contents))
    return out


def _unevaluated_items(validator: Any, uI: Any, instance: Any, schema: Any) -> Any:
    """The ``unevaluatedItems`` keyword, indexes found by :func:`_evaluated_items`."""
    if not validator.is_type(instance, "array"):
        return
    seen = _evaluated_items(validator, instance, schema)
    if any(i not in seen for i in range(len(instance))):
        yield jsonschema.ValidationError("unevaluated items are not allowed")


def _evaluated_items(validator: Any, instance: list[Any], schema: Any) -> set[int]:
    """Item indexes that ``schema`` evaluates (jsonschema's rule, as a set, metered)."""
    _spend(1 + len(instance))
    if not isinstance(schema, dict):
        return set()
    if "items" in schema:
        return set(range(len(instance)))
    seen: set[int] = set()
    for sub, target in _followed_refs(validator, schema):
        seen |= _evaluated_items(sub, instance, target)
    if isinstance(schema.get("prefixItems"), list):
        seen |= set(range(min(len(instance), len(schema["prefixItems"]))))
    if "if" in schema:
        branch = "then" if _valid(validator, instance, schema["if"]) else "else"
        if branch == "then":
            seen |= _evaluated_items(validator, instance, schema["if"])
        seen |= _evaluated_items(validator, instance, schema.get(branch, True))
    for kw in ("contains", "unevaluatedItems"):
        if kw in schema:
            seen |= {i for i, v in enumerate(instance) if _valid(validator, v, schema[kw])}
    for kw in ("allOf", "oneOf", "anyOf"):
        for sub in schema.get(kw, []):
            if _valid(validator, instance, sub):
                seen |= _evaluated_items(validator, instance, sub)
    return seen


def _valid(validator: Any, instance: Any, schema: Any) -> bool:
    return next(iter(validator.descend(instance, schema)), None) is None


def _metered_types() -> Any:
    """The Draft 2020-12 type checks, each metered (jsonschema's helpers recurse through them)."""
    base = jsonschema.Draft202012Validator.TYPE_CHECKER
    names = ("array", "boolean", "integer", "null", "number", "object", "string")

    def check(name: str) -> Any:
        def is_type(checker: Any, instance: Any) -> bool:
            _spend(1)
            return bool(base.is_type(instance, name))

        return is_type

    return base.redefine_many({n: check(n) for n in names})


#: The keywords this module implements itself (RE2 patterns, hashed enum, set-based checks).
_OWN_KEYWORDS: dict[str, Any] = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "uniqueItems": _unique_items,
    "enum": _enum,
    "const": _const,
    "unevaluatedProperties": _unevaluated_properties,
    "unevaluatedItems": _unevaluated_items,
}

_SafeValidator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    {
        k: _metered(k, fn)
        for k, fn in {**jsonschema.Draft202012Validator.VALIDATORS, **_OWN_KEYWORDS}.items()
    },
    type_checker=_metered_types(),
)

#: The validator of the spec's own documents: ``type: integer`` means an integer token.
_DocumentValidator = jsonschema.validators.extend(
    _SafeValidator,
    type_checker=_SafeValidator.TYPE_CHECKER.redefine("integer", _integer_token),
)

#: The same keywords as :data:`_DocumentValidator`, without the meter's wrappers.
_PlainDocumentValidator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    _OWN_KEYWORDS,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _integer_token),
)


def _refuse_remote_refs(schema: Any) -> None:
    """Refuse any non-local ``$ref``/``$dynamicRef``, evaluated or not: nothing is fetched."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                if k in ("$ref", "$dynamicRef") and not (isinstance(v, str) and v.startswith("#")):
                    raise EntrySchemaError(
                        f"embedded schema refers to {v!r:.80}; only local references ('#...') "
                        "are allowed (nothing is fetched)"
                    )
                stack.append(v)
        elif isinstance(node, list):
            stack.extend(node)


def _drop_dialect(schema: Any) -> None:
    """Remove the ``$schema`` keywords of ``schema`` (a fresh parse), each checked first.

    Every ``$schema`` of an embedded schema — of its root or of a subschema — must be
    :data:`DRAFT_2020_12` (R-ENTRY-3, spec §12.1; errata 6): another dialect is
    PCK-ENTRY-SCHEMA. They are then dropped, because jsonschema evaluates a subschema that
    declares ``$schema`` (reached through ``$ref: "#"`` or any applicator) with its stock
    validator class: Python's backtracking ``re`` for patterns, no budget (spec §22).
    Only keyword positions count (``referencing`` walks the subschemas): ``{"const":
    {"$schema": 1}}`` is a value.
    """
    stack = [schema] if isinstance(schema, dict) else []
    while stack:
        node = stack.pop()
        if "$schema" in node:
            if node["$schema"] != DRAFT_2020_12:
                raise EntrySchemaError(
                    f"embedded schemas use JSON Schema Draft 2020-12 ({DRAFT_2020_12!r}), "
                    f"not {node['$schema']!r:.100} (spec §12.1)"
                )
            del node["$schema"]
        stack.extend(sub for sub in DRAFT202012.subresources_of(node) if isinstance(sub, dict))


@functools.cache
def _embedded_validator(schema_json: str) -> jsonschema.protocols.Validator:
    schema = json.loads(schema_json)  # a fresh parse: _drop_dialect edits it below
    # The meta-schema's "format": "regex" would compile patterns with Python's re; every
    # pattern is compiled for the portable subset below instead (R-ENTRY-15).
    jsonschema.Draft202012Validator.check_schema(schema, format_checker=None)
    _refuse_remote_refs(schema)
    for pattern in schema_patterns(schema):
        _re2(pattern)
    _drop_dialect(schema)
    v: jsonschema.protocols.Validator = _SafeValidator(schema, registry=Registry())
    return v


def validate_entry_value(value: Any, schema: dict[str, Any], *, name: str, what: str = "") -> None:
    """Validate a non-tensor entry's value against its declared schema.

    An embedded schema's validation spends at most ``SCHEMA_BASE_UNITS +
    SCHEMA_UNITS_PER_VALUE × n`` units for a value of ``n`` JSON values (R-ENTRY-16).

    Raises:
        EntrySchemaError: unknown built-in id, invalid embedded schema, a value that fails it,
            or a validation that would exceed its budget.
        JsonInvalidError: a value of more than ``jsonio.MAX_VALUE_NODES`` JSON values.

    """
    where = f"{what}: " if what else ""
    nodes = _count_nodes(value, limit=jsonio.MAX_VALUE_NODES, what=f"{where}entry {name!r}")
    v = _entry_validator(schema, name=name, where=where)
    _METER.left = SCHEMA_BASE_UNITS + SCHEMA_UNITS_PER_VALUE * nodes
    try:
        if v.is_valid(value):
            return
        err = _first_errors(v, value)
    except _OverBudget:
        raise EntrySchemaError(
            f"{where}entry {name!r}: validating its {nodes} JSON values against the declared "
            f"schema would take more than {SCHEMA_BASE_UNITS + SCHEMA_UNITS_PER_VALUE * nodes} "
            "keyword evaluations (spec R-ENTRY-16); simplify the schema"
        ) from None
    except Exception as exc:  # unresolvable $ref and similar schema faults
        raise EntrySchemaError(
            f"{where}entry {name!r}: its schema cannot be applied: {exc}"[:400]
        ) from None
    finally:
        _METER.left = None
    if err is not None:
        loc = "/".join(str(p) for p in err.absolute_path) or "value"
        raise EntrySchemaError(
            f"{where}entry {name!r}: {loc}: {err.message[:300]} (declared schema "
            f"{schema.get('id') or 'embedded'})"
        )


def _entry_validator(schema: dict[str, Any], *, name: str, where: str) -> Any:
    sid = schema.get("id")
    try:
        if sid is not None:
            rel = BUILTIN_ENTRY_SCHEMA_FILES.get(sid) if isinstance(sid, str) else None
            if rel is None:
                raise EntrySchemaError(f"{where}entry {name!r}: unknown built-in schema id {sid!r}")
            return _validator(f"entries/{rel}")
        return _embedded_validator(json.dumps(schema.get("json_schema"), sort_keys=True))
    except jsonschema.exceptions.SchemaError as exc:
        raise EntrySchemaError(
            f"{where}entry {name!r}: its embedded JSON Schema is invalid: {exc.message[:200]}"
        ) from None


def _count_nodes(value: Any, *, limit: int, what: str) -> int:
    """JSON values in ``value`` (containers and scalars; member names not), at most ``limit``."""
    count, stack = 0, [value]
    while stack:
        node = stack.pop()
        count += 1
        if count > limit:
            raise JsonInvalidError(
                f"{what}: the value holds more than {limit} JSON values (spec §18.3, R-SEC-15)"
            )
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return count
