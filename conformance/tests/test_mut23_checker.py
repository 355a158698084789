"""Mutation audit 23 of the checker: defects a mutant of conformance/checker.py let pass.

Each test builds a real version with the reference library (or crafts one file of it), breaks
exactly one rule, and asserts the one code the spec gives for it; a survivor of the audit is the
checker change that made the test fail (REPORT of the audit, mutant id in each docstring).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conformance.checker import check
from conformance.craft import file_record

Edit = Callable[[dict[str, Any]], None]


def _version(root: Path, arrays: dict[str, Any] | None = None, **kw: Any) -> Path:
    """One version written by the reference library below ``root``; its directory."""
    pc = pytest.importorskip("portable_ckpt")
    pc.save_arrays(str(root), arrays if arrays is not None else
                   {"w": np.arange(12, dtype=np.float32).reshape(4, 3)},
                   step=kw.pop("step", 3), **kw)
    (vdir,) = [p for p in root.iterdir() if p.is_dir()]
    return vdir


def _edit(path: Path, fn: Edit) -> None:
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


def _rerecord(vdir: Path, rel: str) -> None:
    """Record ``rel``'s current bytes in the manifest (the file is intact again)."""
    data = (vdir / rel).read_bytes()
    _edit(vdir / "manifest.json", lambda m: m["files"].update({rel: file_record(data)}))


def _codes(vdir: Path, deep: bool = False) -> set[str]:
    return check(vdir, deep=deep).codes


def test_the_reference_version_is_conformant(tmp_path: Path) -> None:
    vdir = _version(tmp_path)
    assert _codes(vdir, deep=True) == set()


def test_major_version_zero_is_unsupported(tmp_path: Path) -> None:
    """C01: only MAJOR 1 is read (R-VERSION-3); 0.1 is not a 1.x document (a 0.x of an old minor is no newer 1.x either)."""
    vdir = _version(tmp_path)
    _edit(vdir / "manifest.json", lambda m: m.update(format_version="0.1"))
    assert _codes(vdir) == {"PCK-VERSION-UNSUPPORTED"}


def test_attempt_id_step_above_the_manifest_step(tmp_path: Path) -> None:
    """C05: the attempt id encodes step 3, the manifest says 2: PCK-ATTEMPT-ID either way."""
    vdir = _version(tmp_path)
    _edit(vdir / "manifest.json", lambda m: m.update(step=2))
    assert _codes(vdir) == {"PCK-ATTEMPT-ID"}


def test_a_mesh_smaller_than_the_world_size(tmp_path: Path) -> None:
    """C07: a mesh of 1 rank recorded for a job of 2 ranks breaks R-CONTRACT-2."""
    vdir = _version(tmp_path)
    _edit(vdir / "manifest.json", lambda m: m["continuation"].update(
        world_size=2, mesh={"shape": [1], "dim_names": ["dp"]}))
    assert _codes(vdir) == {"PCK-SCHEMA"}


def test_coverage_is_decided_per_layout_not_per_shape(tmp_path: Path) -> None:
    """C22: two tensors of one shape; the second loses a tile. A verdict cached by shape alone
    would take the first tensor's proof for the second."""
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    vdir = _version(tmp_path, {"a": a, "b": a + 1}, tiles={"a": [4, 3], "b": [2, 3]})

    def drop(m: dict[str, Any]) -> None:
        assert list(m["tensors"]) == ["a", "b"] and len(m["tensors"]["b"]["ranges"]) == 2
        m["tensors"]["b"]["ranges"].pop()
    _edit(vdir / "manifest.json", drop)
    assert _codes(vdir) == {"PCK-COVERAGE-GAP"}


def _indexed(root: Path) -> Path:
    """Two writers with stored indexes: ``t`` of 8 int64 split in halves, a per-rank entry."""
    from .test_index_rules import _two_writers

    return _two_writers(root, per_rank_entry=True)


@pytest.mark.parametrize("what", ["shape", "entry-value"])
def test_an_index_that_disagrees_on_shape_or_entry_value(what: str, tmp_path: Path) -> None:
    """C44, C45: R-INDEX-6 compares the shape (not only the dtype) and every entry value."""
    vdir = _indexed(tmp_path)
    assert _codes(vdir, deep=True) == set()

    def edit(i: dict[str, Any]) -> None:
        if what == "shape":
            i["tensors"]["t"]["shape"] = [9]
        else:
            i["entries"]["rng"]["values"][0]["file"] = "entries/elsewhere.json"
    _edit(vdir / "index" / "w00001.json", edit)
    _rerecord(vdir, "index/w00001.json")
    assert _codes(vdir) == {"PCK-METADATA-CONFLICT"}


def test_a_truncated_data_file_without_deep(tmp_path: Path) -> None:
    """C09: the last data byte of a codec-none shard is gone. Without --deep no block of the data
    is read (only the header's block): the size in ``files`` against the file's is the only
    check that sees it."""
    vdir = _version(tmp_path, {"w": np.arange(4096, dtype=np.float32)}, block_size=4096)
    data = vdir / "data" / "w00000-0000.safetensors"
    data.write_bytes(data.read_bytes()[:-1])
    assert _codes(vdir) == {"PCK-FILE-SIZE"}
    assert _codes(vdir, deep=True) == {"PCK-FILE-SIZE"}


