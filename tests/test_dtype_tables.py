"""Every copy of the dtype table, per format version (contributor review D1, D7).

The table is restated on purpose: spec §7, the schemas' enums, the reference's ``DTYPES``, and the
conformance suite's ``spec.py`` and minimal writer (which import nothing of the reference).
``tests/rules/test_r_files_cksum.py::test_itemsizes_match_the_table`` compares the rows; these
tests compare what each copy *does* for every format version the project implements: which
dtype names a document of that version may use, which row a tensor table's code names, and
whether what the reference writer writes of each row is what the checker reads. Before, a
checker left at its old version, or a schema enum of one version, was caught only by new
golden vectors (review D1).
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from conformance import spec as cspec
from conformance import table as ctable
from conformance.cases import SaveCase, TensorSpec
from conformance.cases import new_attempt_id as conformance_attempt_id
from conformance.checker import Report, check
from conformance.documents import schema_check, schema_version
from conformance.examples import minimal_writer
from conformance.jobs import commit_job, write_jobs
from conformance.reader import load_version
from conformance.schemas import load_schemas
from conformance.store import Problem
from conformance.verify import _WRITER_RULES
from portable_ckpt.errors import CheckpointError
from portable_ckpt.format.dtypes import DTYPES
from portable_ckpt.format.manifest import (
    FORMAT_VERSIONS,
    KNOWN_EXTENSIONS,
    RangeRecord,
    TensorEntry,
    parse_manifest,
    parse_writer_index,
)
from portable_ckpt.format.schemas import validate_document
from portable_ckpt.io.commit import commit
from portable_ckpt.io.table_decode import decode_table
from portable_ckpt.io.tensor_table import DTYPE_CODES, TensorTable, encode_table
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.storage import open_storage

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "spec" / "README.md"


def _minor(version: str) -> int:
    return int(version.split(".")[1])


@cache
def spec_rows() -> list[tuple[str, str, int, str]]:
    """Spec §7's rows in order: (format dtype, safetensors dtype, itemsize, format version).

    A row a later MINOR adds carries that MINOR in parentheses in its notes (``(1.3)``,
    docs/changing-the-format.md); every other row is of 1.0.
    """
    text = SPEC.read_text()
    section = text[text.index("## 7. Dtypes"):text.index("## 8.")]
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \| (\d+) \|([^\n]*)\|$", section, re.M)
    out = []
    for name, st, size, notes in rows:
        since = re.search(r"\((\d+\.\d+)\)", notes)
        out.append((name, st, int(size), since.group(1) if since else "1.0"))
    assert len(out) >= 15 and out[0][:3] == ("float64", "F64", 8)  # the parse found the table
    return out


def spec_names(version: str) -> set[str]:
    """The dtypes spec §7 gives a document of ``version``."""
    return {n for n, _, _, since in spec_rows() if _minor(since) <= _minor(version)}


def _schema_dtype_names() -> set[str]:
    """Every value of a ``dtype`` enum or const in any schema file of ``spec/schemas``."""
    found: set[str] = set()

    def walk(node: Any, key: str | None) -> None:
        if isinstance(node, dict):
            if key == "dtype":
                found.update(v for v in node.get("enum", []) if isinstance(v, str))
                if isinstance(node.get("const"), str):
                    found.add(node["const"])
            for k, v in node.items():
                walk(v, k)
        elif isinstance(node, list):
            for v in node:
                walk(v, key)

    for p in (REPO / "spec" / "schemas").rglob("*.json"):
        walk(json.loads(p.read_text()), None)
    return found


@cache
def candidates() -> list[str]:
    """Every dtype name any copy knows, and one no copy may know (the control)."""
    names = {
        *DTYPES, *cspec.DTYPES, *cspec.DTYPE_CODES, *minimal_writer.DTYPES,
        *(r[0] for r in spec_rows()), *_schema_dtype_names(),
    }
    return sorted(names | {"complex128"})


def _document(kind: str, version: str, dtype: str, announce: bool) -> dict[str, Any]:
    """The spec's example manifest or writer index, of ``version``, its first tensor ``dtype``."""
    doc: dict[str, Any] = json.loads((REPO / "spec" / "examples" / f"{kind}.json").read_text())
    doc["format_version"] = version
    next(iter(doc["tensors"].values()))["dtype"] = dtype
    row = DTYPES.get(dtype)
    if kind == "manifest" and announce and row is not None and row.extension is not None:
        doc["must_understand"] = [*doc["must_understand"], row.extension]
    return doc


