"""Errata schemas (spec §16.4 R-VERSION-11, §19.1): same ``$id``, same documents, RE2-ready.

``spec/schemas/errata/<path>`` replaces the released ``spec/schemas/<path>``. This module proves
that each erratum accepts exactly the documents its released original accepts: structurally the
two differ only in their regular expressions, and the old and new expressions agree on generated
strings when the old ones are evaluated with their ECMA-262 meaning (a Python ``re`` model with
``$`` → ``\\Z`` and ``.`` without line terminators). The validators of the reference reader and of
the conformance checker, which run every pattern on RE2, use the errata and agree with the
released schemas on every example.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import re2
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.schemas import SchemaSet
from portable_ckpt.errors import SchemaError
from portable_ckpt.format import regex as reader_regex
from portable_ckpt.format.schemas import validate_document

from .test_spec_schemas import (
    EXAMPLES,
    INVALID,
    INVALID_EXAMPLES,
    SCHEMAS,
    VALID_EXAMPLES,
    schema_id_for,
)

ERRATA = SCHEMAS / "errata"
ERRATA_FILES = sorted(ERRATA.rglob("*.json"))
COMMON_ID = "https://portable-ckpt.dev/schemas/1.0/common.schema.json"
CHECKER = SchemaSet(SCHEMAS)

#: The released patterns with their ECMA-262 meaning in Python re (``.`` has no line terminator,
#: ``$`` is the end of the input): the oracle the errata patterns are compared with.
_DOT = "[^\n\r\u2028\u2029]"
OLD_PATH = re.compile(rf"^(?!(?:{_DOT}*/)?\.\.?(?:/|\Z))[A-Za-z0-9._-]{{1,255}}"
                      r"(?:/[A-Za-z0-9._-]{1,255}){0,7}\Z")
OLD_ENTRY_NAME = re.compile(r"^(?!(?:" + _DOT + r"*/)?\.\.?(?:/|\Z))[A-Za-z0-9._-]+"
                            r"(?:/[A-Za-z0-9._-]+)*\Z")
OLD_NO_CONTROL = re.compile("^[^\u0000-\u001f\u007f]+\\Z")
OLD_URL = re.compile("^[A-Za-z][A-Za-z0-9+.-]*://[^\u0000-\u0020\u007f]+\\Z")


def _load(p: Path) -> Any:
    return json.loads(p.read_text(encoding="utf-8"))


def _strip_patterns(node: Any) -> Any:
    """The schema without its regular expressions (and the ``not`` the errata moved them to)."""
    if isinstance(node, dict):
        return {k: _strip_patterns(v) for k, v in node.items()
                if k not in ("pattern", "not", "description", "title")}
    if isinstance(node, list):
        return [_strip_patterns(v) for v in node]
    return node


def _patterns(node: Any) -> list[str]:
    if isinstance(node, dict):
        out = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
        return out + [p for v in node.values() for p in _patterns(v)]
    if isinstance(node, list):
        return [p for v in node for p in _patterns(v)]
    return []


def test_errata_replace_released_files_with_the_same_id() -> None:
    """R-VERSION-11: errata schemas replace released files under the same ``$id``."""
    assert [p.relative_to(ERRATA).as_posix() for p in ERRATA_FILES] == ["common.schema.json",
                                                                        "copy.schema.json"]
    for p in ERRATA_FILES:
        released = SCHEMAS / p.relative_to(ERRATA)
        new, old = _load(p), _load(released)
        assert new["$id"] == old["$id"] and new["$schema"] == old["$schema"]
        # Only regular expressions changed (the original "not" members are kept verbatim).
        assert _strip_patterns(new) == _strip_patterns(old)


def _effective_schemas() -> list[Path]:
    released = [p for p in SCHEMAS.rglob("*.schema.json") if ERRATA not in p.parents]
    return [ERRATA / p.relative_to(SCHEMAS) if (ERRATA / p.relative_to(SCHEMAS)).is_file()
            else p for p in released]


@pytest.mark.parametrize("path", _effective_schemas(), ids=lambda p: p.relative_to(SCHEMAS)
                         .as_posix())
def test_every_pattern_validators_use_is_in_the_portable_subset(path: Path) -> None:
    """R-SEC-14: the spec's own schemas run on RE2, with and without the §18.7 rewrite."""
    opts = re2.Options()
    opts.log_errors = False
    for pattern in _patterns(_load(path)):
        reader_regex.compile_pattern(pattern)
        re2.compile(pattern, opts)  # a plain RE2 validator can run them as written


def test_the_released_common_schema_is_not_re2_compatible() -> None:
    """Why errata 1 exists: lookahead and nested counted repetition in the path pattern."""
    with pytest.raises(reader_regex.PatternError):
        reader_regex.compile_pattern(_load(SCHEMAS / "common.schema.json")["$defs"]["path"]
                                     ["pattern"])


def _valid(defn: str, value: Any) -> tuple[bool, bool]:
    """(reader verdict, checker verdict) of ``value`` against ``common#/$defs/<defn>``."""
    schema = {"$ref": f"{COMMON_ID}#/$defs/{defn}"}
    ours = not CHECKER.validate(schema, value)
    from portable_ckpt.format import schemas as fs

    validator = fs._SafeValidator(schema, registry=fs._registry())
    return bool(validator.is_valid(value)), ours


_component = st.one_of(st.sampled_from([".", "..", "...", ".a", "a.", "x" * 255, "y" * 256, ""]),
                       st.text("aZ09._-", min_size=1, max_size=4))
_paths = st.one_of(
    st.lists(_component, min_size=1, max_size=10).map("/".join),
    st.text("a.-/_\n\r\\é\u2028 ", max_size=12),
    st.lists(_component, min_size=1, max_size=3).map(lambda xs: "/".join(xs) + "\n"),
)


