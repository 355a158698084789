"""Collective save, async save and resharding load of torch state.

Protocol of a save (every rank of the group calls it with its own state):

1. Each rank takes its state apart (:mod:`portable_ckpt.torch.flatten`) and decides, from the
   placements alone, which pieces it owns: a DTensor's local shard when its coordinate is 0 on
   every replicate mesh dimension; a plain tensor on rank 0 only.
2. Status exchange (all-gather of a few bytes): rank 0 contributes a fresh attempt id; any rank
   that failed preparing (e.g. a ``Partial`` placement) makes every rank raise.
3. Each rank writes only its pieces and its entries with its own ``ShardWriter(writer=rank)``.
4. Rank 0 gathers the writer indexes (range records, sizes, checksums — never tensor bytes),
   commits when every rank succeeded, and broadcasts the outcome. A failure anywhere publishes
   nothing; every rank raises (PCK-DISTRIBUTED for a peer's failure). A dead or stuck peer makes
   the metadata collectives fail after ``timeout`` seconds instead of hanging.

A load opens the version rank 0 resolved, intersects the stored ranges with each local target
box and reads only those bytes straight into the destination tensor's memory, proving coverage and
verifying checksums of everything it reads; a final status exchange makes all ranks raise if one
failed.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from portable_ckpt.errors import (
    CheckpointError,
    ContractError,
    DistributedError,
    EntryMissingError,
    TensorMissingError,
    UnsupportedValueError,
    UsageError,
    error_for_code,
)
from portable_ckpt.format.manifest import Continuation, Mesh, WriterIndex
from portable_ckpt.io.commit import commit
from portable_ckpt.io.reader import NO_VALUE, Checkpoint
from portable_ckpt.io.tensor_table import TABLE_THRESHOLD
from portable_ckpt.io.versions import latest, load_manifest
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.storage import Storage, open_storage
from portable_ckpt.torch._collectives import Comm, make_comm
from portable_ckpt.torch._tensors import format_dtype, numpy_view
from portable_ckpt.torch.flatten import (
    VALUES_ENTRY,
    FlatState,
    StateEntry,
    decode_json,
    encode_json,
    fill_state,
    flatten_state,
)
from portable_ckpt.torch.layout import LocalBox, dtensor_local_box, mesh_description
from portable_ckpt.torch.state import RNGState, capture_rng

__all__ = [
    "AsyncSaveHandle",
    "CheckpointInfo",
    "LoadInfo",
    "async_save",
    "load",
    "save",
    "staging_bytes",
    "wait_for_pending_save",
]

CONTRACTS = ("exact", "statistical")


@dataclass(frozen=True)
class CheckpointInfo:
    """The outcome of a committed save, on every rank.

    Attributes:
        checkpoint_id: The attempt id of the published version.
        step: Its step.
        path: The version directory (``<root>/<attempt id>``).
        world_size: Ranks that wrote.
        contract: The continuation contract recorded.
        rank: This rank.
        bytes_written: Bytes this rank wrote (data, entries, index).
        total_bytes: Bytes of the whole version (all files).
        seconds: Wall time of the save on this rank (for async: staging to commit).
        blocking_seconds: Time the caller was blocked (for async: until ``staged``).
        staging_bytes: Size of this rank's reusable staging buffers (0 when none were needed).

    """

    checkpoint_id: str
    step: int
    path: str
    world_size: int
    contract: str
    rank: int
    bytes_written: int
    total_bytes: int
    seconds: float
    blocking_seconds: float
    staging_bytes: int


@dataclass
class LoadInfo:
    """The outcome of a load, on every rank.

    Attributes:
        step: The manifest's step.
        checkpoint_id: The attempt id loaded.
        contract: ``"exact"`` when the saved contract was exact and the world size and mesh are
            unchanged; ``"statistical"`` otherwise (only with ``allow_statistical=True``).
        saved_world_size: World size at save time.
        world_size: World size now.
        path: The version directory.
        rank: This rank.
        seconds: Wall time of the load on this rank.
        tensors_loaded: Tensor keys filled on this rank.
        target_bytes: Bytes of the local targets filled on this rank.
        bytes_read: Bytes this rank fetched from storage.
        blocks_verified: Checksum blocks verified by this rank.
        peak_temp_bytes: Largest temporary buffer this rank needed.
        elements_covered: Elements proven covered exactly once on this rank.
        entries_loaded: Non-tensor entries applied.
        missing_keys: Target keys absent from the checkpoint (only with ``strict=False``).
        unexpected_keys: Stored tensor keys the target did not ask for.
        per_rank: Every rank's counters (from the final status exchange).
        range_map: With ``record_ranges=True``: for each key, the stored boxes (file, writer
            box) and the target box they fill on this rank.

    """

    step: int
    checkpoint_id: str
    contract: str
    saved_world_size: int
    world_size: int
    path: str
    rank: int
    seconds: float = 0.0
    tensors_loaded: int = 0
    target_bytes: int = 0
    bytes_read: int = 0
    blocks_verified: int = 0
    peak_temp_bytes: int = 0
    elements_covered: int = 0
    entries_loaded: int = 0
    missing_keys: list[str] = field(default_factory=list)
    unexpected_keys: list[str] = field(default_factory=list)
    per_rank: list[dict[str, Any]] = field(default_factory=list)
    range_map: list[dict[str, Any]] | None = None

    def counters(self) -> dict[str, Any]:
        """Return this rank's counters as a JSON object."""
        return {
            "rank": self.rank,
            "seconds": self.seconds,
            "tensors_loaded": self.tensors_loaded,
            "target_bytes": self.target_bytes,
            "bytes_read": self.bytes_read,
            "blocks_verified": self.blocks_verified,
            "peak_temp_bytes": self.peak_temp_bytes,
            "elements_covered": self.elements_covered,
            "entries_loaded": self.entries_loaded,
        }


