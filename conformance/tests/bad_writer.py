"""The minimal writer with one deliberate defect (``PCK_BAD_MODE``), to prove the harness bites.

Every mode is a fault a real writer or committer could have; ``test_faults.py`` checks that the
harness catches each one, and where.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import time
import zlib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location(
    "minimal_writer", HERE.parent / "examples" / "minimal_writer.py")
assert spec and spec.loader
mw: Any = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mw)

sys.path.insert(0, str(HERE))
from job_edits import JOB_EDITS, with_job_edit  # noqa: E402

MODE = os.environ.get("PCK_BAD_MODE", "")


class _Os:
    """``os`` for the minimal writer, with some calls replaced."""

    def __init__(self, **calls: Any) -> None:
        self.calls = calls

    def __getattr__(self, name: str) -> Any:
        return self.calls.get(name, getattr(os, name))


def _unlink_if_there(path: Any) -> None:
    if os.path.lexists(path):
        os.unlink(path)


def _write_directly(src: Any, dst: Any) -> None:
    """``link(tmp, manifest)`` replaced by opening manifest.json and writing it (R-COMMIT-8)."""
    data = Path(src).read_bytes()
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _flip(orig: Any) -> Any:
    def write_file(path: Path, data: bytes) -> None:
        if path.suffix == ".safetensors" and len(data) > 8:
            data = data[:-1] + bytes([data[-1] ^ 0x40])
        orig(path, data)
    return write_file


def _swap(orig: Any) -> Any:
    def safetensors_bytes(items: list[Any]) -> bytes:
        out = []
        for name, dt, shape, data in items:
            itemsize = len(data) // max(1, math.prod(shape)) if dt != "U8" else 1
            if dt != "U8" and len(data) >= 2 * itemsize:
                els = [data[i:i + itemsize] for i in range(0, len(data), itemsize)]
                data = b"".join(reversed(els)) if els != els[::-1] else data
            out.append((name, dt, shape, data))
        return bytes(orig(out))
    return safetensors_bytes


def _skip_zero_size(orig: Any) -> Any:
    def shard_bytes(job: dict[str, Any], jobdir: Path) -> tuple[bytes | None, dict[str, Any]]:
        blob, tensors = orig(job, jobdir)
        return blob, {k: t for k, t in tensors.items() if 0 not in t["shape"]}
    return shard_bytes


def _trusting_merge(job: dict[str, Any], adir: Path) -> tuple[dict[str, Any], ...]:
    """§14.2's union without its checks: conflicts and foreign indexes merged (R-INDEX-3/4)."""
    files: dict[str, Any] = {}
    tensors: dict[str, Any] = {}
    entries: dict[str, Any] = {}
    for w in job["writers"]:
        ipath = adir / f"index/w{w:05d}.json"
        if not ipath.is_file():
            raise mw.Fail("PCK-WRITER-MISSING", f"no index of writer {w}")
        idx = json.loads(ipath.read_bytes())
        files.update({f"index/w{w:05d}.json": mw.file_record(ipath.read_bytes(), mw.BLOCK_SIZE)},
                     **idx["files"])
        for key, t in idx["tensors"].items():
            tensors.setdefault(key, {**t, "ranges": []})["ranges"] += t["ranges"]
        for name, e in idx["entries"].items():
            entries.setdefault(name, {**e, "values": []})["values"] += e["values"]
    return files, tensors, entries


def _no_error_line() -> Any:
    orig_main = mw.main

    def main(argv: list[str]) -> int:
        with open(os.devnull, "w") as null:
            real, sys.stdout = sys.stdout, null
            try:
                return int(orig_main(argv))
            finally:
                sys.stdout = real
    return main


def _wrong_code() -> Any:
    class Fail(mw.Fail):  # type: ignore[misc]
        def __init__(self, code: str, message: str) -> None:
            super().__init__("PCK-USAGE" if code == "PCK-WRITER-MISSING" else code, message)
    return Fail


def _index_first(job: dict[str, Any], jobdir: Path) -> None:
    """The minimal writer's do_write with the index written before the data."""
    if job.get("fail_at") == "before_data":
        mw.crash()
    adir = Path(job["root"]) / job["attempt_id"]
    blob, tensors = mw.shard_bytes(job, jobdir)
    values, entries = mw.entry_files(job)
    files = ([(f"data/w{job['writer']:05d}-0000.safetensors", blob)] if blob else []) + values
    index = {"format": "portable-ckpt-writer-index", "format_version": "1.0",
             "attempt_id": job["attempt_id"], "writer": job["writer"],
             "files": {rel: mw.file_record(d, mw.BLOCK_SIZE) for rel, d in files},
             "tensors": tensors, "entries": entries}
    adir.mkdir(parents=True, exist_ok=True)
    mw.fsync_dir(adir.parent)
    mw.write_index(adir, job["writer"], index)
    mw.write_data(adir, files, job.get("fail_at"))
    if job.get("fail_at") == "after_data":
        mw.crash()


