"""Mutation audit 31, the commit record's parser (spec §5, §6, §8, §12, §13, §16, §19.2): what
the earlier tests left unchecked in :mod:`portable_ckpt.format.manifest`.

Every case edits the spec's own example documents (``spec/examples``) and, where the rule is one
of the schemas', also asks the schema (the authority) for its verdict, so that the parser and the
schema are seen to agree.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from portable_ckpt.errors import CheckpointError
from portable_ckpt.format.manifest import parse_manifest, parse_writer_index
from portable_ckpt.format.schemas import validate_document
from tests.core.test_schema_agreement import EXAMPLES

Doc = dict[str, Any]
KINDS: dict[str, tuple[str, Callable[..., Any], str]] = {
    "manifest": ("manifest.json", parse_manifest, "manifest.schema.json"),
    "writer-index": ("writer-index.json", parse_writer_index, "writer-index.schema.json"),
}


def _example(kind: str) -> Doc:
    doc: Doc = json.loads((EXAMPLES / KINDS[kind][0]).read_text())
    return doc


def _refused(kind: str, doc: Doc, code: str = "PCK-SCHEMA", *, schema: bool = True) -> None:
    """The parser refuses ``doc`` with ``code``; with ``schema``, the schema refuses it too."""
    _, parse, schema_file = KINDS[kind]
    with pytest.raises(CheckpointError) as ei:
        parse(copy.deepcopy(doc))
    assert ei.value.code == code, ei.value
    if schema:
        with pytest.raises(CheckpointError) as si:
            validate_document(doc, schema_file, what=kind)
        assert si.value.code == "PCK-SCHEMA"


@pytest.mark.parametrize("member", ["must_understand", "extensions"])
def test_required_top_level_members(member: str) -> None:
    # §5: "The schema requires all members above; must_understand MAY be empty and extensions
    # MAY be {}" — empty, not absent (the parser took absence for the empty value).
    doc = _example("manifest")
    parse_manifest(copy.deepcopy(doc))
    del doc[member]
    _refused("manifest", doc)


@pytest.mark.parametrize("kind", list(KINDS))
def test_global_entry_has_no_world_size_policy_member_even_null(kind: str) -> None:
    # §12.1: world_size_policy is "absent for global"; the schema forbids the member, so a
    # null one is refused like a string one.
    doc = _example(kind)
    name = next(n for n, e in doc["entries"].items() if e["scope"] == "global")
    for value in (None, "modulo"):
        doc["entries"][name]["world_size_policy"] = value
        _refused(kind, doc)


def _first(d: Doc) -> Any:
    return next(iter(d.values()))


#: Path members that name a file of ``files`` (R-FILES-2), found from the document.
PATH_MEMBERS: dict[str, Callable[[Doc], Doc]] = {
    "range file": lambda d: _first(d["tensors"])["ranges"][0],
    "entry value file": lambda d: _first(d["entries"])["values"][0],
}


@pytest.mark.parametrize("length", [2048, 4097, 10_000])
@pytest.mark.parametrize("where", list(PATH_MEMBERS))
def test_a_path_too_long_for_section_2_2_is_path_unsafe(where: str, length: int) -> None:
    # The longest path of §2.2 has 8 x 255 + 7 = 2047 characters; any longer one breaks §2.2,
    # whose code §17.2 puts before PCK-SCHEMA (the schema's path maxLength is §2.2 restated),
    # however long it is: a string bound of the parser's own made 4097 characters PCK-SCHEMA.
    for kind in KINDS:
        doc = _example(kind)
        PATH_MEMBERS[where](doc)["file"] = "a" * length
        _refused(kind, doc, "PCK-PATH-UNSAFE")


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_global_entry_has_one_value_in_every_document(kind: str) -> None:
    # The schema's maxItems: 1 holds in a writer index too, where the parser knows no world
    # size to check the values against (it took two values there).
    doc = _example(kind)
    entry = next(e for e in doc["entries"].values() if e["scope"] == "global")
    entry["values"].append(dict(entry["values"][0]))
    _refused(kind, doc)