# -- staging ---------------------------------------------------------------------------------------


class _StagingPool:
    """Host buffers reused across saves, keyed by tensor key (reallocated when shape/dtype change)."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def get(self, key: str, like: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(key)
        if buf is None or buf.shape != like.shape or buf.dtype != like.dtype:
            pin = like.device.type == "cuda"
            buf = torch.empty(like.shape, dtype=like.dtype, device="cpu", pin_memory=pin)
            self._buffers[key] = buf
        return buf

    def retain_only(self, keys: set[str]) -> None:
        for k in [k for k in self._buffers if k not in keys]:
            del self._buffers[k]

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())


_POOL = _StagingPool()
_STATE_LOCK = threading.Lock()
_INFLIGHT: AsyncSaveHandle | None = None
_EXECUTOR: cf.ThreadPoolExecutor | None = None


def staging_bytes() -> int:
    """Bytes held by this process's reusable staging buffers."""
    return _POOL.nbytes


# -- planning --------------------------------------------------------------------------------------


@dataclass
class _Piece:
    key: str
    dtype: str
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    source: torch.Tensor | None  # the live local tensor (None: declare only)
    array: np.ndarray[Any, Any] | None = None


@dataclass
class _SavePlan:
    pieces: list[_Piece]
    entries: list[tuple[str, Any, str, str, str | None]]  # name, value, schema, scope, policy
    mesh: Mesh | None
    tensor_bytes: int


def _group_mesh(flat: FlatState) -> Mesh | None:
    best: Any = None
    for t in flat.tensors.values():
        mesh = getattr(t, "device_mesh", None)
        if mesh is not None and (
            best is None or mesh.ndim > best.ndim or mesh.size() > best.size()
        ):
            best = mesh
    if best is None:
        return None
    shape, names = mesh_description(best)
    return Mesh(shape=tuple(shape), dim_names=tuple(names))


def _is_dtensor(t: torch.Tensor) -> bool:
    return hasattr(t, "device_mesh") and hasattr(t, "placements") and hasattr(t, "to_local")


def _local_box(key: str, t: torch.Tensor, rank: int) -> tuple[LocalBox, torch.Tensor]:
    if _is_dtensor(t):
        return dtensor_local_box(t, key=key), t.to_local()  # type: ignore[attr-defined]
    shape = tuple(int(s) for s in t.shape)
    return LocalBox((0,) * len(shape), shape, shape, rank == 0), t


