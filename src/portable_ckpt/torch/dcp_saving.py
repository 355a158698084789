"""Saving through PyTorch Distributed Checkpoint: ``dcp.save`` / ``dcp.async_save`` onto the format.

:class:`PortableStorageWriter` is DCP's storage layer, :class:`PortableSavePlanner` its planner
for strided DTensors; the protocol is in :mod:`portable_ckpt.torch.dcp`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
from collections.abc import Mapping
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
)
from torch.distributed.checkpoint.planner import (
    SavePlan,
    SavePlanner,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from portable_ckpt.errors import (
    CheckpointError,
    CommitOutcomeUnknownError,
    DistributedError,
    UnsupportedValueError,
    UsageError,
)
from portable_ckpt.format import jsonio
from portable_ckpt.format.keys import (
    DCP_ITEMS_ENTRY,
    MAX_KEY,
    DcpPath,
    dcp_items_value,
    has_position,
)
from portable_ckpt.format.manifest import CODECS, Continuation, Mesh, WriterIndex
from portable_ckpt.format.usage import (
    flag,
    require_non_negative_int,
    require_one_of,
    strict_int,
)
from portable_ckpt.format.vocab import CONTRACTS
from portable_ckpt.io.commit import commit
from portable_ckpt.io.tensor_table import TABLE_THRESHOLD
from portable_ckpt.io.versions import refuse_root_in_version
from portable_ckpt.io.writer import (
    ShardWriter,
    check_block_size,
    committed_or_unknown,
    new_attempt_id,
)
from portable_ckpt.logs import get_logger, log_event
from portable_ckpt.storage import Storage, open_storage
from portable_ckpt.torch._collectives import by_rank
from portable_ckpt.torch._dcp_common import Root, check_root, refuse_one_box_view, strided_pieces
from portable_ckpt.torch._dcp_keys import json_leaves, portable_key
from portable_ckpt.torch._tensors import numpy_view
from portable_ckpt.torch.flatten import VALUES_ENTRY, encode_json
from portable_ckpt.torch.layout import Piece, group_mesh

__all__ = ["PortableSavePlanner", "PortableStorageWriter"]

#: FQN of the one extra result each rank returns from ``write_data`` (its writer index).
_RESULT_FQN = "portable_ckpt/writer"
_log = get_logger("torch")


@dataclasses.dataclass(frozen=True)
class _SpecRoot:
    """A storage root as it travels to another process (``Storage.process_spec``)."""

    spec: dict[str, Any]


class PortableSavePlanner(DefaultSavePlanner):
    """``DefaultSavePlanner`` that describes strided DTensor layouts exactly and never pickles.

    DCP's default planner writes each DTensor's local data as one box at its first offset,
    which is wrong when the local rows of a ``_StridedShard`` layout are not contiguous in the
    global tensor. This planner writes one item per box (:func:`~portable_ckpt.torch.layout.
    dtensor_layout`), and serialises non-tensor items as JSON instead of ``torch.save``.
    Needed only for such layouts; FSDP2 on tensor parallelism gives one box per rank.
    """

    def create_local_plan(self) -> SavePlan:
        """The default plan, with the item of every multi-box DTensor split into its boxes."""
        plan = super().create_local_plan()
        self._pieces: dict[MetadataIndex, Piece] = {}
        strided = strided_pieces(self.state_dict)
        if not strided:
            return plan
        items: list[WriteItem] = []
        for item in plan.items:
            pieces = strided.get(item.index.fqn)
            if pieces is None or item.tensor_data is None:
                items.append(item)
                continue
            for p in pieces:
                index = MetadataIndex(item.index.fqn, p.offsets)
                self._pieces[index] = p
                items.append(
                    WriteItem(
                        index=index,
                        type=WriteItemType.SHARD,
                        tensor_data=TensorWriteData(
                            chunk=ChunkStorageMetadata(
                                torch.Size(p.offsets), torch.Size(p.lengths)
                            ),
                            properties=item.tensor_data.properties,
                            size=item.tensor_data.size,
                        ),
                    )
                )
        self.plan = dataclasses.replace(plan, items=items)
        return self.plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor | io.BytesIO:
        """The box's view of the local tensor for split items; else the default."""
        piece = getattr(self, "_pieces", {}).get(write_item.index)
        if piece is not None:
            local: torch.Tensor = self.state_dict[write_item.index.fqn].to_local()
            return local[piece.local_slices()]
        return super().resolve_data(write_item)

    def transform_object(self, write_item: WriteItem, object: Any) -> Any:
        """Non-tensor items as UTF-8 JSON bytes (never ``torch.save``)."""
        if write_item.type == WriteItemType.BYTE_IO:
            return io.BytesIO(jsonio.dumps(encode_json(object, key=write_item.index.fqn)))
        return object


