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


@functools.cache
def _embedded_validator(schema_json: str) -> jsonschema.protocols.Validator:
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema, registry=Registry())


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
