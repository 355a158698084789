"""Safe, checksum-verifying access to the files of one version directory (own implementation).

Used by both the checker and the suite's own reader. Every path taken from a document goes
through :meth:`VersionFiles.resolve`, which applies the spec's path rules and refuses symlinks
that leave the attempt directory.
"""

from __future__ import annotations

import math
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.spec import (
    MAX_BLOCK_SIZE,
    MAX_HEADER_BYTES,
    MAX_SIZE,
    MIN_BLOCK_SIZE,
    ST_ITEMSIZE,
    path_problem,
)
from conformance.strictjson import StrictJsonError, loads_strict

__all__ = [
    "FileRecord",
    "Problem",
    "StHeader",
    "StTensor",
    "VersionFiles",
    "ZSTD_HEADER_MAX",
    "ZSTD_MAX_WINDOW",
    "ZstdFrameHeader",
    "crc32c",
    "mode_kind",
    "open_regular",
    "parse_file_record",
    "parse_safetensors_bytes",
    "parse_safetensors_header",
    "read_regular",
    "zstd_bound",
    "zstd_check_header",
    "zstd_decode",
    "zstd_frame_content_size",
    "zstd_frame_header",
]


class Problem(Exception):
    """A conformance violation with its spec error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"[{code}] {message}")
        self.code = code
        self.message = message


def _crc32c_py(data: bytes, crc: int = 0) -> int:
    table = _TABLE
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _make_table() -> list[int]:
    out = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        out.append(c)
    return out


_TABLE = _make_table()

try:  # the native package is much faster; the pure-Python table is the fallback.
    import crc32c as _crc32c_mod

    def crc32c(data: bytes | memoryview) -> int:
        """CRC-32C (Castagnoli) of ``data``."""
        return int(_crc32c_mod.crc32c(bytes(data)))

except ImportError:  # pragma: no cover

    def crc32c(data: bytes | memoryview) -> int:
        """CRC-32C (Castagnoli) of ``data``."""
        return _crc32c_py(bytes(data))


_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # opening a FIFO for reading must not wait
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def mode_kind(mode: int) -> str:
    """What a file-type ``mode`` is, in words ("a FIFO", "a symbolic link", ...)."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: Path, what: str, *, follow: bool = True) -> int:
    """Open ``path`` read-only and return the descriptor of a regular file (R-SEC-16).

    ``O_NONBLOCK`` keeps the open of a FIFO from waiting for a writer; the type is checked with
    ``fstat`` on the descriptor itself. ``follow=False`` adds ``O_NOFOLLOW``: a symbolic link
    as the last component is not opened.

    Raises:
        Problem: PCK-FILE-MISSING when nothing is there or it is not a regular file (a FIFO,
            socket, device, directory; with ``follow=False`` also a symbolic link).
        OSError: any other failure of the open.

    """
    flags = os.O_RDONLY | _O_NONBLOCK | _O_CLOEXEC | (0 if follow else _O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise Problem("PCK-FILE-MISSING", f"{what} does not exist") from None
    except OSError:
        if not follow and os.path.islink(path):
            raise Problem("PCK-FILE-MISSING", f"{what} is a symbolic link, not a regular "
                          "file (R-SEC-16)") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise Problem("PCK-FILE-MISSING", f"{what} is {mode_kind(mode)}, not a regular file "
                      "(R-SEC-16)")
    return fd


def read_regular(path: Path, what: str, *, max_bytes: int, code: str = "PCK-JSON-INVALID",
                 follow: bool = True) -> bytes:
    """The whole regular file at ``path`` (:func:`open_regular`), refused above ``max_bytes``.

    The size is taken from ``fstat`` of the open descriptor before anything is read, and the
    read is bounded by ``max_bytes`` whatever the file does meanwhile (R-SEC-11).

    Raises:
        Problem: PCK-FILE-MISSING (see :func:`open_regular`); ``code`` above ``max_bytes``.
        OSError: the open or a read failed otherwise.

    """
    fd = open_regular(path, what, follow=follow)
    try:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise Problem(code, f"{what} is {size} bytes, larger than the limit of {max_bytes} "
                          "(R-SEC-11)")
        out = bytearray()
        while len(out) <= max_bytes:
            piece = os.read(fd, 1 << 20)
            if not piece:
                return bytes(out)
            out += piece
        raise Problem(code, f"{what} grew above the limit of {max_bytes} bytes (R-SEC-11)")
    finally:
        os.close(fd)


@dataclass
class FileRecord:
    """A ``files`` record of a manifest or writer index."""

    path: str
    size: int
    block_size: int
    blocks: list[int]
    verified: set[int] = field(default_factory=set)


def parse_file_record(path: str, rec: Any) -> FileRecord:
    """Parse and sanity-check one ``files`` record.

    Raises:
        Problem: PCK-SCHEMA / PCK-CHECKSUM / PCK-LIMIT when the record is malformed.

    """
    if not isinstance(rec, dict):
        raise Problem("PCK-SCHEMA", f"files[{path!r}] is not an object")
    size = rec.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise Problem("PCK-SCHEMA", f"files[{path!r}].size must be an integer >= 0, got {size!r}")
    if size > 2**53 - 1:
        raise Problem("PCK-LIMIT", f"files[{path!r}].size {size} exceeds 2^53-1")
    ck = rec.get("checksum")
    if not isinstance(ck, dict) or ck.get("algorithm") != "crc32c":
        raise Problem("PCK-SCHEMA", f"files[{path!r}].checksum must have algorithm 'crc32c'")
    bs = ck.get("block_size")
    if (not isinstance(bs, int) or isinstance(bs, bool) or bs < MIN_BLOCK_SIZE
            or bs > MAX_BLOCK_SIZE or bs & (bs - 1)):
        raise Problem("PCK-SCHEMA", f"files[{path!r}].checksum.block_size {bs!r} is not a power "
                      f"of two in [{MIN_BLOCK_SIZE}, 2^30]")
    blocks = ck.get("blocks")
    if not isinstance(blocks, str) or len(blocks) % 8 or any(c not in "0123456789abcdef"
                                                            for c in blocks):
        raise Problem("PCK-SCHEMA", f"files[{path!r}].checksum.blocks must be lowercase hex, "
                      "8 digits per block")
    n = math.ceil(size / bs)
    if len(blocks) != 8 * n:
        raise Problem("PCK-SCHEMA", f"files[{path!r}]: {len(blocks) // 8} block checksums for "
                      f"{n} blocks of {bs} bytes (size {size})")
    return FileRecord(path, size, bs, [int(blocks[i:i + 8], 16) for i in range(0, len(blocks), 8)])


class VersionFiles:
    """Files of one attempt directory, read with the spec's path and checksum rules."""

    def __init__(self, vdir: Path) -> None:
        self.vdir = vdir
        self.real = os.path.realpath(vdir)
        self.records: dict[str, FileRecord] = {}

    def resolve(self, rel: object, *, must_exist: bool = True) -> Path:
        """Return the filesystem path of document path ``rel``.

        Raises:
            Problem: PCK-PATH-UNSAFE for unsafe paths or symlinks leaving the attempt,
                PCK-FILE-MISSING when ``must_exist`` and the file is absent.

        """
        why = path_problem(rel)
        if why is not None:
            raise Problem("PCK-PATH-UNSAFE", why)
        assert isinstance(rel, str)
        cur = self.vdir
        for part in rel.split("/"):
            cur = cur / part
            if cur.is_symlink():
                target = os.path.realpath(cur)
                if not (target + os.sep).startswith(self.real + os.sep) or target == self.real:
                    raise Problem("PCK-PATH-UNSAFE",
                                  f"{rel!r}: {part!r} is a symlink leaving the attempt directory")
        if must_exist and not cur.exists():
            raise Problem("PCK-FILE-MISSING", f"file {rel!r} does not exist in {self.vdir}")
        return cur

    def stat_size(self, rel: str) -> int:
        """Size of an existing regular file (after :meth:`resolve`; opened, never waited on)."""
        fd = open_regular(self.resolve(rel), repr(rel))
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def _pread(self, rel: str, start: int, length: int) -> bytes:
        """``length`` bytes at ``start`` of a regular file (R-SEC-16: checked on every open)."""
        fd = open_regular(self.resolve(rel), repr(rel))
        try:
            out = bytearray()
            while len(out) < length:
                piece = os.pread(fd, min(length - len(out), 1 << 24), start + len(out))
                if not piece:
                    break
                out += piece
            return bytes(out)
        finally:
            os.close(fd)

    def read(self, rel: str, start: int = 0, length: int | None = None) -> bytes:
        """Read bytes of a recorded file, verifying every block the read touches.

        Raises:
            Problem: PCK-FILE-MISSING / PCK-FILE-SIZE / PCK-CHECKSUM / PCK-PATH-UNSAFE.

        """
        rec = self.records.get(rel)
        if rec is None:
            raise Problem("PCK-FILE-MISSING", f"{rel!r} is not listed in the manifest's files")
        if length is None:
            length = rec.size - start
        if start < 0 or length < 0 or start + length > rec.size:
            raise Problem("PCK-SHARD-HEADER", f"read of bytes [{start}, {start + length}) beyond "
                          f"the recorded size {rec.size} of {rel!r}")
        if length == 0:
            return b""
        bs = rec.block_size
        b0, b1 = start // bs, (start + length - 1) // bs
        if all(b in rec.verified for b in range(b0, b1 + 1)):
            # every block already verified (a frame header in a block read before): read just
            # the bytes asked for, not whole blocks of up to 2^30 bytes again
            raw = self._pread(rel, start, length)
            if len(raw) != length:
                raise Problem("PCK-FILE-SIZE", f"{rel!r} is shorter than its recorded size "
                              f"{rec.size}")
            return raw
        expected_len = min(rec.size, (b1 + 1) * bs) - b0 * bs
        raw = self._pread(rel, b0 * bs, expected_len)
        if len(raw) != expected_len:
            raise Problem("PCK-FILE-SIZE", f"{rel!r} is shorter than its recorded size {rec.size}")
        for b in range(b0, b1 + 1):
            if b in rec.verified:
                continue
            chunk = raw[(b - b0) * bs:(b - b0 + 1) * bs]
            got = crc32c(chunk)
            if got != rec.blocks[b]:
                raise Problem("PCK-CHECKSUM", f"{rel!r} block {b} (bytes {b * bs}..{b * bs + len(chunk)}):"
                              f" crc32c {got:08x} != recorded {rec.blocks[b]:08x}")
            rec.verified.add(b)
        off = start - b0 * bs
        return raw[off:off + length]

    def verify_all(self, rel: str) -> None:
        """Verify every block of a recorded file (``--deep``)."""
        rec = self.records[rel]
        step = max(rec.block_size, 1 << 24)
        pos = 0
        while pos < rec.size:
            n = min(step, rec.size - pos)
            self.read(rel, pos, n)
            pos += n


@dataclass
class StTensor:
    """One tensor of a safetensors header."""

    dtype: str
    shape: list[int]
    begin: int  # absolute file offset
    end: int


@dataclass
class StHeader:
    """A parsed, validated safetensors header."""

    tensors: dict[str, StTensor]
    metadata: dict[str, str] | None


def parse_safetensors_header(vf: VersionFiles, rel: str) -> StHeader:
    """Parse and validate the header of a safetensors file (bounded; standard layout).

    Raises:
        Problem: PCK-SHARD-HEADER on any header defect (or a checksum/size problem).

    """
    size = vf.records[rel].size
    if size < 8:
        raise Problem("PCK-SHARD-HEADER", f"{rel!r}: {size} bytes, too small for a safetensors file")
    n = int.from_bytes(vf.read(rel, 0, 8), "little")
    if n > MAX_HEADER_BYTES or n > size - 8:
        raise Problem("PCK-SHARD-HEADER", f"{rel!r}: header length {n} is absurd (file size {size}, "
                      f"limit {MAX_HEADER_BYTES})")
    raw = vf.read(rel, 8, n)
    header = _validate_header(raw, n, size, rel)
    _check_padding(raw, rel)
    return header


def _check_padding(raw: bytes, rel: str) -> None:
    """R-SHARD-2 (a writer rule, reported by checkers, R-SHARD-10): ``{…}`` then spaces, N % 8 = 0."""
    text = raw.rstrip(b" ")
    if len(raw) % 8 or not raw.startswith(b"{") or not text.endswith(b"}"):
        raise Problem("PCK-SHARD-HEADER", f"{rel!r}: the header ({len(raw)} bytes) must be the "
                      "JSON object, from its '{', padded with spaces (0x20) to a multiple of 8 "
                      "bytes (R-SHARD-2; readers accept such a file, R-SHARD-10)")


def parse_safetensors_bytes(data: bytes, what: str) -> StHeader:
    """Parse and validate a whole safetensors file held in memory (e.g. a decoded tensor table).

    The same rules as :func:`parse_safetensors_header` (spec §11.2); the returned offsets are
    positions in ``data``.

    Raises:
        Problem: PCK-SHARD-HEADER on any defect.

    """
    size = len(data)
    if size < 8:
        raise Problem("PCK-SHARD-HEADER", f"{what}: {size} bytes, too small for a safetensors file")
    n = int.from_bytes(data[:8], "little")
    if n > MAX_HEADER_BYTES or n > size - 8:
        raise Problem("PCK-SHARD-HEADER", f"{what}: header length {n} is absurd (size {size}, "
                      f"limit {MAX_HEADER_BYTES})")
    return _validate_header(data[8:8 + n], n, size, what)


def _validate_header(raw: bytes, n: int, size: int, rel: str) -> StHeader:
    try:
        hdr = loads_strict(raw)
    except StrictJsonError as exc:
        tail = raw[raw.rfind(b"}") + 1:]
        if tail and not tail.strip(b" \x00") and b"\x00" in tail:  # C-style padding
            raise Problem("PCK-SHARD-HEADER", f"{rel!r}: the header is padded with NUL bytes "
                          "(0x00); safetensors headers are padded with spaces (0x20), which "
                          "JSON allows after the object (§11.1, R-SHARD-2)") from None
        raise Problem("PCK-SHARD-HEADER", f"{rel!r}: header is not valid JSON: {exc}") from None
    if not isinstance(hdr, dict):
        raise Problem("PCK-SHARD-HEADER", f"{rel!r}: header is not a JSON object")
    data_start = 8 + n
    data_len = size - data_start
    meta = hdr.get("__metadata__")
    if meta is not None and (not isinstance(meta, dict)
                             or not all(isinstance(v, str) for v in meta.values())):
        raise Problem("PCK-SHARD-HEADER", f"{rel!r}: __metadata__ must map strings to strings")
    tensors: dict[str, StTensor] = {}
    spans: list[tuple[int, int, str]] = []
    for name, t in hdr.items():
        if name == "__metadata__":
            continue
        if not isinstance(t, dict):
            raise Problem("PCK-SHARD-HEADER", f"{rel!r}: entry {name!r} is not an object")
        dt, shape, offs = t.get("dtype"), t.get("shape"), t.get("data_offsets")
        if dt not in ST_ITEMSIZE:
            raise Problem("PCK-SHARD-HEADER", f"{rel!r}: tensor {name!r} has unknown dtype {dt!r}")
        if (not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                   and 0 <= d <= MAX_SIZE for d in shape)):
            # §11.1 rule 3: 0 <= d <= MAXINT, zero-size tensors included (their span is 0
            # bytes whatever the other dimensions are, so the span check cannot see it).
            raise Problem("PCK-SHARD-HEADER", f"{rel!r}: tensor {name!r} has a bad shape "
                          f"{str(shape)[:200]} (each dimension an integer 0 … MAXINT = "
                          f"{MAX_SIZE}, R-SHARD-1)")
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)):
            raise Problem("PCK-SHARD-HEADER", f"{rel!r}: tensor {name!r} has bad data_offsets")
        b, e = offs
        if not 0 <= b <= e <= data_len:
            raise Problem("PCK-SHARD-HEADER", f"{rel!r}: tensor {name!r} data_offsets [{b}, {e}] "
                          f"outside the data section of {data_len} bytes")
        need = math.prod(shape) * ST_ITEMSIZE[dt]
        if e - b != need:
            raise Problem("PCK-SHARD-HEADER", f"{rel!r}: tensor {name!r} spans {e - b} bytes but "
                          f"{dt}{shape} needs {need}")
        tensors[name] = StTensor(dt, list(shape), data_start + b, data_start + e)
        spans.append((b, e, name))
    spans.sort()
    pos = 0
    for b, e, name in spans:
        if b != pos:
            raise Problem("PCK-SHARD-HEADER", f"{rel!r}: data of {name!r} starts at {b}, expected "
                          f"{pos} (hole or overlap in the data section)")
        pos = e
    if pos != data_len:
        raise Problem("PCK-SHARD-HEADER", f"{rel!r}: data section has {data_len} bytes, tensors "
                      f"index {pos}")
    return StHeader(tensors, meta)


