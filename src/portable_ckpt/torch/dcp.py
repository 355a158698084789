"""PyTorch Distributed Checkpoint's own API on the portable format.

Frameworks that call ``torch.distributed.checkpoint`` keep their checkpointer and swap the
storage layer::

    import torch.distributed.checkpoint as dcp
    from portable_ckpt.torch.dcp import PortableStorageReader, PortableStorageWriter

    dcp.save(state, storage_writer=PortableStorageWriter("/ckpts/run1", step=100))
    dcp.async_save(state, storage_writer=PortableStorageWriter("/ckpts/run1", step=200))
    dcp.load(state, storage_reader=PortableStorageReader("/ckpts/run1", allow_statistical=True))

What DCP produces is an ordinary portable_ckpt version: a fresh attempt id, one
``ShardWriter`` per rank writing safetensors shards with range records and CRC32C checksums,
writer indexes, and ``manifest.json`` published last by the coordinator after the committer
checked files, sizes and exactly-once coverage. It loads with ``portable_ckpt.torch.load``, the
CLI and ``portable_ckpt.open``; versions written by ``portable_ckpt.torch.save`` load through
``dcp.load``.

Save protocol (the calls DCP makes, see ``torch.distributed.checkpoint.storage``):

1. ``prepare_global_plan`` (coordinator): a fresh attempt id for the requested step travels to
   every rank inside its plan.
2. ``write_data`` (every rank): each write item goes into the rank's ``ShardWriter`` under its
   portable key (:mod:`portable_ckpt.torch._dcp_keys`); non-tensor items become JSON leaves and
   travel to the coordinator in the rank's result; every rank but the coordinator finishes its
   writer (data, index) here.
3. ``finish`` (coordinator): adds the JSON leaves as the global ``pck:json/1`` entry
   ``torch.values`` and, as ``torch.dcp_items``, the DCP object paths the keys alone do not
   tell (which leaves make one item, which components were list positions), finishes its own
   writer and commits. Nothing is published when any rank
   failed; a failed commit deletes the files the writer indexes list.

Load: every rank opens the version and shows it to DCP as DCP ``Metadata`` (each range record
is a chunk); ``read_data`` reads the boxes of all its read items together with
:meth:`portable_ckpt.io.reader.Checkpoint.read_many` — only the bytes of those boxes, planned
per file (each byte read once, each touched checksum block verified once), every box proven
covered — straight into the destination tensors' memory, and checks that the items fill every
destination exactly. DCP's byte items are rebuilt from the JSON leaves in the shape of the load
target's current value and put in place without ``torch.load``.

No pickle is stored or read: DCP pickles plans and results between ranks in memory (its own
collectives), never on storage.
"""

from __future__ import annotations

import dataclasses
import io
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

import portable_ckpt
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
    LIST_ROOM,
    MAX_KEY,
    DcpPath,
    KeyTrie,
    TrieNode,
    dcp_items_value,
    has_position,
    json_item_paths,
    list_item_key,
    list_room,
    recorded_items,
)
from portable_ckpt.format.manifest import CODECS, Continuation, Mesh, WriterIndex
from portable_ckpt.format.usage import require_non_negative_int, require_one_of
from portable_ckpt.format.vocab import CONTRACTS
from portable_ckpt.io.commit import commit
from portable_ckpt.io.reader import Checkpoint, ReadRequest
from portable_ckpt.io.tensor_table import TABLE_THRESHOLD, TableTensorEntry
from portable_ckpt.io.versions import latest
from portable_ckpt.io.writer import ShardWriter, check_block_size, new_attempt_id
from portable_ckpt.storage import Storage, open_storage
from portable_ckpt.torch._dcp_keys import JsonTree, dcp_fqn, json_leaves, portable_key
from portable_ckpt.torch._tensors import format_dtype, numpy_view, torch_dtype
from portable_ckpt.torch.flatten import VALUES_ENTRY, decode_json, encode_json, split_key
from portable_ckpt.torch.layout import Piece, dtensor_layout, group_mesh, is_dtensor
from portable_ckpt.torch.loading import _Casts, _contract, _read_converted

__all__ = [
    "PortableLoadPlanner",
    "PortableSavePlanner",
    "PortableStorageReader",
    "PortableStorageWriter",
    "dcp_fqn",
    "portable_key",
]

#: FQN of the one extra result each rank returns from ``write_data`` (its writer index).
_RESULT_FQN = "portable_ckpt/writer"

