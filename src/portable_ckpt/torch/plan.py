"""What one rank writes in a save, decided from the placements alone (no I/O, no collectives).

A DTensor's local shard is written by the rank whose coordinate is 0 on every replicate mesh
dimension; a plain tensor by rank 0 only; a zero-size tensor is declared by rank 0. Non-tensor
leaves travel in the ``VALUES_ENTRY`` entry (rank 0); ``global`` entries are written by rank 0,
``per_rank`` entries by every rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from portable_ckpt.errors import UnsupportedValueError
from portable_ckpt.format.manifest import Mesh
from portable_ckpt.format.vocab import POLICIES, SCOPES, Scope, WorldSizePolicy, one_of
from portable_ckpt.torch._tensors import format_dtype
from portable_ckpt.torch.flatten import VALUES_ENTRY, FlatState, StateEntry, encode_json
from portable_ckpt.torch.layout import LocalLayout, Piece, group_mesh, local_layout
from portable_ckpt.torch.state import RNGState

__all__ = ["PlannedPiece", "PlannedEntry", "SavePlan", "plan_save"]


@dataclass
class PlannedPiece:
    """A box of one tensor that this rank stores (or, without a source, only declares).

    Attributes:
        key: The tensor key.
        dtype: Its on-disk dtype name.
        global_shape: The logical tensor's shape.
        offsets: Where the box starts in it.
        source: The live local tensor until staging (``None``: declare only, or staged).
        array: The bytes to write once staged: a view of ``source`` or of a staging buffer.

    """

    key: str
    dtype: str
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    source: torch.Tensor | None
    array: np.ndarray[Any, Any] | None = None

    @property
    def slot(self) -> str:
        """Names the piece's staging buffer: a tensor of a strided layout has several pieces."""
        return f"{self.key}@{','.join(str(o) for o in self.offsets)}"


@dataclass(frozen=True)
class PlannedEntry:
    """A non-tensor entry this rank writes.

    Attributes:
        name: The entry name.
        value: Its JSON value (captured at planning time).
        schema: The schema id it is validated against.
        scope: ``"global"`` (rank 0 writes it) or ``"per_rank"`` (every rank writes its value).
        policy: The world-size policy of a ``per_rank`` entry (``None`` for ``global``).

    """

    name: str
    value: Any
    schema: str
    scope: Scope
    policy: WorldSizePolicy | None


@dataclass
class SavePlan:
    """Everything one rank writes in one save.

    Attributes:
        pieces: The tensor boxes this rank stores or declares.
        entries: The entries this rank writes.
        mesh: The job's device mesh (recorded in the continuation), if any.
        tensor_bytes: Bytes of the pieces' data.

    """

    pieces: list[PlannedPiece]
    entries: list[PlannedEntry]
    mesh: Mesh | None
    tensor_bytes: int

    def release(self) -> None:
        """Drop every staged view and live reference (once the pieces are written)."""
        for p in self.pieces:
            p.source = None
            p.array = None


def plan_save(flat: FlatState, rank: int, rng_snapshot: dict[str, Any]) -> SavePlan:
    """Return what ``rank`` writes of ``flat`` (``rng_snapshot`` is the RNG state to store)."""
    pieces = _plan_pieces(flat, rank)
    nbytes = sum(p.source.numel() * p.source.element_size() for p in pieces if p.source is not None)
    entries = _plan_entries(flat, rank, rng_snapshot)
    return SavePlan(pieces, entries, group_mesh(flat.tensors.values()), nbytes)


def _plan_pieces(flat: FlatState, rank: int) -> list[PlannedPiece]:
    pieces: list[PlannedPiece] = []
    for key, t in flat.tensors.items():
        layout, local = local_layout(key, t, rank)
        dtype = format_dtype(t.dtype, key=key)
        if local.is_sparse or local.layout != torch.strided:
            raise UnsupportedValueError(
                f"tensor {key!r}: layout {local.layout} is not supported; densify it"
            )
        if layout.writer:  # one box, or several for strided layouts
            pieces += [
                PlannedPiece(key, dtype, layout.global_shape, p.offsets, _box(local, p, layout))
                for p in layout.pieces
            ]
        if rank == 0 and math.prod(layout.global_shape) == 0:
            # A zero-size tensor has no ranges at all: rank 0 declares it.
            zeros = (0,) * len(layout.global_shape)
            pieces.append(PlannedPiece(key, dtype, layout.global_shape, zeros, None))
    return pieces


def _box(local: torch.Tensor, piece: Piece, layout: LocalLayout) -> torch.Tensor:
    """The part of the local tensor that ``piece`` covers (the tensor itself when it is all)."""
    if len(layout.pieces) == 1 and piece.lengths == layout.local_shape:
        return local
    return local[piece.local_slices()]


def _plan_entries(flat: FlatState, rank: int, rng_snapshot: dict[str, Any]) -> list[PlannedEntry]:
    entries: list[PlannedEntry] = []
    if VALUES_ENTRY in flat.entries:
        raise UnsupportedValueError(f"the state key {VALUES_ENTRY!r} is reserved; rename it")
    if flat.values and rank == 0:
        values = {k: encode_json(v, key=k) for k, v in flat.values.items()}
        entries.append(PlannedEntry(VALUES_ENTRY, values, "pck:json/1", "global", None))
    for key, e in flat.entries.items():
        scope, policy = e.scope, e.world_size_policy
        if not one_of(scope, SCOPES):
            raise UnsupportedValueError(f"entry {key!r}: scope {scope!r} is not global/per_rank")
        if scope == "global" and rank != 0:
            continue
        if scope == "global" or not one_of(policy, POLICIES):
            policy = None  # global; or a per_rank entry without a valid policy: the writer refuses it
        entries.append(PlannedEntry(key, _entry_value(e, rng_snapshot), e.schema, scope, policy))
    return entries


def _entry_value(e: StateEntry, rng_snapshot: dict[str, Any]) -> Any:
    if isinstance(e, RNGState):
        value = dict(rng_snapshot)
        if e.cuda is False:
            value["torch_cuda"] = None
        return value
    return e.capture()
