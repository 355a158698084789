#!/usr/bin/env python3
"""The reference reader adapter with one deliberate defect (``PCK_BAD_MODE``).

Proves that ``portable-ckpt-conformance reader`` catches each kind of defect a reader can have:

* ``no-checksum``: never verifies a checksum block (R-CKSUM-3);
* ``deep-only``: verifies the data blocks of tensor shards only in a separate deep pass
  (``Checkpoint.verify(deep=True)``), run when a job asks for ``"deep"``, which the harness's
  jobs never do; its reads verify headers, tables and entry values, not tensor data, so damaged
  tensor bytes are returned (R-CKSUM-3);
* ``first-block``: verifies only the first checksum block of each span it reads (R-CKSUM-3):
  passes every set but ``errata-21``, whose damaged blocks are never a read's first;
* ``big-endian``: gives multi-byte elements byte-swapped (the protocol's bytes are
  little-endian; a reader that reassembles in its host's order on a big-endian machine);
* ``float-integers``: entry values' integers given as numbers with a fraction (``3.0``);
* ``bool-as-int``: entry values' booleans given as ``0``/``1``;
* ``rank-zero``: a per-rank entry's value of rank 0 given for every rank;
* ``oldest``: opens a root's oldest committed version, not its latest (R-READ-1, R-ID-4);
* ``decode-first``: decodes a zstd range's frame from the bytes as stored, then verifies them
  (R-CKSUM-3: verified before decoded): damage in a frame reports the codec's error, not the
  checksum's; passes every set but ``errata-21``'s frame damaged in a block of its own (its
  other undecodable frame shares the block with ``z``, whose verified read meets it first);
* ``no-bool-check``: reads ``bool`` bytes other than 0 and 1 (R-DTYPE-4 ignored);
* ``one-code``: reports ``PCK-ERROR`` for every refusal (not the spec's stable codes);
* ``anonymous-checksum``: a checksum failure's message does not name the file (R-CKSUM-4);
* ``fv-false``: says no version failed verification (reads no verification record);
* ``strict``: refuses whatever the suite's checker reports, writer-only defects included
  (``"reader": "accept"`` cases: a stored writer index that disagrees with the manifest), which
  a reader reads;
* ``crash``: dies with a traceback on a zstd version (no result line);
* ``hang``: sleeps past the harness's ``--timeout`` on a per-rank entry.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "adapters"))

import reference_reader

MODE = os.environ.get("PCK_BAD_MODE", "")
READING = False  # deep-only: a tensor is being read


def _swap(t: dict[str, Any]) -> None:
    size = {"float64": 8, "int64": 8, "uint64": 8, "float32": 4, "int32": 4, "uint32": 4,
            "float16": 2, "bfloat16": 2, "int16": 2, "uint16": 2}.get(t["dtype"], 1)
    data = bytes.fromhex(t["hex"])
    t["hex"] = b"".join(data[i:i + size][::-1] for i in range(0, len(data), size)).hex()


def _map(value: Any, fn: Any) -> Any:
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    if isinstance(value, list):
        return [_map(v, fn) for v in value]
    return fn(value)


def _patch() -> None:
    if MODE == "no-checksum":
        from portable_ckpt.io import checksum

        def verify_span(self: Any, start: int, pieces: list[memoryview]) -> None:
            self.verified += 1

        checksum.BlockVerifier.verify_span = verify_span  # type: ignore[method-assign]
    elif MODE == "deep-only":
        from portable_ckpt.io import checksum

        real_span = checksum.BlockVerifier.verify_span

        real_tensor = reference_reader._tensor

        def header_only(self: Any, start: int, pieces: list[memoryview]) -> None:
            if READING and str(self.path).endswith(".safetensors") and start > 0:
                self.verified += 1  # a data block of a read: left to the deep pass
                return
            real_span(self, start, pieces)

        def tensor(ck: Any, key: str) -> dict[str, Any]:
            global READING
            READING = True
            try:
                out: dict[str, Any] = real_tensor(ck, key)
                return out
            finally:
                READING = False

        checksum.BlockVerifier.verify_span = header_only  # type: ignore[method-assign]
        reference_reader._tensor = tensor
    elif MODE == "first-block":
        from portable_ckpt.io import checksum

        real = checksum.BlockVerifier.verify_span

        def first_only(self: Any, start: int, pieces: list[memoryview]) -> None:
            first = bytes(b"".join(bytes(p.cast("B")) for p in pieces)[:self.block_size])
            real(self, start, [memoryview(first)])

        checksum.BlockVerifier.verify_span = first_only  # type: ignore[method-assign]
    elif MODE == "decode-first":
        import math

        from portable_ckpt.io import reader
        from portable_ckpt.io.codec import decompress_frame

        real_check = reader.Checkpoint._check_frame

        def decode_then_verify(self: Any, t: Any, rec: Any, st: Any) -> None:
            stored = self.storage.read_range(self._rel(rec.file), st.start, st.end - st.start)
            expect = math.prod(rec.lengths) * t.itemsize
            decompress_frame(bytearray(stored), expect=expect, limit=expect, what=rec.name)
            real_check(self, t, rec, st)

        reader.Checkpoint._check_frame = decode_then_verify  # type: ignore[method-assign]
    elif MODE == "no-bool-check":
        from portable_ckpt.io import reader

        reader.Checkpoint._check_bool = lambda *a, **k: None  # type: ignore[method-assign]
        reader.Checkpoint._check_bool_window = lambda *a, **k: None  # type: ignore[method-assign]
    elif MODE == "oldest":
        from portable_ckpt.errors import NotFoundError
        from portable_ckpt.io import versions

        def oldest(storage: Any, step: int | None = None, **kw: Any) -> Any:
            done = [v.id for v in versions.list_versions(storage, annotations=False)
                    if v.status == versions.COMMITTED]
            if not done:
                raise NotFoundError("no committed version")
            return done[0], versions.load_manifest(storage, done[0])

        versions.latest = oldest
    elif MODE == "crash":
        from portable_ckpt.io import reader

        def boom(*a: Any, **k: Any) -> Any:
            raise RuntimeError("bad_reader: zstd is not implemented")

        reader.Checkpoint._decompressed = boom  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    """Run the reference adapter's job with ``MODE``'s defect."""
    job = json.loads(Path(argv[-1]).read_text(encoding="utf-8"))
    _patch()
    if MODE == "strict":
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from conformance.checker import check

        found = check(job["target"])
        if not found.ok:
            print(json.dumps({"ok": False, "code": sorted(found.codes)[0]}))
            return 0
    if MODE == "deep-only" and job.get("deep"):  # the separate pass, when a job asks for it
        import portable_ckpt
        from portable_ckpt.errors import CheckpointError

        try:
            problems = portable_ckpt.open(job["target"]).verify(deep=True)
        except CheckpointError:
            problems = []  # the read below says it
        if problems:
            print(json.dumps({"ok": False, "code": problems[0].code,
                              "message": str(problems[0])}))
            return 0
    result = reference_reader.read(job)
    if MODE == "hang" and any(isinstance(v, dict) and "per_rank" in v
                              for v in result.get("entries", {}).values()):
        time.sleep(120)
    if result["ok"]:
        if MODE == "big-endian":
            for t in result["tensors"].values():
                _swap(t)
        elif MODE == "float-integers":
            result["entries"] = _map(result["entries"], lambda v: float(v) if type(v) is int
                                     else v)
        elif MODE == "bool-as-int":
            result["entries"] = _map(result["entries"], lambda v: int(v) if type(v) is bool
                                     else v)
        elif MODE == "rank-zero":
            for value in result["entries"].values():
                if isinstance(value, dict) and "per_rank" in value:
                    first = value["per_rank"]["0"]
                    value["per_rank"] = {r: first for r in value["per_rank"]}
        elif MODE == "fv-false" and "failed_verification" in result:
            result["failed_verification"] = False
    elif MODE == "one-code":
        result["code"] = "PCK-ERROR"
    elif MODE == "anonymous-checksum" and result["code"] == "PCK-CHECKSUM":
        result["message"] = "checksum mismatch"
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
