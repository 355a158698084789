#!/usr/bin/env python3
"""A minimal portable-ckpt 1.0/1.1 writer and committer, written from spec/README.md alone.

It imports only the Python standard library: no portable_ckpt, no numpy, no safetensors
package, no crc32c or zstandard package. It exists to prove that the specification is enough to
write compatible checkpoints; it passes ``python -m conformance writer -- python
conformance/examples/minimal_writer.py``.

* CRC-32C is computed in pure Python with a 256-entry table (spec §6.2: reflected polynomial
  0x82F63B78, init and final XOR 0xFFFFFFFF; check value of b"123456789" is e3069283). Slow
  (about 5 MB/s) but fine for conformance-sized data.
* Safetensors files are written by hand (spec §11.1): u64 LE header length, JSON header padded
  with spaces to a multiple of 8, tensors packed without gaps.
* Codec ``zstd`` and encoding ``json+zstd`` use Zstandard frames made of *raw* (uncompressed)
  blocks (RFC 8878 §3.1.1.2, Block_Type 0) with the Frame_Content_Size field set. Such frames are
  valid Zstandard: any decoder reads them. They just do not compress.
* Publishing follows §4.3: temp file, fsync, link(), unlink, fsync of the directory.
* Tensor tables (format 1.1, §8.5): the committer writes the manifest's tensor entries as a
  tensor table (ten columns packed with ``struct``, codec ``none`` or a raw-block zstd frame)
  when the commit job asks for one (``"tensor_table": true``, codec ``"table_codec"``) or when
  the checkpoint has more than ``TABLE_THRESHOLD`` range records (R-TABLE-9 asks for a table only
  above the size limits of R-SEC-11; this writer switches far earlier); the manifest is then
  ``format_version`` 1.1 with ``must_understand: ["tensor-table"]`` (R-TABLE-2), otherwise 1.0
  (R-VERSION-2). A tensor of a dtype of format 1.3 (§7) makes its writer index and the manifest
  1.3, and the manifest lists that dtype's extension in ``must_understand`` (R-VERSION-7). Writer indexes stay JSON. Every range is stored under its implied name
  ``key@offsets`` (R-TABLE-7), so the committer can choose either form after the data is written.

Usage (adapter protocol of conformance/README.md): ``minimal_writer.py JOB.json``.
"""

from __future__ import annotations

import calendar
import json
import math
import os
import struct
import sys
import time
from pathlib import Path
from typing import Any

# -- spec §7: dtype table --------------------------------------------------------------------
DTYPES = {
    "float64": ("F64", 8), "float32": ("F32", 4), "float16": ("F16", 2), "bfloat16": ("BF16", 2),
    "int64": ("I64", 8), "int32": ("I32", 4), "int16": ("I16", 2), "int8": ("I8", 1),
    "uint8": ("U8", 1), "uint16": ("U16", 2), "uint32": ("U32", 4), "uint64": ("U64", 8),
    "bool": ("BOOL", 1), "float8_e4m3fn": ("F8_E4M3", 1), "float8_e5m2": ("F8_E5M2", 1),
    "float8_e8m0fnu": ("F8_E8M0", 1), "float8_e4m3fnuz": ("F8_E4M3FNUZ", 1),
    "float8_e5m2fnuz": ("F8_E5M2FNUZ", 1), "complex64": ("C64", 8),
}
#: the rows of format 1.3 and the extension that announces each (§7, §16.2, R-VERSION-7).
LATER_DTYPES = {
    "float8_e8m0fnu": "dtype-float8-e8m0fnu", "float8_e4m3fnuz": "dtype-float8-e4m3fnuz",
    "float8_e5m2fnuz": "dtype-float8-e5m2fnuz", "complex64": "dtype-complex64",
}
BLOCK_SIZE = 4096
CRASH = 3
#: more range records than this and the manifest holds them in a tensor table (§8.5).
TABLE_THRESHOLD = 32


