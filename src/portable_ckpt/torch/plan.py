"""What one rank writes in a save, decided from the placements alone (no I/O, no collectives).

A DTensor's local shard is written by the rank whose coordinate is 0 on every replicate mesh
dimension; a plain tensor by the lowest rank that holds it, rank 0 for one every rank holds
(the others' copies are compared with it: :func:`replica_digests`; which rank holds what is
learnt by :mod:`portable_ckpt.torch._owners`); a zero-size tensor is declared by rank 0, a
plain one by the rank that would store it. Non-tensor
leaves travel in the ``VALUES_ENTRY`` entry (rank 0); ``global`` entries are written by rank 0,
``per_rank`` entries by every rank.

The tensor part of a plan (which pieces, where in the global tensor, staging slot names) depends
only on the layout of the state, which a training job keeps from save to save: it is kept per
exact layout (:func:`plan_stats`) and bound to the tensors of each call, so only the first save
of a layout pays for the box arithmetic. Entries and JSON values are captured at every save.
"""

from __future__ import annotations

import ctypes
import json
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from portable_ckpt.errors import CheckpointError, UnsupportedValueError
from portable_ckpt.format.keys import DCP_ITEMS_ENTRY, dcp_items_value
from portable_ckpt.format.manifest import Mesh
from portable_ckpt.format.vocab import POLICIES, SCOPES, Scope, WorldSizePolicy, one_of
from portable_ckpt.io.checksum import crc32c
from portable_ckpt.torch._owners import PlainOwners
from portable_ckpt.torch._tensors import as_bits, format_dtype
from portable_ckpt.torch.flatten import VALUES_ENTRY, FlatState, StateEntry, encode_json
from portable_ckpt.torch.layout import copy_holder, group_mesh, is_dtensor, local_layout
from portable_ckpt.torch.state import RNGState

