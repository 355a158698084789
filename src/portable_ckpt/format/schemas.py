"""The JSON Schemas of the format (``spec/schemas``, the authority) and entry-value validation."""

from __future__ import annotations

import functools
import json
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource

from portable_ckpt.errors import EntrySchemaError, SchemaError
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
    return Resource.from_contents(_load(rel))


@functools.cache
def _registry() -> Registry[Any]:
    return Registry(retrieve=_no_remote)  # type: ignore[call-arg]


@functools.cache
def _validator(rel: str) -> jsonschema.protocols.Validator:
    # The spec's own schemas run on the same RE2-based validator as embedded ones (§18.7).
    v: jsonschema.protocols.Validator = _SafeValidator(_load(rel), registry=_registry())
    return v


def validate_document(doc: Any, schema_file: str, *, what: str) -> None:
    """Validate a format document against ``schemas/<schema_file>`` (``SchemaError`` if not)."""
    v = _validator(schema_file)
    if v.is_valid(doc):
        return
    err = jsonschema.exceptions.best_match(v.iter_errors(doc))
    if err is not None:
        loc = "/".join(str(p) for p in err.absolute_path) or "top level"
        raise SchemaError(f"{what}: {loc}: {err.message[:300]}", path=what)


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


_SafeValidator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
        "uniqueItems": _unique_items,
    },
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


@functools.cache
def _embedded_validator(schema_json: str) -> jsonschema.protocols.Validator:
    schema = json.loads(schema_json)
    if (
        isinstance(schema, dict)
        and schema.get("$schema", jsonschema.Draft202012Validator.META_SCHEMA["$id"])
        != jsonschema.Draft202012Validator.META_SCHEMA["$id"]
    ):
        raise EntrySchemaError(
            f"embedded schemas use JSON Schema Draft 2020-12, not {schema.get('$schema')!r}"
        )
    # The meta-schema's "format": "regex" would compile patterns with Python's re; every
    # pattern is compiled for the portable subset below instead (R-ENTRY-15).
    jsonschema.Draft202012Validator.check_schema(schema, format_checker=None)
    _refuse_remote_refs(schema)
    for pattern in schema_patterns(schema):
        _re2(pattern)
    v: jsonschema.protocols.Validator = _SafeValidator(schema, registry=Registry())
    return v


def validate_entry_value(value: Any, schema: dict[str, Any], *, name: str, what: str = "") -> None:
    """Validate a non-tensor entry's value against its declared schema.

    Raises:
        EntrySchemaError: unknown built-in id, invalid embedded schema, or a value that fails it.

    """
    where = f"{what}: " if what else ""
    sid = schema.get("id")
    try:
        if sid is not None:
            rel = BUILTIN_ENTRY_SCHEMA_FILES.get(sid) if isinstance(sid, str) else None
            if rel is None:
                raise EntrySchemaError(f"{where}entry {name!r}: unknown built-in schema id {sid!r}")
            v = _validator(f"entries/{rel}")
        else:
            v = _embedded_validator(json.dumps(schema.get("json_schema"), sort_keys=True))
    except jsonschema.exceptions.SchemaError as exc:
        raise EntrySchemaError(
            f"{where}entry {name!r}: its embedded JSON Schema is invalid: {exc.message[:200]}"
        ) from None
    try:
        if v.is_valid(value):
            return
        err = jsonschema.exceptions.best_match(v.iter_errors(value))
    except Exception as exc:  # unresolvable $ref and similar schema faults
        raise EntrySchemaError(
            f"{where}entry {name!r}: its schema cannot be applied: {exc}"[:400]
        ) from None
    if err is not None:
        loc = "/".join(str(p) for p in err.absolute_path) or "value"
        raise EntrySchemaError(
            f"{where}entry {name!r}: {loc}: {err.message[:300]} (declared schema "
            f"{sid or 'embedded'})"
        )
