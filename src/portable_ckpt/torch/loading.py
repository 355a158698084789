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

import contextlib
import functools
import inspect
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import torch

from portable_ckpt._gc import paused_gc
from portable_ckpt._threads import worker
from portable_ckpt.errors import (
    CheckpointError,
    ContractError,
    DistributedError,
    EntryMissingError,
    EntrySchemaError,
    EntryTargetError,
    TensorMissingError,
    UsageError,
    VersionDeletedError,
)
from portable_ckpt.format.keys import (
    JsonTree,
    KeyTrie,
    RecordedShapes,
    escape_component,
    recorded_items,
    similar_keys,
    split_key,
)
from portable_ckpt.format.manifest import Manifest, Mesh
from portable_ckpt.format.naming import ATTEMPT_ID_RE
from portable_ckpt.format.usage import require_one_of
from portable_ckpt.io.reader import NO_VALUE, Checkpoint, ReadRequest
from portable_ckpt.logs import get_logger, logged
from portable_ckpt.storage import Storage, open_storage
from portable_ckpt.torch._collectives import Comm, make_comm
from portable_ckpt.torch._hyperparameters import (
    GROUP_MEMBER,
    OPTIMIZER_HYPERPARAMETERS,
    Hyperparameters,
    OptimizerHyperparameters,
)
from portable_ckpt.torch._inflight import say, wait_idle
from portable_ckpt.torch._load_resolve import RESOLVE_FAILED, RecordShare
from portable_ckpt.torch._tensors import (
    as_bits,
    format_dtype,
    numpy_view,
    torch_dtype,
    torch_from_numpy,
)
from portable_ckpt.torch.flatten import (
    VALUES_ENTRY,
    FlatState,
    StateEntry,
    decode_json,
    encode_json,
    fill_state,
    flatten_state,
)
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
        process_group: The group (default: the default group when initialised).
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
        raise _none_found(ck, wanted)

    def fill() -> tuple[LoadInfo, dict[str, Any]]:
        try:
            _load_local(
                ck, flat, state_dict, info, strict=strict, record_ranges=record_ranges,
                casts=_Casts(strict_dtype, tell=comm.rank == 0), hyper=hyper,
            )
        except CheckpointError:
            raise  # damage, storage, contract: what it says (a fallback may follow)
        except Exception as exc:
            if found or not wanted:
                raise
            # An optimizer's values applied to parameters none of which was found fail in
            # torch ("a parameter group that doesn't match"): the cause is the target's keys.
            raise _none_found(ck, wanted) from exc
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
    casts: _Casts,
    hyper: Hyperparameters,
) -> None:
    """Fill this rank's targets from ``ck``: tensors, plain values, entries (RNG last)."""
    grown = _tensors_into_empty(ck, flat, whole=info.world_size == 1)
    with _EntryReads(ck, flat, info) as entries:
        extra_peak = _load_tensors(
            ck, flat, info, strict=strict, record_ranges=record_ranges, casts=casts
        )
        info.unexpected_keys = sorted(k for k in ck.tensors if k not in flat.tensors)
        values = _load_values(entries, flat, info, strict=strict)
        hyper.settle(flat, values, info)  # before a grown optimizer state joins the values
        last = _load_entries(entries, flat, info, strict=strict)
    optimizers = {f"/{k}".split("/param_groups/", 1)[0] for k in flat.values
                  if "/param_groups/" in f"/{k}"}
    for where, tensors in grown.items():
        # An optimizer's `state` (beside `param_groups`) is keyed by int: a fresh optimizer's
        # plain state_dict() got string keys, restored nothing and failed the next save (diff
        # review D2).
        by_int = f"/{where}".rpartition("/state")[0] in optimizers and where.endswith("state")
        values[where] = _with_tensors(values.get(where, {}), tensors, by_int=by_int,
                                      where=where, shapes=entries.shapes)
    fill_state(template, flat, values)
    for key, e, value in last:  # RNG last: loading has no RNG side effect
        _restore_entry(e, value, key, ck)
    info.bytes_read = ck.stats.bytes_read
    info.blocks_verified = ck.stats.blocks_verified
    info.peak_temp_bytes = max(ck.stats.peak_scratch_bytes, extra_peak)


def _tensors_into_empty(
    ck: Checkpoint, flat: FlatState, *, whole: bool
) -> dict[str, dict[str, torch.Tensor]]:
    """New tensors for the stored tensors below an empty dict of the target.

    An empty dict is a place for everything stored below it: a Stateful's dict that grows in
    training (EMA weights keyed by parameter name, filled at the first update) got its plain
    values back but lost its tensors, listed only in ``LoadInfo.unexpected_keys`` (odd-states
    review O14). Each is made whole on the CPU, with the stored dtype and global shape, and
    read like any plain tensor target. In a group (``whole`` false), only tensors stored whole
    (one range: a plain tensor) are made so: a sharded one (an FSDP2 EMA) made whole on every
    rank could exhaust the host, and a plain tensor where the job keeps a DTensor breaks its
    next update (diff review D6); it stays in ``LoadInfo.unexpected_keys``. Returns, per empty
    dict, its new tensors by their key below it.
    """
    places = {k for k, v in flat.values.items() if isinstance(v, dict) and not v and k}
    if not places:
        return {}
    grown: dict[str, dict[str, torch.Tensor]] = {}
    for name, entry in ck.tensors.items():
        if name in flat.tensors:
            continue
        cut = name.find("/")
        while cut != -1 and name[:cut] not in places:  # the shortest enclosing place
            cut = name.find("/", cut + 1)
        if cut != -1 and (whole or _range_count(entry) == 1):
            t = torch.empty(tuple(entry.shape), dtype=torch_dtype(entry.dtype))
            flat.tensors[name] = t
            grown.setdefault(name[:cut], {})[name[cut + 1:]] = t
    return grown