@settings(max_examples=150, deadline=None)
@given(_paths)
def test_path_and_entry_name_errata_accept_exactly_what_the_released_patterns_accept(
        s: str) -> None:
    want_path = bool(OLD_PATH.search(s)) and len(s) <= 2047
    assert _valid("path", s) == (want_path, want_path), s
    want_name = bool(OLD_ENTRY_NAME.search(s)) and len(s) <= 256
    assert _valid("entryName", s) == (want_name, want_name), s


@settings(max_examples=100, deadline=None)
@given(st.text(st.characters(max_codepoint=0x2030), max_size=8))
def test_key_name_and_url_errata_accept_exactly_what_the_released_patterns_accept(
        s: str) -> None:
    want = bool(OLD_NO_CONTROL.search(s)) and 1 <= len(s) <= 1024
    assert _valid("tensorKey", s) == (want, want), repr(s)
    url = "s3://" + s
    new = re2.compile(_load(ERRATA / "copy.schema.json")["properties"]["destination"]["pattern"])
    assert (new.search(url) is not None) == bool(OLD_URL.search(url)), repr(url)


def _reader_validate(example: Path, schema_id: str) -> bool:
    rel = schema_id.split("/schemas/", 1)[1]
    rel = rel.removeprefix("1.0/")
    try:
        validate_document(_load(example), rel, what=example.name)
    except SchemaError:
        return False
    return True


def _checker_validate(example: Path, schema_id: str) -> bool:
    return not CHECKER.validate(CHECKER.by_id[schema_id], _load(example))


@pytest.mark.parametrize("example", VALID_EXAMPLES + INVALID_EXAMPLES,
                         ids=lambda p: p.relative_to(EXAMPLES).as_posix())
def test_examples_get_the_same_verdict_from_the_errata_validators(example: Path) -> None:
    """Every valid example stays valid and every invalid one invalid (reader and checker)."""
    sid = schema_id_for(example)
    want = INVALID not in example.parents
    assert _checker_validate(example, sid) is want
    assert _reader_validate(example, sid) is want


def _keywords(node: Any, out: set[str]) -> set[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            out.add(k)
            if k in ("properties", "$defs", "patternProperties"):
                for sub in v.values():
                    _keywords(sub, out)
            elif k not in ("enum", "const", "required"):
                _keywords(v, out)
    elif isinstance(node, list):
        for v in node:
            _keywords(v, out)
    return out


def test_the_validator_feature_list_names_every_keyword_the_schemas_use() -> None:
    """§19.2 lists what a validator needs: every keyword of every shipped schema is named."""
    text = (SCHEMAS.parent / "README.md").read_text(encoding="utf-8")
    section = text.split("### 19.2 What a schema validator needs", 1)[1].split("\n## ", 1)[0]
    used: set[str] = set()
    for p in SCHEMAS.rglob("*.schema.json"):
        _keywords(_load(p), used)
    annotations = {"$schema", "$id", "$defs", "title", "description"}
    missing = sorted(k for k in used - annotations if f"`{k}`" not in section)
    assert not missing, f"keywords used by the schemas but not listed in §19.2: {missing}"


def _manifest_with(edit: Any) -> Any:
    doc = json.loads((SCHEMAS.parent / "examples" / "manifest.json").read_text())
    edit(doc)
    return doc


_TEXT_RULES = [  # (§19.2 table row, a document at the limit, one just past it)
    ("producer.name: 1 to 256 characters",
     lambda d: d["producer"].update(name="p" * 256), lambda d: d["producer"].update(name="p" * 257)),
    ("world_size 1 … 16,777,216",
     lambda d: d["continuation"].update(world_size=16777216, mesh=None),
     lambda d: d["continuation"].update(world_size=16777217, mesh=None)),
    ("mesh.dim_names pattern",
     lambda d: d["continuation"].update(world_size=2, mesh={"shape": [2],
                                                              "dim_names": ["_" + "a" * 63]}),
     lambda d: d["continuation"].update(world_size=2, mesh={"shape": [2],
                                                              "dim_names": ["a" * 65]})),
    ("mesh.dim_names: no leading digit",
     lambda d: d["continuation"].update(world_size=2, mesh={"shape": [2], "dim_names": ["d0"]}),
     lambda d: d["continuation"].update(world_size=2, mesh={"shape": [2], "dim_names": ["0d"]})),
    ("extension names",
     lambda d: d["extensions"].update({"a" + "b" * 127: {}}),
     lambda d: d["extensions"].update({"a" + "b" * 128: {}})),
    ("must_understand items",
     lambda d: d.update(must_understand=["x.y:z/w-1"]),
     lambda d: d.update(must_understand=["-x"])),
]


@pytest.mark.parametrize(("row", "at_limit", "past"), _TEXT_RULES, ids=[r[0] for r in _TEXT_RULES])
def test_the_rules_only_schemas_had_are_the_schemas_rules(row: str, at_limit: Any,
                                                          past: Any) -> None:
    """§19.2's table (issue 16 guess 6) restates the schemas: at each stated limit the schema
    accepts, one step past it rejects, for the reader's and the checker's validators."""
    del row
    ok, bad = _manifest_with(at_limit), _manifest_with(past)
    validate_document(ok, "manifest.schema.json", what="at the limit")
    with pytest.raises(SchemaError):
        validate_document(bad, "manifest.schema.json", what="past the limit")
    schema = CHECKER.document("manifest")
    assert schema is not None
    assert not CHECKER.validate(schema, ok)
    assert CHECKER.validate(schema, bad)
