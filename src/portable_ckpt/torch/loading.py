"""The collective resharding load: resolve, check the contract, fill the local targets, agree.

Phases (every rank of the group calls :func:`load` with its own target state):

1. ``resolve`` (all-gather): each rank takes its target apart; rank 0 resolves the version to
   load (the newest, the newest of a step, or a given attempt id), so every rank opens the same.
   Its ``manifest.json`` is read once per load, each rank reading a slice; every rank validates
   the whole document as one read from storage, all at the same time (:mod:`._load_resolve`).
2. ``check`` (all-gather): each rank opens that version, checks the continuation contract
   and counts the target tensors it holds; a target of which no rank finds one is refused
   here, before anything changes.
3. ``load`` (all-gather of each rank's counters): each rank intersects the stored ranges with
   each local target box and reads only those bytes straight into the destination tensor's
   memory, proving coverage and verifying the checksums of everything it reads — all tensors
   of the rank in one read planned per file (each byte read once, each checksum block verified
   once). The entry values it restores are read on a worker meanwhile; they are applied after
   the tensors, RNG last.
   A failure on any rank makes every rank raise.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from portable_ckpt._gc import paused_gc
from portable_ckpt.errors import (
    CheckpointError,
    ContractError,
    DistributedError,
    TensorMissingError,
    UsageError,
    VersionDeletedError,
)
from portable_ckpt.format.manifest import Manifest, Mesh
from portable_ckpt.format.naming import ATTEMPT_ID_RE
from portable_ckpt.format.usage import (
    process_group_or_none,
    require_one_of,
    strict_int,
    timeout_seconds,
)
from portable_ckpt.io.reader import Checkpoint, ReadRequest
from portable_ckpt.logs import get_logger, logged
from portable_ckpt.storage import Storage, open_storage
from portable_ckpt.torch._collectives import Comm, make_comm
from portable_ckpt.torch._hyperparameters import (
    OPTIMIZER_HYPERPARAMETERS,
    Hyperparameters,
    OptimizerHyperparameters,
)
from portable_ckpt.torch._inflight import say, wait_idle
from portable_ckpt.torch._load_casts import Casts, read_converted
from portable_ckpt.torch._load_messages import instead, none_found
from portable_ckpt.torch._load_resolve import RESOLVE_FAILED, RecordShare
from portable_ckpt.torch._load_ties import tied_targets
from portable_ckpt.torch._load_values import (
    EntryReads,
    load_entries,
    load_values,
    restore_entry,
    tensors_into_empty,
    with_tensors,
)
from portable_ckpt.torch._tensors import format_dtype, numpy_view
from portable_ckpt.torch.flatten import FlatState, fill_state, flatten_state
from portable_ckpt.torch.info import LoadInfo
from portable_ckpt.torch.layout import Piece, group_mesh, local_layout
from portable_ckpt.torch.saving import Root

__all__ = ["load"]

_log = get_logger("torch")
_LOAD_FAILED = "the ranks that succeeded hold a partly restored state; load again"


def load(
    state_dict: Mapping[str, Any],
    root: Root,
    *,
    step: int | None = None,
    checkpoint_id: str | None = None,
    process_group: Any = None,
    allow_statistical: bool = False,
    strict: bool = True,
    timeout: float | None = None,
    record_ranges: bool = False,
    strict_dtype: bool = False,
    optimizer_hyperparameters: OptimizerHyperparameters = "checkpoint",
) -> LoadInfo:
    """Fill ``state_dict`` in place from a committed version (a collective over the group).

    The caller's tensors define the target layout: for each plain tensor every rank reads the
    whole tensor; for each DTensor each rank reads only the box of its local shard, whatever the
    saved world size, mesh or placements were. Objects with ``load_state_dict`` get their filled
    state; RNG is restored last. For FSDP2, pass the dicts from
    ``get_state_dict(model, optim)`` and hand them to ``set_state_dict`` afterwards. An async
    save of this process still in flight is waited for first (their collectives share a group).

    Args:
        state_dict: The target state (same structure as saved).
        root: Checkpoint root (or a :class:`Storage`), or a version directory
            (``<root>/<attempt id>``: that version).
        step: Load the newest version of this step (default: the newest version).
        checkpoint_id: Load this attempt id.
        process_group: A torch.distributed ProcessGroup (default: the default group when
            initialised).
        allow_statistical: Accept restoring an ``exact`` checkpoint onto another world size or
            mesh (the contract becomes ``statistical``).
        strict: Raise when the target has keys the checkpoint lacks.
        timeout: Seconds a metadata collective may wait for peers.
        record_ranges: Record the stored-to-target range map in ``LoadInfo.range_map``.
        strict_dtype: Refuse (PCK-USAGE) a target whose dtype differs from the stored one
            instead of casting; a cast is otherwise logged once per family of tensors and
            listed in ``LoadInfo.casts``. A cast that would make finite values infinite (or the
            largest value), more than half of a box's non-zero values 0, or change an integer
            (a wrap, a truncation, an int64 rounded by a float), is refused either way.
        optimizer_hyperparameters: Which values an optimizer's param groups get where the
            stored hyper-parameters (every member of a param group but ``params``: ``lr``,
            ``weight_decay``, ``betas``, ``eps``, ``param_names``, ...) differ from the
            optimizer's current ones (its values before the load: a changed config):
            ``"checkpoint"`` (default) the stored ones, as torch's ``load_state_dict`` and DCP
            do, or ``"current"`` the current ones. Either way rank 0 says the differences
            (stderr and the ``portable_ckpt.torch`` logger, event
            ``load.optimizer_hyperparameters``), and ``LoadInfo.changed_hyperparameters``
            lists them. Values compare as numbers, NaN equal to NaN; a tensor member (a
            ``fused`` or ``capturable`` optimizer's ``lr``, ``betas`` of tensors) by value,
            ``"current"`` copying its value back into the target's own tensor. The members an
            LR scheduler in ``state_dict`` sets on the optimizer it drives (``lr`` and
            ``initial_lr``; ``momentum`` and ``betas`` too where it cycles momentum:
            ``cycle_momentum``, as ``OneCycleLR`` and ``CyclicLR`` have by default) are
            restored with its state, whatever the choice, and not reported. The members that
            choose kernels, not the maths (``foreach``, ``fused``, ``capturable``,
            ``differentiable``) keep the optimizer's current values, whatever the choice (torch's
            ``load_state_dict`` would apply the stored ones), and are not reported.

    Raises:
        ContractError: exact checkpoint onto another world size/mesh without
            ``allow_statistical``.
        CheckpointError: on every rank when any rank fails.

    """
    choice = require_one_of(
        optimizer_hyperparameters, OPTIMIZER_HYPERPARAMETERS, "optimizer_hyperparameters"
    )
    return load_into(
        state_dict, root, Hyperparameters(choice), step=step, checkpoint_id=checkpoint_id,
        process_group=process_group, allow_statistical=allow_statistical, strict=strict,
        timeout=timeout, record_ranges=record_ranges, strict_dtype=strict_dtype,
    )


def load_into(
    state_dict: Mapping[str, Any],
    root: Root,
    hyper: Hyperparameters,
    *,
    step: int | None = None,
    checkpoint_id: str | None = None,
    process_group: Any = None,
    allow_statistical: bool = False,
    strict: bool = True,
    timeout: float | None = None,
    record_ranges: bool = False,
    strict_dtype: bool = False,
) -> LoadInfo:
    """:func:`load` (the same arguments) with ``hyper``'s choice.

    A manager's restore passes one ``hyper`` to the loads of its candidates: the values before
    the first one are the current ones for every one.
    """
    t0 = time.perf_counter()
    # step="10" was compared with the stored ints: "no committed version for step 10" where
    # one was (api review 31); a bad timeout failed in the first collective.
    step = None if step is None else strict_int(step, "load: step", minimum=0)
    timeout = timeout_seconds(timeout, "load: timeout")
    process_group_or_none(process_group, "load: process_group")
    # An async save of this process still in flight runs collectives on the same side group:
    # interleaved with the load's, both waited for the timeout (async review F9). Its outcome
    # is its own handle's.
    wait_idle("wait")
    # Full collections of a training process's heap in the middle of a load cost more than the
    # load's own work (see portable_ckpt._gc); the load creates no long-lived cycles.
    with paused_gc():
        comm = make_comm(process_group, timeout)
        what = f"load from {_where(root)}"
        with logged(_log, "load", what, rank=comm.rank, t0=t0) as out:
            kwargs: dict[str, Any] = dict(
                step=step, checkpoint_id=checkpoint_id, allow_statistical=allow_statistical,
                strict=strict, record_ranges=record_ranges, strict_dtype=strict_dtype)
            held: set[str] = set()
            try:
                info = _load(state_dict, root, comm, t0, hyper, held=held, **kwargs)
            except CheckpointError as e:
                if not _may_retry(root, comm, checkpoint_id, step, e):
                    raise
                # Retention deleted the version under this load (a server reloading from a
                # root a trainer writes and prunes): the state is partly filled from it.
                # Load the root's latest once more (serving review F3), every rank of a group
                # together (each decides from the same exchanged failures).
                if comm.rank == 0:
                    say(f"{e}; loading the root's latest version again")
                info = _load(state_dict, root, comm, t0, hyper, **kwargs)
                _say_left_from_deleted(info, held)
            hyper.say(info, _log)
            out.update(
                bytes=info.bytes_read, step=info.step, version=info.path,
                contract=info.contract,
                detail=f"step {info.step} from {info.path}, {info.tensors_loaded} tensors, "
                f"contract {info.contract}",
            )
    return info


def _may_retry(
    root: Root, comm: Comm, checkpoint_id: str | None, step: int | None, e: CheckpointError
) -> bool:
    """Whether a load whose version was deleted under it reads the root's latest again.

    Only when it was given a root, not one version or step. In a group, only when every
    failure the ranks exchanged was the version's deletion: all ranks learnt the same list, so
    all of them retry, or none (a rank that failed otherwise, or an exchange that failed,
    leaves no list to agree on).
    """
    if checkpoint_id is not None or step is not None:
        return False  # (a step's newest version again: it was the one deleted)
    name = os.path.basename(_where(root).rstrip("/"))
    if ATTEMPT_ID_RE.fullmatch(name) is not None:
        return False
    if comm.world_size == 1:
        return isinstance(e, VersionDeletedError)
    failures = e.failures if isinstance(e, (VersionDeletedError, DistributedError)) else ()
    return bool(failures) and all(f.deleted for f in failures)


def shown_keys(keys: Sequence[str], most: int = 4) -> str:
    """The first ``most`` keys, quoted, for a message."""
    return ", ".join(repr(k) for k in keys[:most]) + (", ..." if len(keys) > most else "")


def left_from(info: LoadInfo, held: set[str]) -> list[str]:
    """Set and return ``info.left_from_failed``: the missing keys another version ``held``."""
    info.left_from_failed = [k for k in info.missing_keys if k in held]
    return info.left_from_failed


def _say_left_from_deleted(info: LoadInfo, held: set[str]) -> None:
    """The keys the version loaded instead lacks that the deleted one holds: said, listed.

    With ``strict=False`` they stay as the first, interrupted load left them: the deleted
    version's values where it had filled them, the initial ones elsewhere (serving review F3's
    follow-up). Listed in ``LoadInfo.left_from_failed``, as a manager's fallback does.
    """
    keys = left_from(info, held)
    if info.rank == 0 and keys:
        shown = shown_keys(keys)
        say(
            f"rank 0: loaded step {info.step} after the version being read was deleted; "
            f"{len(keys)} key(s) of the state are not in step {info.step} but were in the deleted "
            f"one ({shown}): they may hold its values, or their initial ones. Set them again or "
            "load into a fresh state (LoadInfo.left_from_failed lists them)"
        )


def _where(root: Root) -> str:
    return root.url if isinstance(root, Storage) else os.fspath(root)


def _load(
    state_dict: Mapping[str, Any],
    root: Root,
    comm: Comm,
    t0: float,
    hyper: Hyperparameters,
    *,
    step: int | None,
    checkpoint_id: str | None,
    allow_statistical: bool,
    strict: bool,
    record_ranges: bool,
    strict_dtype: bool,
    held: set[str] | None = None,
) -> LoadInfo:
    """The three steps of :func:`load`: resolve, check (nothing changed yet), fill and agree.

    ``held`` receives the keys of the version this load fills from, as soon as it is known.
    """
    root, checkpoint_id = _split_version_dir(root, checkpoint_id)

    resolved: list[Manifest] = []  # rank 0 parsed the manifest already: it is not read twice
    share = RecordShare(comm)
    opened: list[Storage] = []

    def storage_once() -> Storage:
        if not opened:
            opened.append(open_storage(root, create=False))
        return opened[0]

    # Every rank asks the state for its tensors first, at the same point: a Stateful's
    # state_dict() may run collectives of its own (get_state_dict with full_state_dict=True),
    # which would deadlock against ranks already waiting in the record share below. A failure
    # is raised inside the collective step, so every rank learns of it.
    try:
        flat_now = flatten_state(state_dict, for_load=True)
        hyper.remember(flat_now)  # the optimizers' hyper-parameters before anything is loaded
        flattened: FlatState | Exception = flat_now
    except Exception as e:  # re-raised in resolve(), where the peers learn of it
        flattened = e

    def flat_state() -> FlatState:
        if isinstance(flattened, Exception):
            raise flattened
        return flattened

    def resolve() -> tuple[tuple[Storage, FlatState], list[Any] | None]:
        if comm.rank != 0:
            return (storage_once(), flat_state()), None
        try:
            storage = storage_once()
            flat = flat_state()
            if comm.world_size > 1:
                share.announce(storage, step, checkpoint_id)
            attempt, manifest = share.pick(storage, step, checkpoint_id)
            resolved.append(manifest)
            return (storage, flat), [attempt, share.together]
        finally:
            if comm.world_size > 1:
                share.close()

    if comm.rank != 0:
        share.receive(storage_once)  # and parse it while rank 0 parses its own copy
    (storage, flat), picks = comm.all_gather_step(
        "load/resolve", resolve, what="load (resolve)", outcome=RESOLVE_FAILED
    )
    attempt_id, together = str(picks[0][0]), bool(picks[0][1])
    share.trust(together)
    record = share.share(attempt_id, resolved[0] if resolved else None)
    if resolved:
        resolved[0].source = None  # sent: the parsed record is what this rank keeps

    def check() -> tuple[tuple[Checkpoint, LoadInfo, list[str], int], dict[str, int]]:
        manifest = resolved[0] if resolved else share.manifest(attempt_id, record)
        if held is not None:
            held.update(manifest.tensors)
            held.update(manifest.entries)
        ck = Checkpoint(storage, attempt_id, manifest)
        info = _new_info(ck, comm, group_mesh(flat.tensors.values()), allow_statistical)
        # The target's own tensors, before the load grows any below an empty dict (a fresh
        # Stateful's EMA): those are the stored ones, and would hide a target that fits not.
        wanted = list(flat.tensors)
        found = sum(1 for k in wanted if k in ck.tensors)
        return (ck, info, wanted, found), {"found": found, "targets": len(wanted)}

    (ck, info, wanted, found), counts = comm.all_gather_step(
        "load/check", check, what=f"load of {attempt_id} (check)", outcome=RESOLVE_FAILED
    )
    # Decided over the group, on every rank alike and before anything changes: a pipeline
    # stage whose tensors are all new is a partial target like any other, while a target of
    # which no rank found a tensor would load nothing (fine-tuning review 21, M2; its values
    # and entries were applied before the refusal until the twenty-second stop).
    if any(c["targets"] for c in counts) and not any(c["found"] for c in counts):
        raise none_found(ck, wanted)

    def fill() -> tuple[LoadInfo, dict[str, Any]]:
        try:
            _load_local(
                ck, flat, state_dict, info, strict=strict, record_ranges=record_ranges,
                casts=Casts(strict_dtype, tell=comm.rank == 0), hyper=hyper,
            )
        except CheckpointError:
            raise  # damage, storage, contract: what it says (a fallback may follow)
        except Exception as exc:
            if found or not wanted:
                raise
            # An optimizer's values applied to parameters none of which was found fail in
            # torch ("a parameter group that doesn't match"): the cause is the target's keys.
            raise none_found(ck, wanted) from exc
        info.seconds = time.perf_counter() - t0
        return info, info.counters()

    info, counters = comm.all_gather_step(
        "load/status", fill, what=f"load of {attempt_id}", outcome=_LOAD_FAILED
    )
    info.per_rank = counters
    return info


def _split_version_dir(root: Root, checkpoint_id: str | None) -> tuple[Root, str | None]:
    """A version directory ``<root>/<attempt id>`` names its root and attempt."""
    if isinstance(root, Storage):
        return root, checkpoint_id
    from portable_ckpt.format.naming import ATTEMPT_ID_RE

    text = os.fspath(root).rstrip("/")
    parent, _, base = text.rpartition("/")
    if not parent or not ATTEMPT_ID_RE.match(base):
        return root, checkpoint_id
    if checkpoint_id is not None and checkpoint_id != base:
        raise UsageError(
            f"load: {text} is version {base}, but checkpoint_id={checkpoint_id!r} was also given"
        )
    return parent, base


def _new_info(ck: Checkpoint, comm: Comm, mesh: Mesh | None, allow_statistical: bool) -> LoadInfo:
    return LoadInfo(
        step=ck.step,
        checkpoint_id=ck.id,
        contract=_contract(ck, comm.world_size, mesh, allow_statistical),
        saved_world_size=ck.continuation.world_size,
        world_size=comm.world_size,
        path=ck.path,
        rank=comm.rank,
    )


def _contract(ck: Checkpoint, world: int, mesh: Mesh | None, allow_statistical: bool,
              accept: str = "allow_statistical=True") -> str:
    """The contract of this load; ``ContractError`` naming ``accept``, how the caller accepts."""
    saved = ck.continuation
    same = saved.world_size == world
    if same and saved.mesh is not None and mesh is not None:
        # Dimension names are labels ("dp" vs the default "dim0"): only the shape counts; the
        # placements of each tensor are checked by the exactly-once coverage of what is read.
        same = list(saved.mesh.shape) == list(mesh.shape)
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
        f"continuation is impossible; pass {accept} to accept statistical "
        f"continuation (values restored exactly, RNG/data position per the entries' policies). "
        f"Loading weights to evaluate or fine-tune, not to continue that run? Nothing is lost: "
        f"pass {accept} (the contract is about that run's random streams and "
        f"data order)"
    )


# -- this rank's part of the load ------------------------------------------------------------------


def _load_local(
    ck: Checkpoint,
    flat: FlatState,
    template: Mapping[str, Any],
    info: LoadInfo,
    *,
    strict: bool,
    record_ranges: bool,
    casts: Casts,
    hyper: Hyperparameters,
) -> None:
    """Fill this rank's targets from ``ck``: tensors, plain values, entries (RNG last)."""
    grown = tensors_into_empty(ck, flat, whole=info.world_size == 1)
    with EntryReads(ck, flat, info) as entries:
        extra_peak = _load_tensors(
            ck, flat, info, strict=strict, record_ranges=record_ranges, casts=casts
        )
        info.unexpected_keys = sorted(k for k in ck.tensors if k not in flat.tensors)
        values = load_values(entries, flat, info, strict=strict)
        hyper.settle(flat, values, info)  # before a grown optimizer state joins the values
        last = load_entries(entries, flat, info, strict=strict)
    optimizers = {f"/{k}".split("/param_groups/", 1)[0] for k in flat.values
                  if "/param_groups/" in f"/{k}"}
    for where, tensors in grown.items():
        # An optimizer's `state` (beside `param_groups`) is keyed by int: a fresh optimizer's
        # plain state_dict() got string keys, restored nothing and failed the next save (diff
        # review D2).
        by_int = f"/{where}".rpartition("/state")[0] in optimizers and where.endswith("state")
        values[where] = with_tensors(values.get(where, {}), tensors, by_int=by_int,
                                      where=where, shapes=entries.shapes)
    fill_state(template, flat, values)
    for key, e, value in last:  # RNG last: loading has no RNG side effect
        restore_entry(e, value, key, ck)
    info.bytes_read = ck.stats.bytes_read
    info.blocks_verified = ck.stats.blocks_verified
    info.peak_temp_bytes = max(ck.stats.peak_scratch_bytes, extra_peak)


