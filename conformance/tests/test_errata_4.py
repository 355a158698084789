"""Errata 4 (spec §23): what an outside team using ``check`` as a CI gate found it got wrong.

One test per finding; each fails without its fix. The golden vectors of ``errata-4``
(test_vectors.py) pin the cases a vector can hold; these are the others: documents over 64 MiB
(sparse files), FIFOs, symbolic links to directories, empty directories in a root, and the
comparison of writer indexes with tensor tables in both forms.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conformance.checker import check
from conformance.craft import file_record
from conformance.store import Problem, parse_safetensors_bytes
from conformance.table import encode_table, implied_name
from conformance.vectors import VECTOR_DIRS, load_cases, materialize

from .conftest import REPO
from .test_table import DATA, write_table_version

DRILL = "drills/d20260101T000002000000Z-0123abcd.json"
COPY = "copies/c20260101T000004000000Z-5e6f7a8b.json"
VERIFICATION = "verifications/v20260101T000005000000Z-1a2b3c4d.json"


def _version(tmp: Path, name: str = "", vset: str = "errata-4") -> Path:
    """A copy of a valid vector's version directory (or root, for a root case).

    By default a plain version (one int64 tensor in one shard, one global entry): the version
    of ``valid-files-manifest-jsonl`` without its ``manifest.jsonl``, so that a test of one fix
    is not confounded by another.
    """
    case = next(c for c in load_cases(VECTOR_DIRS[vset])
                if c["name"] == (name or "valid-files-manifest-jsonl"))
    target = materialize(case, tmp, VECTOR_DIRS[vset])
    if not name:
        (target / "manifest.jsonl").unlink()
        _edit(target, lambda m: m["files"].pop("manifest.jsonl"))
    return target


def _manifest(vdir: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((vdir / "manifest.json").read_text())
    return doc


def _edit(vdir: Path, fn: Callable[[dict[str, Any]], None]) -> None:
    m = _manifest(vdir)
    fn(m)
    (vdir / "manifest.json").write_text(json.dumps(m, indent=1))


def _store(vdir: Path, rel: str, data: bytes, *, listed: bool = True) -> None:
    """Write ``rel`` and (``listed``) record it in the manifest's files."""
    (vdir / rel).parent.mkdir(parents=True, exist_ok=True)
    (vdir / rel).write_bytes(data)
    if listed:
        _edit(vdir, lambda m: m["files"].update({rel: file_record(data)}))


def _index(vdir: Path, writer: int, **changes: Any) -> dict[str, Any]:
    m = _manifest(vdir)
    doc = {"format": "portable-ckpt-writer-index", "format_version": "1.0",
           "attempt_id": m["attempt_id"], "writer": writer,
           "files": {DATA: m["files"][DATA]}, "tensors": m["tensors"], "entries": {}}
    doc.update(changes)
    return doc


def _record(kind: str, vdir: Path, rid: str) -> dict[str, Any]:
    aid = vdir.name
    if kind == "drills":
        return {"format": "portable-ckpt-drill", "format_version": "1.0", "attempt_id": aid,
                "drill_id": rid, "ok": True, "started_at": "2026-01-01T00:00:02Z",
                "finished_at": "2026-01-01T00:00:03Z", "world_size": 1, "saved_world_size": 1,
                "contract": "exact", "measurements": {}, "error": None}
    if kind == "copies":
        return {"format": "portable-ckpt-copy", "format_version": "1.0", "attempt_id": aid,
                "copy_id": rid, "destination": "s3://b/r", "verified_at": "2026-01-01T00:00:04Z",
                "ok": True}
    return {"format": "portable-ckpt-verification", "format_version": "1.0", "attempt_id": aid,
            "verification_id": rid, "verified_at": "2026-01-01T00:00:05Z", "ok": True,
            "mode": "deep", "chunks": 1, "errors": []}


def _json(doc: dict[str, Any]) -> bytes:
    return (json.dumps(doc, indent=1) + "\n").encode()


