"""The JSON Schemas of the format (``spec/schemas``, the authority) and entry-value validation."""

from __future__ import annotations

import functools
import json
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import re2
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource

from portable_ckpt.errors import EntrySchemaError, SchemaError

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


def schema_dir() -> Path:
    """Directory holding the JSON Schemas (the packaged copy of ``spec/schemas``)."""
    pkg = resources.files("portable_ckpt.format") / "schemas"
    return Path(str(pkg))


@functools.cache
def _load(rel: str) -> dict[str, Any]:
    with open(schema_dir() / rel, encoding="utf-8") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def _no_remote(uri: str) -> Resource[Any]:
    # Schemas are resolved from the packaged files only; nothing is ever fetched.
    for path in schema_dir().rglob("*.json"):
        doc = _load(str(path.relative_to(schema_dir())))
        if doc.get("$id") == uri:
            return Resource.from_contents(doc)
    raise NoSuchResource(uri)


@functools.cache
def _registry() -> Registry[Any]:
    return Registry(retrieve=_no_remote)  # type: ignore[call-arg]


@functools.cache
def _validator(rel: str) -> jsonschema.protocols.Validator:
    schema = _load(rel)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, registry=_registry())


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
# (linear time, no catastrophic backtracking) and uniqueItems is a hash-set check, not O(n^2).


@functools.cache
def _re2(pattern: str) -> Any:
    try:
        return re2.compile(pattern)
    except re2.error as exc:
        raise EntrySchemaError(
            f"embedded schema pattern {pattern[:80]!r} is not supported: patterns must be RE2 "
            f"syntax (no backreferences or lookaround) ({exc})"
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
    jsonschema.Draft202012Validator.check_schema(schema)
    _refuse_remote_refs(schema)
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
