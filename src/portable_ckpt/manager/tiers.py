"""Node-local fast tiers: which node holds which writers' files (no torch, no I/O).

On several nodes a fast tier is usually node-local: node ``n``'s directory holds the files
written by the ranks of node ``n`` and nothing else. A version saved there records, in its
global entry ``pck.placement`` (spec §14.7, schema ``entries/manager-placement.schema.json``),
the node of every writer and the replication scheme, so a restore can tell — before reading a
byte — whether every file a rank needs is on that rank's node, on a peer node that keeps a
replica (``fast_replicas=1``: node ``n`` also holds the files of node ``n-1``), or nowhere in the
fast tier (then the durable tier is used). The files of writer ``w`` are those its writer index
``index/wNNNNN.json`` lists; every node also holds the manifest and the files of the writers in
``everywhere`` (rank 0: global entries and unsharded tensors, which every rank reads).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from portable_ckpt.errors import UsageError
from portable_ckpt.io.damage import PLACEMENT_ENTRY  # the entry's name, one for the core

__all__ = ["PLACEMENT_ENTRY", "NodeLayout"]


@dataclass(frozen=True)
class NodeLayout:
    """Ranks grouped into nodes (contiguous, as torchrun numbers them) and replication.

    Attributes:
        node_of_rank: The node index of every rank.
        replicas: How many preceding nodes' files each node also holds (0 or 1).
        everywhere: Writers whose files every node holds.

    """

    node_of_rank: tuple[int, ...]
    replicas: int = 0
    everywhere: tuple[int, ...] = (0,)

    @classmethod
    def contiguous(cls, world: int, ranks_per_node: int, replicas: int = 0) -> NodeLayout:
        """``ranks_per_node`` consecutive ranks per node."""
        if ranks_per_node < 1 or world % ranks_per_node:
            raise UsageError(f"ranks_per_node={ranks_per_node} must divide the world size {world}")
        nodes = world // ranks_per_node
        if replicas not in (0, 1) or (replicas and nodes < 2):
            raise UsageError(f"fast_replicas must be 0 or 1 (1 needs >= 2 nodes), got {replicas}")
        return cls(tuple(r // ranks_per_node for r in range(world)), replicas)

    @property
    def nodes(self) -> int:
        """Number of nodes."""
        return max(self.node_of_rank) + 1 if self.node_of_rank else 0

    def ranks_of(self, node: int) -> list[int]:
        """Ranks on ``node``."""
        return [r for r, n in enumerate(self.node_of_rank) if n == node]

    def leader(self, node: int) -> int:
        """The lowest rank of ``node`` (it acts for the node's directory)."""
        return self.ranks_of(node)[0]

    def holders(self, writer: int) -> list[int]:
        """Nodes whose fast directory holds ``writer``'s files, own node first."""
        if writer in self.everywhere:
            return list(range(self.nodes))
        home = self.node_of_rank[writer]
        out = [home]
        for k in range(1, self.replicas + 1):
            out.append((home + k) % self.nodes)
        return out

    def replica_target(self, rank: int) -> int | None:
        """The rank (same local index, next node) that keeps a replica of ``rank``'s files."""
        if not self.replicas:
            return None
        node = self.node_of_rank[rank]
        local = self.ranks_of(node).index(rank)
        return self.ranks_of((node + 1) % self.nodes)[local]

    def to_json(self) -> dict[str, Any]:
        """The ``pck.placement`` entry value."""
        return {
            "nodes": self.nodes,
            "node_of_rank": list(self.node_of_rank),
            "replicas": self.replicas,
            "everywhere": list(self.everywhere),
        }

    @classmethod
    def from_json(cls, value: Any) -> NodeLayout:
        """Parse an entry value (already validated against its schema)."""
        return cls(
            tuple(int(n) for n in value["node_of_rank"]),
            int(value["replicas"]),
            tuple(int(w) for w in value["everywhere"]),
        )


def providers(layout: NodeLayout, writers: Sequence[int], node: int) -> dict[int, int | None]:
    """Map each writer whose files ``node`` needs to the node to fetch them from.

    ``None``: ``node`` itself holds them; ``-1``: no node of the fast tier does.
    """
    out: dict[int, int | None] = {}
    for w in writers:
        held = layout.holders(w)
        out[w] = None if node in held else (held[0] if held else -1)
    return out
