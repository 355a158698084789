"""The minimal writer with one deliberate defect (``PCK_BAD_MODE``), to prove the harness bites.

Modes: ``flip`` (a data byte changed after checksumming), ``swap`` (chunk data of a 2+-element
box reversed, checksums consistent), ``no-writer-check`` (commit ignores missing writer indexes),
``ignore-fail`` (``fail_at`` ignored), ``overwrite`` (publishes with a plain write of
manifest.json before the indexes are checked), ``table-names`` (ranges stored under names other
than the implied names of R-TABLE-7 while the manifest holds a tensor table).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location(
    "minimal_writer", HERE.parent / "examples" / "minimal_writer.py")
assert spec and spec.loader
mw: Any = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mw)

MODE = os.environ.get("PCK_BAD_MODE", "")

if MODE == "flip":
    orig_write_file = mw.write_file

    def write_file(path: Path, data: bytes) -> None:
        if path.suffix == ".safetensors" and len(data) > 8:
            data = data[:-1] + bytes([data[-1] ^ 0x40])
        orig_write_file(path, data)

    mw.write_file = write_file
elif MODE == "swap":
    orig_sb = mw.safetensors_bytes

    def safetensors_bytes(items: list[Any]) -> bytes:
        out = []
        for name, dt, shape, data in items:
            itemsize = len(data) // max(1, __import__("math").prod(shape)) if dt != "U8" else 1
            if dt != "U8" and len(data) >= 2 * itemsize:
                els = [data[i:i + itemsize] for i in range(0, len(data), itemsize)]
                data = b"".join(reversed(els)) if els != els[::-1] else data
            out.append((name, dt, shape, data))
        return bytes(orig_sb(out))

    mw.safetensors_bytes = safetensors_bytes
elif MODE == "no-writer-check":
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

    mw.do_commit = do_commit
elif MODE == "table-names":
    mw.implied_name = lambda key, offsets: f"{key}#{','.join(str(o) for o in offsets)}"
elif MODE == "ignore-fail":
    orig_main = mw.main

    def main(argv: list[str]) -> int:
        path = Path(argv[1])
        job = json.loads(path.read_text())
        if job.get("fail_at"):
            job["fail_at"] = None
            path.write_text(json.dumps(job))
        return int(orig_main(argv))

    mw.main = main

if __name__ == "__main__":
    sys.exit(mw.main(sys.argv))
