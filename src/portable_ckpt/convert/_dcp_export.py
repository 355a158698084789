"""portable → DCP with DCP's own writer (imports torch; see :mod:`portable_ckpt.convert.dcp`)."""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
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

from portable_ckpt.convert._model import ConvertWarning

__all__ = ["save_portable_as_dcp", "to_torch"]


def to_torch(arr: np.ndarray[Any, Any], dtype: str) -> torch.Tensor:
    """Return a torch tensor sharing ``arr``'s bytes, with torch dtype named ``dtype``."""
    tdtype = getattr(torch, dtype)
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    return torch.from_numpy(flat).view(tdtype).reshape(arr.shape)


class _PortablePlanner(SavePlanner):
    """Plans one DCP write item per portable range record; resolves items lazily."""

    def __init__(self, ck: Any, progress: Callable[[int], None] | None) -> None:
        self.ck = ck
        self.progress = progress
        self.bytes = 0
        self.warnings: list[ConvertWarning] = []
        self.plan: SavePlan | None = None
        self.metadata: Metadata | None = None
        self._boxes: dict[MetadataIndex, tuple[str, tuple[int, ...], tuple[int, ...]]] = {}

    def set_up_planner(self, state_dict: Any, storage_meta: Any = None, is_coordinator: bool = False) -> None:
        self.is_coordinator = is_coordinator

    def create_local_plan(self) -> SavePlan:
        items: list[WriteItem] = []
        for key in sorted(self.ck.tensors):
            info = self.ck.tensors[key]
            props = TensorProperties(dtype=getattr(torch, info.dtype))
            size = torch.Size(info.shape)
            boxes = [(tuple(r.offsets), tuple(r.lengths)) for r in info.ranges]
            if not boxes:  # zero-size tensor: one empty chunk so DCP knows its shape
                boxes = [((0,) * len(info.shape), tuple(info.shape))]
            for offsets, lengths in boxes:
                index = MetadataIndex(key, torch.Size(offsets))
                self._boxes[index] = (key, offsets, lengths)
                items.append(
                    WriteItem(
                        index=index,
                        type=WriteItemType.SHARD,
                        tensor_data=TensorWriteData(
                            chunk=ChunkStorageMetadata(
                                offsets=torch.Size(offsets), sizes=torch.Size(lengths)
                            ),
                            properties=props,
                            size=size,
                        ),
                    )
                )
        for name in sorted(self.ck.entries):
            items.append(WriteItem(index=MetadataIndex(name), type=WriteItemType.BYTE_IO))
        self.plan = SavePlan(items)
        return self.plan

    def create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
        plans, metadata = create_default_global_save_plan(all_plans)
        self.metadata = metadata
        return plans, metadata

    def finish_plan(self, new_plan: SavePlan) -> SavePlan:
        self.plan = new_plan
        return new_plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor | io.BytesIO:
        if write_item.type == WriteItemType.BYTE_IO:
            name = write_item.index.fqn
            info = self.ck.entries[name]
            value = self.ck.entry(name, rank=0, world_size=1) if info.scope == "per_rank" else self.ck.entry(name)
            if info.scope == "per_rank":
                self.warnings.append(
                    ConvertWarning(name, "per-rank entry: DCP has no per-rank values; rank 0's value was written")
                )
            buf = io.BytesIO()
            torch.save(value, buf)
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


def save_portable_as_dcp(
    ck: Any, directory: str, *, progress: Callable[[int], None] | None = None
) -> tuple[int, int, list[ConvertWarning]]:
    """Write opened portable checkpoint ``ck`` into the (empty) directory as DCP."""
    planner = _PortablePlanner(ck, progress)
    writer = FileSystemWriter(directory, single_file_per_rank=False, thread_count=1)
    dcp_save({}, storage_writer=writer, planner=planner, no_dist=True)
    return len(ck.tensors), planner.bytes, planner.warnings
