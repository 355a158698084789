"""Synthetic TP × FSDP layouts for the scale-by-simulation section, written as a real attempt.

The model is a Llama-70B-like stack: hidden ``H = 8192``, MLP ``F = 28672``, vocabulary
``V = 128256``, grouped-query attention (QKV rows ``(64 + 2·8) · 128 = 10240``). Every parameter
is stored together with its two Adam moments (``exp_avg``, ``exp_avg_sq``), so the checkpoint has
three tensors per parameter; layers are added until the tensor budget (2,000 by default) is met.

Placements follow FSDP2 + tensor parallelism (``W = TP · FSDP``, rank ``= f · TP + t``):

* column-parallel weights (QKV, gate, up, embedding, lm_head): TP splits dim 0 into ``TP``
  blocks, FSDP splits each TP block again along dim 0 (``_StridedShard``) — one box per rank;
* row-parallel weights (attention output, down): TP splits dim 1, FSDP splits dim 0 — a 2-D grid;
* norms (1-D ``[H]``): replicated over TP, FSDP-sharded; written once (by TP rank 0), so only
  ``FSDP`` records;
* FSDP uses ``torch.chunk`` semantics (``ceil(n / FSDP)`` rows per rank; trailing ranks may get
  fewer or none), which makes some splits uneven (QKV: 1280 rows over 512 ranks).

:func:`write_attempt` writes what ``W`` ShardWriters would leave in an attempt directory (the
committer's whole input), with numpy, without the tensor bytes:

* ``data/wNNNNN-0000.safetensors``: a sparse file of the size the writer's shard would have
  (payload + an estimated safetensors header); its checksum record lists one placeholder CRC per
  256 KiB block, as a real one would (so ``files`` — and the manifest — have their real size);
* ``entries/rng.rNNNNN.json``: a small real file, the value of a ``per_rank`` entry;
* ``index/wNNNNN.tensors.safetensors`` (table form, format 1.1): the writer's tensor table,
  encoded with :func:`portable_ckpt.io.tensor_table.encode_table` (codec ``none``, as
  ``ShardWriter(tensor_table=True)`` writes it), with its real CRC32C;
* ``index/wNNNNN.json``: the writer index, referencing the table (table form) or listing every
  range record in JSON (``json`` form, format 1.0).

Every writer declares all tensors (a rank that holds no part of one declares it with no records),
as ShardWriter does when every rank declares the whole model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "ATTEMPT",
    "BLOCK",
    "Layout",
    "TensorSpec",
    "box_of",
    "boxes_for",
    "model_tensors",
    "record_count",
    "target_box",
    "write_attempt",
]

ATTEMPT = "s000000001000-20260101T000000000000Z-0123456789abcdef"
STEP = 1000
H, FF, V, QKV = 8192, 28672, 128256, (64 + 2 * 8) * 128
BLOCK = 256 * 1024
_ITEMSIZE = {"bfloat16": 2, "float32": 4}


@dataclass(frozen=True)
class TensorSpec:
    """One logical tensor and how it is placed."""

    key: str
    shape: tuple[int, ...]
    dtype: str
    kind: str  # "col" | "row" | "norm"


@dataclass(frozen=True)
class Layout:
    """A 2-D device mesh: ``tp`` × ``fsdp`` ranks (TP innermost)."""

    tp: int
    fsdp: int

    @property
    def world(self) -> int:
        return self.tp * self.fsdp

    @staticmethod
    def for_world(world: int, tp: int = 8) -> Layout:
        tp = min(tp, world)
        return Layout(tp, world // tp)


def model_tensors(count: int = 2000) -> list[TensorSpec]:
    """The first ``count`` tensors of the synthetic model (params + two Adam moments each)."""
    params: list[tuple[str, tuple[int, ...], str]] = [
        ("tok_embeddings.weight", (V, H), "col"),
        ("output.weight", (V, H), "col"),
        ("norm.weight", (H,), "norm"),
    ]
    layer = 0
    out: list[TensorSpec] = []

    def emit(name: str, shape: tuple[int, ...], kind: str) -> None:
        for prefix, dtype in (("model", "bfloat16"), ("optim.exp_avg", "float32"), ("optim.exp_avg_sq", "float32")):
            if len(out) < count:
                out.append(TensorSpec(f"{prefix}.{name}", shape, dtype, kind))

    for name, shape, kind in params:
        emit(name, shape, kind)
    while len(out) < count:
        p = f"layers.{layer}."
        emit(p + "attention_norm.weight", (H,), "norm")
        emit(p + "attention.wqkv.weight", (QKV, H), "col")
        emit(p + "attention.wo.weight", (H, H), "row")
        emit(p + "ffn_norm.weight", (H,), "norm")
        emit(p + "feed_forward.w1.weight", (FF, H), "col")
        emit(p + "feed_forward.w3.weight", (FF, H), "col")
        emit(p + "feed_forward.w2.weight", (H, FF), "row")
        layer += 1
    return out


def _chunk(n: int, parts: int, i: int) -> tuple[int, int]:
    """``torch.chunk``: part ``i`` of ``n`` split into ``parts`` (may be empty)."""
    size = -(-n // parts)
    lo = min(n, i * size)
    return lo, min(n, lo + size) - lo


def box_of(spec: TensorSpec, lay: Layout, rank: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The box ``rank`` holds (and writes) of ``spec`` under ``lay``, or ``None``."""
    t, f = rank % lay.tp, rank // lay.tp
    if spec.kind == "norm":
        if t != 0:
            return None  # replicated over TP: written once
        o, n = _chunk(spec.shape[0], lay.fsdp, f)
        return ((o,), (n,)) if n else None
    rows, cols = spec.shape
    if spec.kind == "col":
        to, tn = _chunk(rows, lay.tp, t)
        fo, fn = _chunk(tn, lay.fsdp, f)
        return ((to + fo, 0), (fn, cols)) if fn else None
    co, cn = _chunk(cols, lay.tp, t)
    fo, fn = _chunk(rows, lay.fsdp, f)
    return ((fo, co), (fn, cn)) if fn else None