def _reference_code(kind: str, doc: dict[str, Any]) -> str | None:
    try:
        (parse_manifest if kind == "manifest" else parse_writer_index)(doc)
    except CheckpointError as exc:
        return exc.code
    return None


def _schema_label(kind: str, version: str) -> str:
    """The schema file the checker applies to a ``kind`` document of ``version``."""
    v = schema_version({"format_version": version})
    return f"{kind}.schema.json" if v == "1.0" else f"{v}/{kind}.schema.json"


def test_the_implementations_implement_the_same_versions_and_extensions() -> None:
    """Review D5: the suite's newest version is one constant; it is the reference's. A row of a
    later MINOR has that MINOR's version and an extension both sides implement and the spec
    names (R-VERSION-7); a row of 1.0 has none."""
    assert cspec.FORMAT_VERSIONS == FORMAT_VERSIONS
    for name, row in DTYPES.items():
        assert row.since in FORMAT_VERSIONS, name
        assert (row.since == "1.0") == (row.extension is None), name
        if row.extension is not None:
            assert row.extension in KNOWN_EXTENSIONS & cspec.KNOWN_EXTENSIONS, name
            assert f"`{row.extension}`" in SPEC.read_text(), name
    assert {n: s for n, _, _, s in spec_rows()} == {n: r.since for n, r in DTYPES.items()}


@pytest.mark.parametrize("version", FORMAT_VERSIONS)
@pytest.mark.parametrize("kind", ["manifest", "writer-index"])
def test_each_version_allows_the_dtypes_of_section_7(kind: str, version: str) -> None:
    """R-DTYPE-3 per version: the dtypes a document of ``version`` may use are the same in spec
    §7, the reference's ``DTYPES`` and parser, the schema the checker picks for that version
    (its classification of the violation included), through both packages' copies of
    ``spec/schemas`` (``conformance/_schemas``, ``portable_ckpt/format/schemas``). A refused
    name is ``PCK-DTYPE-UNSUPPORTED`` on both sides (review D6)."""
    schemas = load_schemas(None)
    schemas.require_complete()
    label = _schema_label(kind, version)
    want = spec_names(version)
    got: dict[str, set[str]] = {
        "DTYPES": {n for n, r in DTYPES.items() if _minor(r.since) <= _minor(version)},
        "the reference's parser": set(), f"{label} (conformance checker)": set(),
        f"{label} (portable_ckpt package)": set(),
    }
    for name in candidates():
        doc = _document(kind, version, name, announce=True)
        ref = _reference_code(kind, doc)
        if ref is None:
            got["the reference's parser"].add(name)
        rep = Report()
        schema_check(schemas, kind, doc, kind, rep, set())
        if not rep.errors:
            got[f"{label} (conformance checker)"].add(name)
        try:
            validate_document(doc, label, what=kind)
            got[f"{label} (portable_ckpt package)"].add(name)
        except CheckpointError:
            pass
        if kind == "manifest" and name not in want:
            assert ref == "PCK-DTYPE-UNSUPPORTED", (name, ref)
            assert {e.code for e in rep.errors} == {"PCK-DTYPE-UNSUPPORTED"}, (name, rep.errors)
    for source, names in got.items():
        assert names == want, f"{source} at {version}: extra {names - want}, missing {want - names}"


@pytest.mark.parametrize("version", FORMAT_VERSIONS)
def test_a_later_row_needs_its_extension_in_every_copy(version: str) -> None:
    """R-VERSION-7: a row a later MINOR added is no dtype of a document that does not list its
    extension, for the reference and for the schema the checker picks. (No row needs one
    today: the loop is empty until the first such row.)"""
    schemas = load_schemas(None)
    for name, row in DTYPES.items():
        if row.extension is None or _minor(row.since) > _minor(version):
            continue
        doc = _document("manifest", version, name, announce=False)
        assert _reference_code("manifest", doc) == "PCK-DTYPE-UNSUPPORTED", name
        rep = Report()
        schema_check(schemas, "manifest", doc, "manifest", rep, set())
        assert {e.code for e in rep.errors} == {"PCK-DTYPE-UNSUPPORTED"}, (name, rep.errors)


