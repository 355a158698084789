"""Saving to and restoring from a node-local fast tier (spec §14.7), correct by design.

Every rank reads and writes only its own node's root. What another node must hold travels over
the job's network (:mod:`portable_ckpt.torch._transfer`):

Save (a :class:`NodeLocalPublisher` plugged into the save protocol):

1. *write*: each rank writes its files to its node root, checks that each is there with its
   recorded size (the committer cannot see other nodes' disks, so every writer attests its own
   files), then sends its files to the rank that keeps its replica (``fast_replicas=1``: same
   local index on the next node) and rank 0 sends its files — global entries and unsharded
   tensors, which every rank reads — to every other node's leader;
2. *commit* (rank 0): the committer's checks run on a view in which files on other nodes have
   the sizes their writers attested; shard headers are checked by the readers (spec §4.2 does
   not require the committer to read them);
3. *publish*: once committed, every other node's leader creates the same ``manifest.json`` in
   its node root.

Restore (:func:`prepare_fast_restore`): each rank lists the files it needs for its target boxes;
a file missing from its node root is fetched from a node whose root holds it (a replica), or the
fast tier is not used for that version.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from portable_ckpt.errors import CheckpointError, FileMissingError, FileSizeError
from portable_ckpt.format import jsonio
from portable_ckpt.format.manifest import Manifest, WriterIndex
from portable_ckpt.io.commit import commit
from portable_ckpt.io.reader import Checkpoint
from portable_ckpt.io.versions import load_manifest
from portable_ckpt.manager.tiers import NodeLayout
from portable_ckpt.storage import ObjectInfo, Storage, StreamWriter
from portable_ckpt.torch._collectives import Comm
from portable_ckpt.torch._transfer import Transfer, run_transfers
from portable_ckpt.torch.flatten import flatten_state
from portable_ckpt.torch.layout import local_layout

__all__ = ["AttestedStorage", "NodeLocalPublisher", "needed_files", "prepare_fast_restore"]


class AttestedStorage(Storage):
    """A node root as rank 0's committer sees it: other nodes' files have attested sizes."""

    def __init__(self, local: Storage, attested: Mapping[str, int]) -> None:
        self.local, self.attested = local, dict(attested)
        self.capabilities = local.capabilities
        self.url = local.url

    def _foreign(self, path: str) -> bool:
        return path in self.attested and not self.local.exists(path)

    def size(self, path: str) -> int:
        return self.attested[path] if self._foreign(path) else self.local.size(path)

    def exists(self, path: str) -> bool:
        return path in self.attested or self.local.exists(path)

    def read_into(self, path: str, offset: int, buf: memoryview) -> None:
        if self._foreign(path):
            raise FileMissingError(f"{path} is on another node (its writer attested it)", path=path)
        self.local.read_into(path, offset, buf)

    def read_all(self, path: str, *, max_size: int) -> bytes:
        return self.local.read_all(path, max_size=max_size)

    def open_writer(self, path: str, *, defer_sync: bool = False) -> StreamWriter:
        return self.local.open_writer(path, defer_sync=defer_sync)

    def put(self, path: str, data: bytes | memoryview) -> None:
        self.local.put(path, data)

    def create_if_absent(self, path: str, data: bytes) -> bool:
        return self.local.create_if_absent(path, data)

    def list(self, prefix: str = "", *, recursive: bool = True) -> Iterator[ObjectInfo]:
        return self.local.list(prefix, recursive=recursive)

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        return self.local.list_dirs(prefix)

    def delete(self, path: str) -> bool | None:
        return self.local.delete(path)

    def sync(self) -> None:
        self.local.sync()

    def local_root(self) -> str | None:
        return self.local.local_root()


def _exchange(
    comm: Comm, transfers: list[Transfer], storage: Storage, attempt: str, paths: Sequence[str] = ()
) -> int:
    """Perform this rank's part of ``transfers`` over ``comm``'s group."""
    return run_transfers(
        transfers,
        rank=comm.rank,
        group=comm.group,
        global_ranks=comm.global_ranks,
        storage=storage,
        attempt=attempt,
        timeout=comm.timeout,
        paths=paths,
    )


def _own_files(storage: Storage, attempt: str, index: WriterIndex) -> dict[str, int]:
    """Return this writer's files (relative to the attempt) with their sizes, checked on its disk."""
    out: dict[str, int] = {}
    paths = list(index.files) + [f"index/w{index.writer:05d}.json"]
    for path in paths:
        full = f"{attempt}/{path}"
        if not storage.exists(full):
            if path.startswith("index/"):
                continue  # indexes handed over in memory need not be stored
            raise FileMissingError(f"{storage.url}/{full}: written but not found", path=full)
        size = storage.size(full)
        rec = index.files.get(path)
        if rec is not None and rec.size != size:
            raise FileSizeError(
                f"{storage.url}/{full}: {size} bytes on the node's disk, the writer recorded "
                f"{rec.size}",
                path=full,
            )
        out[path] = size
    return out


