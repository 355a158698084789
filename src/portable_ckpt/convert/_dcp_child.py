"""Child process: unpickle a DCP ``.metadata`` with torch and print it as JSON on stdout.

Run only after the user passed ``--trust-pickle``: ``.metadata`` and DCP byte items are pickles
and unpickling them can run arbitrary code. Running it in a child keeps torch (~270 MiB of RSS)
out of the converting process, which then streams the chunk bytes without torch.

Output document::

    {"tensors": {fqn: {"dtype": "float32", "size": [...],
                       "chunks": [{"offsets": [...], "sizes": [...], "file": rel,
                                   "offset": n, "length": n, "transforms": [...]}]}},
     "bytes": {fqn: {"file": rel, "offset": n, "length": n, "transforms": [...],
                     "ok": bool, "value": <JSON>, "reason": str}},
     "unsupported": {fqn: "reason"}}
"""

from __future__ import annotations

import io
import json
import math
import os
import sys
from typing import Any

__all__ = ["main", "to_json_value"]

_MAX_BYTE_ITEM = 64 << 20


class _NotJson(Exception):
    pass


def to_json_value(value: Any, depth: int = 0) -> Any:
    """Return ``value`` as plain JSON data, or raise ``ValueError`` if it is not recognisable.

    Recognised: ``None``, bools, ints, finite floats, strings, and lists/tuples/dicts (string
    keys) of these. Tuples become lists.
    """
    if depth > 64:
        raise ValueError("nested too deeply")
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"non-finite float {value!r}")
        return float(value)
    if isinstance(value, list | tuple):
        return [to_json_value(v, depth + 1) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                if isinstance(k, int) and not isinstance(k, bool):
                    k = str(k)
                else:
                    raise ValueError(f"dict key {k!r} is not a string")
            out[k] = to_json_value(v, depth + 1)
        return out
    raise ValueError(f"value of type {type(value).__name__} is not JSON data")


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m portable_ckpt.convert._dcp_child DIR``."""
    args = sys.argv[1:] if argv is None else argv
    root = args[0]
    import torch
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        MetadataIndex,
        TensorStorageMetadata,
    )

    try:
        meta = FileSystemReader(root).read_metadata()
    except Exception as exc:  # report any unpickling failure as data
        json.dump({"error": f"{type(exc).__name__}: {exc}"}, sys.stdout)
        return 0
    storage = meta.storage_data or {}
    tensors: dict[str, Any] = {}
    byte_items: dict[str, Any] = {}
    unsupported: dict[str, str] = {}

    def sinfo(idx: Any) -> dict[str, Any] | None:
        info = storage.get(idx)
        if info is None:
            return None
        return {
            "file": str(info.relative_path),
            "offset": int(info.offset),
            "length": int(info.length),
            "transforms": list(getattr(info, "transform_descriptors", None) or []),
        }

    for fqn, md in meta.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            chunks = []
            for i, ch in enumerate(md.chunks):
                s = sinfo(MetadataIndex(fqn, ch.offsets, i))
                if s is None:
                    unsupported[fqn] = f"chunk at {list(ch.offsets)} has no storage record"
                    break
                s["offsets"] = [int(x) for x in ch.offsets]
                s["sizes"] = [int(x) for x in ch.sizes]
                chunks.append(s)
            else:
                tensors[fqn] = {
                    "dtype": _dtype_name(md.properties.dtype),
                    "size": [int(x) for x in md.size],
                    "chunks": chunks,
                }
        elif isinstance(md, BytesStorageMetadata):
            s = sinfo(MetadataIndex(fqn))
            if s is None:
                unsupported[fqn] = "byte item has no storage record"
                continue
            s.update(ok=False, value=None, reason="")
            if s["transforms"]:
                s["reason"] = f"stream transforms {s['transforms']} are not supported"
            elif s["length"] > _MAX_BYTE_ITEM:
                s["reason"] = f"byte item of {s['length']} bytes is too large to convert"
            else:
                try:
                    with open(os.path.join(root, s["file"]), "rb") as f:
                        f.seek(s["offset"])
                        raw = f.read(s["length"])
                    if len(raw) != s["length"]:
                        s["reason"] = f"file {s['file']} is truncated"
                    else:
                        obj = torch.load(io.BytesIO(raw), weights_only=True)
                        s["value"] = to_json_value(obj)
                        s["ok"] = True
                except Exception as exc:
                    s["reason"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            byte_items[fqn] = s
        else:
            unsupported[fqn] = f"unknown metadata type {type(md).__name__}"
    json.dump({"tensors": tensors, "bytes": byte_items, "unsupported": unsupported}, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
