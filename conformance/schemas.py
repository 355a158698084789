"""Loading the normative JSON Schemas from ``spec/schemas`` (Draft 2020-12)."""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from conformance.regex import compiled
from conformance.spec import BUILTIN_SCHEMA_FILES

__all__ = ["REQUIRED_SCHEMAS", "SchemaSet", "SchemasUnavailable", "default_schema_dir",
           "load_schemas"]

#: the schema files a check needs (relative to the schema directory): the format documents of
#: 1.0 and 1.1 and the built-in entry schemas. Without any of them a check would have to skip
#: validation, so their absence is a hard error (:class:`SchemasUnavailable`), never a warning.
REQUIRED_SCHEMAS: tuple[str, ...] = (
    "common.schema.json", "manifest.schema.json", "writer-index.schema.json",
    "drill.schema.json", "copy.schema.json", "1.1/manifest.schema.json",
    "1.1/writer-index.schema.json", *BUILTIN_SCHEMA_FILES.values(),
)


class SchemasUnavailable(Exception):
    """The normative schemas are missing or incomplete: nothing can be checked."""


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
        if root.is_dir():
            found = sorted(root.rglob("*.json"), key=lambda p: p.parts[len(root.parts)] == "errata")
            for p in found:
                try:
                    doc = json.loads(p.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    continue
                if not isinstance(doc, dict):
                    continue
                rel = p.relative_to(root).as_posix().removeprefix("errata/")
                self.by_file[rel] = doc
                sid = doc.get("$id")
                if isinstance(sid, str):
                    self.by_id[sid] = doc
        self._registry: Any = None
        self._validators: dict[int, Any] = {}

    def missing(self) -> list[str]:
        """The :data:`REQUIRED_SCHEMAS` this set lacks."""
        return [rel for rel in REQUIRED_SCHEMAS if rel not in self.by_file]

    def require_complete(self) -> None:
        """Raise :class:`SchemasUnavailable` unless every required schema is present."""
        missing = self.missing()
        if missing:
            where = "does not exist" if not self.root.is_dir() else f"lacks {', '.join(missing)}"
            raise SchemasUnavailable(
                f"schema directory {self.root} {where}: the normative schemas of spec/schemas are "
                "needed (install the portable-ckpt-conformance package, which ships them, run "
                "from a checkout of the repository, or pass --schemas DIR / set "
                "$PCK_SPEC_SCHEMAS)")

    def validator(self, schema: dict[str, Any] | bool) -> Any:
        """A (cached) Draft 2020-12 validator of ``schema`` resolving refs in this set only.

        Regular expressions run on RE2 with their ECMA-262 meaning (:mod:`conformance.regex`).
        """
        key = id(schema)
        hit = self._validators.get(key)
        if hit is None or hit[0] is not schema:
            hit = (schema, _re2_validator_class()(schema, registry=self.registry()))
            if len(self._validators) > 256:
                self._validators.clear()
            self._validators[key] = hit
        return hit[1]

    def registry(self) -> Any:
        """A ``referencing.Registry`` holding every schema (no remote retrieval)."""
        if self._registry is None:
            from referencing import Registry, Resource
            from referencing.jsonschema import DRAFT202012

            reg: Any = Registry()
            for rel, doc in self.by_file.items():
                res = Resource.from_contents(doc, default_specification=DRAFT202012)
                uri = doc.get("$id") if isinstance(doc.get("$id"), str) else rel
                reg = reg.with_resource(uri, res)
                if uri != rel:
                    reg = reg.with_resource(rel, res)
            self._registry = reg
        return self._registry

    def document(self, name: str, version: str = "1.0") -> dict[str, Any] | None:
        """Return the schema of a format document of a format version.

        ``("manifest", "1.0")`` is ``manifest.schema.json``; the 1.1 schemas live in ``1.1/``
        (``("manifest", "1.1")`` is ``1.1/manifest.schema.json``) and extend the 1.0 ones.
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

    def validate(self, schema: dict[str, Any], instance: Any, *, limit: int = 20) -> list[str]:
        """Validate ``instance`` and return up to ``limit`` error messages (empty when valid)."""
        validator = self.validator(schema)
        out: list[str] = []
        for err in validator.iter_errors(instance):
            loc = "/".join(str(p) for p in err.absolute_path) or "(root)"
            out.append(f"at {loc}: {err.message[:300]}")
            if len(out) >= limit:
                break
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


@lru_cache(maxsize=1)
def _re2_validator_class() -> Any:
    """Draft 2020-12 with patterns on RE2 and ``uniqueItems`` by hashing (R-ENTRY-15)."""
    from jsonschema import Draft202012Validator, validators

    return validators.extend(Draft202012Validator, {
        "pattern": _pattern, "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties, "uniqueItems": _unique_items})


@lru_cache(maxsize=4)
def load_schemas(root: str | None = None) -> SchemaSet:
    """Load (and cache) the schema set below ``root`` or the default directory."""
    return SchemaSet(Path(root) if root else default_schema_dir())