def _plan_save(flat: FlatState, rank: int, rng_snapshot: dict[str, Any]) -> _SavePlan:
    pieces: list[_Piece] = []
    nbytes = 0
    for key, t in flat.tensors.items():
        box, local = _local_box(key, t, rank)
        dtype = format_dtype(t.dtype, key=key)
        if local.is_sparse or local.layout != torch.strided:
            raise UnsupportedValueError(
                f"tensor {key!r}: layout {local.layout} is not supported; densify it"
            )
        if box.writer and not box.empty:
            pieces.append(_Piece(key, dtype, box.global_shape, box.offsets, local))
            nbytes += local.numel() * local.element_size()
        elif rank == 0 and math.prod(box.global_shape) == 0:
            # A zero-size tensor has no ranges at all: rank 0 declares it.
            pieces.append(_Piece(key, dtype, box.global_shape, box.offsets, None))
    entries: list[tuple[str, Any, str, str, str | None]] = []
    if VALUES_ENTRY in flat.entries:
        raise UnsupportedValueError(f"the state key {VALUES_ENTRY!r} is reserved; rename it")
    if flat.values and rank == 0:
        values = {k: encode_json(v, key=k) for k, v in flat.values.items()}
        entries.append((VALUES_ENTRY, values, "pck:json/1", "global", None))
    for key, e in flat.entries.items():
        if e.scope not in ("global", "per_rank"):
            raise UnsupportedValueError(f"entry {key!r}: scope {e.scope!r} is not global/per_rank")
        if e.scope == "global" and rank != 0:
            continue
        if isinstance(e, RNGState):
            value = dict(rng_snapshot)
            if e.cuda is False:
                value["torch_cuda"] = None
        else:
            value = e.capture()
        entries.append(
            (key, value, e.schema, e.scope, e.world_size_policy if e.scope == "per_rank" else None)
        )
    return _SavePlan(pieces, entries, _group_mesh(flat), nbytes)


def _stage(plan: _SavePlan, copy: bool) -> float:
    """Give every owned piece a numpy array: a view of the live tensor, or a staged copy."""
    t0 = time.perf_counter()
    keys: set[str] = set()
    for p in plan.pieces:
        if p.source is None:
            continue
        src = p.source.detach()
        if copy or src.device.type != "cpu":
            buf = _POOL.get(p.key, src)
            buf.copy_(src, non_blocking=src.device.type == "cuda")
            keys.add(p.key)
            p.array = numpy_view(buf, key=p.key)
        else:
            p.array = numpy_view(src, key=p.key)
        p.source = None  # drop the reference to live state
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()
    if copy:
        _POOL.retain_only(keys)
    return time.perf_counter() - t0


# -- the collective save ---------------------------------------------------------------------------


def _err_doc(e: BaseException) -> dict[str, str]:
    code = e.code if isinstance(e, CheckpointError) else "PCK-DISTRIBUTED"
    return {"code": code, "message": f"{type(e).__name__}: {e}"}


def _raise_outcome(comm: Comm, what: str, statuses: list[Any], own: BaseException | None) -> None:
    failed = [(r, s) for r, s in enumerate(statuses) if not s.get("ok")]
    if not failed:
        return
    if own is not None:
        if isinstance(own, CheckpointError):
            raise own
        raise DistributedError(
            f"rank {comm.rank}: {what} failed: {type(own).__name__}: {own}"
        ) from own
    detail = "; ".join(f"rank {r}: {s.get('error', {}).get('message', '?')}" for r, s in failed[:4])
    raise DistributedError(
        f"{what} failed on rank(s) {[r for r, _ in failed]} ({detail}); nothing was published "
        f"and the previous version stays the latest"
    )


def _storage_of(root: str | os.PathLike[str] | Storage, create: bool) -> Storage:
    return open_storage(root, create=create)


