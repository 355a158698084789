"""The format's schemas with their references resolved once validate as the schemas do.

A listing validates every record of every version; ``validate_document`` first asks a validator
built on the schema with each ``$ref`` replaced by its target (``format/_schema_inline.py``) and
only falls back to the referencing validator for a document that fails. These tests hold the
two to the same verdict on every example of the spec, valid and invalid, and on mutations of
them; a fast verdict of "valid" where the schema says "invalid" would let a bad record count.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from portable_ckpt.format import schemas
from portable_ckpt.format._schema_inline import NotInlinable, inline_refs
from portable_ckpt.format.schemas import validate_document
from tests.hardening._mutate import mutate_json

EXAMPLES = Path(__file__).resolve().parents[2] / "spec" / "examples"


def _schema_of(example: Path) -> str:
    """``spec/examples/[invalid/][1.x/]kind--case.json`` → its schema file."""
    rel = example.relative_to(EXAMPLES).parts
    sub = [p for p in rel[:-1] if p != "invalid"]
    stem = example.name.split("--")[0].removesuffix(".json")
    return "/".join([*sub, f"{stem}.schema.json"])


def _examples() -> list[tuple[Path, str]]:
    out = []
    for p in sorted(EXAMPLES.rglob("*.json")):
        rel = _schema_of(p)
        if (schemas.schema_dir() / rel).is_file() and schemas._inlined_validator(rel):
            out.append((p, rel))
    return out


EXAMPLE_CASES = _examples()


def _verdict(v: Any, doc: Any) -> bool | str:
    try:
        return bool(v.is_valid(doc))
    except UnicodeEncodeError as exc:  # a lone surrogate (never in a strictly parsed document)
        return type(exc).__name__


def _both(doc: Any, rel: str) -> tuple[bool | str, bool | str]:
    fast = schemas._inlined_validator(rel)
    assert fast is not None
    return _verdict(fast, doc), _verdict(schemas._validator(rel), doc)


def test_every_document_schema_is_inlined() -> None:
    """Every schema a listing or a commit validates with is resolved once (lr-scheduler, which
    refers to itself, keeps jsonschema's resolution: entry values are metered anyway)."""
    root = schemas.schema_dir()
    rels = [p.relative_to(root).as_posix() for p in root.rglob("*.json")]
    missing = {r for r in rels if not r.startswith("errata/") and not schemas._inlined_validator(r)}
    assert missing == {"entries/lr-scheduler.schema.json"}
    assert len(EXAMPLE_CASES) > 90


@pytest.mark.parametrize("path, rel", EXAMPLE_CASES,
                         ids=[str(p.relative_to(EXAMPLES)) for p, _ in EXAMPLE_CASES])
def test_examples_get_the_same_verdict(path: Path, rel: str) -> None:
    doc = json.loads(path.read_text())
    fast, slow = _both(doc, rel)
    assert fast == slow
    assert slow == ("invalid" not in path.relative_to(EXAMPLES).parts)


_VALID = [(p, r) for p, r in EXAMPLE_CASES if "invalid" not in p.relative_to(EXAMPLES).parts]


@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from(_VALID), seed=st.integers(0, 2**32 - 1))
def test_mutated_examples_get_the_same_verdict(case: tuple[Path, str], seed: int) -> None:
    path, rel = case
    doc = mutate_json(json.loads(path.read_text()), random.Random(seed))
    fast, slow = _both(doc, rel)
    assert fast == slow, (path.name, doc)


def test_errata_schemas_are_the_ones_inlined() -> None:
    """An erratum replaces its schema in the inlined tree too (R-VERSION-11): the 1.0 copy
    schema is read from ``errata/copy.schema.json``."""
    assert (schemas.schema_dir() / "errata" / "copy.schema.json").is_file()
    inlined = json.dumps(schemas._inlined_validator("copy.schema.json").schema)  # type: ignore[union-attr]
    errata = schemas._load("copy.schema.json")
    for name in errata["properties"]:
        assert json.dumps(name) in inlined


def test_a_reference_cycle_is_not_inlined() -> None:
    registry = schemas._registry()
    cyclic = {"$id": "https://example.invalid/c.json", "type": "object",
              "properties": {"next": {"$ref": "#"}}}
    with pytest.raises(NotInlinable):
        inline_refs(cyclic, registry)
    assert inline_refs({"$id": "https://example.invalid/d.json", "$defs": {"a": {"type": "string"}},
                        "properties": {"x": {"$ref": "#/$defs/a", "minLength": 2}}}, registry) == {
        "properties": {"x": {"minLength": 2, "allOf": [{"type": "string"}]}}}


def test_an_invalid_document_is_reported_as_before() -> None:
    """A document the fast validator turns away is named by the referencing validator, with
    its location and message."""
    doc = json.loads((EXAMPLES / "drill.json").read_text())
    doc["world_size"] = 0
    with pytest.raises(Exception) as err:
        validate_document(doc, "drill.schema.json", what="drills/d1.json")
    assert getattr(err.value, "code", None) == "PCK-SCHEMA"
    assert "drills/d1.json: world_size:" in str(err.value)


def test_no_reference_is_left_to_resolve() -> None:
    """What makes it fast: no ``$ref`` (nor ``$defs``) is left in an inlined tree, so validating
    a record resolves nothing (the timing is in the stop's note, not here)."""
    for _, rel in EXAMPLE_CASES:
        text = json.dumps(schemas._inlined_validator(rel).schema)  # type: ignore[union-attr]
        assert '"$ref"' not in text and '"$defs"' not in text, rel