class PortableStorageWriter(StorageWriter):
    """A DCP ``StorageWriter`` that saves one portable_ckpt version.

    Args:
        root: Checkpoint root (local path or ``s3://...``; a :class:`~portable_ckpt.storage.
            Storage` works for threads; ``async_save`` in process mode pickles the writer into
            the checkpoint process, where a backend travels as its ``process_spec`` and one
            without is refused with :class:`~portable_ckpt.errors.UsageError`).
        step: The completed training step (in the attempt id and the manifest).
        continuation: ``"exact"`` or ``"statistical"`` (see ``docs/torch.md``).
        codec: ``"none"`` or ``"zstd"`` for tensor chunks.
        block_size: Checksum block size (default: the writer's).
        max_file_bytes: Start a new shard file beyond this size.
        tensor_table: Describe ranges in tensor tables (format 1.1); default when the job holds
            more than 65,536 range records.

    After ``dcp.save`` returns, :attr:`attempt_id` is the published version's id on every rank.
    Every save through the writer publishes a new version of :attr:`step` (an attribute: set it
    before each save of a writer kept across saves, or make a new writer per save); DCP's
    ``checkpoint_id`` (``reset``) changes the root. A writer that published a version and saves
    again at the same step says so once (a warning on the coordinator: logger
    ``portable_ckpt.torch``, event ``save.writer_reused``, and stderr): that second version
    carries the first one's step.

    """

    def __init__(
        self,
        root: Root,
        *,
        step: int,
        continuation: str = "exact",
        codec: str = "none",
        block_size: int | None = None,
        max_file_bytes: int = 4 << 30,
        tensor_table: bool | None = None,
    ) -> None:
        require_non_negative_int(step, "step")
        require_one_of(continuation, CONTRACTS, "continuation")
        require_one_of(codec, CODECS, "codec")
        check_block_size(block_size)  # at construction, not after DCP has planned the save
        self.root = check_root(root)
        self.step = step
        self.continuation = continuation
        self.codec = codec
        self.block_size = block_size
        # (0, -5, 1.5 and "no" were taken, as by save(): api review 31)
        self.max_file_bytes = strict_int(max_file_bytes, "max_file_bytes", minimum=1)
        flag(tensor_table, "tensor_table", allow_none=True)
        self.tensor_table = tensor_table
        #: ``(step, attempt id)`` of the last version this writer published (coordinator).
        self._published: tuple[int, str] | None = None
        self._reuse_said = False
        self.reset()

    def __getstate__(self) -> dict[str, Any]:
        # Process-mode async_save sends the writer to the checkpoint process before a save starts.
        state = dict(self.__dict__)
        state["_storage"] = state["_writer"] = None
        if isinstance(self.root, Storage):
            # A backend object holds locks and connections: pickle said only "cannot pickle
            # '_thread.lock' object" (DCP integrator review 23, 10). One that can say how
            # another process opens it travels as that; any other is refused by name.
            spec = self.root.process_spec()
            if spec is None:
                raise UsageError(
                    f"PortableStorageWriter: its root is a {type(self.root).__name__} object, "
                    "which cannot be sent to another process (async_save's process mode "
                    "pickles the writer): give the root as a path or an s3:// URL, or use "
                    "async_checkpointer_type=AsyncCheckpointerType.THREAD")
            state["root"] = _SpecRoot(spec)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        root = state.get("root")
        if isinstance(root, _SpecRoot):
            from portable_ckpt.storage import open_process_spec

            state["root"] = open_process_spec(root.spec)
        self.__dict__.update(state)

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """Start a new save (``checkpoint_id``, when given, is the root)."""
        if checkpoint_id is not None:
            self.root = check_root(checkpoint_id)
        refuse_root_in_version(self.root)  # at once, before DCP plans the save
        self.attempt_id: str | None = None
        self.rank = 0
        self.is_coordinator = True
        self._storage: Storage | None = None
        self._writer: ShardWriter | None = None
        self._mesh: Mesh | None = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Record this rank's role (DCP passes ``rank`` and ``use_collectives``)."""
        if kwargs.get("use_collectives", True) is False:
            raise UsageError(
                "PortableStorageWriter needs DCP's collectives (one coordinator commits the "
                "version); call dcp.save without use_collectives=False"
            )
        rank = kwargs.get("rank")
        if rank is None:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.rank = int(rank)
        self.is_coordinator = bool(is_coordinator)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """Add the rank's step, which the coordinator compares with the others'."""
        return dataclasses.replace(plan, storage_data={"step": self.step})

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Give every rank's plan the fresh attempt id and the world size (coordinator)."""
        if any(not p.usable for p in plans):
            raise UsageError(
                "DCP plan caching reuses an earlier save's plans, attempt id included; every "
                "portable_ckpt save needs a fresh attempt: drop enable_plan_caching=True"
            )
        steps = [p.storage_data.get("step") if isinstance(p.storage_data, dict) else None
                 for p in plans]
        if any(s is not None and s != self.step for s in steps):  # (None: no local plan's)
            # Ranks whose writers had other steps were committed under the coordinator's: a
            # version of one step holding other steps' state (api review 31).
            raise UsageError(
                f"the ranks' PortableStorageWriters have different steps ("
                f"{by_rank(steps, 'step')}); every rank must save the "
                "same step. Nothing was saved"
            )
        self._say_reused()
        data = {"attempt_id": new_attempt_id(self.step), "world_size": len(plans)}
        return [dataclasses.replace(p, storage_data=dict(data)) for p in plans]

    def _say_reused(self) -> None:
        """Warn, once per writer, when it saves again at the step of a version it published.

        ``step`` is the writer's, not DCP's: a writer kept across saves (DCP calls only
        ``reset`` between them) labelled every version with its first step (DCP integrator
        review 26, 4).
        """
        published = getattr(self, "_published", None)  # (a writer unpickled from older state)
        if published is None or published[0] != self.step or getattr(self, "_reuse_said", False):
            return
        self._reuse_said = True
        step, previous = published
        msg = (
            f"PortableStorageWriter saves again at step {step}: it published {previous} at "
            f"that step, so this version is labelled step {step} too. A writer's step is "
            "its own, not DCP's: make a new PortableStorageWriter(root, step=N) for each save, "
            "or set writer.step = N before it (said once per writer)"
        )
        from portable_ckpt.torch._inflight import say

        root = os.fspath(self.root) if isinstance(self.root, str | os.PathLike) else self.root.url
        log_event(_log, "save.writer_reused", {"step": step, "previous": previous, "root": root},
                  "%s", msg, rank=self.rank, level=logging.WARNING)
        say(msg)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Write this rank's items with its own ``ShardWriter`` (see the module docstring)."""
        self.attempt_id, world = _attempt_of(plan, planner)
        state = getattr(planner, "state_dict", None)
        if isinstance(state, Mapping):
            self._mesh = group_mesh(state.values())
            refuse_one_box_view(planner, (i.index.fqn for i in plan.items), PortableSavePlanner)
        self._storage = open_storage(self.root, create=True)  # (reset() refused a version)
        writer = self._new_writer(self._storage, len(plan.items) * world)
        try:
            results, values, items = self._write_items(writer, plan, planner)
            index = None if self.is_coordinator else writer.finish()
        except BaseException:
            with contextlib.suppress(Exception):  # the first error is the one that counts
                writer.abort()
            raise
        self._writer = writer if self.is_coordinator else None
        doc = {
            "writer": self.rank,
            "index": index.to_transport() if index is not None else None,
            "values": values,
            "items": items,
            "mesh": None if self._mesh is None else self._mesh.to_json(),
        }
        results.append(WriteResult(MetadataIndex(_RESULT_FQN), writer.stats.bytes_written, doc))
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def _new_writer(self, storage: Storage, records: int) -> ShardWriter:
        kwargs: dict[str, Any] = {
            "codec": self.codec,
            "max_file_bytes": self.max_file_bytes,
            "tensor_table": (
                self.tensor_table if self.tensor_table is not None else records > TABLE_THRESHOLD
            ),
        }
        if self.block_size is not None:
            kwargs["block_size"] = self.block_size
        if self.attempt_id is None:  # pragma: no cover - set by write_data
            raise UsageError("no attempt id")
        return ShardWriter(storage, self.attempt_id, self.rank, **kwargs)

    def _write_items(
        self, writer: ShardWriter, plan: SavePlan, planner: SavePlanner
    ) -> tuple[list[WriteResult], dict[str, Any], list[list[str | int]]]:
        keys = plan.planner_data if isinstance(plan.planner_data, Mapping) else {}
        results: list[WriteResult] = []
        values: dict[str, Any] = {}
        paths: list[DcpPath] = []
        for item in plan.items:
            path = keys.get(item.index.fqn)
            path = tuple(path) if isinstance(path, tuple | list) else (item.index.fqn,)
            key = portable_key(path)
            if item.type == WriteItemType.BYTE_IO:
                leaves = json_leaves(key, _byte_value(planner, item), fqn=item.index.fqn)
                _check_leaf_keys(leaves, item.index.fqn)
                values.update(leaves)
                if list(leaves) != [key] or has_position(path):
                    paths.append(path)  # not an item of its own key alone
                results.append(WriteResult(item.index, len(jsonio.dumps(leaves)), key))
            else:
                if has_position(path):
                    paths.append(path)
                results.append(
                    WriteResult(item.index, _add_tensor(writer, key, item, planner), key)
                )
        if self.is_coordinator:
            writer.flush()  # its entries and index follow in finish(), once every rank reported
        return results, values, dcp_items_value(paths)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Write the JSON entry, finish the coordinator's writer and commit (coordinator)."""
        storage, writer, attempt = self._storage, self._writer, self.attempt_id
        if storage is None or writer is None or attempt is None:
            raise UsageError("finish: write_data did not run on the coordinator")
        self._writer = None
        peers: dict[int, WriterIndex] = {}
        try:
            docs = [_writer_doc(r, rank) for rank, r in enumerate(results)]
            peers = {
                r: WriterIndex.from_transport(d["index"])
                for r, d in enumerate(docs)
                if d["index"] is not None
            }
            values = {k: v for d in docs for k, v in d["values"].items()}
            if values:
                writer.add_entry(VALUES_ENTRY, values, "pck:json/1")
            items = dcp_items_value(tuple(p) for d in docs for p in d.get("items", ()))
            if values or items:
                writer.add_entry(DCP_ITEMS_ENTRY, items, "pck:json/1")
            own = writer.finish()
            commit(
                storage,
                attempt,
                step=self.step,
                indexes=[peers.get(r, own) for r in range(len(docs))],
                expected_writers=list(range(len(docs))),
                continuation=Continuation(self.continuation, len(docs), _mesh_of(docs)),
            )
            self._published = (self.step, attempt)
        except CommitOutcomeUnknownError:
            raise  # the version may be committed: its files stay (R-COMMIT-19)
        except BaseException:
            with contextlib.suppress(Exception):  # the first error is the one that counts
                writer.abort()
            _discard(storage, attempt, list(peers.values()))
            raise
        # What dcp.save returns, as FileSystemWriter fills it: where each item went (its
        # portable key) and which version the save made.
        metadata.storage_data = {
            r.index: r.storage_data for rs in results for r in rs if r.index.fqn != _RESULT_FQN
        }
        root = os.fspath(self.root) if isinstance(self.root, str | os.PathLike) else None
        metadata.storage_meta = StorageMeta(
            checkpoint_id=f"{root.rstrip('/')}/{attempt}" if root else attempt, save_id=attempt
        )

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """Any path or URL names a root."""
        return isinstance(checkpoint_id, str | os.PathLike)