class Fail(Exception):
    """A committer check failed: (spec error code, message)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# -- spec §6.2: CRC-32C ----------------------------------------------------------------------
def _table() -> list[int]:
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


TABLE = _table()


def crc32c(data: bytes) -> int:
    """CRC-32C of ``data`` (pure Python)."""
    crc = 0xFFFFFFFF
    t = TABLE
    for b in data:
        crc = t[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283


def file_record(data: bytes, block_size: int) -> dict[str, Any]:
    """§6: size plus one 8-hex-digit CRC-32C per block."""
    blocks = "".join(f"{crc32c(data[i:i + block_size]):08x}"
                     for i in range(0, len(data), block_size))
    return {"size": len(data),
            "checksum": {"algorithm": "crc32c", "block_size": block_size, "blocks": blocks}}


# -- RFC 8878: a Zstandard frame of raw blocks -------------------------------------------------
def zstd_raw_frame(data: bytes) -> bytes:
    """One zstd frame holding ``data`` in raw blocks, with an 8-byte Frame_Content_Size."""
    out = bytearray(b"\x28\xb5\x2f\xfd")
    # Frame_Header_Descriptor: FCS flag 3 (8 bytes), Single_Segment 0, no checksum, no dict.
    out.append(0b11000000)
    # Window_Descriptor: window = 2^(10 + exponent); 128 KiB >= block size. Exponent 7.
    out.append(7 << 3)
    out += struct.pack("<Q", len(data))
    max_block = 128 * 1024
    pos = 0
    while True:
        chunk = data[pos:pos + max_block]
        pos += len(chunk)
        last = pos >= len(data)
        header = (len(chunk) << 3) | (0 << 1) | (1 if last else 0)  # Block_Type 0 = raw
        out += header.to_bytes(3, "little")
        out += chunk
        if last:
            return bytes(out)


# -- helpers -----------------------------------------------------------------------------------
def dumps(value: Any) -> bytes:
    """Strict JSON (§18.3): no NaN/Infinity, UTF-8."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def write_file(path: Path, data: bytes) -> None:
    """Create ``path`` exclusively (R-LAYOUT-2), write, fsync (R-COMMIT-6)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Fsync a directory."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def safe_path(path: str) -> bool:
    """§2.2: 1..8 components of 1..255 characters of [A-Za-z0-9._-], none '.' or '..'."""
    parts = path.split("/")
    return 1 <= len(parts) <= 8 and all(
        1 <= len(p) <= 255 and p not in (".", "..")
        and all(c.isascii() and (c.isalnum() or c in "._-") for c in p) for p in parts)


def crash() -> None:
    """Simulate a crash: exit at once, no cleanup."""
    os._exit(CRASH)


# -- write phase ---------------------------------------------------------------------------
def safetensors_bytes(items: list[tuple[str, str, list[int], bytes]]) -> bytes:
    """§11.1: header JSON padded with spaces to a multiple of 8, then the packed data."""
    return _st_bytes(items)


def _st_bytes(items: list[tuple[str, str, list[int], bytes]]) -> bytes:
    header: dict[str, Any] = {"__metadata__": {"format": "pt", "portable_ckpt": "1.0"}}
    pos = 0
    for name, st_dtype, shape, data in items:
        header[name] = {"dtype": st_dtype, "shape": shape, "data_offsets": [pos, pos + len(data)]}
        pos += len(data)
    h = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(it[3] for it in items)


def shard_bytes(job: dict[str, Any], jobdir: Path) -> tuple[bytes | None, dict[str, Any]]:
    """The safetensors shard of this writer (None without chunks) and its index ``tensors``."""
    data_rel = f"data/w{job['writer']:05d}-0000.safetensors"
    codec = job["codec"]
    tensors: dict[str, Any] = {}
    items: list[tuple[str, str, list[int], bytes]] = []
    for t in job["tensors"]:
        st_dtype, itemsize = DTYPES[t["dtype"]]
        ranges = []
        for ch in t["chunks"]:
            raw = (jobdir / ch["data"]).read_bytes()
            if len(raw) != math.prod(ch["lengths"]) * itemsize:
                raise Fail("PCK-USAGE", f"chunk {ch['data']} has the wrong size")
            name = implied_name(t["key"], ch["offsets"])  # R-TABLE-7, unique per file
            if codec == "zstd":
                frame = zstd_raw_frame(raw)
                items.append((name, "U8", [len(frame)], frame))
            else:
                items.append((name, st_dtype, list(ch["lengths"]), raw))
            ranges.append({"offsets": ch["offsets"], "lengths": ch["lengths"], "file": data_rel,
                           "name": name, "codec": codec})
        tensors[t["key"]] = {"dtype": t["dtype"], "shape": t["shape"], "ranges": ranges}
    return (safetensors_bytes(items) if items else None), tensors


def entry_files(job: dict[str, Any]) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
    """The entry value files of this writer and its index ``entries`` (§12)."""
    files: list[tuple[str, bytes]] = []
    entries: dict[str, Any] = {}
    for e in job["entries"]:
        zst = e["encoding"] == "json+zstd"
        payload = dumps(e["value"])
        if zst:
            payload = zstd_raw_frame(payload)
        suffix = ".json.zst" if zst else ".json"
        tag = "g" if e["scope"] == "global" else f"r{e['rank']:05d}"
        rel = f"entries/{e['name']}.{tag}{suffix}"
        if not safe_path(rel):  # §12.1 names can be longer/deeper than §2.2 paths allow
            rel = f"entries/e{crc32c(e['name'].encode()):08x}-{len(entries):04d}.{tag}{suffix}"
        files.append((rel, payload))
        decl = entries.setdefault(e["name"], {"schema": e["schema"], "scope": e["scope"],
                                              "encoding": e["encoding"], "values": []})
        if e["scope"] == "per_rank":
            decl["world_size_policy"] = e["world_size_policy"]
            decl["values"].append({"rank": e["rank"], "file": rel})
        else:
            decl["values"].append({"file": rel})
    return files, entries


def write_data(adir: Path, files: list[tuple[str, bytes]], fail_at: str | None) -> None:
    """Write (and make durable) every file of this writer except its index.

    ``fail_at == "mid_data"``: write half of the first file, then crash.
    """
    adir.mkdir(parents=True, exist_ok=True)
    if fail_at == "mid_data":
        if files:
            rel, data = files[0]
            write_file(adir / rel, data[: max(1, len(data) // 2)])
        crash()
    for rel, data in files:
        write_file(adir / rel, data)
    # R-COMMIT-6: every new name durable too: the files' directories, each directory's parent,
    # up to the root that holds the attempt directory.
    for d in sorted({q for rel, _ in files for q in Path(rel).parents} | {Path(".")},
                    key=lambda q: -len(q.parts)):
        fsync_dir(adir / d)
    fsync_dir(adir.parent)


def write_index(adir: Path, writer: int, index: dict[str, Any]) -> None:
    """Write the writer index, after the files it lists are durable (R-INDEX-1)."""
    write_file(adir / f"index/w{writer:05d}.json", dumps(index))
    fsync_dir(adir / "index")
    fsync_dir(adir)


def do_write(job: dict[str, Any], jobdir: Path) -> None:
    """Write this writer's data file, entry values and index (§2, §8, §11, §12, §14.1)."""
    fail_at = job.get("fail_at")
    if fail_at == "before_data":
        crash()
    adir = Path(job["root"]) / job["attempt_id"]
    blob, tensors = shard_bytes(job, jobdir)
    values, entries = entry_files(job)
    files = ([(f"data/w{job['writer']:05d}-0000.safetensors", blob)] if blob else []) + values
    later = any(t["dtype"] in LATER_DTYPES for t in tensors.values())
    index = {"format": "portable-ckpt-writer-index", "format_version": "1.3" if later else "1.0",
             "attempt_id": job["attempt_id"], "writer": job["writer"],
             "files": {rel: file_record(data, BLOCK_SIZE) for rel, data in files},
             "tensors": tensors, "entries": entries}
    write_data(adir, files, fail_at)
    if fail_at == "after_data":
        crash()
    write_index(adir, job["writer"], index)


