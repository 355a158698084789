"""The manager's tiers: the durable root and the optional fast one (node-local on several nodes).

A tier is a storage, its retention policy, and for a node-local fast tier the
:class:`~portable_ckpt.manager.tiers.NodeLayout` that says which node holds what (spec §14.7).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from portable_ckpt.errors import UsageError
from portable_ckpt.io.versions import refuse_root_in_version
from portable_ckpt.manager.retention import RetentionPolicy
from portable_ckpt.manager.tiers import NodeLayout
from portable_ckpt.storage import Storage, local_path, open_storage, root_text

__all__ = ["Tier", "durable_tier", "fast_tier", "storage_url"]


@dataclass
class Tier:
    """One tier of the manager."""

    name: str  # "durable" or "fast"
    root: str
    storage: Storage
    retention: RetentionPolicy
    layout: NodeLayout | None = None  # node-local: this rank's node root, several nodes

    def leads(self, rank: int) -> bool:
        """Whether ``rank`` maintains this tier's root (rank 0, or its node's leader)."""
        if self.layout is None:
            return rank == 0
        return rank == self.layout.leader(self.layout.node_of_rank[rank])


def storage_url(root: str | os.PathLike[str]) -> str:
    """A local root as an absolute path, ``~/`` expanded; a remote URL as given."""
    text = root_text(root)  # "~/ckpts" was made absolute first: ./~/ckpts (notebook F6)
    local = local_path(text)
    return text if local is None else os.path.abspath(local)


def durable_tier(root: str | os.PathLike[str], **retention: Any) -> Tier:
    """The durable tier with the caller's retention policy (keep_last, keep_every, keep_best)."""
    url = storage_url(root)
    # A version directory as the root was taken here and every save failed later, in the
    # background, until max_failed_saves stopped the job (api review 31).
    refuse_root_in_version(url)
    return Tier("durable", url, open_storage(url, create=True), RetentionPolicy.build(**retention))


def fast_tier(
    fast_root: str | os.PathLike[str],
    durable: str,
    *,
    keep: int,
    replicas: int,
    ranks_per_node: int | None,
    rank: int,
    world: int,
) -> Tier:
    """The fast tier: this rank's node root when there are several nodes (``{node}`` in the path)."""
    per_node = ranks_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", world))
    layout = NodeLayout.contiguous(world, per_node, replicas)
    node = layout.node_of_rank[rank]
    fast = storage_url(os.fspath(fast_root).replace("{node}", str(node)))
    if fast == durable:
        raise UsageError("fast_root must differ from root")
    retention = RetentionPolicy.build(keep_last=keep)
    refuse_root_in_version(fast)
    storage = open_storage(fast, create=True)
    return Tier("fast", fast, storage, retention, layout if layout.nodes > 1 else None)
