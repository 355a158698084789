"""The reader's parser and the JSON Schemas (the authority) accept and reject the same documents.

The reader validates with hand-written checks (fast enough for manifests with millions of range
records, and able to report the spec's specific codes); this test keeps it honest against the
schemas for every example and every invalid example in ``spec/examples``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from portable_ckpt.errors import CheckpointError
from portable_ckpt.format.manifest import parse_manifest, parse_writer_index
from portable_ckpt.format.schemas import validate_document, validate_entry_value

EXAMPLES = Path(__file__).resolve().parents[2] / "spec" / "examples"
PARSERS = {"manifest": parse_manifest, "writer-index": parse_writer_index}


def _cases(valid: bool):
    base = EXAMPLES if valid else EXAMPLES / "invalid"
    for p in sorted(base.glob("*.json")):
        stem = p.name.split("--")[0].removesuffix(".json")
        if stem in PARSERS:
            yield pytest.param(p, stem, id=p.name)


@pytest.mark.parametrize("path, stem", list(_cases(True)))
def test_valid_examples_parse(path: Path, stem: str) -> None:
    doc = json.loads(path.read_text())
    validate_document(doc, f"{stem}.schema.json", what=path.name)
    PARSERS[stem](doc)


@pytest.mark.parametrize("path, stem", list(_cases(False)))
def test_invalid_examples_are_rejected_by_both(path: Path, stem: str) -> None:
    doc = json.loads(path.read_text())
    with pytest.raises(CheckpointError):
        validate_document(doc, f"{stem}.schema.json", what=path.name)
    with pytest.raises(CheckpointError):
        PARSERS[stem](doc)


@pytest.mark.parametrize(
    "path", sorted((EXAMPLES / "entries").glob("*.json")), ids=lambda p: p.name
)
def test_builtin_entry_examples_validate(path: Path) -> None:
    stem = path.name.split("--")[0].removesuffix(".json")
    validate_entry_value(json.loads(path.read_text()), {"id": f"pck:{stem}/1"}, name=stem)


@pytest.mark.parametrize(
    "path", sorted((EXAMPLES / "invalid" / "entries").glob("*.json")), ids=lambda p: p.name
)
def test_invalid_entry_examples_are_rejected(path: Path) -> None:
    stem = path.name.split("--")[0]
    with pytest.raises(CheckpointError) as ei:
        validate_entry_value(json.loads(path.read_text()), {"id": f"pck:{stem}/1"}, name=stem)
    assert ei.value.code == "PCK-ENTRY-SCHEMA"