def _range_count(entry: Any) -> int:
    """How many range records a tensor entry has (a table's without building them)."""
    count = getattr(entry, "range_count", None)  # a property of a table's entries
    return int(count) if count is not None else len(entry.ranges)


def _with_tensors(
    value: Any,
    tensors: Mapping[str, torch.Tensor],
    *,
    by_int: bool,
    where: str = "",
    shapes: RecordedShapes | None = None,
) -> Any:
    """The loaded value of an empty dict with its new tensors put in place by their keys.

    ``by_int``: its own keys that are decimal become ints (an optimizer's ``state``). A list
    the stored values already made (the values of a list of dicts that also hold tensors) takes
    the tensors at its positions: it was replaced by a dict of the tensors alone, and its values
    were lost without a word (zoo review Z3). Then each container that was a list when saved (a
    list of tensors: ``shapes``, or one the values made) is a list again, not a dict keyed
    ``"0"``, ``"1"`` (zoo review Z2).
    """
    if not isinstance(value, dict):
        return value  # a stored value there (not a dict): the tensors stay unexpected
    made: set[str] = set()  # the lists the values made (all a version without a record says)
    for rel, t in tensors.items():
        node, at = value, where
        comps = rel.split("/")
        for i, comp in enumerate(comps):
            name = split_key(comp)[0]
            if i == len(comps) - 1:
                node[name] = t
                break
            child = node.get(name)
            if isinstance(child, list):  # positions join the tensors' keys; a list again below
                child = node[name] = {str(j): v for j, v in enumerate(child)}
                made.add(f"{at}/{comp}")
            elif not isinstance(child, dict):
                child = node[name] = {}
            node, at = child, f"{at}/{comp}"
    value = _as_lists(value, where, made | shapes.lists if shapes is not None else made)
    if by_int:
        ints = {k: int(k) for k in value if isinstance(k, str) and k.isdecimal()
                and str(int(k)) == k}
        value = {ints.get(k, k): v for k, v in value.items()}
    return value


def _as_lists(value: dict[str, Any], where: str, lists: set[str]) -> dict[str, Any]:
    """``value`` (grown at ``where``) with the dicts that were lists made lists again.

    Only a dict at a key of ``lists`` whose keys are the positions ``0..n-1`` changes.
    """
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        node, key = stack.pop()
        kids = list(node.items() if isinstance(node, dict) else enumerate(node))
        for name, child in kids:
            if not isinstance(child, dict | list):
                continue
            at = f"{key}/{escape_component(str(name))}"
            if (isinstance(child, dict) and at in lists
                    and sorted(child) == sorted(str(i) for i in range(len(child)))):
                child = node[name] = [child[str(i)] for i in range(len(child))]
            stack.append((child, at))
    return value


def _load_tensors(
    ck: Checkpoint,
    flat: FlatState,
    info: LoadInfo,
    *,
    strict: bool,
    record_ranges: bool,
    casts: _Casts,
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
    peak = _read_converted(ck, converted, casts)
    info.casts = casts.report()
    ck.read_many(in_place)
    if tied:
        peak = max(peak, _read_converted(ck, tied, casts, same_as=ties))
    if record_ranges:
        info.range_map = ranges
    return peak


def tied_targets(targets: Sequence[tuple[str, torch.Tensor]]) -> dict[str, str]:
    """Targets that are the memory of an earlier one: key → the earlier key it is tied to.

    A tied model (``head.weight = emb.weight``) holds one tensor under two keys; the load wrote
    it twice and the last key won: an untied version loaded into a tied model gave the
    embedding the head's values, silently (odd-states review O2). A tie (the same memory, shape,
    strides and dtype), or a view inside another target, is filled by that target, and its own
    stored values are compared with what it then holds. Targets that overlap only in part are
    refused.
    """
    spans: dict[tuple[str, int], list[tuple[int, int, str, torch.Tensor]]] = {}
    for key, t in targets:
        if t.numel() == 0 or t.device.type == "meta":
            continue
        lo = t.data_ptr()
        extent = sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))
        hi = lo + (extent + 1) * t.element_size()
        spans.setdefault((str(t.device), t.untyped_storage().data_ptr()), []).append(
            (lo, hi, key, t))
    ties: dict[str, str] = {}
    for group in spans.values():
        group.sort(key=lambda g: (g[0], -g[1]))  # a base before the views that start with it
        for cluster in _clusters(group):
            _ties_in(cluster, ties)
    return ties


Span = tuple[int, int, str, torch.Tensor]