def test_the_byte_size_limit_counts_the_item_size(tmp_path: Path) -> None:
    """C19: 3 * 2^51 float32 elements are 3 * 2^53 bytes, above 2^53 - 1 (R-TENSOR-1): PCK-LIMIT,
    although the element count alone is within the limit."""
    vdir = _version(tmp_path)
    _edit(vdir / "manifest.json", lambda m: m["tensors"]["w"].update(shape=[2**51, 3]))
    assert _codes(vdir) == {"PCK-LIMIT"}


def test_a_remote_dynamic_ref_in_an_embedded_schema(tmp_path: Path) -> None:
    """C37: ``$dynamicRef`` to another document is a remote reference like ``$ref``."""
    vdir = _version(tmp_path, entries={"meta": {"epoch": 1}})
    _edit(vdir / "manifest.json", lambda m: m["entries"]["meta"].update(
        schema={"json_schema": {"$dynamicRef": "https://example.com/s.json#node"}}))
    assert _codes(vdir) == {"PCK-ENTRY-SCHEMA"}


@pytest.mark.parametrize(("edit", "code"), [
    (lambda i: i.update(format_version="2.0"), "PCK-VERSION-UNSUPPORTED"),  # C69
    (lambda i: i["tensors"].update(ghost={"dtype": "int64", "shape": [1], "ranges": []}),
     "PCK-METADATA-CONFLICT"),  # C77: a tensor the manifest does not have
])
def test_a_stored_index_breaking_one_rule(edit: Edit, code: str, tmp_path: Path) -> None:
    vdir = _indexed(tmp_path)
    _edit(vdir / "index" / "w00001.json", edit)
    _rerecord(vdir, "index/w00001.json")
    assert _codes(vdir) == {code}


def test_the_drop_policy_is_conformant(tmp_path: Path) -> None:
    """C68: ``drop`` is one of the four world_size_policy values (§12)."""
    vdir = _indexed(tmp_path)
    for rel in ("manifest.json", "index/w00000.json", "index/w00001.json"):
        _edit(vdir / rel, lambda d: d["entries"]["rng"].update(world_size_policy="drop"))
    for w in (0, 1):
        _rerecord(vdir, f"index/w0000{w}.json")
    assert _codes(vdir, deep=True) == set()


def test_a_committed_version_whose_manifest_is_a_dangling_link(tmp_path: Path) -> None:
    """C59: below a root, a manifest.json that is a link to nothing is a version's commit record
    (a symbolic link, R-SEC-2), not an uncommitted attempt."""
    vdir = _version(tmp_path / "root")
    (vdir / "manifest.json").unlink()
    (vdir / "manifest.json").symlink_to(tmp_path / "nowhere.json")
    assert _codes(tmp_path / "root") == {"PCK-PATH-UNSAFE"}


def test_a_bool_byte_of_two_with_deep(tmp_path: Path) -> None:
    """C67: a bool element is 0x00 or 0x01 (R-DTYPE-4): 0x02 too is refused by --deep."""
    vdir = _version(tmp_path, {"b": np.array([True, False, True, True])})
    rel = "data/w00000-0000.safetensors"
    raw = bytearray((vdir / rel).read_bytes())
    assert raw[-4:] == b"\x01\x00\x01\x01"
    raw[-1] = 2
    (vdir / rel).write_bytes(bytes(raw))
    _rerecord(vdir, rel)
    assert _codes(vdir) == set()
    assert _codes(vdir, deep=True) == {"PCK-DTYPE-VALUE"}


@pytest.mark.parametrize("damage", ["renamed", "pins-a-file"])
def test_pins_of_a_root(damage: str, tmp_path: Path) -> None:
    """C60: a pin record lives under its own pin_id (R-PIN-1); C61: ``pins`` that is no
    directory holds pins nobody can read (§15.3, R-GC-11)."""
    from portable_ckpt.io.pins import pin

    root = tmp_path / "root"
    vdir = _version(root)
    rel = pin(str(root), vdir.name, reason="audit")
    assert _codes(root) == set()
    if damage == "renamed":
        (root / rel).rename(root / "pins" / "p20200101T000000000000Z-00000000.json")
        assert _codes(root) == {"PCK-SCHEMA"}
    else:
        (root / rel).unlink()
        (root / "pins").rmdir()
        (root / "pins").write_text("")
        assert _codes(root) == {"PCK-PATH-UNSAFE"}


def test_a_tensor_of_64_dimensions_is_conformant(tmp_path: Path) -> None:
    """C18: the limit is 64 dimensions inclusive (R-TENSOR-1); 65 is PCK-LIMIT."""
    vdir = _version(tmp_path, {"w": np.arange(2, dtype=np.float32).reshape((1,) * 63 + (2,))})
    assert _codes(vdir, deep=True) == set()
    _edit(vdir / "manifest.json", lambda m: m["tensors"]["w"].update(shape=[1] * 63 + [2, 1]))
    assert _codes(vdir) == {"PCK-LIMIT"}


