"""Non-tensor entries (§12) and the continuation contract (§13)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard

import portable_ckpt
from portable_ckpt.format.dtypes import DTYPES
from portable_ckpt.format.manifest import Continuation, Mesh
from portable_ckpt.format.naming import new_attempt_id
from portable_ckpt.io.commit import commit
from portable_ckpt.io.writer import ShardWriter
from portable_ckpt.storage import open_storage

from ._util import build_version, edit_manifest, expect_code, read_manifest, rewrite_file


def _entry_version(tmp_path: Path, values: dict[str, Any], *, compress: bool = False,
                   schema: Any = "pck:json/1", step: int = 1) -> Path:
    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(step)
    w = ShardWriter(storage, attempt, 0)
    for name, v in values.items():
        w.add_entry(name, v, schema=schema, compress=compress)
    commit(storage, attempt, step=step, indexes=[w.finish()], expected_writers=[0])
    return tmp_path / attempt


def _per_rank_version(tmp_path: Path, world: int, policy: str, values: list[Any] | None = None,
                      step: int = 1) -> Path:
    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(step)
    ws = [ShardWriter(storage, attempt, r) for r in range(world)]
    for r, w in enumerate(ws):
        w.add_entry("st", {"rank": r} if values is None else values[r], scope="per_rank", rank=r,
                    world_size_policy=policy)
    ws[0].add_entry("g", {"lr": 0.5})
    commit(storage, attempt, step=step, indexes=[w.finish() for w in ws],
           expected_writers=list(range(world)), continuation=Continuation("exact", world, None))
    return tmp_path / attempt


def _entry_file(vdir: Path, name: str) -> str:
    return str(read_manifest(vdir)["entries"][name]["values"][0]["file"])


@pytest.mark.parametrize("compress", [False, True])
def test_entry_values_are_json_never_pickle(tmp_path: Path, compress: bool) -> None:
    """R-ENTRY-1: stored entry values are JSON text (no pickle or other code-capable format)."""
    value = {"a": [1, 2.5, None, True], "s": "x\u00e9", "n": {"k": -3}}
    vdir = _entry_version(tmp_path, {"v": value}, compress=compress)
    raw = (vdir / _entry_file(vdir, "v")).read_bytes()
    text = zstandard.ZstdDecompressor().decompress(raw) if compress else raw
    assert json.loads(text.decode("utf-8")) == value
    assert not text.startswith(b"\x80")
    storage = open_storage(tmp_path)
    w = ShardWriter(storage, new_attempt_id(2), 0)
    for bad in (object(), {1, 2}, b"bytes", np.float32(1.5), float("nan")):
        # Refused (never pickled); see requests-rules.md: TypeError should be PCK-USAGE.
        with pytest.raises((portable_ckpt.CheckpointError, TypeError)):
            w.add_entry("bad", bad)


@pytest.mark.parametrize("raw", [b"{not json", b'{"x": NaN}', b'{"x": 1, "x": 2}', b"\xff\xfe",
                                 b'{"x": Infinity}', b"\xef\xbb\xbf{}", b""])
@pytest.mark.parametrize("compress", [False, True])
def test_invalid_json_value(tmp_path: Path, raw: bytes, compress: bool) -> None:
    """R-ENTRY-2: a value file that is not strict JSON (after decoding) is PCK-JSON-INVALID."""
    vdir = _entry_version(tmp_path, {"v": {"x": 1}}, compress=compress)
    payload = zstandard.ZstdCompressor().compress(raw) if compress else raw
    rewrite_file(vdir, _entry_file(vdir, "v"), payload)
    expect_code("PCK-JSON-INVALID", portable_ckpt.open(vdir).entry, "v")


def test_values_validated_against_declared_schema(tmp_path: Path) -> None:
    """R-ENTRY-3: violation, unknown built-in id, unusable embedded schema: PCK-ENTRY-SCHEMA."""
    vdir = _entry_version(tmp_path, {"step": {"step": 1}}, schema="pck:step/1")
    rewrite_file(vdir, _entry_file(vdir, "step"), b'{"step": "one"}')
    expect_code("PCK-ENTRY-SCHEMA", portable_ckpt.open(vdir).entry, "step")
    vdir2 = _entry_version(tmp_path, {"e": 5}, step=2)
    edit_manifest(vdir2, lambda d: d["entries"]["e"].__setitem__("schema", {"id": "pck:nope/1"}))
    expect_code("PCK-ENTRY-SCHEMA", portable_ckpt.open, vdir2)
    for schema in ({"type": 5}, {"type": "integer", "minimum": "x"}, {"type": "string"}):
        vdir3 = _entry_version(tmp_path, {"e": 5}, step=3)
        edit_manifest(vdir3, lambda d, s=schema: d["entries"]["e"].__setitem__(
            "schema", {"json_schema": s}))
        expect_code("PCK-ENTRY-SCHEMA", portable_ckpt.open(vdir3).entry, "e")
        import shutil

        shutil.rmtree(vdir3)


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record (and refuse) every attempt to open a network connection."""
    import socket

    attempts: list[Any] = []

    def refuse(self: socket.socket, address: Any) -> None:
        attempts.append(address)
        raise OSError("network access attempted by the reader")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


