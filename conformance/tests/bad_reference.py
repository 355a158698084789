"""The reference adapter (portable_ckpt) with one deliberate defect (``PCK_BAD_MODE``).

Measures the fault table of conformance/README.md ("What the harness catches"): each mode is
injected into the reference writer/committer by patching the library inside the adapter process,
then ``fault_table.py`` runs the whole suite against it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, ClassVar

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "adapters"))
sys.path.insert(0, str(HERE))

import reference_writer as rw  # noqa: E402
from job_edits import JOB_EDITS, with_job_edit  # noqa: E402

import portable_ckpt.io.commit as commit_mod  # noqa: E402
import portable_ckpt.storage.local as local  # noqa: E402
from portable_ckpt.errors import CheckpointError  # noqa: E402

MODE = os.environ.get("PCK_BAD_MODE", "")
_real_fsync = os.fsync


def _create_direct(self: Any, path: str, data: bytes) -> bool:
    """create_if_absent that opens and writes manifest.json itself (R-COMMIT-8)."""
    full = self._full(path)
    try:
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    os.write(fd, data)
    _real_fsync(fd)
    os.close(fd)
    local.fsync_dir(os.path.dirname(full))
    return True


def _create_rename(self: Any, path: str, data: bytes) -> bool:
    """create_if_absent with a plain rename() over the target (R-COMMIT-8, R-COMMIT-9)."""
    full = self._full(path)
    tmp = f"{full}.00000000000000aa.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, data)
    _real_fsync(fd)
    os.close(fd)
    os.rename(tmp, full)
    local.fsync_dir(os.path.dirname(full))
    return True


class _Deferred:
    """A stream writer that holds its bytes until the writer index has been written."""

    pending: ClassVar[list[tuple[Any, str, bytes]]] = []

    def __init__(self, storage: Any, path: str) -> None:
        self.storage, self.path = storage, path
        self.parts: list[bytes] = []

    def write(self, data: Any) -> None:
        self.parts.append(bytes(memoryview(data).cast("B")))

    def close(self) -> None:
        _Deferred.pending.append((self.storage, self.path, b"".join(self.parts)))

    def abort(self) -> None:
        self.parts = []

    def __enter__(self) -> _Deferred:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _index_first() -> None:
    """Data and entry files are written only after the writer index (R-INDEX-1)."""
    open_writer = local.LocalStorage.open_writer

    def hook(self: Any, path: str, *, defer_sync: bool = False) -> Any:
        if "/index/w" in path and path.endswith(".json"):
            w = open_writer(self, path, defer_sync=defer_sync)
            real_close = w.close

            def close() -> None:
                real_close()
                for storage, p, data in _Deferred.pending:
                    with open_writer(storage, p) as out:
                        out.write(data)
                _Deferred.pending.clear()
            setattr(w, "close", close)  # noqa: B010 - patch one instance
            return w
        return _Deferred(self, path)

    local.LocalStorage.open_writer = hook  # type: ignore[method-assign]


def _skip_checks() -> None:
    """Coverage and file checks of the committer skipped (R-COMMIT-4)."""
    setattr(commit_mod, "check_coverage", lambda *a, **k: None)  # noqa: B010
    setattr(getattr(commit_mod, "LayoutCache"), "check", lambda *a, **k: None)  # noqa: B009, B010
    real_size = local.LocalStorage.size

    def size(self: Any, path: str) -> int:
        rec = _recorded_sizes(self, path).get(path)
        return rec if rec is not None else int(real_size(self, path))

    local.LocalStorage.size = size  # type: ignore[method-assign]


def _recorded_sizes(storage: Any, path: str) -> dict[str, int]:
    aid = path.split("/", 1)[0]
    out: dict[str, int] = {}
    for p in Path(storage.root, aid, "index").glob("w*.json"):
        for rel, rec in json.loads(p.read_text())["files"].items():
            out[f"{aid}/{rel}"] = rec["size"]
    return out


def _wrong_code() -> None:
    """PCK-USAGE reported instead of PCK-WRITER-MISSING (R-ERR-1)."""
    real = CheckpointError.to_json

    def to_json(self: CheckpointError) -> dict[str, Any]:
        d = dict(real(self))
        if d.get("code") == "PCK-WRITER-MISSING":
            d["code"] = "PCK-USAGE"
        return d

    CheckpointError.to_json = to_json  # type: ignore[method-assign]


def _flip() -> None:
    """The last byte of every data shard changed after its checksum was computed."""
    real_write = local._LocalWriter.write

    def write(self: Any, data: Any) -> None:
        if "/data/" in self._rel and len(data) > 1:
            b = bytearray(memoryview(data).cast("B"))
            b[-1] ^= 0x01
            data = bytes(b)
        real_write(self, data)

    local._LocalWriter.write = write  # type: ignore[method-assign]


MODES = {
    "no-fsync": lambda: setattr(os, "fsync", lambda fd: None),
    "no-dir-fsync": lambda: setattr(local, "fsync_dir", lambda path: None),
    "direct-manifest": lambda: setattr(local.LocalStorage, "create_if_absent", _create_direct),
    "rename-publish": lambda: setattr(local.LocalStorage, "create_if_absent", _create_rename),
    "index-first": _index_first,
    "skip-checks": _skip_checks,
    "wrong-code": _wrong_code,
    "flip": _flip,
}

if MODE in JOB_EDITS:  # zstd-as-none, drop-range, write-twice, ... (job_edits.py)
    rw.main = with_job_edit(rw.main, JOB_EDITS[MODE])
elif MODE:
    MODES[MODE]()

if __name__ == "__main__":
    sys.exit(rw.main(sys.argv))
