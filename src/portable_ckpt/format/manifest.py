"""The format model: typed records for manifest.json and writer index documents.

``parse_*`` functions turn untrusted JSON into records, checking every rule of the spec that a
single document can violate and raising the rule's error (``SchemaError`` for structure,
``PathUnsafeError``, ``RangeBoundsError``, ``LimitError``...). They are an implementation of the
JSON Schemas in ``spec/schemas`` plus the cross-field rules a schema cannot express; the test
suite checks that both accept and reject the same documents.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from portable_ckpt.errors import (
    AttemptIdError,
    CheckpointError,
    CodecError,
    CoverageGapError,
    CoverageOverlapError,
    DtypeUnsupportedError,
    EntryMissingError,
    EntrySchemaError,
    FeatureUnsupportedError,
    LimitError,
    RangeBoundsError,
    SchemaError,
    UsageError,
    VersionUnsupportedError,
)
from portable_ckpt.format.dtypes import DTYPES, DType
from portable_ckpt.format.naming import check_attempt_id
from portable_ckpt.format.paths import check_relative_path
from portable_ckpt.format.vocab import (
    CODECS,
    CONTRACTS,
    ENCODINGS,
    POLICIES,
    SCOPES,
    TABLE_EXTENSION,
    is_entry_name,
)
from portable_ckpt.ranges.box import Box

__all__ = [
    "BUILTIN_SCHEMA_IDS",
    "CODECS",
    "DIM_NAME_RE",
    "FORMAT_MAJOR",
    "FORMAT_MINOR",
    "FORMAT_VERSION",
    "FORMAT_VERSIONS",
    "FORMAT_VERSION_RE",
    "is_newer_major",
    "minor_at_least",
    "version_parts",
    "KNOWN_EXTENSIONS",
    "MAX_NDIM",
    "MAX_SIZE",
    "TABLE_FORMAT_VERSION",
    "CLEARS_FORMAT_VERSION",
    "DTYPES_FORMAT_VERSION",
    "CLEARS_MAX",
    "TableRef",
    "Checksum",
    "Continuation",
    "Entry",
    "EntryValue",
    "FileRecord",
    "Manifest",
    "Mesh",
    "RangeRecord",
    "TensorEntry",
    "WriterIndex",
    "check_continuation",
    "check_format_version",
    "dtype_not_defined",
    "dtypes_announced",
    "entry_values_problem",
    "files_bytes",
    "parse_manifest",
    "parse_writer_index",
    "has_control_chars",
]

FORMAT_MAJOR = 1
FORMAT_MINOR = 0
#: The format version of documents that use no 1.1 feature (R-VERSION-2: readers of 1.0 read them).
FORMAT_VERSION = f"{FORMAT_MAJOR}.{FORMAT_MINOR}"
#: The format version of documents that reference a tensor table (spec §8.5).
TABLE_FORMAT_VERSION = "1.1"
#: The format version of a verification record that clears failed ones (spec §14.5); 1.2
#: changes no other document.
CLEARS_FORMAT_VERSION = "1.2"
#: Failed records one clearing record names at most (``clears``'s maxItems, spec §14.5).
CLEARS_MAX = 1024
#: The format version that added the dtypes ``float8_e8m0fnu``, ``float8_e4m3fnuz``,
#: ``float8_e5m2fnuz`` and ``complex64`` (spec §7): a document with a tensor of one carries it.
DTYPES_FORMAT_VERSION = "1.3"
#: Every format version this implementation reads and writes (oldest first; the CLI names them).
FORMAT_VERSIONS = (
    FORMAT_VERSION, TABLE_FORMAT_VERSION, CLEARS_FORMAT_VERSION, DTYPES_FORMAT_VERSION
)
#: Largest size or byte count the format allows (2^53 - 1: exact in every JSON implementation).
MAX_SIZE = (1 << 53) - 1
#: Largest tensor rank.
MAX_NDIM = 64
BUILTIN_SCHEMA_IDS = (
    "pck:step/1",
    "pck:lr-scheduler/1",
    "pck:grad-scaler/1",
    "pck:rng/1",
    "pck:data-position/1",
    "pck:json/1",
)
#: Extensions this implementation understands (for ``must_understand``).
KNOWN_EXTENSIONS: frozenset[str] = frozenset(
    {TABLE_EXTENSION, *(r.extension for r in DTYPES.values() if r.extension is not None)}
)

_HEX_DIGITS = b"0123456789abcdef"
_CTRL = re.compile(r"[\x00-\x1f\x7f]")


def has_control_chars(text: str) -> bool:
    """Whether ``text`` holds a control character (U+0000–U+001F, U+007F; §8.1 keys)."""
    return _CTRL.search(text) is not None
#: A well-formed ``format_version``: ``MAJOR.MINOR``, decimal, no leading zeros, any number of
#: digits (spec §16.1; R-VERSION-10 decides with it whether a record is foreign, errata 6).
FORMAT_VERSION_RE = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\Z")
#: The most digits of a MINOR that the 1.x schemas accept (``formatVersion``).
_MINOR_DIGITS = 9
#: Member names of ``extensions`` and items of ``must_understand`` (manifest.schema.json).
_EXTENSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}\Z")
#: A mesh's dimensions and their sizes (common.schema.json ``mesh``).
_MESH_MAX = 1 << 24
_TS = re.compile(
    r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)"
    r"(\.[0-9]{1,9})?Z\Z"
)  # the schema's timestamp pattern (common.schema.json), anchored at the very end


# ---------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checksum:
    """Per-block CRC32C of a file: one 8-hex-digit value per ``block_size`` bytes."""

    algorithm: str
    block_size: int
    blocks: str

    def block_count(self) -> int:
        """Number of blocks."""
        return len(self.blocks) // 8

    def block(self, i: int) -> int:
        """CRC of block ``i``."""
        return int(self.blocks[8 * i : 8 * i + 8], 16)

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {"algorithm": self.algorithm, "block_size": self.block_size, "blocks": self.blocks}


@dataclass(frozen=True)
class FileRecord:
    """A file of the version: relative path, size and checksum."""

    path: str
    size: int
    checksum: Checksum

    def to_json(self) -> dict[str, Any]:
        """JSON form (the path is the key in ``files``)."""
        return {"size": self.size, "checksum": self.checksum.to_json()}


@dataclass(frozen=True)
class RangeRecord:
    """A stored box of a tensor: where its bytes are and how they are encoded."""

    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    file: str
    name: str
    codec: str = "none"

    @property
    def box(self) -> Box:
        """The global box this record stores."""
        return Box(self.offsets, self.lengths)

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "offsets": list(self.offsets),
            "lengths": list(self.lengths),
            "file": self.file,
            "name": self.name,
            "codec": self.codec,
        }


@dataclass
class TensorEntry:
    """A logical tensor: dtype, global shape and its range records."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    ranges: list[RangeRecord] = field(default_factory=list)

    @property
    def range_count(self) -> int:
        """Number of range records (cheap for table-backed entries, which override it)."""
        return len(self.ranges)

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Logical size in bytes."""
        return self.numel * DTYPES[self.dtype].itemsize

    @property
    def itemsize(self) -> int:
        """Element size in bytes."""
        return DTYPES[self.dtype].itemsize

    @property
    def numpy_dtype(self) -> Any:
        """The numpy dtype (ml_dtypes for bfloat16 and float8)."""
        return DTYPES[self.dtype].numpy

    def to_json(self) -> dict[str, Any]:
        """JSON form (the key is the key in ``tensors``)."""
        return {
            "dtype": self.dtype,
            "shape": list(self.shape),
            "ranges": [r.to_json() for r in self.ranges],
        }


@dataclass(frozen=True)
class EntryValue:
    """One stored value of a non-tensor entry (``rank`` is ``None`` for global scope)."""

    file: str
    rank: int | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {"file": self.file} if self.rank is None else {"rank": self.rank, "file": self.file}


@dataclass
class Entry:
    """A non-tensor entry: declared schema, scope, policy, encoding and stored values."""

    name: str
    schema: dict[str, Any]
    scope: str
    encoding: str
    values: list[EntryValue]
    world_size_policy: str | None = None

    @property
    def schema_id(self) -> str | None:
        """The built-in schema id, or ``None`` for an embedded JSON Schema."""
        sid = self.schema.get("id")
        return sid if isinstance(sid, str) else None

    def declaration(self) -> tuple[Any, ...]:
        """What every writer of this entry must agree on."""
        import json

        return (
            json.dumps(self.schema, sort_keys=True),
            self.scope,
            self.encoding,
            self.world_size_policy,
        )

    def to_json(self) -> dict[str, Any]:
        """JSON form (the name is the key in ``entries``)."""
        doc: dict[str, Any] = {"schema": self.schema, "scope": self.scope}
        if self.world_size_policy is not None:
            doc["world_size_policy"] = self.world_size_policy
        doc["encoding"] = self.encoding
        doc["values"] = [v.to_json() for v in self.values]
        return doc


@dataclass(frozen=True)
class Mesh:
    """The device mesh at save time: its shape and dimension names."""

    shape: tuple[int, ...]
    dim_names: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {"shape": list(self.shape), "dim_names": list(self.dim_names)}


@dataclass(frozen=True)
class Continuation:
    """The continuation contract declared at save time (spec §Continuation)."""

    contract: str = "exact"
    world_size: int = 1
    mesh: Mesh | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "contract": self.contract,
            "world_size": self.world_size,
            "mesh": self.mesh.to_json() if self.mesh is not None else None,
        }

    @staticmethod
    def from_json(doc: Any, *, what: str = "continuation") -> Continuation:
        """Inverse of :meth:`to_json` (validated as in a commit record)."""
        return _continuation(_Ctx(what), doc)


def files_bytes(files: Mapping[str, FileRecord]) -> int:
    """The bytes of a version: the sizes of the files its commit record lists."""
    return sum(f.size for f in files.values())


@dataclass(frozen=True)
class TableRef:
    """The ``tensor_table`` member of a 1.1 document: where its tensor table is (spec §8.5)."""

    file: str
    codec: str = "zstd"

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {"file": self.file, "codec": self.codec}


@dataclass
class WriterIndex:
    """What one writer wrote: its files, its range records and its entry values."""

    attempt_id: str
    writer: int
    files: dict[str, FileRecord] = field(default_factory=dict)
    tensors: dict[str, TensorEntry] = field(default_factory=dict)
    entries: dict[str, Entry] = field(default_factory=dict)
    #: The record of ``index/wNNNNN.json`` itself, when the writer stored it (not part of the doc).
    index_file: FileRecord | None = None
    #: Where the writer's tensor table is, when its tensors are in one (spec §8.5).
    tensor_table: TableRef | None = None
    #: The decoded table (an ``io.tensor_table.TensorTable``), once loaded or when built here.
    table: Any = None
    #: The ``format_version`` a parsed document declared (``None`` when built here: ``to_json``
    #: stamps its own); its tensor table's dtype codes are checked against it (R-DTYPE-3).
    format_version: str | None = field(default=None, compare=False)

    def to_transport(self) -> dict[str, Any]:
        """The index plus the record of its own file, for sending to the committer in memory."""
        doc: dict[str, Any] = {"index": self.to_json()}
        if self.index_file is not None:
            doc["index_file"] = {"path": self.index_file.path, **self.index_file.to_json()}
        return doc

    @staticmethod
    def from_transport(doc: Any) -> WriterIndex:
        """Inverse of :meth:`to_transport` (validates everything)."""
        c = _Ctx("writer index (transport)")
        d = c.obj(doc, "top level")
        idx = parse_writer_index(c.req(d, "index", "top level"))
        f = d.get("index_file")
        if f is not None:
            fo = c.obj(f, "index_file")
            path = check_relative_path(fo.get("path"), what="index_file.path")
            size = c.int_(c.req(fo, "size", "index_file"), "index_file.size")
            idx.index_file = FileRecord(
                path,
                size,
                _checksum(c, c.req(fo, "checksum", "index_file"), "index_file.checksum", size),
            )
        return idx

    def to_json(self) -> dict[str, Any]:
        """JSON form (``index/wNNNNN.json``)."""
        doc: dict[str, Any] = {
            "format": "portable-ckpt-writer-index",
            "format_version": dtypes_announced(
                TABLE_FORMAT_VERSION if self.tensor_table else FORMAT_VERSION,
                self._dtypes(),
            )[0],
            "attempt_id": self.attempt_id,
            "writer": self.writer,
            "files": {p: f.to_json() for p, f in self.files.items()},
            "tensors": {}
            if self.tensor_table
            else {k: t.to_json() for k, t in self.tensors.items()},
            "entries": {n: e.to_json() for n, e in self.entries.items()},
        }
        if self.tensor_table:
            doc["tensor_table"] = self.tensor_table.to_json()
        return doc

    def _dtypes(self) -> set[str]:
        """The dtypes of this writer's tensors (JSON entries and a loaded table's codes)."""
        names = {t.dtype for t in self.tensors.values()}
        if self.table is not None:  # an io.tensor_table.TensorTable
            names.update(self.table.used_dtypes())
        return names

    @staticmethod
    def from_json(doc: Any, *, what: str = "writer index") -> WriterIndex:
        """Parse (and validate) a writer index document."""
        return parse_writer_index(doc, what=what)


@dataclass
class Manifest:
    """The commit record of one version."""

    attempt_id: str
    step: int
    created_at: str
    committed_at: str
    producer: dict[str, Any]
    continuation: Continuation
    files: dict[str, FileRecord]
    tensors: dict[str, TensorEntry]
    entries: dict[str, Entry]
    format_version: str = FORMAT_VERSION
    must_understand: list[str] = field(default_factory=list)
    extensions: dict[str, Any] = field(default_factory=dict)
    #: Where the tensor table is, when ``tensors`` are stored in one (spec §8.5).
    tensor_table: TableRef | None = None
    #: The bytes of ``manifest.json`` this record was parsed from, when it was read from storage
    #: (not part of the record: a load hands them to its other ranks as they are).
    source: bytes | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        """JSON form (``manifest.json``)."""
        doc = {
            "format": "portable-ckpt",
            "format_version": self.format_version,
            "attempt_id": self.attempt_id,
            "step": self.step,
            "created_at": self.created_at,
            "committed_at": self.committed_at,
            "producer": self.producer,
            "continuation": self.continuation.to_json(),
            "files": {p: f.to_json() for p, f in self.files.items()},
            "tensors": {}
            if self.tensor_table is not None
            else {k: t.to_json() for k, t in self.tensors.items()},
            "entries": {n: e.to_json() for n, e in self.entries.items()},
            "must_understand": list(self.must_understand),
            "extensions": self.extensions,
        }
        if self.tensor_table is not None:
            doc["tensor_table"] = self.tensor_table.to_json()
        return doc


# ---------------------------------------------------------------------------------------------
# Parsing untrusted documents
# ---------------------------------------------------------------------------------------------


class _Ctx:
    """Path-aware helpers that raise ``SchemaError`` naming the JSON location."""

    def __init__(self, what: str) -> None:
        self.what = what
        #: The document's format_version and must_understand, once checked (None: not known).
        self.version: str | None = None
        self.must_understand: list[str] | None = None

    def fail(
        self, where: str, msg: str, cls: type[CheckpointError] = SchemaError
    ) -> CheckpointError:
        return cls(f"{self.what}: {where}: {msg}", path=self.what)

    def obj(self, v: Any, where: str) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise self.fail(where, f"expected an object, got {type(v).__name__}")
        return v

    def arr(self, v: Any, where: str, max_len: int | None = None) -> list[Any]:
        if not isinstance(v, list):
            raise self.fail(where, f"expected an array, got {type(v).__name__}")
        if max_len is not None and len(v) > max_len:
            raise self.fail(where, f"more than {max_len} items", LimitError)
        return v

    def req(self, d: dict[str, Any], k: str, where: str) -> Any:
        if k not in d:
            raise self.fail(where, f"required field {k!r} is missing")
        return d[k]

    def int_(
        self,
        v: Any,
        where: str,
        lo: int = 0,
        hi: int = MAX_SIZE,
        low_cls: type[CheckpointError] = SchemaError,
    ) -> int:
        if not isinstance(v, int) or isinstance(v, bool):
            raise self.fail(where, f"expected an integer, got {v!r:.40}")
        if v < lo or v > hi:
            # PCK-LIMIT is for the format's limit, MAXINT (§17.2's closed list: sizes, shapes,
            # offsets, lengths); a schema's own bound (world size, rank, step, block size) is
            # PCK-SCHEMA (R-COMMIT-15; errata 6).
            cls: type[CheckpointError] = (
                low_cls if v < lo else LimitError if hi == MAX_SIZE else SchemaError
            )
            raise self.fail(where, f"{v} is outside [{lo}, {hi}]", cls)
        return v

    def str_(self, v: Any, where: str, max_len: int = 1024) -> str:
        if not isinstance(v, str):
            raise self.fail(where, f"expected a string, got {type(v).__name__}")
        if len(v) > max_len:
            raise self.fail(where, f"string longer than {max_len} characters")
        return v

    def enum(self, v: Any, where: str, allowed: tuple[str, ...]) -> str:
        if v not in allowed:
            raise self.fail(where, f"{v!r} is not one of {', '.join(allowed)}")
        return str(v)

    def name(self, v: Any, where: str, max_len: int = 1024) -> str:
        s = self.str_(v, where, max_len)
        if not s or _CTRL.search(s):
            raise self.fail(where, f"name {s!r} is empty or contains control characters")
        return s

    def closed(self, d: dict[str, Any], where: str, allowed: set[str]) -> None:
        extra = set(d) - allowed
        if extra:
            raise self.fail(where, f"unknown field(s) {sorted(extra)}")


def version_parts(v: Any) -> tuple[str, str] | None:
    """``(MAJOR, MINOR)`` of a well-formed format version (§16.1) as digit strings, else None.

    Digits, not ints: CPython refuses to convert more than 4,300 of them.
    """
    m = FORMAT_VERSION_RE.match(v) if isinstance(v, str) else None
    return None if m is None else (m.group(1), m.group(2))


def is_newer_major(v: Any) -> bool:
    """Whether ``v`` is a well-formed format version of a MAJOR above this one's (1)."""
    parts = version_parts(v)
    return parts is not None and (len(parts[0]) > 1 or parts[0] > str(FORMAT_MAJOR))


