"""PyTorch Distributed Checkpoint (DCP) directories: read into, and write from, the portable format.

Reading (:func:`read_dcp_source`)
    A DCP directory written by ``FileSystemWriter`` holds ``.metadata`` (a pickle of
    ``torch.distributed.checkpoint.metadata.Metadata``) and ``__<rank>_<n>.distcp`` files in which
    every stored chunk is one ``torch.save`` zip. Because unpickling ``.metadata`` and byte items
    can run arbitrary code, nothing is read unless the caller passes ``trust_pickle=True``. Then a
    child process (``python -m portable_ckpt.convert._dcp_child``) loads the metadata with torch's
    own ``FileSystemReader.read_metadata`` and byte items with ``torch.load(weights_only=True)``
    and reports them as JSON; the converting process itself never imports torch. Chunk bytes are
    read straight from the ``.distcp`` files: each chunk's zip is parsed and its ``data.pkl``
    interpreted symbolically (no code runs), then exactly the storage bytes are ``pread``.

    Layout is kept: each DCP chunk becomes one range record (offsets/sizes unchanged); no tensor
    is ever gathered. Keys are kept exactly as DCP flattened them (``"model.layer.weight"``,
    ``"optim.state.layer.weight.exp_avg"``, ``"optim.param_groups"``), so a portable checkpoint
    converted back to DCP loads into the same state dict. Byte items whose value is JSON data
    (numbers, strings, bools, None, lists/tuples/dicts of them) become ``pck:json/1`` entries
    (tuples become lists); other byte items are skipped with a warning, or raise
    ``PCK-UNSUPPORTED-VALUE`` when ``strict=True``.

Writing (:func:`write_dcp`)
    Uses DCP's own writer from a single process: ``torch.distributed.checkpoint.save`` with a
    custom :class:`~torch.distributed.checkpoint.SavePlanner` that emits one write item per range
    record (the chunk layout is kept) and resolves each item lazily by reading just that range
    from the portable checkpoint; ``FileSystemWriter(single_file_per_rank=False)`` writes one
    ``.distcp`` file per chunk, so only one chunk is in memory at a time (with
    ``single_file_per_rank=True`` torch keeps every tensor of the file alive until it is closed).
    The result loads with ``torch.distributed.checkpoint.load`` on any world size, since DCP's
    loader reshards chunk layouts itself. Entries are written as DCP byte items (the JSON value).
    Memory: torch itself (~270 MiB RSS) plus one chunk.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from portable_ckpt.convert._model import (
    ChunkSpec,
    ConvertWarning,
    EntrySpec,
    SourcePlan,
    TensorSpec,
)
from portable_ckpt.convert._torchzip import (
    TORCH_DTYPE_NAMES,
    TorchTensorLayout,
    parse_torch_zip,
    read_torch_tensor,
)
from portable_ckpt.errors import (
    CheckpointError,
    CodecError,
    DtypeUnsupportedError,
    FileMissingError,
    FileSizeError,
    PathUnsafeError,
    ShardMismatchError,
    StorageError,
    UnsupportedValueError,
    UsageError,
)
from portable_ckpt.format.dtypes import DTYPES

__all__ = ["TRUST_HELP", "is_dcp_dir", "read_dcp_source", "write_dcp"]

#: Why a trust flag is required (used by the CLI's --help and error messages).
TRUST_HELP = (
    "DCP's .metadata file and its non-tensor items are Python pickles; unpickling can run arbitrary "
    "code, so only pass --trust-pickle for checkpoints from a source you trust"
)
_ENTRY_NAME = re.compile(r"^[A-Za-z0-9._/-]{1,256}$")
_DISTCP = re.compile(r"^__(\d+)_\d+\.distcp$")


def is_dcp_dir(path: str) -> bool:
    """Return whether ``path`` looks like a DCP directory (``.metadata`` or ``*.distcp``)."""
    if not os.path.isdir(path):
        return False
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return ".metadata" in names or any(n.endswith(".distcp") for n in names)


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _read_metadata(root: str) -> dict[str, Any]:
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "portable_ckpt.convert._dcp_child", root],
            capture_output=True,
            env=_child_env(),
            check=False,
        )
    except OSError as exc:
        raise StorageError(f"cannot start the DCP metadata reader: {exc}") from None
    meta_path = os.path.join(root, ".metadata")
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        tail = err[-1] if err else f"exit status {proc.returncode}"
        if "No module named 'torch'" in tail:
            raise UsageError("reading DCP checkpoints needs torch: pip install 'portable-ckpt[torch]'")
        raise StorageError(f"reading {meta_path} failed: {tail}", path=meta_path)
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        raise StorageError(f"reading {meta_path}: the metadata reader returned bad output") from None
    if not isinstance(doc, dict):
        raise StorageError(f"reading {meta_path}: the metadata reader returned bad output")
    if "error" in doc:
        raise ShardMismatchError(f"{meta_path} cannot be unpickled: {doc['error']}", path=meta_path)
    return doc


class _Files:
    """Lazily opened read-only descriptors of the ``.distcp`` files."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._fds: dict[str, int] = {}

    def path(self, rel: str) -> str:
        if (
            not rel
            or rel.startswith("/")
            or "\\" in rel
            or any(p in ("", ".", "..") for p in rel.split("/"))
        ):
            raise PathUnsafeError(
                f"{os.path.join(self.root, '.metadata')} names file {rel!r}, which leaves the "
                "checkpoint directory",
                path=rel,
            )
        return os.path.join(self.root, rel)

    def fd(self, rel: str) -> int:
        fd = self._fds.get(rel)
        if fd is None:
            path = self.path(rel)
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            except FileNotFoundError:
                raise FileMissingError(
                    f"{os.path.join(self.root, '.metadata')} references {path}, which does not "
                    "exist; the checkpoint is incomplete",
                    path=path,
                ) from None
            except OSError as exc:
                raise StorageError(f"open {path}: {exc.strerror}", path=path) from None
            self._fds[rel] = fd
        return fd

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def _loader(files: _Files, layout: TorchTensorLayout, rel: str, where: str) -> Callable[[], np.ndarray[Any, Any]]:
    def load() -> np.ndarray[Any, Any]:
        return read_torch_tensor(files.fd(rel), layout, where=where)

    return load


