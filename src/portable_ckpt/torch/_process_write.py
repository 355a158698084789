"""The write phase of a ``mode="process"`` async save: the rank's writer process does the I/O.

The pieces were staged into :data:`~portable_ckpt.torch._shm.SHARED`; the job sent to the writer
process (:mod:`portable_ckpt.io.writer_process`) names each piece's offset in that segment, its
key, dtype and box, and carries the rank's entries (already JSON). The collectives of the save
protocol stay on this process's background thread, on the dedicated gloo group; on rank 0 the
gathered indexes go back to the writer process, which commits.

One writer process per training process, started on the first process-mode save and reused; if
it died, the next save starts a new one. A failed write is undone by the writer (``abort``); if
the writer itself is gone, this rank's files of the failed attempt are removed here: the
attempt id is fresh and the file names carry this writer's number, so nothing else can match.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
from typing import Any

from portable_ckpt.errors import (
    CheckpointError,
    CommitOutcomeUnknownError,
    UsageError,
    WriterProcessError,
)
from portable_ckpt.format.manifest import WriterIndex, files_bytes
from portable_ckpt.io.commit import logged_commit
from portable_ckpt.io.writer_process import WriterAnsweredError, WriterProcess
from portable_ckpt.logs import get_logger
from portable_ckpt.storage import Storage
from portable_ckpt.torch._collectives import DEFAULT_TIMEOUT_S
from portable_ckpt.torch._shm import SHARED
from portable_ckpt.torch.saving import RankWrite

__all__ = ["ProcessWrite", "check_can_travel", "is_own_file", "writer_process"]


_log = get_logger("torch")


class _Current:
    proc: WriterProcess | None = None


_CURRENT = _Current()
_LOCK = threading.Lock()


def writer_process() -> WriterProcess:
    """Return the writer process of this process (a new one when there is none or it died)."""
    with _LOCK:
        proc = _CURRENT.proc
        if proc is None or not proc.alive():
            if proc is not None:
                proc.close(timeout=1.0)
            proc = _CURRENT.proc = WriterProcess()
            if not _HOOKED:
                _HOOKED.append(True)
                atexit.register(_close_at_exit)  # atexit: after pending saves were finished
        return proc


_HOOKED: list[bool] = []


def _close_at_exit() -> None:
    proc, _CURRENT.proc = _CURRENT.proc, None
    if proc is not None:
        proc.close(timeout=5.0)


def _forget_after_fork() -> None:
    # A forked child (e.g. a DataLoader worker) does not own its parent's writer.
    _CURRENT.proc = None


os.register_at_fork(after_in_child=_forget_after_fork)


def check_can_travel(storage: Storage) -> dict[str, Any]:
    """The storage's :meth:`~Storage.process_spec`, or a usage error naming the fix.

    The description is opened here as the writer process will open it, and must give this
    backend at this root: a backend whose ``url`` was a path was opened there as a local
    directory, and the save committed where the backend never looks (backend review B1). A
    scheme registered in this process only is not found by the writer process (B3).
    """
    from portable_ckpt.storage import open_process_spec, scheme_installed

    what = f"async_save(mode='process'): the root {storage.url or type(storage).__name__!r}"
    spec = storage.process_spec()
    if spec is None:
        raise UsageError(
            f"{what} ({type(storage).__name__}) cannot be opened by another process (its "
            f"process_spec() is None); pass a local path, an s3:// URL or a registered scheme "
            f"whose backend travels (docs/storage-backends.md), or use mode='thread'"
        )
    key = (type(storage), storage.url, json.dumps(spec, sort_keys=True, default=str))
    if key in _TRAVELS:  # each save of each rank asks, in its blocking part
        return spec
    url = str(spec.get("url", ""))
    scheme = url.partition("://")[0] if "://" in url else ""
    if spec.get("kind") == "url" and scheme not in ("", "s3", "file") and not scheme_installed(
        scheme
    ):
        raise UsageError(
            f"{what}: the writer process cannot open {scheme}:// roots: the scheme is "
            "registered in this process only (register_scheme); declare it as an entry "
            "point of the group portable_ckpt.storage in your package's metadata "
            "(docs/storage-backends.md), or use mode='thread'"
        )
    again = open_process_spec(spec)
    try:
        if type(again) is not type(storage) or again.url != storage.url:
            raise UsageError(
                f"{what}: its process_spec() {spec!r} opens a {type(again).__name__} at "
                f"{again.url!r} in another process, not this {type(storage).__name__} at "
                f"{storage.url!r}; return a description that opens this root again "
                "(docs/storage-backends.md), or use mode='thread'"
            )
    finally:
        if again is not storage:  # an opener may give back the very object (a cache: D2)
            again.close()
    _TRAVELS.add(key)
    return spec


#: The (backend type, url, description) that :func:`check_can_travel` opened again and found
#: to be the same root (each save of each rank checks its root).
_TRAVELS: set[tuple[type, str, str]] = set()


class ProcessWrite(RankWrite):
    """:class:`RankWrite` whose files are written by this process's writer process."""

    proc: WriterProcess | None = None

    def write_index(self) -> tuple[int, WriterIndex]:
        """Send the job (the segment by descriptor), wait; return bytes and the index."""
        written, transport = self.write_transport()
        return written, WriterIndex.from_transport(transport)

    def write_transport(self) -> tuple[int, dict[str, Any]]:
        """As :meth:`write_index`, the index passed on as the writer sent it.

        Not parsed here: the committer parses every index (in rank 0's writer process), and
        each parse holds this interpreter's lock while the training loop runs.
        """
        segment = SHARED.segment
        if segment is None:  # pragma: no cover - staging always allocates one
            raise WriterProcessError("process-mode save: nothing was staged")
        job = {
            "op": "write",
            "segment_bytes": segment.size,
            "storage": check_can_travel(self.storage),
            "attempt": self.attempt_id,
            "writer": self.rank,
            "options": self.opts.writer_options(len(self.plan.pieces), self.world),
            "pieces": self._pieces(),
            "entries": self._entries(),
        }
        self.proc = writer_process()
        what = f"save of step {self.opts.step}: rank {self.rank}'s writer process"
        # A writer stopped longer than the save may wait for its peers fails the save; a
        # running one may take as long as its storage needs.
        limit = self.opts.timeout if self.opts.timeout is not None else DEFAULT_TIMEOUT_S
        value = self.proc.request(job, [segment.fd], what=what, stopped_limit=limit)
        return int(value["bytes_written"]), value["index"]

    def commit(self, transports: list[Any], **kwargs: Any) -> int:
        """Rank 0: the writer process checks the indexes and files and publishes the record.

        Logged here as ``commit.*`` events, as a commit in this process is. The writer's own
        refusal is raised as in this process (its class, code and path). A writer that died,
        stayed stopped or broke the protocol once the commit was asked may have published the
        record, or may still (an upload in flight): the record is read back, and a save whose
        record is there committed; otherwise the outcome is unknown
        (:class:`CommitOutcomeUnknownError`: every rank is told, and nothing of the attempt is
        removed; gc classifies it later).
        """
        step, continuation = int(kwargs["step"]), kwargs["continuation"]
        job = {
            "op": "commit",
            "storage": check_can_travel(self.storage),
            "attempt": self.attempt_id,
            "step": step,
            "expected_writers": list(kwargs["expected_writers"]),
            "continuation": continuation.to_json(),
            "transports": transports,
        }
        proc = self.proc = writer_process()
        what = f"save of step {step}: rank 0's writer process (commit)"
        # Half the peers' wait: a stopped writer is given up, and the outcome told to the other
        # ranks, before they stop waiting for rank 0 (commit-child review F3).
        limit = (self.opts.timeout if self.opts.timeout is not None else DEFAULT_TIMEOUT_S) / 2
        with logged_commit(self.storage.url, self.attempt_id, step) as done:
            try:
                value = proc.request(job, what=what, stopped_limit=limit)
            except WriterAnsweredError:
                raise  # it answered: its commit failed, as it would have here
            except WriterProcessError as e:
                value = _published_or_unknown(self.storage, self.attempt_id, e)
                _log.warning("%s: %s; the commit record was read back: the save committed",
                             what, e)
            done(int(value["files"]), int(value["bytes"]))
        return int(value["bytes"])

    def _pieces(self) -> list[dict[str, Any]]:
        out = []
        for p in self.plan.pieces:
            staged = p.array is not None
            out.append({
                "key": p.key,
                "dtype": p.dtype,
                "global_shape": list(p.global_shape),
                "offsets": list(p.offsets),
                "shape": list(p.array.shape) if p.array is not None else None,
                "at": SHARED.offsets[p.slot] if staged else None,
            })
        return out

    def _entries(self) -> list[dict[str, Any]]:
        return [
            {
                "name": e.name,
                "value": e.value,
                "schema": e.schema,
                "scope": e.scope,
                "rank": self.rank if e.scope == "per_rank" else None,
                "policy": e.policy,
            }
            for e in self.plan.entries
        ]

    def abort(self) -> None:
        """Remove what this rank wrote: through the writer, or here when it is gone."""
        proc = self.proc
        if proc is not None and proc.alive():
            try:
                proc.request({"op": "abort", "attempt": self.attempt_id}, what="abort")
                return
            except CheckpointError:
                pass
        _remove_own_files(self.storage, self.attempt_id, self.rank)


