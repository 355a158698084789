"""Errata 6 (spec §23): what an outside implementer's independent reader disagreed on.

The reference reader's side of each item; the conformance checker's side is the ``errata-6``
golden vectors (conformance/tests/test_vectors.py), read by this reader too
(conformance/tests/test_vectors_errata.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.errors import CheckpointError
from portable_ckpt.format.manifest import FORMAT_VERSIONS
from portable_ckpt.format.schemas import validate_entry_value
from portable_ckpt.io.versions import classify_attempt, list_versions
from portable_ckpt.storage import open_storage

from ._util import (
    build_version,
    edit_manifest,
    expect_code,
    open_and_read_all,
    read_manifest,
    rechecksum,
    rewrite_file,
)

DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"
DRAFT_07 = "http://json-schema.org/draft-07/schema#"


def _with_entry(tmp_path: Path, schema: dict[str, Any], value: Any) -> Path:
    """A version whose entry ``cfg`` is declared with ``schema`` and holds ``value``."""
    vdir, _ = build_version(tmp_path)
    rel = read_manifest(vdir)["entries"]["cfg"]["values"][0]["file"]
    edit_manifest(vdir, lambda d: d["entries"]["cfg"].update(schema=schema))
    rewrite_file(vdir, rel, json.dumps(value).encode())
    return vdir


def _entry_code(tmp_path: Path, schema: dict[str, Any], value: Any) -> str | None:
    """The code of reading entry ``cfg`` (None when it reads as ``value``)."""
    vdir = _with_entry(tmp_path, schema, value)
    try:
        got = portable_ckpt.open(vdir).entry("cfg")
    except CheckpointError as exc:
        return exc.code
    assert json.dumps(got) == json.dumps(value)  # JSON types too: 1.0 stays 1.0
    return None


# -- F1: files keys -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["manifest.json.bak", "manifest.json.", "manifest.json.x.y"])
def test_files_key_manifest_json_anything_is_refused(tmp_path: Path, name: str) -> None:
    """R-COMMIT-15, R-FILES-1 (§19.2): ``manifest.json.<anything>`` is no files key."""
    vdir, _ = build_version(tmp_path)
    (vdir / name).write_bytes(b'{"backup": true}\n')
    edit_manifest(vdir, lambda d: d["files"].__setitem__(name, d["files"]["index/w00000.json"]))
    rechecksum(vdir, name)
    err = expect_code("PCK-SCHEMA", portable_ckpt.open, vdir)
    assert "manifest.json.<anything>" in err.message


def test_files_key_manifest_jsonl_is_allowed(tmp_path: Path) -> None:
    """R-FILES-1 (errata 4): ``manifest.jsonl`` is an ordinary file and may be listed."""
    vdir, _ = build_version(tmp_path)
    (vdir / "manifest.jsonl").write_bytes(b"{}\n")
    edit_manifest(vdir, lambda d: d["files"].__setitem__("manifest.jsonl",
                                                         d["files"]["index/w00000.json"]))
    rechecksum(vdir, "manifest.jsonl")
    open_and_read_all(vdir)


# -- F2: extensions member names ---------------------------------------------------------------
@pytest.mark.parametrize("name", ["-acme", "_vendor", "", "a" * 129, "acme sign", "é"])
def test_extensions_names_outside_the_pattern_are_refused(tmp_path: Path, name: str) -> None:
    """R-COMMIT-15, R-VERSION-6: a reader ignores what ``extensions`` hold, not their names."""
    vdir, _ = build_version(tmp_path)
    edit_manifest(vdir, lambda d: d.update(extensions={name: {"sig": "00"}}))
    expect_code("PCK-SCHEMA", portable_ckpt.open, vdir)


@pytest.mark.parametrize("name", ["acme.sign", "x", "a" * 128, "org.example:v2/part-1"])
def test_extensions_names_inside_the_pattern_are_ignored(tmp_path: Path, name: str) -> None:
    """R-VERSION-6: ``^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$``, contents ignored."""
    vdir, _ = build_version(tmp_path)
    edit_manifest(vdir, lambda d: d.update(extensions={name: [1, {"k": None}]}))
    open_and_read_all(vdir)


# -- F3: integer tokens in built-in entry schemas ----------------------------------------------
@pytest.mark.parametrize(("schema_id", "value"), [
    ("pck:step/1", {"step": 1.0}),
    ("pck:step/1", {"step": 1, "tokens_seen": 10.0}),
    ("pck:lr-scheduler/1", {"last_epoch": 4.0}),
    # _schedulers' items are {"$ref": "#"}: the schema's root, which declares $schema (§22).
    ("pck:lr-scheduler/1", {"_schedulers": [{"last_epoch": 4.0}]}),
    ("pck:lr-scheduler/1", {"_schedulers": [{"_schedulers": [{"_step_count": 1e0}]}]}),
])
def test_builtin_schemas_take_integer_tokens(tmp_path: Path, schema_id: str, value: Any) -> None:
    """R-SEC-18, §12.5 (errata 6): ``4.0`` is no integer for a built-in entry schema."""
    assert _entry_code(tmp_path, {"id": schema_id}, value) == "PCK-ENTRY-SCHEMA"


@pytest.mark.parametrize(("schema_id", "value"), [
    ("pck:step/1", {"step": 1, "tokens_seen": 10}),
    ("pck:lr-scheduler/1", {"_schedulers": [{"last_epoch": 4, "base_lrs": [0.1]}]}),
])
def test_builtin_schemas_accept_integer_tokens(tmp_path: Path, schema_id: str, value: Any) -> None:
    """R-SEC-18: the same values written as integer tokens are valid."""
    assert _entry_code(tmp_path, {"id": schema_id}, value) is None


def test_embedded_schemas_keep_draft_2020_12_integers(tmp_path: Path) -> None:
    """R-SEC-18, §12.1: an embedded schema decides; in Draft 2020-12 ``1.0`` is an integer."""
    schema = {"json_schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}
    assert _entry_code(tmp_path, schema, {"a": 1.0}) is None


# -- F4: the dialect of embedded schemas --------------------------------------------------------
@pytest.mark.parametrize("json_schema", [
    {"$schema": DRAFT_07, "type": "object"},
    {"$schema": DRAFT_2020_12 + "#", "type": "object"},
    {"$schema": "https://json-schema.org/draft/2019-09/schema"},
    # A subschema that declares another dialect (an embedded resource) is refused too.
    {"$defs": {"x": {"$id": "urn:x", "$schema": DRAFT_07, "type": "object"}},
     "$ref": "#/$defs/x"},
    {"properties": {"a": {"$schema": DRAFT_07}}},
])
def test_embedded_schema_of_another_dialect_is_unusable(tmp_path: Path,
                                                        json_schema: dict[str, Any]) -> None:
    """R-ENTRY-3, §12.1 (errata 6): ``$schema`` other than Draft 2020-12 is PCK-ENTRY-SCHEMA."""
    assert _entry_code(tmp_path, {"json_schema": json_schema}, {"a": 1}) == "PCK-ENTRY-SCHEMA"


@pytest.mark.parametrize("json_schema", [
    {"type": "object"},
    {"$schema": DRAFT_2020_12, "type": "object"},
    {"$defs": {"x": {"$id": "urn:x", "$schema": DRAFT_2020_12, "type": "object"}},
     "$ref": "#/$defs/x"},
    # A value named $schema is no keyword.
    {"properties": {"a": {"const": {"$schema": DRAFT_07}}}},
])
def test_embedded_schema_of_draft_2020_12_is_used(tmp_path: Path,
                                                  json_schema: dict[str, Any]) -> None:
    """§12.1: an absent ``$schema`` or the Draft 2020-12 URI: the schema is applied."""
    value = {"a": {"$schema": DRAFT_07}}
    assert _entry_code(tmp_path, {"json_schema": json_schema}, value) is None


def test_ref_into_a_root_with_schema_keeps_the_patterns_of_18_7() -> None:
    """R-ENTRY-15, §18.7, §22: ``$ref: "#"`` into a root that declares ``$schema`` is evaluated
    like the rest of the schema — RE2 with ECMA-262's ``$`` (no match before a final newline),
    within the budget of R-ENTRY-16 — not by jsonschema's stock validator class with Python's
    backtracking ``re``."""
    schema = {"json_schema": {"$schema": DRAFT_2020_12, "anyOf": [
        {"type": "string", "pattern": "^a$"}, {"type": "array", "items": {"$ref": "#"}}]}}
    validate_entry_value(["a", ["a"]], schema, name="tree")
    expect_code("PCK-ENTRY-SCHEMA", validate_entry_value, ["a\n"], schema, name="tree")
    # (a+)+ backtracks exponentially in Python's re: 28 characters took ~20 s there.
    redos = {"json_schema": {"$schema": DRAFT_2020_12, "anyOf": [
        {"type": "string", "pattern": "^(a+)+$"}, {"type": "array", "items": {"$ref": "#"}}]}}
    t0 = time.monotonic()
    expect_code("PCK-ENTRY-SCHEMA", validate_entry_value, ["a" * 28 + "!"], redos, name="r")
    assert time.monotonic() - t0 < 5


# -- F5, F6: foreign commit records -------------------------------------------------------------
#: A MINOR newer than this reader implements (contributor review D5: a literal "1.3" stops being
#: newer when 1.3 is implemented).
NEWER = f"1.{max(int(v.split('.')[1]) for v in FORMAT_VERSIONS) + 1}"


@pytest.mark.parametrize(("change", "cause"), [
    (lambda d: (d.update(format_version=NEWER), d.pop("producer")), "producer"),
    (lambda d: d.update(format_version="1.12", tensors={"a": {"layout": "future"}}), "layout"),
    (lambda d: d.update(format_version="1.1234567890"), "MINOR of 10 digits"),
    (lambda d: d.update(format_version="1." + "7" * 5000), "MINOR of 5000 digits"),
])
def test_foreign_record_opened_explicitly_is_version_unsupported(
        tmp_path: Path, change: Any, cause: str) -> None:
    """R-VERSION-10 (errata 6): a newer version that fails the checks is foreign; opened
    explicitly it is PCK-VERSION-UNSUPPORTED, the failure named in the message."""
    vdir, m = build_version(tmp_path)
    edit_manifest(vdir, change)
    err = expect_code("PCK-VERSION-UNSUPPORTED", portable_ckpt.open, vdir)
    assert cause in err.message and "newer" in err.message
    c = classify_attempt(open_storage(tmp_path), m.attempt_id)
    assert c.status == "foreign" and c.error is not None
    assert c.error.code == "PCK-VERSION-UNSUPPORTED"


@pytest.mark.parametrize(("version", "status"), [
    ("1.1234567890", "foreign"),  # the text's MAJOR.MINOR, newer than 1.1 (errata 6)
    ("1.123456789", "committed"),  # 9 digits: the schema's limit (R-VERSION-4)
    ("12345678901.0", "foreign"),  # an unknown MAJOR, however long (R-VERSION-3)
    ("9" * 5000 + ".0", "foreign"),  # more digits than CPython converts to an int
    ("1.2\n", "invalid"),  # not MAJOR.MINOR (errata 1: no $ before a final newline)
    ("1.02", "invalid"),  # a leading zero
])
def test_well_formed_format_version_is_the_texts(tmp_path: Path, version: str,
                                                 status: str) -> None:
    """§16.1, R-VERSION-10 (errata 6): well-formed is MAJOR.MINOR of any number of digits."""
    vdir, m = build_version(tmp_path)
    edit_manifest(vdir, lambda d: d.update(format_version=version))
    [v] = list_versions(open_storage(tmp_path))
    assert v.status == status, v.error
    if status == "committed":
        open_and_read_all(vdir)
    elif status == "foreign":
        expect_code("PCK-VERSION-UNSUPPORTED", portable_ckpt.open, vdir)
    else:
        expect_code("PCK-SCHEMA", portable_ckpt.open, vdir)


def test_gc_keeps_a_record_with_a_ten_digit_minor(tmp_path: Path) -> None:
    """R-VERSION-10, R-GC-7 (errata 6): ``1.1234567890`` is foreign, so gc keeps it (it was
    called invalid and deleted)."""
    old = portable_ckpt.save_arrays(tmp_path, {"a": np.ones(3, np.float32)}, step=4)
    new = portable_ckpt.save_arrays(tmp_path, {"a": np.ones(3, np.float32)}, step=9)
    edit_manifest(tmp_path / old.attempt_id, lambda d: d.update(format_version="1.1234567890"))
    report = portable_ckpt.gc(tmp_path, keep=1, grace_seconds=0,
                              now=lambda: time.time() + 10**6)
    assert report.foreign == [old.attempt_id] and report.deleted == []
    assert report.kept == [new.attempt_id]
    assert (tmp_path / old.attempt_id / "manifest.json").is_file()


# -- F7: schema bounds are PCK-SCHEMA, MAXINT is PCK-LIMIT --------------------------------------
def _mesh(shape: list[int], ws: int) -> Any:
    def edit(d: dict[str, Any]) -> None:
        d["continuation"].update(world_size=ws, mesh={
            "shape": shape, "dim_names": [f"d{i}" for i in range(len(shape))]})
    return edit


def _block_size(bs: int) -> Any:
    def edit(d: dict[str, Any]) -> None:
        d["files"]["data/w00000-0000.safetensors"]["checksum"]["block_size"] = bs
    return edit


@pytest.mark.parametrize("edit", [
    lambda d: d["continuation"].update(world_size=2**24 + 1),
    lambda d: d["continuation"].update(world_size=2**53),
    lambda d: d.update(step=10**12),
    _mesh([2] + [1] * 64, 2),
    _mesh([2**53], 2**53),
    _block_size(2**31),
    _block_size(2**53),
    lambda d: d["entries"]["cfg"].update(scope="per_rank", world_size_policy="drop", values=[
        {"rank": 2**24, "file": d["entries"]["cfg"]["values"][0]["file"]}]),
], ids=["world-size-2^24+1", "world-size-2^53", "step-10^12", "mesh-65-dims", "mesh-dim-2^53",
        "block-size-2^31", "block-size-2^53", "rank-2^24"])
def test_schema_bounds_are_schema_errors(tmp_path: Path, edit: Any) -> None:
    """§17.2, R-ERR-3, R-COMMIT-15 (errata 6): §17.2's list of PCK-LIMIT overrides is closed
    (a tensor's shape, a size, offsets and lengths above MAXINT; more than 64 items of a
    tensor's shape, offsets or lengths); a value outside another bound of the schema is
    PCK-SCHEMA."""
    vdir, _ = build_version(tmp_path)
    edit_manifest(vdir, edit)
    expect_code("PCK-SCHEMA", portable_ckpt.open, vdir)


@pytest.mark.parametrize("edit", [
    lambda d: d["files"]["data/w00000-0000.safetensors"].update(size=2**53),
    lambda d: d["tensors"]["b"].update(shape=[2**53]),
    lambda d: d["tensors"]["b"].update(shape=[5] + [1] * 64),
    lambda d: d["tensors"]["b"]["ranges"][0].update(offsets=[2**53]),
])
def test_the_formats_limits_are_limit_errors(tmp_path: Path, edit: Any) -> None:
    """§17.2, R-SEC-3: the limits §17.2 names stay PCK-LIMIT."""
    vdir, _ = build_version(tmp_path)
    edit_manifest(vdir, edit)
    expect_code("PCK-LIMIT", portable_ckpt.open, vdir)


# -- schema rules the reader did not apply ------------------------------------------------------
@pytest.mark.parametrize("edit", [
    _mesh([], 1),
    lambda d: d["producer"].update(name=""),
    lambda d: d["producer"].update(version=""),
    lambda d: d.update(must_understand=["tensor-table", "tensor-table"]),
], ids=["mesh-no-dimensions", "producer-name-empty", "producer-version-empty",
        "must-understand-twice"])
def test_manifest_schema_rules_the_reader_applies(tmp_path: Path, edit: Any) -> None:
    """R-COMMIT-15 (§19.2's table): a mesh has 1 to 64 dimensions, a producer's name and
    version 1 to 256 characters, ``must_understand`` no item twice."""
    vdir, _ = build_version(tmp_path)
    edit_manifest(vdir, edit)
    expect_code("PCK-SCHEMA", portable_ckpt.open, vdir)


@pytest.mark.parametrize("mu", [[5], [None], [{"x": 1}], ["tensor-table", 1]])
def test_must_understand_items_that_name_no_known_extension(tmp_path: Path, mu: Any) -> None:
    """R-VERSION-5, §16.3: ``must_understand`` is checked before the schema; an item that is not
    an extension the reader implements is PCK-FEATURE-UNSUPPORTED (as the checker says)."""
    vdir, _ = build_version(tmp_path)
    edit_manifest(vdir, lambda d: d.update(must_understand=mu))
    expect_code("PCK-FEATURE-UNSUPPORTED", portable_ckpt.open, vdir)


# -- F8: links inside the attempt ---------------------------------------------------------------
def test_reader_may_refuse_a_link_inside_the_attempt(tmp_path: Path) -> None:
    """R-SEC-1 (errata 6): a reader MUST NOT follow a link out of the attempt and MAY refuse
    every link; the reference reader refuses them all (``O_NOFOLLOW``), PCK-PATH-UNSAFE."""
    vdir, _ = build_version(tmp_path)
    rel = "data/w00000-0001.safetensors"
    (vdir / rel).rename(vdir / "data" / "real.bin")
    (vdir / rel).symlink_to("real.bin")
    ck = portable_ckpt.open(vdir)
    expect_code("PCK-PATH-UNSAFE", ck.read, "b")
