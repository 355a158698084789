"""safetensors shard headers: building them for writers, parsing them (bounded) for readers."""

from __future__ import annotations

import bisect
import math
import re
import struct
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from portable_ckpt.errors import CheckpointError, ShardHeaderError, ShardMismatchError
from portable_ckpt.format import jsonio
from portable_ckpt.format.dtypes import DTYPES
from portable_ckpt.format.jsonio import unescaped_quotes

__all__ = [
    "BATCH_BYTES",
    "WHOLE_BYTES",
    "MAX_HEADER_BYTES",
    "ShardHeader",
    "ShardTensor",
    "ShardTensors",
    "build_header",
    "check_range",
    "load_header",
    "parse_header",
]

_ST_ITEMSIZE = {row.safetensors: row.itemsize for row in DTYPES.values()}
_ST_NAMES = sorted(_ST_ITEMSIZE)
_ST_CODES = {name: i for i, name in enumerate(_ST_NAMES)}

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


class ShardTensors(Mapping[str, ShardTensor]):
    """The tensors of a parsed header, held as arrays: about 50 bytes plus the name per tensor.

    A dict of :class:`ShardTensor` cost about 2.6 KB of objects per tensor (resource review R8:
    a file of 1,000,000 tiles took 2.6 GB to read 16 MB of it); here each tensor is a row of
    :mod:`array` columns, its name bytes in one blob, found by its ``hash()`` (sorted) and then
    compared exactly. A :class:`ShardTensor` is built only for the tensor asked for.
    """

    __slots__ = ("_dims", "_dtype", "_end", "_hash", "_names", "_nhi", "_nlo", "_shape", "_start")

    def __init__(self, cols: dict[str, array[int]], names: bytes) -> None:
        self._hash, self._nlo, self._nhi = cols["hash"], cols["name_lo"], cols["name_hi"]
        self._dtype, self._start, self._end = cols["dtype"], cols["start"], cols["end"]
        self._shape, self._dims = cols["shape"], cols["dims"]
        self._names = names

    def _name(self, i: int) -> str:
        return self._names[self._nlo[i] : self._nhi[i]].decode("utf-8", "surrogatepass")

    def _row(self, i: int) -> ShardTensor:
        lo = self._shape[i]  # _dims[lo] is the row's ndim, its dims follow
        shape = tuple(self._dims[lo + 1 : lo + 1 + self._dims[lo]])
        return ShardTensor(
            self._name(i), _ST_NAMES[self._dtype[i]], shape, self._start[i], self._end[i]
        )

    def _find(self, name: str) -> int:
        if not isinstance(name, str):
            return -1
        h = hash(name)
        i = bisect.bisect_left(self._hash, h)
        raw = name.encode("utf-8", "surrogatepass")
        while i < len(self._hash) and self._hash[i] == h:
            if self._names[self._nlo[i] : self._nhi[i]] == raw:
                return i
            i += 1
        return -1

    def __getitem__(self, name: str) -> ShardTensor:
        i = self._find(name)
        if i < 0:
            raise KeyError(name)
        return self._row(i)

    def start_of(self, name: str) -> int:
        """The first byte of tensor ``name`` in the file (no :class:`ShardTensor` is made)."""
        i = self._find(name)
        if i < 0:
            raise KeyError(name)
        return int(self._start[i])

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._find(name) >= 0

    def __len__(self) -> int:
        return len(self._hash)

    def __iter__(self) -> Iterator[str]:
        for i in sorted(range(len(self._start)), key=self._start.__getitem__):  # in file order
            yield self._name(i)

    def check_unique(self, path: str) -> None:
        """Refuse two members of one name (those of one batch were refused by its parse)."""
        h = np.frombuffer(self._hash, dtype=np.int64)
        same = np.flatnonzero(h[1:] == h[:-1])
        for i in same.tolist():
            # Rows of equal hashes are adjacent: compare each with the ones before it.
            j = i
            while j >= 0 and self._hash[j] == self._hash[i + 1]:
                if self._name(j) == self._name(i + 1):
                    raise ShardHeaderError(
                        f"{path} (safetensors header): invalid JSON: duplicate key "
                        f"{self._name(j)!r}",
                        path=path,
                    )
                j -= 1

    def check_packed(self, data_start: int, data_len: int, path: str) -> None:
        """R-SHARD-9 (:func:`_check_packed`) on the columns."""
        start = np.frombuffer(self._start, dtype=np.int64)
        end = np.frombuffer(self._end, dtype=np.int64)
        _check_packed(start, end, self._name, data_start, data_len, path)