def _published_or_unknown(
    storage: Storage, attempt_id: str, lost: WriterProcessError
) -> dict[str, int]:
    """The files and bytes of ``attempt_id`` if its commit record is there and valid.

    Raises:
        CommitOutcomeUnknownError: it is not (or could not be read): the writer may have
            published it, or may yet (commit-child review F2, F5), so nothing is removed.

    """
    from portable_ckpt.io.versions import load_manifest

    try:
        manifest = load_manifest(storage, attempt_id)
    except CheckpointError as e:
        raise CommitOutcomeUnknownError(
            f"{lost}; its commit record of {attempt_id} could not be read back ([{e.code}] "
            f"{e.message[:300]}): the version may be committed, or may become so (an upload "
            "in flight); nothing of it is removed. `portable-ckpt ls` tells which it is; gc "
            "removes it once it is known abandoned",
            path=f"{attempt_id}/manifest.json",
        ) from lost
    return {"files": len(manifest.files), "bytes": files_bytes(manifest.files)}


def _remove_own_files(storage: Storage, attempt_id: str, rank: int) -> None:
    """Delete this writer's data, entry and index files of a failed attempt (best effort)."""
    try:
        for info in list(storage.list(f"{attempt_id}/")):
            if is_own_file(info.path.removeprefix(f"{attempt_id}/"), rank):
                storage.delete(info.path)
    except CheckpointError:
        pass  # gc classifies what stays: the attempt never commits


def is_own_file(rel: str, rank: int) -> bool:
    """Whether writer ``rank`` names an attempt file ``rel`` so (``format.naming``'s rules).

    Data and index files carry ``wNNNNN``; entry values ``.rNNNNN`` (per rank) or ``.g``
    (global, written by rank 0 only).
    """
    top, _, name = rel.partition("/")
    mine = f"w{rank:05d}"
    if top in ("data", "index"):
        return "/" not in name and name.startswith((f"{mine}-", f"{mine}."))
    if top == "entries":
        scopes = [f"r{rank:05d}"] + (["g"] if rank == 0 else [])
        return "/" not in name and any(
            name.endswith((f".{s}.json", f".{s}.json.zst")) for s in scopes
        )
    return False
