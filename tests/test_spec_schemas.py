"""The spec's JSON Schemas are valid, resolve offline, and agree with the example documents.

File-name convention (spec/README.md, section "Schemas and examples"):

* ``spec/examples/<stem>[--<variant>].json`` validates against
  ``spec/schemas/<stem>.schema.json``;
* ``spec/examples/entries/<stem>[--<variant>].json`` validates against
  ``spec/schemas/entries/<stem>.schema.json``;
* ``spec/examples/invalid/[entries/]<stem>--<rule>.json`` breaks exactly the rule ``<rule>`` and
  fails validation against the same schema.
* Format 1.1 (unreleased): ``spec/schemas/1.1/<stem>.schema.json`` have the ``$id`` base
  ``https://portable-ckpt.dev/schemas/1.1/``; their examples are ``spec/examples/1.1/`` and
  ``spec/examples/invalid/1.1/`` under the same naming rules. A 1.1 schema extends the 1.0 schema
  of its kind, so every valid 1.0 example of that kind also validates against it (a 1.1 reader reads
  every 1.0 document) and every invalid 1.0 example stays invalid.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Iterator
from itertools import product
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource, Unresolvable

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "spec"
SCHEMAS = SPEC / "schemas"
EXAMPLES = SPEC / "examples"
INVALID = EXAMPLES / "invalid"
BASE_URI = "https://portable-ckpt.dev/schemas/1.0/"
#: Sub-directories of spec/schemas and spec/examples holding a later minor version, with their
#: base: found by listing (contributor review D4: a 1.3 set needed a line here).
MINOR_DIRS = {
    d.name: f"https://portable-ckpt.dev/schemas/{d.name}/"
    for d in sorted(SCHEMAS.iterdir())
    if re.fullmatch(r"1\.[1-9][0-9]*", d.name)
}

#: The released schemas; ``spec/schemas/errata/`` (same ``$id``s) is tested in test_spec_errata.py.
SCHEMA_FILES = sorted(p for p in SCHEMAS.rglob("*.schema.json") if "errata" not in p.parts)
VALID_EXAMPLES = sorted(p for p in EXAMPLES.rglob("*.json") if INVALID not in p.parents)
INVALID_EXAMPLES = sorted(INVALID.rglob("*.json"))
DOCUMENT_SCHEMAS = ["manifest", "writer-index", "drill", "copy"]
#: The 1.1 schemas: the two documents that may reference a tensor table, and the reference itself.
SCHEMAS_1_1 = ["manifest", "writer-index", "table-ref"]
#: The 1.2 schema: verification records that clear failed ones (spec §14.5, R-DRILL-10).
SCHEMAS_1_2 = ["verification"]
#: The 1.3 schemas: the manifest and writer index with the dtypes of 1.3 (spec §7), and the
#: shared definitions they use (the longer dtype list).
SCHEMAS_1_3 = ["common", "manifest", "writer-index"]
#: The schemas of each later MINOR, each of a kind whose 1.0 examples keep their verdict under it.
SCHEMAS_BY_MINOR = {"1.1": SCHEMAS_1_1, "1.2": SCHEMAS_1_2, "1.3": SCHEMAS_1_3}
ENTRY_SCHEMAS = {
    "pck:step/1": "step",
    "pck:lr-scheduler/1": "lr-scheduler",
    "pck:grad-scaler/1": "grad-scaler",
    "pck:rng/1": "rng",
    "pck:data-position/1": "data-position",
    "pck:json/1": "json",
}


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _load(path: Path) -> Any:
    with path.open("rb") as f:
        return json.loads(f.read().decode("utf-8"))


def _no_network(uri: str) -> Resource[Any]:
    raise NoSuchResource(ref=uri)


def build_registry() -> Registry[Any]:
    """All spec schemas, keyed by their ``$id``; any other URI fails instead of being fetched."""
    resources = []
    for path in SCHEMA_FILES:
        schema = _load(path)
        resources.append((schema["$id"], Resource.from_contents(schema)))
    registry: Registry[Any] = Registry(retrieve=_no_network)  # type: ignore[call-arg]
    return registry.with_resources(resources)


REGISTRY = build_registry()


def _base_and_rest(rel: Path) -> tuple[str, Path]:
    """The ``$id`` base for a path relative to spec/schemas or spec/examples[/invalid]."""
    if len(rel.parts) > 1 and rel.parts[0] in MINOR_DIRS:
        return MINOR_DIRS[rel.parts[0]], Path(*rel.parts[1:])
    return BASE_URI, rel


def expected_schema_id(path: Path) -> str:
    """The ``$id`` a schema file must carry: its path below spec/schemas, on its version's base."""
    base, rest = _base_and_rest(path.relative_to(SCHEMAS))
    return base + rest.as_posix()


