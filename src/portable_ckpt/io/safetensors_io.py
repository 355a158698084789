"""safetensors shard headers: building them for writers, parsing them (bounded) for readers."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from portable_ckpt.errors import CheckpointError, ShardHeaderError, ShardMismatchError
from portable_ckpt.format import jsonio
from portable_ckpt.format.dtypes import DTYPES

__all__ = [
    "MAX_HEADER_BYTES",
    "ShardHeader",
    "ShardTensor",
    "build_header",
    "check_range",
    "load_header",
    "parse_header",
]

_ST_ITEMSIZE = {row.safetensors: row.itemsize for row in DTYPES.values()}

#: Largest header accepted (the safetensors reference limit).
MAX_HEADER_BYTES = 100_000_000


@dataclass(frozen=True, slots=True)
class ShardTensor:
    """A tensor inside a safetensors file: dtype code, shape and absolute byte span in the file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


@dataclass(frozen=True)
class ShardHeader:
    """A parsed header: the data section begins at ``data_start``."""

    data_start: int
    tensors: dict[str, ShardTensor]
    metadata: dict[str, str]


def build_header(
    items: Sequence[tuple[str, str, Sequence[int], int]], metadata: dict[str, str]
) -> bytes:
    """Return the 8-byte length prefix + JSON header for ``(name, dtype, shape, nbytes)`` items.

    Tensors are laid out back to back in the given order; the header is padded with spaces to a
    multiple of 8 bytes so the data section starts aligned.
    """
    doc: dict[str, Any] = {"__metadata__": metadata}
    pos = 0
    for name, dtype, shape, nbytes in items:
        doc[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + nbytes]}
        pos += nbytes
    body = jsonio.dumps(doc)
    body += b" " * (-(len(body) + 8) % 8)
    return struct.pack("<Q", len(body)) + body


def parse_header(prefix: bytes, header: bytes, *, path: str, file_size: int) -> ShardHeader:
    """Parse and bound-check a safetensors header read from ``path``.

    Raises:
        ShardHeaderError: bad JSON, malformed entries, offsets outside the file.

    """
    if len(prefix) != 8:
        raise ShardHeaderError(
            f"{path}: safetensors length prefix has {len(prefix)} bytes, not 8", path=path
        )
    n = struct.unpack("<Q", prefix)[0]
    if len(header) != n:
        raise ShardHeaderError(
            f"{path}: header has {len(header)} bytes, the prefix says {n}", path=path
        )
    data_start = 8 + n
    try:
        doc = jsonio.loads(header, what=f"{path} (safetensors header)", max_bytes=MAX_HEADER_BYTES)
    except CheckpointError as exc:
        raise ShardHeaderError(str(exc.message), path=path) from None
    if not isinstance(doc, dict):
        raise ShardHeaderError(f"{path}: safetensors header is not a JSON object", path=path)
    meta = doc.pop("__metadata__", {}) or {}
    if not isinstance(meta, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
    ):
        raise ShardHeaderError(f"{path}: __metadata__ must map strings to strings", path=path)
    tensors: dict[str, ShardTensor] = {}
    data_len = file_size - data_start
    for name, t in doc.items():
        if not isinstance(t, dict):
            raise ShardHeaderError(f"{path}: header entry {name!r} is not an object", path=path)
        dtype = t.get("dtype")
        shape = t.get("shape")
        offs = t.get("data_offsets")
        if (
            not isinstance(dtype, str)
            or not isinstance(shape, list)
            or not all(
                isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 1 << 53 for s in shape
            )
            or not isinstance(offs, list)
            or len(offs) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)
        ):
            raise ShardHeaderError(
                f"{path}: header entry {name!r} is malformed ({t!r:.200})", path=path
            )
        b, e = offs
        row = _ST_ITEMSIZE.get(dtype)
        if row is None:
            raise ShardHeaderError(
                f"{path}: header entry {name!r} has dtype {dtype!r}, not a safetensors dtype of "
                "the format's table",
                path=path,
            )
        if e - b != math.prod(shape) * row:
            raise ShardHeaderError(
                f"{path}: header entry {name!r} spans {e - b} bytes, but {dtype}{shape} needs "
                f"{math.prod(shape) * row}",
                path=path,
            )
        if not 0 <= b <= e <= data_len:
            raise ShardHeaderError(
                f"{path}: tensor {name!r} data_offsets [{b}, {e}] lie outside the {data_len}-byte "
                "data section (truncated file?)",
                path=path,
            )
        tensors[name] = ShardTensor(name, dtype, tuple(shape), data_start + b, data_start + e)
    _check_packed(tensors.values(), data_start, data_len, path)
    return ShardHeader(data_start, tensors, dict(meta))