@pytest.mark.parametrize("ref", ["https://example.com/s.json", "step.schema.json",
                                 "https://portable-ckpt.dev/schemas/1.0/entries/step.schema.json",
                                 "file:///etc/passwd"])
def test_embedded_schema_refs_must_be_local(tmp_path: Path, ref: str,
                                            no_network: list[Any]) -> None:
    """R-ENTRY-4: a $ref not starting with '#' is PCK-ENTRY-SCHEMA and never resolved.

    R-SEC-13: no schema or other resource is fetched over the network (connect() is refused and
    recorded).
    """
    vdir = _entry_version(tmp_path, {"e": {"step": 1}})
    edit_manifest(vdir, lambda d: d["entries"]["e"].__setitem__(
        "schema", {"json_schema": {"$ref": ref}}))
    expect_code("PCK-ENTRY-SCHEMA", portable_ckpt.open(vdir).entry, "e")
    assert no_network == []


def test_local_refs_are_allowed(tmp_path: Path) -> None:
    """R-ENTRY-4: '#' references into the embedded schema itself work."""
    schema = {"$defs": {"n": {"type": "integer"}}, "type": "object",
              "properties": {"k": {"$ref": "#/$defs/n"}}}
    vdir = _entry_version(tmp_path, {"e": {"k": 3}}, schema={"json_schema": schema})
    assert portable_ckpt.open(vdir).entry("e") == {"k": 3}
    rewrite_file(vdir, _entry_file(vdir, "e"), b'{"k": "x"}')
    expect_code("PCK-ENTRY-SCHEMA", portable_ckpt.open(vdir).entry, "e")


@pytest.mark.parametrize("schema", [
    {"$defs": {"x": {"$ref": "https://example.com/x.json"}}},
    {"anyOf": [{"type": "object"}, {"$ref": "https://example.com/x.json"}]},
])
def test_unevaluated_remote_refs_are_rejected_too(tmp_path: Path, schema: dict[str, Any],
                                                  no_network: list[Any]) -> None:
    """R-ENTRY-4: an embedded schema MUST only contain '#' refs, evaluated or not."""
    vdir = _entry_version(tmp_path, {"e": {"k": 1}})
    edit_manifest(vdir, lambda d: d["entries"]["e"].__setitem__("schema", {"json_schema": schema}))
    expect_code("PCK-ENTRY-SCHEMA", portable_ckpt.open(vdir).entry, "e")


@pytest.mark.parametrize("compress", [False, True])
def test_integers_decode_exactly(tmp_path: Path, compress: bool) -> None:
    """R-ENTRY-5: integers in -2^63 .. 2^64-1 are decoded exactly (no float round trip)."""
    value = {"seeds": [2**64 - 1, -(2**63), 2**53 + 1, 9007199254740993, 18446744073709551557],
             "nested": {"k": [12345678901234567891]}}
    vdir = _entry_version(tmp_path, {"v": value}, compress=compress)
    got = portable_ckpt.open(vdir).entry("v")
    assert got == value
    assert all(type(x) is int for x in got["seeds"])
    rewrite_file(vdir, _entry_file(vdir, "v"), zstandard.ZstdCompressor().compress(
        b'{"s": 18446744073709551615}') if compress else b'{"s": 18446744073709551615}')
    assert portable_ckpt.open(vdir).entry("v") == {"s": 2**64 - 1}