def _check_leaf_keys(leaves: Mapping[str, Any], fqn: str) -> None:
    """Refuse a value whose stored key is longer than the key rule allows, before any commit.

    Readers take no DCP item from such a key (:data:`~portable_ckpt.format.keys.MAX_KEY`), as
    ``portable_ckpt.torch.save`` refuses it and the format refuses such tensor keys.
    """
    long = next((k for k in leaves if len(k) > MAX_KEY), None)
    if long is not None:
        raise UnsupportedValueError(
            f"DCP item {fqn!r}: its value's key {long[:80]!r}... is {len(long)} characters, "
            f"over the {MAX_KEY} a key may have (components are joined with '/', and '/' and "
            f"'~' inside one are escaped); shorten the names on its path"
        )


def _byte_value(planner: SavePlanner, item: WriteItem) -> Any:
    """The object of a non-tensor item (never the planner's ``torch.save`` bytes).

    DefaultSavePlanner's own ``resolve_data`` pickles the live object, so that object is taken
    as it is. A planner that may change the object (``transform_object`` or ``resolve_data``
    overridden, e.g. to redact a secret) is asked: an object it returns is stored; pickled bytes
    are accepted only when they are the live object's own (the hook left this item alone), and
    refused otherwise, since storing the live object would drop its change silently.
    """
    lookup = getattr(planner, "lookup_object", None)
    base = PortableSavePlanner if isinstance(planner, PortableSavePlanner) else DefaultSavePlanner
    if callable(lookup) and not _transforms(planner, base):
        return lookup(item.index)
    value = planner.resolve_data(item)
    if isinstance(value, io.BytesIO) and callable(lookup):
        live = lookup(item.index)
        unchanged = base.transform_object(cast(DefaultSavePlanner, planner), item, live)
        if isinstance(unchanged, io.BytesIO) and value.getvalue() == unchanged.getvalue():
            return live
    if isinstance(value, io.BytesIO | bytes | bytearray):
        raise UnsupportedValueError(
            f"DCP item {item.index.fqn!r}: {type(planner).__name__} serialised it to opaque "
            "bytes (torch.save). Items are stored as JSON: return the transformed object itself "
            "from transform_object for BYTE_IO items instead of calling super(), or use "
            "DefaultSavePlanner or PortableSavePlanner"
        )
    return value