def _one_tensor_per_row(names: list[str]) -> dict[str, dict[str, Any]]:
    return {f"t{i}": {"dtype": n, "shape": [1], "ranges": [
        {"file": "data/a.safetensors", "name": f"t{i}@0", "offsets": [0], "lengths": [1],
         "codec": "none"}]} for i, n in enumerate(names)}


def _reference_encode(tensors: dict[str, dict[str, Any]]) -> bytes:
    entries = [TensorEntry(k, t["dtype"], tuple(t["shape"]), [RangeRecord(
        tuple(r["offsets"]), tuple(r["lengths"]), r["file"], r["name"], r["codec"],
    ) for r in t["ranges"]]) for k, t in tensors.items()]
    return encode_table(TensorTable.from_entries(entries), codec="none")


def _decoded(decoder: str, data: bytes) -> list[str] | str:
    """The dtype names a decoder reads from a table, or the code it refuses it with."""
    files = {"data/a.safetensors": None}  # only its keys are looked at
    try:
        if decoder == "reference":
            t = decode_table(data, codec="none", what="table", files=files)
            return [t.dtype_of(i) for i in range(len(t.keys))]
        return list(ctable.decode_table(data, files, "table").dtypes)
    except (CheckpointError, Problem) as exc:
        return exc.code


def _with_dtype_code(data: bytes, code: int) -> bytes:
    """The table with the first tensor's dtype code replaced (a safetensors file of columns)."""
    n = int.from_bytes(data[:8], "little")
    begin = json.loads(data[8:8 + n])["tensor.dtype"]["data_offsets"][0]
    at = 8 + n + begin
    return data[:at] + bytes([code]) + data[at + 1:]


def test_table_codes_are_the_rows_of_section_7_in_every_copy() -> None:
    """§8.5, R-TABLE-6: a tensor table's dtype code is the row of §7, counted from 0. Each of
    the three encoders (reference, checker, minimal writer) writes a table that both decoders
    read as §7's rows, and both refuse the first code past the table."""
    names = [r[0] for r in spec_rows()]
    tensors = _one_tensor_per_row(names)
    encoders = {
        "reference": _reference_encode(tensors),
        "conformance": ctable.encode_table(tensors),
        "minimal writer": minimal_writer.tensor_table(tensors),
    }
    for encoder, data in encoders.items():
        for decoder in ("reference", "conformance"):
            assert _decoded(decoder, data) == names, (encoder, decoder)
            bad = _with_dtype_code(data, len(names))
            assert _decoded(decoder, bad) == "PCK-DTYPE-UNSUPPORTED", (encoder, decoder)
    assert list(DTYPE_CODES) == list(cspec.DTYPE_CODES) == names


def test_the_spec_states_the_table_codes_it_has() -> None:
    """Review D7: §8.5 writes codes as literals ("`float8_e5m2` = 14", "a dtype code above
    14"). The first names the last code of a 1.1 table, the second the largest code a 1.1
    table may hold; a row added later has its own "`name` = code" there."""
    text = SPEC.read_text()
    section = text[text.index("### 8.5"):text.index("## 9.")]
    rows = spec_rows()
    last_1_1 = max(i for i, r in enumerate(rows) if _minor(r[3]) <= 1)
    assert f"`{rows[last_1_1][0]}` = {last_1_1}" in section
    above = {int(n) for n in re.findall(r"a dtype code above\s+(\d+)", section)}
    assert above == {last_1_1}, above
    for code, (name, *_rest, since) in enumerate(rows):
        if _minor(since) > 1:
            assert f"`{name}` = {code}" in section, name


def test_the_dtypes_docs_call_refused_are_no_rows() -> None:
    """Review D7: docs/torch.md lists dtypes "outside spec §7" that a save refuses; it named
    float8_e8m0fnu, which the review's 1.3 added, and nothing failed."""
    text = (REPO / "docs" / "torch.md").read_text()
    refused = re.search(r"dtypes outside spec §7 \(([^)]*)\)", text)
    assert refused is not None, "the refused-dtype list of docs/torch.md moved"
    names = set(re.findall(r"`(\w+)`", refused.group(1)))
    assert names and not names & {r[0] for r in spec_rows()}, names


def _sample(name: str) -> np.ndarray[Any, Any]:
    """Eight elements of the row, as bytes every dtype reads back unchanged."""
    raw = np.arange(8 * DTYPES[name].itemsize, dtype=np.uint8)
    if name == "bool":
        raw %= 2
    return raw.view(DTYPES[name].numpy).reshape(4, 2)