@dataclass(frozen=True)
class ShardHeader:
    """A parsed header: the data section begins at ``data_start``."""

    data_start: int
    tensors: Mapping[str, ShardTensor]
    metadata: dict[str, str]

    def start_of(self, name: str) -> int:
        """The first byte of tensor ``name`` in the file (``KeyError`` if there is none)."""
        t = self.tensors
        return t.start_of(name) if isinstance(t, ShardTensors) else t[name].start


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


def parse_header(
    prefix: bytes, header: bytes | memoryview, *, path: str, file_size: int
) -> ShardHeader:
    """Parse and bound-check a safetensors header read from ``path``.

    Up to :data:`WHOLE_BYTES` it is parsed whole into a dict. A larger one is parsed a batch at
    a time (:data:`BATCH_BYTES` of whole members, strictly as every format document) into the
    rows of :class:`ShardTensors`, so the objects ``json`` builds never exceed one batch's,
    whatever the number of tensors.

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
    data_len = file_size - data_start
    what = f"{path} (safetensors header)"
    if len(header) > MAX_HEADER_BYTES:
        raise ShardHeaderError(
            f"{what}: {len(header)} bytes exceeds the limit of {MAX_HEADER_BYTES}", path=path
        )
    if len(header) <= WHOLE_BYTES:
        return _parse_whole(header, what, path, data_start, data_len)
    rows = _Rows(path, data_start, data_len)
    scan = _MemberScan(header)
    meta: Any = None
    members = 0
    # The whole text is scanned first: a header that is no object fails before any batch is
    # parsed (the spans are a few per MiB).
    spans = scan.batches()
    if scan.problem:  # said from the scan's positions: the header is never parsed whole
        raise ShardHeaderError(f"{path}: {scan.problem}", path=path)
    for lo, hi in spans:
        try:
            doc = jsonio.loads(b"{" + header[lo:hi] + b"}", what=what, max_bytes=len(header) + 2)
        except CheckpointError as exc:
            # The parser counts from the batch's "{": positions are given in the header (the
            # characters before are ASCII in any header a writer makes: "near").
            text = _AT.sub(_near(lo), exc.message)
            raise ShardHeaderError(f"{text} (a batch of members, header bytes {lo}-{hi})",
                                   path=path) from None
        members += len(doc)
        if "__metadata__" in doc:
            if meta is not None:
                raise ShardHeaderError(
                    f"{what}: invalid JSON: duplicate key '__metadata__'", path=path
                )
            meta = doc.pop("__metadata__") or {}
        rows.add(doc)
    if members != scan.separators + (members > 0):
        raise ShardHeaderError(
            f"{what}: invalid JSON: a member is empty (a comma with no member before or after "
            "it)",
            path=path,
        )
    meta = _metadata(meta, path)
    return ShardHeader(data_start, rows.finish(), meta)


def _near(lo: int) -> Callable[[re.Match[str]], str]:
    """The header position of a json message's one in a batch starting at byte ``lo``."""
    return lambda m: f" near header byte {lo + int(m.group(1)) - 1}"


def _metadata(meta: Any, path: str) -> dict[str, str]:
    meta = meta or {}
    if not isinstance(meta, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
    ):
        raise ShardHeaderError(f"{path}: __metadata__ must map strings to strings", path=path)
    return dict(meta)


