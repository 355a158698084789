"""portable → DCP with DCP's own writer (imports torch; see :mod:`portable_ckpt.convert.dcp`)."""

from __future__ import annotations

import dataclasses
import functools
import io
import math
import warnings as pywarnings
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import create_default_global_save_plan
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import (
    SavePlan,
    SavePlanner,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from portable_ckpt.convert._model import (
    ConvertOptions,
    ConvertWarning,
    fail_if_lost,
    refuse_shared_keys,
)
from portable_ckpt.convert._publish import fsync_files
from portable_ckpt.convert.hf import HF_METADATA_ENTRY
from portable_ckpt.errors import UnsupportedValueError, UsageError
from portable_ckpt.format.keys import (
    DCP_ITEMS_ENTRY,
    VALUES_ENTRY,
    dcp_fqn,
    decode_json,
    json_item_paths,
    portable_key,
    split_key,
)
from portable_ckpt.torch.state import without_scheduler_class

__all__ = ["save_portable_as_dcp", "to_torch"]


def to_torch(arr: np.ndarray[Any, Any], dtype: str) -> torch.Tensor:
    """Return a torch tensor sharing ``arr``'s bytes, with torch dtype named ``dtype``."""
    tdtype = getattr(torch, dtype)
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    return torch.from_numpy(flat).view(tdtype).reshape(arr.shape)


class _PortablePlanner(SavePlanner):
    """Plans one DCP write item per portable range record; resolves items lazily.

    ``tensors`` maps each DCP FQN to the portable key it shows, ``values`` each byte item's
    FQN to a function giving its value, and ``paths`` (recorded as ``planner_data``) each FQN
    to its object path.
    """

    def __init__(
        self,
        ck: Any,
        progress: Callable[[int], None] | None,
        *,
        tensors: dict[str, str],
        values: dict[str, Callable[[], Any]],
        paths: dict[str, tuple[str, ...]] | None = None,
    ) -> None:
        self.ck = ck
        self.progress = progress
        self.bytes = 0
        self.tensors = tensors
        self.values = values
        self.paths = paths
        self.plan: SavePlan | None = None
        self.metadata: Metadata | None = None
        self._boxes: dict[MetadataIndex, tuple[str, tuple[int, ...], tuple[int, ...]]] = {}

    def set_up_planner(self, state_dict: Any, storage_meta: Any = None, is_coordinator: bool = False) -> None:
        self.is_coordinator = is_coordinator

    def create_local_plan(self) -> SavePlan:
        items: list[WriteItem] = []
        for fqn, key in sorted(self.tensors.items()):
            items.extend(self._tensor_items(fqn, key))
        for name in sorted(self.values):
            items.append(WriteItem(index=MetadataIndex(name), type=WriteItemType.BYTE_IO))
        self.plan = SavePlan(items)
        return self.plan

    def _tensor_items(self, fqn: str, key: str) -> list[WriteItem]:
        info = self.ck.tensors[key]
        props = TensorProperties(dtype=getattr(torch, info.dtype))
        size = torch.Size(info.shape)
        boxes = [(tuple(r.offsets), tuple(r.lengths)) for r in info.ranges]
        if not boxes:  # zero-size tensor: one empty chunk so DCP knows its shape
            boxes = [((0,) * len(info.shape), tuple(info.shape))]
        items = []
        for offsets, lengths in boxes:
            index = MetadataIndex(fqn, torch.Size(offsets))
            self._boxes[index] = (key, offsets, lengths)
            chunk = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(lengths))
            items.append(
                WriteItem(
                    index=index,
                    type=WriteItemType.SHARD,
                    tensor_data=TensorWriteData(chunk=chunk, properties=props, size=size),
                )
            )
        return items

    def create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
        plans, metadata = create_default_global_save_plan(all_plans)
        if self.paths is not None:
            metadata = dataclasses.replace(metadata, planner_data=dict(self.paths))
        self.metadata = metadata
        return plans, metadata

    def finish_plan(self, new_plan: SavePlan) -> SavePlan:
        self.plan = new_plan
        return new_plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor | io.BytesIO:
        if write_item.type == WriteItemType.BYTE_IO:
            buf = io.BytesIO()
            torch.save(self.values[write_item.index.fqn](), buf)
            buf.seek(0)
            return buf
        key, offsets, lengths = self._boxes[MetadataIndex(write_item.index.fqn, write_item.index.offset)]
        dtype = self.ck.tensors[key].dtype
        if math.prod(lengths) == 0:
            return torch.empty(lengths, dtype=getattr(torch, dtype))
        arr = self.ck.read(key, offsets, lengths)
        self.bytes += arr.nbytes
        if self.progress is not None:
            self.progress(arr.nbytes)
        return to_torch(arr, dtype)


