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

from portable_ckpt.errors import CheckpointError, UsageError
from portable_ckpt.format.dtypes import DTYPES, DType
from portable_ckpt.format.manifest import (
    Continuation,
    Mesh,
    check_continuation,
    dtype_not_defined,
    entry_values_problem,
    minor_at_least,
    parse_manifest,
    parse_writer_index,
)
from portable_ckpt.format.naming import check_attempt_id
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


# Mutation audit 31: rules the parser kept that no test checked (each kills a mutant).

#: Each closed object of a manifest (additionalProperties: false), found from the document.
CLOSED: dict[str, Callable[[Doc], Doc]] = {
    "file record": lambda d: _first(d["files"]),
    "checksum": lambda d: _first(d["files"])["checksum"],
    "tensor entry": lambda d: _first(d["tensors"]),
    "range record": lambda d: _first(d["tensors"])["ranges"][0],
    "entry": lambda d: _first(d["entries"]),
    "entry schema": lambda d: _first(d["entries"])["schema"],
    "entry value": lambda d: _first(d["entries"])["values"][0],
    "continuation": lambda d: d["continuation"],
    "mesh": lambda d: d["continuation"]["mesh"],
}


@pytest.mark.parametrize("where", list(CLOSED))
def test_closed_objects_refuse_an_unknown_member(where: str) -> None:
    # R-VERSION-6 lets readers ignore unknown members at the top level and inside extensions
    # only; below, the schemas are closed. A file record and a checksum take the parser's fast
    # path when well-formed: an extra member must send them to the full checks.
    doc = _example("manifest")
    CLOSED[where](doc)["x-extra"] = 1
    _refused("manifest", doc)


def test_unknown_members_at_the_top_and_in_extensions_are_ignored() -> None:
    doc = _example("manifest")
    doc["x-extra"] = {"anything": [1, None]}
    doc["extensions"]["x-extra"] = {"anything": [1, None]}
    validate_document(doc, "manifest.schema.json", what="manifest")
    assert parse_manifest(doc).extensions["x-extra"] == {"anything": [1, None]}


#: Path members that name a file of ``files`` (R-FILES-2), found from the document.
#: String members with a length bound (§8.1, §19.2), the longest valid value's length each.
STRINGS: dict[str, tuple[int, Callable[[Doc, str], Any]]] = {
    "producer.name": (256, lambda d, s: d["producer"].__setitem__("name", s)),
    "producer.version": (256, lambda d, s: d["producer"].__setitem__("version", s)),
    "tensor key": (1024, lambda d, s: d["tensors"].__setitem__(s, d["tensors"].popitem()[1])),
    "range name": (4096, lambda d, s: _first(d["tensors"])["ranges"][0].__setitem__("name", s)),
    "mesh dim name": (64, lambda d, s: d["continuation"]["mesh"]["dim_names"].__setitem__(0, s)),
}


@pytest.mark.parametrize("where", list(STRINGS))
def test_string_bounds_are_exact(where: str) -> None:
    longest, put = STRINGS[where]
    doc = _example("manifest")
    put(doc, "n" * longest)
    validate_document(doc, "manifest.schema.json", what="manifest")
    parse_manifest(copy.deepcopy(doc))
    doc = _example("manifest")
    put(doc, "n" * (longest + 1))
    _refused("manifest", doc)


#: Members whose values are fixed words: the wrong case is another word (§6.2, §12, §13).
WORDS: dict[str, Callable[[Doc], tuple[Doc, str]]] = {
    "contract": lambda d: (d["continuation"], "contract"),
    "scope": lambda d: (_first(d["entries"]), "scope"),
    "world_size_policy": lambda d: (
        next(e for e in d["entries"].values() if e["scope"] == "per_rank"),
        "world_size_policy",
    ),
    "encoding": lambda d: (_first(d["entries"]), "encoding"),
    "checksum algorithm": lambda d: (_first(d["files"])["checksum"], "algorithm"),
}


@pytest.mark.parametrize("where", list(WORDS))
def test_fixed_words_are_case_sensitive(where: str) -> None:
    doc = _example("manifest")
    obj, member = WORDS[where](doc)
    obj[member] = obj[member].upper()
    _refused("manifest", doc)


@pytest.mark.parametrize(
    ("kind", "other"),
    [("manifest", "portable-ckpt-writer-index"), ("writer-index", "portable-ckpt")],
)
def test_format_names_the_document_kind(kind: str, other: str) -> None:
    # §16.3: the format member comes first; a writer index is no commit record, nor the reverse.
    doc = _example(kind)
    doc["format"] = other
    _refused(kind, doc)


def test_minor_at_least_compares_minors_of_any_length() -> None:
    # §16.1: digits compared as text; int() of more than 4,300 digits raises in CPython.
    assert minor_at_least("1." + "1" * 5000, 2)
    assert minor_at_least("1.2", 2) and not minor_at_least("1.1", 2)
    assert not minor_at_least("2." + "1" * 5000, 2)