def _run_save(
    plan: _SavePlan | None,
    prep_error: BaseException | None,
    comm: Comm,
    storage: Storage,
    *,
    step: int,
    continuation: str,
    codec: str,
    block_size: int | None,
    max_file_bytes: int,
    t_start: float,
    blocking: float,
    tensor_table: bool | None = None,
) -> CheckpointInfo:
    rank, world = comm.rank, comm.world_size
    attempt = new_attempt_id(step) if rank == 0 and prep_error is None else None
    st = comm.allgather_json(
        {
            "ok": prep_error is None,
            "error": _err_doc(prep_error) if prep_error else None,
            "attempt_id": attempt,
        },
        "save/prepare",
    )
    _raise_outcome(comm, f"save of step {step} (prepare)", st, prep_error)
    attempt_id = st[0]["attempt_id"]
    if plan is None or not isinstance(attempt_id, str):  # pragma: no cover - guarded above
        raise DistributedError("save: no attempt id from rank 0")
    writer: ShardWriter | None = None
    own: BaseException | None = None
    doc: dict[str, Any]
    try:
        if tensor_table is None:
            # Writers of a large job describe their ranges in a tensor table (spec §8.5): the
            # committer then merges arrays instead of parsing thousands of JSON indexes.
            tensor_table = len(plan.pieces) * world > TABLE_THRESHOLD
        kwargs: dict[str, Any] = {
            "codec": codec,
            "max_file_bytes": max_file_bytes,
            "tensor_table": tensor_table,
        }
        if block_size is not None:
            kwargs["block_size"] = block_size
        writer = ShardWriter(storage, attempt_id, rank, **kwargs)
        for p in plan.pieces:
            if p.array is None:
                writer.declare_tensor(p.key, p.dtype, p.global_shape)
            else:
                writer.add_tensor(p.key, p.array, offsets=p.offsets, global_shape=p.global_shape)
        for name, value, schema, scope, policy in plan.entries:
            writer.add_entry(
                name,
                value,
                schema,
                scope=scope,
                rank=rank if scope == "per_rank" else None,
                world_size_policy=policy,
            )
        index = writer.finish()
        doc = {"ok": True, "index": index.to_transport()}
    except BaseException as e:
        own = e
        doc = {"ok": False, "error": _err_doc(e)}
    for p in plan.pieces:
        p.array = None  # release staged views/live references
    docs = comm.gather_json(doc, "save/indexes")
    outcome: dict[str, Any] = {"ok": False}
    if rank == 0 and docs is not None:
        failed = [(r, d) for r, d in enumerate(docs) if not d.get("ok")]
        if failed:
            outcome = {
                "ok": False,
                "failed": [r for r, _ in failed],
                "error": failed[0][1].get("error"),
                "stage": "write",
            }
        else:
            try:
                manifest = commit(
                    storage,
                    attempt_id,
                    step=step,
                    indexes=[WriterIndex.from_transport(d["index"]) for d in docs],
                    expected_writers=list(range(world)),
                    continuation=Continuation(
                        contract=continuation, world_size=world, mesh=plan.mesh
                    ),
                )
                outcome = {"ok": True, "total_bytes": sum(f.size for f in manifest.files.values())}
            except BaseException as e:
                own = own or e
                outcome = {"ok": False, "failed": [0], "error": _err_doc(e), "stage": "commit"}
    outcome = comm.broadcast_json(outcome, "save/commit")
    if not outcome.get("ok"):
        if writer is not None:
            writer.abort()
        if own is not None:
            if isinstance(own, CheckpointError):
                raise own
            raise DistributedError(
                f"rank {rank}: save of step {step} failed: {type(own).__name__}: {own}"
            ) from own
        err = outcome.get("error") or {}
        cls = (
            error_for_code(str(err.get("code")))
            if outcome.get("stage") == "commit"
            else DistributedError
        )
        raise cls(
            f"save of step {step} failed at {outcome.get('stage')} on rank(s) {outcome.get('failed')}: "
            f"{err.get('message')}; nothing was published and the previous version stays the latest"
        )
    written = writer.stats.bytes_written if writer is not None else 0
    return CheckpointInfo(
        checkpoint_id=attempt_id,
        step=step,
        path=f"{storage.url.rstrip('/')}/{attempt_id}",
        world_size=world,
        contract=continuation,
        rank=rank,
        bytes_written=int(written),
        total_bytes=int(outcome.get("total_bytes", 0)),
        seconds=time.perf_counter() - t_start,
        blocking_seconds=blocking,
        staging_bytes=_POOL.nbytes,
    )


