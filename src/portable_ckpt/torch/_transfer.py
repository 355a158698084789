"""Copy files of an attempt from one rank's storage to another rank's, over a gloo group.

Node-local tiers cannot read each other's disks: a replica on a peer node, or a file a restoring
rank lacks, travels over the network. Transfers are executed in one global order that every
rank computes identically; each rank performs, in that order, the sends and receives it takes
part in, with blocking point-to-point calls — with a shared order the earliest unfinished
transfer always has both of its ranks waiting on it, so there is no deadlock. Bytes move in
chunks of at most ``chunk`` bytes (bounded memory); the receiver writes through
``Storage.open_writer`` (durable on close), checks the size it was announced, and syncs the
storage (names durable) before it returns.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from portable_ckpt.errors import (
    CheckpointError,
    DistributedError,
    FileMissingError,
    FileSizeError,
    StorageError,
)
from portable_ckpt.format.paths import check_relative_path
from portable_ckpt.storage import Storage

__all__ = ["Transfer", "run_transfers"]

_log = logging.getLogger("portable_ckpt")
_CHUNK = 16 << 20


@dataclass(frozen=True)
class Transfer:
    """Files (paths relative to the attempt) that ``src`` sends to ``dst`` (group ranks).

    Empty ``paths``: the sender's own list (the ``paths`` argument of :func:`run_transfers`);
    the receiver learns the paths and sizes from the sender's header either way.
    """

    src: int
    dst: int
    paths: tuple[str, ...] = ()


def _wait(work: Any, timeout: float, what: str) -> None:
    try:
        work.wait(_dt.timedelta(seconds=timeout))
    except Exception as e:
        raise DistributedError(f"file transfer ({what}) failed: {e}") from e


def _send_json(obj: Any, dst: int, group: Any, timeout: float) -> None:
    data = json.dumps(obj).encode("utf-8")
    _wait(
        dist.isend(torch.tensor([len(data)], dtype=torch.int64), dst, group=group),
        timeout,
        "header",
    )
    if data:
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        _wait(dist.isend(buf, dst, group=group), timeout, "header")


def _recv_json(src: int, group: Any, timeout: float) -> Any:
    n = torch.zeros(1, dtype=torch.int64)
    _wait(dist.irecv(n, src, group=group), timeout, "header")
    buf = torch.empty(int(n.item()), dtype=torch.uint8)
    if buf.numel():
        _wait(dist.irecv(buf, src, group=group), timeout, "header")
    return json.loads(bytes(buf.numpy()))


def _send(
    paths: Sequence[str],
    storage: Storage,
    attempt: str,
    dst: int,
    group: Any,
    timeout: float,
    chunk: int,
) -> int:
    failed: CheckpointError | None = None
    try:
        sizes = [storage.size(f"{attempt}/{p}") for p in paths]
    except CheckpointError as e:  # nothing to send: the receiver learns of no file
        paths, sizes, failed = [], [], e
    _send_json([list(paths), sizes], dst, group, timeout)
    buf = torch.empty(chunk, dtype=torch.uint8)
    view = memoryview(buf.numpy().data)
    for path, size in zip(paths, sizes, strict=True):
        ok = True
        for off in range(0, size, chunk):
            n = min(chunk, size - off)
            if ok:
                try:
                    storage.read_into(f"{attempt}/{path}", off, view[:n])
                except CheckpointError as e:
                    # The declared bytes are still sent (zeros), and the trailer says the file
                    # is void: the receiver drops it instead of waiting for the timeout.
                    ok, failed = False, failed or e
            if not ok:
                buf[:n].zero_()
            _wait(dist.isend(buf[:n], dst, group=group), timeout, path)
        _wait(dist.isend(torch.tensor([0 if ok else 1], dtype=torch.uint8), dst, group=group),
              timeout, path)
    if failed is not None:
        raise failed
    return sum(sizes)


def _clear_partial(storage: Storage, rel: str, size: int) -> None:
    """Remove what an interrupted earlier fetch of ``rel`` left (a process killed mid-file).

    Files are written under their final name; a killed receiver leaves a short file there that
    would refuse every later fetch ("attempts never overwrite files"). Only a file positively of
    another size than the peer's copy goes: one that cannot be sized fails the fetch as before.
    """
    try:
        have = storage.size(rel)
    except FileMissingError:
        return
    if have != size:
        _log.warning("%s: %d bytes of %d, left by an interrupted fetch; fetching it again",
                     rel, have, size)
        storage.delete(rel)


def _recv(storage: Storage, attempt: str, src: int, group: Any, timeout: float, chunk: int) -> int:
    paths, sizes = _recv_json(src, group, timeout)
    buf = torch.empty(chunk, dtype=torch.uint8)
    failed: CheckpointError | None = None
    refused = False  # this disk refused a write: the rest is received and dropped
    for path, size in zip(paths, sizes, strict=True):
        rel = f"{attempt}/{check_relative_path(path, what='transferred file')}"
        writer = None
        voided = False
        if not refused:
            try:
                _clear_partial(storage, rel, size)
                writer = storage.open_writer(rel)
            except CheckpointError as e:
                refused, failed = True, failed or e
        try:
            for off in range(0, size, chunk):
                n = min(chunk, size - off)
                _wait(dist.irecv(buf[:n], src, group=group), timeout, path)
                if writer is not None:
                    try:
                        writer.write(buf.numpy().data[:n])
                    except CheckpointError as e:
                        # A full or read-only disk: keep receiving (and dropping) the rest, so
                        # the sender finishes and the failure is agreed, not a peer's timeout.
                        writer.abort()
                        writer, refused, failed = None, True, failed or e
            trailer = torch.zeros(1, dtype=torch.uint8)
            _wait(dist.irecv(trailer, src, group=group), timeout, path)
            if int(trailer.item()) != 0:  # the sender could not read it: void
                voided = True
                if writer is not None:
                    writer.abort()
                    writer = None
                failed = failed or StorageError(
                    f"{storage.url}/{rel}: the sending rank could not read its copy (it names "
                    "the error); nothing was kept",
                    path=rel,
                )
            if writer is not None:
                try:
                    writer.close()
                except CheckpointError as e:  # fsync on a full disk: the next files drain too
                    writer.abort()
                    writer, refused, failed = None, True, failed or e
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
        if not refused and not voided and storage.size(rel) != size:
            raise FileSizeError(
                f"{storage.url}/{rel}: received {storage.size(rel)} of {size} bytes", path=rel
            )
    if failed is not None:
        raise failed
    return int(sum(sizes))


def run_transfers(
    transfers: Sequence[Transfer],
    *,
    rank: int,
    group: Any,
    global_ranks: Sequence[int],
    storage: Storage,
    attempt: str,
    timeout: float,
    paths: Sequence[str] = (),
    chunk: int = _CHUNK,
) -> int:
    """Perform this rank's part of ``transfers`` (identical list on every rank); return bytes."""
    moved = 0
    received = False
    failed: CheckpointError | None = None
    for t in sorted(transfers, key=lambda t: (t.src, t.dst, t.paths)):
        if t.src == t.dst:
            continue
        try:
            if rank == t.src:
                mine = t.paths or tuple(paths)
                moved += _send(mine, storage, attempt, global_ranks[t.dst], group, timeout, chunk)
            elif rank == t.dst:
                received = True
                moved += _recv(storage, attempt, global_ranks[t.src], group, timeout, chunk)
        except DistributedError:
            raise  # the peer is gone: nothing to agree with over this group
        except CheckpointError as e:  # this disk refused (the transfer ran to its end): go on
            failed = failed or e
    if failed is not None:
        raise failed
    if received:
        # The received names must be durable before this rank reports them (the commit record
        # that follows counts on them): R-COMMIT-17 for the files a node-local tier copies.
        storage.sync()
    return moved