Root = str | os.PathLike[str] | Storage


def _strided_pieces(state: Mapping[str, Any]) -> dict[str, tuple[Piece, ...]]:
    """DTensors of a flattened state whose local data is several boxes (strided layouts)."""
    out: dict[str, tuple[Piece, ...]] = {}
    for fqn, obj in state.items():
        if is_dtensor(obj) and obj.device_mesh.get_coordinate() is not None:
            lay = dtensor_layout(obj, key=fqn)
            if len(lay.pieces) > 1:
                out[fqn] = lay.pieces
    return out


def _refuse_one_box_view(planner: Any, fqns: Iterable[str], what: str) -> None:
    """DCP's default planners describe a DTensor's local data as one box: refuse where it is not."""
    if isinstance(planner, PortableSavePlanner | PortableLoadPlanner):
        return
    state = getattr(planner, "state_dict", None)
    if not isinstance(state, Mapping):
        return
    wanted = set(fqns)
    bad = _strided_pieces({k: v for k, v in state.items() if k in wanted})
    if bad:
        fqn, pieces = next(iter(bad.items()))
        raise UnsupportedValueError(
            f"DCP item {fqn!r}: this rank holds {len(pieces)} separate boxes of the tensor "
            f"(a strided layout) but {type(planner).__name__} describes them as one; pass "
            f"planner={what}() to dcp.{'save' if 'Save' in what else 'load'}"
        )


# -- planners --------------------------------------------------------------------------------------


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
        strided = _strided_pieces(self.state_dict)
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


class PortableLoadPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` that reads strided DTensor targets box by box and never unpickles.

    Loading into a ``_StridedShard`` target whose local rows are several boxes needs it (DCP's
    default planner would fill the local tensor as if it were one box). ``load_bytes`` accepts
    UTF-8 JSON only.
    """

    def create_local_plan(self) -> LoadPlan:
        """The default plan, with the reads of every multi-box DTensor target redone per box."""
        plan = super().create_local_plan()
        self._pieces: dict[tuple[str, tuple[int, ...]], Piece] = {}
        strided = _strided_pieces(self.state_dict)
        if not strided or self.metadata is None:
            return plan
        items = [it for it in plan.items if it.dest_index.fqn not in strided]
        for fqn, pieces in strided.items():
            md = self.metadata.state_dict_metadata.get(fqn)
            if not isinstance(md, TensorStorageMetadata):
                continue  # missing key: the default plan already raised or skipped it
            chunks = [
                ChunkStorageMetadata(torch.Size(p.offsets), torch.Size(p.lengths)) for p in pieces
            ]
            self._pieces.update(((fqn, p.offsets), p) for p in pieces)
            items.extend(create_read_items_for_chunk_list(fqn, md, chunks))
        return dataclasses.replace(plan, items=items)

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        """The box's view of the local tensor for split targets; else the default."""
        offset = tuple(int(o) for o in index.offset) if index.offset is not None else ()
        piece = getattr(self, "_pieces", {}).get((index.fqn, offset))
        if piece is not None:
            local: torch.Tensor = self.state_dict[index.fqn].to_local()
            return local[piece.local_slices()]
        return super().lookup_tensor(index)

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        """Put a UTF-8 JSON byte item in place (refusing anything else, pickles included)."""
        doc = jsonio.loads(
            value.getvalue(), what=f"DCP item {read_item.dest_index.fqn!r}", max_cost_per_byte=None
        )
        _place_value(self, read_item, decode_json(doc))


def _place_value(planner: DefaultLoadPlanner, item: ReadItem, value: Any) -> None:
    """What ``DefaultLoadPlanner.load_bytes`` does with an unpickled value, without unpickling."""
    fqn = item.dest_index.fqn
    if planner.flatten_state_dict:
        set_element(planner.original_state_dict, planner.mappings[fqn], value)
    else:
        planner.state_dict[fqn] = value


def _places_directly(planner: LoadPlanner) -> bool:
    """Whether byte items go in place here (stock or portable planners) or through load_bytes."""
    return isinstance(planner, DefaultLoadPlanner) and type(planner).load_bytes in (
        DefaultLoadPlanner.load_bytes,
        PortableLoadPlanner.load_bytes,
    )


# -- writer ----------------------------------------------------------------------------------------


def _check_root(root: Any) -> Root:
    if isinstance(root, Storage | str | os.PathLike):
        return root
    raise UsageError(f"root must be a path, an s3:// URL or a Storage, got {type(root).__name__}")


class PortableStorageWriter(StorageWriter):
    """A DCP ``StorageWriter`` that saves one portable_ckpt version.

    Args:
        root: Checkpoint root (local path or ``s3://...``; a :class:`~portable_ckpt.storage.
            Storage` works for threads, not for ``async_save`` in process mode, which pickles
            the writer into the checkpoint process).
        step: The completed training step (in the attempt id and the manifest).
        continuation: ``"exact"`` or ``"statistical"`` (see ``docs/torch.md``).
        codec: ``"none"`` or ``"zstd"`` for tensor chunks.
        block_size: Checksum block size (default: the writer's).
        max_file_bytes: Start a new shard file beyond this size.
        tensor_table: Describe ranges in tensor tables (format 1.1); default when the job holds
            more than 65,536 range records.

    After ``dcp.save`` returns, :attr:`attempt_id` is the published version's id on every rank.
    Every save through the writer publishes a new version of ``step``; DCP's ``checkpoint_id``
    (``reset``) changes the root.

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
        self.root = _check_root(root)
        self.step = step
        self.continuation = continuation
        self.codec = codec
        self.block_size = block_size
        self.max_file_bytes = max_file_bytes
        self.tensor_table = tensor_table
        self.reset()

    def __getstate__(self) -> dict[str, Any]:
        # Process-mode async_save sends the writer to the checkpoint process before a save starts.
        state = dict(self.__dict__)
        state["_storage"] = state["_writer"] = None
        return state

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """Start a new save (``checkpoint_id``, when given, is the root)."""
        if checkpoint_id is not None:
            self.root = _check_root(checkpoint_id)
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
        """Nothing to add locally."""
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Give every rank's plan the fresh attempt id and the world size (coordinator)."""
        if any(not p.usable for p in plans):
            raise UsageError(
                "DCP plan caching reuses an earlier save's plans, attempt id included; every "
                "portable_ckpt save needs a fresh attempt: drop enable_plan_caching=True"
            )
        data = {"attempt_id": new_attempt_id(self.step), "world_size": len(plans)}
        return [dataclasses.replace(p, storage_data=dict(data)) for p in plans]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Write this rank's items with its own ``ShardWriter`` (see the module docstring)."""
        self.attempt_id, world = _attempt_of(plan, planner)
        state = getattr(planner, "state_dict", None)
        if isinstance(state, Mapping):
            self._mesh = group_mesh(state.values())
            _refuse_one_box_view(planner, (i.index.fqn for i in plan.items), "PortableSavePlanner")
        self._storage = open_storage(self.root, create=True)
        writer = self._new_writer(self._storage, len(plan.items) * world)
        try:
            results, values, items = self._write_items(writer, plan, planner)
            index = None if self.is_coordinator else writer.finish()
        except BaseException:
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
        except CommitOutcomeUnknownError:
            raise  # the version may be committed: its files stay (R-COMMIT-19)
        except BaseException:
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
    """Best effort: delete the files the writer indexes of a failed attempt list."""
    for idx in indexes:
        paths = list(idx.files) + ([idx.index_file.path] if idx.index_file is not None else [])
        for rel in paths:
            try:
                storage.delete(f"{attempt_id}/{rel}")
            except CheckpointError:
                pass


# -- reader ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class _DcpView:
    """A version as DCP sees it: dotted FQNs, chunks, byte items."""

    ck: Checkpoint
    tensor_keys: dict[str, str]
    byte_keys: dict[str, str]
    ambiguous: dict[str, set[str]]
    values: JsonTree
    metadata: Metadata

    def key(self, fqn: str, table: dict[str, str]) -> str:
        clash = self.ambiguous.get(fqn)
        if clash:
            raise UnsupportedValueError(
                f"DCP item {fqn!r} stands for several keys of {self.ck.path} "
                f"({sorted(clash)}); load this version with portable_ckpt.torch.load"
            )
        return table[fqn]


def _json_items(
    ck: Checkpoint, recorded: dict[str, DcpPath] | None
) -> tuple[JsonTree, dict[str, DcpPath], dict[str, DcpPath]]:
    """The JSON leaves, the DCP items they make and every tensor's DCP object path.

    Leaves come from ``torch.values`` and the other global entries. An entry's own value is
    JSON, so DCP's default rule gives its items. The items of ``torch.values`` are the ones
    ``torch.dcp_items`` records, every other leaf an item of its own; for a version written
    without the record, or with one that contradicts itself or the tensors, DCP's rule for
    lists (:func:`~portable_ckpt.format.keys.list_item_key`), with list positions guessed from
    the keys. Either way no item lies inside another or above a tensor, no path uses one
    component both as a list position and as a dict key or starts with a position, and no list
    is longer than what is stored in it allows, so DCP can rebuild the state from the metadata
    alone. Prefixes are looked up in tries (:class:`~portable_ckpt.format.keys.KeyTrie`): the
    cost is linear in the characters of the keys, however many components they have.

    Raises:
        UnsupportedValueError: a tensor's key lies below another's (no state dict holds both),
            or the record's lists want more positions than what is stored in them allows.

    """
    leaves: dict[str, Any] = {}
    entry_items: dict[str, DcpPath] = {}
    values: dict[str, Any] = {}
    for name, e in ck.entries.items():
        if e.scope != "global" or name == DCP_ITEMS_ENTRY:
            continue
        value = ck.entry(name)
        if name == VALUES_ENTRY and isinstance(value, dict):
            values = value
            leaves.update(value)
        elif name != VALUES_ENTRY:
            value = decode_json(value)
            leaves.update(json_leaves(name, value, fqn=dcp_fqn(name)))
            entry_items.update(
                (portable_key(p), p) for p in json_item_paths(value, tuple(split_key(name)))
            )
    tree = JsonTree(leaves)
    tensors = set(ck.tensors)
    shape = KeyTrie(tensors)
    _refuse_nested_tensors(shape)
    vkeys = [k for k in values if len(k) <= MAX_KEY]  # longer: no DCP item
    if recorded is not None and all(len(k) <= MAX_KEY for k in recorded):
        own: dict[str, DcpPath] = {}
        taken = KeyTrie()
        for k, p in sorted(recorded.items()):  # a key before the keys below it
            if k in tree and k not in tensors and not shape.below(k) and not taken.on_path(k):
                own[k] = p
                taken.add(k)
        for leaf in vkeys:
            if not taken.on_path(leaf) and not shape.below(leaf):
                own[leaf] = tuple(split_key(leaf))
        items = {**entry_items, **own}
        tensor_paths = {k: recorded.get(k) or tuple(split_key(k)) for k in tensors}
        check = _check_paths(items, tensor_paths)
        if check.consistent and all(len(k) <= MAX_KEY for k in entry_items):
            if check.long_list is not None:
                raise UnsupportedValueError(
                    f"{DCP_ITEMS_ENTRY} of {ck.path} asks for lists of {check.allocated:,} "
                    f"positions in all, {check.stored:,} of them stored (e.g. "
                    f"{check.long_list}): DCP's template-free load would allocate every "
                    "position, and reading these items by their keys would turn the lists "
                    "into dicts; load this version with portable_ckpt.torch.load"
                )
            return tree, items, tensor_paths
    value_items: dict[str, DcpPath] = {}
    for leaf in vkeys:
        # the item: the list rule's, or below the deepest prefix that holds a tensor (a list
        # that holds a tensor is DCP items by position), if that is not the leaf or below it
        depth, more = shape.reach(leaf)
        deepest_above = depth if more else depth - 1
        size = max(list_item_key(leaf).count("/") + 1, deepest_above + 1)
        if size <= leaf.count("/") + 1:
            value_items.setdefault(_leading(leaf, size), ())
    items = _disjoint({**entry_items, **value_items}, tensors, shape)
    return tree, *_guessed_paths(items, tensors, entry_items)


def _leading(key: str, n: int) -> str:
    """The first ``n`` components of ``key``, joined."""
    return key if key.count("/") < n else "/".join(key.split("/", n)[:n])


def _refuse_nested_tensors(shape: KeyTrie) -> None:
    """Refuse a tensor whose key lies below another's: DCP places both in one state dict."""
    for node, _ in shape.nodes():
        if node.flags and node.below:
            inner = node
            while not (inner is not node and inner.flags):
                inner = next(iter(cast(dict[str, TrieNode], inner.kids).values()))
            raise UnsupportedValueError(
                f"tensor {inner.key[:200]!r} lies below the tensor {node.key[:200]!r} (its key "
                "continues the other's after a '/'): no state dict holds both, so DCP cannot "
                "load this version; load it with portable_ckpt.torch.load"
            )


def _disjoint(
    items: dict[str, DcpPath], tensors: set[str], shape: KeyTrie
) -> dict[str, DcpPath]:
    """``items`` less those too long, at or above a tensor, or inside another item or tensor."""
    kept: dict[str, DcpPath] = {}
    taken = KeyTrie()
    for k in sorted(items, key=len):  # an item above another keeps the leaves below it
        if (
            len(k) <= MAX_KEY
            and k not in tensors
            and not shape.below(k)
            and not taken.on_path(k)
            and not shape.on_path(k)
        ):
            kept[k] = items[k]
            taken.add(k)
    return kept


def _guessed_paths(
    items: dict[str, DcpPath], tensors: set[str], exact: dict[str, DcpPath]
) -> tuple[dict[str, DcpPath], dict[str, DcpPath]]:
    """Object paths for a version without a usable item record (``exact``: paths known).

    A container whose children are ``0..n-1`` and that holds no tensor is taken for a list
    (``param_groups``), as ``convert --to torch`` takes it; others (an optimizer's ``state``
    keyed by parameter number) are dicts.
    """
    trie = KeyTrie(tensors, _TENSOR)
    for k in items:
        trie.add(k, _ITEM)
    lists: dict[int, bool] = {}

    def is_list(node: TrieNode) -> bool:
        known = lists.get(id(node))
        if known is None:
            kids = node.kids or {}
            known = not node.below & _TENSOR and kids.keys() == {str(i) for i in range(len(kids))}
            lists[id(node)] = known
        return known

    def path(k: str) -> DcpPath:
        if k in exact:
            return exact[k]
        raw = k.split("/")
        out: list[str | int] = list(split_key(k))
        parent = trie.root
        for node in trie.path(k):
            if parent is not trie.root and is_list(parent):
                out[parent.depth] = int(raw[parent.depth])
            if not (node.flags | node.below) & _TENSOR:  # one child each inside the edge
                for i in range(parent.depth + 1, node.depth):
                    if raw[i] == "0":
                        out[i] = 0
            parent = node
        return tuple(out)

    out = {k: path(k) for k in items}
    tensor_paths = {k: path(k) for k in tensors}
    if not _check_paths(out, tensor_paths, trie).consistent:
        out = {k: tuple(split_key(k)) for k in items}
        tensor_paths = {k: tuple(split_key(k)) for k in tensors}
    return out, tensor_paths


#: Flags of keys in the tries of the reader.
_TENSOR, _ITEM = 1, 2

@dataclasses.dataclass
class _PathCheck:
    consistent: bool = True
    allocated: int = 0
    stored: int = 0
    long_list: str | None = None


def _check_paths(
    items: Mapping[str, DcpPath], tensors: Mapping[str, DcpPath], trie: KeyTrie | None = None
) -> _PathCheck:
    """Whether DCP can build the containers of these object paths (keyed by portable key).

    ``consistent``: no key is another's or lies below it (no item inside another, at or above a
    tensor, or below one), every path starts with a dict key (the state is a dict), and no
    container is both a list (an int component below it) and a dict (a str one).
    ``long_list`` (if consistent): the lists want more positions than twice those stored in
    them, plus 16 each, plus :data:`~portable_ckpt.format.keys.LIST_ROOM` in all
    (:func:`~portable_ckpt.format.keys.lists_fit`); DCP's template-free load allocates every
    position up to the largest. (A list of plain items that DCP would want as one item gives
    DCP's own "Missing key" on a template-free load, as a list holding only an empty dict does
    with DCP's own storage.) One trie of the keys (``trie``: the caller's, of ``items`` flagged
    ``_ITEM`` and ``tensors`` ``_TENSOR``): the cost is linear in their characters.
    """
    kinds: dict[str, str] = {}
    for paths in (items, tensors):
        for k, p in paths.items():
            if int in set(map(type, p)):
                kind = "".join(["i" if type(c) is int else "s" for c in p])
                if kind[0] != "s":
                    return _PathCheck(consistent=False)
            else:
                kind = "s" * len(p)
            kinds[k] = kind
    if trie is None:
        trie = KeyTrie(tensors, _TENSOR)
        for k in items:
            trie.add(k, _ITEM)
    order = list(trie.nodes())
    rep: dict[int, str] = {}  # the kinds of the components of one path through each node
    for node, _ in reversed(order):  # the nodes below a node before it
        kid = next(iter(node.kids.values())) if node.kids else None
        rep[id(node)] = kinds[node.key] if kid is None else rep[id(kid)]
    for node, parent in order:
        # every path through a node has the kinds of the components up to the one after it
        here = rep[id(node)]
        if parent is not trie.root and not here.startswith(rep[id(parent)][: parent.depth + 1]):
            return _PathCheck(consistent=False)
        if (node.flags and node.kids) or node.flags == _ITEM | _TENSOR:
            return _PathCheck(consistent=False)
    out = _PathCheck()
    widest: tuple[int, str, int, int, int] = (-1, "", 0, 0, 0)  # holes, key, cut, last, stored
    room = LIST_ROOM
    for node, parent in order:
        here = rep[id(node)]
        lists: list[tuple[int, int, int]] = []  # the list's components, stored, largest
        if node.kids and len(here) > node.depth and here[node.depth] == "i":
            lists.append((node.depth, len(node.kids), max(int(c) for c in node.kids)))
        if "i" in here[parent.depth + 1 : node.depth]:  # inside the edge: one position each
            comps = node.key.split("/")
            lists.extend(
                (i, 1, int(comps[i]))
                for i in range(parent.depth + 1, node.depth)
                if here[i] == "i"
            )
        for cut, stored, last in lists:
            out.stored += stored
            out.allocated += last + 1
            room += list_room(stored, last)
            if last + 1 - stored > widest[0]:
                widest = (last + 1 - stored, node.key, cut, last, stored)
    if room < 0:
        _, key, cut, last, stored = widest
        where = "/".join(key.split("/")[:cut])
        out.long_list = f"position {last:,} of the list {where[:100]!r}, {stored:,} stored"
    return out


def _tensor_metadata(t: Any) -> TensorStorageMetadata:
    pairs: Iterable[tuple[Any, Any]]
    if isinstance(t, TableTensorEntry) and t.table_ranges_untouched:
        offs, lens = t.boxes()
        pairs = zip(offs.tolist(), lens.tolist(), strict=True)
    else:
        pairs = ((r.offsets, r.lengths) for r in t.ranges)
    return TensorStorageMetadata(
        properties=TensorProperties(dtype=torch_dtype(t.dtype)),
        size=torch.Size(t.shape),
        chunks=[ChunkStorageMetadata(torch.Size(o), torch.Size(n)) for o, n in pairs],
    )


def _build_view(ck: Checkpoint) -> _DcpView:
    md: dict[str, Any] = {}
    tensor_keys: dict[str, str] = {}
    byte_keys: dict[str, str] = {}
    ambiguous: dict[str, set[str]] = defaultdict(set)
    paths: dict[str, DcpPath] = {}

    def claim(fqn: str, key: str, table: dict[str, str]) -> None:
        prev = table.setdefault(fqn, key)
        if prev != key:
            ambiguous[fqn].update((prev, key))

    tree, items, tensor_paths = _json_items(ck, recorded_items(ck))
    for key, t in ck.tensors.items():
        fqn = dcp_fqn(key)
        claim(fqn, key, tensor_keys)
        md[fqn] = _tensor_metadata(t)
        paths[fqn] = tensor_paths[key]
    for key, path in items.items():
        fqn = dcp_fqn(key)
        if fqn not in tensor_keys:
            claim(fqn, key, byte_keys)
            md[fqn] = BytesStorageMetadata()
            paths[fqn] = path
    metadata = Metadata(state_dict_metadata=md, planner_data=paths)
    return _DcpView(ck, tensor_keys, byte_keys, dict(ambiguous), tree, metadata)


class PortableStorageReader(StorageReader):
    """A DCP ``StorageReader`` that loads one committed portable_ckpt version.

    Args:
        root: Checkpoint root or version directory (local path or ``s3://...``), or a
            :class:`~portable_ckpt.storage.Storage`.
        step: Load the newest version of this step (default: the newest version).
        allow_statistical: Accept loading an ``exact`` version onto another world size or mesh
            (as ``portable_ckpt.torch.load(..., allow_statistical=True)``); without it such a
            load raises PCK-CONTRACT.

    Every rank opens the version itself; when ranks resolved different versions (a save
    committed meanwhile) the load fails instead of mixing them: pass ``step`` for a fixed one.
    :attr:`stats` counts the bytes read and checksum blocks verified on this rank.

    """

    def __init__(
        self, root: Root, *, step: int | None = None, allow_statistical: bool = False
    ) -> None:
        require_non_negative_int(step, "step", allow_none=True)
        self.root = _check_root(root)
        self.step = step
        self.allow_statistical = allow_statistical
        self.reset()

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """Start a new load (``checkpoint_id``, when given, is the root or version directory)."""
        if checkpoint_id is not None:
            self.root = _check_root(checkpoint_id)
        self._view: _DcpView | None = None
        self._error: CheckpointError | None = None
        self.rank = 0

    @property
    def checkpoint(self) -> Checkpoint:
        """The version opened by ``read_metadata``."""
        return self._opened().ck

    @property
    def stats(self) -> Any:
        """Read counters of this rank (:class:`~portable_ckpt.io.reader.ReadStats`)."""
        return self._opened().ck.stats

    def _opened(self) -> _DcpView:
        if self._view is None:
            raise UsageError("the version is not open yet: DCP calls read_metadata() first")
        return self._view

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """Open the version and describe it as DCP ``Metadata``.

        DCP turns an exception raised here into a bare ``AssertionError``; a checkpoint error
        is kept and raised from :meth:`set_up_storage_reader` instead, so the caller sees its
        code (e.g. PCK-NOT-FOUND).
        """
        self._error = None
        try:
            if isinstance(self.root, Storage):
                attempt, manifest = latest(self.root, self.step)
                ck = Checkpoint(self.root, attempt, manifest)
            else:
                ck = portable_ckpt.open(self.root, step=self.step)
            self._view = _build_view(ck)
        except CheckpointError as e:
            self._error = e
            return Metadata(state_dict_metadata={})
        return self._view.metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        """Record this rank (or raise what ``read_metadata`` kept)."""
        if self._error is not None:
            raise self._error
        self.rank = int(kwargs.get("rank", 0) or 0)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """Tag the plan with the version this rank opened."""
        return dataclasses.replace(plan, storage_data=self._opened().ck.id)

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """Check every rank opened the same version; tell each the world size (coordinator)."""
        ids = sorted({str(p.storage_data) for p in plans})
        if len(ids) != 1:
            raise DistributedError(
                f"ranks opened different versions of {self.root} ({ids}); a save committed "
                f"during the load: pass step= to PortableStorageReader"
            )
        return [
            dataclasses.replace(p, storage_data={"id": ids[0], "world_size": len(plans)})
            for p in plans
        ]

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Read every item of this rank's plan (see the module docstring)."""
        view = self._opened()
        data = plan.storage_data if isinstance(plan.storage_data, dict) else {}
        state = getattr(planner, "state_dict", None)
        mesh = group_mesh(state.values()) if isinstance(state, Mapping) else None
        if not _template_free(planner):  # an export or inspection continues no training
            _contract(view.ck, int(data.get("world_size", 1)), mesh, self.allow_statistical)
        _refuse_one_box_view(planner, (i.dest_index.fqn for i in plan.items), "PortableLoadPlanner")
        filled: dict[MetadataIndex, int] = defaultdict(int)
        reads = _TensorReads(view, planner)
        for item in plan.items:
            if item.type == LoadItemType.BYTE_IO:
                _read_bytes(view, item, planner)
            else:
                filled[item.dest_index] += reads.add(item)
        reads.flush()
        _check_filled(filled, planner)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """Any path or URL may name a root or version."""
        return isinstance(checkpoint_id, str | os.PathLike)


def _template_free(planner: LoadPlanner) -> bool:
    """DCP's template-free load (``dcp_to_torch_save``): the planner makes the whole state."""
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner

    return isinstance(planner, _EmptyStateDictLoadPlanner)


#: Destination bytes a batch of tensor items may resolve before it is read, for planners whose
#: ``resolve_tensor`` may allocate; the stock planners resolve views of the state (one batch).
ITEM_BATCH_BYTES = 64 << 20


def _resolves_views(planner: LoadPlanner) -> bool:
    """Whether ``resolve_tensor`` returns views of the target state (stock or portable planner)."""
    return isinstance(planner, DefaultLoadPlanner) and (
        type(planner).resolve_tensor is DefaultLoadPlanner.resolve_tensor
    )


class _TensorReads:
    """The tensor items of one plan, read together (planned per file) and then committed.

    One :meth:`~portable_ckpt.io.reader.Checkpoint.read_many` per batch reads each byte once
    and verifies each checksum block once, however many items share a block (an item per
    stored chunk and target box: hundreds per rank for an FSDP2 state); items whose target is
    a CPU tensor of the stored dtype are read straight into its memory, the others converted
    in bounded batches. ``commit_tensor`` follows the read of its item's batch.
    """

    def __init__(self, view: _DcpView, planner: LoadPlanner) -> None:
        self._view = view
        self._planner = planner
        self._bound = None if _resolves_views(planner) else ITEM_BATCH_BYTES
        self._items: list[tuple[ReadItem, torch.Tensor]] = []
        self._direct: list[ReadRequest] = []
        self._converted: list[tuple[ReadRequest, torch.Tensor]] = []
        self._bytes = 0
        # A cast that changes values (1e5 -> inf in float16) is refused as by load() (attack
        # review 4 A1: this path cast without a check).
        self._casts = _Casts(strict=False)

    def add(self, item: ReadItem) -> int:
        """Plan one item's box (read at the next flush); return the elements it fills."""
        view = self._view
        key = view.key(item.storage_index.fqn, view.tensor_keys)
        base = item.storage_index.offset or ()
        offsets = [int(a) + int(b) for a, b in zip(base, item.storage_offsets, strict=True)]
        req = ReadRequest(key, offsets, [int(n) for n in item.lengths])
        dst = self._planner.resolve_tensor(item).detach()
        stored = view.ck.tensors[key].dtype
        if dst.device.type == "cpu" and format_dtype(dst.dtype, key=key) == stored:
            self._direct.append(dataclasses.replace(req, out=numpy_view(dst, key=key)))
        else:
            self._converted.append((req, dst))
        self._items.append((item, dst))
        self._bytes += dst.numel() * dst.element_size()
        if self._bound is not None and self._bytes >= self._bound:
            self.flush()
        return int(dst.numel())

    def flush(self) -> None:
        """Read the planned items, then commit each to the planner."""
        ck = self._view.ck
        if self._direct:
            ck.read_many(self._direct)
        _read_converted(ck, self._converted, self._casts)
        for item, dst in self._items:
            self._planner.commit_tensor(item, dst)
        self._items, self._direct, self._converted, self._bytes = [], [], [], 0


def _check_filled(filled: Mapping[MetadataIndex, int], planner: LoadPlanner) -> None:
    """Every destination got exactly its number of elements (the items are disjoint)."""
    lookup = getattr(planner, "lookup_tensor", None)
    if not callable(lookup):
        return
    for index, n in filled.items():
        want = int(lookup(index).numel())
        if n != want:
            raise UnsupportedValueError(
                f"DCP item {index.fqn!r} at {list(index.offset or ())}: the read items fill {n} "
                f"of its {want} elements; the planner's view of the target is inconsistent"
            )


def _read_bytes(view: _DcpView, item: ReadItem, planner: LoadPlanner) -> None:
    """Rebuild one byte item from the JSON leaves and put it in place (no unpickling)."""
    fqn = item.dest_index.fqn
    key = view.key(fqn, view.byte_keys)
    state = getattr(planner, "state_dict", None)
    template = state.get(fqn) if isinstance(state, Mapping) else None
    # A flattening planner's item is a list or a scalar (DCP walks dicts): stored positions
    # make a list whatever the target holds, as DCP's own storage puts the stored list there.
    flat = bool(getattr(planner, "flatten_state_dict", False))
    value = view.values.value(key, template, item=flat)
    if _places_directly(planner) and isinstance(planner, DefaultLoadPlanner):
        _place_value(planner, item, value)
    else:
        try:
            planner.load_bytes(item, io.BytesIO(jsonio.dumps(encode_json(value, key=fqn))))
        except CheckpointError:
            raise
        except Exception as e:  # a planner that expects torch.save's pickle (torch's examples)
            raise UnsupportedValueError(
                f"DCP item {fqn!r}: {type(planner).__name__}.load_bytes failed on the item's "
                f"UTF-8 JSON ({type(e).__name__}: {str(e)[:200]}). The portable format never "
                "stores pickle, so load_bytes gets JSON, not torch.save bytes: read it with "
                "json.load (or PortableLoadPlanner's load_bytes) instead of torch.load"
            ) from e
