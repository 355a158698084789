"""The suite's own minimal reader: reassembles every tensor element by element.

Independent of :mod:`portable_ckpt`; used by the writer harness to compare a saved checkpoint
with the logical state it was given. Run :func:`conformance.checker.check_version` first: this
module assumes a conformant version and raises :class:`~conformance.store.Problem` otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from conformance.spec import ATTEMPT_ID_RE, DTYPES
from conformance.store import (
    Problem,
    VersionFiles,
    parse_file_record,
    parse_safetensors_header,
    zstd_decode,
)
from conformance.strictjson import StrictJsonError, loads_strict
from conformance.table import load_table

__all__ = ["LoadedVersion", "committed_versions", "latest_committed", "load_version",
           "timestamp_key"]


@dataclass
class LoadedVersion:
    """Everything a version holds, as raw little-endian bytes per tensor and JSON per entry."""

    attempt_id: str
    step: int
    manifest: dict[str, Any]
    tensors: dict[str, tuple[str, tuple[int, ...], bytes]]  # key -> (dtype, shape, C-order bytes)
    entries: dict[str, Any]  # global -> value; per_rank -> {rank: value}
    range_codecs: dict[str, list[str]] = field(default_factory=dict)  # key -> codec per range


def _json(raw: bytes, what: str) -> Any:
    try:
        return loads_strict(raw)
    except StrictJsonError as exc:
        raise Problem("PCK-JSON-INVALID", f"{what}: {exc}") from None


def load_version(vdir: Path) -> LoadedVersion:
    """Read every tensor and entry of a committed version directory."""
    vf = VersionFiles(vdir)
    m = _json((vdir / "manifest.json").read_bytes(), f"{vdir}/manifest.json")
    for rel, rec in m["files"].items():
        vf.records[rel] = parse_file_record(rel, rec)
    headers: dict[str, Any] = {}
    tensors: dict[str, tuple[str, tuple[int, ...], bytes]] = {}
    codecs: dict[str, list[str]] = {}
    # Format 1.1: the tensor entries may live in a tensor table (§8.5) instead of `tensors`.
    items = load_table(vf, m["tensor_table"], m["files"], "manifest.json").items() \
        if "tensor_table" in m else m["tensors"].items()
    for key, t in items:
        dtype, shape = t["dtype"], tuple(t["shape"])
        isz = DTYPES[dtype][1]
        out = np.zeros((*shape, isz), dtype=np.uint8)
        count = np.zeros(shape, dtype=np.int32)
        codecs[key] = [rr["codec"] for rr in t["ranges"]]
        for rr in t["ranges"]:
            rel = rr["file"]
            if rel not in headers:
                headers[rel] = parse_safetensors_header(vf, rel)
            st = headers[rel].tensors[rr["name"]]
            raw = vf.read(rel, st.begin, st.end - st.begin)
            lens = tuple(rr["lengths"])
            if rr["codec"] == "zstd":
                raw = zstd_decode(raw, where=f"{key}: {rr['name']}",
                                  limit=math.prod(lens) * isz)
            if len(raw) != math.prod(lens) * isz:
                raise Problem("PCK-CODEC", f"{key}: range holds {len(raw)} bytes")
            sl = tuple(slice(o, o + n) for o, n in zip(rr["offsets"], lens, strict=True))
            out[sl] = np.frombuffer(raw, dtype=np.uint8).reshape(*lens, isz)
            count[sl] += 1
        if count.size and (count.min() != 1 or count.max() != 1):
            raise Problem("PCK-COVERAGE-GAP" if count.min() == 0 else "PCK-COVERAGE-OVERLAP",
                          f"{key}: element coverage counts in [{count.min()}, {count.max()}]")
        tensors[key] = (dtype, shape, out.tobytes())
    entries: dict[str, Any] = {}
    for name, e in m["entries"].items():
        vals: dict[int | None, Any] = {}
        for v in e["values"]:
            raw = vf.read(v["file"])
            if e["encoding"] == "json+zstd":
                raw = zstd_decode(raw, where=v["file"], limit=64 << 20)
            vals[v.get("rank")] = _json(raw, v["file"])
        entries[name] = vals[None] if e["scope"] == "global" else vals
    return LoadedVersion(m["attempt_id"], m["step"], m, tensors, entries, codecs)


def committed_versions(root: Path) -> list[Path]:
    """Attempt directories below ``root`` holding a manifest.json (candidates; check them).

    Children whose names do not match the attempt-id pattern are ignored (R-LAYOUT-4).
    """
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if ATTEMPT_ID_RE.match(p.name) and p.is_dir()
                  and not p.is_symlink() and (p / "manifest.json").is_file())


def timestamp_key(ts: object) -> tuple[str, str]:
    """Order key of an RFC 3339 UTC timestamp ``YYYY-MM-DDTHH:MM:SS[.fraction]Z`` (§3)."""
    if not isinstance(ts, str):
        return ("", "")
    base, _, frac = ts.rstrip("Z").partition(".")
    return (base, frac.ljust(9, "0"))


def latest_committed(root: Path) -> Path | None:
    """The latest committed version by the spec's order (step, committed_at, attempt_id).

    Only versions whose manifest parses and whose attempt_id equals the directory are
    considered (a version exists iff ...). A manifest that cannot be read (``OSError``) is not
    skipped: the error propagates, since it could be the latest version (R-ID-5).
    """
    best: tuple[int, tuple[str, str], str, Path] | None = None
    for p in committed_versions(root):
        try:
            m = loads_strict((p / "manifest.json").read_bytes())
        except StrictJsonError:
            continue
        if not isinstance(m, dict) or m.get("attempt_id") != p.name:
            continue
        k = (int(m.get("step", -1)), timestamp_key(m.get("committed_at")), p.name, p)
        if best is None or k[:3] > best[:3]:
            best = k
    return best[3] if best else None