def _one_byte_file(d: Doc) -> Doc:
    rec: Doc = _first(d["files"])
    rec["checksum"]["blocks"] = "00000000"  # one block: what a size of 1 needs
    return rec


#: Integer members given the boolean that equals a valid value (True == 1, False == 0).
BOOLEANS: dict[str, tuple[str, Callable[[Doc], None]]] = {
    "file size": ("manifest", lambda d: _one_byte_file(d).__setitem__("size", True)),
    "range offset": (
        "manifest",
        lambda d: _first(d["tensors"])["ranges"][0]["offsets"].__setitem__(0, False),
    ),
    "value rank": (
        "manifest",
        lambda d: next(e for e in d["entries"].values() if e["scope"] == "per_rank")["values"][
            0
        ].__setitem__("rank", False),
    ),
    "writer": ("writer-index", lambda d: d.__setitem__("writer", False)),
}


@pytest.mark.parametrize("where", list(BOOLEANS))
def test_booleans_are_not_integers(where: str) -> None:
    # JSON true is no integer token (R-SEC-18), though Python's True is an int equal to 1: the
    # parser's fast paths test the exact type, or true would pass as a size of 1 byte.
    kind, put = BOOLEANS[where]
    doc = _example(kind)
    put(doc)
    _refused(kind, doc)


@pytest.mark.parametrize(
    ("dtype", "shape", "code"),
    [
        ("uint8", [0, 2**53 - 1], None),
        ("uint8", [0, 2**26, 2**27], "PCK-LIMIT"),
        ("float32", [2**51 - 1, 0], None),
        ("float32", [2**51, 0], "PCK-LIMIT"),
    ],
)
def test_a_zero_size_tensor_is_bounded_by_its_non_zero_dimensions(
    dtype: str, shape: list[int], code: str | None
) -> None:
    # R-TENSOR-1: the product of the non-zero dimensions x itemsize must not exceed MAXINT
    # either (a tensor of shape [0, 2^26, 2^27] cannot be described in an address space),
    # though the tensor has no elements and no ranges (R-TENSOR-9). The schema cannot say it.
    for kind in KINDS:
        doc = _example(kind)
        doc["tensors"]["z"] = {"dtype": dtype, "shape": shape, "ranges": []}
        if code is None:
            KINDS[kind][1](doc)
        else:
            _refused(kind, doc, code, schema=False)


def test_a_writer_index_gives_a_rank_one_value() -> None:
    # R-ENTRY-9's duplicate rank, in the index that would carry it to the committer; the
    # schema has no uniqueness over objects.
    doc = _example("writer-index")
    entry = next(e for e in doc["entries"].values() if e["scope"] == "per_rank")
    entry["values"].append(dict(entry["values"][0]))
    validate_document(doc, "writer-index.schema.json", what="writer-index")
    _refused("writer-index", doc, schema=False)


#: A row a later MINOR might add (docs/changing-the-format.md): no row of 1.0 … 1.2 has an
#: extension, so R-DTYPE-3's per-version rule runs on none of the real table's rows.
LATER_ROW = DType(
    "float8_e8m0fnu", "F8_E8M0", 1, "u1", since="1.3", extension="dtype-float8-e8m0fnu"
)


def test_a_later_row_needs_its_version_and_its_extension() -> None:
    ext = [LATER_ROW.extension]
    assert dtype_not_defined(LATER_ROW, "1.3", ext) == ""
    assert dtype_not_defined(LATER_ROW, "1.10", ext) == ""
    assert "format_version 1.2" in dtype_not_defined(LATER_ROW, "1.2", ext)
    assert "does not list" in dtype_not_defined(LATER_ROW, "1.3", [])
    assert dtype_not_defined(LATER_ROW, None, None) == ""  # neither known: nothing to refuse
    assert dtype_not_defined(DTYPES["float32"], "1.0", []) == ""


@pytest.mark.parametrize(
    ("kind", "version", "ok"),
    [
        ("manifest", "1.3", False),  # the extension is not listed
        ("writer-index", "1.2", False),  # an index lists no extensions, but has a version
        ("writer-index", "1.3", True),
    ],
)
def test_the_parser_applies_the_per_version_rule(
    monkeypatch: pytest.MonkeyPatch, kind: str, version: str, ok: bool
) -> None:
    # The parser's own table gets the later row, as the change that adds one would give it.
    monkeypatch.setitem(DTYPES, LATER_ROW.name, LATER_ROW)
    doc = _example(kind)
    doc["format_version"] = version
    _first(doc["tensors"])["dtype"] = LATER_ROW.name
    if ok:
        KINDS[kind][1](doc)
    else:
        _refused(kind, doc, "PCK-DTYPE-UNSUPPORTED", schema=False)


