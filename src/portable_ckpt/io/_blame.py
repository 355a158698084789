"""What lives in a damaged checksum block: the tensor ranges, entry value or header it holds.

A PCK-CHECKSUM error names the file and the block's bytes; an operator also needs to know what
was lost there (``tensor 'model/layers/3/w' range offsets [0, 0] lengths [512, 1024], elements
[0:4096] of 524288``) to judge whether an older version, a copy or a re-computation is needed.
Only called on the error path: it walks the manifest's records of the file (bounded by the
manifest, which was parsed with its own limits) and the shard header the reader already holds.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from portable_ckpt.errors import ChecksumError
from portable_ckpt.format.manifest import Manifest, RangeRecord, TensorEntry
from portable_ckpt.io.safetensors_io import ShardHeader
from portable_ckpt.io.tensor_table import iter_records

__all__ = ["block_contents", "name_block"]

#: Items named in one message (the rest are counted).
MAX_NAMED = 8


def _records(t: TensorEntry) -> Iterator[RangeRecord]:
    # Without materialising the records: the reader's planning keeps its table fast path.
    return iter_records(t)


def _range_text(t: TensorEntry, rec: RangeRecord, start: int, end: int, lo: int, hi: int) -> str:
    """``tensor 'k' range offsets [..] lengths [..]`` and which of its elements the block holds."""
    text = f"tensor {t.key!r} range offsets {list(rec.offsets)} lengths {list(rec.lengths)}"
    a, b = max(lo, start) - start, min(hi, end) - start
    if rec.codec != "none":
        return f"{text} (bytes [{a}:{b}] of its {end - start}-byte {rec.codec} frame)"
    isz, n = t.itemsize, math.prod(rec.lengths)
    return f"{text} (elements [{a // isz}:{-(-b // isz)}] of its {n}, row-major)"


def _tensor_items(
    manifest: Manifest, path: str, header: ShardHeader | None, lo: int, hi: int
) -> list[str]:
    items: list[str] = []
    for t in manifest.tensors.values():
        for rec in _records(t):
            if rec.file != path:
                continue
            if header is None:
                items.append(f"tensor {t.key!r}")  # where exactly is in the unreadable header
                break
            st = header.tensors.get(rec.name)
            if st is not None and st.start < hi and lo < st.end:
                items.append(_range_text(t, rec, st.start, st.end, lo, hi))
    return items


def block_contents(
    manifest: Manifest, path: str, header: ShardHeader | None, lo: int, hi: int
) -> str:
    """What bytes ``[lo, hi)`` of ``path`` (relative to the version) hold, as a sentence."""
    if manifest.tensor_table is not None and manifest.tensor_table.file == path:
        return "the block holds part of the version's tensor table (every tensor's ranges)"
    owners = [
        f"entry {e.name!r}" + ("" if v.rank is None else f" (rank {v.rank})")
        for e in manifest.entries.values()
        for v in e.values
        if v.file == path
    ]
    if owners:
        return f"the block holds the value of {', '.join(owners)}"
    items = _tensor_items(manifest, path, header, lo, hi)
    if header is None:
        lead = "the block is in the file's shard header, so the exact ranges are unknown; "
        return lead + (f"the file holds {_listed(items)}" if items else "the file holds no tensor")
    if lo < header.data_start:
        items.insert(0, "the shard header")
    return f"the block holds {_listed(items)}" if items else "the block holds padding only"


def _listed(items: list[str]) -> str:
    named = "; ".join(items[:MAX_NAMED])
    return named + (f"; and {len(items) - MAX_NAMED} more" if len(items) > MAX_NAMED else "")


def name_block(
    exc: ChecksumError, manifest: Manifest, path: str, header: ShardHeader | None
) -> ChecksumError:
    """``exc`` with what its block holds appended (``exc`` itself when it names no block)."""
    if exc.span is None:
        return exc
    lo, hi = exc.span
    # What was lost goes before the advice that ends the message.
    head, sep, advice = exc.message.partition("; the file is corrupt")
    text = f"{head}; {block_contents(manifest, path, header, lo, hi)}{sep}{advice}"
    return ChecksumError(text, path=exc.path, span=exc.span)