# -- spec §8.5: tensor tables (format 1.1) ------------------------------------------------------
def implied_name(key: str, offsets: list[int]) -> str:
    """R-TABLE-7: ``key@o0,o1``; ``key@`` for a 0-d tensor."""
    return key + "@" + ",".join(str(o) for o in offsets)


def tensor_table(tensors: dict[str, Any]) -> bytes:
    """The ten columns of §8.5 as a safetensors file (little-endian, 1-d each)."""
    order = list(DTYPES)  # §7's rows in order: the dtype code is the row number
    paths: dict[str, int] = {}
    keys, dtypes, ndims = bytearray(), bytearray(), bytearray()
    shapes: list[int] = []
    counts: list[int] = []
    files: list[int] = []
    codecs = bytearray()
    offs: list[int] = []
    lens: list[int] = []
    for key, t in tensors.items():
        keys += key.encode("utf-8") + b"\x00"
        dtypes.append(order.index(t["dtype"]))
        ndims.append(len(t["shape"]))
        shapes += t["shape"]
        counts.append(len(t["ranges"]))
        for r in t["ranges"]:
            files.append(paths.setdefault(r["file"], len(paths)))
            codecs.append({"none": 0, "zstd": 1}[r["codec"]])
            offs += r["offsets"]
            lens += r["lengths"]

    def col(name: str, dt: str, data: bytes) -> tuple[str, str, list[int], bytes]:
        return (name, dt, [len(data) // {"U8": 1, "U32": 4, "I64": 8}[dt]], data)

    return _st_bytes([
        col("tensor.key", "U8", bytes(keys)),
        col("tensor.dtype", "U8", bytes(dtypes)),
        col("tensor.ndim", "U8", bytes(ndims)),
        col("tensor.shape", "I64", struct.pack(f"<{len(shapes)}q", *shapes)),
        col("tensor.ranges", "I64", struct.pack(f"<{len(counts)}q", *counts)),
        col("range.file", "U32", struct.pack(f"<{len(files)}I", *files)),
        col("range.codec", "U8", bytes(codecs)),
        col("range.offsets", "I64", struct.pack(f"<{len(offs)}q", *offs)),
        col("range.lengths", "I64", struct.pack(f"<{len(lens)}q", *lens)),
        col("file.path", "U8", b"".join(p.encode() + b"\x00" for p in paths)),
    ])


# -- commit phase ------------------------------------------------------------------------------
def _coverage(key: str, shape: list[int], ranges: list[dict[str, Any]]) -> None:
    """§9: bounds, then overlap (pairwise), then gap (volume sum)."""
    n = len(shape)
    for r in ranges:
        o, ln = r["offsets"], r["lengths"]
        if len(o) != n or len(ln) != n or any(
                o[i] < 0 or ln[i] < 1 or o[i] + ln[i] > shape[i] for i in range(n)):
            raise Fail("PCK-RANGE-BOUNDS", f"{key}: box {o}+{ln} outside {shape}")
    for i, a in enumerate(ranges):
        for b in ranges[i + 1:]:
            if all(a["offsets"][d] < b["offsets"][d] + b["lengths"][d]
                   and b["offsets"][d] < a["offsets"][d] + a["lengths"][d] for d in range(n)):
                raise Fail("PCK-COVERAGE-OVERLAP", f"{key}: boxes overlap")
    if sum(math.prod(r["lengths"]) for r in ranges) < math.prod(shape):
        raise Fail("PCK-COVERAGE-GAP", f"{key}: elements not covered")


def _epoch_us(stamp: object) -> int | None:
    """Microseconds since 1970 of a §5 timestamp (a finer fraction is cut), ``None`` if none."""
    if not isinstance(stamp, str):
        return None
    try:
        base = calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, TypeError):
        return None
    frac = stamp[20:-1] if len(stamp) > 20 and stamp[19] == "." else ""
    return base * 1_000_000 + int((frac + "000000")[:6] or 0)


def committed_at(root: Path, aid: str) -> str:
    """R-COMMIT-16: now, but one microsecond after every version of this step under the root.

    An attempt without a record, or with one that is not JSON, is no version; a record that
    cannot be read (a storage error) stops the commit.
    """
    us = int(time.time() * 1_000_000)
    prefix = aid.split("-", 1)[0] + "-"
    for d in root.iterdir():
        if d.name == aid or not d.name.startswith(prefix):
            continue
        try:
            rec = json.loads((d / "manifest.json").read_bytes())
        except FileNotFoundError:
            continue
        except ValueError:
            continue  # invalid: no version
        except OSError as exc:
            raise Fail("PCK-STORAGE", f"cannot order the commit after {d.name}: {exc}") from None
        claimed = _epoch_us(rec.get("committed_at")) if isinstance(rec, dict) else None
        if claimed is not None:
            us = max(us, claimed + 1)
    t, frac = divmod(us, 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{frac:06d}Z"


def merge_indexes(job: dict[str, Any], adir: Path) -> tuple[dict[str, Any], ...]:
    """§14.2: the union of the expected writers' indexes (checks 1 and 2 of §4.2)."""
    aid = job["attempt_id"]
    files: dict[str, Any] = {}
    tensors: dict[str, Any] = {}
    entries: dict[str, Any] = {}
    for w in job["writers"]:  # R-COMMIT-5: expected writers come from the job
        ipath = adir / f"index/w{w:05d}.json"
        if not ipath.is_file():
            raise Fail("PCK-WRITER-MISSING", f"no index of writer {w}")
        raw = ipath.read_bytes()
        idx = json.loads(raw)
        if idx.get("attempt_id") != aid:
            raise Fail("PCK-ATTEMPT-ID", f"index of writer {w} names {idx.get('attempt_id')}")
        if idx.get("writer") != w:
            raise Fail("PCK-SCHEMA", f"index w{w:05d}.json says writer {idx.get('writer')}")
        files[f"index/w{w:05d}.json"] = file_record(raw, BLOCK_SIZE)  # R-FILES-1
        for rel, rec in idx["files"].items():
            if rel in files:
                raise Fail("PCK-METADATA-CONFLICT", f"{rel} claimed twice")
            files[rel] = rec
        for key, t in idx["tensors"].items():
            m = tensors.setdefault(key, {"dtype": t["dtype"], "shape": t["shape"], "ranges": []})
            if (m["dtype"], m["shape"]) != (t["dtype"], t["shape"]):
                raise Fail("PCK-METADATA-CONFLICT", f"tensor {key} dtype/shape differ")
            m["ranges"] += t["ranges"]
        for name, e in idx["entries"].items():
            decl = {k: e.get(k) for k in ("schema", "scope", "world_size_policy", "encoding")}
            m = entries.setdefault(name, {**{k: v for k, v in decl.items() if v is not None},
                                          "values": []})
            if {k: m.get(k) for k in decl} != decl:
                raise Fail("PCK-METADATA-CONFLICT", f"entry {name} declared differently")
            for v in e["values"]:
                if any(x.get("rank") == v.get("rank") for x in m["values"]):
                    raise Fail("PCK-METADATA-CONFLICT", f"entry {name} value stored twice")
                m["values"].append(v)
    return files, tensors, entries


def check_coverage(tensors: dict[str, Any]) -> None:
    """Check 3 of §4.2 for every tensor."""
    for key, t in tensors.items():
        _coverage(key, t["shape"], t["ranges"])


def check_entries(entries: dict[str, Any], world_size: int) -> None:
    """Check 4 of §4.2: one value per global entry, one per rank of each per-rank entry."""
    for name, e in entries.items():
        if e["scope"] == "per_rank":
            e["values"].sort(key=lambda v: v["rank"])
            if [v["rank"] for v in e["values"]] != list(range(world_size)):
                raise Fail("PCK-ENTRY-MISSING", f"entry {name}: ranks missing")
        elif len(e["values"]) != 1:
            raise Fail("PCK-ENTRY-MISSING", f"entry {name}: no value")


def check_files(adir: Path, files: dict[str, Any]) -> None:
    """Check 5 of §4.2: every listed file exists with exactly its recorded size."""
    for rel, rec in files.items():
        p = adir / rel
        if not p.is_file():
            raise Fail("PCK-FILE-MISSING", f"{rel} does not exist")
        if p.stat().st_size != rec["size"]:
            raise Fail("PCK-FILE-SIZE", f"{rel} has the wrong size")


def write_table(adir: Path, tensors: dict[str, Any], codec: str) -> tuple[str, bytes]:
    """Write the manifest's tensor table (§8.5), durable before the manifest names it."""
    blob = tensor_table(tensors)
    if codec == "zstd":
        blob = zstd_raw_frame(blob)  # one frame with its content size (R-TABLE-3)
    rel = "tensor-table.safetensors" + (".zst" if codec == "zstd" else "")
    write_file(adir / rel, blob)
    fsync_dir(adir)
    return rel, blob


def publish(adir: Path, data: bytes, fail_at: str | None) -> None:
    """§4.3: temp file, fsync, link(), unlink the temp name, fsync the directory."""
    tmp = adir / f"manifest.json.{os.urandom(8).hex()}.tmp"
    write_file(tmp, data)  # steps 1-2
    if fail_at == "temp_written":
        crash()
    try:
        os.link(tmp, adir / "manifest.json")  # step 3: fails if manifest.json exists
    except FileExistsError:
        os.unlink(tmp)
        raise Fail("PCK-COMMIT-CONFLICT", f"{adir.name}/manifest.json already exists") from None
    os.unlink(tmp)  # step 4
    fsync_dir(adir)  # step 5


def do_commit(job: dict[str, Any]) -> None:
    """§4.2 checks, then §4.3 publication."""
    aid = job["attempt_id"]
    adir = Path(job["root"]) / aid
    files, tensors, entries = merge_indexes(job, adir)
    check_coverage(tensors)
    check_entries(entries, job["continuation"]["world_size"])
    check_files(adir, files)
    fail_at = job.get("fail_at")
    if fail_at == "before_publish":
        crash()
    n_records = sum(len(t["ranges"]) for t in tensors.values())
    table: dict[str, str] | None = None
    if job.get("tensor_table") or n_records > TABLE_THRESHOLD:
        codec = job.get("table_codec") or "none"
        rel, blob = write_table(adir, tensors, codec)
        files[rel] = file_record(blob, BLOCK_SIZE)
        table = {"file": rel, "codec": codec}
    created = aid.split("-")[1]  # the attempt id's timestamp is the attempt's creation time
    # R-VERSION-2, R-VERSION-7: a dtype of 1.3 makes the manifest 1.3 and lists its extension.
    later = sorted({LATER_DTYPES[t["dtype"]] for t in tensors.values()
                    if t["dtype"] in LATER_DTYPES})
    version = "1.3" if later else "1.1" if table else "1.0"
    manifest = {
        "format": "portable-ckpt", "format_version": version,  # R-VERSION-2
        "attempt_id": aid, "step": job["step"],
        "created_at": f"{created[0:4]}-{created[4:6]}-{created[6:8]}T{created[9:11]}:"
                      f"{created[11:13]}:{created[13:15]}.{created[15:21]}Z",
        "committed_at": committed_at(Path(job["root"]), aid),
        "producer": {"name": "conformance-minimal-writer", "version": "1.1"},
        "continuation": job["continuation"], "files": dict(sorted(files.items())),
        "tensors": {} if table else tensors, "entries": entries,
        "must_understand": sorted((["tensor-table"] if table else []) + later),
        "extensions": {},
    }
    if table:
        manifest["tensor_table"] = table  # R-TABLE-1, R-TABLE-2
    publish(adir, dumps(manifest), fail_at)


def main(argv: list[str]) -> int:
    """``minimal_writer.py JOB.json``: exit 0 on success, 1 with a JSON error line on failure."""
    path = Path(argv[1])
    job = json.loads(path.read_text(encoding="utf-8"))
    try:
        if job["phase"] == "write":
            do_write(job, path.parent)
        elif job["phase"] == "commit":
            do_commit(job)
        else:
            raise Fail("PCK-USAGE", f"unknown phase {job['phase']!r}")
    except Fail as exc:
        print(json.dumps({"error": {"code": exc.code, "message": str(exc)}}))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
