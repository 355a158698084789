"""portable_ckpt: versioned, sharded, portable training checkpoints.

The core (this package without ``portable_ckpt.torch``) needs no torch::

    import portable_ckpt
    ck = portable_ckpt.open("/ckpts/run1")          # latest committed version
    w = ck.read("model.w", offsets=[0, 0], lengths=[8, 8])
"""

from __future__ import annotations

__version__ = "0.1.0"

import logging
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from portable_ckpt import errors
from portable_ckpt.errors import (
    CheckpointError,
    CommitOutcomeUnknownError,
    NotFoundError,
)
from portable_ckpt.format import usage

if TYPE_CHECKING:  # what __getattr__ imports lazily, typed for mypy (it saw Any: api review 31)
    from portable_ckpt.format.manifest import FORMAT_VERSION, Continuation, Manifest, Mesh
    from portable_ckpt.io.gc import gc
    from portable_ckpt.io.reader import NO_VALUE, Checkpoint
    from portable_ckpt.io.versions import list_versions
    from portable_ckpt.storage.base import Storage

# Quiet by default: the job log shows portable_ckpt's records once the application configures
# logging (see portable_ckpt.logs).
logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [  # all but errors and open are imported lazily (see __getattr__)
    "FORMAT_VERSION",
    "Checkpoint",
    "CheckpointError",
    "Continuation",
    "Manifest",
    "Mesh",
    "NO_VALUE",
    "__version__",
    "errors",
    "gc",
    "list_versions",
    "open",
    "save_arrays",
]


def __getattr__(name: str) -> Any:
    # Lazy imports keep `import portable_ckpt` light (numpy alone takes a tenth of a second):
    # the CLI's start-up, where a Ctrl-C would print a traceback, stays short (ops review F15).
    if name in ("FORMAT_VERSION", "Continuation", "Manifest", "Mesh"):
        from portable_ckpt.format import manifest

        return getattr(manifest, name)
    if name in ("Checkpoint", "NO_VALUE"):
        from portable_ckpt.io import reader

        return getattr(reader, name)
    if name == "list_versions":
        from portable_ckpt.io.versions import list_versions

        return list_versions
    if name == "gc":
        from portable_ckpt.io.gc import gc

        return gc
    if hasattr(errors, name):
        return getattr(errors, name)
    raise AttributeError(name)


def _split_version(text: str) -> tuple[str, str] | None:
    """``(root, attempt id)`` when a root's ``text`` names a version directory, else ``None``.

    A local path is made absolute first (its root is then the directory above).
    """
    from portable_ckpt.format.naming import ATTEMPT_ID_RE
    from portable_ckpt.storage import local_path

    local = local_path(text)
    text = (text if local is None else os.path.abspath(local)).rstrip("/")
    parent, _, base = text.rpartition("/")
    if ATTEMPT_ID_RE.match(base) and parent:
        return parent, base
    return None


def open(path: str | os.PathLike[str] | Storage, step: int | None = None) -> Checkpoint:
    """Open a committed version for reading.

    Args:
        path: A checkpoint root (resolves to its latest committed version, or to ``step``), or a
            version directory (an attempt id as last component). Local path or ``s3://...``,
            or a storage backend instance (a root).
        step: With a root, open the newest committed version of this step.

    Returns:
        A :class:`portable_ckpt.io.reader.Checkpoint`.

    Raises:
        NotFoundError: no committed version at the root (for ``step``), or a version
            directory of another step than ``step``.
        ManifestMissingError: a version directory that was never committed.

    Warns:
        PassedOverWarning: a newer attempt of the root was passed over: its commit record is
            lost or damaged, or of a newer format (the message says what to do).

    """
    from portable_ckpt.io.reader import Checkpoint

    return Checkpoint(*_resolve(path, step))


