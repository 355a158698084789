"""Which checksum layout fits the ranges? Bytes read per rank, by planning alone (no I/O).

For the realistic GPT-like state (:mod:`bench.realistic_model`) saved by 4 FSDP ranks, this
builds each rank's shard file exactly as ``ShardWriter`` lays it out (real safetensors header,
chunks in state order or smallest first), then computes, for every rank of a 4/3/2/1-rank load,
the bytes a reader reads with

* ``per-tensor``: the old reader (each piece rounded out to whole blocks, separately; the
  header read once per file);
* ``planned``: the per-file plan of :func:`portable_ckpt.ranges.planning.plan_file` (each block
  once, bytes in the header's blocks served from them);
* ``range-aligned``: a hypothetical 1.2 layout where checksum blocks restart at every range's
  first byte (block size per range ``clamp(pow2 ≥ range/k, 4 KiB, 256 KiB)``), planned per range;

at several block sizes, with the checksum metadata each layout costs in the manifest (8 hex
digits per block) — for this state and for the 4,096-writer × 2,000-tensor layout of
``bench/scale_sim.py`` (block counts from its real range sizes).

    python -m bench.checksum_layout [--model full] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

from bench.realistic_model import PRESETS, ModelConfig
from portable_ckpt.io.checksum import BlockHasher, BlockVerifier, auto_block_size
from portable_ckpt.io.safetensors_io import build_header
from portable_ckpt.ranges.planning import Segment, plan_file

KIB = 1024


@dataclass(frozen=True)
class Chunk:
    key: str
    shape: tuple[int, ...]  # global shape
    rows: tuple[int, int]  # stored rows [a, b) (0-d: (0, 1))
    start: int  # absolute file offset of the chunk's bytes
    nbytes: int

    @property
    def row_bytes(self) -> int:
        return self.nbytes // max(1, self.rows[1] - self.rows[0])


def _chunk(n: int, parts: int, i: int) -> tuple[int, int]:
    size = -(-n // parts) if n else 0
    a = min(i * size, n)
    return a, min(n, a + size)


def state_tensors(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """The keys and global shapes of ``get_state_dict`` of the model + AdamW, in state order."""
    d, v = cfg.d_model, cfg.vocab
    params: list[tuple[str, tuple[int, ...]]] = [("tok.weight", (v, d)), ("pos.weight", (cfg.context, d))]
    for i in range(cfg.layers):
        b = f"blocks.{i}."
        params += [(b + "ln1.weight", (d,)), (b + "ln1.bias", (d,)), (b + "qkv.weight", (3 * d, d)),
                   (b + "qkv.bias", (3 * d,)), (b + "proj.weight", (d, d)), (b + "proj.bias", (d,)),
                   (b + "ln2.weight", (d,)), (b + "ln2.bias", (d,)), (b + "fc.weight", (4 * d, d)),
                   (b + "fc.bias", (4 * d,)), (b + "fc2.weight", (d, 4 * d)), (b + "fc2.bias", (d,))]
    params += [("ln_f.weight", (d,)), ("ln_f.bias", (d,)), ("head.weight", (v, d))]
    out = [(f"model.{k}", s) for k, s in params]
    for k, s in params:
        out += [(f"optim.state.{k}.step", ()), (f"optim.state.{k}.exp_avg", s),
                (f"optim.state.{k}.exp_avg_sq", s)]
    return out


def write_layout(cfg: ModelConfig, world: int, order: str) -> list[list[Chunk]]:
    """Per file, its chunks at their file offsets (header included), as ShardWriter writes."""
    files = []
    for r in range(world):
        items: list[tuple[str, tuple[int, ...], tuple[int, int], int]] = []
        for key, shape in state_tensors(cfg):
            if not shape:
                if r == 0:
                    items.append((key, shape, (0, 1), 4))
                continue
            a, b = _chunk(shape[0], world, r)
            if b > a:
                items.append((key, shape, (a, b), (b - a) * math.prod(shape[1:]) * 4))
        # As the writer does: whole tensors (here the step scalars) in a file of their own when
        # the writer also holds pieces of larger ones.
        whole = [it for it in items if not it[1] or it[2] == (0, it[1][0])]
        pieces = [it for it in items if it[1] and it[2] != (0, it[1][0])]
        for group in ([pieces, whole] if pieces and whole else [items]):
            files.append(_file_layout(group, order))
    return files


def _file_layout(items: list[tuple[str, tuple[int, ...], tuple[int, int], int]],
                 order: str) -> list[Chunk]:
    if order == "smallest-first":
        items = sorted(items, key=lambda it: it[3])
    header = build_header([(f"{k}@{a}", "F32", [b - a, *s[1:]] if s else [], n)
                           for k, s, (a, b), n in items],
                          {"format": "pt", "portable_ckpt": "1.0", "attempt_id": "x" * 52})
    pos = len(header)
    chunks = []
    for key, shape, rows, n in items:
        chunks.append(Chunk(key, shape, rows, pos, n))
        pos += n
    return chunks


def _header_end(chunks: list[Chunk]) -> int:
    return chunks[0].start if chunks else 0


def pieces(files: list[list[Chunk]], tensors: list[tuple[str, tuple[int, ...]]], world: int,
           rank: int) -> tuple[dict[int, list[tuple[int, int]]], int]:
    """Bytes ``[lo, hi)`` per file that target rank ``rank`` of ``world`` needs; target bytes."""
    need: dict[int, list[tuple[int, int]]] = {}
    target = 0
    for f, chunks in enumerate(files):
        for c in chunks:
            if not c.shape:
                need.setdefault(f, []).append((c.start, c.start + c.nbytes))
                continue
            ta, tb = _chunk(c.shape[0], world, rank)
            a, b = max(ta, c.rows[0]), min(tb, c.rows[1])
            if b > a:
                lo = c.start + (a - c.rows[0]) * c.row_bytes
                need.setdefault(f, []).append((lo, lo + (b - a) * c.row_bytes))
    for _, shape in tensors:
        if not shape:
            target += 4
        else:
            ta, tb = _chunk(shape[0], world, rank)
            target += (tb - ta) * math.prod(shape[1:]) * 4
    return need, target



def _blocks(lo: int, hi: int, bs: int, size: int) -> tuple[int, int]:
    return lo // bs * bs, min(-(-hi // bs) * bs, size)


def _header_read(chunks: list[Chunk], bs: int, size: int) -> int:
    return _blocks(0, max(_header_end(chunks), 8), bs, size)[1]


def read_per_tensor(files: list[list[Chunk]], need: dict[int, list[tuple[int, int]]], bs: int) -> int:
    total = 0
    for f, spans in need.items():
        size = files[f][-1].start + files[f][-1].nbytes
        total += _header_read(files[f], bs, size)
        for lo, hi in spans:
            a, b = _blocks(lo, hi, bs, size)
            total += b - a
    return total


def read_planned(files: list[list[Chunk]], need: dict[int, list[tuple[int, int]]],
                 bs: int | None) -> int:
    """Bytes the per-file plan reads; ``bs=None``: each file's own auto block size."""
    total = 0
    for f, spans in need.items():
        size = files[f][-1].start + files[f][-1].nbytes
        bs = bs or auto_block_size(size)
        kept = _header_read(files[f], bs, size)
        total += kept
        segs = [Segment(lo, hi, i, True) for i, (lo, hi) in enumerate(spans) if hi > kept]
        segs = [Segment(max(s.lo, kept), s.hi, s.sink, True) for s in segs]
        for ext in plan_file(segs, block_size=bs, file_size=size, max_shared=1 << 24):
            total += sum(e.hi - e.lo for e in ext)
    return total