class NodeLocalPublisher:
    """The save-protocol hooks of a node-local tier (see the module docstring)."""

    def __init__(self, layout: NodeLayout) -> None:
        self.layout = layout

    def _transfers(self) -> list[Transfer]:
        lay = self.layout
        out = [Transfer(0, lay.leader(n), ()) for n in range(lay.nodes) if n != lay.node_of_rank[0]]
        for r in range(len(lay.node_of_rank)):
            dst = lay.replica_target(r)
            if dst is not None and r not in lay.everywhere:
                out.append(Transfer(r, dst, ()))
        return out

    def after_write(
        self, comm: Comm, storage: Storage, attempt: str, index: WriterIndex
    ) -> dict[str, int]:
        """Every rank: attest own files, send replicas and rank 0's files; return attestation."""
        own = _own_files(storage, attempt, index)
        _exchange(comm, self._transfers(), storage, attempt, sorted(own))
        return own

    def commit(
        self,
        storage: Storage,
        attempt: str,
        attestations: Sequence[Mapping[str, int]],
        **kwargs: Any,
    ) -> tuple[Manifest, str]:
        """Rank 0: commit on the attested view; return the manifest and its text."""
        sizes = {f"{attempt}/{p}": n for a in attestations for p, n in a.items()}
        manifest = commit(AttestedStorage(storage, sizes), attempt, check_headers=False, **kwargs)
        text = storage.read_all(f"{attempt}/manifest.json", max_size=jsonio.MAX_MANIFEST_BYTES)
        return manifest, text.decode("utf-8")

    def after_commit(self, comm: Comm, storage: Storage, attempt: str, text: str) -> None:
        """Every other node's leader publishes the same commit record in its node root."""
        node = self.layout.node_of_rank[comm.rank]
        if comm.rank != self.layout.leader(node) or node == self.layout.node_of_rank[0]:
            return
        data = text.encode("utf-8")
        rel = f"{attempt}/manifest.json"
        if (
            not storage.create_if_absent(rel, data)
            and storage.read_all(rel, max_size=jsonio.MAX_MANIFEST_BYTES) != data
        ):
            raise CheckpointError(f"{storage.url}/{rel} exists with another commit record")


def needed_files(ck: Checkpoint, state: Mapping[str, Any], rank: int, world: int) -> set[str]:
    """Files of ``ck`` this rank reads to fill ``state`` (target boxes, its entry values)."""
    flat = flatten_state(state, for_load=True)
    out: set[str] = set()
    if ck.manifest.tensor_table is not None:
        out.add(ck.manifest.tensor_table.file)
    for key, t in flat.tensors.items():
        if key not in ck.tensors:
            continue
        layout, _ = local_layout(key, t, rank)
        for box in layout.pieces:
            out.update(item.record.file for item in ck.plan_read(key, box.offsets, box.lengths))
    saved = ck.continuation.world_size
    for e in ck.entries.values():
        if e.scope == "global":
            out.update(v.file for v in e.values)
            continue
        policy = e.world_size_policy
        want = rank if world == saved else (0 if policy == "rank0" else rank % saved)
        if world != saved and policy == "drop":
            continue
        out.update(v.file for v in e.values if v.rank == want)
    return out