def _clusters(group: list[Span]) -> list[list[Span]]:
    """The runs of spans (sorted by start) that overlap one another, of two or more.

    Views of one flat buffer (a contiguous parameter buffer, FSDP1's ``use_orig_params``) are
    all one group; only spans that overlap are looked at together (last review L3: one tie
    among them made the whole buffer one case: a mask of its size, quadratic time).
    """
    out: list[list[Span]] = []
    run: list[Span] = []
    end = 0
    for g in group:
        if run and g[0] >= end:
            if len(run) > 1:
                out.append(run)
            run = []
        run.append(g)
        end = g[1] if len(run) == 1 else max(end, g[1])
    if len(run) > 1:
        out.append(run)
    return out


def _ties_in(cluster: list[Span], ties: dict[str, str]) -> None:
    """Ties and refusals among targets of one storage whose spans overlap.

    The same view under two keys is a tie at once. Otherwise one byte mask for the cluster's
    span, each view marked in turn: a view whose bytes are all marked already is filled by the
    views before it (a tie: compared after), one with some marked is refused.
    """
    first: dict[tuple[Any, ...], str] = {}
    views: list[Span] = []
    for g in cluster:
        t = g[3]
        same = (t.data_ptr(), t.dtype, tuple(t.shape), t.stride())
        if same in first:
            ties[g[2]] = ties.get(first[same], first[same])
        else:
            first[same] = g[2]
            views.append(g)
    if len(views) < 2:
        return
    base = views[0][0]
    mask = torch.zeros(max(hi for _, hi, _, _ in views) - base, dtype=torch.uint8)
    seen: list[Span] = []
    for lo, hi, key, t in views:
        size = t.element_size()
        view = mask.as_strided((*t.shape, size), (*(st * size for st in t.stride()), 1), lo - base)
        if bool(view.any()):
            other = next(k for a, b, k, _ in seen if a < hi and lo < b)
            if not bool(view.all()):
                raise UsageError(
                    f"tensors {other!r} and {key!r} of the target share part of their "
                    "memory: the load would write those elements twice and keep the last "
                    "key's values. Load one of them (leave the other out of the state), "
                    "or make them independent (.clone())"
                )
            ties[key] = ties.get(other, other)
            continue
        view.fill_(1)
        seen.append((lo, hi, key, t))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN payloads, -0.0), for any dtype the format has; views, no copies."""
    x, y = as_bits(a), as_bits(b)
    return bool(torch.equal(x, y)) if x is not None and y is not None else bool(torch.equal(a, b))


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


#: Temporary bytes one batch of converted targets may hold (a larger target goes alone).
CONVERT_BATCH_BYTES = 64 << 20


def _read_converted(
    ck: Checkpoint,
    targets: list[tuple[ReadRequest, torch.Tensor]],
    casts: _Casts | None = None,
    *,
    same_as: Mapping[str, str] | None = None,
) -> int:
    """Read targets that need a dtype or device conversion, batch by batch; return the peak.

    A dtype conversion is checked by ``casts`` (:meth:`_Casts.convert`) before it is written.
    With ``same_as`` (tied keys → the key that filled their memory), nothing is written: the
    stored values must be the bits the target holds.
    """
    peak = 0
    batch: list[tuple[ReadRequest, torch.Tensor]] = []
    size = 0
    for i, (req, local) in enumerate(targets):
        n = ck.tensors[req.key].itemsize * (math.prod(req.lengths) if req.lengths else 1)
        batch.append((req, local))
        size += n
        if size >= CONVERT_BATCH_BYTES or i == len(targets) - 1:
            arrays = ck.read_many([r for r, _ in batch])
            with torch.no_grad():
                for (req, dst), arr in zip(batch, arrays, strict=True):
                    src = torch_from_numpy(arr)
                    out = src.to(dst.dtype)
                    if casts is not None and out.dtype != src.dtype:
                        casts.convert(req.key, src, out)
                    if same_as is None:
                        dst.copy_(out)
                    elif not _same_bits(out, dst.to(out.device)):
                        first = same_as[req.key]
                        raise UsageError(
                            f"tensors {first!r} and {req.key!r} of the target share memory "
                            f"(tied weights, or a view of the other), but {ck.path} holds "
                            "different values for them "
                            f"(box {list(req.offsets or ())}+{list(req.lengths or ())} of {req.key!r}): "
                            "the version was saved with them apart. Make them independent in the "
                            "target (a module's own parameter, .clone()) to load both, or leave "
                            "one key out of the state to give both the other's values"
                        )
            peak = max(peak, size)
            batch, size = [], 0
    return peak


#: Elements checked at once by a cast's value checks (bounds their masks' memory).
_CHECK_ELEMENTS = 1 << 22


def _digits(dtype: torch.dtype) -> tuple[int, float, float]:
    """A float type's precision (significand bits), largest value and smallest subnormal."""
    f = torch.finfo(dtype)
    bits = round(-math.log2(f.eps))
    return bits + 1, float(f.max), float(f.tiny) * float(f.eps)


def _rounds_to_max(dtype: torch.dtype) -> float:
    """The largest magnitude that a cast to ``dtype`` rounds to its largest finite value."""
    f = torch.finfo(dtype)
    top = float(f.max)
    exponent = math.frexp(top)[1] - 1  # of its leading bit (log2 would round up to 1024)
    return top + math.ldexp(float(f.eps) / 2, exponent)