def _check_save_args(step: int, continuation: str) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise UsageError(f"step must be a non-negative int, got {step!r}")
    if continuation not in CONTRACTS:
        raise UsageError(f"continuation must be one of {CONTRACTS}, got {continuation!r}")


def _prepare(
    state: Mapping[str, Any], rank: int, copy: bool
) -> tuple[_SavePlan | None, BaseException | None, float]:
    t0 = time.perf_counter()
    try:
        rng = capture_rng()  # before any state_dict() call: saving has no RNG side effect
        flat = flatten_state(state)
        plan = _plan_save(flat, rank, rng)
        _stage(plan, copy)
        return plan, None, time.perf_counter() - t0
    except BaseException as e:
        return None, e, time.perf_counter() - t0


def wait_for_pending_save(timeout: float | None = None) -> CheckpointInfo | None:
    """Wait for this process's in-flight async save (if any); return its result or re-raise."""
    h = _INFLIGHT
    if h is None:
        return None
    return h.committed.result(timeout)


def _wait_idle(if_busy: str) -> None:
    h = _INFLIGHT
    if h is None or h.committed.done():
        return
    if if_busy == "raise":
        raise UsageError(
            f"an async save of step {h.step} is still in flight on this rank; wait for "
            f"handle.committed (or call wait_for_pending_save()) before saving again, or pass "
            f"if_busy='wait'"
        )
    try:
        h.committed.result()
    except BaseException:
        pass


def save(
    state_dict: Mapping[str, Any],
    root: str | os.PathLike[str] | Storage,
    *,
    step: int,
    process_group: Any = None,
    continuation: str = "exact",
    codec: str = "none",
    timeout: float | None = None,
    block_size: int | None = None,
    max_file_bytes: int = 4 << 30,
    if_busy: str = "wait",
    tensor_table: bool | None = None,
) -> CheckpointInfo:
    """Save ``state_dict`` as one new version under ``root`` (a collective over the group).

    Every rank of the group calls this with its own state. Plain tensors must be identical on
    every rank (rank 0 writes them); DTensors are written shard by shard by the owning ranks.

    Args:
        state_dict: Nested dict of tensors, DTensors, JSON scalars, lists, objects with
            ``state_dict()``/``load_state_dict()`` and :mod:`portable_ckpt.torch.state` helpers.
        root: Checkpoint root (local path, ``s3://...`` or a :class:`Storage`).
        step: The completed training step (stored once, in the manifest).
        process_group: The group (default: the default group when initialised, else one process).
        continuation: ``"exact"`` (bit-exact resume on the same world size and mesh) or
            ``"statistical"``.
        codec: ``"none"`` or ``"zstd"`` for tensor chunks.
        timeout: Seconds a metadata collective may wait for peers (default: the process-group
            default).
        block_size: Checksum block size (default: the writer's).
        max_file_bytes: Start a new shard file beyond this size.
        if_busy: ``"wait"`` for an in-flight async save of this process, or ``"raise"``.
        tensor_table: Describe the ranges in tensor tables (format 1.1, spec §8.5). Default:
            when the job's writers together hold more than 65,536 range records.

    Returns:
        :class:`CheckpointInfo` on every rank once the version is committed.

    Raises:
        CheckpointError: on every rank when any rank fails; nothing is published.

    """
    _check_save_args(step, continuation)
    _wait_idle(if_busy)
    t0 = time.perf_counter()
    comm = make_comm(process_group, timeout)
    storage = _storage_of(root, True)
    plan, err, _ = _prepare(state_dict, comm.rank, copy=False)
    return _run_save(
        plan,
        err,
        comm,
        storage,
        step=step,
        continuation=continuation,
        codec=codec,
        block_size=block_size,
        max_file_bytes=max_file_bytes,
        t_start=t0,
        blocking=0.0,
        tensor_table=tensor_table,
    )