def schema_id_for(path: Path) -> str:
    """Map an example (valid or invalid) to the ``$id`` of the schema it is checked against."""
    base, rel = _base_and_rest(path.relative_to(INVALID if INVALID in path.parents else EXAMPLES))
    stem = rel.name.removesuffix(".json").split("--", 1)[0]
    sub = "entries/" if rel.parts[0] == "entries" else ""
    return f"{base}{sub}{stem}.schema.json"


def is_1_0_example(path: Path) -> bool:
    """True for the released 1.0 examples (everything outside the minor-version folders)."""
    rel = path.relative_to(INVALID if INVALID in path.parents else EXAMPLES)
    return not (len(rel.parts) > 1 and rel.parts[0] in MINOR_DIRS)


def validator_for(schema_id: str) -> Draft202012Validator:
    schema = REGISTRY.contents(schema_id)
    return Draft202012Validator(schema, registry=REGISTRY)


def _walk_refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _walk_refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk_refs(item)


# --------------------------------------------------------------------------- schemas


def test_schema_files_present() -> None:
    names = {_rel(p) for p in SCHEMA_FILES}
    for stem in [*DOCUMENT_SCHEMAS, "common"]:
        assert f"spec/schemas/{stem}.schema.json" in names
    for stem in ENTRY_SCHEMAS.values():
        assert f"spec/schemas/entries/{stem}.schema.json" in names
    # Every MINOR's directory is listed here, file by file (review D4: a 1.3 set had no test
    # that the 1.0 examples keep their verdict under it, and nothing failed).
    assert set(SCHEMAS_BY_MINOR) == set(MINOR_DIRS), "a new MINOR: add its SCHEMAS_BY_MINOR row"
    for minor, stems in SCHEMAS_BY_MINOR.items():
        have = {n for n in names if n.startswith(f"spec/schemas/{minor}/")}
        assert have == {f"spec/schemas/{minor}/{stem}.schema.json" for stem in stems}, minor


@pytest.mark.parametrize("path", SCHEMA_FILES, ids=_rel)
def test_schema_is_valid_draft_2020_12(path: Path) -> None:
    schema = _load(path)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == expected_schema_id(path)
    Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("path", SCHEMA_FILES, ids=_rel)
def test_schema_refs_resolve_offline(path: Path) -> None:
    schema = _load(path)
    resolver = REGISTRY.resolver(base_uri=schema["$id"])
    refs = list(_walk_refs(schema))
    minor = path.relative_to(SCHEMAS).parts[0] in MINOR_DIRS
    for ref in refs:
        if re.match(r"^[a-z]+://", ref):
            # 1.0 schemas refer to each other relatively; a later minor's schemas may name the
            # released 1.0 schema they extend by its absolute $id (never anything else).
            assert minor and ref.startswith(BASE_URI), f"{_rel(path)}: absolute $ref {ref!r}"
        resolved = resolver.lookup(ref)
        assert resolved.contents is not None


def test_unknown_remote_ref_is_not_fetched() -> None:
    """R-SEC-13: schema references resolve only against the shipped schemas, never remotely."""
    schema = {"$ref": "https://example.invalid/remote.schema.json"}
    validator = Draft202012Validator(schema, registry=REGISTRY)
    with pytest.raises(Unresolvable, match=r"https://example\.invalid/remote\.schema\.json"):
        validator.validate({})  # the registry's retrieve refused it: never fetched


# --------------------------------------------------------------------------- examples


def test_every_schema_has_examples() -> None:
    valid_ids = {schema_id_for(p) for p in VALID_EXAMPLES}
    invalid_ids = {schema_id_for(p) for p in INVALID_EXAMPLES}
    for path in SCHEMA_FILES:
        schema_id = _load(path)["$id"]
        if path.name == "common.schema.json":
            continue
        assert schema_id in valid_ids, f"no valid example for {schema_id}"
        if path.name != "json.schema.json":  # pck:json/1 accepts every JSON value
            assert schema_id in invalid_ids, f"no invalid example for {schema_id}"