def _verbatim(ck: Any) -> tuple[_Items, list[ConvertWarning]]:
    """Keys as they are: FQN = portable key, one byte item per entry (rank 0's when per-rank)."""
    warnings: list[ConvertWarning] = []
    refuse_shared_keys(ck.entries, ck.tensors, "a DCP checkpoint has one item of each name")
    values: dict[str, Callable[[], Any]] = {}
    for name in sorted(ck.entries):
        if ck.entries[name].scope == "per_rank":
            warnings.append(
                ConvertWarning(
                    name,
                    "per-rank entry: DCP has no per-rank values; rank 0's value was written",
                    kind="changed",
                )
            )
            values[name] = functools.partial(ck.entry, name, rank=0, world_size=1)
        elif ck.entries[name].schema_id == "pck:lr-scheduler/1":
            # The format's ``class`` member (R-ENTRY-17) is no part of the scheduler's state: a
            # scheduler given it keeps it as an attribute and saves it again (mapped items keep
            # it, as the DCP view shows it to dcp.load).
            values[name] = functools.partial(_scheduler_value, ck, name)
        else:
            values[name] = functools.partial(ck.entry, name)
    return _Items({k: k for k in ck.tensors}, values, None), warnings


def _scheduler_value(ck: Any, name: str) -> Any:
    return without_scheduler_class(ck.entry(name))


def _mapped(ck: Any) -> tuple[_Items, list[ConvertWarning]]:
    """Keys through the key rule, shown as the DCP storage layer shows a version to dcp.load."""
    from portable_ckpt.torch.dcp_loading import _build_view

    view = _build_view(cast(Any, ck))
    warnings = [
        ConvertWarning(
            name,
            "per-rank entry: DCP has no per-rank values (load it with portable_ckpt.torch.load); "
            "skipped",
        )
        for name in sorted(ck.entries)
        if ck.entries[name].scope != "global"
    ]
    if view.ambiguous:
        # Two keys one DCP name: skipping them wrote a checkpoint without them, exit 0 (odd
        # states review O10: every tensor of a version was dropped so). Refused before
        # anything is written.
        fqn, keys = min(view.ambiguous.items())
        more = f" (and {len(view.ambiguous) - 1} more such name(s))" if len(view.ambiguous) > 1 else ""
        raise UsageError(
            f"keys {sorted(keys)} have the same DCP name {fqn!r}{more}: a DCP checkpoint can "
            "hold only one of them. Convert with --keys verbatim (the keys as they are), or "
            "--select the ones to keep"
        )
    _refuse_entries_lost_to_tensors(ck, view)
    tensors = {f: k for f, k in view.tensor_keys.items() if f not in view.ambiguous}
    # An HF source's __metadata__ is the safetensors files', no part of the job's state (as for
    # a mapped torch target): as items it gave dcp_to_torch_save an 'hf' key, and convert
    # DCP -> HF refused it as a value with no place in safetensors (conv30 F3).
    hf_meta = HF_METADATA_ENTRY + "/"
    values: dict[str, Callable[[], Any]] = {
        f: functools.partial(view.values.value, k)
        for f, k in view.byte_keys.items()
        if f not in view.ambiguous and not k.startswith(hf_meta)
    }
    paths = {
        f: tuple(p)
        for f, p in (view.metadata.planner_data or {}).items()
        if f in tensors or f in values
    }
    return _Items(tensors, values, paths), warnings