def _missing(storage: Storage, attempt: str, manifest: Manifest, paths: set[str]) -> list[str]:
    out = []
    for p in sorted(paths):
        full = f"{attempt}/{p}"
        try:
            if storage.size(full) == manifest.files[p].size:
                continue
        except CheckpointError:
            pass
        out.append(p)
    return out


def prepare_fast_restore(
    comm: Comm,
    layout: NodeLayout,
    storage: Storage,
    attempt: str,
    state: Mapping[str, Any],
    manifest_text: str,
) -> tuple[bool, dict[str, Any]]:
    """Make every file each rank needs present in its node root, fetching from peer nodes.

    Collective over ``comm``. Returns ``(usable, report)``: usable when, afterwards, every rank's
    needed files are in its node root with their recorded sizes.
    """
    rel = f"{attempt}/manifest.json"
    agreed = manifest_text.encode("utf-8")
    what, outcome = f"fast restore of {attempt}", "the restore tries the next version"

    # Every local step is agreed (all_gather_step): a rank that failed alone (a node's torn copy
    # of the record, a full or read-only disk) left its peers waiting for the collective timeout.
    def needs() -> tuple[tuple[Manifest, set[str]], list[str]]:
        # The record every rank agreed on (rank 0's) is parsed, never this node's own copy.
        manifest = load_manifest(storage, attempt, known={attempt: agreed})
        if storage.exists(rel) and storage.read_all(rel, max_size=len(agreed)) != agreed:
            raise FileSizeError(
                f"{storage.url}/{rel}: this node root's copy of the commit record differs from "
                "the one the other nodes hold (damaged on this node's disk)",
                path=rel,
            )
        need = needed_files(Checkpoint(storage, attempt, manifest), state, comm.rank,
                            comm.world_size)
        return (manifest, need), _missing(storage, attempt, manifest, need)

    (manifest, need), wanted = comm.all_gather_step(
        "restore/fast-needs", needs, what=what, outcome=outcome
    )
    union = sorted({p for m in wanted for p in m})
    have = [p for p in union if p not in _missing(storage, attempt, manifest, {p})]
    holders = comm.allgather_json(have, "restore/fast-haves")
    transfers, unreachable = _fetch_plan(layout, wanted, holders)
    report = {"missing": sum(len(m) for m in wanted), "unreachable": unreachable}
    if unreachable:
        return False, report
    # A file is fetched once per node, by one of its ranks: the others may check it only once
    # that rank has written it (run_transfers returns then), so every rank's fetch ends first.
    comm.all_gather_step(
        "restore/fast-fetched",
        lambda: (_exchange(comm, transfers, storage, attempt), None),
        what=what,
        outcome=outcome,
    )
    report["fetched"] = sum(len(t.paths) for t in transfers)

    def ready() -> tuple[None, bool]:
        # The record goes into this node root only once its ranks' files are all there:
        # written before, a replacement node's empty root kept records of versions it never
        # held (listed as committed, kept by retention, tried by every restore).
        if _missing(storage, attempt, manifest, need):
            return None, False
        if not storage.exists(rel):
            storage.create_if_absent(rel, agreed)
        return None, True

    _, ok = comm.all_gather_step("restore/fast-ready", ready, what=what, outcome=outcome)
    return all(ok), report


def _fetch_plan(
    layout: NodeLayout, wanted: Sequence[Sequence[str]], holders: Sequence[Sequence[str]]
) -> tuple[list[Transfer], int]:
    """One provider per (rank, file): a rank holding it, preferring the requester's own node."""
    transfers: list[Transfer] = []
    unreachable = 0
    have = [set(h) for h in holders]
    fetched: set[tuple[int, str]] = set()  # one copy per node root, not per rank
    for r, paths in enumerate(wanted):
        node = layout.node_of_rank[r]
        for p in paths:
            if (node, p) in fetched:
                continue
            src = next((q for q in range(len(have)) if p in have[q]), None)
            if src is None:
                unreachable += 1
                continue
            fetched.add((node, p))
            transfers.append(Transfer(src, r, (p,)))
    return transfers, unreachable