def _open_code(vdir: Path) -> str | None:
    try:
        ck = portable_ckpt.open(vdir)
        for key in ck.tensors:
            ck.read(key)
    except CheckpointError as exc:
        return exc.code
    return None


def test_the_reference_writes_every_row_as_the_checker_reads_it(tmp_path: Path) -> None:
    """Review D1, D3: every row, written by two reference writers (codecs none and zstd) and
    committed from their stored indexes, in JSON and in a tensor table: the checker finds no
    error and no writer-rule warning (a writer index or manifest of the wrong version or
    without the extension), and reads the bytes written. Then each manifest is restated as a
    document of each implemented version, with and without the row's extension: the reference
    reader and the checker accept the same ones and refuse the others with the same code."""
    storage = open_storage(tmp_path, create=True)
    written: dict[str, tuple[str, bool]] = {}
    for step, (name, table) in enumerate(((n, t) for t in (False, True) for n in DTYPES), 1):
        attempt = new_attempt_id(step)
        arr = _sample(name)
        for w in (0, 1):
            sw = ShardWriter(storage, attempt, w, codec=("none", "zstd")[w], tensor_table=table)
            sw.add_tensor("t", arr[2 * w:2 * w + 2], offsets=(2 * w, 0), global_shape=(4, 2))
            sw.finish()
        commit(storage, attempt, step=step, expected_writers=[0, 1], tensor_table=table)
        written[attempt] = (name, table)
    rep = check(tmp_path, deep=True)
    assert rep.ok, [e.to_json() for e in rep.errors]
    assert not [w.message for w in rep.warnings if _WRITER_RULES.search(w.message)]
    for attempt, (name, _) in written.items():
        dtype, _shape, data = load_version(tmp_path / attempt).tensors["t"]
        assert (dtype, data) == (name, _sample(name).tobytes()), (attempt, name)

    original = {a: (tmp_path / a / "manifest.json").read_bytes() for a in written}
    for version in FORMAT_VERSIONS:
        for announce in (True, False):
            want: dict[str, str | None] = {}
            for attempt, (name, table) in written.items():
                row = DTYPES[name]
                path = tmp_path / attempt / "manifest.json"
                path.write_bytes(original[attempt])
                if (table and _minor(version) < 1) or (not announce and row.extension is None):
                    continue  # a 1.0 table is another rule (R-TABLE-2); nothing to leave out
                doc = json.loads(original[attempt])
                doc["format_version"] = version
                mu = [x for x in doc["must_understand"] if x != row.extension]
                doc["must_understand"] = mu + [row.extension] * (announce and bool(row.extension))
                path.write_text(json.dumps(doc))
                ok = name in spec_names(version) and (announce or row.extension is None)
                want[attempt] = None if ok else "PCK-DTYPE-UNSUPPORTED"
            if not want:
                continue
            found = check(tmp_path)
            assert not [w for w in found.warnings if "newer than this checker" in w.message]
            for attempt, code in want.items():
                codes = {e.code for e in found.errors if e.version == attempt}
                case = (version, announce, *written[attempt])
                assert codes == ({code} if code else set()), (case, found.errors)
                assert _open_code(tmp_path / attempt) == code, case


def test_the_minimal_writer_writes_every_row_as_the_checker_reads_it(tmp_path: Path) -> None:
    """Review D3, D7: the minimal writer stamps format_version and must_understand itself (it
    imports nothing); a row it writes in a document of the wrong version, or without its
    extension, passed every test (only the slow writer harness, whose cases hold every dtype,
    ran it). Each row as its own version, two writers, JSON and tensor table."""
    root = tmp_path / "root"
    for step, (name, table) in enumerate(((r[0], t) for t in (False, True) for r in spec_rows()),
                                         1):
        case = SaveCase(step, 2, "none", [TensorSpec("t", name, [4], step, [
            ([0], [2], 0), ([2], [2], 1)])], [], tensor_table=table)
        attempt = conformance_attempt_id(step)
        jobs = tmp_path / f"jobs{step}"
        for job in [*write_jobs(case, jobs, root, attempt), commit_job(case, jobs, root, attempt)]:
            assert minimal_writer.main(["minimal_writer.py", str(job)]) == 0, (name, table)
    rep = check(root, deep=True)
    assert rep.ok and len(rep.versions) == 2 * len(spec_rows()), [e.to_json() for e in rep.errors]
    assert not [w.message for w in rep.warnings if _WRITER_RULES.search(w.message)]