#: The zstd frame magic (RFC 8878 §3.1.1), little-endian 0xFD2FB528.
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: The longest frame header: magic, descriptor, window descriptor, 4-byte dictionary id and
#: 8-byte content size (RFC 8878 §3.1.1.1). R-TENSOR-10 is decided from these bytes.
ZSTD_HEADER_MAX = 18
#: The largest window a stored frame may need (spec §8.3, R-TENSOR-10: 2^27 bytes, libzstd's
#: ``ZSTD_WINDOWLOG_LIMIT_DEFAULT``).
ZSTD_MAX_WINDOW = 1 << 27


def zstd_bound(n: int) -> int:
    """``ZSTD_COMPRESSBOUND(n)`` as spec §8.3 states it (the bound of ``zstd.h``).

    ``n + floor(n / 256) + (n < 131072 ? floor((131072 - n) / 2048) : 0)``: no frame that
    libzstd's one-shot or streaming compressor writes for ``n`` bytes (without flushing
    mid-frame) is longer (R-TENSOR-10).
    """
    small = ((128 << 10) - n) >> 11 if n < (128 << 10) else 0
    return n + (n >> 8) + small


@dataclass(frozen=True)
class ZstdFrameHeader:
    """The fields of a zstd frame header that the spec's rules need (RFC 8878 §3.1.1.1)."""

    content_size: int | None  # Frame_Content_Size, None when the header has none
    window_size: int  # Window_Size: from the Window_Descriptor, or the content size
    single_segment: bool
    header_size: int  # bytes of magic and frame header


