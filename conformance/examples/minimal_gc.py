#!/usr/bin/env python3
"""A minimal gc of portable-ckpt roots on a local file system (spec §15), from the spec alone.

It imports only the Python standard library (no portable_ckpt, no jsonschema, nothing of the
conformance suite). It exists to show that §15 is enough to write a gc that keeps what it must
and deletes only what it may; it passes ``python -m conformance gc -- python
conformance/examples/minimal_gc.py``, with or without ``--no-retire-abandoned`` (it implements
the optional retirement of abandoned branches, and does it when the job asks for it).

Usage (the job protocol of conformance/README.md, "gc"): ``minimal_gc.py JOB.json`` with the job
``{"op": "gc", "root", "keep", "grace_seconds", "delete_invalid", "retire_abandoned"}``.
Exit status 0, or 1 when the gc reports an attempt (R-GC-6, R-GC-10, R-GC-11, R-GC-12, a
pinned version ``retire_abandoned`` could not retire) or failed to delete one; 2 on a usage
error. Its report is printed to standard output as one line of JSON: the class of every
attempt (``classes``), what it deleted and kept (with the rule that kept it), what it reports
(``reports``) and the attempts those name (``reported``, the protocol's report line). Patterns
are matched whole (``fullmatch``: ``$`` also matches before a final newline).

How it follows §15, in the order of :func:`gc`:

1. classify every child of the root named like an attempt id (§15.1, :func:`classify`): the
   commit record (:func:`classify_record`), then for a version its verification status
   (§14.5) and whether it is drilled (§14.3); for an attempt without a record its deletion
   marks (R-GC-13), records and files;
2. read the pins (§15.3, :func:`read_pins`);
3. keep what is unknown, foreign or stray, has an unknown verification status or is pinned;
4. retire abandoned branches when asked (§15.2, :func:`retire_abandoned`);
5. apply retention to the remaining versions (R-GC-1, R-GC-2, R-GC-9, :func:`retain`);
6. decide the rest: invalid attempts are kept unless asked (R-GC-10), incomplete and invalid
   ones go only after their grace period (R-GC-4);
7. delete, each attempt behind a deletion mark, commit record first (R-GC-3, R-GC-13,
   :func:`delete_attempt`), looking at the pins again while it deletes (:func:`delete_all`).

Simplifications (a gc for a test suite's example, not for production):

* The commit record is checked by hand, not with jsonschema: §18.3's JSON rules, §16.3's
  order (format, format_version, must_understand), the members and types of
  ``manifest.schema.json`` (1.0 + 1.1's ``tensor_table``), and the record-alone rules of §4.1
  (R-ID-3, R-FILES-2, R-CKSUM-2, R-TENSOR-1, R-TENSOR-2, R-CONTRACT-2, R-ENTRY-7..9).
  Not checked: embedded entry schemas (R-ENTRY-3/4/15: whether an embedded schema is a usable
  Draft 2020-12 schema), R-SEC-19's optional memory bound, and R-SEC-15 (entry values only).
  A record that passes these checks but fails a full schema check is therefore taken as a
  version (kept, counted) - the safe direction for a gc only when it is among the kept ones.
* dim_names follow R-CONTRACT-8 (unique, 1..64 code points, no C0 control or DEL).
* Drill, verification, pin and deletion records are validated by hand against their schemas.
* Local file system only: no uploads (R-GC-8 does not apply).
* The storage's clock is learnt with a clock probe (§15.2); without one, the local clock.
* R-DRILL-9 pruning and the optional clearing of old deletion marks are not done.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import secrets
import stat
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, NoReturn

# -- patterns of the schemas (spec/schemas) and the text ---------------------------------------
ATTEMPT_RE = re.compile(r"^s[0-9]{12}-[0-9]{8}T[0-9]{12}Z-[0-9a-f]{16}$")
FV_RE = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$")  # well-formed (§16.1)
FV_SCHEMA_RE = re.compile(r"^1\.(0|[1-9][0-9]{0,8})$")  # the schemas' formatVersion
TS_RE = re.compile(r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):"
                   r"[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]{1,9})?Z$")
PATH_RE = re.compile(r"^[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+){0,7}$")
PATH_BAD_RE = re.compile(r"(?:^|/)\.\.?(?:/|$)|[A-Za-z0-9._-]{256}")
FILES_EXCL_RE = re.compile(r"^(?:manifest\.json(?:\..*)?|drills/.*|copies/.*)$", re.S)
BLOCKS_RE = re.compile(r"(?:[0-9a-f]{8})*")
NOCTRL_RE = re.compile(r"^[^\x00-\x1f\x7f]+$")
ENTRY_NAME_RE = re.compile(r"^[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)*$")
ENTRY_NAME_BAD_RE = re.compile(r"(?:^|/)\.\.?(?:/|$)")
MU_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
DRILL_ID_RE = re.compile(r"^d[0-9]{8}T[0-9]{12}Z-[0-9a-f]{8}$")
VER_ID_RE = re.compile(r"^v[0-9]{8}T[0-9]{12}Z-[0-9a-f]{8}$")
PIN_ID_RE = re.compile(r"^p[0-9]{8}T[0-9]{12}Z-[0-9a-f]{8}$")
DEL_ID_RE = re.compile(r"^g[0-9]{8}T[0-9]{12}Z-[0-9a-f]{8}$")
ERRCODE_RE = re.compile(r"^PCK-[A-Z0-9]+(?:-[A-Z0-9]+)*$")

MAXINT = 2**53 - 1
MAX_WORLD = 16777216
IMPLEMENTED_EXTENSIONS = {"tensor-table"}
NEWEST = (1, 2)  # the newest format version this gc implements
ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
            "int16": 2, "int8": 1, "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8,
            "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}
BLOCK_SIZES = {2**k for k in range(12, 31)}
BUILTIN_IDS = {"pck:step/1", "pck:lr-scheduler/1", "pck:grad-scaler/1", "pck:rng/1",
               "pck:data-position/1", "pck:json/1"}
WORLD_SIZE_POLICIES = ("require_same", "modulo", "rank0", "drop")
MANIFEST_LIMIT = 2**30
DOC_LIMIT = 2**26
RECORD_DIRS = ("drills", "copies", "verifications")
#: a deletion mark younger than this is reused rather than stored again (§15.2)
MARK_REUSE_SECONDS = 1800
#: how far ``committed_at`` and the records' modification times may disagree (§15.2)
RETIRE_TOLERANCE_SECONDS = 60
#: an attempt id this far ahead of the storage's clock dates nothing (R-GC-4)
CLOCK_AHEAD_SECONDS = 60


class Invalid(Exception):
    """A document breaks a rule (JSON, schema or a rule of the text)."""


class StorageError(Exception):
    """The storage failed to answer (the attempt's class is unknown)."""


class NotRegular(Exception):
    """A path that is a symbolic link, directory, FIFO, ... (a foreign entry, R-LAYOUT-7)."""


# -- strict JSON (§18.3) -----------------------------------------------------------------------
_OVERFLOW = 2**1024 - 2**970  # the first integer that rounds to infinity as a double
_MAX_DEPTH = 64


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for k, v in pairs:
        if k in d:
            raise Invalid(f"duplicate member {k!r}")
        d[k] = v
    return d


def _const(tok: str) -> NoReturn:
    raise Invalid(f"non-finite token {tok}")


def _float(tok: str) -> float:
    v = float(tok)
    if math.isinf(v):
        raise Invalid("number overflows a double")
    return v


def _int(tok: str) -> int:
    # the length test first: int() of thousands of digits is slow, and already too large
    if len(tok.lstrip("-")) > 400 or abs(int(tok)) >= _OVERFLOW:
        raise Invalid("number overflows a double")
    return int(tok)


def _check_strings_depth(v: Any, depth: int = 1) -> None:
    if depth > _MAX_DEPTH:
        raise Invalid("nesting deeper than 64")
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:  # a \ud800 escape decodes to a lone surrogate
            raise Invalid("unpaired surrogate") from None
    elif isinstance(v, dict):
        for k, x in v.items():
            _check_strings_depth(k, depth)
            _check_strings_depth(x, depth + 1)
    elif isinstance(v, list):
        for x in v:
            _check_strings_depth(x, depth + 1)


def _depth_scan(text: str) -> None:
    """Reject nesting deeper than 64 before parsing (protects the recursive parser)."""
    depth, in_str, esc = 0, False, False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > _MAX_DEPTH:
                raise Invalid("nesting deeper than 64")
        elif ch in "]}":
            depth -= 1


def parse_strict(data: bytes) -> Any:
    """Parse a JSON document under §18.3 (UTF-8, no BOM, no duplicates, finite numbers)."""
    if data.startswith(b"\xef\xbb\xbf"):
        raise Invalid("byte-order mark")
    try:
        text = data.decode("utf-8", errors="strict")
    except UnicodeDecodeError:
        raise Invalid("invalid UTF-8") from None
    _depth_scan(text)
    try:
        v = json.loads(text, object_pairs_hook=_pairs, parse_constant=_const,
                       parse_float=_float, parse_int=_int)
    except (ValueError, RecursionError) as e:
        raise Invalid(f"not JSON: {e}") from None
    _check_strings_depth(v)
    return v


# O_NOFOLLOW: a link is a foreign entry, never followed; O_NONBLOCK: opening a FIFO must not hang
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def read_file(path: str, limit: int) -> bytes:
    """Read a regular file without following links.

    NotRegular for anything but a regular file, Invalid when larger than ``limit``,
    StorageError for I/O failures; FileNotFoundError passes through.
    """
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NotRegular(path) from None
        raise StorageError(f"{path}: {e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(path)
        if st.st_size > limit:
            raise Invalid(f"larger than {limit} bytes")
        chunks, total = [], 0
        while b := os.read(fd, 1 << 20):
            total += len(b)
            if total > limit:  # grew while read
                raise Invalid(f"larger than {limit} bytes")
            chunks.append(b)
        return b"".join(chunks)
    except OSError as e:
        raise StorageError(f"{path}: {e}") from None
    finally:
        os.close(fd)


def read_doc(path: str, limit: int = DOC_LIMIT) -> Any:
    """The parsed document, or None when it is no JSON document; StorageError passes."""
    try:
        return parse_strict(read_file(path, limit))
    except (Invalid, NotRegular, FileNotFoundError):
        return None


def list_dir(path: str) -> list[str]:
    """Sorted names in a directory; [] if there is none; StorageError otherwise."""
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as e:
        raise StorageError(f"{path}: {e}") from None


# -- small type helpers ------------------------------------------------------------------------
def is_int(v: object) -> bool:
    """A JSON integer (bool is no integer)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: object) -> bool:
    """A JSON number (bool is no number)."""
    return isinstance(v, int | float) and not isinstance(v, bool)


def is_uint53(v: object) -> bool:
    """An integer in 0 .. 2**53 - 1."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAXINT


def matches(rx: re.Pattern[str], v: object) -> bool:
    """A string matched by one of the patterns above."""
    return isinstance(v, str) and rx.fullmatch(v) is not None


def is_ts(v: object) -> bool:
    """A timestamp of the schemas (UTC, ``Z``, up to nanoseconds)."""
    return matches(TS_RE, v)


def is_path(v: object) -> bool:
    """A relative path of §2.2 (portable characters, no ``.``/``..``, at most 8 parts)."""
    return isinstance(v, str) and len(v) <= 2047 and matches(PATH_RE, v) \
        and PATH_BAD_RE.search(v) is None


def is_short_str(v: object, limit: int) -> bool:
    """A string of at most ``limit`` characters."""
    return isinstance(v, str) and len(v) <= limit


def req(cond: object, msg: str) -> None:
    """Raise Invalid(msg) unless ``cond`` holds."""
    if not cond:
        raise Invalid(msg)


# -- versions and times ------------------------------------------------------------------------
def fv_tuple(s: object) -> tuple[str, str] | None:
    """(major, minor) digit strings of a well-formed format_version, or None."""
    if not isinstance(s, str) or s.endswith("\n"):  # re's $ matches before a final newline
        return None
    m = FV_RE.fullmatch(s)
    return (m.group(1), m.group(2)) if m else None


def num_cmp(a: str, b: str) -> int:
    """Compare decimal digit strings without converting them (§16.1: any number of digits)."""
    if len(a) != len(b):
        return -1 if len(a) < len(b) else 1
    return (a > b) - (a < b)


def fv_cmp(t: tuple[str, str], major: int, minor: int) -> int:
    """Compare a format_version of :func:`fv_tuple` with ``major.minor``: -1, 0 or 1."""
    return num_cmp(t[0], str(major)) or num_cmp(t[1], str(minor))


def newer_major(doc: Any) -> bool:
    """A document that claims a MAJOR format version above 1 (it cannot be validated, §16.2)."""
    fv = fv_tuple(doc.get("format_version")) if isinstance(doc, dict) else None
    return fv is not None and num_cmp(fv[0], "1") > 0


def _fraction(ts: str) -> str:
    """The digits after the seconds of a schema timestamp ("" without)."""
    return ts[20:-1] if len(ts) > 20 and ts[19] == "." else ""


def ts_key(ts: str) -> str:
    """Sortable form of a schema timestamp: fraction padded to 9 digits (the order of §3)."""
    return ts[:19] + _fraction(ts).ljust(9, "0")


def iso_seconds(ts: str) -> float:
    """Seconds since the epoch of a schema timestamp (a leap second ``:60`` included)."""
    dt = datetime.strptime(ts[:17], "%Y-%m-%dT%H:%M:").replace(tzinfo=UTC)
    frac = _fraction(ts)
    return dt.timestamp() + int(ts[17:19]) + (int(frac) / 10 ** len(frac) if frac else 0)


def attempt_time(aid: str) -> float:
    """The time an attempt id carries (its writer's clock), -inf when it is no date."""
    ts = aid.split("-")[1]
    try:
        dt = datetime.strptime(ts[:15], "%Y%m%dT%H%M%S").replace(tzinfo=UTC)
    except ValueError:
        return float("-inf")
    return dt.timestamp() + int(ts[15:21]) / 1e6


# -- the commit record (§4.1), checked by hand -------------------------------------------------
MANIFEST_MEMBERS = ("format", "format_version", "attempt_id", "step", "created_at",
                    "committed_at", "producer", "continuation", "files", "tensors", "entries",
                    "must_understand", "extensions")


def _check_continuation(c: Any) -> int:
    """Check ``continuation`` (and R-CONTRACT-2, R-CONTRACT-8); its world size."""
    req(isinstance(c, dict) and set(c) == {"contract", "world_size", "mesh"}, "continuation")
    req(c["contract"] in ("exact", "statistical"), "contract")
    ws = c["world_size"]
    req(is_int(ws) and 1 <= ws <= MAX_WORLD, "world_size")
    mesh = c["mesh"]
    if mesh is not None:
        req(isinstance(mesh, dict) and set(mesh) == {"shape", "dim_names"}, "mesh")
        sh, dn = mesh["shape"], mesh["dim_names"]
        req(isinstance(sh, list) and 1 <= len(sh) <= 64
            and all(is_int(x) and 1 <= x <= MAX_WORLD for x in sh), "mesh.shape")
        req(isinstance(dn, list) and 1 <= len(dn) <= 64
            and all(isinstance(x, str) and 1 <= len(x) <= 64 and NOCTRL_RE.fullmatch(x) for x in dn)
            and len(set(dn)) == len(dn), "mesh.dim_names")  # R-CONTRACT-8
        req(len(sh) == len(dn), "R-CONTRACT-2: mesh lengths")
        req(math.prod(sh) == ws, "R-CONTRACT-2: prod(shape) != world_size")
    return int(ws)


def _check_files(files: Any) -> None:
    """Check ``files``: paths, sizes and block checksums (R-CKSUM-2)."""
    req(isinstance(files, dict), "files")
    for path, rec in files.items():
        req(is_path(path) and not FILES_EXCL_RE.fullmatch(path), f"files key {path!r}")
        req(isinstance(rec, dict) and set(rec) == {"size", "checksum"}, f"file record {path!r}")
        req(is_uint53(rec["size"]), f"size of {path!r}")
        ck = rec["checksum"]
        req(isinstance(ck, dict) and set(ck) == {"algorithm", "block_size", "blocks"}, "checksum")
        req(ck["algorithm"] == "crc32c", "algorithm")
        req(is_int(ck["block_size"]) and ck["block_size"] in BLOCK_SIZES, "block_size")
        bl = ck["blocks"]
        req(isinstance(bl, str) and BLOCKS_RE.fullmatch(bl) is not None, "blocks")
        # one 8-digit CRC per block, ceil(size / block_size) blocks
        req(len(bl) == 8 * (-(-rec["size"] // ck["block_size"])), f"R-CKSUM-2 {path!r}")


def _check_range(r: Any, shape: list[int], files: dict[str, Any]) -> None:
    """Check one range record of a tensor (R-TENSOR-2, R-FILES-2)."""
    req(isinstance(r, dict) and set(r) == {"offsets", "lengths", "file", "name", "codec"},
        "range")
    off, ln = r["offsets"], r["lengths"]
    req(isinstance(off, list) and len(off) <= 64 and all(is_uint53(x) for x in off), "offsets")
    req(isinstance(ln, list) and len(ln) <= 64
        and all(is_int(x) and 1 <= x <= MAXINT for x in ln), "lengths")
    req(is_path(r["file"]), "range file")
    nm = r["name"]
    req(isinstance(nm, str) and 1 <= len(nm) <= 4096 and NOCTRL_RE.fullmatch(nm)
        and nm != "__metadata__", "range name")
    req(r["codec"] in ("none", "zstd"), "codec")
    req(len(off) == len(shape) and len(ln) == len(shape), "R-TENSOR-2 rank")
    req(all(o + n <= d for o, n, d in zip(off, ln, shape, strict=True)), "R-TENSOR-2 bounds")
    req(r["file"] in files, f"R-FILES-2 range file {r['file']!r}")


def _check_tensors(tensors: Any, files: dict[str, Any]) -> None:
    """Check ``tensors``: dtype, shape, size (R-TENSOR-1) and ranges."""
    req(isinstance(tensors, dict), "tensors")
    for key, t in tensors.items():
        req(1 <= len(key) <= 1024 and NOCTRL_RE.fullmatch(key), "tensor key")
        req(isinstance(t, dict) and set(t) == {"dtype", "shape", "ranges"}, f"tensor {key!r}")
        req(isinstance(t["dtype"], str) and t["dtype"] in ITEMSIZE, "dtype")
        shape = t["shape"]
        req(isinstance(shape, list) and len(shape) <= 64 and all(is_uint53(d) for d in shape),
            "shape")
        size = ITEMSIZE[t["dtype"]]
        req(math.prod(shape) * size <= MAXINT, "R-TENSOR-1")
        req(math.prod([d for d in shape if d]) * size <= MAXINT, "R-TENSOR-1")
        ranges = t["ranges"]
        req(isinstance(ranges, list), "ranges")
        if 0 in shape:
            req(not ranges, "zero-size tensor with ranges")
        else:
            req(len(ranges) >= 1, "tensor without ranges")
        if not shape:
            req(len(ranges) <= 1, "0-d tensor with several ranges")
        for r in ranges:
            _check_range(r, shape, files)


def _check_entry_schema(s: Any) -> bool:
    """A built-in schema id or an embedded schema (exactly one of the two)."""
    ok_id = isinstance(s, dict) and set(s) == {"id"} and isinstance(s["id"], str) \
        and s["id"] in BUILTIN_IDS
    ok_emb = isinstance(s, dict) and set(s) == {"json_schema"} \
        and isinstance(s["json_schema"], dict | bool)
    return ok_id != ok_emb


def _check_entries(entries: Any, files: dict[str, Any], ws: int) -> None:
    """Check ``entries``: names, schemas, scopes and values (R-ENTRY-7..9, R-FILES-2)."""
    req(isinstance(entries, dict), "entries")
    for name, e in entries.items():
        req(len(name) <= 256 and ENTRY_NAME_RE.fullmatch(name) and not ENTRY_NAME_BAD_RE.search(name),
            "entry name")
        req(isinstance(e, dict) and {"schema", "scope", "encoding", "values"} <= set(e)
            and set(e) <= {"schema", "scope", "world_size_policy", "encoding", "values"}, "entry")
        req(_check_entry_schema(e["schema"]), "entry schema")
        req(e["scope"] in ("global", "per_rank"), "scope")
        req(e["encoding"] in ("json", "json+zstd"), "encoding")
        vals = e["values"]
        req(isinstance(vals, list) and len(vals) >= 1, "values")
        for v in vals:
            req(isinstance(v, dict) and "file" in v and set(v) <= {"file", "rank"}, "value")
            req(is_path(v["file"]), "value file")
            if "rank" in v:
                req(is_int(v["rank"]) and 0 <= v["rank"] <= MAX_WORLD - 1, "rank")
            req(v["file"] in files, f"R-FILES-2 value file {v['file']!r}")
        if e["scope"] == "global":
            req("world_size_policy" not in e, "global with world_size_policy")
            req(len(vals) == 1 and "rank" not in vals[0], "R-ENTRY-7")
        else:
            req(e.get("world_size_policy") in WORLD_SIZE_POLICIES, "world_size_policy")
            req(all("rank" in v for v in vals), "per_rank value without rank")
            ranks = [v["rank"] for v in vals]
            req(len(set(ranks)) == len(ranks) and all(r < ws for r in ranks), "R-ENTRY-9")
            # a missing rank breaks a rule of the record alone: invalid, not foreign
            req(len(ranks) == ws, "R-ENTRY-8 missing rank")


def check_manifest(m: dict[str, Any], attempt_id: str) -> None:
    """Check a commit record of format 1.x against the schema and §4.1; raise Invalid."""
    for k in MANIFEST_MEMBERS:
        req(k in m, f"missing member {k}")
    req(FV_SCHEMA_RE.fullmatch(m["format_version"]) is not None, "format_version outside schema")
    req(matches(ATTEMPT_RE, m["attempt_id"]), "attempt_id")
    req(is_int(m["step"]) and 0 <= m["step"] <= 999999999999, "step")
    req(is_ts(m["created_at"]), "created_at")
    req(is_ts(m["committed_at"]), "committed_at")
    p = m["producer"]
    req(isinstance(p, dict) and "name" in p and "version" in p, "producer")
    for k in ("name", "version"):
        req(isinstance(p[k], str) and 1 <= len(p[k]) <= 256, "producer." + k)
    ws = _check_continuation(m["continuation"])
    files = m["files"]
    _check_files(files)
    tensors = m["tensors"]
    _check_tensors(tensors, files)
    _check_entries(m["entries"], files, ws)
    mu = m["must_understand"]
    req(isinstance(mu, list) and all(matches(MU_RE, x) for x in mu)
        and len(set(mu)) == len(mu), "must_understand")
    ex = m["extensions"]
    req(isinstance(ex, dict) and all(MU_RE.fullmatch(k) for k in ex), "extensions")
    # a 1.0 record ignores a tensor_table member (R-VERSION-6); 1.1 defines it (§8.5)
    if m["format_version"] != "1.0" and "tensor_table" in m:
        tt = m["tensor_table"]
        req(isinstance(tt, dict) and set(tt) == {"file", "codec"}, "tensor_table")
        req(is_path(tt["file"]) and tt["codec"] in ("none", "zstd"), "tensor_table members")
        req(not tensors and "tensor-table" in mu, "tensor_table rules")
        req(tt["file"] in files, "tensor_table file not in files")
    req(m["attempt_id"] == attempt_id, "R-ID-3 attempt_id differs from directory")
    req(m["step"] == int(attempt_id[1:13]), "R-ID-3 step differs")


def classify_record(data: bytes, attempt_id: str) -> tuple[str, str | None, dict[str, Any] | None]:
    """(class, why, record) of a commit record read in full, in §16.3's order.

    ``committed`` (why None), ``invalid`` (record None) or ``foreign``: a MAJOR other than 1,
    an extension it does not implement, or a newer version that fails the checks of 1.x.
    """
    try:
        m = parse_strict(data)
    except Invalid as e:
        return "invalid", str(e), None
    if not isinstance(m, dict):
        return "invalid", "not an object", None
    if m.get("format") != "portable-ckpt":
        return "invalid", "format is not portable-ckpt", None
    fv = fv_tuple(m.get("format_version"))
    if fv is None:
        return "invalid", "format_version missing or malformed", None
    if fv[0] != "1":  # MAJOR 0 too: not a version this gc implements
        return "foreign", f"MAJOR {fv[0]}", m
    mu = m.get("must_understand")
    if isinstance(mu, list):
        for x in mu:
            if not (isinstance(x, str) and x in IMPLEMENTED_EXTENSIONS):
                return "foreign", f"must_understand names {x!r}", m
    try:
        check_manifest(m, attempt_id)
    except Invalid as e:
        if fv_cmp(fv, *NEWEST) > 0:  # a newer MINOR may add what 1.2's checks refuse
            return "foreign", f"newer version {m['format_version']} failing checks: {e}", m
        return "invalid", str(e), None
    return "committed", None, m


# -- records after commit (§14.3, §14.5), pins (§15.3), deletion marks (§15.2) -----------------
def _record_head(d: Any, fmt: str, members: tuple[str, ...], id_member: str,
                 id_re: re.Pattern[str]) -> bool:
    """What every record schema asks alike: its members, format, a 1.x version and its ids."""
    return (isinstance(d, dict) and all(k in d for k in members)
            and d["format"] == fmt and matches(FV_SCHEMA_RE, d["format_version"])
            and matches(id_re, d[id_member]) and matches(ATTEMPT_RE, d["attempt_id"]))


def valid_error_record(e: Any) -> bool:
    """An error of a drill or verification record: ``{code, message}``."""
    return isinstance(e, dict) and "code" in e and "message" in e \
        and matches(ERRCODE_RE, e["code"]) and is_short_str(e["message"], 65536)


DRILL_MEMBERS = ("format", "format_version", "attempt_id", "drill_id", "ok", "started_at",
                 "finished_at", "world_size", "saved_world_size", "contract", "measurements",
                 "error")


def drill_valid(d: Any) -> bool:
    """``drill.schema.json``, by hand."""
    if not _record_head(d, "portable-ckpt-drill", DRILL_MEMBERS, "drill_id", DRILL_ID_RE):
        return False
    if not isinstance(d["ok"], bool) or not is_ts(d["started_at"]) or not is_ts(d["finished_at"]):
        return False
    if not all(is_int(d[k]) and 1 <= d[k] <= MAX_WORLD
               for k in ("world_size", "saved_world_size")):
        return False
    if d["contract"] not in ("exact", "statistical"):
        return False
    ms = d["measurements"]
    if not isinstance(ms, dict):
        return False
    for k in ("restore_seconds", "restore_mib_per_s", "slowest_rank_seconds",
              "first_step_seconds"):
        if k in ms and not (is_num(ms[k]) and ms[k] >= 0):
            return False
    if "restore_bytes" in ms and not is_uint53(ms["restore_bytes"]):
        return False
    peak = ms.get("peak_temp_bytes_per_rank", [])
    if not (isinstance(peak, list) and all(is_uint53(x) for x in peak)):
        return False
    err = d["error"]
    if not (err is None or valid_error_record(err)):
        return False
    # ok and error go together: an error exactly when the drill failed
    return (d["ok"] is True) == (err is None)


def drill_counts(d: Any, drill_id_file: str, attempt_id: str) -> bool:
    """R-DRILL-4: a drill counts when it validates, has its own id, names the attempt, passed."""
    return drill_valid(d) and d["drill_id"] == drill_id_file and d["attempt_id"] == attempt_id \
        and d["ok"] is True


VERIFICATION_MEMBERS = ("format", "format_version", "attempt_id", "verification_id",
                        "verified_at", "ok", "mode", "chunks", "errors")


def verification_valid(v: Any) -> bool:
    """``verification.schema.json`` of 1.2 (that of 1.0 with ``clears``), by hand."""
    if not _record_head(v, "portable-ckpt-verification", VERIFICATION_MEMBERS,
                        "verification_id", VER_ID_RE):
        return False
    if not is_ts(v["verified_at"]) or not isinstance(v["ok"], bool):
        return False
    if v["mode"] not in ("sample", "deep"):
        return False
    if "fraction" in v and not (v["fraction"] is None or (is_num(v["fraction"])
                                                          and 0 < v["fraction"] <= 1)):
        return False
    if not is_uint53(v["chunks"]):
        return False
    if "seed" in v and not (v["seed"] is None or (is_int(v["seed"]) and v["seed"] >= 0)):
        return False
    if "verifier" in v and not is_short_str(v["verifier"], 1024):
        return False
    errs = v["errors"]
    if not (isinstance(errs, list) and len(errs) <= 1024
            and all(valid_error_record(e) for e in errs)):
        return False
    if (v["ok"] is True) == bool(errs):  # errors exactly when it failed
        return False
    if v["mode"] == "sample" and not is_num(v.get("fraction")):
        return False
    # clears is a member of passed deep records of 1.2 and later only (§14.5)
    if "clears" in v and v["ok"] is True and v["mode"] == "deep" \
            and v["format_version"] not in ("1.0", "1.1"):
        c = v["clears"]
        if not (isinstance(c, list) and 1 <= len(c) <= 1024 and len(set(map(repr, c))) == len(c)
                and all(matches(VER_ID_RE, x) for x in c)):
            return False
    return True


def _reason_and_by(d: dict[str, Any]) -> bool:
    """The optional members that pins and deletion marks share."""
    return ("reason" not in d or is_short_str(d["reason"], 1024)) \
        and ("by" not in d or is_short_str(d["by"], 256))


def pin_valid(p: Any) -> bool:
    """``pin.schema.json``, by hand."""
    return _record_head(p, "portable-ckpt-pin",
                        ("format", "format_version", "pin_id", "attempt_id", "pinned_at"),
                        "pin_id", PIN_ID_RE) \
        and is_ts(p["pinned_at"]) and _reason_and_by(p)


def deletion_valid(d: Any) -> bool:
    """``deletion.schema.json``, by hand."""
    return _record_head(d, "portable-ckpt-deletion",
                        ("format", "format_version", "deletion_id", "attempt_id", "started_at"),
                        "deletion_id", DEL_ID_RE) \
        and is_ts(d["started_at"]) and _reason_and_by(d)


def deletion_marks(adir: str, aid: str) -> list[tuple[str, float]]:
    """[(path, mtime)] of the deletion marks that count (R-GC-13); StorageError passes."""
    d = os.path.join(adir, "deleting")
    try:
        st = os.lstat(d)
    except FileNotFoundError:
        return []
    except OSError as e:
        raise StorageError(str(e)) from None
    if not stat.S_ISDIR(st.st_mode):
        return []
    marks = []
    for name in list_dir(d):
        mid = name.removesuffix(".json")
        if mid == name or not DEL_ID_RE.fullmatch(mid):
            continue
        p = os.path.join(d, name)
        doc = read_doc(p)
        if not isinstance(doc, dict) or doc.get("deletion_id") != mid \
                or doc.get("attempt_id") != aid:
            continue  # not stored under its own id, or names another attempt
        # a mark of a newer MAJOR cannot be validated: its format decides (errata 19)
        if deletion_valid(doc) or (newer_major(doc)
                                   and doc.get("format") == "portable-ckpt-deletion"):
            try:
                marks.append((p, os.lstat(p).st_mtime))
            except OSError as e:
                raise StorageError(str(e)) from None
    return marks


def verification_status(adir: str, aid: str) -> tuple[str, str | None]:
    """(``ok`` | ``failed``, None) or (``unknown``, why) of a committed version (§14.5)."""
    vdir = os.path.join(adir, "verifications")
    counting: list[dict[str, Any]] = []
    unknown = None
    for name in list_dir(vdir):
        vid = name.removesuffix(".json")
        if vid == name or not VER_ID_RE.fullmatch(vid):
            continue
        doc = read_doc(os.path.join(vdir, name))
        if not isinstance(doc, dict):
            continue
        if newer_major(doc):
            # a record of a newer MAJOR may say the version failed: its status is unknown
            # (taking precedence over failed)
            if doc.get("verification_id") == vid and doc.get("attempt_id") == aid:
                unknown = f"record {name} of a newer MAJOR"
            continue
        if verification_valid(doc) and doc["verification_id"] == vid \
                and doc["attempt_id"] == aid:
            counting.append(doc)
    if unknown:
        return "unknown", unknown
    cleared: set[str] = set()
    for v in counting:  # a passed deep record of 1.2 or later clears failed ones (R-DRILL-10)
        fv = fv_tuple(v["format_version"])
        if v["ok"] is True and v["mode"] == "deep" and fv is not None and fv_cmp(fv, 1, 2) >= 0 \
                and isinstance(v.get("clears"), list):
            cleared.update(x for x in v["clears"] if isinstance(x, str))
    failed = any(v["ok"] is False and v["verification_id"] not in cleared for v in counting)
    return ("failed" if failed else "ok"), None


def is_drilled(adir: str, aid: str) -> bool:
    """Whether the version holds a drill record that counts (§14.3, R-DRILL-4)."""
    ddir = os.path.join(adir, "drills")
    for name in list_dir(ddir):
        if name.endswith(".json") and drill_counts(read_doc(os.path.join(ddir, name)),
                                                   name[:-5], aid):
            return True
    return False


def _read_pin(path: str) -> tuple[str, Any]:
    """(``gone``|``notregular``, None), (``doc``, parsed) or (``bad``, bytes); StorageError passes."""
    try:
        data = read_file(path, DOC_LIMIT)
    except FileNotFoundError:
        return "gone", None
    except NotRegular:
        return "notregular", None
    try:
        return "doc", parse_strict(data)
    except Invalid:
        return "bad", data


def _pin_counts(doc: Any, pid: str) -> bool:
    if not isinstance(doc, dict):
        return False
    if pin_valid(doc) and doc["pin_id"] == pid:
        return True
    # a pin of a newer MAJOR cannot be validated: it still holds the attempt it names
    return newer_major(doc) and doc.get("format") == "portable-ckpt-pin" \
        and doc.get("pin_id") == pid and isinstance(doc.get("attempt_id"), str)


def read_pins(root: str) -> tuple[set[str], str | None]:
    """(pinned attempt ids, None), or (ids, why) when a pin may be unreadable (R-GC-11)."""
    pdir = os.path.join(root, "pins")
    try:
        st = os.lstat(pdir)
    except FileNotFoundError:
        return set(), None
    except OSError as e:
        return set(), f"pins: {e}"
    if not stat.S_ISDIR(st.st_mode):
        return set(), "root child pins is not a directory"
    try:
        names = sorted(os.listdir(pdir))
    except OSError as e:
        return set(), f"listing pins/: {e}"
    pinned: set[str] = set()
    why = None
    for name in names:
        pid = name.removesuffix(".json")
        if pid == name or not PIN_ID_RE.fullmatch(pid):
            continue  # only files named like a pin are pins
        p = os.path.join(pdir, name)
        try:
            first = _read_pin(p)
            if first[0] == "notregular":
                why = f"pins/{name} is not a regular file"
                continue
            if first[0] == "gone":  # unpinned meanwhile
                continue
            if first[0] == "doc" and _pin_counts(first[1], pid):
                pinned.add(first[1]["attempt_id"])
                continue
            # does not count: read it a second time, a pin being written may have been half
            # there (R-GC-11)
            second = _read_pin(p)
        except StorageError as e:
            why = f"pin {name}: {e}"
            continue
        if second != first and second[0] != "gone":
            why = f"pin {name} read twice differently"
    return pinned, why


# -- classifying attempts (§15.1) --------------------------------------------------------------
@dataclass
class Attempt:
    """One child of the root named like an attempt id, and what gc learnt of it."""

    id: str
    dir: str
    cls: str = "unknown"  # committed, incomplete, invalid, foreign, stray or unknown
    why: str | None = None
    #: manifest.json is there in some form (a deletion mark is due before it is deleted)
    has_record: bool = False
    #: no record, but a deletion mark that counts: a version being deleted (R-GC-13)
    marked: bool = False
    #: (path, mtime) of its regular files and foreign entries, for its last activity (R-GC-4)
    files: list[tuple[str, float]] = field(default_factory=list)
    foreign: list[tuple[str, float]] = field(default_factory=list)
    # committed versions only:
    vstatus: str = ""  # verification status: ok, failed or unknown
    vwhy: str | None = None
    drilled: bool = False
    committed_at: str = ""
    key: tuple[int, str, str] = (0, "", "")  # the order of §3: step, committed_at, id
    record_mtime: float = 0.0


def walk_files(adir: str) -> tuple[list[tuple[str, float]], list[tuple[str, float]], list[str]]:
    """(regular files, foreign entries, directories) below adir, without following links."""
    files: list[tuple[str, float]] = []
    foreign: list[tuple[str, float]] = []
    dirs: list[str] = []

    def walk(d: str) -> None:
        for name in list_dir(d):
            p = os.path.join(d, name)
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise StorageError(str(e)) from None
            if stat.S_ISDIR(st.st_mode):
                dirs.append(p)
                walk(p)
            elif stat.S_ISREG(st.st_mode):
                files.append((p, st.st_mtime))
            else:
                foreign.append((p, st.st_mtime))

    walk(adir)
    return files, foreign, dirs


def _classify_without_record(a: Attempt) -> None:
    """Classify an attempt whose ``manifest.json`` the storage says does not exist."""
    if "manifest.json" in list_dir(a.dir):  # a listing must not contradict the not-found
        a.cls, a.why = "unknown", "manifest.json listed but not found"
        return
    marks = deletion_marks(a.dir, a.id)
    a.files, a.foreign, _ = walk_files(a.dir)
    if marks:
        a.cls, a.why, a.marked = "incomplete", "holds a deletion mark", True
        return
    tops = [os.path.relpath(p, a.dir).split(os.sep)[0] for p, _ in a.files + a.foreign]
    has_rec = any(t in RECORD_DIRS for t in tops)
    has_other = any(t not in RECORD_DIRS for t in tops)
    if has_rec and has_other:  # records are written into committed versions only
        a.cls, a.why = "invalid", "commit record lost (records and files)"
    else:
        a.cls = "incomplete"


def classify(root: str, aid: str) -> Attempt:
    """The class of one attempt (§15.1) and the facts retention needs."""
    a = Attempt(aid, os.path.join(root, aid))
    mp = os.path.join(a.dir, "manifest.json")
    try:
        try:
            data = read_file(mp, MANIFEST_LIMIT)
        except FileNotFoundError:
            _classify_without_record(a)
            return a
        except NotRegular:  # a link, FIFO, directory ...: no record can be read (R-GC-14)
            a.cls, a.why, a.has_record = "stray", "manifest.json is not a regular file", True
            return a
        except Invalid as e:  # too large to be a record
            a.cls, a.why, a.has_record = "invalid", str(e), True
            return a
        a.has_record = True
        a.cls, a.why, m = classify_record(data, aid)
        if a.cls == "invalid":
            a.files, a.foreign, _ = walk_files(a.dir)
        elif a.cls == "committed" and m is not None:
            a.vstatus, a.vwhy = verification_status(a.dir, aid)
            a.drilled = is_drilled(a.dir, aid)
            a.committed_at = m["committed_at"]
            a.key = (m["step"], ts_key(a.committed_at), aid)
            a.record_mtime = os.lstat(mp).st_mtime
    except StorageError as e:  # could not read is never abandoned (R-GC-6)
        a.cls, a.why = "unknown", str(e)
    return a


def activity(a: Attempt, now: float) -> float:
    """The time of an attempt's most recent activity (R-GC-4): its id and its files."""
    t = attempt_time(a.id)
    if t > now + CLOCK_AHEAD_SECONDS:  # written by a host whose clock was ahead: no date
        t = float("-inf")
    for _, mt in a.files + a.foreign:
        t = max(t, mt)
    return t


# -- the storage's clock (§15.2, clock probe) --------------------------------------------------
def storage_now(root: str) -> float:
    """The storage's time now: the modification time of a probe file it stamps."""
    name = os.path.join(root, f".pck-clock-{secrets.token_hex(8)}")
    try:
        os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        try:
            return os.lstat(name).st_mtime
        finally:
            os.unlink(name)
    except OSError:
        return time.time()


# -- deletion (R-GC-3, R-GC-13) ----------------------------------------------------------------
@dataclass
class Report:
    """What one run did and found; printed as JSON. ``reports`` and ``errors`` make exit 1."""

    root: str
    deleted: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)  # attempt id: the first rule keeping it
    reports: list[str] = field(default_factory=list)
    #: the attempts ``reports`` name (the protocol's report line, conformance/README.md "gc")
    reported: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    foreign_entries: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    classes: dict[str, str] = field(default_factory=dict)

    def keep(self, a: Attempt, why: str) -> None:
        """Keep an attempt; the first reason given stays."""
        self.kept.setdefault(a.id, why)

    def report_invalid(self, a: Attempt, how: str = "") -> None:
        """Report an invalid attempt that is kept (R-GC-10)."""
        self.reports.append(f"R-GC-10: invalid attempt {a.id} kept{how}: {a.why}")
        self.reported.append(a.id)


def _fsync_dir(d: str) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass  # best effort: not every file system lets a directory be synced


def new_id(letter: str) -> str:
    """A record id of §14.3: a letter, the UTC time to microseconds, 8 hex digits."""
    now = datetime.now(UTC)
    return f"{letter}{now.strftime('%Y%m%dT%H%M%S%f')}Z-{secrets.token_hex(4)}"


def store_mark(adir: str, aid: str) -> str:
    """Store a deletion mark in the attempt, created exclusively and durable; its path.

    Raises OSError when it cannot be stored.
    """
    d = os.path.join(adir, "deleting")
    try:
        os.mkdir(d)
        _fsync_dir(adir)
    except FileExistsError:
        pass
    did = new_id("g")
    doc = {"format": "portable-ckpt-deletion", "format_version": "1.0", "deletion_id": did,
           "attempt_id": aid,
           "started_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
           "by": "minimal_gc"}
    p = os.path.join(d, did + ".json")
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, json.dumps(doc).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    _fsync_dir(d)
    return p


def _order(adir: str, path: str) -> int:
    """R-GC-3's order after the commit record: records, indexes, data and entries, marks."""
    top = os.path.relpath(path, adir).split(os.sep)[0]
    if top in RECORD_DIRS:
        return 0
    return {"index": 1, "deleting": 3}.get(top, 2)


def _remove_record(adir: str, aid: str, now: float, report: Report) -> bool:
    """Store (or reuse) a deletion mark, then delete ``manifest.json``; False to stop."""
    try:
        young = [p for p, mt in deletion_marks(adir, aid) if now - mt < MARK_REUSE_SECONDS]
    except StorageError:
        young = []
    reused = young[0] if young else None
    mark = reused
    if mark is None:
        try:
            mark = store_mark(adir, aid)
        except OSError as e:
            # a full storage may be freed without a mark: a gc that cannot free it fails forever
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                report.errors.append(f"{aid}: cannot store deletion mark: {e}")
                return False
    mp = os.path.join(adir, "manifest.json")
    try:
        os.unlink(mp)
    except FileNotFoundError:
        pass
    except OSError as e:
        if os.path.lexists(mp) and mark and mark != reused:  # the record is there: no mark
            try:
                os.unlink(mark)
            except OSError:
                pass
        report.errors.append(f"{aid}: cannot delete manifest.json: {e}")
        return False
    _fsync_dir(adir)
    if mark and not os.path.exists(mark):  # cleared meanwhile by another gc: store it again
        try:
            store_mark(adir, aid)
        except OSError:
            pass
    return True


def delete_attempt(adir: str, aid: str, has_record: bool, now: float, report: Report) -> bool:
    """Delete one attempt; True when every file went (foreign entries stay, R-LAYOUT-7)."""
    if has_record and not _remove_record(adir, aid, now, report):
        return False
    try:
        files, foreign, dirs = walk_files(adir)
    except StorageError as e:
        report.errors.append(f"{aid}: {e}")
        return False
    ok = True
    for p, _ in sorted(files, key=lambda f: (_order(adir, f[0]), f[0])):
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
        except OSError as e:
            report.errors.append(f"{p}: {e}")
            ok = False
    for d in [*sorted(dirs, key=len, reverse=True), adir]:
        try:
            os.rmdir(d)
        except OSError:
            pass  # holds a foreign entry (kept) or a file that could not be deleted
    report.foreign_entries.extend(p for p, _ in foreign)
    return ok


# -- the rules of §15.2 ------------------------------------------------------------------------
def list_attempts(root: str, names: list[str], report: Report) -> list[Attempt]:
    """Classify every child of the root named like an attempt id (§15.1)."""
    attempts = []
    for name in sorted(names):
        if not ATTEMPT_RE.fullmatch(name):
            continue
        p = os.path.join(root, name)
        try:
            st = os.lstat(p)
        except OSError as e:
            attempts.append(Attempt(name, p, "unknown", str(e)))
            continue
        if not stat.S_ISDIR(st.st_mode):
            report.foreign_entries.append(p)  # a link, file, FIFO named like one: left alone
            continue
        attempts.append(classify(root, name))
    return attempts


def retire_abandoned(committed: list[Attempt], pinned: set[str], report: Report) -> set[str]:
    """Ids of the abandoned versions to retire (§15.2, optional); keeps the refused ones."""
    retired = set()
    for v in committed:
        # a later commit of a step no greater (a rollback) makes v abandoned
        newer = [w for w in committed if w is not v and w.key[0] <= v.key[0]
                 and w.key[1] > v.key[1]]
        if not newer:
            continue
        if v.id in pinned:
            report.reports.append(f"{v.id} is abandoned (rollback) but pinned: kept")
            report.reported.append(v.id)
            continue
        if v.vstatus == "unknown":
            continue
        # committed_at is the committing host's clock: retire only when the storage's times
        # of the two records agree with it
        if not any(abs((iso_seconds(w.committed_at) - iso_seconds(v.committed_at))
                       - (w.record_mtime - v.record_mtime)) <= RETIRE_TOLERANCE_SECONDS
                   for w in newer):
            # keep it, and the later commit that made it look abandoned (the branch a
            # rollback may be training on), so that a refused retirement does not delete
            # the newest commit instead
            report.reports.append(f"{v.id} looks abandoned but the record times disagree "
                                  "with committed_at: kept")
            report.reported.append(v.id)
            report.keep(v, "abandoned? times disagree")
            report.keep(max(newer, key=lambda x: x.key[1]),
                        "newest commit of a branch whose retirement was refused")
            continue
        retired.add(v.id)
    return retired


def retain(cands: list[Attempt], keep: int, report: Report) -> None:
    """Keep what R-GC-1, R-GC-2 and R-GC-9 keep of the versions that take a place."""
    cands = sorted(cands, key=lambda a: a.key, reverse=True)  # greatest first (§3)
    for a in cands[:keep]:
        report.keep(a, f"R-GC-1: among the {keep} greatest")
    drilled = [a for a in cands if a.drilled]
    if drilled:
        report.keep(drilled[0], "R-GC-2: newest drilled")
    elif cands:
        report.keep(cands[0], "R-GC-2: newest (none drilled)")
    not_failed = [a for a in cands if a.vstatus != "failed"]
    for a in not_failed[:keep]:
        report.keep(a, f"R-GC-9: among the {keep} greatest that did not fail")
    if not drilled and not_failed:
        report.keep(not_failed[0], "R-GC-9: greatest that did not fail")


def _grace_passed(a: Attempt, now: float, grace: float) -> bool:
    # strictly more than grace seconds: the safe side of R-GC-4's "at least"
    return now - activity(a, now) > grace


def to_delete(attempts: list[Attempt], pinned: set[str], pins_unreadable: str | None,
              delete_invalid: bool, grace: float, now: float, report: Report) -> list[Attempt]:
    """Of the attempts not kept yet, those the rules let go; keeps the others."""
    out = []
    for a in attempts:
        if a.id in report.kept:
            continue
        if a.id in pinned:  # a pin holds any attempt it names, a version or not (R-PIN-2)
            report.keep(a, "pinned (R-PIN-2)")
            if a.cls == "invalid":
                report.report_invalid(a, " (pinned)")
            continue
        if pins_unreadable and (a.has_record or a.marked):  # it may be pinned (R-GC-11)
            report.keep(a, "R-GC-11: pins unreadable")
            if a.cls == "invalid":
                report.report_invalid(a)
            continue
        if a.cls == "committed":
            out.append(a)
        elif a.cls == "invalid" and not delete_invalid:
            report.keep(a, "invalid (R-GC-10)")
            report.report_invalid(a)
        elif a.cls in ("invalid", "incomplete"):
            if _grace_passed(a, now, grace):
                out.append(a)
            else:
                report.keep(a, f"{a.cls}, within its grace period (R-GC-4)")
    return out


def delete_all(doomed: list[Attempt], root: str, now: float, report: Report) -> None:
    """Delete the attempts the rules let go, looking at the pins again as it goes (§15.3)."""
    pins_read = time.monotonic()
    for a in doomed:
        if (a.has_record or a.marked) and time.monotonic() - pins_read > 1.0:
            # a pin may have been stored since: reading pins/ again narrows that race
            pinned, why = read_pins(root)
            pins_read = time.monotonic()
            if a.id in pinned or why:
                report.keep(a, "pinned meanwhile" if a.id in pinned else f"R-GC-11: {why}")
                if why:
                    report.reports.append(f"R-GC-11: {why}")
                continue
        # an invalid attempt without a record (a lost one) gets a mark too: it held a version
        if delete_attempt(a.dir, a.id, a.has_record or a.cls != "incomplete", now, report):
            report.deleted.append(a.id)
        else:
            report.reports.append(f"{a.id}: deletion failed")


def gc(job: dict[str, Any]) -> int:
    """Run one gc job on its root; print the report; the exit status (0, 1 or 2)."""
    root = job["root"]
    keep = job.get("keep", 1)
    grace = job.get("grace_seconds", 3600)
    delete_invalid = bool(job.get("delete_invalid", False))
    retire = bool(job.get("retire_abandoned", False))
    if not is_int(keep) or keep < 1 or not is_num(grace) or not math.isfinite(grace) or grace < 0:
        print(json.dumps({"error": "keep must be >= 1, grace a finite number >= 0"}))
        return 2
    report = Report(root)
    now = storage_now(root)
    try:
        names = os.listdir(root)
    except OSError as e:
        report.errors.append(f"cannot list root: {e}")
        print(json.dumps(asdict(report), sort_keys=True))  # one line: the protocol's report line
        return 1
    attempts = list_attempts(root, names, report)
    pinned, pins_unreadable = read_pins(root)
    if pins_unreadable:
        report.reports.append(f"R-GC-11: {pins_unreadable}; no attempt with a commit record is "
                              "deleted")

    for a in attempts:  # what gc could not read, or cannot read as a version, stays
        if a.cls == "unknown":
            report.keep(a, f"unknown: {a.why}")
            report.reports.append(f"R-GC-6: {a.id} could not be classified: {a.why}")
            report.reported.append(a.id)
        elif a.cls == "foreign":
            report.keep(a, "foreign (R-GC-7)")
        elif a.cls == "stray":  # reported as foreign entries are, no exit 1 (R-GC-14)
            report.keep(a, "stray (R-GC-14)")
            report.foreign_entries.append(os.path.join(a.dir, "manifest.json"))
    committed = [a for a in attempts if a.cls == "committed"]
    for a in committed:
        if a.vstatus == "unknown":
            report.keep(a, "verification status unknown (R-GC-12)")
            report.reports.append(f"R-GC-12: {a.id} verification status unknown: {a.vwhy}")
            report.reported.append(a.id)
        if a.id in pinned:
            report.keep(a, "pinned (R-PIN-2)")

    retired = retire_abandoned(committed, pinned, report) if retire else set()
    # pinned and unknown-status versions take no place among the kept ones: removing a
    # candidate only raises the rank of the others
    retain([a for a in committed if a.id not in pinned and a.vstatus != "unknown"
            and a.id not in retired], keep, report)
    doomed = to_delete(attempts, pinned, pins_unreadable, delete_invalid, grace, now, report)

    delete_all(doomed, root, now, report)
    report.classes = {a.id: a.cls for a in attempts}
    if report.foreign_entries:
        report.warnings.append("foreign entries left in place (R-LAYOUT-7)")
    print(json.dumps(asdict(report), sort_keys=True))  # one line: the protocol's report line
    return 1 if (report.reports or report.errors) else 0


def main(argv: list[str]) -> int:
    """Run the job whose path is ``argv[-1]``; the exit status."""
    if len(argv) < 2:
        print("usage: minimal_gc.py JOB.json", file=sys.stderr)
        return 2
    try:
        with open(argv[-1], encoding="utf-8") as f:
            job = json.load(f)
    except (OSError, ValueError) as e:
        print(f"cannot read job: {e}", file=sys.stderr)
        return 2
    if not isinstance(job, dict) or job.get("op") != "gc" or "root" not in job:
        print("not a gc job", file=sys.stderr)
        return 2
    return gc(job)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