def _no_tmp_fsync(adir: Path, data: bytes, fail_at: str | None) -> None:
    tmp = adir / f"manifest.json.{os.urandom(8).hex()}.tmp"
    tmp.write_bytes(data)
    if fail_at == "temp_written":
        mw.crash()
    try:
        os.link(tmp, adir / "manifest.json")
    except FileExistsError:
        os.unlink(tmp)
        raise mw.Fail("PCK-COMMIT-CONFLICT", "manifest.json exists") from None
    os.unlink(tmp)
    mw.fsync_dir(adir)


def _table_name_unsynced(orig: Any) -> Any:
    """``write_table`` without the directory fsync: the table's name is not durable when the
    manifest that lists it is linked (R-COMMIT-17)."""
    def write_table(adir: Path, tensors: dict[str, Any], codec: str) -> tuple[str, bytes]:
        real, mw.fsync_dir = mw.fsync_dir, lambda path: None
        try:
            return orig(adir, tensors, codec)  # type: ignore[no-any-return]
        finally:
            mw.fsync_dir = real
    return write_table


def _touch_then_publish(orig: Any) -> Any:
    def publish(adir: Path, data: bytes, fail_at: str | None) -> None:
        m = adir / "manifest.json"
        if m.exists():  # opened for writing, nothing written: only the trace can tell
            os.close(os.open(m, os.O_WRONLY | os.O_APPEND))
        orig(adir, data, fail_at)
    return publish


def _symlink_values(orig: Any) -> Any:
    """Entry values written as ``<name>.real`` and stored under their names as symbolic links
    to it (R-SEC-2): every listed size and checksum is right through the link."""
    def write_file(path: Path, data: bytes) -> None:
        if path.parent.name == "entries":
            real = path.with_name(path.name + ".real")
            orig(real, data)
            os.symlink(real.name, path)
        else:
            orig(path, data)
    return write_file


def _overwrite(orig: Any) -> Any:
    def write_file(path: Path, data: bytes) -> None:
        orig(path, data)
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)  # the same bytes again: never visible
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    return write_file


def _no_writer_check() -> Any:
    orig_commit = mw.do_commit

    def do_commit(job: dict[str, Any]) -> None:
        adir = Path(job["root"]) / job["attempt_id"]
        job = dict(job, writers=[w for w in job["writers"]
                                 if (adir / f"index/w{w:05d}.json").is_file()])
        job["fail_at"] = None
        try:
            orig_commit(job)
        except mw.Fail:
            pass
        if not (adir / "manifest.json").exists():
            (adir / "manifest.json").write_text(json.dumps({"broken": True}))
    return do_commit


def _clock_only(root: Path, aid: str) -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


def _stray_lock(orig: Any) -> Any:
    def write_file(path: Path, data: bytes) -> None:
        orig(path, data)
        if path.suffix == ".safetensors":
            orig(path.with_name(f".{path.stem}.lock"), b"locked")
    return write_file


def _scratch_outside(orig: Any) -> Any:
    def write_file(path: Path, data: bytes) -> None:
        orig(path, data)
        if path.suffix == ".safetensors":  # root is <case>/root: its parent is outside
            root = next(p for p in path.parents if p.name == "root")
            with open(root.parent / "mywriter-scratch.log", "a") as f:
                f.write(f"wrote {path.name}\n")
    return write_file


def _partial_after(orig: Any) -> Any:
    def write_file(path: Path, data: bytes) -> None:
        orig(path, data)
        if path.parent.name == "index":  # made after the index, durable, listed nowhere
            orig(path.with_name(path.name + ".partial"), b"")
            mw.fsync_dir(path.parent)
    return write_file


def _range_early(orig: Any) -> Any:
    """The first range with a non-zero offset recorded one element early (its bytes right)."""
    def shard_bytes(job: dict[str, Any], jobdir: Path) -> tuple[bytes | None, dict[str, Any]]:
        data, tensors = orig(job, jobdir)
        for t in tensors.values():
            for r in t.get("ranges", []):
                at = next((i for i, o in enumerate(r["offsets"]) if o > 0), None)
                if at is not None:
                    r["offsets"] = [o - (i == at) for i, o in enumerate(r["offsets"])]
                    return data, tensors
        return data, tensors
    return shard_bytes


def _chained_crcs(data: bytes, block_size: int) -> dict[str, Any]:
    """Block CRCs that continue from the previous block's: right for a one-block file only."""
    crcs = [f"{mw.crc32c(data[:i + block_size]):08x}" for i in range(0, len(data), block_size)]
    return {"size": len(data),
            "checksum": {"algorithm": "crc32c", "block_size": block_size, "blocks": "".join(crcs)}}