def zstd_frame_header(head: bytes) -> ZstdFrameHeader:
    """Parse the header at the start of a stored zstd frame, from its first ≤ 18 bytes.

    ``Window_Size`` follows RFC 8878 §3.1.1.1.2: with a ``Window_Descriptor`` (frames that are
    not single-segment) it is ``2^(10 + Exponent) + 2^(10 + Exponent) / 8 × Mantissa``; a
    single-segment frame has no descriptor and its window is its content size.

    Raises:
        Problem: PCK-CODEC when the bytes do not start with a zstd frame (a skippable frame
            first included), the reserved bit is set, the frame refers to a dictionary, or
            the header is cut short.

    """
    if len(head) >= 4 and head[1:4] == b"\x2a\x4d\x18" and head[0] & 0xF0 == 0x50:
        raise Problem("PCK-CODEC", "data starts with a skippable frame (magic "
                      f"{head[:4].hex(' ')}), not a zstd frame; a range is exactly one zstd "
                      "frame (R-TENSOR-6)")
    if len(head) < 5 or head[:4] != ZSTD_MAGIC:
        raise Problem("PCK-CODEC", "data does not start with a zstd frame (magic 28 B5 2F FD)")
    fhd = head[4]
    fcs_flag, single, did_flag = fhd >> 6, bool(fhd & 0x20), fhd & 3
    if fhd & 0x08:
        raise Problem("PCK-CODEC", "zstd frame header has the reserved bit set")
    pos = 5
    window = 0
    if not single:
        if len(head) < 6:
            raise Problem("PCK-CODEC", "truncated zstd frame header")
        exponent, mantissa = head[5] >> 3, head[5] & 7
        base = 1 << (10 + exponent)
        window = base + (base >> 3) * mantissa
        pos = 6
    did_len = (0, 1, 2, 4)[did_flag]
    if len(head) < pos + did_len:
        raise Problem("PCK-CODEC", "truncated zstd frame header")
    # A Dictionary_ID field holding 0 names no dictionary (RFC 8878 §3.1.1.1.3): libzstd and
    # the reference reader accept it.
    if did_len and int.from_bytes(head[pos:pos + did_len], "little"):
        raise Problem("PCK-CODEC", "zstd frame references a dictionary (not allowed)")
    pos += did_len
    fcs_len = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if len(head) < pos + fcs_len:
        raise Problem("PCK-CODEC", "truncated zstd frame header")
    fcs: int | None = None
    if fcs_len:
        fcs = int.from_bytes(head[pos:pos + fcs_len], "little") + (256 if fcs_len == 2 else 0)
    if single:
        assert fcs is not None
        window = fcs
    return ZstdFrameHeader(fcs, window, single, pos + fcs_len)