def _load_tensors(
    ck: Checkpoint,
    flat: FlatState,
    info: LoadInfo,
    *,
    strict: bool,
    record_ranges: bool,
    casts: Casts,
) -> int:
    """Read every target tensor's local box; return the largest temporary buffer needed.

    Every target is checked first; then the targets that need a conversion (another dtype, a
    device) are read in batches of bounded size, and all in-place targets with one
    :meth:`~portable_ckpt.io.reader.Checkpoint.read_many` (planned per file: each byte read
    once, each checksum block verified once, straight into the tensors' memory).
    """
    ranges: list[dict[str, Any]] = []
    in_place: list[ReadRequest] = []
    converted: list[tuple[ReadRequest, torch.Tensor]] = []
    tied: list[tuple[ReadRequest, torch.Tensor]] = []
    stateless = _NoStateYet(ck, flat)
    targets = []
    for key, t in flat.tensors.items():
        if key not in ck.tensors and stateless.covers(key):
            info.fresh_optimizer_state.append(key)  # the target's fresh value stays
            continue
        if not _stored_like(ck, key, t, info, strict=strict):
            continue
        layout, local = local_layout(key, t, info.rank)
        _check_target(key, local)
        casts.check(ck, key, local)
        targets.append((key, layout, local))
    ties = tied_targets([(key, local) for key, _, local in targets])
    for key, layout, local in targets:
        if key in ties:
            # Memory an earlier key fills (tied weights, a view inside another target): that
            # key writes it; this key's stored values are read aside and must be the same bits.
            for piece in layout.pieces:
                tied.append((ReadRequest(key, piece.offsets, piece.lengths), local[piece.local_slices()]))
                info.elements_covered += math.prod(piece.lengths)
            info.tensors_loaded += 1 if layout.pieces else 0
            continue
        # A negative or conjugate view's memory holds other values than it shows: copy_
        # writes through the view correctly, a numpy view would fill a temporary.
        in_cpu = (
            local.device.type == "cpu"
            and not (local.is_neg() or local.is_conj())
            and format_dtype(local.dtype, key=key) == ck.tensors[key].dtype
        )
        # In place: one numpy view of the local tensor, sliced per box (a torch slice and a
        # view per box cost more than the planning of the read).
        whole = numpy_view(local, key=key) if in_cpu else None
        for piece in layout.pieces:  # one box, or several for strided layouts
            if record_ranges:
                ranges += _range_map(ck, key, piece)
            if whole is not None:
                out = whole if piece.lengths == whole.shape else whole[piece.local_slices()]
                in_place.append(ReadRequest(key, piece.offsets, piece.lengths, out))
            else:
                req = ReadRequest(key, piece.offsets, piece.lengths)
                converted.append((req, local[piece.local_slices()]))
            n = math.prod(piece.lengths)
            info.elements_covered += n
            info.target_bytes += n * local.element_size()
        info.tensors_loaded += 1 if layout.pieces else 0
    # Converted targets first: a cast refused there leaves the in-place targets untouched
    # (attack review 3 F5).
    peak = read_converted(ck, converted, casts)
    info.casts = casts.report()
    ck.read_many(in_place)
    if tied:
        peak = max(peak, read_converted(ck, tied, casts, same_as=ties))
    if record_ranges:
        info.range_map = ranges
    return peak