def _transforms(planner: SavePlanner, base: type[DefaultSavePlanner]) -> bool:
    """Whether ``planner`` overrides how its base planner resolves an item's data."""
    cls = type(planner)
    return (
        getattr(cls, "resolve_data", None) is not base.resolve_data
        or getattr(cls, "transform_object", None) is not base.transform_object
    )


def _add_tensor(writer: ShardWriter, key: str, item: WriteItem, planner: SavePlanner) -> int:
    """Plan one tensor item into the writer; return its size in bytes."""
    td = item.tensor_data
    if td is None:
        raise UsageError(f"DCP item {item.index.fqn!r}: a tensor item without tensor data")
    tensor = planner.resolve_data(item)
    if not isinstance(tensor, torch.Tensor):
        raise UsageError(f"DCP item {item.index.fqn!r}: resolved to {type(tensor).__name__}")
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    offsets = tuple(int(o) for o in td.chunk.offsets)
    writer.add_tensor(
        key, numpy_view(tensor, key=key), offsets=offsets, global_shape=tuple(td.size)
    )
    return tensor.numel() * tensor.element_size()


def _attempt_of(plan: SavePlan, planner: SavePlanner) -> tuple[str, int]:
    """The attempt id and world size ``prepare_global_plan`` put in this rank's plan."""
    data = plan.storage_data
    if not isinstance(data, dict) or "attempt_id" not in data:
        raise UsageError("write_data: the plan carries no attempt id (prepare_global_plan)")
    if getattr(planner, "_enable_plan_caching", False):
        raise UsageError(
            "DCP plan caching reuses an earlier save's attempt id; drop enable_plan_caching"
        )
    return str(data["attempt_id"]), int(data["world_size"])