def zstd_frame_content_size(frame: bytes) -> int | None:
    """Return the Frame_Content_Size of a zstd frame header, or None when absent.

    Raises:
        Problem: PCK-CODEC when the bytes do not start with a zstd frame header.

    """
    return zstd_frame_header(frame[:ZSTD_HEADER_MAX]).content_size


def zstd_check_header(head: bytes, *, stored: int, where: str, limit: int,
                      exact: int | None = None, need_content_size: bool = False,
                      limit_code: str = "PCK-CODEC") -> int | None:
    """Apply every rule that a zstd frame's first bytes decide; return its declared size.

    These are the checks a reader makes before it reads or allocates anything for the rest of
    the frame (R-TENSOR-7, R-TENSOR-10), so a metadata-level check makes them too (R-VERIFY-2):
    the magic (no skippable frame first), the reserved bit, no dictionary, a declared content
    size (when ``need_content_size``) not above ``limit`` and equal to ``exact``, a window of at
    most 2^27 bytes, and a stored length ``stored`` of at most ``ZSTD_COMPRESSBOUND(m)``, ``m``
    the declared size (or ``exact``, or ``limit``, when the header declares none).

    Args:
        head: The frame's first ``min(18, stored)`` bytes (more are ignored).
        stored: The stored frame's length.
        where: Names the frame in messages.
        limit: Upper bound of the decoded size.
        exact: The decoded size required, when one is.
        need_content_size: The header must declare its content size (tensor tables).
        limit_code: The code of a declared size above ``limit``.

    Raises:
        Problem: ``PCK-CODEC`` for every frame defect, ``limit_code`` for a declared size above
            ``limit``.

    """
    try:
        fh = zstd_frame_header(head[:ZSTD_HEADER_MAX])
    except Problem as exc:
        raise Problem(exc.code, f"{where}: {exc.message}") from None
    fcs = fh.content_size
    if fcs is None and need_content_size:
        raise Problem("PCK-CODEC", f"{where}: zstd frame header declares no content size")
    if fcs is not None and fcs > limit:
        raise Problem(limit_code, f"{where}: zstd frame declares {fcs} decoded bytes, above the "
                      f"limit of {limit}")
    if fcs is not None and exact is not None and fcs != exact:
        raise Problem("PCK-CODEC", f"{where}: zstd frame declares {fcs} bytes, {exact} expected "
                      "(R-TENSOR-7)")
    if fh.window_size > ZSTD_MAX_WINDOW:
        raise Problem("PCK-CODEC", f"{where}: zstd frame needs a {fh.window_size}-byte window, "
                      f"above the {ZSTD_MAX_WINDOW}-byte limit (R-TENSOR-10)")
    m = fcs if fcs is not None else exact if exact is not None else limit
    most = zstd_bound(m)
    if stored > most:
        raise Problem("PCK-CODEC", f"{where}: the stored zstd frame is {stored} bytes, more than "
                      f"ZSTD_COMPRESSBOUND({m}) = {most} (R-TENSOR-10)")
    return fcs


