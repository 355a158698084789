"""Where a rank's data sits in the global tensor, and which rank writes it.

The arithmetic here is plain Python over ``(mesh shape, coordinate, placements)`` so that it can
be checked exhaustively without a process group. Placements are applied left to right over the
mesh dimensions, as DTensor does:

* ``Shard(d)`` on mesh dimension ``i`` splits the current extent of tensor dimension ``d`` the way
  ``torch.chunk`` does (chunk size ``ceil(L / n)``; trailing shards may be short or empty).
  Several mesh dimensions sharding the same tensor dimension nest in mesh-dimension order.
* ``_StridedShard(d, split_factor=f)`` (FSDP2 on top of tensor parallelism) first cuts the current
  extent into ``f`` chunks, cuts each of those into ``n`` chunks, and gives coordinate ``c`` the
  concatenation of chunk ``c`` of every one of them, so the local rows need not be contiguous
  in the global tensor.
* ``Replicate()`` leaves the extent alone; of the replicas, the one whose coordinate is 0 on every
  replicate mesh dimension writes (the lowest coordinate), so exactly one rank writes each region
  and no communication is needed to decide it.
* ``Partial`` holds unreduced values and cannot be stored (PCK-UNSUPPORTED-VALUE).

Along each tensor dimension a rank's local indices are tracked as *runs* (global start, length)
in local order; the local data is then the cartesian product of the runs of every dimension:
a set of boxes (:class:`Piece`), each with its place in the global tensor and in the local
tensor. Plain ``Shard``/``Replicate`` layouts always give one box; ``_StridedShard`` gives one
box in the usual FSDP2 + TP case (split factor equal to the TP degree) and several otherwise.
"""

from __future__ import annotations

import functools
import itertools
import re
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from portable_ckpt.errors import UnsupportedValueError
from portable_ckpt.format.manifest import Mesh

__all__ = [
    "LocalLayout",
    "Piece",
    "PlacementSpec",
    "chunk_extent",
    "copy_holder",
    "dtensor_layout",
    "group_mesh",
    "is_dtensor",
    "local_layout",
    "local_pieces",
    "local_runs",
    "dim_labels",
    "mesh_description",
    "placement_specs",
    "shard_box",
    "writes_region",
]

#: Placement kinds that split a tensor dimension.
_SHARD_KINDS = ("shard", "strided")

#: ``(global start, length)`` segments of one tensor dimension, in local order.
Runs = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class PlacementSpec:
    """A placement reduced to what box arithmetic needs.

    Attributes:
        kind: ``"shard"``, ``"strided"`` (``_StridedShard``), ``"replicate"`` or ``"partial"``.
        dim: The tensor dimension for ``"shard"`` and ``"strided"``, else ``None``.
        split_factor: For ``"strided"``: the number of chunks the extent is cut into before
            this mesh dimension splits each of them.

    """

    kind: str
    dim: int | None = None
    split_factor: int = 1


@dataclass(frozen=True)
class Piece:
    """One box of a rank's local data.

    Attributes:
        offsets: Where the box starts in the global tensor.
        lengths: Its shape (no zeros).
        local_offsets: Where it starts in the rank's local tensor.

    """

    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    local_offsets: tuple[int, ...]

    def local_slices(self) -> tuple[slice, ...]:
        """Index of the box in the local tensor (``local[piece.local_slices()]``)."""
        return tuple(slice(o, o + n) for o, n in zip(self.local_offsets, self.lengths, strict=True))


@dataclass(frozen=True)
class LocalLayout:
    """A rank's data of one tensor: its local shape and the boxes it holds.

    Attributes:
        global_shape: The logical tensor's shape.
        local_shape: The shape of the rank's local tensor.
        pieces: The boxes of the local data (none when it holds no element).
        writer: Whether this rank is the one that stores them.

    """

    global_shape: tuple[int, ...]
    local_shape: tuple[int, ...]
    pieces: tuple[Piece, ...]
    writer: bool

    @property
    def empty(self) -> bool:
        """True when the rank holds no element."""
        return not self.pieces