def _check_target(key: str, local: torch.Tensor) -> None:
    """Refuse a target that cannot hold what is loaded (fidelity review F1, F4).

    A meta tensor has no memory (``copy_`` into it does nothing, and the load looked like a
    success); an expanded one (a stride of 0 over more than one element) keeps only the last
    value written to each shared element.
    """
    if local.device.type == "meta":
        raise UsageError(
            f"tensor {key!r}: the target is on the meta device and holds no memory to load "
            "into; materialise the model first (model.to_empty(device=...)), then load"
        )
    if any(st == 0 and n > 1 for st, n in zip(local.stride(), local.shape, strict=True)):
        raise UsageError(
            f"tensor {key!r}: the target's elements share memory (an expanded view, stride "
            f"{tuple(local.stride())} for shape {tuple(local.shape)}): it cannot hold the "
            "stored values; load into a tensor with memory of its own (.clone())"
        )


class _NoStateYet:
    """Per-parameter optimizer state that a version lacks as a whole, where it has others'.

    An optimizer has state only for the parameters that got a gradient (an unused branch, an
    expert not routed yet, a layer frozen when saved), but a template made from a fresh
    optimizer (``get_state_dict``) has state for every parameter: each restore of such a job
    failed with ``PCK-TENSOR-MISSING`` (integrator review F8). Such a parameter had no state
    when saved, and a fresh state (zero moments, step 0) is what its optimizer would make at
    its first step: the target's value is kept (``LoadInfo.fresh_optimizer_state``). A
    parameter that has some of its state in the version, or an optimizer with none at all,
    is a real gap.
    """

    def __init__(self, ck: Checkpoint, flat: FlatState) -> None:
        self.ck, self.flat = ck, flat
        # Made at the first key missing from the version (none, in most loads): the stored
        # parameters with state, the optimizers among them, and the target's optimizers.
        self._params: set[str] | None = None
        self._heads: set[str] = set()
        self._optimizers: set[str] = set()

    def covers(self, key: str) -> bool:
        """Whether ``key`` is state of a parameter the version has no state of."""
        head, sep, rest = f"/{key}".rpartition("/state/")
        if not sep or rest.count("/") != 1:
            return False
        if self._params is None:
            self._params = {f"/{k}".rsplit("/", 1)[0] for k in self.ck.tensors if "/state/" in f"/{k}"}
            self._heads = {p.rpartition("/state/")[0] for p in self._params}
            # Only an optimizer's state dict (``state`` beside ``param_groups``), not any dict
            # of a ``state/<x>/<y>`` shape (review of the change F5: a gap passed strict=True).
            self._optimizers = {f"/{k}".split("/param_groups/", 1)[0]
                                for k in self.flat.values if "/param_groups/" in f"/{k}"}
        return (head in self._optimizers and head in self._heads
                and f"{head}/state/{rest.split('/')[0]}" not in self._params)


