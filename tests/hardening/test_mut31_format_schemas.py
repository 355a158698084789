"""Mutation audit 31, embedded entry schemas (spec §12.1, R-ENTRY-4): what the earlier tests left
unchecked in :mod:`portable_ckpt.format.schemas`."""

from __future__ import annotations

import pytest

from portable_ckpt.errors import CheckpointError
from portable_ckpt.format.schemas import validate_entry_value


@pytest.mark.parametrize(
    "ref", ["file:///etc/passwd", "other.schema.json", "other.schema.json#/$defs/x", "//host/x", ""]
)
def test_only_references_into_the_schema_itself(ref: str) -> None:
    # R-ENTRY-4: every $ref starts with "#"; any other is PCK-ENTRY-SCHEMA, evaluated or not
    # (here it sits in $defs, which the value never reaches).
    schema = {"json_schema": {"type": "integer", "$defs": {"x": {"$ref": ref}}}}
    with pytest.raises(CheckpointError) as ei:
        validate_entry_value(1, schema, name="e")
    assert ei.value.code == "PCK-ENTRY-SCHEMA"
    assert "local references" in ei.value.message


def test_a_local_reference_is_followed() -> None:
    schema = {"json_schema": {"$ref": "#/$defs/x", "$defs": {"x": {"type": "integer"}}}}
    validate_entry_value(1, schema, name="e")
    with pytest.raises(CheckpointError) as ei:
        validate_entry_value("1", schema, name="e")
    assert ei.value.code == "PCK-ENTRY-SCHEMA"