def minor_at_least(v: Any, minor: int) -> bool:
    """Whether ``v`` is a well-formed 1.x format version whose MINOR is ``minor`` or later."""
    parts = version_parts(v)
    if parts is None or parts[0] != str(FORMAT_MAJOR):
        return False
    return len(parts[1]) > len(str(minor)) or int(parts[1]) >= minor


def check_format_version(v: Any, what: str) -> str:
    """Validate ``format_version`` and refuse an unknown major version.

    Well-formed is the text's ``MAJOR.MINOR`` with any number of digits (§16.1): a MAJOR other
    than 1 is PCK-VERSION-UNSUPPORTED however long it is; a MINOR of more than 9 digits breaks
    the 1.x schemas (PCK-SCHEMA), and the record is then foreign (newer than this reader and
    failing its checks, R-VERSION-10). The digits are compared as text: CPython refuses to
    convert more than 4,300 of them to an int.
    """
    m = FORMAT_VERSION_RE.match(v) if isinstance(v, str) else None
    if m is None:
        raise SchemaError(f"{what}: format_version {v!r:.60} is not MAJOR.MINOR", path=what)
    major, minor = m.group(1), m.group(2)
    if major != str(FORMAT_MAJOR):
        raise VersionUnsupportedError(
            f"{what}: format_version {v:.60} has major version {major:.40}; this reader "
            f"implements major {FORMAT_MAJOR} (upgrade portable_ckpt to read it)",
            path=what,
        )
    if len(minor) > _MINOR_DIGITS:
        raise SchemaError(
            f"{what}: format_version {v:.60} has a MINOR of {len(minor)} digits; the schema "
            f"allows {_MINOR_DIGITS}",
            path=what,
        )
    return m.group(0)