@pytest.mark.parametrize("declared", [
    False,
    pytest.param(True),
])
def test_decompression_stops_at_64_mib(tmp_path: Path, declared: bool) -> None:
    """R-ENTRY-6: json+zstd output beyond 64 MiB is PCK-CODEC (bounded, prompt)."""
    import time
    import tracemalloc

    vdir = _entry_version(tmp_path, {"v": [0]}, compress=True)
    text = b"[" + b"0," * ((65 << 20) // 2) + b"0]"
    bomb = zstandard.ZstdCompressor(write_content_size=declared).compress(text)
    del text
    rewrite_file(vdir, _entry_file(vdir, "v"), bomb)
    ck = portable_ckpt.open(vdir)
    t0 = time.process_time()  # (CPU: other processes do not count)
    tracemalloc.start()
    try:
        expect_code("PCK-CODEC", ck.entry, "v")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 80 << 20
    assert time.process_time() - t0 < 5


def test_a_frame_without_size_longer_than_its_bound_is_codec(tmp_path: Path) -> None:
    """mutation audit 22 A-11: R-ENTRY-6 / R-TENSOR-10 for a json+zstd value whose frame
    declares no content size: a valid frame, padded with empty raw blocks beyond
    ZSTD_COMPRESSBOUND of what it decodes to, is PCK-CODEC once decoded."""
    import struct

    from portable_ckpt.io.codec import zstd_bound

    vdir = _entry_version(tmp_path, {"v": {"k": 1}}, compress=True)
    text = b'{"k": 2}'
    frame = (struct.pack("<I", 0xFD2FB528) + bytes([0x00, 0x00])  # no content size; 1 KiB window
             + b"\0\0\0" * 30 + struct.pack("<I", (len(text) << 3) | 1)[:3] + text)
    assert zstandard.get_frame_parameters(frame).content_size == zstandard.CONTENTSIZE_UNKNOWN
    assert zstandard.ZstdDecompressor().decompressobj().decompress(frame) == text
    assert len(frame) > zstd_bound(len(text))
    rewrite_file(vdir, _entry_file(vdir, "v"), frame)
    err = expect_code("PCK-CODEC", portable_ckpt.open(vdir).entry, "v")
    assert "ZSTD_COMPRESSBOUND" in err.message


def test_global_entry_has_exactly_one_value_without_rank(tmp_path: Path) -> None:
    """R-ENTRY-7: a global entry has exactly one value, without a rank."""
    vdir = _entry_version(tmp_path, {"g": 1})
    assert read_manifest(vdir)["entries"]["g"]["values"] == [{"file": _entry_file(vdir, "g")}]
    assert "world_size_policy" not in read_manifest(vdir)["entries"]["g"]
    original = (vdir / "manifest.json").read_bytes()
    for mutate, code in (
        (lambda d: d["entries"]["g"]["values"].append(d["entries"]["g"]["values"][0]), "PCK-SCHEMA"),
        (lambda d: d["entries"]["g"]["values"][0].__setitem__("rank", 0), "PCK-SCHEMA"),
        (lambda d: d["entries"]["g"].__setitem__("values", []), "PCK-ENTRY-MISSING"),
    ):
        (vdir / "manifest.json").write_bytes(original)
        edit_manifest(vdir, mutate)
        expect_code(code, portable_ckpt.open, vdir)
    storage = open_storage(tmp_path)
    w = ShardWriter(storage, new_attempt_id(2), 0)
    expect_code("PCK-USAGE", w.add_entry, "g", 1, rank=0)


def test_per_rank_entry_has_one_value_per_rank(tmp_path: Path) -> None:
    """R-ENTRY-8: per_rank: one value for each rank 0..W-1, each with its rank."""
    vdir = _per_rank_version(tmp_path, 3, "modulo")
    values = read_manifest(vdir)["entries"]["st"]["values"]
    assert sorted(v["rank"] for v in values) == [0, 1, 2]
    ck = portable_ckpt.open(vdir)
    assert [ck.entry("st", rank=r) for r in range(3)] == [{"rank": r} for r in range(3)]
    # A committer refuses a per-rank entry lacking a rank of the saving job.
    storage = open_storage(tmp_path)
    attempt = new_attempt_id(4)
    w = ShardWriter(storage, attempt, 0)
    w.add_entry("st", 1, scope="per_rank", rank=0, world_size_policy="modulo")
    w.add_entry("st", 1, scope="per_rank", rank=2, world_size_policy="modulo")
    expect_code("PCK-ENTRY-MISSING", commit, storage, attempt, step=4, indexes=[w.finish()],
                expected_writers=[0], continuation=Continuation("exact", 3, None))


def test_reader_codes_for_missing_duplicate_rank(tmp_path: Path) -> None:
    """R-ENTRY-9: missing rank: PCK-ENTRY-MISSING; duplicate rank: PCK-SCHEMA."""
    vdir = _per_rank_version(tmp_path, 3, "modulo")
    original = (vdir / "manifest.json").read_bytes()
    edit_manifest(vdir, lambda d: d["entries"]["st"]["values"].pop(1))
    expect_code("PCK-ENTRY-MISSING", portable_ckpt.open, vdir)
    (vdir / "manifest.json").write_bytes(original)
    edit_manifest(vdir, lambda d: d["entries"]["st"]["values"][1].__setitem__("rank", 0))
    expect_code("PCK-SCHEMA", portable_ckpt.open, vdir)


def test_reader_rank_beyond_world_size_is_schema_error(tmp_path: Path) -> None:
    """R-ENTRY-9: a rank >= world_size is PCK-SCHEMA."""
    vdir = _per_rank_version(tmp_path, 3, "modulo")
    edit_manifest(vdir, lambda d: d["entries"]["st"]["values"][2].__setitem__("rank", 3))
    expect_code("PCK-SCHEMA", portable_ckpt.open, vdir)


def test_unknown_entry_name(tmp_path: Path) -> None:
    """R-ENTRY-10: an entry name that does not exist is PCK-ENTRY-MISSING."""
    vdir, _ = build_version(tmp_path)
    ck = portable_ckpt.open(vdir)
    for name in ("nope", "CFG", "cfg/", "a"):
        expect_code("PCK-ENTRY-MISSING", ck.entry, name)
        expect_code("PCK-ENTRY-MISSING", ck.entry, name, rank=0, world_size=2)


def test_world_size_policies_follow_the_table(tmp_path: Path) -> None:
    """R-ENTRY-11: same W: own value; W' != W: require_same/modulo/rank0/drop as the table says."""
    ck = {p: portable_ckpt.open(_per_rank_version(tmp_path / p, 4, p))
          for p in ("require_same", "modulo", "rank0", "drop")}
    for p, c in ck.items():
        assert [c.entry("st", rank=r, world_size=4) for r in range(4)] == [
            {"rank": r} for r in range(4)], p
        assert [c.entry("st", rank=r) for r in range(4)] == [{"rank": r} for r in range(4)], p
    for w2 in (1, 3, 6, 9):
        for r in range(w2):
            expect_code("PCK-CONTRACT", ck["require_same"].entry, "st", rank=r, world_size=w2)
            assert ck["modulo"].entry("st", rank=r, world_size=w2) == {"rank": r % 4}
            assert ck["rank0"].entry("st", rank=r, world_size=w2) == {"rank": 0}
            assert ck["drop"].entry("st", rank=r, world_size=w2) is portable_ckpt.NO_VALUE


def test_rank_outside_requesting_world_is_usage_error(tmp_path: Path) -> None:
    """R-ENTRY-14 (with R-ENTRY-11): the policy applies to 0 <= r < W' only; otherwise PCK-USAGE."""
    ck = portable_ckpt.open(_per_rank_version(tmp_path, 4, "modulo"))
    expect_code("PCK-USAGE", ck.entry, "st", rank=5, world_size=3)
    expect_code("PCK-USAGE", ck.entry, "st", rank=-1, world_size=4)
    # A rank the saved job had but the requesting one has not (traceability audit F14): the
    # bound is W', not W.
    expect_code("PCK-USAGE", ck.entry, "st", rank=3, world_size=3)
    expect_code("PCK-USAGE", ck.entry, "st", rank=2, world_size=2)


def test_a_global_entry_ignores_the_rank_and_world_size_asked_for(tmp_path: Path) -> None:
    """R-ENTRY-14, R-CONTRACT-4 (errata 16, reader review R5): the rank check and the policies
    concern per-rank entries; a global entry is delivered unchanged whatever a request names,
    also a rank outside the requesting world (which a per-rank entry refuses)."""
    ck = portable_ckpt.open(_per_rank_version(tmp_path, 4, "modulo"))
    for rank, world in ((0, 4), (7, 2), (3, 3), (0, 9)):
        assert ck.entry("g", rank=rank, world_size=world) == {"lr": 0.5}
    expect_code("PCK-USAGE", ck.entry, "st", rank=7, world_size=2)
    expect_code("PCK-USAGE", ck.entry, "g", rank=-1, world_size=2)  # never a rank (D8)
    expect_code("PCK-USAGE", ck.entry, "g", rank=0, world_size=0)


def test_drop_signals_no_value_distinctly(tmp_path: Path) -> None:
    """R-ENTRY-12: under drop, 'no value' differs from every stored value (even null)."""
    ck = portable_ckpt.open(_per_rank_version(tmp_path, 2, "drop", values=[None, None]))
    stored = ck.entry("st", rank=0, world_size=2)
    dropped = ck.entry("st", rank=0, world_size=3)
    assert stored is None
    assert dropped is not None and dropped != stored


def test_drop_never_substitutes_a_stored_value(tmp_path: Path) -> None:
    """R-ENTRY-12: drop never delivers any stored rank's value and does not raise."""
    ck = portable_ckpt.open(_per_rank_version(tmp_path, 2, "drop"))
    for w2 in (1, 3):
        for r in range(w2):
            got = ck.entry("st", rank=r, world_size=w2)
            assert got not in ({"rank": 0}, {"rank": 1})


def test_step_entry_must_equal_manifest_step(tmp_path: Path) -> None:
    """R-ENTRY-13: a pck:step/1 value disagreeing with the manifest step is PCK-STEP-MISMATCH."""
    vdir = _entry_version(tmp_path, {"step": {"step": 7, "tokens_seen": 10}}, schema="pck:step/1",
                          step=7)
    assert portable_ckpt.open(vdir).entry("step") == {"step": 7, "tokens_seen": 10}
    rewrite_file(vdir, _entry_file(vdir, "step"), b'{"step": 8}')
    expect_code("PCK-STEP-MISMATCH", portable_ckpt.open(vdir).entry, "step")


def test_writer_records_world_size_and_mesh(tmp_path: Path) -> None:
    """R-CONTRACT-1: the saving job's world size and mesh are recorded as given."""
    vdir = _per_rank_version(tmp_path / "a", 2, "modulo")
    assert read_manifest(vdir)["continuation"] == {"contract": "exact", "world_size": 2,
                                                   "mesh": None}
    cont = Continuation("statistical", 4, Mesh((2, 2), ("dp", "tp")))
    m = portable_ckpt.save_arrays(tmp_path / "b", {"x": np.ones(2)}, step=1, continuation=cont)
    doc = read_manifest(tmp_path / "b" / m.attempt_id)
    assert doc["continuation"] == {"contract": "statistical", "world_size": 4,
                                   "mesh": {"shape": [2, 2], "dim_names": ["dp", "tp"]}}
    assert portable_ckpt.open(tmp_path / "b").continuation == cont


@pytest.mark.parametrize("mesh", [{"shape": [2, 2], "dim_names": ["dp"]},
                                  {"shape": [3], "dim_names": ["dp"]},
                                  {"shape": [1, 2], "dim_names": ["dp", "tp"]}])
def test_mesh_must_match_world_size(tmp_path: Path, mesh: dict[str, Any]) -> None:
    """R-CONTRACT-2: len(shape) = len(dim_names) and prod(shape) = world_size, else PCK-SCHEMA."""
    vdir = _per_rank_version(tmp_path, 4, "modulo")
    edit_manifest(vdir, lambda d: d["continuation"].__setitem__("mesh", mesh))
    expect_code("PCK-SCHEMA", portable_ckpt.open, vdir)
    edit_manifest(vdir, lambda d: d["continuation"].__setitem__(
        "mesh", {"shape": [2, 2], "dim_names": ["dp", "tp"]}))
    assert portable_ckpt.open(vdir).continuation.mesh == Mesh((2, 2), ("dp", "tp"))


@pytest.mark.parametrize("dtype", [n for n in DTYPES if "float" in n])  # review D7: every float
def test_tensor_values_bit_identical_for_any_reader_layout(tmp_path: Path, dtype: str) -> None:
    """R-CONTRACT-3: values are delivered bit-identically whatever the reading layout."""
    from ._util import grid_boxes, save_sharded

    isz = np.dtype(DTYPES[dtype].numpy).itemsize
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 256, size=(12, 10, isz), dtype=np.uint8)
    bits[0, 0] = 0xFF  # NaN payloads, -0.0 and infinities included
    bits[0, 1] = 0
    bits[0, 1, -1] = 0x80
    arr = bits.view(DTYPES[dtype].numpy).reshape(12, 10)
    for codec in ("none", "zstd"):
        m = save_sharded(tmp_path / codec, {"t": (arr, (3, 2))}, writers=3, codec=codec,
                         entries={})
        ck = portable_ckpt.open(tmp_path / codec / m.attempt_id)
        for parts in ((1, 1), (2, 3), (5, 1), (12, 10), (4, 4)):
            out = np.empty_like(arr)
            for offs, lens in grid_boxes(arr.shape, parts):
                sl = tuple(slice(o, o + n) for o, n in zip(offs, lens, strict=True))
                out[sl] = ck.read("t", offs, lens)
            assert out.tobytes() == arr.tobytes()


