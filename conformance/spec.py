"""Constants of format 1.x as the conformance suite reads them from the spec (own copy).

Nothing here is imported from :mod:`portable_ckpt`; the values are transcribed from
``spec/README.md`` / ``spec/DESIGN-NOTES.md`` so that a mistake in the reference implementation's
tables shows up as a disagreement.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "ATTEMPT_ID_RE",
    "DELETION_NAME_RE",
    "BUILTIN_SCHEMA_FILES",
    "BUILTIN_SCHEMA_IDS",
    "CODES",
    "DTYPES",
    "DTYPE_CODES",
    "DTYPE_SINCE",
    "FORMAT_VERSIONS",
    "KNOWN_EXTENSIONS",
    "MAX_BLOCK_SIZE",
    "MAX_COMPONENTS",
    "MAX_HEADER_BYTES",
    "MAX_NDIM",
    "MAX_SIZE",
    "MAX_TABLE_BYTES",
    "MIN_BLOCK_SIZE",
    "NEWEST_FORMAT_VERSION",
    "NEWEST_MINOR",
    "RANGE_CODECS",
    "TABLE_COLUMNS",
    "TABLE_EXTENSION",
    "PATH_COMPONENT_RE",
    "ST_ITEMSIZE",
    "VERSIONS_TEXT",
    "dtype_not_allowed",
    "has_control_chars",
    "newer_minor",
    "path_problem",
]

#: The format versions this suite implements, oldest first. A new MINOR changes this line (and
#: ``__version__``, which starts with the newest: ``conformance/tests/test_cli.py``); the checker,
#: the CLI and the tests take "the newest" and "a newer one" from here (contributor review D5:
#: "1.2 is the newest" was written out in six places, and a test used "1.3" as a future version).
#: ``tests/test_dtype_tables.py`` compares it with the reference's ``FORMAT_VERSIONS``.
FORMAT_VERSIONS: tuple[str, ...] = ("1.0", "1.1", "1.2", "1.3")
NEWEST_FORMAT_VERSION = FORMAT_VERSIONS[-1]
NEWEST_MINOR = int(NEWEST_FORMAT_VERSION.split(".")[1])
#: ``"1.0, 1.1, 1.2 and 1.3"``: how the CLI and the README name them.
VERSIONS_TEXT = f"{', '.join(FORMAT_VERSIONS[:-1])} and {NEWEST_FORMAT_VERSION}"


def dtype_not_allowed(dtype: str, version: Any, must_understand: Any) -> str:
    """Why a row of §7 is not a dtype of a document (R-DTYPE-3 per version); "" when it is.

    ``version`` is the document's ``format_version``; ``must_understand`` is ``None`` for a
    writer index (which has none).
    """
    since = DTYPE_SINCE.get(dtype)
    if since is None:
        return ""
    minor, ext = since
    m = re.fullmatch(r"1\.(0|[1-9][0-9]*)", version) if isinstance(version, str) else None
    if m is not None and (len(m.group(1)), m.group(1)) < (len(minor[2:]), minor[2:]):
        return f"dtype {dtype!r} is a dtype of format {minor}; the document is {version}"
    if must_understand is not None and (not isinstance(must_understand, list)
                                        or ext not in must_understand):
        return (f"dtype {dtype!r} needs the extension {ext!r} in must_understand "
                "(R-VERSION-7)")
    return ""


def newer_minor(minor: str) -> bool:
    """Whether a well-formed MINOR (decimal, no leading zero) is newer than :data:`NEWEST_MINOR`.

    Compared as text, length first: CPython converts at most 4,300 digits to an int, and a
    MINOR may have any number of them (errata 6).
    """
    newest = str(NEWEST_MINOR)
    return len(minor) > len(newest) or (len(minor) == len(newest) and minor > newest)


#: attempt id: ``s<step:012d>-<YYYYMMDD>T<HHMMSS><micro:06d>Z-<16 hex>``.
ATTEMPT_ID_RE = re.compile(r"^s([0-9]{12})-[0-9]{8}T[0-9]{12}Z-[0-9a-f]{16}\Z")
#: a deletion mark's file name in ``deleting/``: ``<deletion_id>.json`` (spec §15.2, R-GC-13).
DELETION_NAME_RE = re.compile(r"g[0-9]{8}T[0-9]{12}Z-[0-9a-f]{8}\.json")
PATH_COMPONENT_RE = re.compile(r"^[A-Za-z0-9._-]{1,255}\Z")
MAX_COMPONENTS = 8
#: format dtype name -> (safetensors dtype, itemsize)
DTYPES: dict[str, tuple[str, int]] = {
    "float64": ("F64", 8),
    "float32": ("F32", 4),
    "float16": ("F16", 2),
    "bfloat16": ("BF16", 2),
    "int64": ("I64", 8),
    "int32": ("I32", 4),
    "int16": ("I16", 2),
    "int8": ("I8", 1),
    "uint8": ("U8", 1),
    "uint16": ("U16", 2),
    "uint32": ("U32", 4),
    "uint64": ("U64", 8),
    "bool": ("BOOL", 1),
    "float8_e4m3fn": ("F8_E4M3", 1),
    "float8_e5m2": ("F8_E5M2", 1),
    # format 1.3 (DTYPE_SINCE)
    "float8_e8m0fnu": ("F8_E8M0", 1),
    "float8_e4m3fnuz": ("F8_E4M3FNUZ", 1),
    "float8_e5m2fnuz": ("F8_E5M2FNUZ", 1),
    "complex64": ("C64", 8),
}
#: the rows a later MINOR added (§7): dtype -> (format version, extension). Such a row is a
#: dtype only of a document of that version or later and, in a manifest, only where
#: ``must_understand`` lists its extension (R-DTYPE-3, R-VERSION-7); elsewhere it is
#: ``PCK-DTYPE-UNSUPPORTED``.
DTYPE_SINCE: dict[str, tuple[str, str]] = {
    "float8_e8m0fnu": ("1.3", "dtype-float8-e8m0fnu"),
    "float8_e4m3fnuz": ("1.3", "dtype-float8-e4m3fnuz"),
    "float8_e5m2fnuz": ("1.3", "dtype-float8-e5m2fnuz"),
    "complex64": ("1.3", "dtype-complex64"),
}
#: itemsize of every safetensors dtype a header may name (superset of the format's table).
ST_ITEMSIZE: dict[str, int] = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
    "U8": 1, "U16": 2, "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "F8_E8M0": 1, "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1, "C64": 8,
}
MAX_SIZE = 2**53 - 1
MAX_NDIM = 64
MAX_HEADER_BYTES = 100_000_000
MIN_BLOCK_SIZE = 4096
MAX_BLOCK_SIZE = 2**30
BUILTIN_SCHEMA_IDS = (
    "pck:step/1",
    "pck:lr-scheduler/1",
    "pck:grad-scaler/1",
    "pck:rng/1",
    "pck:data-position/1",
    "pck:json/1",
)
#: built-in schema id -> schema file below spec/schemas (spec §12.5).
BUILTIN_SCHEMA_FILES = {
    "pck:step/1": "entries/step.schema.json",
    "pck:lr-scheduler/1": "entries/lr-scheduler.schema.json",
    "pck:grad-scaler/1": "entries/grad-scaler.schema.json",
    "pck:rng/1": "entries/rng.schema.json",
    "pck:data-position/1": "entries/data-position.schema.json",
    "pck:json/1": "entries/json.schema.json",
}
#: the extension name a manifest with a tensor table lists in ``must_understand`` (§8.5, 1.1).
TABLE_EXTENSION = "tensor-table"
#: extensions this checker implements (for ``must_understand``): 1.0 defines none, 1.1 one,
#: 1.3 one per dtype it adds.
KNOWN_EXTENSIONS: frozenset[str] = frozenset(
    {TABLE_EXTENSION, *(ext for _, ext in DTYPE_SINCE.values())}
)
#: dtype code of a tensor table (§8.5): the row of the dtype in §7's table, counted from 0.
#: Transcribed row by row, independently of the order of :data:`DTYPES`.
DTYPE_CODES: tuple[str, ...] = (
    "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8",
    "uint16", "uint32", "uint64", "bool", "float8_e4m3fn", "float8_e5m2",
    "float8_e8m0fnu", "float8_e4m3fnuz", "float8_e5m2fnuz", "complex64",
)
#: range codec names; in a tensor table their index is the codec code (0 = none, 1 = zstd).
RANGE_CODECS: tuple[str, ...] = ("none", "zstd")
#: the ten columns of a tensor table and their safetensors dtypes (§8.5, R-TABLE-4).
TABLE_COLUMNS: dict[str, str] = {
    "tensor.key": "U8", "tensor.dtype": "U8", "tensor.ndim": "U8", "tensor.shape": "I64",
    "tensor.ranges": "I64", "range.file": "U32", "range.codec": "U8", "range.offsets": "I64",
    "range.lengths": "I64", "file.path": "U8",
}
#: the largest decoded tensor table (R-TABLE-3): 2^32 bytes.
MAX_TABLE_BYTES = 2**32

CODES = (
    "PCK-NOT-FOUND", "PCK-MANIFEST-MISSING", "PCK-JSON-INVALID", "PCK-SCHEMA",
    "PCK-VERSION-UNSUPPORTED", "PCK-FEATURE-UNSUPPORTED", "PCK-ATTEMPT-ID", "PCK-PATH-UNSAFE",
    "PCK-FILE-MISSING", "PCK-FILE-SIZE", "PCK-CHECKSUM", "PCK-DTYPE-UNSUPPORTED", "PCK-DTYPE-VALUE",
    "PCK-RANGE-BOUNDS", "PCK-COVERAGE-GAP", "PCK-COVERAGE-OVERLAP", "PCK-SHARD-HEADER",
    "PCK-SHARD-MISMATCH", "PCK-CODEC", "PCK-LIMIT", "PCK-ENTRY-SCHEMA", "PCK-ENTRY-MISSING",
    "PCK-TENSOR-MISSING", "PCK-CONTRACT", "PCK-COMMIT-CONFLICT", "PCK-WRITER-MISSING",
    "PCK-METADATA-CONFLICT", "PCK-STEP-MISMATCH", "PCK-STORAGE", "PCK-DISTRIBUTED",
    "PCK-WRITER-PROCESS", "PCK-UNSUPPORTED-VALUE", "PCK-USAGE", "PCK-VERIFICATION-FAILED",
)

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def has_control_chars(s: str) -> bool:
    """Return True when ``s`` contains U+0000-U+001F or U+007F."""
    return _CONTROL.search(s) is not None


def path_problem(path: object) -> str | None:
    """Return why ``path`` breaks the spec's path rules, or None when it is safe."""
    if not isinstance(path, str) or not path:
        return f"path must be a non-empty string, got {path!r}"
    if path.startswith("/"):
        return f"path {path!r} is absolute"
    if "\\" in path:
        return f"path {path!r} contains a backslash"
    parts = path.split("/")
    if len(parts) > MAX_COMPONENTS:
        return f"path {path!r} has more than {MAX_COMPONENTS} components"
    for part in parts:
        if part in (".", ".."):
            return f"path {path!r} has a {part!r} component"
        if not PATH_COMPONENT_RE.match(part):
            return f"path {path!r} has a component {part!r} outside [A-Za-z0-9._-]{{1,255}}"
    return None