# -- FP-2: index/w<writer:05d>.json has at least five digits ------------------------------------
def test_a_six_digit_writer_index_is_read_as_an_index(tmp_path: Path) -> None:
    base = _version(tmp_path / "a")
    assert check(base).codes == set()
    _store(base, "index/w123456.json", _json(_index(base, 123456)))
    assert check(base, deep=True).codes == set()  # an index that agrees: conformant

    conflict = _version(tmp_path / "b")
    bad = _index(conflict, 123456, files={"data/not-in-manifest.safetensors":
                                          _manifest(conflict)["files"][DATA]})
    _store(conflict, "index/w123456.json", _json(bad))
    assert check(conflict).codes == {"PCK-METADATA-CONFLICT"}

    unlisted = _version(tmp_path / "c")
    _store(unlisted, "index/w123456.json", _json(bad), listed=False)
    rep = check(unlisted)  # unlisted (R-FILES-1), and still compared (R-INDEX-6)
    assert rep.codes == {"PCK-SCHEMA", "PCK-METADATA-CONFLICT"}, rep.errors
    assert any("w123456.json" in e.message and "not listed" in e.message for e in rep.errors)

    padded = _version(tmp_path / "d")  # the number is the writer's: w0123456 is not 123456's name
    _store(padded, "index/w0123456.json", _json(_index(padded, 123456)))
    rep = check(padded)
    assert rep.codes == {"PCK-SCHEMA"} and "does not match the file name" in rep.errors[0].message


# -- FP-3: R-SEC-11, 64 MiB for every JSON document but the manifest ------------------------------
@pytest.mark.parametrize("rel", ["index/w00000.json", DRILL, COPY, VERIFICATION])
def test_documents_above_64_mib_are_rejected_before_reading(rel: str, tmp_path: Path) -> None:
    """A sparse file of 64 MiB + 1 byte: refused from its size (its record, or fstat), fast."""
    vdir = _version(tmp_path)
    p = vdir / rel
    p.parent.mkdir(parents=True)
    with open(p, "wb") as f:
        f.write(b"{")
        f.truncate((64 << 20) + 1)
    if rel.startswith("index/"):  # a stored index is listed; its blocks are not read here
        _edit(vdir, lambda m: m["files"].update({rel: {"size": (64 << 20) + 1, "checksum": {
            "algorithm": "crc32c", "block_size": 1 << 30, "blocks": "00000000"}}}))
    t0 = time.monotonic()
    rep = check(vdir)
    assert rep.codes == {"PCK-JSON-INVALID"}, rep.errors
    assert "R-SEC-11" in rep.errors[0].message and time.monotonic() - t0 < 5


# -- FP-4: drill and copy records under their own ids (R-DRILL-1, R-DRILL-6) ------------------------
@pytest.mark.parametrize(("rel", "name"), [
    (DRILL, "d20260101T000002000000Z-0123abcd"), (COPY, "c20260101T000004000000Z-5e6f7a8b"),
    (VERIFICATION, "v20260101T000005000000Z-1a2b3c4d")])
def test_records_are_stored_under_their_ids(rel: str, name: str, tmp_path: Path) -> None:
    kind = rel.split("/")[0]
    good = _version(tmp_path / "good")
    _store(good, rel, _json(_record(kind, good, name)), listed=False)
    assert check(good).codes == set()
    misnamed = _version(tmp_path / "bad")
    other = name[:-8] + "00000000"
    _store(misnamed, rel.replace(name, other), _json(_record(kind, misnamed, name)),
           listed=False)
    rep = check(misnamed)
    assert rep.codes == {"PCK-SCHEMA"} and "is not its file name" in rep.errors[0].message


def test_a_drill_record_named_junk_is_an_error(tmp_path: Path) -> None:
    vdir = _version(tmp_path)
    _store(vdir, "drills/junk.json", _json(_record("drills", vdir,
                                                   "d20260101T000002000000Z-0123abcd")),
           listed=False)
    rep = check(vdir)
    assert [e.code for e in rep.errors] == ["PCK-SCHEMA"], rep.errors
    assert "drills/junk.json" in rep.errors[0].message
    assert "is not its file name (R-DRILL-1)" in rep.errors[0].message


# -- FP-5: R-SEC-2, no symbolic link in an attempt -------------------------------------------------
def test_a_symlink_inside_the_attempt_is_reported(tmp_path: Path) -> None:
    """A referenced value file that is a link to a file in the attempt: one PCK-PATH-UNSAFE."""
    vdir = _version(tmp_path)
    value = vdir / "entries" / "meta.g.json"
    value.rename(vdir / "entries" / "real.bin")
    value.symlink_to("real.bin")
    for deep in (False, True):
        rep = check(vdir, deep=deep)
        assert [e.code for e in rep.errors] == ["PCK-PATH-UNSAFE"], rep.errors
        assert "entries/meta.g.json" in rep.errors[0].message
        assert "R-SEC-2" in rep.errors[0].message


