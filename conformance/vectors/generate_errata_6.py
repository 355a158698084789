#!/usr/bin/env python3
"""Generate the golden vectors of errata 6 (run once; the output is frozen and committed).

Errata 6 adds the cases for disagreements that an outside implementer found between an
independent reader written from the spec, the reference reader and the conformance checker:

* the schema's rules that the reference reader did not apply: a ``files`` key
  ``manifest.json.<anything>`` (``manifest.json.bak``), an ``extensions`` member name outside
  ``^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$``, a mesh of no dimensions, an empty ``producer.name``
  and a ``must_understand`` that names an extension twice (``PCK-SCHEMA``);
* schema bounds that are not the format's limits (§17.2's closed list): ``continuation.world_size``
  above 16,777,216, a mesh of 65 dimensions, a ``block_size`` of 2^31 are ``PCK-SCHEMA``, not
  ``PCK-LIMIT``;
* the built-in entry schemas take integer tokens (R-SEC-18): ``{"step": 10.0}`` is no step, also
  where a built-in schema refers to itself (``pck:lr-scheduler/1``'s ``_schedulers``); embedded
  schemas keep Draft 2020-12's meaning (``1.0`` is an integer there);
* an embedded schema whose ``$schema`` names another dialect is unusable (R-ENTRY-3); one that
  names Draft 2020-12 is evaluated with the meaning of §18.7 everywhere, a ``$ref: "#"`` back
  into its root included (the jsonschema pitfall of §22);
* the pitfall in a 1.1 manifest, whose schema refers to the whole 1.0 manifest schema: a
  ``committed_at`` ending in a newline breaks the pattern (errata 1);
* a MINOR of 9 digits, the most the schemas allow, is a valid version (R-VERSION-4).

Uses the builders of ``generate_1_0.py`` and ``generate_1_1.py`` (standard library, numpy,
crc32c; they import zstandard, but no case here holds a zstd frame, so the bytes do not depend
on a compressor's version). Refuses to touch an existing vector directory unless ``--force`` is
given.

Usage: python conformance/vectors/generate_errata_6.py [--out DIR] [--force]
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _load(stem: str) -> Any:
    """A generator of the same directory (its builders are reused)."""
    path = Path(__file__).resolve().with_name(f"{stem}.py")
    spec = importlib.util.spec_from_file_location(f"pck_{stem}_for_errata_6", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


G = _load("generate_1_0")
E1 = _load("generate_errata_1")  # its command line writes this set too
T = _load("generate_1_1")
V, write_version = G.V, G.write_version
SHARD = "data/w00000-0000.safetensors"
VALUES = [-7, 993, 1993, 2993]
#: The dialect of every schema of the format (spec §12.1, §19.2).
DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"
#: An embedded schema that refers back to its root: a string "a", or an array of such values.
NESTED_A = {"$schema": DRAFT_2020_12,
            "anyOf": [{"type": "string", "pattern": "^a$"},
                      {"type": "array", "items": {"$ref": "#"}}]}
CASES: list[dict[str, Any]] = []


def case(name: str, feature: str, *, code: str | None = None) -> Callable[
        [Callable[[Path], Any]], Callable[[Path], Any]]:
    """Register a case generator (valid when ``code`` is None)."""
    def deco(fn: Callable[[Path], Any]) -> Callable[[Path], Any]:
        CASES.append({"name": name, "feature": feature, "code": code, "reader": None, "fn": fn})
        return fn
    return deco


def one_tensor(step: int = 10) -> Any:
    """``w`` (int64[4], one range) and one global entry."""
    v = V(step)
    v.tensor("w", "int64", [4], VALUES)
    v.entry("meta", {"note": "errata-6"})
    return v


def with_entry(name: str, value: Any, schema: dict[str, Any]) -> Any:
    """``w`` and one global entry ``name`` holding ``value`` under ``schema``."""
    v = V()
    v.tensor("w", "int64", [4], VALUES)
    v.entry(name, value, schema=schema)
    return v


def edited(root: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """:func:`one_tensor`, its manifest changed by ``edit`` once the file records are made."""
    write_version(root, one_tensor(), mutate_manifest=edit)


# ------------------------------------------------------------------------------------ valid
@case("valid-embedded-integral-float", "R-SEC-18, §12.1: an embedded schema keeps Draft "
      "2020-12's meaning: {\"a\": 1.0} is valid under {\"properties\": {\"a\": {\"type\": "
      "\"integer\"}}} (only format documents and the built-in schemas take integer tokens)")
def _(root: Path) -> Any:
    v = with_entry("cfg", {"a": 1.0},
                   {"json_schema": {"type": "object", "properties": {"a": {"type": "integer"}},
                                    "required": ["a"]}})
    write_version(root, v)
    return v


@case("valid-embedded-schema-2020-12", "§12.1: an embedded schema whose $schema is "
      "https://json-schema.org/draft/2020-12/schema and which refers back to its root "
      "($ref \"#\"): [\"a\", [\"a\"]] is valid")
def _(root: Path) -> Any:
    v = with_entry("tree", ["a", ["a"]], {"json_schema": NESTED_A})
    write_version(root, v)
    return v


@case("valid-format-version-9-digit-minor", "R-VERSION-4, §16.1: format_version 1.123456789, "
      "a MINOR of 9 digits (the most the schemas allow), newer than 1.1, and a document "
      "valid under the 1.1 schema: a version every 1.x reader reads")
def _(root: Path) -> Any:
    v = one_tensor()
    write_version(root, v, mutate_manifest=lambda m: m.update(format_version="1.123456789"))
    return v


# ---------------------------------------------------------------------------------- invalid
@case("invalid-files-key-manifest-json-bak", "R-COMMIT-15, §19.2: files lists "
      "manifest.json.bak (a file of the attempt, with its checksum): the schema forbids the "
      "files keys manifest.json and manifest.json.<anything>", code="PCK-SCHEMA")
def _(root: Path) -> None:
    v = one_tensor()
    v.files["manifest.json.bak"] = b'{"backup": true}\n'
    write_version(root, v)


@case("invalid-extensions-name", "R-COMMIT-15, R-VERSION-6, §19.2: extensions has a member "
      "named -acme, outside ^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$ (a reader ignores what "
      "extensions hold, not their names)", code="PCK-SCHEMA")
def _(root: Path) -> None:
    edited(root, lambda m: m.update(extensions={"-acme": {"sig": "00"}}))


@case("invalid-world-size-above-limit", "§17.2, R-COMMIT-15: continuation.world_size "
      "16777217, one above the schema's 16,777,216: PCK-SCHEMA (§17.2's list of PCK-LIMIT "
      "overrides names sizes, shapes, offsets and lengths above MAXINT only)", code="PCK-SCHEMA")
def _(root: Path) -> None:
    edited(root, lambda m: m["continuation"].update(world_size=16777217))


@case("invalid-mesh-65-dimensions", "§17.2, §19.2: a mesh of 65 dimensions of size 1 (named "
      "d0 … d64) for world size 1: the schema allows 1 to 64 (PCK-SCHEMA; §17.2's 64-item "
      "PCK-LIMIT is for a tensor's shape, offsets and lengths)", code="PCK-SCHEMA")
def _(root: Path) -> None:
    edited(root, lambda m: m["continuation"].update(
        mesh={"shape": [1] * 65, "dim_names": [f"d{i}" for i in range(65)]}))


@case("invalid-mesh-no-dimensions", "§19.2: a mesh of no dimensions (shape [], dim_names []; "
      "their product 1 is the world size): the schema requires 1 to 64", code="PCK-SCHEMA")
def _(root: Path) -> None:
    edited(root, lambda m: m["continuation"].update(mesh={"shape": [], "dim_names": []}))


@case("invalid-block-size-2-31", "§6.2, §17.2: the shard's checksum block_size is 2^31 (its "
      "one block checksum is right): not one of the 19 powers of two 4096 … 2^30 (PCK-SCHEMA, "
      "not PCK-LIMIT)", code="PCK-SCHEMA")
def _(root: Path) -> None:
    edited(root, lambda m: m["files"][SHARD]["checksum"].update(block_size=2**31))


@case("invalid-producer-name-empty", "§19.2: producer.name is the empty string; the schema "
      "requires 1 to 256 characters", code="PCK-SCHEMA")
def _(root: Path) -> None:
    edited(root, lambda m: m["producer"].update(name=""))


@case("invalid-must-understand-duplicate", "R-COMMIT-15: must_understand lists tensor-table "
      "twice (an extension every 1.1 reader implements): the schema's uniqueItems",
      code="PCK-SCHEMA")
def _(root: Path) -> None:
    edited(root, lambda m: m.update(must_understand=["tensor-table", "tensor-table"]))


@case("invalid-builtin-entry-integral-float", "R-SEC-18, §12.5: an entry declared with "
      "pck:step/1 holds {\"step\": 10.0} (the manifest's step is 10): the built-in schemas "
      "take integer tokens, as format documents do", code="PCK-ENTRY-SCHEMA")
def _(root: Path) -> None:
    write_version(root, with_entry("progress", {"step": 10.0}, {"id": "pck:step/1"}))


@case("invalid-builtin-entry-nested-integral-float", "R-SEC-18, §12.5, §22: an entry declared "
      "with pck:lr-scheduler/1 holds {\"_schedulers\": [{\"last_epoch\": 4.0}]}; the schema "
      "refers to itself ($ref \"#\") for _schedulers, and its integers stay integer tokens "
      "there", code="PCK-ENTRY-SCHEMA")
def _(root: Path) -> None:
    write_version(root, with_entry("sched", {"_schedulers": [{"last_epoch": 4.0}]},
                                   {"id": "pck:lr-scheduler/1"}))


@case("invalid-embedded-schema-draft-07", "R-ENTRY-3, §12.1: an embedded schema whose $schema "
      "is http://json-schema.org/draft-07/schema# (value {\"a\": 1}): embedded schemas are "
      "Draft 2020-12, a schema of another dialect is unusable", code="PCK-ENTRY-SCHEMA")
def _(root: Path) -> None:
    write_version(root, with_entry("cfg", {"a": 1}, {"json_schema": {
        "$schema": "http://json-schema.org/draft-07/schema#", "type": "object"}}))


@case("invalid-embedded-schema-ref-root-newline", "§18.7, §22: the schema of "
      "valid-embedded-schema-2020-12 and the value [\"a\\n\"]: ^a$ does not match a string "
      "ending in a newline, also where the schema is reached through $ref \"#\" into a root "
      "that declares $schema", code="PCK-ENTRY-SCHEMA")
def _(root: Path) -> None:
    write_version(root, with_entry("tree", ["a\n"], {"json_schema": NESTED_A}))


@case("invalid-table-manifest-timestamp-newline", "§18.7, §22: a 1.1 manifest (with a tensor "
      "table) whose committed_at ends in a newline; the 1.1 schema refers to the whole 1.0 "
      "manifest schema, whose timestamp pattern still applies", code="PCK-SCHEMA")
def _(root: Path) -> None:
    v = T.basic("none")
    T.write_version(root, v, mutate_manifest=lambda m: m.update(
        committed_at=m["committed_at"] + "\n"))


DESCRIPTION = ("Golden vectors of errata 6 (spec §20): schema rules the reference reader did "
               "not apply (files key manifest.json.bak, extensions names, empty mesh, empty "
               "producer name, a must_understand item twice), schema bounds that are "
               "PCK-SCHEMA and not PCK-LIMIT (world size, mesh dimensions, block size), "
               "integer tokens in built-in entry schemas, the dialect of embedded schemas, "
               "$ref into a resource that declares $schema, a 9-digit MINOR. 'target' is "
               "relative to the case directory.")


def main(argv: list[str] | None = None) -> int:
    """Write every case below ``--out`` (default: ``errata-6`` next to this script)."""
    return int(E1.write_set(argv, CASES, "errata-6", DESCRIPTION, __doc__))


if __name__ == "__main__":
    sys.exit(main())