def aligned_block(nbytes: int, k: int) -> int:
    """Block size of a range in the range-aligned layout: a power of two ≥ nbytes / k in [4 KiB, 256 KiB]."""
    b = 4 * KIB
    while b * k < nbytes and b < 256 * KIB:
        b *= 2
    return b


def read_aligned(files: list[list[Chunk]], need: dict[int, list[tuple[int, int]]], k: int) -> int:
    total = 0
    for f, spans in need.items():
        chunks = files[f]
        total += _header_end(chunks)  # the header in its own blocks, read exactly
        for lo, hi in spans:
            c = next(c for c in chunks if c.start <= lo < c.start + c.nbytes)
            bs = aligned_block(c.nbytes, k)
            a, b = _blocks(lo - c.start, hi - c.start, bs, c.nbytes)
            total += b - a
    return total


def block_count(files: list[list[Chunk]], bs: int | None, k: int = 8, auto: bool = False) -> int:
    n = 0
    for chunks in files:
        size = chunks[-1].start + chunks[-1].nbytes
        if auto:
            n += -(-size // auto_block_size(size))
        elif bs is not None:
            n += -(-size // bs)
        else:
            n += -(-_header_end(chunks) // (256 * KIB)) + sum(
                -(-c.nbytes // aligned_block(c.nbytes, k)) for c in chunks)
    return n


def scale_blocks(k: int = 8, world: int = 4096, tensors: int = 2000) -> dict[str, int]:
    """Checksum blocks of the 4,096-writer scale layout: fixed blocks vs range-aligned ones."""
    import numpy as np

    from bench.scale_sim import Layout, boxes_for, model_tensors

    lay = Layout(tp=8, fsdp=world // 8)
    sizes_per_writer = np.zeros(world, np.int64)
    aligned = 0
    for spec in model_tensors(tensors):
        writers, _, lens = boxes_for(spec, lay)
        nb = np.prod(lens, axis=1) * (2 if spec.dtype == "bfloat16" else 4)
        np.add.at(sizes_per_writer, writers, nb)
        bsz = np.full(nb.shape, 4 * KIB)
        while True:
            grow = (bsz * k < nb) & (bsz < 256 * KIB)
            if not grow.any():
                break
            bsz[grow] *= 2
        aligned += int((-(-nb // bsz)).sum())
    out = {"writers": world, "bytes": int(sizes_per_writer.sum()), "aligned-1.2": aligned}
    for bs in (256 * KIB, 64 * KIB, 16 * KIB):
        out[f"fixed-{bs // KIB}KiB"] = int((-(-sizes_per_writer // bs)).sum())
    return out


def crc_cost(total: int = 64 << 20, reps: int = 5) -> list[dict[str, Any]]:
    """Seconds to hash (writer) and verify (reader) ``total`` bytes at each block size."""
    data = memoryview(os.urandom(total))
    rows = []
    for bs in (4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB):
        hs, vs = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            h = BlockHasher(bs)
            h.update(data)
            blocks = h.blocks()
            hs.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            BlockVerifier("x", blocks, bs, total).verify_span(0, [data])
            vs.append(time.perf_counter() - t0)
        rows.append({"block": f"{bs // KIB} KiB", "hash MiB/s": total / 2**20 / statistics.median(hs),
                     "verify MiB/s": total / 2**20 / statistics.median(vs),
                     "hex bytes per GiB": 8 * (1 << 30) // bs})
    return rows


def _md_table(rows: list[dict[str, Any]]) -> str:
    cols = list(rows[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(f"{r[c]:,.4g}" if isinstance(r[c], float) else f"{r[c]:,}"
                                     if isinstance(r[c], int) else str(r[c]) for c in cols) + " |")
    return "\n".join(out)


def write_md(path: str, out: dict[str, Any]) -> None:
    """The report: bytes-read table per model, checksum counts at scale, CRC cost."""
    lines = [f"# Checksum layout vs read planning ({dt.date.today().isoformat()})", "",
             "Command: `python -m bench.checksum_layout --md " + os.path.basename(path) + "` "
             "(planning arithmetic on the exact file layout ShardWriter produces; no I/O).", ""]
    for name, res in out["models"].items():
        m = res["model"]
        lines += [f"## {name}: {m['params'] / 1e6:.2f} M parameters, saved by 4 FSDP ranks", "",
                  "Worst rank's bytes read / target bytes (header and manifest excluded), and "
                  "the checksum list each layout puts in the manifest:", "",
                  _md_table(res["rows"]), ""]
    sc = out.get("scale")
    if sc:
        rows = [{"layout": k, "checksum blocks": v, "hex MiB in the manifest": v * 8 / 2**20}
                for k, v in sc.items() if k not in ("writers", "bytes")]
        lines += [f"## 4,096 writers × 2,000 tensors (bench/scale_sim.py layout, "
                  f"{sc['bytes'] / 2**30:.0f} GiB)", "", _md_table(rows), ""]
    lines += ["## CRC32C cost per block size (64 MiB in memory, medians of 5)", "",
              _md_table(out["crc"]), "",
              f"Load average (1 min) at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} "
              "cores; on a shared machine the absolute MiB/s are pessimistic, compare the rows.", ""]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="full", choices=sorted(PRESETS))
    ap.add_argument("--saved", type=int, default=4)
    ap.add_argument("--loads", default="4,3,2,1")
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-scale", action="store_true")
    ap.add_argument("--md", default=None, help="write a markdown report (both models) here")
    a = ap.parse_args(argv)
    if a.md:
        out = {"models": {m: layout_rows(PRESETS[m], a.saved, [4, 3, 2, 1]) for m in ("full", "small")},
               "crc": crc_cost()}
        if not a.no_scale:
            out["scale"] = {k: v for k, v in scale_blocks(8).items()}
            out["scale"].update({f"aligned-1.2 (k={k})": scale_blocks(k)["aligned-1.2"] for k in (4, 16)})
            out["scale"]["aligned-1.2 (k=8)"] = out["scale"].pop("aligned-1.2")
        write_md(a.md, out)
        with open(a.md.removesuffix(".md") + ".json", "w") as f:
            json.dump(out, f, indent=1)
        print(f"report: {a.md}")
        return 0
    res = layout_rows(PRESETS[a.model], a.saved, [int(x) for x in a.loads.split(",")])
    rows = res["rows"]
    cols = list(rows[0])
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))
    out = dict(res)
    if not a.no_scale:
        out["scale"] = {f"k={k}": scale_blocks(k) for k in (4, 8, 16)}
        print(json.dumps(out["scale"], indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


def layout_rows(cfg: ModelConfig, saved: int, loads: list[int]) -> dict[str, Any]:
    """Bytes read per layout and reader for one model (worst rank per load world size)."""
    tensors = state_tensors(cfg)
    rows: list[dict[str, Any]] = []
    for order in ("state order", "smallest-first"):
        files = write_layout(cfg, saved, order)
        variants: list[tuple[str, Any, int]] = []
        for bs in (256 * KIB, 64 * KIB, 16 * KIB, 4 * KIB):
            variants.append((f"per-tensor {bs // KIB} KiB",
                             lambda n, f=files, bs=bs: read_per_tensor(f, n, bs), block_count(files, bs)))
            variants.append((f"planned {bs // KIB} KiB",
                             lambda n, f=files, bs=bs: read_planned(f, n, bs), block_count(files, bs)))
        variants.append(("planned, per-file auto block (≈4,096 blocks/file)",
                         lambda n, f=files: read_planned(f, n, None), block_count(files, None, auto=True)))
        for k in (4, 8, 16):
            variants.append((f"range-aligned 1.2 (k={k})",
                             lambda n, f=files, k=k: read_aligned(f, n, k), block_count(files, None, k)))
        for name, fn, blocks in variants:
            row: dict[str, Any] = {"order": order, "reader / layout": name, "manifest checksum KiB": blocks * 8 / KIB}
            for m in loads:
                worst = 0.0
                for r in range(m):
                    need, target = pieces(files, tensors, m, r)
                    worst = max(worst, fn(need) / target)
                row[f"{saved}→{m}"] = round(worst, 4)
            rows.append(row)
    return {"model": cfg.to_json(), "rows": rows}


if __name__ == "__main__":
    raise SystemExit(main())