def exact_cast(src: torch.dtype, out: torch.dtype) -> bool:
    """Whether every value of ``src`` is exactly a value of ``out`` (no scan needed).

    ``torch.promote_types`` is not this: it promotes every integer to any float type (int64 to
    float16) and raises for float8 (attack review 3 F1, F12). (The format has no complex
    dtypes: a complex target is refused before any cast.)
    """
    if src == out or src == torch.bool:
        return True
    if out == torch.bool:
        return False
    if out.is_floating_point:
        bits, top, low = _digits(out)
        if src.is_floating_point:
            sbits, stop, slow = _digits(src)
            return bits >= sbits and top >= stop and low <= slow
        i = torch.iinfo(src)
        return bool(max(abs(i.min), i.max) <= 2**bits)
    if src.is_floating_point:
        return False
    i, o = torch.iinfo(src), torch.iinfo(out)
    return bool(o.min <= i.min and o.max >= i.max)


def _checkable(t: torch.Tensor) -> torch.Tensor:
    """``t``, or as float32 when it is a float8.

    torch lacks isfinite and more for float8; its e4m3fn has no infinity (an overflow
    saturates or is NaN), which float32 keeps as it is.
    """
    return t.float() if t.is_floating_point() and t.element_size() == 1 else t


def _int_changes(src: torch.Tensor, out: torch.Tensor) -> int:
    """How many values of ``src`` the cast to ``out`` changed (integers compared exactly).

    A round trip through ``src``'s own type hides a wrap (uint8 200 -> int8 -56 -> uint8 200),
    so both sides are compared as int64 where they are integers, and a float side only where it
    is an integer within int64's range.
    """
    def as_int64(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if t.is_floating_point():
            w = t.to(torch.float64)
            ok = torch.isfinite(w) & (w == w.trunc()) & (w.abs() < 2.0**63)
            return torch.where(ok, w, 0.0).to(torch.int64), ok
        if t.dtype == torch.uint64:  # values of 2**63 and above would wrap: never "the same"
            ok = t.double() < 2.0**63
            return torch.where(ok, t, 0).to(torch.int64), ok
        return t.to(torch.int64), torch.ones(t.shape, dtype=torch.bool)

    a, a_ok = as_int64(src)
    b, b_ok = as_int64(out)
    return int((~a_ok | ~b_ok | (a != b)).sum())


class _Casts:
    """dtype conversions of one load: refused (``strict_dtype``) or logged once per family.

    A family is the key with its numbered components dropped (``model/layers/3/w`` and
    ``model/layers/7/w`` are one family), per pair of dtypes.
    """

    def __init__(self, strict: bool, *, tell: bool = False) -> None:
        self.strict = strict
        #: Say on stderr each pair of dtypes a cast loses precision between (rank 0 of a load)
        self.tell = tell
        self.told: set[tuple[str, str]] = set()
        self.seen: set[tuple[str, str, str]] = set()
        #: key → what its conversion did on this rank (``LoadInfo.casts``)
        self.done: dict[str, dict[str, Any]] = {}

    def convert(self, key: str, src: torch.Tensor, out: torch.Tensor) -> None:
        """Account for one cast box; refuse one that changes what the values are.

        A narrower float type turns large values into ``inf`` and small ones into 0: an AdamW
        ``exp_avg_sq`` loaded into float16 became all zeros, a 1e5 buffer ``inf``, and the
        job went on (multi-job review F5). Refused: a finite value made infinite, a box where
        more than half of the finite non-zero values became 0, and an integer that changes (a
        wrap between signed and unsigned, a truncation, an int64 rounded by a float target,
        attack review 3 F1, F4). Other zeros are counted (``flushed``); rounding of floats to
        a narrower float is what such a cast means and passes.
        """
        rec = self.done.setdefault(key, {
            "key": key, "stored": format_dtype(src.dtype, key=key),
            "target": format_dtype(out.dtype, key=key), "flushed": 0, "elements": 0,
        })
        rec["elements"] += src.numel()
        if exact_cast(src.dtype, out.dtype):
            return  # every stored value is a target value (bf16 -> fp32 weights: no scan)
        try:
            why = self._changes(rec, src, out)
        except RuntimeError as e:  # an operation torch lacks for the pair (float8, uint64)
            why = f"the cast cannot be checked ({e})"
        if why:
            raise UsageError(
                f"tensor {key!r}: casting the stored {rec['stored']} to the target's "
                f"{rec['target']}: {why}; build the target with dtype {rec['stored']} (and "
                "cast it after the load, if that is what you want). Targets of other tensors "
                "may already hold this version's values"
            )

    @staticmethod
    def _changes(rec: dict[str, Any], src: torch.Tensor, out: torch.Tensor) -> str:
        """Why the cast of ``src`` into ``out`` is refused ("" when it is not).

        Checked in slices of :data:`_CHECK_ELEMENTS`, so the masks stay small beside the box.
        """
        a, b = src.reshape(-1), out.reshape(-1)
        to_float = out.is_floating_point()
        ints = src.dtype != torch.bool and not src.is_floating_point()
        overflow = changed = flushed = nonzero = flipped = 0
        # Beyond the largest value by more than half a step there (what rounds to it): float8
        # e4m3fn saturates instead of giving inf (448 for 500, and for inf: review of the change
        # D1).
        top = _rounds_to_max(out.dtype) if to_float else 0.0
        for i in range(0, a.numel(), _CHECK_ELEMENTS):
            x, y = _checkable(a[i : i + _CHECK_ELEMENTS]), _checkable(b[i : i + _CHECK_ELEMENTS])
            if not to_float:
                changed += _int_changes(x, y)
                continue
            xf = x if x.is_floating_point() else x.double()  # (torch has no abs of uints)
            overflow += int((torch.isfinite(xf) & (~torch.isfinite(y) | (xf.abs() > top))).sum())
            overflow += int((~torch.isfinite(xf) & torch.isfinite(y)).sum())  # inf saturated
            if ints:
                changed += _int_changes(x, y)
            # A sign lost, or a 0 that is no longer 0: a float type without a sign or a zero
            # (e8m0) turned [-2, 0] into [2, 5.9e-39] and passed (maintainer review M1).
            yf = y if y.is_floating_point() else y.double()
            flipped += int(((xf < 0) & (yf > 0) | (xf > 0) & (yf < 0) | (xf == 0) & (yf != 0)).sum())
            nz = (x != 0) & torch.isfinite(x)
            nonzero += int(nz.sum())
            flushed += int((nz & (y == 0)).sum())
        rec["flushed"] += flushed
        if overflow:
            return (
                f"{overflow} value(s) out of the target type's range would become infinite, or "
                "its largest value"
            )
        if flipped:
            return (f"{flipped} value(s) would change sign or stop being 0 (the target type "
                    "has no sign or no zero)")
        if changed and ints:
            return f"{changed} integer value(s) cannot be represented and would change"
        if changed:
            return f"{changed} value(s) are not integers the target type holds"
        if flushed and 2 * flushed > nonzero:
            return (
                f"{flushed} of its {nonzero} non-zero values would become 0 (below the "
                "target type's smallest value)"
            )
        return ""

    def report(self) -> list[dict[str, Any]]:
        """The casts of this rank's load, one per key (``LoadInfo.casts``)."""
        return list(self.done.values())

    def check(self, ck: Checkpoint, key: str, local: torch.Tensor) -> None:
        stored, target = ck.tensors[key].dtype, format_dtype(local.dtype, key=key)
        if stored == target:
            return
        if self.strict:
            raise UsageError(
                f"tensor {key!r}: {ck.path} stores {stored}, the target is {target}; "
                f"strict_dtype=True refuses to cast (build the target with dtype {stored})"
            )
        if (self.tell and (stored, target) not in self.told
                and not exact_cast(torch_dtype(stored), local.dtype)):
            # The logger is silent until a job configures logging: a bf16 model loaded from
            # fp32 master weights lost precision without a word (odd-states review O5).
            self.told.add((stored, target))
            say(f"load: tensors stored as {stored} (first {key!r}) are cast to the target's "
                f"{target}, which rounds them; LoadInfo.casts lists each, strict_dtype=True "
                "refuses")
        family = "/".join("#" if p.isdigit() else p for p in key.split("/"))
        if (family, stored, target) not in self.seen:
            self.seen.add((family, stored, target))
            _log.warning(
                "load: casting %s (stored %s) to the target's %s%s; pass strict_dtype=True "
                "to refuse", key, stored, target,
                " and every tensor like it" if family != key else "",
            )


def _none_found(ck: Checkpoint, keys: list[str]) -> TensorMissingError:
    """The error of a load of which no rank found one of its target tensors in the version.

    Such a load loaded nothing and reported success, also with ``strict=False``: the
    fine-tune the docs showed restored ``{"model": model}`` from a version that holds
    ``train/model/...`` and trained from random weights (docs review 21, F1). Keys absent one
    by one are what ``strict=False`` is for; all of them absent is a target that does not fit.
    """
    where = f"checkpoint {ck.path}, which holds {len(ck.tensors)} tensors"
    if not keys:  # this rank holds no tensor: its peers' did not fit
        return TensorMissingError(f"no rank found one of its target tensors in {where}")
    return TensorMissingError(
        f"none of the target's {len(keys)} tensors (e.g. {keys[0]!r}) is in {where}: the "
        f"target does not fit the version, and strict=False does not load it either; "
        f"{_prefix_hint(ck, keys)}. To load an optional part only where a version holds it, "
        "look first: portable_ckpt.open(root).tensors"
    )


def _stored_below(key: str, stored: list[str], wanted: str) -> str:
    """A container stored where the target holds one ``wanted`` at ``key``, said ("" if not).

    A module's extra state that is None in a fresh object, a parameter that became a
    submodule: not a renamed prefix, as the keys that look alike suggested (zoo review, low).
    """
    below = sorted(k for k in stored if k.startswith(f"{key}/"))
    if not below:
        return ""
    return (
        f"the checkpoint holds a dict or list there ({below[:4]}"
        f"{', ...' if len(below) > 4 else ''}), the target a single "
        f"{'plain value' if wanted == 'value' else 'tensor'}: make the target's value a "
        "container of that shape (an empty dict takes whatever is stored below it)"
    )


def _prefix_hint(ck: Checkpoint, keys: list[str]) -> str:
    """How the target's keys differ from the stored ones by a prefix, or how to see both."""
    stored = list(ck.tensors)  # in the record's order: the same hint on every rank and run
    below = _stored_below(keys[0], stored, "tensor")
    if below:
        return below
    ends: dict[str, str] = {}  # "a/b/c" -> "x/a/b/c": the stored keys by their shorter tails
    for s in stored[:200_000]:
        parts = s.split("/")
        for i in range(1, min(len(parts), 8)):
            ends.setdefault("/".join(parts[i:]), s)
    known = set(stored)
    for key in keys[:256]:
        if key in ends:
            long = ends[key]
            under = long[: -len(key)]
            return (f"the version holds {key!r} as {long!r}: nest the target under {under!r} "
                    "as the saving job did")
        parts = key.split("/")
        for i in range(1, len(parts)):
            tail = "/".join(parts[i:])
            if tail in known:
                return (f"the version holds {key!r} as {tail!r}: the target nests it under "
                        f"{'/'.join(parts[:i]) + '/'!r}, the saving job did not")
    close = similar_keys(keys[0], stored)
    if close:
        return f"stored keys that look alike: {close} (a renamed prefix? map the target's keys)"
    return "build the target with the saved keys (portable-ckpt inspect lists them)"


def _instead(ck: Checkpoint, key: str, *, wanted: str) -> str:
    """What ``ck`` holds in place of a missing ``key``, for the error ("" when nothing is near).

    The same key stored as the other kind (a tensor saved where the target now holds an int),
    or keys that look alike (a renamed prefix): ``strict=False`` is then the wrong advice, as it
    would load nothing for them and report success.
    """
    values: Any = {}
    if VALUES_ENTRY in ck.entries:
        try:
            values = ck.entry(VALUES_ENTRY)
        except CheckpointError:
            values = {}
    values = values if isinstance(values, dict) else {}
    if wanted == "value" and key in ck.tensors:
        return (
            f"; the checkpoint holds {key!r} as a tensor, the target a plain value: make the "
            "target a tensor of the saved shape and dtype"
        )
    if wanted == "tensor" and key in values:
        return (
            f"; the checkpoint holds {key!r} as a plain value, the target a tensor: make the "
            "target that value's type"
        )
    head, _, member = key.rpartition("/")
    if f"/{head}/".find("/state/") >= 0:
        # An optimizer's per-parameter state of other members: another optimizer class, not a
        # renamed prefix (manager review 25, L2: an AdamW's state loaded into an SGD said "map
        # the target's keys")
        sibling = {k.rpartition("/")[2] for k in [*ck.tensors, *values]
                   if k.rpartition("/")[0] == head}
        if sibling and member not in sibling:
            return (f"; the checkpoint holds {sorted(sibling)[:6]} for that parameter: the "
                    "state of another optimizer class (an AdamW's where an SGD's is wanted?): "
                    "build the optimizer the version saved, or leave it out of the loaded "
                    "state (a fine-tune builds it fresh)")
    below = _stored_below(key, [*ck.tensors, *values], wanted)
    if below:
        return f"; {below}"
    close = similar_keys(key, [*ck.tensors, *values])
    if not close:
        return ""
    return (
        f"; stored keys that look alike: {close} (a renamed prefix? map the target's keys; "
        "strict=False would leave them unloaded and report success)"
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
                + (_instead(ck, key, wanted="tensor") or "; pass strict=False to leave it untouched")
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


class _EntryReads:
    """The entry values this rank's load restores, read on a worker while its tensors are read.

    Read after the tensors, a version's small entry files queued behind the other ranks' large
    reads of the same disk: 15-70 ms of a 0.55 s cold 4-rank load of the realistic state. Read
    while the tensors are planned and read, they cost nothing the load waits for. Each value is
    read once (``torch.values`` was read again for every entry rebuilt from its leaves).
    Failures are raised where the value is used, in the order the load always had.
    """

    def __init__(self, ck: Checkpoint, flat: FlatState, info: LoadInfo) -> None:
        self.ck = ck
        self.rank = info.rank
        self.world_size = info.world_size
        self._reads: dict[tuple[str, int | None, int | None], Future[Any]] = {}
        wanted: list[tuple[str, int | None, int | None]] = []
        if VALUES_ENTRY in ck.entries and (flat.values or flat.entries):
            wanted.append((VALUES_ENTRY, None, None))
        for key in flat.entries:
            stored = ck.entries.get(key)
            if stored is not None:
                per_rank = stored.scope == "per_rank"
                wanted.append((key, self.rank, self.world_size) if per_rank else (key, None, None))
        pool = worker("pck-entries")
        for w in wanted:
            self._reads[w] = pool.submit(ck.entry, *w)

    def __enter__(self) -> _EntryReads:
        return self

    def __exit__(self, *exc: object) -> None:
        # Nothing reads the version after the load returns: drop what was not started, wait
        # for what was.
        for fut in self._reads.values():
            fut.cancel()
        for fut in self._reads.values():
            if not fut.cancelled():
                fut.exception()

    @functools.cached_property
    def shapes(self) -> RecordedShapes | None:
        """Which containers were lists, where the version records it (read when first asked)."""
        items = recorded_items(self.ck)
        return None if items is None else RecordedShapes(items)

    def get(self, name: str, *, per_rank: bool = False) -> Any:
        """The value of entry ``name`` (this rank's for a ``per_rank`` one)."""
        key = (name, self.rank, self.world_size) if per_rank else (name, None, None)
        fut = self._reads.get(key)
        if fut is None:
            return self.ck.entry(*key)
        return fut.result()


#: Members of every optimizer's param groups, whatever its class, and those LR schedulers add
#: (OneCycleLR, CyclicLR, SWALR): a fine-tune with another schedule is no other optimizer.
_GROUP_COMMON = frozenset({"params", "param_names", "lr", "weight_decay", "maximize", "foreach",
                           "differentiable", "fused", "capturable", "initial_lr", "max_lr",
                           "min_lr", "base_lr", "max_momentum", "base_momentum", "swa_lr"})


@functools.cache
def _optimizer_members() -> frozenset[str]:
    """The hyper-parameters torch's optimizers take, but those every one has or schedules add."""
    names: set[str] = set()
    for c in vars(torch.optim).values():
        if isinstance(c, type) and issubclass(c, torch.optim.Optimizer):
            with contextlib.suppress(TypeError, ValueError):
                names |= set(inspect.signature(c.__init__).parameters)
    return frozenset(names - _GROUP_COMMON - {"self", "args", "kwargs", "defaults"})


def _group_members(keys: Any) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for k in keys:
        m = GROUP_MEMBER.match(f"{k}")
        if m:
            out.setdefault((m.group(1) or "", m.group(2)), set()).add(m.group(3))
    return out


def _same_optimizers(stored: dict[str, Any], target: Mapping[str, Any], path: str) -> None:
    """Refuse stored param groups of another optimizer class than the target's.

    Loaded into an SGD, an AdamW's groups set the pretraining run's learning rate and weight
    decay and left out ``momentum`` (fine-tuning review 21, M7). Groups are told apart by their
    hyper-parameters: each side holding some the other lacks (``betas`` and ``eps`` against
    ``momentum`` and ``dampening``), among the hyper-parameters torch's optimizers take: one
    side's extra members alone are a newer torch's, and a group's own (a ``name``) tell nothing.
    """
    wanted = _group_members(target)
    if not wanted:
        return
    have = _group_members(stored)
    known = _optimizer_members()  # a group's own members (a "name" to log) tell nothing
    for (head, idx), names in sorted(wanted.items()):
        got = have.get((head, idx))
        if got is None:
            continue
        theirs, ours = (got - names) & known, (names - got) & known
        if theirs and ours:
            raise EntryTargetError(
                f"optimizer {head or '(top)'!r} of {path}: its param group {idx} holds "
                f"{sorted(theirs)[:6]}, the target's holds {sorted(ours)[:6]}: the state of "
                "another optimizer class (an AdamW's into an SGD would set the saved learning "
                "rate and weight decay); build the optimizer the version saved, or leave it out "
                "of the loaded state (a fine-tune builds it fresh)"
            )


def _same_group_count(stored: dict[str, Any], target: Mapping[str, Any], path: str) -> None:
    """Refuse stored param groups beyond the target optimizer's (``strict`` loads only).

    A group added during training (``add_param_group`` for a layer unfrozen at step N) is
    stored; a restarted job that builds its optimizer without it got the other groups and
    trained on with that layer frozen and its optimizer state dropped, listed only among
    ``LoadInfo.unexpected_keys`` (zoo review Z6). torch's ``load_state_dict`` refuses another
    number of groups; so does this, naming the groups and the fix.
    """
    wanted = _group_members(target)
    if not wanted:
        return
    ours: dict[str, set[int]] = {}
    for head, idx in wanted:
        ours.setdefault(head, set()).add(int(idx))
    theirs: dict[str, set[int]] = {}
    for head, idx in _group_members(stored):
        if head in ours:
            theirs.setdefault(head, set()).add(int(idx))
    for head, groups in sorted(theirs.items()):
        extra = sorted(groups - ours[head])
        if not extra:
            continue
        pre = f"{head}/" if head else ""
        named = "; ".join(
            f"group {i}: lr {stored.get(f'{pre}param_groups/{i}/lr')!r}, params "
            f"{_params_of(stored, f'{pre}param_groups/{i}/params')}" for i in extra[:3]
        )
        raise EntryTargetError(
            f"optimizer {head or '(top)'!r} of {path}: the version holds {max(groups) + 1} param "
            f"groups, the target's optimizer {len(ours[head])} ({named}): a group added during "
            "training (add_param_group) must be added again before the restore, or its "
            "parameters train on without it; pass strict=False to load the others "
            "(LoadInfo.unexpected_keys names the rest)"
        )


def _params_of(stored: dict[str, Any], key: str) -> str:
    """A stored group's parameters (names, or ids), the first four."""
    params = [stored[f"{key}/{i}"] for i in range(5) if f"{key}/{i}" in stored]
    return repr(params[:4])[:-1] + (", ...]" if len(params) > 4 else "]")


def _load_values(
    entries: _EntryReads, flat: FlatState, info: LoadInfo, *, strict: bool
) -> dict[str, Any]:
    """The target's plain (JSON) leaves from the ``VALUES_ENTRY`` entry."""
    if not flat.values:
        return {}
    ck = entries.ck
    stored: Any = {}
    if VALUES_ENTRY in ck.entries:
        stored = entries.get(VALUES_ENTRY)
        if not isinstance(stored, dict):
            raise EntryMissingError(f"entry {VALUES_ENTRY!r} is not an object")
        info.entries_loaded += 1
    _same_optimizers(stored, flat.values, ck.path)
    if strict:
        _same_group_count(stored, flat.values, ck.path)
    loaded, whole = _load_whole(stored, flat, lambda: entries.shapes)
    for k, v in flat.values.items():
        if whole.on_path(k):
            continue  # in a list loaded whole
        if k in stored:
            loaded[k] = decode_json(stored[k])
        elif isinstance(v, list | tuple | dict) and not v:
            continue  # an empty container of the target: versions before 2026-12-03 lack it
        elif strict:
            raise EntryMissingError(
                f"value {k!r} is in the target state but not in entry {VALUES_ENTRY!r} of "
                f"{ck.path}"
                + (_instead(ck, k, wanted="value") or "; pass strict=False to keep the current value")
            )
        else:
            info.missing_keys.append(k)
    # Stored values the target does not ask for are reported, as stored tensors are (a config
    # key added between save and load went unnoticed: fidelity review F7).
    info.unexpected_keys += sorted(
        k for k in stored if k not in flat.values and not whole.on_path(k)
    )
    return loaded


def _load_whole(
    stored: dict[str, Any],
    flat: FlatState,
    shapes: Callable[[], RecordedShapes | None] = lambda: None,
) -> tuple[dict[str, Any], KeyTrie]:
    """The lists DCP keeps as one item, and the target's empty containers, loaded whole.

    As ``dcp.load`` replaces such a list, the stored one takes the target's place whatever
    their lengths: a target made fresh (``history = []``) gets the saved history, never the
    target's positions only. Returns the values and a trie of their keys.
    """
    empty = {k: v for k, v in flat.values.items() if isinstance(v, list | tuple | dict) and not v}
    if not flat.lists and not empty:
        return {}, KeyTrie()  # nothing to load whole: no copy of the stored leaves
    tree = JsonTree(stored, shapes=shapes() if empty else None)  # what an empty dict grows
    loaded = {
        k: tree.value(k, node, item=not isinstance(node, dict))
        for k, node in {**flat.lists, **empty}.items()
        if k in tree  # stored: as a leaf, or as leaves below k
    }
    return loaded, KeyTrie(loaded)


def _load_entries(
    entries: _EntryReads, flat: FlatState, info: LoadInfo, *, strict: bool
) -> list[tuple[str, StateEntry, Any]]:
    """Restore every entry now, except the ``restore_last`` ones: returned with their values."""
    ck = entries.ck
    last: list[tuple[str, StateEntry, Any]] = []
    for key, e in flat.entries.items():
        if key not in ck.entries and (value := _entry_from_values(entries, key, e)) is not None:
            _restore_entry(e, value, key, ck)  # a DCP save stored its state_dict() as JSON leaves
            info.entries_loaded += 1
            continue
        if key not in ck.entries:
            if strict:
                raise EntryMissingError(
                    f"entry {key!r} ({e.schema}) is in the target state but not in {ck.path}; "
                    f"pass strict=False to keep the current state"
                )
            info.missing_keys.append(key)
            continue
        stored = ck.entries[key]
        value = entries.get(key, per_rank=stored.scope == "per_rank")
        if value is NO_VALUE:  # policy "drop": the application keeps its fresh state
            continue
        if (stored.schema_id == "pck:rng/1" and stored.world_size_policy == "modulo"
                and info.world_size > info.saved_world_size and info.rank == 0):
            # Documented, yet silent: a new rank r draws what stored rank r mod W drew (async
            # review F21: dropout masks and augmentations correlated across ranks).
            say(f"load of {key!r}: ranks {info.saved_world_size}..{info.world_size - 1} continue "
                f"the RNG streams of ranks r mod {info.saved_world_size} (policy modulo), so "
                "their random draws repeat those ranks'; reseed them (torch.manual_seed(seed + "
                "rank)) where that matters")
        if e.restore_last:
            last.append((key, e, value))
        else:
            _restore_entry(e, value, key, ck)
        info.entries_loaded += 1
    return last


def _restore_entry(e: StateEntry, value: Any, key: str, ck: Checkpoint) -> None:
    """``e.restore(value)``, a value it refuses named by entry and version."""
    try:
        e.restore(value)
    except EntrySchemaError as exc:  # the same class: a manager tells the caller's own apart
        raise type(exc)(f"entry {key!r} of {ck.path}: {exc.message}", path=exc.path) from exc


def _entry_from_values(entries: _EntryReads, key: str, e: StateEntry) -> Any:
    """A global entry's value rebuilt from ``torch.values`` leaves below ``key``, or ``None``.

    ``dcp.save`` of ``{"sched": scheduler}`` stores ``scheduler.state_dict()`` as the leaves
    ``sched/...`` (DCP flattens it); the entry's own capture shapes the rebuilt value.
    """
    if e.scope != "global" or e.restore_last or VALUES_ENTRY not in entries.ck.entries:
        return None
    stored = entries.get(VALUES_ENTRY)
    tree = JsonTree(stored if isinstance(stored, dict) else {})
    if key not in tree:
        return None
    return encode_json(tree.value(key, decode_json(e.capture())), key=key)