def _check_packed(tensors: Iterable[ShardTensor], data_start: int, data_len: int, path: str) -> None:
    """R-SHARD-9: the tensors tile the data area from its first byte to its last, in some order.

    A hole (bytes no tensor owns), an overlap or bytes after the last tensor are
    ``PCK-SHARD-HEADER``, as the safetensors library reports them.
    """
    pos = data_start
    for t in sorted(tensors, key=lambda t: (t.start, t.end)):
        if t.start != pos:
            kind = "a hole before" if t.start > pos else "an overlap with"
            raise ShardHeaderError(
                f"{path}: tensor {t.name!r} starts at data offset {t.start - data_start}, the "
                f"previous tensor ends at {pos - data_start} ({kind} it); tensors must be packed "
                "without holes or overlaps",
                path=path,
            )
        pos = t.end
    if pos != data_start + data_len:
        raise ShardHeaderError(
            f"{path}: the tensors end at data offset {pos - data_start}, the data area has "
            f"{data_len} bytes ({data_start + data_len - pos} bytes no tensor owns)",
            path=path,
        )


def load_header(
    read: Callable[[int, int], bytes], *, file_size: int, what: str, probe: int = 8
) -> ShardHeader:
    """Read and parse a safetensors header with bounded reads.

    ``read(lo, hi)`` returns bytes ``[lo, hi)`` of the file, already checksum-verified (a header is
    never interpreted before its blocks verify). ``file_size`` is the size recorded in the
    manifest (already checked against the storage). ``probe`` bytes are read first: pass the
    checksum block size, since a verified read costs that whole block anyway.
    """
    if file_size < 8:
        raise ShardHeaderError(
            f"{what}: {file_size} bytes is too short for a safetensors file", path=what
        )
    # One read usually holds the length prefix and the whole header: verified reads cost whole
    # checksum blocks, so asking for 8 bytes first and the header next would verify block 0 twice.
    first = read(0, min(file_size, max(8, probe)))
    n = struct.unpack("<Q", first[:8])[0]
    if n > MAX_HEADER_BYTES or n > file_size - 8:
        raise ShardHeaderError(
            f"{what}: header length {n} exceeds the limit ({MAX_HEADER_BYTES}) or the file size "
            f"({file_size}); the file is corrupt or not safetensors",
            path=what,
        )
    header = first[8 : 8 + n]
    if len(header) < n:
        header += read(len(first), 8 + n)
    return parse_header(first[:8], header, path=what, file_size=file_size)


def check_range(
    header: ShardHeader,
    *,
    what: str,
    key: str,
    rec_name: str,
    codec: str,
    st_dtype: str,
    lengths: Sequence[int],
    nbytes: int,
) -> ShardTensor:
    """Check that range record ``rec_name`` agrees with the header; return its shard tensor."""
    t = header.tensors.get(rec_name)
    if t is None:
        raise ShardMismatchError(
            f"{what}: tensor {key!r}: range names {rec_name!r}, which the safetensors header does "
            "not contain",
            path=what,
        )
    if codec == "none":
        if t.dtype != st_dtype or t.shape != tuple(lengths) or t.end - t.start != nbytes:
            raise ShardMismatchError(
                f"{what}: tensor {key!r} range {rec_name!r}: header says {t.dtype}{list(t.shape)} "
                f"({t.end - t.start} bytes), the manifest says {st_dtype}{list(lengths)} "
                f"({nbytes} bytes)",
                path=what,
            )
    elif t.dtype != "U8" or len(t.shape) != 1 or not 1 <= t.shape[0] == t.end - t.start:
        raise ShardMismatchError(
            f"{what}: tensor {key!r} range {rec_name!r} is zstd-coded and must be a 1-D U8 tensor "
            f"of at least one byte (R-TENSOR-6), the header says {t.dtype}{list(t.shape)}",
            path=what,
        )
    return t
