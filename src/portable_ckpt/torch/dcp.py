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

from portable_ckpt.torch._dcp_keys import dcp_fqn, portable_key
from portable_ckpt.torch.dcp_loading import PortableLoadPlanner, PortableStorageReader, decode_item
from portable_ckpt.torch.dcp_saving import PortableSavePlanner, PortableStorageWriter

__all__ = [
    "PortableLoadPlanner",
    "PortableSavePlanner",
    "PortableStorageReader",
    "PortableStorageWriter",
    "dcp_fqn",
    "decode_item",
    "portable_key",
]