__all__ = [
    "PARAMETER",
    "REPLICA_CHECK_BYTES",
    "PlannedEntry",
    "PlannedPiece",
    "SavePlan",
    "copy_conflicts",
    "diverged",
    "diverged_parameters",
    "plan_save",
    "plan_stats",
    "replica_conflicts",
    "replica_digests",
    "submesh_copies",
]


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
        slot: Names the piece's staging buffer (a tensor of a strided layout has several
            pieces): ``key@offsets``.

    """

    key: str
    dtype: str
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    source: torch.Tensor | None
    array: np.ndarray[Any, Any] | None = None
    slot: str = ""

    def __post_init__(self) -> None:
        """Name the staging buffer unless the plan did (made once per layout, not per save)."""
        if not self.slot:
            self.slot = _slot(self.key, self.offsets)


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
    replicas: dict[str, str] = field(default_factory=dict)
    copies: dict[str, list[Any]] = field(default_factory=dict)
    #: The plain tensors a rank other than 0 stores (no lower rank holds them).
    staged_plain: list[str] = field(default_factory=list)
    #: The plain values it stores (as JSON), which rank 0 writes for it.
    plain_values: dict[str, Any] = field(default_factory=dict)
    #: The DCP object paths of those tensors and values that need one (and of the lists the
    #: values are items of): rank 0 records them all.
    plain_paths: dict[str, list[Any]] = field(default_factory=dict)
    #: Names the pieces' slots, shapes, dtypes and devices: two plans with the same layout
    #: (``is``, or equal) have the same (:func:`~portable_ckpt.torch.staging.stage` reuses the
    #: buffers it found for the last one). ``None``: unknown, the buffers are looked up.
    layout: Any = None

    def release(self) -> None:
        """Drop every staged view and live reference (once the pieces are written)."""
        for p in self.pieces:
            p.source = None
            p.array = None


def plan_save(
    flat: FlatState,
    rank: int,
    rng_snapshot: dict[str, Any],
    *,
    world: int = 1,
    step: int = 0,
    owners: PlainOwners | None = None,
) -> SavePlan:
    """Return what ``rank`` of ``world`` writes of ``flat`` (``rng_snapshot``: the RNG to store).

    ``step`` places the sampled slices of large plain tensors (the same on every rank).
    ``owners`` says which plain tensors and values a rank other than 0 stores (``None``: none,
    rank 0 stores them all).

    The tensor part of the plan is reused from an earlier save when the state's layout is
    exactly the same (see :func:`plan_stats`); entries and values are captured every time.
    """
    template, locals_ = _template_for(flat, rank, world)
    kept = template.pieces
    mine = owners.mine if owners is not None else frozenset()
    if rank != 0 and template.plain:
        kept = tuple(t for t in kept if not t.plain or t.key in mine)
    staged = list(dict.fromkeys(t.key for t in kept if t.plain)) if rank != 0 else []
    pieces = [
        PlannedPiece(
            t.key, t.dtype, t.global_shape, t.offsets, _bind(locals_, t), slot=t.slot
        )
        for t in kept
    ]
    nbytes = template.tensor_bytes
    if rank != 0 and template.plain:
        nbytes = sum(t.nbytes for t in kept)
    entries = _plan_entries(flat, rank, rng_snapshot)
    replicas = (
        replica_digests(flat, captured={e.name: e.value for e in entries}, seed=step)
        if world > 1 else {}
    )
    copies = submesh_copies(flat, seed=step) if world > 1 else {}
    values: dict[str, Any] = {}
    if rank != 0 and flat.values and mine:
        values = {k: encode_json(v, key=k) for k, v in flat.values.items() if k in mine}
    paths = _paths_of([*staged, *values], flat.dcp_paths) if flat.dcp_paths else {}
    # The template fixes every piece's slot, shape, dtype and device; which plain pieces a
    # rank other than 0 keeps is fixed by the owners it stores.
    layout = (template, mine if rank != 0 and template.plain else None)
    return SavePlan(
        pieces, entries, template.mesh, nbytes, replicas, copies, staged, values, paths, layout
    )


def _paths_of(keys: list[str], dcp_paths: Mapping[str, Any]) -> dict[str, list[Any]]:
    """The DCP object paths of ``keys`` and of the lists above them (a list is one DCP item)."""
    out: dict[str, list[Any]] = {}
    for key in keys:
        head = key
        while head:
            if head in dcp_paths:
                out[head] = list(dcp_paths[head])
            head = head.rpartition("/")[0]
    return out


#: Plain tensors up to this size are compared between ranks at every save (their CRC32C):
#: one copy of a plain tensor is stored, which the ranks that hold it must hold alike.
#: Buffers that are not synchronised (BatchNorm statistics under FSDP2, per-rank counters) are
#: small; larger plain tensors (a DDP model's parameters, which DDP keeps equal) are compared
#: by a sample.
REPLICA_CHECK_BYTES = 1 << 20
#: At most this many bytes are checked in all per save.
REPLICA_CHECK_TOTAL = 64 << 20


def replica_digests(
    flat: FlatState, captured: Mapping[str, Any] | None = None, seed: int = 0
) -> dict[str, str]:
    """``dtype[shape]`` of each plain (non-DTensor) tensor of ``flat``, now (see above).

    The small ones get ``:`` and the CRC32C of their bytes after it. Plain values are stored
    as rank 0's too: each gets ``value:`` and the CRC32C of its JSON (values that differed
    between ranks became rank 0's under an ``exact`` contract, fidelity review F16). So do
    ``global`` entries (``entry:``; a rank's own cursor in one was restored on every rank as
    rank 0's, continuation review F2), from ``captured`` where this rank planned them already.
    """
    out: dict[str, str] = {}
    for key, v in flat.values.items():
        out[key] = f"value:{_json_crc(encode_json(v, key=key)):08x}"
    for key, e in flat.entries.items():
        if e.scope == "global" and e.compare_ranks:
            if captured is not None and key in captured:
                value = captured[key]
            else:
                try:
                    value = e.capture()
                except Exception:  # held by rank 0 only (a tracker, a logger)
                    continue  # as an entry only rank 0 holds: stored as rank 0's, unchecked
            try:
                # The JSON as stored (int keys as strings): mixed key types cannot be sorted
                # raw, and the check failed every multi-rank save (attack review 2 F5).
                text = encode_json(value, key=key)
            except CheckpointError:
                continue  # the writer says what is wrong with it, on the rank that stores it
            out[key] = f"entry:{_json_crc(text):08x}"
    budget = REPLICA_CHECK_TOTAL
    with torch.no_grad():
        for key, t in flat.tensors.items():
            if is_dtensor(t):
                continue
            values, budget = _values_digest(t, budget, seed)
            mark = PARAMETER if key in flat.params else ""
            out[key] = f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}{values}{mark}"
    return out


def _values_digest(t: torch.Tensor, budget: int, seed: int) -> tuple[str, int]:
    """The values part of a plain tensor's digest, and the budget left.

    ``:crc`` of a small tensor's bytes, ``:scrc`` of a large one's sample, or nothing (zero
    size, or past ``budget`` bytes).
    """
    nbytes = t.numel() * t.element_size()
    if nbytes > REPLICA_CHECK_BYTES:
        sample = _sample(t, seed) if budget >= _SAMPLE_BYTES * (_SAMPLES + 1) else None
        if sample is None:
            return "", budget
        return f":s{crc32c(sample.numpy().data):08x}", budget - sample.numel()
    if nbytes > budget or nbytes == 0:
        return "", budget
    if t.device.type == "cpu" and t.is_contiguous() and not (t.is_conj() or t.is_neg()):
        # the bytes in place (a step counter: 7 µs through the views below, 1.4 ms per save
        # for FSDP2's 202 of them, in async_save's blocking part)
        raw = (ctypes.c_char * nbytes).from_address(t.data_ptr())
        return f":{crc32c(memoryview(raw).cast('B')):08x}", budget - nbytes
    # resolve_*: a conjugate or negative view has no bytes of its own to view as uint8;
    # a one-element view (a complex tensor's .imag) is "contiguous" with a stride of 2
    host = t.detach().to("cpu", copy=False).resolve_conj().resolve_neg().reshape(-1)
    if host.stride(0) != 1:
        host = host.clone(memory_format=torch.contiguous_format)
    return f":{crc32c(host.view(torch.uint8).numpy().data):08x}", budget - nbytes


#: Ends the digest of a plain tensor that is a module's parameter (``FlatState.params``).
PARAMETER = "!p"


def _bare(digest: str) -> str:
    return digest.removesuffix(PARAMETER)


def diverged_parameters(digests: list[dict[str, str]], differ: list[str]) -> list[str]:
    """Those of ``differ`` (:func:`diverged`) that some rank holds as a module's parameter."""
    return [k for k in differ if any(d.get(k, "").endswith(PARAMETER) for d in digests)]


#: A plain tensor above REPLICA_CHECK_BYTES is compared by a sample: this many evenly spaced
#: slices and its end, each this many bytes. A per-rank buffer (an error-feedback residual)
#: was restored as rank 0's under "exact" (continuation review F5); DDP's equal parameters
#: cost 68 KiB each to compare. The slices move with every save's step (the same on every
#: rank), so a difference between them is not missed at every save (attack review 2 F10).
_SAMPLES = 16
_SAMPLE_BYTES = 4096


def _sample(t: torch.Tensor, seed: int = 0) -> torch.Tensor | None:
    """The bytes of a sample of a large contiguous plain tensor, on the host (else ``None``)."""
    if not t.is_contiguous():
        return None  # a strided view would be copied whole to be sampled
    flat = t.detach().reshape(-1)
    n, per = flat.numel(), max(1, _SAMPLE_BYTES // t.element_size())
    step = max(1, n // _SAMPLES)
    shift = (seed * 0x9E3779B1) % max(1, step - per) if seed else 0  # a golden-ratio stride
    parts = [flat[i * step + shift : i * step + shift + per] for i in range(_SAMPLES)]
    parts.append(flat[max(0, n - per) :])
    host = torch.cat(parts).to("cpu").resolve_conj().resolve_neg().contiguous()
    return host.view(torch.uint8)


def _json_crc(value: Any) -> int:
    return crc32c(json.dumps(value, sort_keys=True, separators=(",", ":")).encode())


def diverged(digests: list[dict[str, str]]) -> list[str]:
    """The plain tensors and values that differ between the ranks that hold them.

    ``digests``: each rank's :attr:`SavePlan.replicas`. Only keys held with one dtype and
    shape (the others are :func:`replica_conflicts`); a global entry only if every rank holds
    it (one that only rank 0 holds, a tracker, is stored as before).
    """
    out = []
    for key in sorted(set().union(*digests)):
        seen = [d.get(key) for d in digests]
        held = [_bare(v) for v in seen if v is not None]
        if None in seen and held[0].startswith("entry:"):
            continue
        if len({v.split(":")[0] for v in held}) == 1 and len(set(held)) > 1:
            out.append(key)
    return out


def replica_conflicts(digests: list[dict[str, str]]) -> list[str]:
    """Why plain tensors and values cannot be stored once: keys held as different things.

    Another dtype or shape, a tensor on one rank and a value on another: the stored copy
    could not load back on some rank. A key that only some ranks hold is stored from the
    lowest of them (:mod:`portable_ckpt.torch._owners`).
    """
    out = []
    for key in sorted(set().union(*digests)):
        seen = [d.get(key) for d in digests]
        metas = sorted({_bare(v).split(":")[0] for v in seen if v})
        if len(metas) > 1:
            out.append(f"{key!r} is {' on some ranks, '.join(metas)} on others")
    return out


#: Elements of each local shard that :func:`submesh_copies` compares: evenly spaced over the
#: shard, moved with each save's step (as the plain tensors' slices are), plus its last.
_COPY_SAMPLES = 64


def submesh_copies(flat: FlatState, seed: int = 0) -> dict[str, list[Any]]:
    """What this rank holds on sub-meshes, for the check that the stored copy is the same.

    A DTensor on a sub-mesh is stored once, from the rank at coordinate 0 along the root dims
    the sub-mesh lacks (:func:`~portable_ckpt.torch.layout.copy_holder`, a global rank); the
    other ranks skip theirs as copies of it. Under pipeline parallelism those ranks hold other
    stages' tensors: they were silently lost (HSDP/PP review F0). Per group of such tensors
    (by the sub-mesh's dim names and the holder): ``[holder, structure digest, values digest,
    first key]``. The structure covers the keys, dtypes and shapes; the values a sample of each
    local shard (:data:`_COPY_SAMPLES` elements spread over it, strided shards too, gathered on
    the device and copied to the host once). :func:`copy_conflicts` compares each rank's with
    its holder's.
    """
    groups: dict[str, tuple[int, list[tuple[str, Any]]]] = {}
    for key, t in flat.tensors.items():
        if not is_dtensor(t):
            continue
        holder = copy_holder(t)
        if holder is None or holder < 0:
            continue
        mesh: Any = getattr(t, "device_mesh")  # noqa: B009 - a DTensor (duck-typed above)
        dims = ",".join(str(n) for n in (mesh.mesh_dim_names or ()))
        groups.setdefault(f"{dims}@{holder}", (holder, []))[1].append((key, t))
    if not groups:
        return {}
    # (group, its holder, its (key, global shape, local shard) in key order)
    ordered = [(name, holder, [(k, t.shape, t.to_local()) for k, t in sorted(items)])
               for name, (holder, items) in sorted(groups.items(), key=lambda g: g[0])]
    indexes: dict[tuple[int, Any], torch.Tensor] = {}
    with torch.no_grad():
        host = iter(_to_host([_spread_sample(local, seed, indexes)
                              for _, _, shards in ordered for _, _, local in shards]))
    out: dict[str, list[Any]] = {}
    for name, holder, shards in ordered:
        shape_crc = values_crc = 0
        for key, shape, local in shards:
            head = f"{key}|{local.dtype}|{list(shape)}|{list(local.shape)}|".encode()
            shape_crc = crc32c(head, shape_crc)
            values_crc = crc32c(next(host), values_crc)
        out[name] = [holder, f"{shape_crc:08x}", f"{values_crc:08x}", shards[0][0]]
    return out


def _spread_sample(
    local: torch.Tensor, seed: int, indexes: dict[tuple[int, Any], torch.Tensor]
) -> torch.Tensor:
    """Sample ``local`` for :func:`submesh_copies`, on its device, bitwise.

    The bytes of :data:`_COPY_SAMPLES` elements spread evenly over it from a start that moves
    with ``seed`` (every element is sampled by some step, small shards too), and of its last,
    as a 1-D uint8 tensor. The shard is seen as integers of its element's width (CUDA has no
    gather kernel for uint16; -0.0 and 0.0 differ, as bytes do); any strides, no copy of the
    whole shard. ``indexes``: the device index tensors made already, by (elements, device).
    """
    n = local.numel()
    ints = as_bits(local)
    if n == 0 or ints is None:
        return torch.empty(0, dtype=torch.uint8, device=local.device)
    shift = (seed * 0x9E3779B1) % n
    pos = np.append((shift + (np.arange(_COPY_SAMPLES) * n) // _COPY_SAMPLES) % n, n - 1)
    if not ints.is_contiguous():
        where = torch.from_numpy(pos).to(local.device)
        picked = ints[torch.unravel_index(where, local.shape)] if local.dim() else ints.reshape(1)
    elif ints.device.type == "cpu":
        picked = torch.from_numpy(ints.reshape(-1).numpy()[pos])
    else:
        key = (n, ints.device)
        if key not in indexes:
            indexes[key] = torch.from_numpy(pos).to(ints.device)
        picked = ints.reshape(-1).index_select(0, indexes[key])
    return picked.contiguous().view(torch.uint8)




def _to_host(samples: list[torch.Tensor]) -> list[bytes]:
    """Each sample's bytes on the host: one copy per device, not one per tensor."""
    out: list[bytes] = [b""] * len(samples)
    by_device: dict[Any, list[int]] = {}
    for j, x in enumerate(samples):
        by_device.setdefault(x.device, []).append(j)
    for idx in by_device.values():
        data = torch.cat([samples[j] for j in idx]).cpu().numpy()
        off = 0
        for j in idx:
            size = samples[j].numel()
            out[j] = data[off : off + size].tobytes()
            off += size
    return out


def copy_conflicts(copies: list[dict[str, list[Any]]], global_ranks: list[int]) -> list[str]:
    """Ranks whose sub-mesh DTensors are not held alike by the rank that stores them.

    ``copies``: each rank's :func:`submesh_copies`, in group order; ``global_ranks``: the
    global rank of each (a holder is a global rank: a group need not start at rank 0).
    """
    index = {g: i for i, g in enumerate(global_ranks)}
    out = []
    for i, groups in enumerate(copies):
        for name, (holder, shapes, values, first) in sorted(groups.items()):
            if holder == global_ranks[i]:
                continue
            dims = name.split("@")[0]
            where = f"rank {global_ranks[i]} holds DTensors on a sub-mesh ({dims}) such as {first!r}"
            j = index.get(holder)
            theirs = copies[j].get(name) if j is not None else None
            if j is None:
                out.append(f"{where}, stored from rank {holder}, which is not in the saving group")
            elif theirs is None or theirs[1] != shapes:
                held = "holds none of them" if theirs is None else "holds other ones"
                out.append(f"{where}, stored from rank {holder}, which {held} (pipeline "
                           "parallelism: the stages hold other tensors)")
            elif theirs[2] != values:
                out.append(f"{where}, stored from rank {holder}, which holds them with other "
                           "values (pipeline stages with stage-local names, or tensor-parallel "
                           "copies that drifted apart: make them equal before saving)")
    return out


# -- the tensor part of a plan, reused across saves of the same layout -----------------------------


@dataclass(frozen=True)
class _PieceTemplate:
    """A planned piece without its source: ``index`` names the local tensor, ``slices`` the box.

    ``index`` is ``None`` for a zero-size tensor that is only declared; ``slices`` is ``None``
    when the box is the whole local tensor.
    """

    key: str
    dtype: str
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    index: int | None
    slices: tuple[slice, ...] | None
    slot: str
    plain: bool = False  # of a plain tensor: stored by the lowest rank that holds it
    nbytes: int = 0


@dataclass(frozen=True)
class _Template:
    signature: tuple[Any, ...]
    pieces: tuple[_PieceTemplate, ...]
    mesh: Mesh | None
    tensor_bytes: int
    plain: bool = False  # some piece is a plain tensor's (a rank other than 0 filters them)


class _PlanCache:
    """The last few tensor plans of this process, found by comparing signatures exactly."""

    size = 4

    def __init__(self) -> None:
        self.templates: list[_Template] = []
        self.planned = 0
        self.reused = 0
        self.lock = threading.Lock()

    def find(self, signature: tuple[Any, ...]) -> _Template | None:
        with self.lock:
            for i, t in enumerate(self.templates):
                if t.signature == signature:  # element by element, never by a hash alone
                    self.templates.insert(0, self.templates.pop(i))
                    self.reused += 1
                    return t
            return None

    def add(self, template: _Template) -> None:
        with self.lock:
            self.planned += 1
            self.templates.insert(0, template)
            del self.templates[self.size :]


_CACHE = _PlanCache()


def plan_stats() -> dict[str, int]:
    """How often this process planned a save's tensors afresh and how often it reused a plan.

    A plan is reused when every input of the tensor planning is equal to an earlier save's
    (one of the last four): the rank and world size, and per tensor in order its key, dtype,
    global shape, device mesh (the same object, not an equal one) and placements, and its local
    tensor's shape, device, layout and type. Anything else re-plans.
    """
    return {"planned": _CACHE.planned, "reused": _CACHE.reused}


def _signature(flat: FlatState, rank: int, world: int) -> tuple[tuple[Any, ...], list[Any]]:
    """The exact inputs of the tensor planning, and the local tensors (in key order).

    A local tensor's strides and storage offset are no input: its pieces are boxes of its
    shape, whatever its memory layout. What :func:`_check_source` looks at (type, nesting,
    layout, device) is, so a signature equal to a cached one passed those checks.
    """
    sig: list[Any] = [rank, world]
    locals_: list[Any] = []
    with torch.no_grad():  # once: to_local() is then an attribute read, not an autograd op
        for key, t in flat.tensors.items():
            d: Any = t
            if is_dtensor(d):
                local, mesh, placements = d.to_local(), d.device_mesh, tuple(d.placements)
            else:
                local, mesh, placements = t, None, None
            locals_.append(local)
            # The mesh by identity: id() first (a cached signature keeps its mesh alive, so an
            # equal id is the same object), then the object (compared by `is` in a tuple).
            sig.append((
                key, t.dtype, t.shape, id(mesh), mesh, placements, local.shape, local.device,
                local.layout, type(local), local.is_nested,
            ))
    return tuple(sig), locals_


def _template_for(flat: FlatState, rank: int, world: int) -> tuple[_Template, list[Any]]:
    # The sources are checked only when a layout is planned: the checks were a third of the
    # signature's cost, paid at every save of a state of hundreds of tensors.
    try:
        signature, locals_ = _signature(flat, rank, world)
    except Exception:
        _check_sources(flat)  # a tensor without a shape (a nested one): refused by name
        raise
    template = _CACHE.find(signature)
    if template is None:
        for key, local in zip(flat.tensors, locals_, strict=True):
            _check_source(key, local)
        template = _plan_template(flat, rank, signature)
        _CACHE.add(template)
    return template, locals_


def _check_sources(flat: FlatState) -> None:
    with torch.no_grad():
        for key, t in flat.tensors.items():
            d: Any = t
            _check_source(key, d.to_local() if is_dtensor(d) else t)


def _check_source(key: str, t: torch.Tensor) -> None:
    """Refuse, naming the key, a tensor whose elements cannot be saved as a dense box.

    Sparse and nested tensors and meta tensors (no data) failed deep in torch with a message
    that named neither (fidelity review F3).
    """
    if type(t) is not torch.Tensor and is_traceable_wrapper_subclass(t):
        # torchao's quantized and float8 tensors, a TwoTensor: .numpy() failed deep in torch,
        # reported as PCK-DISTRIBUTED in one process and naming no key (odd-states O6)
        raise UnsupportedValueError(
            f"tensor {key!r}: a {type(t).__name__} (a tensor subclass that wraps other "
            "tensors): its data is not one dense box. Save plain tensors: dequantize it, or "
            "store its inner tensors (t.__tensor_flatten__()) under keys of their own"
        )
    if t.is_nested:
        raise UnsupportedValueError(
            f"tensor {key!r}: a nested tensor is not supported; save its components "
            "(t.unbind()) as tensors of their own"
        )
    if t.is_sparse or t.layout != torch.strided:
        raise UnsupportedValueError(
            f"tensor {key!r}: layout {t.layout} is not supported; densify it (t.to_dense())"
        )
    if t.device.type == "meta":
        raise UnsupportedValueError(
            f"tensor {key!r}: a meta tensor holds no data to save; materialise it first "
            "(model.to_empty(device=...) and initialise, or load a checkpoint into it)"
        )


def _plan_template(flat: FlatState, rank: int, signature: tuple[Any, ...]) -> _Template:
    pieces: list[_PieceTemplate] = []
    nbytes = 0
    for index, (key, t) in enumerate(flat.tensors.items()):
        layout, local = local_layout(key, t, rank)
        dtype = format_dtype(t.dtype, key=key)
        # Every rank plans its plain tensors: plan_save keeps those this rank may store.
        plain = not is_dtensor(t)
        if layout.writer or plain:  # one box, or several for strided layouts
            for p in layout.pieces:
                whole = len(layout.pieces) == 1 and p.lengths == layout.local_shape
                slices = None if whole else p.local_slices()
                size = math.prod(p.lengths) * local.element_size()
                pieces.append(_PieceTemplate(
                    key, dtype, layout.global_shape, p.offsets, index, slices,
                    _slot(key, p.offsets), plain, size,
                ))
                nbytes += size if layout.writer else 0
        if (rank == 0 or plain) and math.prod(layout.global_shape) == 0:
            # A zero-size tensor has no ranges at all: rank 0 declares it (a plain one, the
            # rank that would store it).
            zeros = (0,) * len(layout.global_shape)
            pieces.append(_PieceTemplate(
                key, dtype, layout.global_shape, zeros, None, None, _slot(key, zeros), plain
            ))
    mesh = group_mesh(flat.tensors.values())
    plain = rank != 0 and any(p.plain for p in pieces)
    return _Template(signature, tuple(pieces), mesh, nbytes, plain)


def _slot(key: str, offsets: tuple[int, ...]) -> str:
    return f"{key}@{','.join(str(o) for o in offsets)}"


def _bind(locals_: list[Any], t: _PieceTemplate) -> torch.Tensor | None:
    """The piece's source: its local tensor, or the box of it (``None``: declared only)."""
    if t.index is None:
        return None
    local: torch.Tensor = locals_[t.index]
    return local if t.slices is None else local[t.slices]


def _plan_entries(flat: FlatState, rank: int, rng_snapshot: dict[str, Any]) -> list[PlannedEntry]:
    entries: list[PlannedEntry] = []
    for reserved in (VALUES_ENTRY, DCP_ITEMS_ENTRY):
        if reserved in flat.entries:
            raise UnsupportedValueError(f"the state key {reserved!r} is reserved; rename it")
    if flat.values and rank == 0:
        values = {k: encode_json(v, key=k) for k, v in flat.values.items()}
        entries.append(PlannedEntry(VALUES_ENTRY, values, "pck:json/1", "global", None))
    if (flat.values or flat.dcp_paths) and rank == 0:
        items = dcp_items_value(flat.dcp_paths.values())
        entries.append(PlannedEntry(DCP_ITEMS_ENTRY, items, "pck:json/1", "global", None))
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
    return _int_keys_as_text(e.capture())


def _int_keys_as_text(value: Any, depth: int = 0) -> Any:
    """``value`` with its int dict keys as decimal strings (the key rule; a copy where any is).

    The writer refuses every dict key that is no string (it would not read back as given);
    a StateEntry's int keys were stored as strings before that, as state dict keys are, and
    stay so (attack review 2 F5). Other keys are left for the writer to refuse, named.
    """
    if depth > 64:  # deeper than readers take: the writer refuses it as such
        return value
    if isinstance(value, dict):
        out = {
            (str(k) if type(k) is int else k): _int_keys_as_text(v, depth + 1)
            for k, v in value.items()
        }
        if len(out) < len(value):  # {1: ..., "1": ...}: one would be lost
            clash = next(k for k in value if type(k) is int and str(k) in value)
            raise UnsupportedValueError(
                f"a StateEntry's value holds the dict keys {clash!r} and {str(clash)!r}, which "
                "are stored as one (int keys are stored as decimal strings); rename one"
            )
        same = all(a is b and out[a] is v for (a, v), b in zip(value.items(), out, strict=True))
        return value if same else out
    if isinstance(value, list | tuple) and any(isinstance(v, dict | list | tuple) for v in value):
        items = [_int_keys_as_text(v, depth + 1) for v in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    return value