class AsyncSaveHandle:
    """An async save in progress.

    Attributes:
        step: The step being saved.
        staged: Future resolving (to a dict with ``seconds`` and ``staging_bytes``) once the state
            was copied; from then on the caller may mutate every tensor and object it passed.
        committed: Future resolving to the :class:`CheckpointInfo` after the commit record is
            published, or raising the save's :class:`CheckpointError`.
        staging_bytes: Size of this process's reusable staging buffers.

    """

    def __init__(self, step: int) -> None:
        self.step = step
        self.staged: cf.Future[dict[str, Any]] = cf.Future()
        self.committed: cf.Future[CheckpointInfo] = cf.Future()
        self.staging_bytes = 0
        self.blocking_seconds = 0.0

    def result(self, timeout: float | None = None) -> CheckpointInfo:
        """Wait for the commit and return its :class:`CheckpointInfo` (or raise)."""
        return self.committed.result(timeout)

    def done(self) -> bool:
        """Whether the save finished (committed or failed)."""
        return self.committed.done()


def async_save(
    state_dict: Mapping[str, Any],
    root: str | os.PathLike[str] | Storage,
    *,
    step: int,
    process_group: Any = None,
    continuation: str = "exact",
    codec: str = "none",
    timeout: float | None = None,
    block_size: int | None = None,
    max_file_bytes: int = 4 << 30,
    if_busy: str = "wait",
    tensor_table: bool | None = None,
) -> AsyncSaveHandle:
    """Like :func:`save`, but returns once the state is staged; I/O and commit run in the background.

    The state (tensors into reused host staging buffers, non-tensor values as JSON) is copied
    before this returns, so ``handle.staged`` is already resolved and training may continue and
    mutate everything. ``handle.committed`` resolves after the version is published. A second
    save while one is in flight waits for it (``if_busy="wait"``) or raises (``"raise"``).
    Metadata collectives use a dedicated gloo group, so they never interleave with training
    collectives.
    """
    global _INFLIGHT, _EXECUTOR
    _check_save_args(step, continuation)
    t0 = time.perf_counter()
    with _STATE_LOCK:
        _wait_idle(if_busy)
        handle = AsyncSaveHandle(step)
        comm = make_comm(process_group, timeout)  # collective on first use: main thread
        storage = _storage_of(root, True)
        plan, err, staged_s = _prepare(state_dict, comm.rank, copy=True)
        handle.staging_bytes = _POOL.nbytes
        handle.blocking_seconds = time.perf_counter() - t0
        handle.staged.set_result(
            {
                "seconds": staged_s,
                "staging_bytes": handle.staging_bytes,
                "error": None if err is None else str(err),
            }
        )
        if _EXECUTOR is None:
            _EXECUTOR = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="pck-async-save")
        _INFLIGHT = handle

        def work() -> None:
            try:
                info = _run_save(
                    plan,
                    err,
                    comm,
                    storage,
                    step=step,
                    continuation=continuation,
                    codec=codec,
                    block_size=block_size,
                    max_file_bytes=max_file_bytes,
                    t_start=t0,
                    blocking=handle.blocking_seconds,
                    tensor_table=tensor_table,
                )
                handle.committed.set_result(info)
            except BaseException as e:
                handle.committed.set_exception(e)

        _EXECUTOR.submit(work)
    return handle


# -- load ------------------------------------------------------------------------------------------


def _resolve(storage: Storage, step: int | None, checkpoint_id: str | None) -> tuple[str, Any]:
    if checkpoint_id is not None:
        return checkpoint_id, load_manifest(storage, checkpoint_id)
    return latest(storage, step)


def _contract(ck: Checkpoint, world: int, mesh: Mesh | None, allow_statistical: bool) -> str:
    saved = ck.continuation
    same = saved.world_size == world
    if same and saved.mesh is not None and mesh is not None:
        same = list(saved.mesh.shape) == list(mesh.shape) and list(saved.mesh.dim_names) == list(
            mesh.dim_names
        )
    if saved.contract != "exact":
        return str(saved.contract)
    if same:
        return "exact"
    if allow_statistical:
        return "statistical"
    smesh = (
        f"mesh {list(saved.mesh.shape)} {list(saved.mesh.dim_names)}" if saved.mesh else "no mesh"
    )
    nmesh = f"mesh {list(mesh.shape)} {list(mesh.dim_names)}" if mesh else "no mesh"
    raise ContractError(
        f"checkpoint {ck.path} was saved with continuation contract 'exact' on world size "
        f"{saved.world_size} ({smesh}); this group has world size {world} ({nmesh}). Bit-exact "
        f"continuation is impossible; pass allow_statistical=True to accept statistical "
        f"continuation (values restored exactly, RNG/data position per the entries' policies)"
    )