def _parse_whole(
    header: bytes | memoryview, what: str, path: str, data_start: int, data_len: int
) -> ShardHeader:
    """A header of at most :data:`WHOLE_BYTES`, parsed whole into a dict (the fastest lookups)."""
    try:
        doc = jsonio.loads(bytes(header), what=what, max_bytes=MAX_HEADER_BYTES)
    except CheckpointError as exc:
        raise ShardHeaderError(str(exc.message), path=path) from None
    if not isinstance(doc, dict):
        raise ShardHeaderError(f"{path}: safetensors header is not a JSON object", path=path)
    meta = _metadata(doc.pop("__metadata__", None), path)
    tensors = {
        name: ShardTensor(name, dtype, tuple(shape), data_start + b, data_start + e)
        for name, dtype, shape, b, e in _entries(doc, path, data_len)
    }
    rows = list(tensors.values())
    start = np.array([t.start for t in rows], dtype=np.int64)
    end = np.array([t.end for t in rows], dtype=np.int64)
    _check_packed(start, end, lambda i: rows[i].name, data_start, data_len, path)
    return ShardHeader(data_start, tensors, meta)


#: Where json's messages say a problem is: ": line 1 column 57 (char 56)".
_AT = re.compile(r": line \d+ column \d+ \(char (\d+)\)")
#: Headers up to this size are parsed whole into a dict (about 13,000 tensors; 330 bytes each):
#: the fastest lookups, for the files a model's state makes (2,000 tensors read 12-22 % slower
#: through the columns: review D5). Larger ones are parsed in batches into columns.
WHOLE_BYTES = 1 << 20
#: Bytes of whole members parsed at once (the objects of one batch cost about 20 times this).
BATCH_BYTES = 1 << 16
#: Bytes of the header scanned at once for the commas between members.
_SCAN_BYTES = 1 << 16
_WHITESPACE = np.zeros(256, dtype=bool)
_WHITESPACE[[0x09, 0x0A, 0x0D, 0x20]] = True


class _MemberScan:
    """The spans of a header's top-level object that hold whole members, found on the text.

    Strings are delimited by unescaped quotes and brackets counted outside them (as
    :func:`jsonio.count_values` does), in numpy windows: a comma at depth 1 separates two
    members. ``problem`` says (from positions) why the text is not one object between blanks,
    found before any batch when the first or last non-blank byte shows it: such a header is
    never parsed whole (parser review P1: a stray byte after a 94 MB header cost 964 MiB).
    """

    def __init__(self, header: bytes | memoryview) -> None:
        self.header = header
        self.separators = 0
        self.problem = ""

    def batches(self) -> list[tuple[int, int]]:
        """The spans of whole members, about :data:`BATCH_BYTES` each ([] and ``problem``)."""
        data = self.header
        out: list[tuple[int, int]] = []
        first, last = _solid(data, from_end=False), _solid(data, from_end=True)
        if first < 0 or data[first] != 0x7B:
            self.problem = "safetensors header is not a JSON object" + (
                "" if first < 0 else f" (its first byte that is not blank, at {first}, is "
                f"0x{data[first]:02x})")
            return []
        if data[last] != 0x7D:
            self.problem = (f"safetensors header does not end its object: its last byte that "
                            f"is not blank, at {last}, is 0x{data[last]:02x}, not '}}' (a "
                            "truncated header, or text after the object)")
            return []
        depth = inside = run = 0
        opened = closed = -1
        batch_lo = 0
        for lo in range(0, len(data), _SCAN_BYTES):
            a = np.frombuffer(data, dtype=np.uint8, count=min(_SCAN_BYTES, len(data) - lo), offset=lo)
            quotes = unescaped_quotes(a, run)
            pos = np.flatnonzero(((a | 0x20) == 0x7B) | ((a | 0x20) == 0x7D) | (a == 0x2C))
            if len(quotes):
                pos = pos[(np.searchsorted(quotes, pos) + inside) % 2 == 0]
                inside ^= len(quotes) & 1
            elif inside:
                pos = pos[:0]
            back = np.flatnonzero(a != 0x5C)
            run = len(a) - 1 - int(back[-1]) if len(back) else run + len(a)
            if not len(pos):
                continue
            byte = a[pos]
            steps = np.where((byte | 0x20) == 0x7B, 1, np.where(byte == 0x2C, 0, -1))
            level = np.cumsum(steps, dtype=np.int64) + depth
            depth = int(level[-1])
            if closed >= 0 or int(level.min()) < 0:
                at = lo + int(pos[0 if closed >= 0 else int(np.argmax(level < 0))])
                self.problem = (f"invalid JSON: the header's object closes before byte {at} "
                                "(a bracket without its opening one, or text after the object)")
                return []
            if opened < 0:
                opened = lo + int(pos[0])  # the first non-blank byte is '{' (checked above)
                batch_lo = opened + 1
            ends = np.flatnonzero(level == 0)
            if len(ends):
                closed = lo + int(pos[ends[0]])
                if len(ends) > 1 or int(ends[0]) != len(pos) - 1:
                    at = lo + int(pos[int(ends[0]) + 1])
                    self.problem = (f"invalid JSON: text after the header's object, at byte "
                                    f"{at}")
                    return []
            seps = lo + pos[(level == 1) & (byte == 0x2C)]
            self.separators += len(seps)
            while True:
                j = int(np.searchsorted(seps, batch_lo + BATCH_BYTES))
                if j >= len(seps):
                    break
                out.append((batch_lo, int(seps[j])))
                batch_lo = int(seps[j]) + 1
        if closed < 0:
            self.problem = ("invalid JSON: the header's object is not closed (a string or a "
                            "bracket left open)")
            return []
        if closed < last:  # the last byte is a '}' inside a string or after the object
            self.problem = f"invalid JSON: text after the header's object, at byte {closed + 1}"
            return []
        out.append((batch_lo, closed))
        return out