@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=_rel)
def test_valid_example_validates(path: Path) -> None:
    """R-VERSION-1: format documents validate against the schema of their kind."""
    schema_id = schema_id_for(path)
    assert schema_id in {str(u) for u in REGISTRY}, f"{_rel(path)}: no schema {schema_id}"
    errors = sorted(validator_for(schema_id).iter_errors(_load(path)), key=str)
    assert not errors, f"{_rel(path)}: " + "; ".join(e.message for e in errors[:5])


@pytest.mark.parametrize("path", INVALID_EXAMPLES, ids=_rel)
def test_invalid_example_fails(path: Path) -> None:
    assert "--" in path.name, f"{_rel(path)}: invalid examples are named <stem>--<rule>.json"
    schema_id = schema_id_for(path)
    assert schema_id in {str(u) for u in REGISTRY}, f"{_rel(path)}: no schema {schema_id}"
    assert not validator_for(schema_id).is_valid(_load(path)), f"{_rel(path)} validates"


def test_invalid_examples_have_unique_rules() -> None:
    names = [p.name for p in INVALID_EXAMPLES]
    assert len(names) == len(set(names))


# ------------------------------------------------------------- format 1.1 (tensor tables)

#: Per later MINOR, the valid and invalid 1.0 examples of the kinds its schemas extend.
_EXTENDED_1_0 = {
    minor: [
        p for p in VALID_EXAMPLES + INVALID_EXAMPLES
        if is_1_0_example(p)
        and schema_id_for(p).removeprefix(BASE_URI).removesuffix(".schema.json") in stems
    ]
    for minor, stems in SCHEMAS_BY_MINOR.items()
}


def test_1_1_examples_exist() -> None:
    names = {_rel(p) for p in VALID_EXAMPLES + INVALID_EXAMPLES if not is_1_0_example(p)}
    for name in ("manifest--tensor-table", "writer-index--tensor-table",
                 "manifest--1-1-without-table"):
        assert f"spec/examples/1.1/{name}.json" in names
    assert any(n.startswith("spec/examples/invalid/1.1/") for n in names)
    assert len(_EXTENDED_1_0["1.1"]) > 20 and _EXTENDED_1_0["1.2"]


@pytest.mark.parametrize(
    ("minor", "path"), [(m, p) for m, ps in _EXTENDED_1_0.items() for p in ps],
    ids=lambda x: x if isinstance(x, str) else _rel(x),
)
def test_1_0_examples_keep_their_verdict(minor: str, path: Path) -> None:
    """Backward compatibility (R-VERSION-4, R-VERSION-9): each later MINOR's schema of a kind
    accepts every valid 1.0 example of that kind and rejects every invalid one (1.2: ``clears``
    is only constrained in 1.2 and later records). One test for every MINOR of
    ``SCHEMAS_BY_MINOR`` (contributor review D4: one was written per MINOR)."""
    schema_id = schema_id_for(path).replace(BASE_URI, MINOR_DIRS[minor])
    errors = [e.message for e in validator_for(schema_id).iter_errors(_load(path))]
    assert bool(errors) == (INVALID in path.parents), f"{_rel(path)} under {minor}: {errors[:3]}"


# ------------------------------------------- format 1.2 (verification records that clear others)


def test_1_2_examples_follow_section_14_5() -> None:
    """R-DRILL-10, R-VERSION-2, R-VERSION-6: ``clears`` in a passed deep 1.2 record; the member is
    unknown, not checked, in a 1.0 record; every invalid 1.2 example breaks a rule of ``clears``
    and is valid under the 1.0 schema (which does not know the member)."""
    v10 = validator_for(BASE_URI + "verification.schema.json")
    cleared = _load(EXAMPLES / "1.2" / "verification--clears.json")
    assert cleared["format_version"] == "1.2" and cleared["ok"] is True
    assert cleared["mode"] == "deep" and cleared["clears"]
    assert _load(EXAMPLES / "1.2" / "verification--1-0-with-clears-ignored.json")[
        "format_version"] == "1.0"
    invalid = sorted((INVALID / "1.2").glob("verification--*.json"))
    assert len(invalid) >= 5
    for path in invalid:
        doc = _load(path)
        assert "clears" in doc and doc["format_version"] == "1.2", _rel(path)
        assert v10.is_valid(doc), f"{_rel(path)} breaks a 1.0 rule, not one of clears"