def _mesh_of(docs: list[dict[str, Any]]) -> Mesh | None:
    """The job's mesh as the first rank that saw DTensors reported it."""
    for d in docs:
        if d["mesh"]:
            shape, names = d["mesh"]["shape"], d["mesh"]["dim_names"]
            return Mesh(shape=tuple(int(n) for n in shape), dim_names=tuple(names))
    return None


def _writer_doc(results: list[WriteResult], rank: int) -> dict[str, Any]:
    for r in results:
        if r.index.fqn == _RESULT_FQN and isinstance(r.storage_data, dict):
            return r.storage_data
    raise DistributedError(f"rank {rank} returned no writer index from write_data")


def _discard(storage: Storage, attempt_id: str, indexes: list[WriterIndex]) -> None:
    """Best effort: delete the files the writer indexes of a failed attempt list.

    Not where the attempt holds a commit record, or where that cannot be read: the failure
    came after the commit took effect (:func:`committed_or_unknown`).
    """
    if indexes and committed_or_unknown(storage, attempt_id):
        return
    for idx in indexes:
        paths = list(idx.files) + ([idx.index_file.path] if idx.index_file is not None else [])
        for rel in paths:
            try:
                storage.delete(f"{attempt_id}/{rel}")
            except CheckpointError:
                pass