def test_a_symlinked_directory_is_reported_once(tmp_path: Path) -> None:
    vdir = _version(tmp_path)
    (vdir / "entries").rename(vdir / "entries-real")
    (vdir / "entries").symlink_to("entries-real")
    rep = check(vdir)
    assert [e.code for e in rep.errors] == ["PCK-PATH-UNSAFE"], rep.errors
    assert "'entries'" in rep.errors[0].message


def test_a_link_leaving_the_attempt_is_one_finding(tmp_path: Path) -> None:
    vdir = _version(tmp_path)
    shard = vdir / DATA
    (tmp_path / "outside.safetensors").write_bytes(shard.read_bytes())
    shard.unlink()
    shard.symlink_to(tmp_path / "outside.safetensors")
    assert [e.code for e in check(vdir).errors] == ["PCK-PATH-UNSAFE"]


def test_a_symlinked_record_is_reported_and_never_read(tmp_path: Path) -> None:
    """A drill record that is a link to a file in the attempt: the link is the finding; what
    it points to is not read as a record."""
    vdir = _version(tmp_path)
    (vdir / "junk.txt").write_text("not json")
    (vdir / "drills").mkdir()
    (vdir / DRILL).symlink_to("../junk.txt")
    rep = check(vdir)
    assert [e.code for e in rep.errors] == ["PCK-PATH-UNSAFE"], rep.errors
    assert DRILL in rep.errors[0].message


# -- CRASH-1: R-SEC-16, a FIFO is reported, never waited on -----------------------------------------
def _check_cli(target: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conformance", "check", str(target)], cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize(("rel", "listed"), [(DRILL, False), (VERIFICATION, False),
                                             ("index/w00007.json", False),
                                             ("index/w00000.json", True)])
def test_a_fifo_named_like_a_record_is_reported(rel: str, listed: bool, tmp_path: Path) -> None:
    vdir = _version(tmp_path)
    (vdir / rel).parent.mkdir()
    os.mkfifo(vdir / rel)
    if listed:
        _edit(vdir, lambda m: m["files"].update({rel: file_record(b"{}")}))
    r = _check_cli(vdir)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "PCK-FILE-MISSING" in r.stdout and "FIFO" in r.stdout, r.stdout
    assert "Traceback" not in r.stderr


def test_a_stray_fifo_is_a_warning(tmp_path: Path) -> None:
    vdir = _version(tmp_path)
    (vdir / "tmp").mkdir()
    os.mkfifo(vdir / "tmp" / "pipe")
    r = _check_cli(vdir)
    assert r.returncode == 0 and "foreign entry" in r.stderr, r.stdout + r.stderr


# -- FP-8: shard header dimensions up to MAXINT, zero-size tensors included ---------------------
@pytest.mark.parametrize(("dim", "ok"), [(2**53 - 1, True), (2**53, False), (2**60, False)])
def test_shard_header_dimensions_are_bounded(dim: int, ok: bool) -> None:
    h = json.dumps({"z": {"dtype": "F32", "shape": [0, dim], "data_offsets": [0, 0]}}).encode()
    h += b" " * (-len(h) % 8)
    data = len(h).to_bytes(8, "little") + h
    if ok:
        assert list(parse_safetensors_bytes(data, "t").tensors["z"].shape) == [0, dim]
    else:
        with pytest.raises(Problem) as ei:
            parse_safetensors_bytes(data, "t")
        assert ei.value.code == "PCK-SHARD-HEADER" and "MAXINT" in ei.value.message


# -- FF-1: R-LAYOUT-4, only attempt-named children of a root are attempts --------------------------
def test_non_attempt_children_of_a_root_are_ignored(tmp_path: Path) -> None:
    root = _version(tmp_path, "valid-root-non-attempt-children")
    (version,) = [p for p in root.iterdir() if p.name.startswith("s")]
    for empty in ("data", "index", "lost+found"):
        (root / empty).mkdir(exist_ok=True)
    (root / "backup-of-v").mkdir()
    for probe in (".pck-clock-0011223344556677", ".pck-probe-0011223344556677"):  # §15.2
        (root / probe).write_bytes(b"")
    for p in version.rglob("*"):
        if p.is_file():
            dst = root / "backup-of-v" / p.relative_to(version)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(p.read_bytes())
    rep = check(root)
    assert rep.ok and rep.versions == [version.name], rep.errors
    assert any("R-LAYOUT-4" in w.message and "backup-of-v" in w.message for w in rep.warnings)
    assert not [w for w in rep.warnings if ".pck-" in w.message]  # probes: ignored, unsaid
    # A version directory named directly is still checked (its name is not its attempt id).
    assert check(root / "backup-of-v").codes == {"PCK-ATTEMPT-ID"}
    # A root with only an empty data/ child is no version: nothing committed there.
    bare = tmp_path / "bare"
    (bare / "data").mkdir(parents=True)
    assert check(bare).codes == {"PCK-NOT-FOUND"}