def _solid(data: bytes | memoryview, *, from_end: bool) -> int:
    """The position of the first (last) byte of ``data`` that is not JSON blank, or -1."""
    n = len(data)
    starts = range(((n - 1) // _SCAN_BYTES) * _SCAN_BYTES, -1, -_SCAN_BYTES) if from_end else \
        range(0, n, _SCAN_BYTES)
    for lo in starts:
        a = np.frombuffer(data, dtype=np.uint8, count=min(_SCAN_BYTES, n - lo), offset=lo)
        hits = np.flatnonzero(~_WHITESPACE[a])
        if len(hits):
            return lo + int(hits[-1] if from_end else hits[0])
    return -1


def _entries(
    doc: dict[str, Any], path: str, data_len: int
) -> list[tuple[str, str, list[int], int, int]]:
    """Each member of ``doc`` checked: ``(name, dtype, shape, begin, end)`` (data offsets)."""
    out: list[tuple[str, str, list[int], int, int]] = []
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
        if dtype not in _ST_CODES:
            raise ShardHeaderError(
                f"{path}: header entry {name!r} has dtype {dtype!r}, not a safetensors dtype of "
                "the format's table",
                path=path,
            )
        need = math.prod(shape) * _ST_ITEMSIZE[dtype]
        if e - b != need:
            raise ShardHeaderError(
                f"{path}: header entry {name!r} spans {e - b} bytes, but {dtype}{shape} needs "
                f"{need}",
                path=path,
            )
        if not 0 <= b <= e <= data_len:
            raise ShardHeaderError(
                f"{path}: tensor {name!r} data_offsets [{b}, {e}] lie outside the {data_len}-byte "
                "data section (truncated file?)",
                path=path,
            )
        out.append((name, dtype, shape, b, e))
    return out


def _check_packed(
    start: np.ndarray[Any, Any],
    end: np.ndarray[Any, Any],
    name_of: Callable[[int], str],
    data_start: int,
    data_len: int,
    path: str,
) -> None:
    """R-SHARD-9: the tensors tile the data area from its first byte to its last, in some order.

    ``start`` and ``end`` are the tensors' absolute spans (``name_of(i)`` names tensor ``i``).
    A hole (bytes no tensor owns), an overlap or bytes after the last tensor are
    ``PCK-SHARD-HEADER``, as the safetensors library reports them.
    """
    order = np.lexsort((end, start))
    start, end = start[order], end[order]
    before = np.concatenate((np.array([data_start], dtype=np.int64), end[:-1]))
    bad = np.flatnonzero(start != before)
    if len(bad):
        k = int(bad[0])
        at, pos = int(start[k]), int(before[k])
        kind = "a hole before" if at > pos else "an overlap with"
        raise ShardHeaderError(
            f"{path}: tensor {name_of(int(order[k]))!r} starts at data offset {at - data_start}, "
            f"the previous tensor ends at {pos - data_start} ({kind} it); tensors must be packed "
            "without holes or overlaps",
            path=path,
        )
    pos = int(end[-1]) if len(end) else data_start
    if pos != data_start + data_len:
        raise ShardHeaderError(
            f"{path}: the tensors end at data offset {pos - data_start}, the data area has "
            f"{data_len} bytes ({data_start + data_len - pos} bytes no tensor owns)",
            path=path,
        )


class _Rows:
    """Checked rows of a header's tensors, stored as numpy columns batch by batch."""

    def __init__(self, path: str, data_start: int, data_len: int) -> None:
        self.path, self.data_start, self.data_len = path, data_start, data_len
        self.names = bytearray()
        self.cols: dict[str, list[np.ndarray[Any, Any]]] = {name: [] for name in _COLUMNS}
        self.ndims = 0

    def add(self, doc: dict[str, Any]) -> None:
        """Check a batch's members and store them as one numpy part per column."""
        got: dict[str, list[int]] = {name: [] for name in _COLUMNS}
        for name, dtype, shape, b, e in _entries(doc, self.path, self.data_len):
            got["hash"].append(hash(name))
            got["name_lo"].append(len(self.names))
            self.names += name.encode("utf-8", "surrogatepass")
            got["name_hi"].append(len(self.names))
            got["dtype"].append(_ST_CODES[dtype])
            got["start"].append(self.data_start + b)
            got["end"].append(self.data_start + e)
            got["shape"].append(self.ndims)  # dims[shape]: the ndim, the dims follow
            got["dims"] += (len(shape), *shape)
            self.ndims += 1 + len(shape)
        for name, values in got.items():
            if values:
                self.cols[name].append(np.array(values, dtype=_NP[_COLUMNS[name]]))

    def finish(self) -> ShardTensors:
        """The rows sorted by name hash, as :mod:`array` columns, checked (R-SHARD-9).

        Each column is concatenated, permuted and converted alone, so the rows' transient cost
        is about one column besides the kept ones (a row keeps about 60 bytes and its name).
        """
        hashes = self._column("hash")
        order = np.argsort(hashes, kind="stable")
        cols: dict[str, array[int]] = {"hash": _frozen(hashes[order], "q")}
        del hashes
        for name, code in _COLUMNS.items():
            if name != "hash":
                col = self._column(name)
                cols[name] = _frozen(col if name == "dims" else col[order], code)
                del col
        tensors = ShardTensors(cols, bytes(self.names))
        self.names = bytearray()
        tensors.check_unique(self.path)
        tensors.check_packed(self.data_start, self.data_len, self.path)
        return tensors

    def _column(self, name: str) -> np.ndarray[Any, Any]:
        parts = self.cols[name]
        self.cols[name] = []
        return np.concatenate(parts) if parts else np.zeros(0, dtype=_NP[_COLUMNS[name]])


#: The columns of :class:`ShardTensors` and their :mod:`array` type codes.
_COLUMNS = {
    "hash": "q",
    "name_lo": "q",
    "name_hi": "q",
    "dtype": "B",
    "start": "q",
    "end": "q",
    "shape": "q",
    "dims": "q",
}
_NP = {"q": np.int64, "B": np.uint8}


def _frozen(col: np.ndarray[Any, Any], code: str) -> array[int]:
    out = array(code)
    out.frombytes(np.ascontiguousarray(col).data.cast("B"))
    return out


def load_header(
    read: Callable[[int, int], bytes | memoryview], *, file_size: int, what: str, probe: int = 8
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
    # A longer header is the probe's part and the rest joined (each block verified once): held
    # twice until the rest's buffer is dropped, when the join returns.
    header = first[8 : 8 + n] if len(first) >= 8 + n else b"".join((first[8:], read(len(first), 8 + n)))
    return parse_header(bytes(first[:8]), header, path=what, file_size=file_size)


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