def test_1_1_table_examples_follow_section_8_5() -> None:
    """R-TABLE-1, R-TABLE-2 in the examples: with a table, tensors is {}, the table file is listed
    in files (a rule the schema cannot express), a manifest is 1.1 and says tensor-table."""
    man = _load(EXAMPLES / "1.1" / "manifest--tensor-table.json")
    idx = _load(EXAMPLES / "1.1" / "writer-index--tensor-table.json")
    plain = _load(EXAMPLES / "1.1" / "manifest--1-1-without-table.json")
    for doc in (man, idx):
        assert doc["tensors"] == {}
        assert doc["format_version"] == "1.1"
        assert doc["tensor_table"]["file"] in doc["files"]
    assert man["must_understand"] == ["tensor-table"]
    assert {man["tensor_table"]["codec"], idx["tensor_table"]["codec"]} == {"none", "zstd"}
    # a writer's table is a file of the version, listed in the manifest too (R-FILES-1)
    assert idx["tensor_table"]["file"] in man["files"]
    assert "tensor_table" not in plain and plain["tensors"] and plain["format_version"] == "1.1"
    assert man["attempt_id"] == idx["attempt_id"] == _load(EXAMPLES / "manifest.json")["attempt_id"]
    # 1.0 documents with a tensor_table member fail the 1.1 schema (R-TABLE-2): shown by the
    # invalid examples; a 1.0 schema alone does not know the member (R-VERSION-6) and accepts it.
    v10 = validator_for(BASE_URI + "manifest.schema.json")
    assert v10.is_valid(_load(INVALID / "1.1" / "manifest--table-format-version-1-0.json"))


# ------------------------------------------------------- rules beyond the schemas (examples)


def _manifest_like_examples() -> list[Path]:
    return [p for p in VALID_EXAMPLES if p.parent in (EXAMPLES, EXAMPLES / "1.1")
            and p.name.split("--")[0] in (
                "manifest.json", "manifest", "writer-index.json", "writer-index")]


def _boxes_cover_exactly_once(shape: list[int], boxes: list[tuple[list[int], list[int]]]) -> bool:
    counts: dict[tuple[int, ...], int] = {}
    for offsets, lengths in boxes:
        for index in product(*(range(o, o + n) for o, n in zip(offsets, lengths, strict=True))):
            counts[index] = counts.get(index, 0) + 1
    every = list(product(*(range(n) for n in shape)))
    return all(counts.get(i) == 1 for i in every) and len(counts) == len(every)


@pytest.mark.parametrize("path", _manifest_like_examples(), ids=_rel)
def test_example_obeys_semantic_rules(path: Path) -> None:
    doc = _load(path)
    is_manifest = doc["format"] == "portable-ckpt"
    step = int(doc["attempt_id"][1:13])
    if is_manifest:
        assert step == doc["step"]
    for name, record in doc["files"].items():
        cks = record["checksum"]
        assert len(cks["blocks"]) == 8 * math.ceil(record["size"] / cks["block_size"]), name
    if "tensor_table" in doc:  # R-TABLE-1
        assert doc["tensor_table"]["file"] in doc["files"]
        assert doc["tensors"] == {}
    for key, tensor in doc["tensors"].items():
        ndim = len(tensor["shape"])
        for r in tensor["ranges"]:
            assert r["file"] in doc["files"], (key, r["file"])
            assert len(r["offsets"]) == len(r["lengths"]) == ndim, key
            for o, n, dim in zip(r["offsets"], r["lengths"], tensor["shape"], strict=True):
                assert o + n <= dim, key
        if is_manifest:
            boxes = [(r["offsets"], r["lengths"]) for r in tensor["ranges"]]
            assert _boxes_cover_exactly_once(tensor["shape"], boxes), key
    for name, entry in doc["entries"].items():
        for value in entry["values"]:
            assert value["file"] in doc["files"], (name, value["file"])
        if is_manifest and entry["scope"] == "per_rank":
            ranks = sorted(v["rank"] for v in entry["values"])
            assert ranks == list(range(doc["continuation"]["world_size"])), name
        schema = entry["schema"]
        if "json_schema" in schema:
            Draft202012Validator.check_schema(schema["json_schema"])
    if is_manifest and doc["continuation"]["mesh"] is not None:
        mesh = doc["continuation"]["mesh"]
        assert len(mesh["shape"]) == len(mesh["dim_names"])
        assert math.prod(mesh["shape"]) == doc["continuation"]["world_size"]