def _resolve(path: str | os.PathLike[str] | Storage, step: int | None) -> tuple[Any, str, Any]:
    """``(storage, attempt id, manifest)`` of the version :func:`open` opens (nothing else read).

    A verifier that finds damage while the version is opened (a tensor table) knows from this
    which version to record as damaged.
    """
    from portable_ckpt.io.versions import latest, load_manifest
    from portable_ckpt.storage import Storage, open_storage, root_text

    step = None if step is None else usage.strict_int(step, "open: step", minimum=0)
    if isinstance(path, Storage):  # a backend instance is a root (docs/storage-backends.md)
        return (path, *latest(path, step))
    text = root_text(path)
    split = _split_version(text)
    if split is not None:
        root, attempt = split
        storage = open_storage(root)
        manifest = load_manifest(storage, attempt)
        if step is not None and manifest.step != step:
            raise NotFoundError(  # the version exists: what is missing is the step asked for
                f"{text} is the version of step {manifest.step}, not {step}: pass its root to "
                f"find step {step}, or drop step"
            )
        return storage, attempt, manifest
    storage = open_storage(text)
    try:
        attempt, manifest = latest(storage, step)
    except NotFoundError:
        from portable_ckpt.io.versions import enclosing_version

        version = enclosing_version(text)
        if version is None:
            raise
        root = os.path.dirname(version)
        raise NotFoundError(  # `ls` of the same path said so; open() named no version (M9)
            f"{text} lies inside the version {version}, not a root: open the version itself "
            f"(portable_ckpt.open({version!r})), or its root {root!r}"
        ) from None
    return storage, attempt, manifest


def save_arrays(
    root: str | os.PathLike[str] | Storage,
    arrays: dict[str, Any],
    *,
    step: int,
    entries: dict[str, Any] | None = None,
    continuation: Continuation | None = None,
    codec: str = "none",
    tiles: Mapping[str, Sequence[int]] | None = None,
    block_size: int | None = None,
) -> Manifest:
    """Save numpy arrays (and JSON entries, schema ``pck:json/1``) as one version, one process.

    Args:
        root: Checkpoint root: a local path, ``s3://...``, a registered scheme's URL, or a
            backend object (:class:`~portable_ckpt.storage.base.Storage`).
        arrays: Tensor key → array.
        step: The completed step the version holds.
        entries: Entry name → JSON value.
        continuation: The continuation contract (default: exact, world size 1).
        codec: ``"none"`` or ``"zstd"``.
        tiles: Key → tile shape (one length per dimension): that array is stored as one range
            per tile, so a read of a small region (a square of a large matrix) fetches only the
            tiles it touches; the others are one row-major range each, best for row slabs.
        block_size: Checksum block size of every file (a power of two, 4 KiB … 1 GiB); default:
            chosen per file. Smaller blocks make small reads exact at the cost of a longer
            checksum list in the manifest (8 hex digits per block).

    Returns:
        The published manifest.

    Raises:
        UsageError: ``arrays``, ``entries`` or ``tiles`` not a dict, a ``tiles`` key that is
            not in ``arrays``, a bad tile or an invalid ``continuation`` (before anything is
            written), a bad block size or entry name (before any file is written).

    """
    import numpy as np

    from portable_ckpt.format.manifest import check_continuation
    from portable_ckpt.io.commit import commit
    from portable_ckpt.io.writer import ShardWriter, new_attempt_id, tile_lengths
    from portable_ckpt.storage import open_storage

    arrays = usage.mapping(arrays, "save_arrays: arrays")
    entries = usage.mapping(entries, "save_arrays: entries", allow_none=True)
    tiles = usage.mapping(tiles, "save_arrays: tiles", allow_none=True)
    unknown = sorted(set(tiles or {}) - set(arrays))
    if unknown:
        raise errors.UsageError(f"save_arrays: tiles names keys that are not arrays: {unknown}")
    for key, tile in (tiles or {}).items():
        tile_lengths(key, tile, np.shape(arrays[key]))
    continuation = usage.continuation_or_none(continuation, "save_arrays: continuation")
    if continuation is not None:
        check_continuation(continuation, "save_arrays: continuation")
    storage = open_storage(root, create=True)
    attempt = new_attempt_id(step)
    w = ShardWriter(storage, attempt, 0, codec=codec, write_index=False, block_size=block_size)
    try:
        for key, arr in arrays.items():
            if tiles is not None and key in tiles:
                w.add_tiled(key, arr, tiles[key])
            else:
                w.add_tensor(key, arr)
        for name, value in (entries or {}).items():
            w.add_entry(name, value)
        idx = w.finish()
        return commit(
            storage,
            attempt,
            step=step,
            indexes=[idx],
            expected_writers=[0],
            continuation=continuation,
        )
    except CommitOutcomeUnknownError:
        raise  # the version may be committed: its files stay (R-COMMIT-19)
    except BaseException:
        w.abort(dirs=True)  # the only writer: nothing else writes the attempt
        raise