def _stored_like(
    ck: Checkpoint, key: str, t: torch.Tensor, info: LoadInfo, *, strict: bool
) -> bool:
    """Whether ``ck`` holds ``key`` with ``t``'s global shape (absent and not strict: no)."""
    stored = ck.tensors.get(key)
    if stored is None:
        if strict:
            raise TensorMissingError(
                f"tensor {key!r} is in the target state but not in checkpoint {ck.path}"
                + (instead(ck, key, wanted="tensor") or "; pass strict=False to leave it untouched")
            )
        info.missing_keys.append(key)
        return False
    gshape = tuple(int(s) for s in t.shape)
    if tuple(stored.shape) != gshape:
        raise UsageError(
            f"tensor {key!r}: the checkpoint holds shape {list(stored.shape)}, the target has "
            f"{list(gshape)}; build the target with the saved global shape, or, to change it on "
            f"purpose (a resized head, more experts), leave {key!r} out of the target and read "
            "the part you keep with portable_ckpt.open(root).read(key, offsets, lengths) "
            "(docs/torch.md, 'Fine-tuning' and 'Mixture of experts')"
        )
    return True


def _range_map(ck: Checkpoint, key: str, box: Piece) -> list[dict[str, Any]]:
    def span(offsets: Any, lengths: Any) -> dict[str, list[int]]:
        return {"offsets": list(offsets), "lengths": list(lengths)}

    return [
        {
            "key": key,
            "file": item.record.file,
            "stored": span(item.record.offsets, item.record.lengths),
            "target": span(item.box.offsets, item.box.lengths),
            "local_target": span(box.offsets, box.lengths),
        }
        for item in ck.plan_read(key, box.offsets, box.lengths)
    ]