def zstd_decode(frame: bytes, *, where: str, limit: int, exact: int | None = None,
                need_content_size: bool = False, limit_code: str = "PCK-CODEC") -> bytes:
    """Decode exactly one Zstandard frame with the spec's rules (§8.3, R-SEC-5, R-TABLE-3).

    The frame must pass :func:`zstd_check_header` (the zstd magic, no skippable frame, no
    dictionary, a window of at most 2^27, no longer than ``ZSTD_COMPRESSBOUND``, R-TENSOR-10)
    and be followed by no other bytes. A declared content size above ``limit`` is rejected with
    ``limit_code`` before anything is decoded; the output is produced in small steps and decoding
    stops as soon as it would exceed the declared size (or ``limit`` when none is declared), so
    no allocation is sized by the frame's own header. ``exact`` is the size the output must have.

    Raises:
        Problem: ``PCK-CODEC`` for every frame defect, ``limit_code`` for a declared size above
            ``limit``.

    """
    import zstandard

    fcs = zstd_check_header(frame[:ZSTD_HEADER_MAX], stored=len(frame), where=where,
                            limit=limit, exact=exact, need_content_size=need_content_size,
                            limit_code=limit_code)
    cap = fcs if fcs is not None else (exact if exact is not None else limit)
    dobj = zstandard.ZstdDecompressor().decompressobj()
    out: list[bytes] = []
    total = 0
    step = 1 << 12  # a few KiB of input can only expand to a bounded amount of output
    pos = 0
    trailing = 0
    try:
        while pos < len(frame):
            piece = dobj.decompress(frame[pos:pos + step])
            pos += step
            total += len(piece)
            if total > cap:
                raise Problem("PCK-CODEC", f"{where}: zstd frame decodes to more than {cap} bytes")
            out.append(piece)
            if dobj.eof:
                trailing = len(dobj.unused_data) + max(0, len(frame) - pos)
                break
    except zstandard.ZstdError as exc:
        raise Problem("PCK-CODEC", f"{where}: corrupt zstd frame: {exc}") from None
    if not dobj.eof:
        raise Problem("PCK-CODEC", f"{where}: zstd frame is truncated")
    if trailing:
        raise Problem("PCK-CODEC", f"{where}: {trailing} bytes after the zstd frame")
    if total != cap and (fcs is not None or exact is not None):
        raise Problem("PCK-CODEC", f"{where}: zstd frame decodes to {total} bytes, {cap} "
                      "expected")
    if fcs is None and len(frame) > zstd_bound(total):
        # No declared size: m is the decoded size (R-TENSOR-10 through R-ENTRY-6, errata 3).
        raise Problem("PCK-CODEC", f"{where}: {len(frame)}-byte zstd frame for {total} decoded "
                      f"bytes, more than ZSTD_COMPRESSBOUND({total}) = {zstd_bound(total)}")
    return b"".join(out)