def _one_block(data: bytes, block_size: int) -> dict[str, Any]:
    """One CRC of the whole file under the declared block size (right below one block)."""
    return {"size": len(data), "checksum": {"algorithm": "crc32c", "block_size": block_size,
                                            "blocks": f"{mw.crc32c(data):08x}" if data else ""}}


def _apply(mode: str) -> None:
    if mode in JOB_EDITS:  # ignore-fail, zstd-as-none, write-twice, listing-writers, ... (job_edits)
        mw.main = with_job_edit(mw.main, JOB_EDITS[mode])
    elif mode == "flip":  # a data byte changed after checksumming (wrong CRC)
        mw.write_file = _flip(mw.write_file)
    elif mode == "symlink-values":  # entry values stored as symbolic links (R-SEC-2)
        mw.write_file = _symlink_values(mw.write_file)
    elif mode == "swap":  # a chunk's elements reversed, checksums consistent
        mw.safetensors_bytes = _swap(mw.safetensors_bytes)
    elif mode == "table-names":  # ranges not under their implied names (R-TABLE-7)
        mw.implied_name = lambda key, offsets: f"{key}#{','.join(str(o) for o in offsets)}"
    elif mode == "no-writer-check":  # commits whatever indexes exist, even a broken manifest
        mw.do_commit = _no_writer_check()
    elif mode == "no-fsync":  # never calls fsync (R-COMMIT-6, R-COMMIT-7 step 2)
        mw.os = _Os(fsync=lambda fd: None)
    elif mode == "no-dir-fsync":  # fsyncs files, never directories (R-COMMIT-6)
        mw.fsync_dir = lambda path: None
    elif mode == "direct-manifest":  # opens and writes manifest.json (R-COMMIT-8)
        mw.os = _Os(link=_write_directly, unlink=_unlink_if_there)
    elif mode == "rename-publish":  # plain rename() over manifest.json (R-COMMIT-8, -9)
        mw.os = _Os(link=os.rename, unlink=_unlink_if_there)
    elif mode == "no-tmp-fsync":  # the temporary manifest is not synced (R-COMMIT-7 step 2)
        mw.publish = _no_tmp_fsync
    elif mode == "table-name-unsynced":  # the table's name not durable first (R-COMMIT-17)
        mw.write_table = _table_name_unsynced(mw.write_table)
    elif mode == "touch-manifest":  # opens an existing manifest.json for writing (R-COMMIT-9)
        mw.publish = _touch_then_publish(mw.publish)
    elif mode == "skip-checks":  # no coverage, entry or file checks (R-COMMIT-4)
        mw.check_coverage = mw.check_entries = lambda *a: None
        mw.check_files = lambda *a: None
    elif mode == "wrong-code":  # PCK-USAGE instead of PCK-WRITER-MISSING (R-ERR-1)
        mw.Fail = _wrong_code()
    elif mode == "no-error-line":  # fails without the {"error": ...} line
        mw.main = _no_error_line()
    elif mode == "index-first":  # writes its index before its data (R-INDEX-1)
        mw.do_write = _index_first
    elif mode == "trusting-merge":  # merges indexes without the R-INDEX-3/4 checks
        mw.merge_indexes = _trusting_merge
    elif mode == "wrong-crc":  # CRC-32 (zlib) where §6 says CRC-32C
        mw.crc32c = zlib.crc32
    elif mode == "ignore-same-step":  # committed_at from the clock alone (R-COMMIT-16)
        mw.committed_at = _clock_only
    elif mode == "stray-file":  # a lock file left in the attempt, in no document (R-FILES-1)
        mw.write_file = _stray_lock(mw.write_file)
    elif mode == "overwrite":  # every file rewritten once after it was made (R-LAYOUT-2)
        mw.write_file = _overwrite(mw.write_file)
    elif mode == "write-outside":  # a scratch log beside root, in the user's directory
        mw.write_file = _scratch_outside(mw.write_file)
    elif mode == "partial-after-index":  # a durable stray file made after the index
        mw.write_file = _partial_after(mw.write_file)
    elif mode == "range-early":  # a range's box recorded one element early (R-COVER-1)
        mw.shard_bytes = _range_early(mw.shard_bytes)
    elif mode == "crc-block-chain":  # each block's CRC continues the previous one (§6)
        mw.file_record = _chained_crcs
    elif mode == "one-block":  # one CRC over the whole file, whatever its block size (§6)
        mw.file_record = _one_block
    elif mode == "skip-zero-size":  # zero-size tensors left undeclared (§8.1; review C10)
        mw.shard_bytes = _skip_zero_size(mw.shard_bytes)
    elif mode == "entry-248":  # §12.1's 248 taken literally: ".r00000.json.zst" names overflow
        mw.safe_path = lambda rel: len(rel.split("/", 1)[1].split(".")[0]) <= 248
    elif mode:
        raise SystemExit(f"unknown PCK_BAD_MODE {mode!r}")


_apply(MODE)

if __name__ == "__main__":
    sys.exit(mw.main(sys.argv))
