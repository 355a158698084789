"""Fuzz targets of the surfaces of issue 12, shared by ``test_fuzz.py`` and ``bench/fuzz_long.py``.

Each target takes a seeded :class:`random.Random` and a :class:`Corpus` of pristine inputs, damages
one input and runs the real code on it: commit of fuzzed writer indexes (JSON and tables, so the
merge runs), tensor-table decoding, zstd entry values (in-memory and streamed decoders), embedded
schemas with ``$ref`` chains, enums and ``unevaluated*``, and the conversion sources (torch.save
zips, DCP ``.metadata``, Hugging Face safetensors with an index). The invariant is the suite's:
only ``CheckpointError`` escapes, within the time and heap bounds the caller enforces.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np
import zstandard

from portable_ckpt.format import jsonio
from portable_ckpt.format.dtypes import DTYPES
from portable_ckpt.io.codec import MAX_WINDOW_BYTES
from tests.hardening import _mutate
from tests.hardening._hand import rle_frame
from tests.hardening._util import make_version

__all__ = ["PEAK_BYTES_OF", "TARGETS", "Corpus", "reference_decode"]


class Corpus:
    """Pristine inputs, built once under ``work``."""

    def __init__(self, work: str) -> None:
        self.work = work
        self.root = os.path.join(work, "pristine")
        self.attempt = make_version(self.root, 3, nwriters=2)
        vdir = os.path.join(self.root, self.attempt)
        self.indexes = {w: _load(os.path.join(vdir, "index", f"w{w:05d}.json")) for w in (0, 1)}
        self.manifest = _load(os.path.join(vdir, "manifest.json"))
        self.entry = {"lr": [0.1, 0.01], "steps": list(range(40)), "name": "cosine"}
        self.torch_zip = _torch_zip_bytes()
        self.dcp_meta = _dcp_metadata_bytes()
        self.hf_shard, self.hf_index = _hf_files()
        self.bombs = [zstandard.ZstdCompressor(level=3).compress(b"[" + b"{}," * (n - 1) + b"{}]")
                      for n in (1 << 10, 1 << 16, 3 << 20, 22 << 20)]

    def scratch(self) -> str:
        return tempfile.mkdtemp(dir=self.work)


def _load(path: str) -> Any:
    with open(path, "rb") as f:
        return json.loads(f.read())


# -- commit of fuzzed writer indexes (JSON or tables: the merge runs) ------------------------
def t_commit(rng: Any, c: Corpus) -> None:
    from portable_ckpt import Continuation
    from portable_ckpt.io.commit import commit
    from portable_ckpt.storage import open_storage

    base = c.scratch()
    try:
        shutil.copytree(os.path.join(c.root, c.attempt), os.path.join(base, c.attempt))
        os.unlink(os.path.join(base, c.attempt, "manifest.json"))
        w = rng.choice([0, 1])
        doc = c.indexes[w]
        data = (_mutate.mutate_text_doc(doc, rng) if rng.random() < 0.3
                else jsonio.dumps(_mutate.mutate_json(doc, rng, n=rng.randint(1, 6))))
        with open(os.path.join(base, c.attempt, "index", f"w{w:05d}.json"), "wb") as f:
            f.write(data)
        commit(open_storage(base), c.attempt, step=3, expected_writers=[0, 1],
               continuation=Continuation("exact", 2, None), tensor_table=rng.random() < 0.5)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def t_table(rng: Any, c: Corpus) -> None:
    from portable_ckpt.format.manifest import parse_manifest
    from portable_ckpt.io.table_decode import decode_table
    from portable_ckpt.io.tensor_table import TensorTable, encode_table
    from portable_ckpt.ranges.coverage import LayoutCache

    man = parse_manifest(c.manifest, directory_name=c.attempt)
    codec = rng.choice(["none", "zstd"])
    blob = encode_table(TensorTable.from_entries(man.tensors.values()), codec=codec)
    if codec == "none" and rng.random() < 0.5:
        blob = _mutate.mutate_safetensors(blob, rng)
    else:
        blob = _mutate.mutate_bytes(blob, rng)
    table = decode_table(blob, codec=codec, what="t", files=man.files)
    cache = LayoutCache()
    for i, key in enumerate(table.keys):
        offs, lens = table.boxes(i)
        cache.check(table.shape_of(i), offs, lens, key=key)


# -- zstd entry values ----------------------------------------------------------------------
def _frame(rng: Any, c: Corpus) -> bytes:
    kind = rng.randrange(4)
    if kind == 0:
        return zstandard.ZstdCompressor(write_content_size=rng.random() < 0.8).compress(
            jsonio.dumps(c.entry))
    if kind == 1:  # a JSON bomb: [{},{},...] of up to 64 MiB
        return bytes(rng.choice(c.bombs))
    if kind == 2:  # RLE frames that lie, or are honest and huge
        declared = rng.choice([-1, None, 3, 1 << 40])
        return rle_frame(rng.choice([5, 1 << 20, 1 << 27, 1 << 34]), byte=0x20,
                         single_segment=declared is not None and rng.random() < 0.3,
                         content_size=declared)
    return _mutate.mutate_bytes(
        zstandard.ZstdCompressor(write_content_size=True).compress(jsonio.dumps(c.entry)), rng)


def t_zstd_entry(rng: Any, c: Corpus) -> None:
    from portable_ckpt.io.codec import FrameStream, decompress_frame

    frame = _frame(rng, c)
    if rng.random() < 0.6:
        text = decompress_frame(frame, expect=None, limit=jsonio.MAX_DOCUMENT_BYTES, what="e")
        jsonio.loads(text, what="e", max_nodes=jsonio.MAX_VALUE_NODES)
        return
    expect = rng.choice([len(jsonio.dumps(c.entry)), 1 << 20, 1 << 27])

    def read(lo: int, hi: int, dest: memoryview) -> None:
        dest[:] = frame[lo:hi]

    step = rng.choice([1, 7, 4096] if expect < 1 << 20 else [4096, 1 << 20])
    s = FrameStream(read, len(frame), expect=expect, what="e", first=step, step=step)
    buf = memoryview(bytearray(1 << 20))
    left = expect
    while left:
        k = min(left, len(buf))
        s.readinto(buf[:k])
        left -= k
    s.finish()


# -- zstd tensor ranges: the reader returns the frame's bytes or refuses, never other bytes ----
#: Every row but ``bool`` (its bytes are checked, R-DTYPE-4), as an unsigned integer of its size:
#: the target compares bytes (contributor review D7: a hand-written subset never fuzzed a later row).
_RANGE_DTYPES = {n: np.dtype(f"<u{r.itemsize}") for n, r in DTYPES.items() if n != "bool"}
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def reference_decode(frame: bytes, m: int) -> bytes | None:
    """What R-TENSOR-6/7/10 make of ``frame`` for an ``m``-byte range: its bytes, or None (refused).

    Independent of the reader: libzstd through ``zstandard``, fed 64 bytes at a time so a lying
    frame never decodes past ``m + 128 KiB``.
    """
    from portable_ckpt.io.codec import zstd_bound

    if len(frame) > zstd_bound(m) or frame[:4] != _ZSTD_MAGIC:
        return None
    try:
        p = zstandard.get_frame_parameters(frame)
    except zstandard.ZstdError:
        return None
    if p.dict_id or p.window_size > MAX_WINDOW_BYTES or p.content_size not in (
            m, zstandard.CONTENTSIZE_UNKNOWN):
        return None
    dobj = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW_BYTES).decompressobj()
    out = bytearray()
    try:
        for i in range(0, len(frame), 64):
            if dobj.eof:
                return None  # bytes after the frame
            out += dobj.decompress(frame[i:i + 64])
            if len(out) > m:
                return None
    except zstandard.ZstdError:
        return None
    return bytes(out) if dobj.eof and not dobj.unused_data and len(out) == m else None


def _small_range_frame(rng: Any, raw: bytes) -> bytes:
    cctx = zstandard.ZstdCompressor(level=rng.choice([-5, 1, 3, 19]),
                                    write_checksum=rng.random() < 0.5,
                                    write_content_size=rng.random() < 0.7)
    frame = cctx.compress(raw)
    k = rng.randrange(6)
    if k == 0:
        return frame
    if k == 1:  # two frames, a skippable frame, or trailing bytes
        cut = rng.randrange(len(raw) + 1)
        return rng.choice([cctx.compress(raw[:cut]) + cctx.compress(raw[cut:]),
                           struct.pack("<II", 0x184D2A50, 3) + b"abc" + frame,
                           frame + bytes(rng.randint(1, 9))])
    if k == 2:  # a lying content size (flip the header's size bytes)
        b = bytearray(zstandard.ZstdCompressor(write_content_size=True).compress(raw))
        b[rng.randrange(5, min(len(b), 14))] ^= 1 << rng.randrange(8)
        return bytes(b)
    if k == 3:  # the frame of other bytes, one element longer or shorter
        return cctx.compress(raw + raw[:1] if rng.random() < 0.5 else raw[:-1])
    return _mutate.mutate_bytes(frame, rng)


def _rle_range(rng: Any) -> tuple[int, bytes, bool]:
    """A large uint8 range (streamed above 16 MiB) as an RLE frame: honest, or lying by a byte."""
    m = rng.choice([5, 1 << 17, 1 << 17, (17 << 20) + 3])
    total = m + rng.choice([0, 0, 0, -1, 1])
    declared = rng.choice([-1, -1, None, m + 1])
    seg = declared == -1 and rng.random() < 0.3
    frame = rle_frame(total, byte=0x5A, window_log=rng.choice([10, 17, 20]),
                      single_segment=seg, content_size=declared)
    return m, frame, total == m and declared in (-1, None)


def t_zstd_range(rng: Any, c: Corpus) -> None:
    """Read a box of a hostile writer's zstd range (checksums match what it stored).

    Accepted means exactly the bytes libzstd decodes from a frame that R-TENSOR-6/7/10 accept;
    ``verify --deep`` reports the range iff the reference refuses it; a refused frame is one the
    reference refuses too (or whose window exceeds ``max(m, 128 KiB)``, which a reader MAY refuse).
    """
    import portable_ckpt
    from portable_ckpt.io import reader
    from tests.hardening._hand import HandTensor, Piece, write_version

    want: Any  # the decoded range (bytes), an RLE frame's fill byte (int), None: refused
    if rng.random() < 0.25:
        n, frame, valid = _rle_range(rng)
        shape, dtype, want = (n,), "uint8", 0x5A if valid else None
    else:
        shape = tuple(rng.randint(1, 9) for _ in range(rng.randint(1, 3)))
        dtype = rng.choice(list(_RANGE_DTYPES))
        arr = np.random.default_rng(rng.randrange(1 << 30)).integers(
            0, rng.choice([2, 256]), size=shape).astype(_RANGE_DTYPES[dtype])
        frame = _small_range_frame(rng, arr.tobytes())
    npdt = np.dtype(_RANGE_DTYPES[dtype])
    m = int(np.prod(shape)) * npdt.itemsize
    if m <= 1 << 17:
        want = reference_decode(frame, m)
    d = c.scratch()
    saved = (reader.ZSTD_WHOLE_BYTES, reader.ZSTD_WINDOW_BYTES, reader.ZSTD_INPUT_BYTES)
    try:
        vdir = os.path.join(d, write_version(d, [HandTensor("t", dtype, shape, [
            Piece((0,) * len(shape), shape, frame, "zstd")])]))
        if m <= 8192 and rng.random() < 0.5:  # stream small ranges through tiny windows
            reader.ZSTD_WHOLE_BYTES = 0
            reader.ZSTD_WINDOW_BYTES = max(npdt.itemsize, rng.randint(1, 300))
            reader.ZSTD_INPUT_BYTES = rng.randint(1, 300)
        ck = portable_ckpt.open(vdir)
        deep = [e.code for e in ck.verify(deep=True)]
        offs = tuple(rng.randrange(n) for n in shape)
        lens = tuple(rng.randint(1, min(n - o, 3)) for n, o in zip(shape, offs, strict=True))
        try:
            got = ck.read("t", offs, lens)
        except portable_ckpt.CheckpointError as exc:
            _check_refusal(exc, frame, m, want, deep)
            raise
        _check_accepted(got, shape, offs, lens, npdt, want, deep)
    finally:
        reader.ZSTD_WHOLE_BYTES, reader.ZSTD_WINDOW_BYTES, reader.ZSTD_INPUT_BYTES = saved
        shutil.rmtree(d, ignore_errors=True)


def _check_refusal(exc: Any, frame: bytes, m: int, want: Any, deep: list[str]) -> None:
    if want is None:
        assert exc.code in deep, f"read refused ({exc.code}) but verify --deep said {deep}"
        return
    window = zstandard.get_frame_parameters(frame).window_size
    assert window > max(m, 1 << 17), f"a valid frame was refused: {exc}"


def _check_accepted(got: Any, shape: tuple[int, ...], offs: tuple[int, ...],
                    lens: tuple[int, ...], npdt: Any, want: Any, deep: list[str]) -> None:
    assert want is not None, f"the reader returned bytes of a frame the spec refuses: {got!r}"
    assert not deep, f"read accepted the range but verify --deep reported {deep}"
    box = tuple(slice(o, o + n) for o, n in zip(offs, lens, strict=True))
    if isinstance(want, int):
        expect = np.full(lens, want, dtype=npdt)
    else:
        expect = np.frombuffer(want, dtype=npdt).reshape(shape)[box]
    assert got.view(np.uint8).tobytes() == expect.tobytes(), "wrong bytes"


# -- embedded schemas ----------------------------------------------------------------------
_PATTERNS = ["^a+$", "^(a+)+$", "(a|aa)+b", "^[a-z]{1,4}$", "x*y*z*", "(?=a)", r"\1", "é+"]


def _schema(rng: Any, depth: int = 0) -> Any:
    if depth > 4 or rng.random() < 0.25:
        return rng.choice([True, False, {}, {"type": rng.choice(["integer", "string", "array",
                                                                  "object", "number"])}])
    k = rng.randrange(9)
    if k == 0:
        d = rng.choice([1, 2, 3, 5, 8, 12, 30])
        defs = {f"d{i}": {rng.choice(["allOf", "anyOf", "oneOf"]): [{"$ref": f"#/$defs/d{i + 1}"}]
                          * rng.randint(1, 3)} for i in range(d)}
        defs[f"d{d}"] = _schema(rng, depth + 1)
        return {"$defs": defs, "$ref": "#/$defs/d0"}
    if k == 1:
        return {"enum": [rng.randint(0, 50) for _ in range(rng.choice([1, 10, 100, 5000]))]}
    if k == 2:
        return {"items": _schema(rng, depth + 1), "uniqueItems": rng.random() < 0.5}
    if k == 3:
        return {"patternProperties": {rng.choice(_PATTERNS): _schema(rng, depth + 1)},
                "unevaluatedProperties": rng.random() < 0.5}
    if k == 4:
        return {"prefixItems": [_schema(rng, depth + 1)], "unevaluatedItems": False}
    if k == 5:
        return {"type": "string", "pattern": rng.choice(_PATTERNS)}
    if k == 6:
        return {"const": rng.choice([1, [1, 2], {"a": None}])}
    if k == 7:
        return {"properties": {"a": _schema(rng, depth + 1)}, "required": ["a"],
                "additionalProperties": _schema(rng, depth + 1)}
    return {"if": _schema(rng, depth + 1), "then": _schema(rng, depth + 1),
            "else": _schema(rng, depth + 1)}


def _value(rng: Any) -> Any:
    k = rng.randrange(5)
    if k == 0:
        return "a" * rng.choice([3, 30, 300, 5000]) + rng.choice(["", "!", "b"])
    if k == 1:
        return [rng.randint(0, 50) for _ in range(rng.choice([0, 3, 300, 5000]))]
    if k == 2:
        return {"a" * rng.randint(1, 40) + "!": 1, "a": [1, 2]}
    if k == 3:
        return rng.randint(-5, 5)
    return {"a": {"a": {"a": []}}, "b": "x"}


def t_schema(rng: Any, c: Corpus) -> None:
    from portable_ckpt.format.schemas import validate_entry_value

    validate_entry_value(_value(rng), {"json_schema": _schema(rng)}, name="e")


# -- conversion sources -----------------------------------------------------------------------
def _torch_zip_bytes() -> bytes:
    """A torch.save file of a small state dict (torch when installed, else a bare pickle)."""
    fd, path = tempfile.mkstemp(suffix=".pt")
    os.close(fd)
    try:
        import torch

        torch.save({"w": torch.arange(12.0).reshape(3, 4), "b": torch.ones(3, dtype=torch.int64),
                    "opt": {"lr": 0.1, "state": [1, 2]}, "v": torch.zeros(2).expand(3, 2)},
                   path)
    except ImportError:  # pragma: no cover - the dev environment has torch
        import pickle

        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("archive/data.pkl", pickle.dumps({"opt": {"lr": 0.1}}, protocol=2))
    with open(path, "rb") as f:
        data = f.read()
    os.unlink(path)
    return data


def _memo_bomb(depth: int) -> bytes:
    import pickle

    x: Any = []
    for _ in range(depth):
        x = [x, x]
    return pickle.dumps({"x": x}, protocol=2)


def _torch_variant(rng: Any, c: Corpus) -> bytes:
    k = rng.choice([0, 0, 0, 0, 1, 2, 3])
    if k == 0:
        return _mutate.mutate_bytes(c.torch_zip, rng)
    path = os.path.join(c.scratch(), "v.pt")
    method = zipfile.ZIP_STORED if k != 2 else rng.choice([zipfile.ZIP_DEFLATED,
                                                           zipfile.ZIP_BZIP2])
    pkl = _memo_bomb(rng.choice([3, 8, 14, 60])) if k != 3 else b"\x80\x02}q\x00." + bytes(1 << 20)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(zipfile.ZipInfo("archive/data.pkl"), pkl, compress_type=method)
        zf.writestr("archive/byteorder", b"little")
    with open(path, "rb") as f:
        data = f.read()
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    return data


def t_torch_source(rng: Any, c: Corpus) -> None:
    from portable_ckpt.convert import open_source

    d = c.scratch()
    path = os.path.join(d, "m.pt")
    try:
        with open(path, "wb") as f:
            f.write(_torch_variant(rng, c))
        _plan_and_load(lambda: open_source(path, "torch", allow_expand=rng.random() < 0.3), rng)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _dcp_metadata_bytes() -> bytes:
    from tests.convert import _dcp_pickles as dp

    return dp.dumps(dp.metadata({
        "a": ("float32", (4, 3), [((0, 0), (2, 3), "__0_0.distcp", 0, 24),
                                  ((2, 0), (2, 3), "__1_0.distcp", 0, 24)]),
        "s": ("int64", (), [((), (), "__0_0.distcp", 24, 8)]),
    }, {"step": ("__0_0.distcp", 32, 40)}), 4)


def t_dcp_metadata(rng: Any, c: Corpus) -> None:
    from portable_ckpt.convert._dcp_meta import parse_dcp_metadata

    parse_dcp_metadata(_mutate.mutate_bytes(c.dcp_meta, rng), path="f/.metadata")


def _hf_files() -> tuple[bytes, dict[str, Any]]:
    from portable_ckpt.io.safetensors_io import build_header

    w = np.arange(12, dtype=np.float32)
    b = np.ones(3, dtype=np.int64)
    head = build_header([("w", "F32", [3, 4], w.nbytes), ("b", "I64", [3], b.nbytes)], {})
    shard = head + w.tobytes() + b.tobytes()
    index = {"metadata": {"total_size": len(shard)},
             "weight_map": {"w": "model-00001.safetensors", "b": "model-00001.safetensors"}}
    return shard, index


def t_hf_source(rng: Any, c: Corpus) -> None:
    from portable_ckpt.convert import open_source

    d = c.scratch()
    try:
        shard = c.hf_shard
        index: Any = c.hf_index
        if rng.random() < 0.6:
            shard = _mutate.mutate_safetensors(shard, rng)
        else:
            index = _mutate.mutate_json(index, rng, n=rng.randint(1, 4))
        with open(os.path.join(d, "model-00001.safetensors"), "wb") as f:
            f.write(shard)
        with open(os.path.join(d, "model.safetensors.index.json"), "wb") as f:
            f.write(json.dumps(index).encode() if rng.random() < 0.9 else b'{"weight_map":')
        _plan_and_load(lambda: open_source(d, "hf"), rng)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _plan_and_load(make: Callable[[], Any], rng: Any) -> None:
    """Open a source and load (at most a few of) its chunks, as a conversion would."""
    plan = make()
    try:
        for t in plan.tensors[:4]:
            for ch in t.chunks[:2]:
                if ch.nbytes <= 1 << 20:
                    np.asarray(ch.load()).sum()
    finally:
        plan.close()


#: Memory bound of one input where it differs from ``_util.PEAK_BYTES`` (64 MiB). A zstd entry
#: value may decode to ``jsonio.MAX_DOCUMENT_BYTES`` (64 MiB) of text before its values are
#: counted, and a streamed frame may use a decoder window of ``codec.MAX_WINDOW_BYTES`` (2^27,
#: R-TENSOR-10, allowed for ranges that large): that window plus 16 MiB.
PEAK_BYTES_OF = {"zstd entry values": MAX_WINDOW_BYTES + (16 << 20)}

#: name -> target, in the order of the long run's round-robin.
TARGETS: dict[str, Callable[[Any, Corpus], None]] = {
    "commit (fuzzed writer indexes, table merge)": t_commit,
    "tensor table decode + coverage": t_table,
    "zstd entry values": t_zstd_entry,
    "zstd tensor ranges (reader, verify --deep)": t_zstd_range,
    "embedded schemas": t_schema,
    "torch.save source": t_torch_source,
    "DCP .metadata": t_dcp_metadata,
    "HF safetensors + index source": t_hf_source,
}