def _checksum(c: _Ctx, v: Any, where: str, size: int) -> Checksum:
    d = c.obj(v, where)
    c.closed(d, where, {"algorithm", "block_size", "blocks"})
    alg = c.enum(c.req(d, "algorithm", where), where + ".algorithm", ("crc32c",))
    bs = c.int_(c.req(d, "block_size", where), where + ".block_size", 4096, 1 << 30)
    if bs & (bs - 1):
        raise c.fail(where + ".block_size", f"{bs} is not a power of two")
    blocks = c.str_(c.req(d, "blocks", where), where + ".blocks", max_len=MAX_SIZE)
    # bytes.translate deletes the hex digits in one C pass (~20x faster than a regex on the
    # megabytes of block checksums a large version has); anything left over is invalid.
    if len(blocks) % 8 or not blocks.isascii() or blocks.encode().translate(None, _HEX_DIGITS):
        raise c.fail(where + ".blocks", "must be 8 lowercase hex digits per block")
    want = -(-size // bs)
    if len(blocks) != 8 * want:
        raise c.fail(
            where + ".blocks", f"has {len(blocks) // 8} block checksums, the file size needs {want}"
        )
    return Checksum(alg, bs, blocks)


def _file_record_fast(path: str, rec: Any) -> FileRecord | None:
    """A well-formed file record in one expression, or ``None`` (then checked step by step).

    Large manifests list tens of thousands of files; the general path builds a location string
    per check, this one only tests.
    """
    if type(rec) is not dict or len(rec) != 2:
        return None
    size, ck = rec.get("size"), rec.get("checksum")
    if type(size) is not int or not 0 <= size <= MAX_SIZE or type(ck) is not dict or len(ck) != 3:
        return None
    bs, blocks = ck.get("block_size"), ck.get("blocks")
    if (
        ck.get("algorithm") != "crc32c"
        or type(bs) is not int
        or not 4096 <= bs <= 1 << 30
        or bs & (bs - 1)
        or type(blocks) is not str
        or len(blocks) != 8 * -(-size // bs)
        or not blocks.isascii()
        or blocks.encode().translate(None, _HEX_DIGITS)
    ):
        return None
    return FileRecord(path, size, Checksum("crc32c", bs, blocks))


def _files(c: _Ctx, v: Any) -> dict[str, FileRecord]:
    d = c.obj(v, "files")
    out: dict[str, FileRecord] = {}
    for path, rec in d.items():
        check_relative_path(path, what=f"{c.what}: files key")
        if path.startswith(("manifest.json.", "drills/", "copies/")) or path == "manifest.json":
            # The schema's files keys: not manifest.json, manifest.json.<anything>, nor below
            # drills/ or copies/ (§19.2; manifest.json.<anything> since errata 6).
            raise c.fail(
                f"files[{path!r}]",
                "manifest.json, manifest.json.<anything>, drills/ and copies/ are not listed "
                "in files",
            )
        fast = _file_record_fast(path, rec)
        if fast is not None:
            out[path] = fast
            continue
        r = c.obj(rec, f"files[{path!r}]")
        c.closed(r, f"files[{path!r}]", {"size", "checksum"})
        size = c.int_(c.req(r, "size", f"files[{path!r}]"), f"files[{path!r}].size")
        out[path] = FileRecord(
            path,
            size,
            _checksum(
                c, c.req(r, "checksum", f"files[{path!r}]"), f"files[{path!r}].checksum", size
            ),
        )
    return out


def _ints(
    c: _Ctx, v: Any, where: str, lo: int, low_cls: type[CheckpointError] = SchemaError
) -> tuple[int, ...]:
    arr = c.arr(v, where, MAX_NDIM)
    return tuple(c.int_(x, f"{where}[{i}]", lo, low_cls=low_cls) for i, x in enumerate(arr))


_RANGE_KEYS = frozenset(("offsets", "lengths", "file", "name", "codec"))


def _range_fast(
    rv: Any, shape: tuple[int, ...], files: Mapping[str, FileRecord]
) -> RangeRecord | None:
    """A well-formed range record in a few tests, or ``None`` (then checked step by step).

    Manifests hold thousands of range records; the general path builds a location string per
    check. ``files`` keys are already checked paths, so membership proves the path safe.
    """
    if type(rv) is not dict or rv.keys() != _RANGE_KEYS:
        return None
    offs, lens, fpath, name, codec = (
        rv["offsets"],
        rv["lengths"],
        rv["file"],
        rv["name"],
        rv["codec"],
    )
    if (
        type(offs) is not list
        or type(lens) is not list
        or len(offs) != len(shape)
        or len(lens) != len(shape)
        or type(fpath) is not str
        or fpath not in files
        or type(name) is not str
        or not 0 < len(name) <= 4096
        or name == "__metadata__"
        or codec not in CODECS
        or _CTRL.search(name)
    ):
        return None
    for o, n, d in zip(offs, lens, shape, strict=True):
        if type(o) is not int or type(n) is not int or o < 0 or n < 1 or o + n > d:
            return None
    return RangeRecord(tuple(offs), tuple(lens), fpath, name, codec)


def _dtype_defined(c: _Ctx, row: DType, where: str) -> None:
    problem = dtype_not_defined(row, c.version, c.must_understand)
    if problem:
        raise c.fail(where, problem, DtypeUnsupportedError)


def dtype_not_defined(row: DType, version: str | None, must_understand: list[str] | None) -> str:
    """Why ``row`` is not a dtype of a document of ``version`` ("" when it is).

    R-DTYPE-3 per version: a row a later MINOR added belongs to documents of that version or
    later that list its extension (R-VERSION-7), not to older ones. ``None``: not known.
    """
    if row.extension is None:
        return ""
    old = version is not None and _minor(version) < _minor(row.since)
    unlisted = must_understand is not None and row.extension not in must_understand
    if not (old or unlisted):
        return ""
    return (
        f"{row.name!r} is a dtype of format {row.since} with extension {row.extension!r}; "
        f"this document is format_version {version}"
        + (f" and does not list {row.extension!r} in must_understand" if unlisted else "")
    )


def dtypes_announced(version: str, dtypes: Iterable[str]) -> tuple[str, list[str]]:
    """Return the format version and the extensions a document holding ``dtypes`` needs.

    R-VERSION-2, R-VERSION-7: ``version`` raised to the newest row's MINOR, and the rows'
    extensions, sorted. A writer stamps these; it adds to what a document already declares,
    never replaces it.
    """
    rows = [DTYPES[n] for n in sorted(set(dtypes)) if n in DTYPES]
    newest = max([version, *(r.since for r in rows)], key=_version_key)
    return newest, sorted({r.extension for r in rows if r.extension is not None})


def _version_key(version: str) -> tuple[int, int]:
    major, minor = version.split(".", 1)
    return int(major), int(minor)


def _minor(version: str) -> int:
    return int(version.split(".", 1)[1])


def _tensor(
    c: _Ctx, key: str, v: Any, files: Mapping[str, FileRecord] | None, *, complete: bool = True
) -> TensorEntry:
    where = f"tensors[{key!r}]"
    c.name(key, where)
    d = c.obj(v, where)
    c.closed(d, where, {"dtype", "shape", "ranges"})
    dtype = c.req(d, "dtype", where)
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise c.fail(
            where + ".dtype", f"{dtype!r} is not in the dtype table", DtypeUnsupportedError
        )
    _dtype_defined(c, DTYPES[dtype], where + ".dtype")
    shape = _ints(c, c.req(d, "shape", where), where + ".shape", 0)
    numel = math.prod(shape)
    # Zero-size tensors too: an array of shape [0, 2^53, 2^53] cannot even be described in memory.
    if math.prod(max(s, 1) for s in shape) * DTYPES[dtype].itemsize > MAX_SIZE:
        raise c.fail(
            where + ".shape",
            f"{list(shape)} × {DTYPES[dtype].itemsize} bytes exceeds 2^53-1",
            LimitError,
        )
    ranges = []
    for i, rv in enumerate(c.arr(c.req(d, "ranges", where), where + ".ranges")):
        fast = _range_fast(rv, shape, files) if files is not None else None
        if fast is not None:
            ranges.append(fast)
            continue
        rw = f"{where}.ranges[{i}]"
        r = c.obj(rv, rw)
        c.closed(r, rw, {"offsets", "lengths", "file", "name", "codec"})
        offs = _ints(c, c.req(r, "offsets", rw), rw + ".offsets", 0, RangeBoundsError)
        lens = _ints(c, c.req(r, "lengths", rw), rw + ".lengths", 1, RangeBoundsError)
        if len(offs) != len(shape) or len(lens) != len(shape):
            raise c.fail(
                rw,
                f"offsets/lengths have rank {len(offs)}/{len(lens)}, the tensor has {len(shape)}",
                RangeBoundsError,
            )
        for dim, (o, n, s) in enumerate(zip(offs, lens, shape, strict=True)):
            if o + n > s:
                raise c.fail(
                    rw, f"box [{o}:{o + n}] exceeds dimension {dim} of size {s}", RangeBoundsError
                )
        # No length bound of its own: a path too long for §2.2 is PCK-PATH-UNSAFE (§17.2).
        fpath = check_relative_path(
            c.str_(c.req(r, "file", rw), rw + ".file", MAX_SIZE), what=f"{c.what}: {rw}.file"
        )
        if files is not None and fpath not in files:
            raise c.fail(rw + ".file", f"{fpath!r} is not listed in files")
        name = c.name(c.req(r, "name", rw), rw + ".name", 4096)
        if name == "__metadata__":
            raise c.fail(rw + ".name", "'__metadata__' is not a tensor name")
        codec = c.req(r, "codec", rw)
        if codec not in CODECS:
            raise c.fail(
                rw + ".codec", f"codec {codec!r} is not one of {', '.join(CODECS)}", CodecError
            )
        ranges.append(RangeRecord(offs, lens, fpath, name, codec))
    # Cheap structural coverage rules (the full exactly-once check runs before a tensor is read).
    if not shape and (len(ranges) > 1 or (complete and not ranges)):
        cls = CoverageGapError if not ranges else CoverageOverlapError
        raise c.fail(
            where + ".ranges", f"a 0-d tensor has exactly one range, found {len(ranges)}", cls
        )
    if complete and numel and not ranges:
        raise c.fail(where + ".ranges", f"no range records for {numel} elements", CoverageGapError)
    return TensorEntry(key, dtype, shape, ranges)


def _entry(
    c: _Ctx, name: str, v: Any, files: Mapping[str, FileRecord] | None, world_size: int | None
) -> Entry:
    where = f"entries[{name!r}]"
    c.name(name, where, 256)
    if not is_entry_name(name):
        raise c.fail(where, "entry names use [A-Za-z0-9._/-] with no empty, '.' or '..' parts")
    d = c.obj(v, where)
    c.closed(d, where, {"schema", "scope", "world_size_policy", "encoding", "values"})
    schema = _entry_schema(c, c.obj(c.req(d, "schema", where), where + ".schema"), where)
    scope = c.enum(c.req(d, "scope", where), where + ".scope", SCOPES)
    policy = d.get("world_size_policy")
    if scope == "per_rank":
        policy = c.enum(
            c.req(d, "world_size_policy", where), where + ".world_size_policy", POLICIES
        )
    elif "world_size_policy" in d:
        # Absent, not null: the schema forbids the member itself on a global entry (§12.1).
        raise c.fail(where + ".world_size_policy", "only per_rank entries have a world_size_policy")
    encoding = c.enum(c.req(d, "encoding", where), where + ".encoding", ENCODINGS)
    values = _entry_values(c, c.req(d, "values", where), where, scope, files, world_size)
    return Entry(name, schema, scope, encoding, values, policy)


def _entry_schema(c: _Ctx, schema: dict[str, Any], where: str) -> dict[str, Any]:
    """An entry's ``schema``: a built-in id or an embedded JSON Schema."""
    if "id" in schema:
        c.closed(schema, where + ".schema", {"id"})
        if schema["id"] not in BUILTIN_SCHEMA_IDS:
            raise c.fail(
                where + ".schema.id",
                f"{schema['id']!r} is not a built-in schema id ({', '.join(BUILTIN_SCHEMA_IDS)})",
                EntrySchemaError,
            )
    elif "json_schema" in schema:
        c.closed(schema, where + ".schema", {"json_schema"})
        if not isinstance(schema["json_schema"], dict | bool):
            raise c.fail(where + ".schema.json_schema", "must be a JSON Schema (object or boolean)")
    else:
        raise c.fail(where + ".schema", "needs 'id' (a built-in schema) or 'json_schema'")
    return schema


def _entry_values(
    c: _Ctx,
    v: Any,
    where: str,
    scope: str,
    files: Mapping[str, FileRecord] | None,
    world_size: int | None,
) -> list[EntryValue]:
    """An entry's ``values``: files listed in ``files``, ranks per the scope (R-ENTRY-7..9)."""
    values = []
    seen_ranks: set[int] = set()
    for i, vv in enumerate(c.arr(v, where + ".values")):
        vw = f"{where}.values[{i}]"
        o = c.obj(vv, vw)
        c.closed(o, vw, {"file", "rank"})
        # As a range's file: §2.2 bounds the length (PCK-PATH-UNSAFE), not a string limit.
        fpath = check_relative_path(
            c.str_(c.req(o, "file", vw), vw + ".file", MAX_SIZE), what=f"{c.what}: {vw}.file"
        )
        if files is not None and fpath not in files:
            raise c.fail(vw + ".file", f"{fpath!r} is not listed in files")
        rank: int | None = None
        if scope == "per_rank":
            rank = c.int_(c.req(o, "rank", vw), vw + ".rank", 0, (1 << 24) - 1)
            if world_size is not None and rank >= world_size:
                raise c.fail(vw + ".rank", f"rank {rank} is not below world_size {world_size}")
            if rank in seen_ranks:
                raise c.fail(vw + ".rank", f"rank {rank} has two values")
            seen_ranks.add(rank)
        elif "rank" in o:
            raise c.fail(vw, "global entries have no rank")
        values.append(EntryValue(fpath, rank))
    if scope == "global" and len(values) > 1:
        # The schema's maxItems, in a writer index too, where no world size is known (§14.1).
        raise c.fail(where + ".values", f"a global entry has exactly one value, found {len(values)}")
    if world_size is not None:
        problem = entry_values_problem(scope, [v.rank for v in values], world_size)
        if problem is not None:
            raise c.fail(where + ".values", problem[1], problem[0])
    return values


def entry_values_problem(
    scope: str, ranks: Sequence[int | None], world_size: int
) -> tuple[type[CheckpointError], str] | None:
    """The rule on an entry's values (R-ENTRY-7..9), shared by the parser and the committer.

    A ``global`` entry has exactly one value; a ``per_rank`` entry one value for each rank
    ``0 … world_size-1``. ``ranks`` are the values' ranks (``None`` for a global value).

    Returns:
        ``None`` when the values obey the rule, else the error class (PCK-ENTRY-MISSING for a
        missing value, PCK-SCHEMA for one too many) and the message.

    """
    n = len(ranks)
    if scope == "global":
        if n == 1:
            return None
        return EntryMissingError if n == 0 else SchemaError, (
            f"a global entry has exactly one value, found {n}"
        )
    present = set(ranks)
    # The world size is declared, the values are present: find the first missing ranks in
    # O(values), never by building range(world_size) (2^21 ranks took 256 MiB).
    covered = sum(1 for r in present if isinstance(r, int) and 0 <= r < world_size)
    if covered < world_size:
        missing = list(itertools.islice((r for r in range(world_size) if r not in present), 8))
        return EntryMissingError, (
            f"per_rank entry lacks the values of rank(s) {missing[:8]} (world size {world_size})"
        )
    if n != world_size:
        extra = sorted(r for r in present if r is not None and r >= world_size)
        return SchemaError, (
            f"per_rank entry has {n} values for world size {world_size} (duplicate ranks, or "
            f"ranks not below it: {extra[:8]})"
        )
    return None


def _continuation(c: _Ctx, v: Any) -> Continuation:
    d = c.obj(v, "continuation")
    c.closed(d, "continuation", {"contract", "world_size", "mesh"})
    contract = c.enum(c.req(d, "contract", "continuation"), "continuation.contract", CONTRACTS)
    ws = c.int_(c.req(d, "world_size", "continuation"), "continuation.world_size", 1, 1 << 24)
    mv = c.req(d, "mesh", "continuation")
    mesh = None
    if mv is not None:
        m = c.obj(mv, "continuation.mesh")
        c.closed(m, "continuation.mesh", {"shape", "dim_names"})
        # 1 to 64 dimensions of 1 to 2^24 ranks (the schema's mesh): PCK-SCHEMA, not the
        # PCK-LIMIT of a tensor's shape (§17.2 names tensor shapes only; errata 6).
        ms = _mesh_list(c, c.req(m, "shape", "continuation.mesh"), "continuation.mesh.shape")
        shape = tuple(
            c.int_(x, f"continuation.mesh.shape[{i}]", 1, _MESH_MAX) for i, x in enumerate(ms)
        )
        names = tuple(
            c.name(x, "continuation.mesh.dim_names", 64)
            for x in _mesh_list(
                c, c.req(m, "dim_names", "continuation.mesh"), "continuation.mesh.dim_names"
            )
        )
        if len(names) != len(shape):
            raise c.fail("continuation.mesh", "dim_names and shape differ in length")
        if len(set(names)) != len(names):
            raise c.fail("continuation.mesh.dim_names", f"duplicate dimension names {list(names)}")
        if math.prod(shape) != ws:
            raise c.fail(
                "continuation.mesh", f"mesh shape {list(shape)} does not hold world_size {ws} ranks"
            )
        mesh = Mesh(shape, names)
    return Continuation(contract, ws, mesh)


def _mesh_list(c: _Ctx, v: Any, where: str) -> list[Any]:
    arr = c.arr(v, where)
    if not 1 <= len(arr) <= MAX_NDIM:
        raise c.fail(where, f"has {len(arr)} items; a mesh has 1 to {MAX_NDIM} dimensions")
    return arr


#: What writers name a mesh dimension (the schema's pattern, spec §13 and §19.2).
DIM_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}\Z")


def check_continuation(cont: Continuation, what: str = "continuation") -> None:
    """Refuse a continuation contract that readers would refuse in a manifest (spec §13).

    Writers call it before they write anything: a contract the reader's parser rejects would
    make the whole version invalid after its data was written.

    Raises:
        UsageError: an unknown contract, a world size outside 1 … 2^24, or a mesh whose names
            are empty, repeated or not names, or whose shape does not hold the world size.

    """
    try:
        _continuation(_Ctx(what), cont.to_json())
    except CheckpointError as exc:
        raise UsageError(f"{exc.message}; pass a valid Continuation") from None
    if cont.mesh is not None:
        bad = [n for n in cont.mesh.dim_names if not DIM_NAME_RE.match(n)]
        if bad:
            # Readers accept such labels (R-CONTRACT-8); writers never write them.
            raise UsageError(
                f"{what}: mesh dimension names {bad} do not match {DIM_NAME_RE.pattern} "
                "(spec §13); name the dimensions like Python identifiers"
            )


def parse_manifest(
    doc: Any, *, what: str = "manifest.json", directory_name: str | None = None
) -> Manifest:
    """Validate an untrusted manifest document and return its record.

    Args:
        doc: The parsed JSON document.
        what: Name for messages.
        directory_name: The attempt directory's name; the manifest's ``attempt_id`` must equal it.

    """
    c = _Ctx(what)
    d = c.obj(doc, "top level")
    if d.get("format") != "portable-ckpt":
        raise c.fail("format", f"expected 'portable-ckpt', got {d.get('format')!r}")
    version = check_format_version(c.req(d, "format_version", "top level"), what)
    # Required (§5): empty is allowed, absent is not (the schema's "required").
    mu = _must_understand(c, c.req(d, "must_understand", "top level"))
    c.version, c.must_understand = version, mu
    attempt_id = check_attempt_id(c.req(d, "attempt_id", "top level"), what=f"{what}: attempt_id")
    if directory_name is not None and directory_name != attempt_id:
        raise AttemptIdError(
            f"{what}: attempt_id {attempt_id!r} differs from its directory {directory_name!r} "
            "(a copied or renamed attempt); attempts are never renamed",
            path=what,
        )
    step = c.int_(c.req(d, "step", "top level"), "step", 0, 10**12 - 1)
    if int(attempt_id[1:13]) != step:
        raise AttemptIdError(
            f"{what}: step {step} differs from the step in attempt_id {attempt_id}", path=what
        )
    created = c.str_(c.req(d, "created_at", "top level"), "created_at", 64)
    committed = c.str_(c.req(d, "committed_at", "top level"), "committed_at", 64)
    for k, val in (("created_at", created), ("committed_at", committed)):
        if not _TS.match(val):
            raise c.fail(k, f"{val!r} is not an RFC 3339 UTC timestamp (YYYY-MM-DDTHH:MM:SS[.f]Z)")
    producer = c.obj(c.req(d, "producer", "top level"), "producer")
    for k in ("name", "version"):
        if not c.str_(c.req(producer, k, "producer"), f"producer.{k}", 256):
            raise c.fail(f"producer.{k}", "must not be empty (1 to 256 characters)")
    cont = _continuation(c, c.req(d, "continuation", "top level"))
    files = _files(c, c.req(d, "files", "top level"))
    tensors = {
        k: _tensor(c, k, v, files)
        for k, v in c.obj(c.req(d, "tensors", "top level"), "tensors").items()
    }
    entries = {
        n: _entry(c, n, v, files, cont.world_size)
        for n, v in c.obj(c.req(d, "entries", "top level"), "entries").items()
    }
    table = _table_ref(c, d, version, files, tensors)
    if table is not None and TABLE_EXTENSION not in mu:
        raise c.fail(
            "must_understand",
            "a manifest with a tensor_table must list 'tensor-table' (R-TABLE-2)",
        )
    ext = c.req(d, "extensions", "top level")
    if not isinstance(ext, dict):
        raise c.fail("extensions", "must be an object")
    # R-VERSION-6 ignores what extensions hold, not their names (the schema's propertyNames).
    for k in ext:
        if not _EXTENSION_NAME.match(k):
            raise c.fail("extensions", f"member name {k!r:.140} does not match "
                         f"{_EXTENSION_NAME.pattern}")
    return Manifest(
        attempt_id=attempt_id,
        step=step,
        created_at=created,
        committed_at=committed,
        producer=producer,
        continuation=cont,
        files=files,
        tensors=tensors,
        entries=entries,
        format_version=version,
        must_understand=mu,
        extensions=ext,
        tensor_table=table,
    )


def _must_understand(c: _Ctx, v: Any) -> list[str]:
    """``must_understand``: extensions the reader must implement (R-VERSION-5), checked first.

    Any item that is not the name of an extension this reader implements — an unknown name, a
    name outside the schema's pattern, a number — is PCK-FEATURE-UNSUPPORTED (§16.3 checks
    ``must_understand`` before the schema, as the conformance checker does); then the schema's
    ``uniqueItems``.
    """
    items = c.arr(v, "must_understand")
    unknown = [x for x in items if not (isinstance(x, str) and x in KNOWN_EXTENSIONS)]
    if unknown:
        shown = ", ".join(repr(x)[:80] for x in unknown[:8])
        raise FeatureUnsupportedError(
            f"{c.what}: must_understand names extension(s) {shown}"
            f"{' …' if len(unknown) > 8 else ''} that this reader does not implement; use a "
            "reader that supports them",
            path=c.what,
        )
    if len(set(items)) != len(items):
        raise c.fail("must_understand", f"names an extension twice: {items}")
    return list(items)


def parse_writer_index(doc: Any, *, what: str = "writer index") -> WriterIndex:
    """Validate an untrusted writer index document and return its record."""
    c = _Ctx(what)
    d = c.obj(doc, "top level")
    if d.get("format") != "portable-ckpt-writer-index":
        raise c.fail("format", f"expected 'portable-ckpt-writer-index', got {d.get('format')!r}")
    version = check_format_version(c.req(d, "format_version", "top level"), what)
    c.version = version  # an index lists no extensions: its manifest does (R-VERSION-7)
    attempt_id = check_attempt_id(c.req(d, "attempt_id", "top level"), what=f"{what}: attempt_id")
    writer = c.int_(c.req(d, "writer", "top level"), "writer", 0, (1 << 24) - 1)
    files = _files(c, c.req(d, "files", "top level"))
    tensors = {
        k: _tensor(c, k, v, files, complete=False)
        for k, v in c.obj(c.req(d, "tensors", "top level"), "tensors").items()
    }
    entries = {
        n: _entry(c, n, v, files, None)
        for n, v in c.obj(c.req(d, "entries", "top level"), "entries").items()
    }
    table = _table_ref(c, d, version, files, tensors)
    return WriterIndex(attempt_id, writer, files, tensors, entries, tensor_table=table,
                       format_version=version)


def _table_ref(
    c: _Ctx, d: dict[str, Any], version: str, files: dict[str, FileRecord], tensors: dict[str, Any]
) -> TableRef | None:
    """The ``tensor_table`` member (spec §8.5, R-TABLE-1 / R-TABLE-2), or ``None``."""
    if "tensor_table" not in d:
        return None
    # A present member must be a reference: ``null`` is not "absent" (the schema rejects it).
    o = c.obj(d["tensor_table"], "tensor_table")
    c.closed(o, "tensor_table", {"file", "codec"})
    path = check_relative_path(c.req(o, "file", "tensor_table"), what="tensor_table.file")
    codec = c.req(o, "codec", "tensor_table")
    if codec not in CODECS:
        raise CodecError(
            f"{c.what}: tensor_table.codec {codec!r} is not 'none' or 'zstd'", path=c.what
        )
    if path not in files:
        raise c.fail("tensor_table.file", f"{path!r} is not listed in files (R-TABLE-1)")
    if tensors:
        raise c.fail("tensors", "must be {} when the document has a tensor_table (R-TABLE-1)")
    if version == FORMAT_VERSION:
        raise c.fail("format_version", "a document with a tensor_table is format 1.1 or later")
    return TableRef(path, codec)