def _to_torch(arr: np.ndarray[Any, Any]) -> torch.Tensor:
    name = arr.dtype.name
    if name == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    if name in ("float8_e4m3fn", "float8_e5m2"):
        return torch.from_numpy(arr.view(np.uint8)).view(getattr(torch, name))
    return torch.from_numpy(arr)


def _load_local(
    ck: Checkpoint,
    flat: FlatState,
    template: Mapping[str, Any],
    info: LoadInfo,
    *,
    strict: bool,
    record_ranges: bool,
) -> None:
    rank, world = info.rank, info.world_size
    extra_peak = 0
    ranges: list[dict[str, Any]] = []
    for key, t in flat.tensors.items():
        stored = ck.tensors.get(key)
        if stored is None:
            if strict:
                raise TensorMissingError(
                    f"tensor {key!r} is in the target state but not in checkpoint {ck.path}; pass "
                    f"strict=False to leave it untouched"
                )
            info.missing_keys.append(key)
            continue
        gshape = tuple(int(s) for s in t.shape)
        if tuple(stored.shape) != gshape:
            raise UsageError(
                f"tensor {key!r}: the checkpoint holds shape {list(stored.shape)}, the target has "
                f"{list(gshape)}; build the target with the saved global shape"
            )
        box, local = _local_box(key, t, rank)
        if box.empty:
            continue
        if record_ranges:
            for item in ck.plan_read(key, box.offsets, box.lengths):
                rec = item.record
                ranges.append(
                    {
                        "key": key,
                        "file": rec.file,
                        "stored": {"offsets": list(rec.offsets), "lengths": list(rec.lengths)},
                        "target": {
                            "offsets": list(item.box.offsets),
                            "lengths": list(item.box.lengths),
                        },
                        "local_target": {
                            "offsets": list(box.offsets),
                            "lengths": list(box.lengths),
                        },
                    }
                )
        direct = local.device.type == "cpu" and format_dtype(local.dtype, key=key) == stored.dtype
        if direct:
            out = numpy_view(local, key=key)
            ck.read(key, box.offsets, box.lengths, out=out)
        else:
            tmp = ck.read(key, box.offsets, box.lengths)
            extra_peak = max(extra_peak, int(tmp.nbytes))
            with torch.no_grad():
                local.copy_(_to_torch(tmp).to(local.dtype))
        n = int(np.prod(box.lengths)) if box.lengths else 1
        info.elements_covered += n
        info.target_bytes += n * local.element_size()
        info.tensors_loaded += 1
    info.unexpected_keys = sorted(k for k in ck.tensors if k not in flat.tensors)
    # Non-tensor leaves.
    loaded_values: dict[str, Any] = {}
    if flat.values:
        if VALUES_ENTRY in ck.entries:
            stored_values = ck.entry(VALUES_ENTRY)
            if not isinstance(stored_values, dict):
                raise EntryMissingError(f"entry {VALUES_ENTRY!r} is not an object")
            info.entries_loaded += 1
        else:
            stored_values = {}
        for k in flat.values:
            if k in stored_values:
                loaded_values[k] = decode_json(stored_values[k])
            elif strict:
                raise EntryMissingError(
                    f"value {k!r} is in the target state but not in entry {VALUES_ENTRY!r} of "
                    f"{ck.path}; pass strict=False to keep the current value"
                )
            else:
                info.missing_keys.append(k)
    last: list[tuple[StateEntry, Any]] = []
    for key, e in flat.entries.items():
        if key not in ck.entries:
            if strict:
                raise EntryMissingError(
                    f"entry {key!r} ({e.schema}) is in the target state but not in {ck.path}; "
                    f"pass strict=False to keep the current state"
                )
            info.missing_keys.append(key)
            continue
        stored_e = ck.entries[key]
        if stored_e.scope == "per_rank":
            value = ck.entry(key, rank=rank, world_size=world)
            if value is NO_VALUE:  # policy "drop": the application keeps its fresh state
                continue
        else:
            value = ck.entry(key)
        if e.restore_last:
            last.append((e, value))
        else:
            e.restore(value)
        info.entries_loaded += 1
    fill_state(template, flat, loaded_values)
    for e, value in last:  # RNG last: loading has no RNG side effect
        e.restore(value)
    info.bytes_read = ck.stats.bytes_read
    info.blocks_verified = ck.stats.blocks_verified
    info.peak_temp_bytes = max(ck.stats.peak_scratch_bytes, extra_peak)
    if record_ranges:
        info.range_map = ranges


