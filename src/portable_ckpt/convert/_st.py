"""Minimal, bounded safetensors header parsing and streaming writing (for HF shards).

Reading parses only the header (≤ 100 MB, checked against the file size) and returns where each
tensor's bytes are; data is then read with ``pread`` one tensor at a time. Writing emits the
header first and then streams each tensor's bytes, so nothing larger than one slab is in memory.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

from portable_ckpt.errors import (
    CheckpointError,
    DtypeUnsupportedError,
    FileSizeError,
    JsonInvalidError,
    LimitError,
    ShardHeaderError,
)
from portable_ckpt.format import jsonio
from portable_ckpt.format.dtypes import DTYPES, dtype_by_safetensors
from portable_ckpt.format.manifest import MAX_NDIM
from portable_ckpt.storage._posix import open_regular

__all__ = ["MAX_HEADER", "StTensor", "build_header", "read_header"]

#: Largest safetensors header accepted (spec: readers reject N > 100,000,000).
MAX_HEADER = 100_000_000


@dataclass(frozen=True)
class StTensor:
    """A tensor inside a safetensors file: format dtype, shape, absolute byte range."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        """Return the size of the tensor's bytes."""
        return self.end - self.start


def read_header(path: str) -> tuple[list[StTensor], dict[str, str]]:
    """Parse the header of safetensors file ``path``.

    Returns:
        The tensors in data order and the ``__metadata__`` map (empty when absent).

    Raises:
        FileMissingError: the file does not exist.
        ShardHeaderError: header length absurd, JSON bad, offsets inconsistent.
        FileSizeError: the header's data extends past the end of the file (truncated).
        DtypeUnsupportedError: a tensor's dtype is outside the format's table.

    """
    raw, size = _raw_header(path)
    doc = _header_doc(path, raw)
    data_start = 8 + len(raw)
    meta_raw = doc.pop("__metadata__", None) or {}
    if not isinstance(meta_raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta_raw.items()
    ):
        raise ShardHeaderError(f"{path}: __metadata__ must map strings to strings", path=path)
    tensors = [_tensor(path, name, info, data_start, size) for name, info in doc.items()]
    tensors.sort(key=lambda t: t.start)
    return tensors, dict(meta_raw)


def _raw_header(path: str) -> tuple[bytes, int]:
    """The header's JSON bytes (its length checked against the file) and the file's size."""
    fd = open_regular(path, what=f"safetensors file {path}")  # a FIFO is refused, never waited on
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 8, 0)
        if len(head) != 8:
            raise ShardHeaderError(f"{path}: file of {size} bytes is too short for a safetensors header", path=path)
        n = int.from_bytes(head, "little")
        if n > MAX_HEADER or n > size - 8:
            if n <= MAX_HEADER:
                raise FileSizeError(
                    f"{path}: header length {n} exceeds the file ({size} bytes): truncated file",
                    path=path,
                )
            # `--from hf` given a torch.save file is a user's slip, not a damaged download
            hint = (": not a safetensors file (it starts as a zip, as a torch.save file does: "
                    "pass --from torch (Python: src_format='torch'))" if head[:4] == b"PK\x03\x04" else "")
            raise ShardHeaderError(
                f"{path}: header length {n} is absurd (max {MAX_HEADER}){hint}", path=path
            )
        return os.pread(fd, n, 8), size
    finally:
        os.close(fd)


def _header_doc(path: str, raw: bytes) -> dict[str, Any]:
    try:
        doc = jsonio.loads(raw, what=f"{path} (safetensors header)", max_bytes=MAX_HEADER)
    except CheckpointError as exc:
        raise ShardHeaderError(f"{path}: header is not valid JSON: {exc.message}", path=path) from None
    if not isinstance(doc, dict):
        raise ShardHeaderError(f"{path}: header is not a JSON object", path=path)
    return doc


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _tensor(path: str, name: str, info: Any, data_start: int, size: int) -> StTensor:
    """One header record, checked: dtype, shape, offsets within the data section."""
    if not isinstance(info, dict):
        raise ShardHeaderError(f"{path}: entry {name!r} is not an object", path=path)
    code = info.get("dtype")
    try:
        dt = dtype_by_safetensors(code)  # type: ignore[arg-type]
    except DtypeUnsupportedError:
        raise DtypeUnsupportedError(
            f"{path}: tensor {name!r} has dtype {code!r}, which the portable format does not "
            f"support (supported: {', '.join(r.safetensors for r in DTYPES.values())}); cast it "
            "before converting",
            path=path,
        ) from None
    shape = info.get("shape")
    offs = info.get("data_offsets")
    if (
        not isinstance(shape, list)
        or not all(_is_count(d) for d in shape)
        or not isinstance(offs, list)
        or len(offs) != 2
        or not all(_is_count(o) for o in offs)
        or offs[0] > offs[1]
    ):
        raise ShardHeaderError(f"{path}: tensor {name!r} has a malformed shape/data_offsets", path=path)
    if len(shape) > MAX_NDIM:
        # before anything is written (conversion review 25, M1: numpy's reshape refused it
        # mid-write, an internal error), as the DCP and torch.save readers do
        raise LimitError(f"{path}: tensor {name!r} has {len(shape):,} dimensions, above the "
                         f"format's limit of {MAX_NDIM}: it cannot be stored; reshape it before "
                         "converting", path=path)
    want = math.prod(shape) * dt.itemsize
    if offs[1] - offs[0] != want:
        raise ShardHeaderError(
            f"{path}: tensor {name!r} has {offs[1] - offs[0]} bytes but shape {shape} x "
            f"{dt.safetensors} needs {want}",
            path=path,
        )
    data_len = size - data_start
    if offs[1] > data_len:
        raise FileSizeError(
            f"{path}: tensor {name!r} needs data bytes up to {offs[1]} but the file holds "
            f"{data_len} after the header: the file is truncated; re-download it",
            path=path,
        )
    return StTensor(name, dt.name, tuple(shape), data_start + offs[0], data_start + offs[1])


def _sort_key(item: tuple[str, str, tuple[int, ...]]) -> tuple[int, str]:
    return (-DTYPES[item[1]].itemsize, item[0])


def build_header(
    tensors: list[tuple[str, str, tuple[int, ...]]], metadata: dict[str, str] | None
) -> tuple[bytes, list[tuple[str, int, int]]]:
    """Build a safetensors header for ``(name, format dtype, shape)`` tensors.

    Tensors are laid out like the ``safetensors`` library does (largest alignment first, then by
    name); the header is padded with spaces to a multiple of 8.

    Returns:
        The 8-byte length prefix + header bytes, and ``(name, start, end)`` in data order
        (offsets relative to the data section).

    """
    order = sorted(tensors, key=_sort_key)
    doc: dict[str, Any] = {}
    if metadata:
        doc["__metadata__"] = metadata
    layout: list[tuple[str, int, int]] = []
    pos = 0
    for name, dtype, shape in order:
        n = math.prod(shape) * DTYPES[dtype].itemsize
        doc[name] = {"dtype": DTYPES[dtype].safetensors, "shape": list(shape), "data_offsets": [pos, pos + n]}
        layout.append((name, pos, pos + n))
        pos += n
    try:
        text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except ValueError as exc:  # pragma: no cover - names are str
        raise JsonInvalidError(f"cannot encode safetensors header: {exc}") from None
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, layout