def test_global_entries_are_the_same_for_every_rank(tmp_path: Path) -> None:
    """R-CONTRACT-4: global entry values are delivered unchanged to every rank, any world size."""
    ck = portable_ckpt.open(_per_rank_version(tmp_path, 2, "require_same"))
    for w2 in (1, 2, 5):
        for r in range(w2):
            assert ck.entry("g", rank=r, world_size=w2) == {"lr": 0.5}
    assert ck.entry("g") == {"lr": 0.5}


torch = pytest.importorskip("torch")


def _torch_version(root: Path, contract: str, world: int) -> None:
    portable_ckpt.save_arrays(root, {"w": np.arange(6, dtype=np.float32)}, step=3,
                              continuation=Continuation(contract, world, None))


def test_exact_contract_refuses_other_world_size(tmp_path: Path) -> None:
    """R-CONTRACT-5: restoring exact onto another world size fails with PCK-CONTRACT."""
    import portable_ckpt.torch as pckt

    _torch_version(tmp_path, "exact", 2)
    state = {"w": torch.zeros(6)}
    expect_code("PCK-CONTRACT", pckt.load, state, str(tmp_path))
    assert state["w"].sum().item() == 0.0
    info = pckt.load(state, str(tmp_path), allow_statistical=True)
    assert info.contract == "statistical"
    assert state["w"].tolist() == list(range(6))