def load(
    state_dict: Mapping[str, Any],
    root: str | os.PathLike[str] | Storage,
    *,
    step: int | None = None,
    checkpoint_id: str | None = None,
    process_group: Any = None,
    allow_statistical: bool = False,
    strict: bool = True,
    timeout: float | None = None,
    record_ranges: bool = False,
) -> LoadInfo:
    """Fill ``state_dict`` in place from a committed version (a collective over the group).

    The caller's tensors define the target layout: for each plain tensor every rank reads the
    whole tensor; for each DTensor each rank reads only the box of its local shard, whatever the
    saved world size, mesh or placements were. Objects with ``load_state_dict`` get their filled
    state; RNG is restored last. For FSDP2, pass the dicts from
    ``get_state_dict(model, optim)`` and hand them to ``set_state_dict`` afterwards.

    Args:
        state_dict: The target state (same structure as saved).
        root: Checkpoint root (or a :class:`Storage`).
        step: Load the newest version of this step (default: the newest version).
        checkpoint_id: Load this attempt id.
        process_group: The group (default: the default group when initialised).
        allow_statistical: Accept restoring an ``exact`` checkpoint onto another world size or
            mesh (the contract becomes ``statistical``).
        strict: Raise when the target has keys the checkpoint lacks.
        timeout: Seconds a metadata collective may wait for peers.
        record_ranges: Record the stored-to-target range map in ``LoadInfo.range_map``.

    Raises:
        ContractError: exact checkpoint onto another world size/mesh without
            ``allow_statistical``.
        CheckpointError: on every rank when any rank fails.

    """
    t0 = time.perf_counter()
    comm = make_comm(process_group, timeout)
    storage = _storage_of(root, False)
    own: BaseException | None = None
    flat: FlatState | None = None
    resolved: str | None = None
    try:
        flat = flatten_state(state_dict, for_load=True)
        if comm.rank == 0:
            resolved = _resolve(storage, step, checkpoint_id)[0]
    except BaseException as e:
        own = e
    st = comm.allgather_json(
        {"ok": own is None, "error": _err_doc(own) if own else None, "id": resolved}, "load/resolve"
    )
    _raise_outcome(comm, "load (resolve)", st, own)
    attempt_id = str(st[0]["id"])
    info: LoadInfo | None = None
    try:
        if flat is None:  # pragma: no cover - guarded above
            raise DistributedError("load: state not flattened")
        manifest = load_manifest(storage, attempt_id)
        ck = Checkpoint(storage, attempt_id, manifest)
        contract = _contract(ck, comm.world_size, _group_mesh(flat), allow_statistical)
        info = LoadInfo(
            step=ck.step,
            checkpoint_id=attempt_id,
            contract=contract,
            saved_world_size=ck.continuation.world_size,
            world_size=comm.world_size,
            path=ck.path,
            rank=comm.rank,
        )
        _load_local(ck, flat, state_dict, info, strict=strict, record_ranges=record_ranges)
        info.seconds = time.perf_counter() - t0
    except BaseException as e:
        own = e
    st = comm.allgather_json(
        {
            "ok": own is None,
            "error": _err_doc(own) if own else None,
            "counters": info.counters() if info is not None and own is None else None,
        },
        "load/status",
    )
    _raise_outcome(comm, f"load of {attempt_id}", st, own)
    if info is None:  # pragma: no cover - guarded above
        raise DistributedError("load: no result")
    info.per_rank = [s["counters"] for s in st]
    return info
