"""Where a rank's piece of a tensor sits in the global tensor, and which rank writes it.

The arithmetic here is plain Python over ``(mesh shape, coordinate, placements)`` so that it can
be checked exhaustively without a process group.

* ``Shard(d)`` on mesh dimension ``i`` splits the current extent of tensor dimension ``d`` the way
  ``torch.chunk`` does (chunk size ``ceil(L / n)``; trailing shards may be short or empty).
  Several mesh dimensions sharding the same tensor dimension nest in mesh-dimension order.
* ``Replicate()`` leaves the extent alone; of the replicas, the one whose coordinate is 0 on every
  replicate mesh dimension writes (the lowest coordinate), so exactly one rank writes each region
  and no communication is needed to decide it.
* ``Partial`` holds unreduced values and cannot be stored (PCK-UNSUPPORTED-VALUE).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from portable_ckpt.errors import UnsupportedValueError

__all__ = [
    "LocalBox",
    "PlacementSpec",
    "chunk_extent",
    "dtensor_local_box",
    "mesh_description",
    "placement_specs",
    "shard_box",
    "writes_region",
]


@dataclass(frozen=True)
class PlacementSpec:
    """A placement reduced to what box arithmetic needs.

    Attributes:
        kind: ``"shard"``, ``"replicate"`` or ``"partial"``.
        dim: The tensor dimension for ``"shard"``, else ``None``.

    """

    kind: str
    dim: int | None = None


@dataclass(frozen=True)
class LocalBox:
    """A rank's piece of a tensor.

    Attributes:
        offsets: Global offsets of the piece.
        lengths: Its shape (may contain zeros: an empty shard).
        global_shape: The logical tensor's shape.
        writer: Whether this rank is the one that stores the piece.

    """

    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    global_shape: tuple[int, ...]
    writer: bool

    @property
    def empty(self) -> bool:
        """True when the piece holds no element."""
        return any(n == 0 for n in self.lengths)


def chunk_extent(length: int, parts: int, index: int) -> tuple[int, int]:
    """Return ``(start, size)`` of chunk ``index`` of ``parts`` over ``length`` (torch.chunk)."""
    if parts <= 0 or not 0 <= index < parts:
        raise ValueError(f"chunk index {index} outside 0..{parts - 1}")
    size = -(-length // parts) if length else 0
    start = min(index * size, length)
    return start, max(0, min(size, length - start))


def shard_box(
    global_shape: Sequence[int],
    mesh_shape: Sequence[int],
    coordinate: Sequence[int],
    placements: Sequence[PlacementSpec],
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Return ``(offsets, lengths)`` of the piece held at ``coordinate``.

    Raises:
        UnsupportedValueError: a ``partial`` placement, or a shard dimension out of range.

    """
    if not (len(mesh_shape) == len(coordinate) == len(placements)):
        raise ValueError("mesh_shape, coordinate and placements must have the same length")
    offsets = [0] * len(global_shape)
    lengths = [int(s) for s in global_shape]
    for n, c, p in zip(mesh_shape, coordinate, placements, strict=True):
        if p.kind == "partial":
            raise UnsupportedValueError(
                "a DTensor with a Partial placement holds unreduced values and cannot be stored; "
                "call .redistribute(placements=[Replicate() or Shard(d)]) or .full_tensor() first"
            )
        if p.kind == "shard":
            d = p.dim if p.dim is not None else -1
            if not 0 <= d < len(global_shape):
                raise UnsupportedValueError(f"Shard({p.dim}) on a {len(global_shape)}-d tensor")
            start, size = chunk_extent(lengths[d], int(n), int(c))
            offsets[d] += start
            lengths[d] = size
    return tuple(offsets), tuple(lengths)


def writes_region(coordinate: Sequence[int], placements: Sequence[PlacementSpec]) -> bool:
    """Whether the rank at ``coordinate`` writes its piece: coordinate 0 on every replicate dim."""
    return all(c == 0 for c, p in zip(coordinate, placements, strict=True) if p.kind != "shard")


def placement_specs(placements: Sequence[Any], *, key: str = "?") -> list[PlacementSpec]:
    """Convert torch placements to :class:`PlacementSpec` (refusing unsupported kinds)."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    out: list[PlacementSpec] = []
    for p in placements:
        cls = type(p).__name__
        if isinstance(p, Partial) or "Partial" in cls:
            raise UnsupportedValueError(
                f"tensor {key!r}: DTensor placement {p} (Partial) holds unreduced values and "
                f"cannot be stored; redistribute it to Replicate() or Shard(d) before saving"
            )
        if type(p) is Shard:
            out.append(PlacementSpec("shard", int(p.dim)))
        elif isinstance(p, Replicate):
            out.append(PlacementSpec("replicate"))
        else:
            raise UnsupportedValueError(
                f"tensor {key!r}: DTensor placement {p} ({cls}) is not supported (only Shard(d), "
                f"Replicate()); redistribute the tensor before saving"
            )
    return out


def _outside_coordinate_ok(mesh: Any) -> bool:
    """For a sub-mesh: whether this rank is the lowest copy along the root dims the sub-mesh lacks."""
    try:
        root = mesh._get_root_mesh()
    except Exception:  # pragma: no cover - older/newer torch without the helper
        return True
    if root is None or root is mesh or tuple(root.mesh.shape) == tuple(mesh.mesh.shape):
        return True
    root_coord = root.get_coordinate()
    if root_coord is None:
        return False
    members = {int(r) for r in mesh.mesh.flatten().tolist()}
    grid = root.mesh
    for j, size in enumerate(grid.shape):
        if size <= 1 or root_coord[j] == 0:
            continue
        neighbour = list(root_coord)
        neighbour[j] = 0
        if int(grid[tuple(neighbour)]) not in members:
            return False  # another copy of this sub-mesh has coordinate 0 along j
    return True


def dtensor_local_box(dt: Any, *, key: str = "?") -> LocalBox:
    """Return the global box of a DTensor's local shard and whether this rank writes it.

    Raises:
        UnsupportedValueError: unsupported placement, or the local shard disagrees with the
            arithmetic (an unknown sharding scheme).

    """
    mesh = dt.device_mesh
    coord = mesh.get_coordinate()
    gshape = tuple(int(s) for s in dt.shape)
    specs = placement_specs(dt.placements, key=key)
    if coord is None:  # this rank is not part of the mesh: it holds nothing
        return LocalBox((0,) * len(gshape), (0,) * len(gshape), gshape, False)
    mshape = tuple(int(s) for s in mesh.mesh.shape)
    offsets, lengths = shard_box(gshape, mshape, coord, specs)
    local_shape = tuple(int(s) for s in dt.to_local().shape)
    if local_shape != lengths:
        raise UnsupportedValueError(
            f"tensor {key!r}: local shard shape {list(local_shape)} differs from the expected "
            f"{list(lengths)} for placements {list(dt.placements)} on mesh {list(mshape)}; "
            f"uneven sharding other than torch.chunk's is not supported"
        )
    writer = writes_region(coord, specs) and _outside_coordinate_ok(mesh)
    return LocalBox(offsets, lengths, gshape, writer)


def mesh_description(mesh: Any) -> tuple[list[int], list[str]]:
    """Return ``(shape, dim_names)`` of a DeviceMesh (names default to ``dim0``, ``dim1``...)."""
    shape = [int(s) for s in mesh.mesh.shape]
    names = list(mesh.mesh_dim_names or [f"dim{i}" for i in range(len(shape))])
    return shape, [str(n) for n in names]
