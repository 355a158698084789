"""The format's own schemas with every ``$ref`` replaced by its target (one tree per schema).

jsonschema resolves a ``$ref`` at each use: a URI join, a registry lookup and a new validator
per reference. A drill or verification record crosses 10-30 references, and a listing validates
every record of every version, so resolving was two thirds of the validation and the
validation two thirds of a fresh ``ls`` (scale review, stop 28). The spec's schemas are fixed
and not recursive, so each can be resolved once, here, into one tree that validates alike.
"""

from __future__ import annotations

from typing import Any

from referencing import Registry
from referencing.jsonschema import DRAFT202012

__all__ = ["NotInlinable", "inline_refs"]

#: Keywords whose value is a map of names to subschemas (the names are no keywords).
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "dependentSchemas"})
#: Keywords whose value is data, never a schema.
_DATA = frozenset({"const", "enum", "default", "examples"})
#: Keywords this inliner does not rewrite: a schema using one keeps jsonschema's resolution.
_UNSUPPORTED = frozenset({"$dynamicRef", "$dynamicAnchor", "$anchor", "$recursiveRef"})


class NotInlinable(Exception):
    """The schema refers to itself or uses a keyword this module does not rewrite."""


def inline_refs(schema: dict[str, Any], registry: Registry[Any]) -> dict[str, Any]:
    """``schema`` with each ``$ref`` replaced by its target, resolved from ``registry``.

    A reference with sibling keywords becomes one more ``allOf`` member: in Draft 2020-12 a
    ``$ref`` is an in-place applicator that applies beside its siblings, as ``allOf`` does.
    ``$defs`` are dropped (nothing refers to them any more).

    Raises:
        NotInlinable: a reference cycle, or a keyword listed in ``_UNSUPPORTED``.

    """
    base = schema.get("$id", "")
    if base:  # the schema's own references resolve within it (a registry may not hold it)
        registry = registry.with_resource(base, DRAFT202012.create_resource(schema))
    out = _walk(schema, registry.resolver(base), (id(schema),))
    if not isinstance(out, dict):
        raise NotInlinable("the schema is a boolean")
    return out


def _walk(node: Any, resolver: Any, active: tuple[int, ...]) -> Any:
    if isinstance(node, list):
        return [_walk(item, resolver, active) for item in node]
    if not isinstance(node, dict):
        return node
    if _UNSUPPORTED & node.keys():
        raise NotInlinable(f"uses {sorted(_UNSUPPORTED & node.keys())}")
    if isinstance(node.get("$id"), str):
        resolver = resolver.in_subresource(DRAFT202012.create_resource(node))
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("$id", "$defs", "$ref", "$schema"):
            continue
        if key in _DATA:
            out[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _walk(sub, resolver, active) for name, sub in value.items()}
        else:
            out[key] = _walk(value, resolver, active)
    ref = node.get("$ref")
    if ref is None:
        return out
    resolved = resolver.lookup(ref)
    if id(resolved.contents) in active:
        raise NotInlinable(f"{ref} refers to a schema that encloses it")
    target = _walk(resolved.contents, resolved.resolver, (*active, id(resolved.contents)))
    if not out:
        return target
    out["allOf"] = [*out.get("allOf", []), target]
    return out