def target_box(spec: TensorSpec, lay: Layout, rank: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """What ``rank`` needs to load under ``lay``: its own box, or for norms its FSDP shard."""
    if spec.kind == "norm":
        o, n = _chunk(spec.shape[0], lay.fsdp, rank // lay.tp)
        return ((o,), (n,)) if n else None
    return box_of(spec, lay, rank)


def _vchunk(n: Any, parts: int, i: np.ndarray[Any, Any]) -> tuple[Any, Any]:
    size = -(-np.asarray(n) // parts)
    lo = np.minimum(n, i * size)
    return lo, np.minimum(n, lo + size) - lo


def boxes_for(spec: TensorSpec, lay: Layout) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """``(ranks, offsets [k, nd], lengths [k, nd])`` of every non-empty box (the rules of :func:`box_of`)."""
    r = np.arange(lay.world, dtype=np.int64)
    t, f = r % lay.tp, r // lay.tp
    if spec.kind == "norm":
        o, n = _vchunk(spec.shape[0], lay.fsdp, f)
        keep = (t == 0) & (n > 0)
        return r[keep], o[keep][:, None], n[keep][:, None]
    rows, cols = spec.shape
    if spec.kind == "col":
        to, tn = _vchunk(rows, lay.tp, t)
        fo, fn = _vchunk(tn, lay.fsdp, f)
        keep = fn > 0
        offs = np.stack([to + fo, np.zeros_like(fo)], 1)
        lens = np.stack([fn, np.full_like(fn, cols)], 1)
        return r[keep], offs[keep], lens[keep]
    co, cn = _vchunk(cols, lay.tp, t)
    fo, fn = _vchunk(rows, lay.fsdp, f)
    keep = fn > 0
    return r[keep], np.stack([fo, co], 1)[keep], np.stack([fn, cn], 1)[keep]


def record_count(specs: list[TensorSpec], lay: Layout) -> int:
    """Number of range records the layout produces."""
    return sum(len(boxes_for(s, lay)[0]) for s in specs)


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def write_attempt(root: str, world: int, tensors: int, form: str = "table") -> dict[str, Any]:
    """Write the attempt ``ATTEMPT`` of ``world`` writers under ``root`` (see the module doc).

    ``form`` is ``"table"`` (format 1.1 writer tables) or ``"json"`` (format 1.0 JSON indexes).
    Returns counts and byte totals of what was written.
    """
    from portable_ckpt.format import jsonio
    from portable_ckpt.format.manifest import (
        Checksum,
        Entry,
        EntryValue,
        FileRecord,
        RangeRecord,
        TableRef,
        TensorEntry,
        WriterIndex,
    )
    from portable_ckpt.io.checksum import BlockHasher
    from portable_ckpt.io.tensor_table import DTYPE_CODES, TensorTable, encode_table, range_name

    if form not in ("table", "json"):
        raise ValueError(f"form {form!r}")
    lay = Layout.for_world(world)
    specs = model_tensors(tensors)
    ntens = len(specs)
    keys = [s.key for s in specs]
    code = {n: i for i, n in enumerate(DTYPE_CODES)}
    dts = np.array([code[s.dtype] for s in specs], np.uint8)
    nds = np.array([len(s.shape) for s in specs], np.uint8)
    shp = np.array([x for s in specs for x in s.shape], np.int64)
    item = np.array([_ITEMSIZE[s.dtype] for s in specs], np.int64)
    keylen = np.array([len(k) for k in keys], np.int64)
    # Every record of the model, tensor-major, as padded [R, 2] boxes; then stably sorted by rank
    # (within a rank the records stay in tensor order, as a writer's table lists them).
    per = [boxes_for(s, lay) for s in specs]
    rank = np.concatenate([p[0] for p in per])
    tid = np.concatenate([np.full(len(p[0]), i, np.int64) for i, p in enumerate(per)])
    offs = np.zeros((len(rank), 2), np.int64)
    lens = np.ones((len(rank), 2), np.int64)
    at = 0
    for p in per:
        k, d = p[1].shape
        offs[at : at + k, :d] = p[1]
        lens[at : at + k, :d] = p[2]
        at += k
    del per
    order = np.argsort(rank, kind="stable")
    rank, tid, offs, lens = rank[order], tid[order], offs[order], lens[order]
    nd = nds.astype(np.int64)[tid]
    bounds = np.searchsorted(rank, np.arange(world + 1))
    # Flattened coordinates (each record contributes its ndim values) and where each writer's start.
    mask = np.arange(2)[None, :] < nd[:, None]
    flat_o, flat_l = offs[mask], lens[mask]
    cbounds = np.concatenate([[0], np.cumsum(nd)])[bounds]
    # Payload bytes per writer, plus an estimated safetensors header (~ name + 80 B per chunk).
    cs = np.concatenate([[0], np.cumsum(lens.prod(axis=1) * item[tid])])
    hs = np.concatenate([[0], np.cumsum(keylen[tid] + 80)])
    counts = np.bincount(rank * ntens + tid, minlength=world * ntens).reshape(world, ntens)

    d = os.path.join(root, ATTEMPT)
    for sub in ("index", "data", "entries"):
        os.makedirs(os.path.join(d, sub), exist_ok=True)
    placeholder = "0badc0de"
    tot = {"index_bytes": 0, "table_bytes": 0, "data_bytes": 0, "files": 0}
    for w in range(world):
        a, b = int(bounds[w]), int(bounds[w + 1])
        data = f"data/w{w:05d}-0000.safetensors"
        nbytes = int(cs[b] - cs[a]) + 8 + ((int(hs[b] - hs[a]) + 7) // 8) * 8
        with open(os.path.join(d, data), "wb") as f:
            f.truncate(nbytes)  # sparse: the size is what the committer checks
        rng = f"entries/rng.r{w:05d}.json"
        payload = jsonio.dumps({"rank": w, "state": [w] * 64})
        _write(os.path.join(d, rng), payload)
        hp = BlockHasher(BLOCK)
        hp.update(payload)
        idx = WriterIndex(ATTEMPT, w)
        idx.files[data] = FileRecord(data, nbytes, Checksum("crc32c", BLOCK, placeholder * (-(-nbytes // BLOCK))))
        idx.files[rng] = FileRecord(rng, len(payload), Checksum("crc32c", BLOCK, hp.blocks()))
        idx.entries["rng"] = Entry("rng", {"id": "pck:rng/1"}, "per_rank", "json", [EntryValue(rng, w)], "modulo")
        if form == "table":
            ca, cb = int(cbounds[w]), int(cbounds[w + 1])
            tab = TensorTable(keys, dts, nds, shp, counts[w].astype(np.int64), [data],
                              np.zeros(b - a, np.uint32), np.zeros(b - a, np.uint8),
                              flat_o[ca:cb], flat_l[ca:cb])
            blob = encode_table(tab, codec="none")
            trel = f"index/w{w:05d}.tensors.safetensors"
            _write(os.path.join(d, trel), blob)
            h = BlockHasher(BLOCK)
            h.update(blob)
            idx.files[trel] = FileRecord(trel, len(blob), Checksum("crc32c", BLOCK, h.blocks()))
            idx.tensor_table = TableRef(trel, "none")
            tot["table_bytes"] += len(blob)
        else:
            ents = {s.key: TensorEntry(s.key, s.dtype, s.shape, []) for s in specs}
            for t, o, n in zip(tid[a:b].tolist(), offs[a:b].tolist(), lens[a:b].tolist(), strict=True):
                k = int(nds[t])
                oo, nn = tuple(o[:k]), tuple(n[:k])
                ents[keys[t]].ranges.append(RangeRecord(oo, nn, data, range_name(keys[t], oo), "none"))
            idx.tensors = ents
        doc = jsonio.dumps(idx.to_json())
        _write(os.path.join(d, f"index/w{w:05d}.json"), doc)
        tot["index_bytes"] += len(doc)
        tot["data_bytes"] += nbytes
        tot["files"] += 3 + (form == "table")
    return {"attempt": ATTEMPT, "step": STEP, "writers": world, "tensors": ntens, "records": len(rank),
            "form": form, "layout": f"TP={lay.tp} x FSDP={lay.fsdp}", **tot}
