"""Synthetic TP × FSDP layouts for the scale-by-simulation section (no data is written).

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
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from portable_ckpt.format.manifest import (
    Checksum,
    Entry,
    EntryValue,
    FileRecord,
    RangeRecord,
    TensorEntry,
    WriterIndex,
)

__all__ = ["ATTEMPT", "Layout", "TensorSpec", "box_of", "build_indexes", "model_tensors", "record_count"]

ATTEMPT = "s000000001000-20260101T000000000000Z-0123456789abcdef"
H, FF, V, QKV = 8192, 28672, 128256, (64 + 2 * 8) * 128
BLOCK = 256 * 1024


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


def record_count(specs: list[TensorSpec], lay: Layout) -> int:
    """Number of range records the layout produces."""
    return sum(1 for s in specs for r in range(lay.world) if box_of(s, lay, r) is not None)


def _itemsize(dtype: str) -> int:
    return 2 if dtype == "bfloat16" else 4


def build_indexes(specs: list[TensorSpec], lay: Layout) -> Iterator[WriterIndex]:
    """Yield the WriterIndex of every rank, as ShardWriter would report it (no data written)."""
    for rank in range(lay.world):
        data = f"data/w{rank:05d}-0000.safetensors"
        idx = WriterIndex(ATTEMPT, rank)
        nbytes = 0
        for s in specs:
            b = box_of(s, lay, rank)
            entry = TensorEntry(s.key, s.dtype, s.shape, [])
            if b is not None:
                offs, lens = b
                entry.ranges.append(RangeRecord(offs, lens, data, f"{s.key}@{','.join(map(str, offs))}", "none"))
                nbytes += math.prod(lens) * _itemsize(s.dtype)
            idx.tensors[s.key] = entry
        size = nbytes + 200_000  # + a safetensors header of ~100 B per chunk
        nblocks = -(-size // BLOCK)
        idx.files[data] = FileRecord(data, size, Checksum("crc32c", BLOCK, "0badc0de" * nblocks))
        rng = f"entries/rng.r{rank:05d}.json"
        idx.files[rng] = FileRecord(rng, 10_000, Checksum("crc32c", BLOCK, "0badc0de"))
        idx.entries["rng"] = Entry("rng", {"id": "pck:rng/1"}, "per_rank", "json", [EntryValue(rng, rank)], "modulo")
        ixf = f"index/w{rank:05d}.json"
        idx.index_file = FileRecord(ixf, 300_000, Checksum("crc32c", BLOCK, "0badc0de" * 2))
        yield idx