def read_dcp_source(root: str, *, trust_pickle: bool, strict: bool = False) -> SourcePlan:
    """Describe the DCP checkpoint directory ``root``.

    Args:
        root: directory written by ``torch.distributed.checkpoint`` (FileSystemWriter).
        trust_pickle: allow unpickling ``.metadata`` and byte items (see :data:`TRUST_HELP`).
        strict: raise instead of warning on items that cannot be converted.

    Raises:
        UsageError: ``trust_pickle`` is false.
        FileMissingError: no ``.metadata``, or a referenced ``.distcp`` file is absent.
        FileSizeError: a ``.distcp`` file is shorter than its items (truncated).
        DtypeUnsupportedError: a tensor's dtype is outside the format's table.
        ShardHeaderError, CodecError, ShardMismatchError: a chunk is not what the metadata says.

    """
    if not os.path.isdir(root):
        raise FileMissingError(f"DCP directory {root} does not exist", path=root)
    meta_path = os.path.join(root, ".metadata")
    if not os.path.isfile(meta_path):
        extra = ""
        if any(n.endswith(".metadata") for n in os.listdir(root)):
            extra = " (only per-rank __<rank>.metadata files: saved without coordination; unsupported)"
        raise FileMissingError(
            f"{meta_path} does not exist{extra}; the DCP checkpoint is incomplete or was not "
            "finished (dcp.save writes .metadata last)",
            path=meta_path,
        )
    if not trust_pickle:
        raise UsageError(
            f"refusing to read {meta_path}: {TRUST_HELP}. Re-run with --trust-pickle "
            "(Python: trust_pickle=True) if you trust it",
            path=meta_path,
        )
    doc = _read_metadata(root)
    files = _Files(root)
    warnings: list[ConvertWarning] = []
    tensors: list[TensorSpec] = []
    entries: list[EntrySpec] = []
    ranks: set[int] = set()
    try:
        for fqn, md in sorted(doc.get("tensors", {}).items()):
            tdtype = TORCH_DTYPE_NAMES.get(str(md["dtype"]))
            first = md["chunks"][0]["file"] if md["chunks"] else ".metadata"
            if tdtype is None:
                raise DtypeUnsupportedError(
                    f"{os.path.join(root, first)}: tensor {fqn!r} has dtype torch.{md['dtype']}, "
                    f"which the portable format does not support ({', '.join(DTYPES)}); cast it "
                    "before saving",
                    path=os.path.join(root, first),
                )
            shape = tuple(int(x) for x in md["size"])
            chunks: list[ChunkSpec] = []
            for ch in md["chunks"]:
                rel = str(ch["file"])
                path = files.path(rel)
                m = _DISTCP.match(os.path.basename(rel))
                if m:
                    ranks.add(int(m.group(1)))
                offsets = tuple(int(x) for x in ch["offsets"])
                sizes = tuple(int(x) for x in ch["sizes"])
                if ch.get("transforms"):
                    raise CodecError(
                        f"{path}: chunk of {fqn!r} at {list(offsets)} uses stream transforms "
                        f"{ch['transforms']}, which convert does not support",
                        path=path,
                    )
                if math.prod(sizes) == 0:
                    continue
                where = f"{path} (tensor {fqn!r}, chunk at {list(offsets)})"
                fd = files.fd(rel)
                end = int(ch["offset"]) + int(ch["length"])
                fsize = os.fstat(fd).st_size
                if end > fsize:
                    raise FileSizeError(
                        f"{where}: item needs bytes up to {end} but the file has {fsize} bytes: "
                        "truncated; re-copy the checkpoint",
                        path=path,
                    )
                layout = parse_torch_zip(fd, int(ch["offset"]), int(ch["length"]), where=where)
                if layout.dtype != tdtype or layout.shape != sizes:
                    raise ShardMismatchError(
                        f"{where}: stored tensor is {layout.dtype}{list(layout.shape)} but "
                        f".metadata says {tdtype}{list(sizes)}",
                        path=path,
                    )
                nbytes = math.prod(sizes) * DTYPES[tdtype].itemsize
                chunks.append(ChunkSpec(offsets, sizes, nbytes, path, _loader(files, layout, rel, where)))
            tensors.append(TensorSpec(fqn, tdtype, shape, chunks))
        for fqn, item in sorted(doc.get("bytes", {}).items()):
            m = _DISTCP.match(os.path.basename(str(item.get("file", ""))))
            if m:
                ranks.add(int(m.group(1)))
            reason = None
            if not item.get("ok"):
                reason = f"not convertible ({item.get('reason') or 'unknown value'})"
            elif not _ENTRY_NAME.match(fqn):
                reason = "name is not a valid entry name ([A-Za-z0-9._/-], 1..256 chars)"
            if reason is None:
                entries.append(EntrySpec(fqn, item.get("value")))
                continue
            msg = f"non-tensor item {fqn!r} in {os.path.join(root, str(item.get('file')))}: {reason}"
            if strict:
                raise UnsupportedValueError(msg, path=os.path.join(root, str(item.get("file"))))
            warnings.append(ConvertWarning(fqn, msg + "; skipped"))
        for fqn, why in sorted(doc.get("unsupported", {}).items()):
            if strict:
                raise UnsupportedValueError(f"{meta_path}: item {fqn!r}: {why}", path=meta_path)
            warnings.append(ConvertWarning(fqn, f"{why}; skipped"))
    except CheckpointError:
        files.close()
        raise
    except (KeyError, TypeError, ValueError) as exc:
        files.close()
        raise ShardMismatchError(f"{meta_path}: unexpected metadata structure ({exc})", path=meta_path) from None
    world = max(ranks) + 1 if ranks else 1
    return SourcePlan("dcp", tensors, entries, warnings, world_size=world, close=files.close)


def write_dcp(
    src: Any,
    dst: str,
    *,
    progress: Callable[[int], None] | None = None,
) -> tuple[int, int, list[ConvertWarning]]:
    """Write portable checkpoint ``src`` (an opened checkpoint) as a DCP directory ``dst``.

    See the module docstring for the approach. ``dst`` must not exist or be empty; the directory
    appears with one ``rename`` once ``.metadata`` is written.

    Returns:
        ``(tensors, bytes, warnings)``.

    """
    from portable_ckpt.convert._dcp_export import save_portable_as_dcp
    from portable_ckpt.convert._publish import staged_dir

    with staged_dir(dst) as tmp:
        return save_portable_as_dcp(src, tmp, progress=progress)