def test_manifest_example_covers_required_features() -> None:
    doc = _load(EXAMPLES / "manifest.json")
    shapes = [t["shape"] for t in doc["tensors"].values()]
    assert [] in shapes, "a 0-d tensor"
    assert any(0 in s for s in shapes), "a zero-size tensor"
    assert any(t["dtype"] == "bfloat16" for t in doc["tensors"].values())
    codecs = {r["codec"] for t in doc["tensors"].values() for r in t["ranges"]}
    assert codecs == {"none", "zstd"}
    scopes = {e["scope"] for e in doc["entries"].values()}
    assert scopes == {"global", "per_rank"}
    assert doc["continuation"]["mesh"] is not None
    ids = {e["schema"].get("id") for e in doc["entries"].values()}
    assert set(ENTRY_SCHEMAS) <= ids | {"pck:json/1"}
    assert any("json_schema" in e["schema"] for e in doc["entries"].values())


def test_annotation_examples_name_the_manifest_attempt() -> None:
    attempt = _load(EXAMPLES / "manifest.json")["attempt_id"]
    for name in ("drill.json", "copy.json", "writer-index.json"):
        assert _load(EXAMPLES / name)["attempt_id"] == attempt


# --------------------------------------------------------------- the worked checksum example


def test_readme_crc32c_worked_example_is_correct() -> None:
    crc32c = pytest.importorskip("crc32c")
    readme = (SPEC / "README.md").read_text(encoding="utf-8")
    assert f"{crc32c.crc32c(b'123456789'):08x}" in readme
    data = bytes(i % 251 for i in range(10000))
    blocks = "".join(f"{crc32c.crc32c(data[i:i + 4096]):08x}" for i in range(0, len(data), 4096))
    assert len(blocks) == 24
    assert blocks in readme


# ------------------------------------------------------------- real torch objects fit


def _jsonable(value: Any) -> Any:
    """Round-trip through strict JSON (no NaN/Infinity), as a writer would store it."""
    return json.loads(json.dumps(value, allow_nan=False))


def test_torch_scheduler_and_scaler_states_validate() -> None:
    torch = pytest.importorskip("torch")
    lr = torch.optim.lr_scheduler
    params = [torch.nn.Parameter(torch.zeros(2))]

    def opt() -> Any:
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)

    schedulers = []
    o = opt()
    schedulers.append(lr.LambdaLR(o, lambda e: 0.9**e))
    o = opt()
    schedulers.append(lr.StepLR(o, 3))
    o = opt()
    schedulers.append(lr.CosineAnnealingLR(o, 10))
    o = opt()
    schedulers.append(lr.LinearLR(o))
    o = opt()
    schedulers.append(lr.SequentialLR(o, [lr.LinearLR(o), lr.CosineAnnealingLR(o, 10)], [5]))
    o = opt()
    schedulers.append(lr.ChainedScheduler([lr.LinearLR(o), lr.StepLR(o, 3)]))
    o = opt()
    schedulers.append(lr.OneCycleLR(o, 1.0, total_steps=10))
    validator = validator_for(BASE_URI + "entries/lr-scheduler.schema.json")
    for sched in schedulers:
        for _ in range(3):
            sched.optimizer.step()
            sched.step()
        state = _jsonable(sched.state_dict())
        errors = list(validator.iter_errors(state))
        assert not errors, (type(sched).__name__, [e.message for e in errors])

    scaler_validator = validator_for(BASE_URI + "entries/grad-scaler.schema.json")
    for enabled in (True, False):
        scaler = torch.amp.GradScaler("cpu", enabled=enabled)
        assert scaler_validator.is_valid(_jsonable(scaler.state_dict()))


def test_real_rng_states_validate() -> None:
    import random

    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    version, state, gauss_next = random.getstate()
    np_state = np.random.get_state(legacy=False)
    value = {
        "python": {"version": version, "state": list(state), "gauss_next": gauss_next},
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "state": {"key": [int(k) for k in np_state["state"]["key"]],
                      "pos": int(np_state["state"]["pos"])},
            "has_gauss": int(np_state["has_gauss"]),
            "cached_gaussian": float(np_state["gauss"]),
        },
        "torch_cpu": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii"),
        "torch_cuda": [],
    }
    validator = validator_for(BASE_URI + "entries/rng.schema.json")
    errors = list(validator.iter_errors(_jsonable(value)))
    assert not errors, [e.message for e in errors]