def test_statistical_acceptance_is_explicit_and_off_by_default(tmp_path: Path) -> None:
    """R-CONTRACT-6: accepting statistical continuation is an explicit, default-off choice."""
    import portable_ckpt.torch as pckt

    assert inspect.signature(pckt.load).parameters["allow_statistical"].default is False
    _torch_version(tmp_path, "exact", 3)
    for _ in range(2):  # a refusal is not remembered as acceptance
        expect_code("PCK-CONTRACT", pckt.load, {"w": torch.zeros(6)}, str(tmp_path))
    # Same world size: exact restore, no flag needed.
    _torch_version(tmp_path / "one", "exact", 1)
    assert pckt.load({"w": torch.zeros(6)}, str(tmp_path / "one")).contract == "exact"


def test_statistical_version_restores_anywhere_but_require_same_applies(tmp_path: Path) -> None:
    """R-CONTRACT-7: a statistical version never fails on the contract; require_same still does."""
    import portable_ckpt.torch as pckt

    _torch_version(tmp_path, "statistical", 4)
    state = {"w": torch.zeros(6)}
    info = pckt.load(state, str(tmp_path))
    assert info.contract == "statistical" and state["w"].tolist() == list(range(6))
    ck = portable_ckpt.open(_per_rank_version(tmp_path / "rs", 2, "require_same"))
    expect_code("PCK-CONTRACT", ck.entry, "st", rank=0, world_size=1)


def test_patterns_outside_re2_are_entry_schema_errors() -> None:
    """R-ENTRY-15: a backreference or lookaround pattern is refused with PCK-ENTRY-SCHEMA."""
    from portable_ckpt.format.schemas import validate_entry_value

    for pattern in (r"^(a)\1$", r"^(?=a)a$"):
        with pytest.raises(portable_ckpt.CheckpointError) as ei:
            validate_entry_value("aa", {"json_schema": {"type": "string", "pattern": pattern}}, name="e")
        assert ei.value.code == "PCK-ENTRY-SCHEMA"
    validate_entry_value("ab", {"json_schema": {"type": "string", "pattern": "^a[bc]$"}}, name="e")
