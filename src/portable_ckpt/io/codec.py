"""Strict, bounded zstd decoding for chunks and entry values (spec §8.3, §12.2)."""

from __future__ import annotations

import zstandard

from portable_ckpt.errors import CodecError

__all__ = ["decompress_frame"]


def decompress_frame(frame: bytes, *, expect: int | None, limit: int, what: str) -> bytes:
    """Decode exactly one zstd frame, never producing more than ``limit`` bytes.

    Args:
        frame: The stored bytes: one frame, nothing before or after it.
        expect: The exact decoded size required (``None`` when only ``limit`` applies).
        limit: Upper bound on the decoded size, enforced before and while decoding.
        what: Names the file, tensor and range (or entry) in messages.

    Raises:
        CodecError: not one frame, trailing bytes, a declared or actual size that differs from
            ``expect`` or exceeds ``limit``, or a corrupt frame.

    """
    try:
        declared = zstandard.get_frame_parameters(frame).content_size
    except zstandard.ZstdError as exc:
        raise CodecError(f"{what}: not a zstd frame ({exc})", path=what) from None
    bound = limit if expect is None else min(limit, expect)
    known = declared != zstandard.CONTENTSIZE_UNKNOWN
    if known and (declared > bound or (expect is not None and declared != expect)):
        raise CodecError(
            f"{what}: the frame declares {declared} decoded bytes; "
            + (f"exactly {expect} are required" if expect is not None else f"the limit is {limit}"),
            path=what,
        )
    dctx = zstandard.ZstdDecompressor()
    if known:
        # The one-shot decoder allocates the declared size once (about twice as fast as the
        # streaming object on large frames) but ignores bytes after the frame, so the frame's
        # extent is established first from its block headers.
        extent = _frame_extent(frame, what)
        if extent != len(frame):
            raise CodecError(
                f"{what}: the stored bytes are not exactly one zstd frame "
                f"({len(frame) - extent} bytes after it)",
                path=what,
            )
        try:
            out = dctx.decompress(frame, max_output_size=max(declared, 1))
        except zstandard.ZstdError as exc:
            raise CodecError(f"{what}: corrupt zstd frame ({exc})", path=what) from None
        if len(out) != declared:
            raise CodecError(
                f"{what}: decodes to {len(out)} bytes, the frame declares {declared}", path=what
            )
        return out
    try:
        if not known:
            # No declared size: decode with a bounded reader first, so output cannot run away.
            with dctx.stream_reader(frame, read_across_frames=False) as reader:
                size = 0
                while chunk := reader.read(min(1 << 20, bound + 1 - size)):
                    size += len(chunk)
                    if size > bound:
                        raise CodecError(f"{what}: decodes to more than {bound} bytes", path=what)
        dobj = dctx.decompressobj()
        out = dobj.decompress(frame)
        if not dobj.eof or dobj.unused_data:
            raise CodecError(
                f"{what}: the stored bytes are not exactly one zstd frame (truncated, or "
                f"{len(dobj.unused_data)} bytes after it)",
                path=what,
            )
    except zstandard.ZstdError as exc:
        raise CodecError(f"{what}: corrupt zstd frame ({exc})", path=what) from None
    if expect is not None and len(out) != expect:
        raise CodecError(f"{what}: decodes to {len(out)} bytes, {expect} required", path=what)
    if len(out) > limit:
        raise CodecError(f"{what}: decodes to more than {limit} bytes", path=what)
    return out


_MAGIC = 0xFD2FB528


def _frame_extent(frame: bytes, what: str) -> int:
    """Byte length of the zstd frame at the start of ``frame`` (RFC 8878 §3.1.1).

    Walks the block headers without decoding; corrupt or truncated structure is ``PCK-CODEC``.
    """
    if len(frame) < 6 or int.from_bytes(frame[:4], "little") != _MAGIC:
        raise CodecError(f"{what}: not a zstd frame (bad magic number)", path=what)
    try:
        pos = zstandard.frame_header_size(frame)
    except zstandard.ZstdError as exc:
        raise CodecError(f"{what}: corrupt zstd frame header ({exc})", path=what) from None
    has_checksum = bool(frame[4] & 0x04)
    n = len(frame)
    while True:
        if pos + 3 > n:
            raise CodecError(f"{what}: truncated zstd frame (block header)", path=what)
        head = int.from_bytes(frame[pos : pos + 3], "little")
        pos += 3
        kind, size = (head >> 1) & 3, head >> 3
        if kind == 3:
            raise CodecError(f"{what}: corrupt zstd frame (reserved block type)", path=what)
        pos += 1 if kind == 1 else size
        if pos > n:
            raise CodecError(f"{what}: truncated zstd frame (block data)", path=what)
        if head & 1:
            break
    return pos + (4 if has_checksum else 0)