# -- FF-2: only manifest.json and manifest.json.<anything> are forbidden in files --------------------
@pytest.mark.parametrize(("rel", "codes"), [("manifest.jsonl", set()), ("manifest.json5", set()),
                                            ("manifest.json.bak", {"PCK-SCHEMA"})])
def test_manifest_like_names_in_files(rel: str, codes: set[str], tmp_path: Path) -> None:
    vdir = _version(tmp_path)
    _store(vdir, rel, b"{}\n")
    assert check(vdir).codes == codes


# -- R-INDEX-6 with tensor tables: indexes compared tensor by tensor, in either form ---------------
TENSORS: dict[str, dict[str, Any]] = {
    "a": {"dtype": "float32", "shape": [4, 2], "ranges": [
        {"offsets": [0, 0], "lengths": [2, 2]}, {"offsets": [2, 0], "lengths": [2, 2]}]},
    "b": {"dtype": "int64", "shape": [3], "ranges": [{"offsets": [0], "lengths": [3]}]},
    "z": {"dtype": "bool", "shape": [0, 5], "ranges": []},
}


def _full(tensors: dict[str, Any]) -> dict[str, Any]:
    """Range records with every member (file, implied name, codec)."""
    return {k: {**t, "ranges": [{**r, "file": DATA, "name": implied_name(k, r["offsets"]),
                                 "codec": "none"} for r in t["ranges"]]}
            for k, t in json.loads(json.dumps(tensors)).items()}


def _mutate(tensors: dict[str, Any], how: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(tensors))
    if how == "dtype":
        out["b"]["dtype"] = "uint64"
    elif how == "range":  # a box in bounds that the manifest does not have
        out["a"]["ranges"] = [{**out["a"]["ranges"][0], "offsets": [0, 0], "lengths": [4, 2],
                               "name": implied_name("a", [0, 0])}]
    elif how == "key":
        out["c"] = out.pop("b")
        out["c"]["ranges"] = [{**r, "name": implied_name("c", r["offsets"])}
                              for r in out["c"]["ranges"]]
    return out


@pytest.mark.parametrize("manifest_form", ["table", "json"])
@pytest.mark.parametrize("index_form", ["table", "json"])
@pytest.mark.parametrize("how", ["same", "dtype", "range", "key"])
def test_index_tensors_are_compared_in_every_form(manifest_form: str, index_form: str, how: str,
                                                  tmp_path: Path) -> None:
    """The verdict of R-INDEX-6 does not depend on where either document holds its tensors."""
    tensors = _full(TENSORS)
    vdir = write_table_version(tmp_path, json.loads(json.dumps(TENSORS)))
    if manifest_form == "json":
        def to_json(m: dict[str, Any]) -> None:
            del m["tensor_table"], m["files"]["tensor-table.safetensors"]
            m.update(tensors=tensors, must_understand=[], format_version="1.0")

        _edit(vdir, to_json)
        (vdir / "tensor-table.safetensors").unlink()
    assert check(vdir, deep=True).codes == set()
    idx_tensors = _mutate(tensors, how)
    m = _manifest(vdir)
    index: dict[str, Any] = {"format": "portable-ckpt-writer-index", "format_version": "1.0",
                             "attempt_id": m["attempt_id"], "writer": 0,
                             "files": {DATA: m["files"][DATA]}, "tensors": idx_tensors,
                             "entries": {}}
    if index_form == "table":
        table = "index/w00000.tensors.safetensors"
        _store(vdir, table, encode_table(idx_tensors))
        index.update(format_version="1.1", tensors={},
                     tensor_table={"file": table, "codec": "none"},
                     files={DATA: m["files"][DATA], table: _manifest(vdir)["files"][table]})
    _store(vdir, "index/w00000.json", _json(index))
    rep = check(vdir)
    assert rep.codes == (set() if how == "same" else {"PCK-METADATA-CONFLICT"}), rep.errors