@pytest.mark.parametrize(
    ("scope", "ranks", "code"),
    [
        ("global", [None], None),
        ("global", [], "PCK-ENTRY-MISSING"),
        ("global", [None, None], "PCK-SCHEMA"),
        ("per_rank", [0, 1, 2, 3], None),
        ("per_rank", [0, 1, 3], "PCK-ENTRY-MISSING"),
        ("per_rank", [0, 1, 2, 3, 4], "PCK-SCHEMA"),  # a rank not below the world size
        ("per_rank", [0, 1, 2, 3, 3], "PCK-SCHEMA"),  # a rank given twice
    ],
)
def test_entry_values_rule_as_the_committer_applies_it(
    scope: str, ranks: list[int | None], code: str | None
) -> None:
    # R-ENTRY-7 … 9 on merged values (world size 4): the committer's values come from several
    # indexes, none of which knew the world size, so no per-value check ran before this one.
    problem = entry_values_problem(scope, ranks, 4)
    assert (problem and problem[0].code) == code, problem


@pytest.mark.parametrize("name", ["dp-shard", "0dp", "dp.shard", "é"])
def test_writers_write_mesh_names_of_the_schema_readers_read_more(name: str) -> None:
    # §13, R-CONTRACT-8: a reader accepts any unique label without control characters; a
    # writer writes only ^[A-Za-z_][A-Za-z0-9_]{0,63}$ (a DeviceMesh's "dp-shard" is mapped).
    doc = _example("manifest")
    doc["continuation"]["mesh"]["dim_names"][0] = name
    assert parse_manifest(doc).continuation.mesh == Mesh((2, 2), (name, "tp"))
    with pytest.raises(UsageError):
        check_continuation(Continuation("exact", 4, Mesh((2, 2), (name, "tp"))))
    check_continuation(Continuation("exact", 4, Mesh((2, 2), ("_" + "a" * 63, "tp"))))


@pytest.mark.parametrize(
    ("step", "id_step", "ok"),
    [
        (999_999_999_999, "999999999999", True),
        (99_999_999_999, "199999999999", False),  # only the leading digit differs
        (120, "100000000120", False),
    ],
)
def test_step_equals_all_twelve_digits_of_the_attempt_id(step: int, id_step: str, ok: bool) -> None:
    # R-ID-3: the manifest's step is the step encoded in attempt_id, all twelve digits.
    doc = _example("manifest")
    doc["step"] = step
    doc["attempt_id"] = "s" + id_step + doc["attempt_id"][13:]
    if ok:
        assert parse_manifest(doc).step == step
    else:
        _refused("manifest", doc, "PCK-ATTEMPT-ID", schema=False)


def test_an_attempt_id_ends_where_its_pattern_ends() -> None:
    # §3's pattern ends with $, the end of the input in ECMA-262: no final newline, as a
    # directory listing or a manifest could carry one (Python's $ would allow it).
    doc = _example("manifest")
    good = doc["attempt_id"]
    assert check_attempt_id(good) == good
    with pytest.raises(CheckpointError) as ei:
        check_attempt_id(good + "\n")
    assert ei.value.code == "PCK-ATTEMPT-ID"
    doc["attempt_id"] = good + "\n"
    _refused("manifest", doc, "PCK-ATTEMPT-ID")


@pytest.mark.parametrize("name", [".", "a/.", "./a", "a/./b", "..", "a//b", "a/"])
def test_entry_names_have_no_empty_dot_or_dot_dot_part(name: str) -> None:
    # §12.1: "/" separates non-empty parts, none of which is "." or "..".
    for kind in KINDS:
        doc = _example(kind)
        doc["entries"][name] = doc["entries"].popitem()[1]
        _refused(kind, doc)


@pytest.mark.parametrize("char", ["\x00", "\x1f", "\x7f"])
@pytest.mark.parametrize("where", ["tensor key", "range name", "mesh dim name"])
def test_names_hold_no_control_character(where: str, char: str) -> None:
    # §8.1, §13, §19.2: no C0 control character and no DEL (U+007F), the last one included.
    doc = _example("manifest")
    STRINGS[where][1](doc, "n" + char)
    _refused("manifest", doc)


@pytest.mark.parametrize("member", ["created_at", "committed_at"])
def test_timestamps_are_the_patterns_and_nothing_more(member: str) -> None:
    # R-COMMIT-18: every timestamp the pattern accepts is read (Feb 31, a leap second, nine
    # fraction digits); the pattern's $ is the end of the text, so a final newline is not.
    for ok in ("2026-02-31T00:00:00Z", "2026-12-31T23:59:60.123456789Z"):
        doc = _example("manifest")
        doc[member] = ok
        assert getattr(parse_manifest(doc), member) == ok
    for bad in (
        "2026-01-01T00:00:00Z\n",
        "2026-01-01T00:00:00.1234567890Z",
        "2026-01-01T24:00:00Z",
    ):
        doc = _example("manifest")
        doc[member] = bad
        _refused("manifest", doc)
