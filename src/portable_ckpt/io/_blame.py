"""What lives in a damaged checksum block: the tensor ranges, entry value or header it holds.

A PCK-CHECKSUM error names the file and the block's bytes; an operator also needs to know what
was lost there (``tensor 'model/layers/3/w' range offsets [0, 0] lengths [512, 1024], elements
[0:4096] of 524288``) to judge whether an older version, a copy or a re-computation is needed.
Only called on the error path: it walks the manifest's records of the file (bounded by the
manifest, which was parsed with its own limits) and the shard header the reader already holds.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from portable_ckpt.errors import ChecksumError
from portable_ckpt.format.manifest import Manifest, RangeRecord, TensorEntry
from portable_ckpt.io.checksum import DAMAGE_ADVICE
from portable_ckpt.io.safetensors_io import ShardHeader
from portable_ckpt.io.tensor_table import iter_records

__all__ = ["block_contents", "name_block", "name_blocks"]

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


class _Items:
    """What one span holds: the first :data:`MAX_NAMED` items named, the rest counted."""

    def __init__(self) -> None:
        self.named: list[str] = []
        self.more = 0

    def add(self, text: str) -> None:
        if len(self.named) < MAX_NAMED:
            self.named.append(text)
        else:
            self.more += 1

    def lead(self, text: str) -> None:
        """Name ``text`` first."""
        self.named.insert(0, text)
        if len(self.named) > MAX_NAMED:
            self.named.pop()
            self.more += 1

    def __bool__(self) -> bool:
        return bool(self.named)

    def text(self) -> str:
        return "; ".join(self.named) + (f"; and {self.more} more" if self.more else "")


def _tensor_items(
    manifest: Manifest, path: str, header: ShardHeader | None, spans: Sequence[tuple[int, int]]
) -> list[_Items]:
    """The tensor ranges each span of ``path`` holds: one walk of the records for every span."""
    items = [_Items() for _ in spans]
    for t in manifest.tensors.values():
        for rec in _records(t):
            if rec.file != path:
                continue
            if header is None:
                for it in items:  # where exactly is in the unreadable header
                    it.add(f"tensor {t.key!r}")
                break
            st = header.tensors.get(rec.name)
            if st is None:
                continue
            for (lo, hi), it in zip(spans, items, strict=True):
                if st.start < hi and lo < st.end:
                    it.add(_range_text(t, rec, st.start, st.end, lo, hi))
    return items


def _contents(
    manifest: Manifest,
    path: str,
    header: ShardHeader | None,
    spans: Sequence[tuple[int, int]],
    subjects: Sequence[str],
    in_header: bool = True,
) -> list[str]:
    """What each span of ``path`` holds, as a sentence about its subject (``the block``).

    ``in_header``: without a ``header``, the spans are in the shard header being read (else
    the header was not read: a pass over a file whose header failed).
    """
    verbs = [("hold", "are") if s.endswith("s") else ("holds", "is") for s in subjects]
    if manifest.tensor_table is not None and manifest.tensor_table.file == path:
        return [f"{s} {h} part of the version's tensor table (every tensor's ranges)"
                for s, (h, _) in zip(subjects, verbs, strict=True)]
    owners = [
        f"entry {e.name!r}" + ("" if v.rank is None else f" (rank {v.rank})")
        for e in manifest.entries.values()
        for v in e.values
        if v.file == path
    ]
    if owners:
        return [f"{s} {h} the value of {', '.join(owners)}"
                for s, (h, _) in zip(subjects, verbs, strict=True)]
    out = []
    for (lo, _), s, (h, be), items in zip(
        spans, subjects, verbs, _tensor_items(manifest, path, header, spans), strict=True
    ):
        if header is None:
            if in_header:
                lead = f"{s} {be} in the file's shard header, so the exact ranges are unknown; "
            else:
                lead = ("the file's shard header was not read, so the exact ranges are unknown; "
                        if items else "")
            out.append(lead + (f"the file holds {items.text()}" if items
                               else "the file holds no tensor"))
            continue
        if lo < header.data_start:
            items.lead("the shard header")
        out.append(f"{s} {h} {items.text()}" if items else f"{s} {h} padding only")
    return out


def block_contents(
    manifest: Manifest, path: str, header: ShardHeader | None, lo: int, hi: int
) -> str:
    """What bytes ``[lo, hi)`` of ``path`` (relative to the version) hold, as a sentence."""
    return _contents(manifest, path, header, [(lo, hi)], ["the block"])[0]


def name_block(
    exc: ChecksumError, manifest: Manifest, path: str, header: ShardHeader | None
) -> ChecksumError:
    """``exc`` with what its block holds appended (``exc`` itself when it names no block)."""
    return name_blocks([exc], manifest, path, header)[0]


def name_blocks(
    excs: Sequence[ChecksumError],
    manifest: Manifest,
    path: str,
    header: ShardHeader | None,
    *,
    in_header: bool = True,
) -> list[ChecksumError]:
    """Each of ``excs`` (findings in ``path``) with what its bytes hold put before its advice.

    One walk of the file's records names them all. A finding whose span is more than one
    block (a run of damaged blocks, the span of the ones counted) says what "these bytes" hold.
    A finding that names no span is kept as it is. ``in_header``: without a ``header``, the
    findings come from reading the shard header (else from a pass over a file whose header
    could not be read).
    """
    spans = [e.span for e in excs if e.span is not None]
    if not spans:
        return list(excs)
    rec = manifest.files.get(path)
    bs = rec.checksum.block_size if rec is not None else 0
    subjects = ["these bytes" if hi - lo > bs else "the block" for lo, hi in spans]
    texts = iter(_contents(manifest, path, header, spans, subjects, in_header))
    out = []
    for exc in excs:
        if exc.span is None:
            out.append(exc)
            continue
        # What was lost goes before the advice that ends the message.
        head, sep, advice = exc.message.partition(f"; {DAMAGE_ADVICE}")
        text = f"{head}; {next(texts)}{sep}{advice}"
        out.append(ChecksumError(text, path=exc.path, span=exc.span))
    return out