def _refuse_entries_lost_to_tensors(ck: Any, view: Any) -> None:
    """Refuse an entry whose DCP item a tensor displaces (nothing is written).

    The DCP view shows a tensor where an entry's item has its name, or lies above or below
    it (``a`` and ``a/x``), and drops the item: a version of the core API holding tensor ``a``
    and entry ``a`` (or ``b.c`` beside tensor ``b/c``) was exported without the entry, exit 0
    (api review 31), where verbatim keys and the torch export refuse it.

    Raises:
        UnsupportedValueError: naming the entry, its item and the tensor.

    """
    shown = set(view.byte_keys.values())
    # Each tensor key and each of its ancestors (``a`` and ``a/b`` of ``a/b/c``) → the first
    # tensor at or below it: one pass over the tensors, not one per item of every entry.
    at_or_below: dict[str, str] = {}
    for t in sorted(ck.tensors, reverse=True):
        parts = t.split("/")
        for i in range(1, len(parts) + 1):
            at_or_below["/".join(parts[:i])] = t
    for name in sorted(ck.entries):
        if ck.entries[name].scope != "global" or name in (
            VALUES_ENTRY, DCP_ITEMS_ENTRY, HF_METADATA_ENTRY
        ):
            continue  # torch.values's leaves are the view's own; the others are no state
        value = decode_json(ck.entry(name))
        for path in json_item_paths(value, tuple(split_key(name))):
            key = portable_key(path)
            if key in shown:
                continue
            tensor = _tensor_in_the_way(ck, view, key, at_or_below)
            if tensor is not None:
                # an entry and a tensor of one name say so as the verbatim export does
                refuse_shared_keys([name], [tensor], "a DCP checkpoint has one item of each name")
                raise UnsupportedValueError(
                    f"entry {name!r}: its DCP item {dcp_fqn(key)!r} has no place beside the "
                    f"tensor {tensor!r} (one name, or one inside the other), and a DCP "
                    "checkpoint has one item of each name; nothing was written. Convert with "
                    "--select to leave one of them out"
                )


def _tensor_in_the_way(
    ck: Any, view: Any, key: str, at_or_below: dict[str, str]
) -> str | None:
    """The tensor whose DCP name is ``key``'s, or whose key lies at, above or below ``key``."""
    by_name = view.tensor_keys.get(dcp_fqn(key))
    if by_name is not None:
        return str(by_name)
    if key in at_or_below:  # a tensor at ``key`` or below it
        return at_or_below[key]
    parts = key.split("/")
    return next(  # a tensor above it: one of its ancestors
        ("/".join(parts[:i]) for i in range(1, len(parts)) if "/".join(parts[:i]) in ck.tensors),
        None,
    )


@dataclasses.dataclass
class _Items:
    tensors: dict[str, str]
    values: dict[str, Callable[[], Any]]
    paths: dict[str, tuple[str, ...]] | None


def _first_failure(e: CheckpointException) -> BaseException:
    """The error DCP wrapped (a checksum or storage error of the source), or ``e`` itself.

    DCP wraps what the planner raises while it resolves data; the caller expects ours.
    """
    for exc, _trace in e.failures.values():
        return exc
    return e


def save_portable_as_dcp(
    ck: Any,
    directory: str,
    *,
    progress: Callable[[int], None] | None = None,
    options: ConvertOptions | None = None,
    dst: str | None = None,
) -> tuple[int, int, list[ConvertWarning]]:
    """Write opened portable checkpoint ``ck`` into the (empty) directory as DCP.

    ``dst`` is where the directory will be published (for messages).
    """
    opts = options or ConvertOptions()
    items, warnings = _mapped(ck) if opts.keys == "mapped" else _verbatim(ck)
    fail_if_lost(warnings, opts, dst or directory, target="dcp")
    planner = _PortablePlanner(
        ck, progress, tensors=items.tensors, values=items.values, paths=items.paths
    )
    # A file per chunk: DCP keeps every tensor of a file alive until the file is closed, so one
    # file per rank would hold the whole version in memory. DCP would fsync each file as it
    # closes it, one disk flush after another (two thirds of an export's time, 130 files of
    # 257 MiB); they are fsynced together once written, before the directory is published.
    writer = FileSystemWriter(directory, single_file_per_rank=False, thread_count=1,
                              sync_files=False)
    try:
        with pywarnings.catch_warnings():
            # One process by design: DCP's "assuming the intent is to save in a single process".
            pywarnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp_save({}, storage_writer=writer, planner=planner, no_dist=True)
    except CheckpointException as e:
        raise _first_failure(e) from None
    fsync_files(directory)
    return len(items.tensors), planner.bytes, warnings