def test_an_empty_box_in_a_tensor_table(tmp_path: Path) -> None:
    """C20: a table record's box of length 0 is PCK-RANGE-BOUNDS (R-TABLE-7 applies the rules of
    §9 to table tensors, which no JSON Schema sees)."""
    import zstandard

    from conformance.table import encode_table
    from portable_ckpt.io.commit import commit
    from portable_ckpt.io.writer import ShardWriter, new_attempt_id
    from portable_ckpt.storage import open_storage

    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(3)
    sw = ShardWriter(storage, attempt, 0, sync_on_finish=True)
    sw.add_tensor("t", np.arange(4, dtype=np.int64), offsets=(0,), global_shape=(4,))
    sw.finish()
    commit(storage, attempt, step=3, expected_writers=[0], tensor_table=True)
    vdir = tmp_path / attempt
    assert _codes(vdir, deep=True) == set()
    ref = json.loads((vdir / "manifest.json").read_text())["tensor_table"]
    raw = encode_table({"t": {"dtype": "int64", "shape": [4], "ranges": [
        {"offsets": [0], "lengths": [0], "file": "data/w00000-0000.safetensors",
         "codec": "none"}]}})
    if ref["codec"] == "zstd":
        raw = zstandard.ZstdCompressor(write_content_size=True).compress(raw)
    (vdir / ref["file"]).write_bytes(raw)
    _rerecord(vdir, ref["file"])
    assert _codes(vdir) == {"PCK-RANGE-BOUNDS"}


def test_an_18_byte_zstd_frame_header_is_read_whole(tmp_path: Path) -> None:
    """C29: the longest frame header (window byte, a 4-byte dictionary id of 0, an 8-byte content
    size: 18 bytes, ``ZSTD_HEADER_MAX``) is valid (RFC 8878: id 0 is no dictionary); a check
    that reads fewer bytes calls it truncated."""
    import struct

    from conformance.craft import safetensors_bytes
    from conformance.store import parse_safetensors_bytes

    vdir = _version(tmp_path, codec="zstd")
    rel = "data/w00000-0000.safetensors"
    raw = np.arange(12, dtype=np.float32).tobytes()
    head = b"\x28\xb5\x2f\xfd" + bytes([0xC3, 0x00]) + b"\x00" * 4 + struct.pack("<Q", len(raw))
    frame = head + struct.pack("<I", 1 | (len(raw) << 3))[:3] + raw  # one raw, last block
    (name,) = parse_safetensors_bytes((vdir / rel).read_bytes(), rel).tensors
    (vdir / rel).write_bytes(safetensors_bytes([(name, "U8", [len(frame)], frame)]))
    _rerecord(vdir, rel)
    assert _codes(vdir) == set()
    assert _codes(vdir, deep=True) == set()


def test_a_per_rank_value_of_rank_world_size(tmp_path: Path) -> None:
    """C33: ranks are 0 … world_size - 1; ranks 0 and 2 of a world of 2 (none missing by count)."""
    vdir = _indexed(tmp_path)
    _edit(vdir / "manifest.json", lambda m: m["entries"]["rng"]["values"][1].update(rank=2))
    assert _codes(vdir) == {"PCK-SCHEMA"}


def test_clears_in_a_format_1_1_verification_record_is_ignored(tmp_path: Path) -> None:
    """C47: ``clears`` is unknown in records of 1.0 and 1.1 (R-VERSION-6): ignored there, even in
    a failed record; only from 1.2 on is it a writer's mistake outside a passed deep record."""
    from portable_ckpt.io.annotations import write_verification_record
    from portable_ckpt.storage import open_storage

    vdir = _indexed(tmp_path)
    rel = write_verification_record(open_storage(tmp_path), vdir.name, ok=False, mode="sample",
                                    fraction=0.5, chunks=1,
                                    errors=[{"code": "PCK-CHECKSUM", "message": "block 0"}])
    (rec,) = (vdir / "verifications").glob("*.json")
    assert _codes(vdir) == set(), rel
    for fv, codes in (("1.1", set()), ("1.2", {"PCK-SCHEMA"})):
        _edit(rec, lambda d, fv=fv: d.update(format_version=fv, clears=[]))  # type: ignore[misc]
        assert _codes(vdir) == codes, fv


def test_a_data_file_linked_outside_the_attempt_is_not_read(tmp_path: Path) -> None:
    """S02 of the audit: with the symlink check of ``VersionFiles.resolve`` removed the verdict
    stayed the same (another pass reports the link), but the checker then read the file outside
    the attempt. The link's target here holds other bytes than recorded: read, it would add
    size and checksum problems; the only problem is the link (R-SEC-1)."""
    vdir = _version(tmp_path / "root")
    rel = "data/w00000-0000.safetensors"
    outside = tmp_path / "elsewhere.safetensors"
    outside.write_bytes(b"\x00" * 7)  # neither the recorded size nor its checksums
    (vdir / rel).unlink()
    (vdir / rel).symlink_to(outside)
    for deep in (False, True):
        assert _codes(vdir, deep=deep) == {"PCK-PATH-UNSAFE"}, deep