def chunk_extent(length: int, parts: int, index: int) -> tuple[int, int]:
    """Return ``(start, size)`` of chunk ``index`` of ``parts`` over ``length`` (torch.chunk)."""
    if parts <= 0 or not 0 <= index < parts:
        raise ValueError(f"chunk index {index} outside 0..{parts - 1}")
    size = -(-length // parts) if length else 0
    start = min(index * size, length)
    return start, max(0, min(size, length - start))


def _runs_length(runs: Runs) -> int:
    return sum(n for _, n in runs)


def _take(runs: Runs, start: int, size: int) -> Runs:
    """The runs of local positions ``[start, start + size)`` of ``runs``.

    An empty selection keeps one zero-length run at the global index where it would begin, so
    an empty shard still has an offset (as ``torch.chunk`` arithmetic gives it).
    """
    out: list[tuple[int, int]] = []
    pos = 0
    anchor = runs[-1][0] + runs[-1][1] if runs else 0
    for g, n in runs:
        lo, hi = max(start, pos), min(start + size, pos + n)
        if size == 0 and pos <= start < pos + n:
            anchor = g + start - pos
        if lo < hi:
            out.append((g + lo - pos, hi - lo))
        pos += n
    return tuple(out) if out else ((anchor, 0),)


def _split(runs: Runs, parts: int, index: int, spec: PlacementSpec) -> Runs:
    """Apply one sharding placement of ``parts`` mesh positions to one dimension's runs."""
    total = _runs_length(runs)
    if spec.kind == "shard":
        return _take(runs, *chunk_extent(total, parts, index))
    out: list[tuple[int, int]] = []
    for j in range(spec.split_factor):
        first = _take(runs, *chunk_extent(total, spec.split_factor, j))
        out.extend(
            r for r in _take(first, *chunk_extent(_runs_length(first), parts, index)) if r[1]
        )
    return tuple(out) if out else _take(runs, total, 0)


def _merge(runs: Runs) -> Runs:
    """Join runs that continue each other in the global tensor; drop empty ones."""
    out: list[tuple[int, int]] = []
    for g, n in runs:
        if n == 0:
            continue
        if out and out[-1][0] + out[-1][1] == g:
            out[-1] = (out[-1][0], out[-1][1] + n)
        else:
            out.append((g, n))
    return tuple(out) if out else (runs[0] if runs else (0, 0),)


def _check_specs(
    global_shape: Sequence[int], mesh_shape: Sequence[int], placements: Sequence[PlacementSpec]
) -> None:
    if len(mesh_shape) != len(placements):
        raise ValueError("mesh_shape, coordinate and placements must have the same length")
    for p in placements:
        if p.kind == "partial":
            raise UnsupportedValueError(
                "a DTensor with a Partial placement holds unreduced values and cannot be "
                "stored; call .redistribute(placements=[Replicate() or Shard(d)]) or "
                ".full_tensor() first"
            )
        if p.kind in _SHARD_KINDS:
            d = p.dim if p.dim is not None else -1
            if not 0 <= d < len(global_shape):
                raise UnsupportedValueError(f"Shard({p.dim}) on a {len(global_shape)}-d tensor")
            if p.kind == "strided" and p.split_factor < 1:
                raise UnsupportedValueError(f"_StridedShard split factor {p.split_factor} < 1")


def local_runs(
    global_shape: Sequence[int],
    mesh_shape: Sequence[int],
    coordinate: Sequence[int],
    placements: Sequence[PlacementSpec],
) -> list[Runs]:
    """Per tensor dimension, the global runs of the local data held at ``coordinate``.

    Raises:
        UnsupportedValueError: a ``partial`` placement, or a shard dimension out of range.

    """
    _check_specs(global_shape, mesh_shape, placements)
    if len(coordinate) != len(placements):
        raise ValueError("mesh_shape, coordinate and placements must have the same length")
    runs: list[Runs] = [((0, int(s)),) for s in global_shape]
    for n, c, p in zip(mesh_shape, coordinate, placements, strict=True):
        if p.kind in _SHARD_KINDS and p.dim is not None:
            runs[p.dim] = _split(runs[p.dim], int(n), int(c), p)
    return [_merge(r) for r in runs]


def local_pieces(
    global_shape: Sequence[int],
    mesh_shape: Sequence[int],
    coordinate: Sequence[int],
    placements: Sequence[PlacementSpec],
) -> tuple[tuple[int, ...], tuple[Piece, ...]]:
    """Return the local shape and the boxes of the data held at ``coordinate``.

    Memoised: a model repeats a few shapes and placements hundreds of times (every layer),
    and the arithmetic cost ~0.1 ms per tensor on a save or load of the realistic state.
    """
    return _local_pieces(
        tuple(int(s) for s in global_shape),
        tuple(int(s) for s in mesh_shape),
        tuple(int(c) for c in coordinate),
        tuple(placements),
    )


@functools.lru_cache(maxsize=4096)
def _local_pieces(
    global_shape: tuple[int, ...],
    mesh_shape: tuple[int, ...],
    coordinate: tuple[int, ...],
    placements: tuple[PlacementSpec, ...],
) -> tuple[tuple[int, ...], tuple[Piece, ...]]:
    runs = local_runs(global_shape, mesh_shape, coordinate, placements)
    local_shape = tuple(_runs_length(r) for r in runs)
    if any(n == 0 for n in local_shape):
        return local_shape, ()
    per_dim = []
    for r in runs:
        starts = list(itertools.accumulate((n for _, n in r), initial=0))
        per_dim.append([(g, n, lo) for (g, n), lo in zip(r, starts, strict=False)])
    pieces = tuple(
        Piece(
            tuple(g for g, _, _ in combo),
            tuple(n for _, n, _ in combo),
            tuple(lo for _, _, lo in combo),
        )
        for combo in itertools.product(*per_dim)
    )
    return local_shape, pieces


def shard_box(
    global_shape: Sequence[int],
    mesh_shape: Sequence[int],
    coordinate: Sequence[int],
    placements: Sequence[PlacementSpec],
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Return ``(offsets, lengths)`` of the piece held at ``coordinate`` when it is one box.

    Raises:
        UnsupportedValueError: a ``partial`` placement, a shard dimension out of range, or a
            strided layout whose local data is several boxes (use :func:`local_pieces`).

    """
    runs = local_runs(global_shape, mesh_shape, coordinate, placements)
    if any(len(r) > 1 for r in runs):
        raise UnsupportedValueError(
            f"placements {list(placements)} give coordinate {list(coordinate)} several boxes; "
            f"use local_pieces()"
        )
    return tuple(r[0][0] for r in runs), tuple(r[0][1] for r in runs)


def writes_region(coordinate: Sequence[int], placements: Sequence[PlacementSpec]) -> bool:
    """Whether the rank at ``coordinate`` writes its piece: coordinate 0 on every replicate dim."""
    return all(
        c == 0 for c, p in zip(coordinate, placements, strict=True) if p.kind not in _SHARD_KINDS
    )


def placement_specs(placements: Sequence[Any], *, key: str = "?") -> list[PlacementSpec]:
    """Convert torch placements to :class:`PlacementSpec` (refusing unsupported kinds).

    Supported placements are memoised by value (torch's placements are frozen dataclasses);
    anything else is converted here, so its error names ``key``.
    """
    try:
        return list(_cached_specs(tuple(placements)))
    except (TypeError, UnsupportedValueError):  # unhashable or refused: convert with the key
        return _placement_specs(placements, key=key)


@functools.lru_cache(maxsize=256)
def _cached_specs(placements: tuple[Any, ...]) -> tuple[PlacementSpec, ...]:
    return tuple(_placement_specs(placements, key="?"))


def _placement_specs(placements: Sequence[Any], *, key: str) -> list[PlacementSpec]:
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    out: list[PlacementSpec] = []
    for p in placements:
        cls = type(p).__name__
        if isinstance(p, Partial) or "Partial" in cls:
            raise UnsupportedValueError(
                f"tensor {key!r}: DTensor placement {p} (Partial) holds unreduced values and "
                f"cannot be stored; redistribute it to Replicate() or Shard(d) before saving"
            )
        if isinstance(p, _StridedShard):
            out.append(PlacementSpec("strided", int(p.dim), int(p.split_factor)))
        elif type(p) is Shard:
            out.append(PlacementSpec("shard", int(p.dim)))
        elif isinstance(p, Replicate):
            out.append(PlacementSpec("replicate"))
        else:
            raise UnsupportedValueError(
                f"tensor {key!r}: DTensor placement {p} ({cls}) is not supported (only Shard(d), "
                f"_StridedShard(d), Replicate()); redistribute the tensor before saving"
            )
    return out


def _copy_holder(mesh: Any) -> int | None:
    """For a sub-mesh: the rank whose copy of this rank's pieces is stored, else ``None``.

    A DTensor on a sub-mesh (FSDP2 on ``mesh["dp"]`` for a layer that tensor parallelism leaves
    whole) has one copy per coordinate along the root dims the sub-mesh lacks; the rank at
    coordinate 0 along them (the same place along the others) stores it. That these copies are
    alike is checked at every save (:func:`portable_ckpt.torch.plan.copy_conflicts`): under
    pipeline parallelism the other coordinates hold other tensors. ``-1``: not in the root.
    """
    try:
        root = mesh._get_root_mesh()
    except Exception:  # pragma: no cover - older/newer torch without the helper
        return None
    if root is None or root is mesh or tuple(root.mesh.shape) == tuple(mesh.mesh.shape):
        return None
    root_coord = root.get_coordinate()
    if root_coord is None:
        return -1
    members = {int(r) for r in mesh.mesh.flatten().tolist()}
    grid = root.mesh
    holder = list(root_coord)
    lacks = False
    for j, size in enumerate(grid.shape):
        if size <= 1:
            continue
        neighbour = list(root_coord)
        neighbour[j] = (root_coord[j] + 1) % size
        if int(grid[tuple(neighbour)]) not in members:
            lacks = True  # j is a dim the sub-mesh lacks: the copy at 0 along it is stored
            holder[j] = 0
    if not lacks:  # the sub-mesh spans every rank of the root (a flattened mesh): no copies
        return None
    return int(grid[tuple(holder)])


@dataclass(frozen=True)
class _MeshFacts:
    coord: tuple[int, ...] | None
    shape: tuple[int, ...]
    outside_ok: bool
    copy_holder: int | None  # see _copy_holder


_MESH_FACTS: dict[int, tuple[weakref.ref[Any], _MeshFacts]] = {}


def _mesh_facts(mesh: Any) -> _MeshFacts:
    """Return the rank's coordinate, the mesh shape and whether it writes (:func:`_copy_holder`).

    ``DeviceMesh.mesh`` rebuilds a tensor on every access (about a millisecond): with hundreds
    of DTensors on one mesh that dominated planning a save or a load. Meshes are immutable, so
    the facts are computed once per mesh object (held weakly).
    """
    hit = _MESH_FACTS.get(id(mesh))
    if hit is not None and hit[0]() is mesh:
        return hit[1]
    coord = mesh.get_coordinate()
    holder = _copy_holder(mesh)
    facts = _MeshFacts(
        None if coord is None else tuple(int(c) for c in coord),
        tuple(int(s) for s in mesh.mesh.shape),
        # the stored copy of a sub-mesh's pieces is the holder's (the mesh's own otherwise)
        coord is not None and (holder is None or holder == mesh.get_rank()),
        holder,
    )
    if len(_MESH_FACTS) > 256:
        _MESH_FACTS.clear()
    _MESH_FACTS[id(mesh)] = (weakref.ref(mesh), facts)
    return facts


def dtensor_layout(dt: Any, *, key: str = "?", local: Any = None) -> LocalLayout:
    """Return the boxes of a DTensor's local data and whether this rank writes them.

    ``local`` is ``dt``'s local tensor when the caller has it already.

    Raises:
        UnsupportedValueError: unsupported placement, or the local tensor disagrees with the
            arithmetic (an unknown sharding scheme).

    """
    facts = _mesh_facts(dt.device_mesh)
    coord = facts.coord
    gshape = tuple(int(s) for s in dt.shape)
    specs = placement_specs(dt.placements, key=key)
    if coord is None:  # this rank is not part of the mesh: it holds nothing
        return LocalLayout(gshape, (0,) * len(gshape), (), False)
    mshape = facts.shape
    local_shape, pieces = local_pieces(gshape, mshape, coord, specs)
    actual = tuple(int(s) for s in (dt.to_local() if local is None else local).shape)
    if actual != local_shape:
        raise UnsupportedValueError(
            f"tensor {key!r}: local shard shape {list(actual)} differs from the expected "
            f"{list(local_shape)} for placements {list(dt.placements)} on mesh {list(mshape)}; "
            f"uneven sharding other than torch.chunk's is not supported"
        )
    writer = writes_region(coord, specs) and facts.outside_ok
    return LocalLayout(gshape, local_shape, pieces, writer)


def copy_holder(dt: Any) -> int | None:
    """The rank that stores ``dt``'s local pieces when its mesh is a sub-mesh (else ``None``).

    ``None`` too when this rank is not in ``dt``'s mesh: it holds none of its data.
    """
    facts = _mesh_facts(dt.device_mesh)
    return None if facts.coord is None else facts.copy_holder


def mesh_description(mesh: Any) -> tuple[list[int], list[str]]:
    """Return ``(shape, dim_names)`` of a DeviceMesh (names default to ``dim0``, ``dim1``...).

    The names are labels (only the shape decides a contract, spec §13), written in the format's
    pattern: a torch name such as ``"dp-shard"`` is recorded as ``"dp_shard"``.
    """
    shape = [int(s) for s in mesh.mesh.shape]
    names = list(mesh.mesh_dim_names or [f"dim{i}" for i in range(len(shape))])
    return shape, dim_labels([str(n) for n in names])


def dim_labels(names: Sequence[str]) -> list[str]:
    """``names`` as unique mesh dimension labels of the format (``[A-Za-z_][A-Za-z0-9_]{0,63}``)."""
    out: list[str] = []
    for i, name in enumerate(names):
        label = re.sub(r"[^A-Za-z0-9_]", "_", name)[:64] or f"dim{i}"
        if not (label[0].isascii() and (label[0].isalpha() or label[0] == "_")):
            label = f"_{label}"[:64]
        base, k = label, 1
        while label in out:
            label = f"{base[: 63 - len(str(k))]}_{k}"
            k += 1
        out.append(label)
    return out


_DTENSOR_ATTRS = ("device_mesh", "placements", "to_local")
#: Classes that define all three (DTensor): their instances are DTensors without the three
#: lookups, asked several times per tensor and save (hundreds of tensors, async_save's blocking
#: part). A class that defines them per instance only is asked every time.
_DTENSOR_CLASSES: set[type] = set()


def is_dtensor(t: Any) -> bool:
    """Whether ``t`` is a DTensor (duck-typed: device mesh, placements, local tensor)."""
    cls = type(t)
    if cls in _DTENSOR_CLASSES:
        return True
    if not (hasattr(t, "device_mesh") and hasattr(t, "placements") and hasattr(t, "to_local")):
        return False
    if len(_DTENSOR_CLASSES) < 64 and all(hasattr(cls, a) for a in _DTENSOR_ATTRS):
        _DTENSOR_CLASSES.add(cls)
    return True


def _no_grad() -> Any:
    import torch

    return torch.no_grad()


def local_layout(key: str, t: Any, rank: int) -> tuple[LocalLayout, Any]:
    """Return the boxes of tensor ``t`` on ``rank`` and its local tensor.

    A plain tensor is one box that rank 0 writes; a DTensor's boxes come from its placements.
    """
    if is_dtensor(t):
        # Without grad mode to_local() is an attribute read, not an autograd op (~1 ms each).
        with _no_grad():
            local = t.to_local()
        return dtensor_layout(t, key=key, local=local), local
    shape = tuple(int(s) for s in t.shape)
    zeros = (0,) * len(shape)
    pieces = () if any(n == 0 for n in shape) else (Piece(zeros, shape, zeros),)
    return LocalLayout(shape, shape, pieces, rank == 0), t


def group_mesh(tensors: Iterable[Any]) -> Mesh | None:
    """The largest device mesh among ``tensors`` (the job's mesh), or ``None`` without DTensors.

    A sub-mesh (``mesh["dp"]``, on which FSDP2 puts the parameters that tensor parallelism
    leaves alone) stands for the mesh it was taken from: a state holding only such tensors (a
    partial load) is still the same job, not a job on a smaller mesh.
    """
    meshes: dict[int, Any] = {}
    for t in tensors:
        mesh = getattr(t, "device_mesh", None)
        if mesh is not None:
            meshes.setdefault(id(mesh), mesh)  # ndim and size() cost µs each: once per mesh
    for key, mesh in list(meshes.items()):
        root = getattr(mesh, "_get_root_mesh", None)  # torch's own record of the parent mesh
        if callable(root):
            meshes[key] = root()
    best: Any = None
    for mesh in meshes.values():
        if best is None or mesh.ndim > best.ndim or mesh.size() > best.size():
            best = mesh
    if best is None:
        return None
    shape, names = mesh_description(best)
    return Mesh(shape=tuple(shape), dim_names=tuple(names))
