"""The collective save: options, phases and :func:`save`.

Protocol of a save (every rank of the group calls it with its own state):

1. ``prepare``: each rank takes its state apart (:mod:`portable_ckpt.torch.flatten`), decides
   from the placements alone which pieces it owns (:mod:`portable_ckpt.torch.plan`) and stages
   them (:mod:`portable_ckpt.torch.staging`).
2. ``agree on the attempt`` (all-gather of a few bytes): rank 0 contributes a fresh attempt id;
   any rank that failed preparing (e.g. a ``Partial`` placement) makes every rank raise.
3. ``write``: each rank writes only its pieces and its entries with its own
   ``ShardWriter(writer=rank)``.
4. ``commit``: rank 0 gathers the writer indexes (range records, sizes, checksums — never tensor
   bytes), commits when every rank succeeded, and broadcasts the outcome. A failure anywhere
   publishes nothing; every rank raises (PCK-DISTRIBUTED for a peer's failure). A dead or stuck
   peer makes the metadata collectives fail after ``timeout`` seconds instead of hanging.

Steps 2 and 4 are :meth:`~portable_ckpt.torch._collectives.Comm.all_gather_step` and
:meth:`~portable_ckpt.torch._collectives.Comm.coordinator_step`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

from portable_ckpt._gc import paused_gc
from portable_ckpt.errors import (
    DistributedError,
    MetadataConflictError,
    UsageError,
)
from portable_ckpt.format.keys import DCP_ITEMS_ENTRY, dcp_items_value, read_dcp_items
from portable_ckpt.format.manifest import Continuation, WriterIndex, files_bytes
from portable_ckpt.format.usage import (
    flag,
    process_group_or_none,
    require_non_negative_int,
    require_one_of,
    strict_int,
    timeout_seconds,
)
from portable_ckpt.format.vocab import CONTRACTS, Codec, Contract
from portable_ckpt.io.checksum import file_blocks_for
from portable_ckpt.io.commit import commit
from portable_ckpt.io.tensor_table import TABLE_THRESHOLD
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.logs import get_logger, human_bytes, logged
from portable_ckpt.storage import Storage, open_storage
from portable_ckpt.torch._collectives import Comm, by_rank, make_comm
from portable_ckpt.torch._inflight import say, wait_idle
from portable_ckpt.torch._owners import (
    OwnersExchange,
    PlainOwners,
    forget,
    keys_digest,
    writer_problems,
)
from portable_ckpt.torch.flatten import VALUES_ENTRY, FlatState, flatten_state
from portable_ckpt.torch.info import CheckpointInfo
from portable_ckpt.torch.plan import (
    PlannedEntry,
    SavePlan,
    copy_conflicts,
    diverged,
    diverged_parameters,
    plan_save,
    replica_conflicts,
)
from portable_ckpt.torch.staging import Staging, stage, staging_bytes
from portable_ckpt.torch.state import RNGState, capture_rng

__all__ = ["Prepared", "RankWrite", "SaveKeywords", "SaveOptions", "prepare", "run_save", "save"]

_log = get_logger("torch")

#: What a failed save leaves behind (the end of every failure message).
NOTHING_PUBLISHED = "nothing was published and the previous version stays the latest"

Root = str | os.PathLike[str] | Storage


class _Step(TypedDict):
    step: int


class SaveKeywords(_Step, total=False):
    """The keyword arguments of :func:`save` and ``async_save``: see :class:`SaveOptions`."""

    process_group: Any
    continuation: Contract
    codec: Codec
    timeout: float | None
    block_size: int | None
    max_file_bytes: int
    if_busy: str
    tensor_table: bool | None
    publisher: Any


#: What a save does while an async save of this process is in flight.
IF_BUSY = ("wait", "raise")


@dataclass(frozen=True)
class SaveOptions:
    """The options of one save (built once from the keyword arguments; validated then).

    Attributes:
        step: The completed training step (stored once, in the manifest).
        process_group: A torch.distributed ProcessGroup (default: the default group when
            initialised, else one process).
        continuation: ``"exact"`` (bit-exact resume on the same world size and mesh) or
            ``"statistical"``.
        codec: ``"none"`` or ``"zstd"`` for tensor chunks.
        timeout: Seconds a metadata collective may wait for peers (default: the process-group
            default).
        block_size: Checksum block size (default: chosen per file, about 4,096 blocks per file
            and at most 2^22 blocks per job; see io/checksum.auto_block_size).
        max_file_bytes: Start a new shard file beyond this size.
        if_busy: ``"wait"`` for an in-flight async save of this process, or ``"raise"``.
        tensor_table: Describe the ranges in tensor tables (format 1.1, spec §8.5). Default:
            when the job's writers together hold more than 65,536 range records.
        publisher: How a version whose files are spread over node-local roots is committed
            and published (``CheckpointManager``'s node-local fast tier, spec §14.7); ``None``:
            one root every rank reaches.

    """

    step: int
    process_group: Any = None
    continuation: Contract = "exact"
    codec: Codec = "none"
    timeout: float | None = None
    block_size: int | None = None
    max_file_bytes: int = 4 << 30
    if_busy: str = "wait"
    tensor_table: bool | None = None
    publisher: Any = None

    @classmethod
    def of(cls, call: str, options: Mapping[str, Any]) -> SaveOptions:
        """The options of ``call`` (``"save"``): PCK-USAGE naming it for a missing ``step``.

        (Not a ``TypeError`` naming this class: ``step`` is ``call``'s required keyword.)
        """
        # A misspelt keyword is Python's TypeError, but naming the call, not this class's
        # __init__ (api review 31: save(..., stpe=3) named SaveOptions.__init__()).
        unknown = sorted(set(options) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(f"{call}() got an unexpected keyword argument {unknown[0]!r}")
        if "step" not in options:
            raise UsageError(
                f"{call}() needs the keyword argument step= (the completed training step, "
                f"stored in the manifest), e.g. {call}(state, root, step=1000)"
            )
        return cls(**options)

    def __post_init__(self) -> None:
        """Refuse a bad step or contract before anything is touched."""
        require_non_negative_int(self.step, "step")
        require_one_of(self.continuation, CONTRACTS, "continuation")
        # Taken unchecked before: if_busy="skip" waited, tensor_table="no" wrote a table, a
        # timeout "30" failed in the first collective (api review 31).
        timeout_seconds(self.timeout, "timeout")
        strict_int(self.max_file_bytes, "max_file_bytes", minimum=1)
        require_one_of(self.if_busy, IF_BUSY, "if_busy")
        flag(self.tensor_table, "tensor_table", allow_none=True)
        process_group_or_none(self.process_group, "process_group")

    def writer_options(self, pieces: int, world: int) -> dict[str, Any]:
        """The :class:`ShardWriter` keyword arguments for a rank writing ``pieces`` pieces."""
        table = self.tensor_table
        if self.publisher is not None:
            # Node-local roots: a table would be on its writer's node only, where the committer
            # (rank 0) and the other nodes' verification cannot read it (attack review 4 A6).
            table = False
        elif table is None:
            # Writers of a large job describe their ranges in a tensor table (spec §8.5): the
            # committer then merges arrays instead of parsing thousands of JSON indexes.
            table = pieces * world > TABLE_THRESHOLD
        kwargs: dict[str, Any] = {
            "codec": self.codec,
            "max_file_bytes": self.max_file_bytes,
            "tensor_table": table,
            # Per-file checksum blocks, fewer per file in large jobs (bounded manifest).
            "max_file_blocks": file_blocks_for(world),
        }
        if self.block_size is not None:
            kwargs["block_size"] = self.block_size
        return kwargs


# -- phase 1: prepare (local) ----------------------------------------------------------------------


@dataclass
class Prepared:
    """A rank's opened storage and staged plan, or why preparing failed (reported to peers).

    Attributes:
        storage: The checkpoint root (``None`` when preparing failed).
        plan: The staged plan (``None`` when preparing failed).
        error: The exception preparing raised.
        seconds: Time spent preparing.

    """

    storage: Storage | None
    plan: SavePlan | None
    error: BaseException | None
    seconds: float

    def ready(self) -> tuple[Storage, SavePlan]:
        """The storage and the plan, or re-raise the preparation's error."""
        if self.error is not None:
            raise self.error
        if self.storage is None or self.plan is None:  # pragma: no cover - set when no error
            raise UsageError("save: nothing was prepared")
        return self.storage, self.plan


def prepare(
    state: Mapping[str, Any],
    root: Root,
    comm: Comm,
    copy: bool,
    into: Staging | None = None,
    step: int = 0,
) -> Prepared:
    """Open ``root``; flatten, plan and stage ``state`` (``copy``: into staging buffers).

    Failures are kept for the first status exchange, so that every rank learns of them at once.
    ``into`` is where the copies go (default: this process's private buffers). The tensor plan
    is reused from an earlier save of the same layout (:func:`~portable_ckpt.torch.plan.plan_stats`).
    """
    t0 = time.perf_counter()
    flat, failed = None, None
    try:
        storage = open_storage(root, create=True)
        rng = capture_rng()  # before any state_dict() call: saving has no RNG side effect
        flat = flatten_state(state)
    except BaseException as e:
        failed = e
    try:
        # Which rank stores each plain tensor: an all-gather every rank takes part in, one
        # that failed above too (it tells the others, and all raise at the next step).
        exchange = OwnersExchange.start(
            comm, flat, failed, what=f"save of step {step}", outcome=NOTHING_PUBLISHED
        )
    except BaseException as e:
        return Prepared(None, None, e, time.perf_counter() - t0)
    def staged(taken: FlatState, owners: PlainOwners | None) -> SavePlan:
        plan = plan_save(taken, comm.rank, rng, world=comm.world_size, step=step, owners=owners)
        stage(plan, copy, into)
        return plan

    plan: SavePlan | None = None
    staging_error: BaseException | None = None
    try:
        if exchange.ready and flat is not None:  # stage by the record meanwhile
            plan = staged(flat, exchange.record)
    except BaseException as e:
        staging_error = e
    try:
        owners = exchange.finish()  # on every rank, also when staging failed
    except BaseException as e:
        # an interrupt wins over a failure, else the first failure is kept (diff review 7, D5)
        if staging_error is None or (isinstance(staging_error, Exception)
                                     and not isinstance(e, Exception)):
            staging_error = e
    if staging_error is not None:
        return Prepared(None, None, staging_error, time.perf_counter() - t0)
    if exchange.peer_failed:  # the agreement step reports the peer's failure everywhere
        return Prepared(storage, SavePlan([], [], None, 0), None, time.perf_counter() - t0)
    try:
        if flat is None:  # pragma: no cover - finish() raised this rank's failure
            raise UsageError(f"save of step {step}: nothing to save was prepared")
        if plan is None or not _same_owned(owners, exchange.record):
            # keys changed somewhere and this rank stores others now: plan and stage again
            # (every piece is copied again: rare, and a pool slot is not kept across plans)
            plan = staged(flat, owners)
        return Prepared(storage, plan, None, time.perf_counter() - t0)
    except BaseException as e:
        return Prepared(None, None, e, time.perf_counter() - t0)


def _same_owned(a: PlainOwners | None, b: PlainOwners | None) -> bool:
    return a is b or (a is not None and b is not None and a.mine == b.mine)


# -- phases 2-4: the collective protocol -----------------------------------------------------------


def run_save(
    prepared: Prepared,
    comm: Comm,
    opts: SaveOptions,
    *,
    t_start: float,
    blocking: float,
    write_with: type[RankWrite] | None = None,
    on_attempt: Callable[[str], None] | None = None,
) -> CheckpointInfo:
    """Agree on the attempt, write this rank's part, commit on rank 0; same outcome everywhere.

    ``write_with`` runs the write phase (default :class:`RankWrite`: in this process);
    ``on_attempt`` is told the agreed attempt id before anything is written. Logged
    as ``save.started`` / ``save.finished`` (this rank's bytes, seconds since ``t_start``,
    MiB/s) or ``save.refused`` on the ``portable_ckpt.torch`` logger.
    """
    what = f"save of step {opts.step}"
    with logged(_log, "save", what, rank=comm.rank, t0=t_start, step=opts.step) as out:
        info = _run_save(
            prepared, comm, opts, t_start=t_start, blocking=blocking, write_with=write_with,
            on_attempt=on_attempt,
        )
        out.update(
            bytes=info.bytes_written, total_bytes=info.total_bytes, version=info.path,
            detail=f"version {info.path} ({human_bytes(info.total_bytes)} from all ranks)",
        )
    return info


def _run_save(
    prepared: Prepared,
    comm: Comm,
    opts: SaveOptions,
    *,
    t_start: float,
    blocking: float,
    write_with: type[RankWrite] | None,
    on_attempt: Callable[[str], None] | None,
) -> CheckpointInfo:
    # Paused on the main thread (a synchronous save); the background thread of an async save
    # leaves the training loop's collector alone. The pause ends before `seconds` is taken.
    with paused_gc():
        storage, plan, attempt_id, differ, weights = _agree_on_attempt(
            prepared, comm, opts.step, opts.continuation
        )
        opts = _contract_of(opts, comm.rank, differ, weights)
        _warn_exact_without_rng(opts, comm.rank, plan)
        if on_attempt is not None:
            on_attempt(attempt_id)
        write = (write_with or RankWrite)(storage, attempt_id, comm, plan, opts)
        commit_all = functools.partial(_commit, write, comm.world_size, plan, opts)
        written, committed = comm.coordinator_step(
            "save/commit",
            write,
            commit_all,
            what=f"save of step {opts.step} (write and commit)",
            outcome=NOTHING_PUBLISHED,
            on_failure=write.abort,
        )
        total_bytes = committed
        if opts.publisher is not None:  # node-local roots: publish the record on every node
            total_bytes = committed["bytes"]
            _publish_everywhere(
                opts.publisher, comm, storage, attempt_id, committed["manifest"], opts.step
            )
    return CheckpointInfo(
        checkpoint_id=attempt_id,
        step=opts.step,
        path=f"{storage.url.rstrip('/')}/{attempt_id}",
        world_size=comm.world_size,
        contract=opts.continuation,
        rank=comm.rank,
        bytes_written=int(written),
        total_bytes=int(total_bytes),
        seconds=time.perf_counter() - t_start,
        blocking_seconds=blocking,
        staging_bytes=staging_bytes(),
    )


def _agree_on_attempt(
    prepared: Prepared, comm: Comm, step: int, continuation: str
) -> tuple[Storage, SavePlan, str, list[str], list[str]]:
    """The attempt id (rank 0's), what differs between ranks, and which of it is parameters.

    What differs: plain tensors and values (:func:`~portable_ckpt.torch.plan.diverged`).
    """

    def local() -> tuple[tuple[Storage, SavePlan], dict[str, Any]]:
        storage, plan = prepared.ready()
        attempt = new_attempt_id(step) if comm.rank == 0 else None
        doc: dict[str, Any] = {
            "id": attempt, "step": step, "continuation": continuation,
            "replicas": plan.replicas, "copies": plan.copies,
        }
        if plan.staged_plain or plan.plain_values:  # a rank other than 0 stores some
            doc["stored"] = keys_digest([*plan.staged_plain, *plan.plain_values])
            doc.update(values=plan.plain_values, paths=plan.plain_paths)
        return (storage, plan), doc

    (storage, plan), sent = comm.all_gather_step(
        "save/prepare", local, what=f"save of step {step} (prepare)", outcome=NOTHING_PUBLISHED
    )
    if not isinstance(sent[0].get("id"), str):  # pragma: no cover - rank 0 always sends one
        raise DistributedError(f"save of step {step}: no attempt id from rank 0")
    steps = [d.get("step") for d in sent]
    if len(set(steps)) > 1:  # the same list on every rank: every rank refuses alike
        # Rank 0's step named the version, which held the others' state of other steps, and
        # each rank's CheckpointInfo said its own step (api review 31).
        raise UsageError(
            f"rank {comm.rank}: the ranks called save with different steps ({by_rank(steps, 'step')}"
            f"; this rank: {step}). Every rank must pass the same step. Nothing was saved"
        )
    contracts = [d.get("continuation") for d in sent]
    if len(set(contracts)) > 1:  # (rank 0's was recorded; the others' CheckpointInfo differed)
        raise UsageError(
            f"rank {comm.rank}: the ranks called save of step {step} with different "
            f"continuation contracts ({by_rank(contracts, 'continuation')}"
            f"; this rank: {continuation!r}). Every rank must pass the same. Nothing was saved"
        )
    replicas = [d.get("replicas", {}) for d in sent]
    conflicts = replica_conflicts(replicas)
    if conflicts:  # every rank holds the same list: every rank refuses alike
        raise MetadataConflictError(
            f"save of step {step}: a plain (non-DTensor) tensor or value is stored once, from "
            "the lowest rank that holds it, so the ranks that hold it must hold it alike (a "
            "tensor of one dtype and shape, or a value); "
            f"{'; '.join(conflicts[:5])}{' ...' if len(conflicts) > 5 else ''}. Nothing was "
            "saved. Hold them alike, or give what differs by rank keys of its own (experts by "
            "global id: docs/torch.md, 'Mixture of experts'), make it a DTensor, or keep it in "
            "a per-rank entry"
        )
    wrong = writer_problems(replicas, [d.get("stored") for d in sent], comm.rank,
                            [*plan.staged_plain, *plan.plain_values])
    if wrong:  # the same on every rank: all forget their records and refuse alike
        forget(comm)
        raise MetadataConflictError(
            f"save of step {step}: the ranks disagree on which of them stores plain tensors "
            f"({'; '.join(wrong[:4])}): a rank's record of the last exchange is not the "
            "others' (it was interrupted there). Nothing was saved; the next save exchanges "
            "the keys again"
        )
    if comm.rank == 0:
        _take_from_others(plan, sent)
    copied = copy_conflicts([d.get("copies", {}) for d in sent], comm.global_ranks)
    if copied:  # every rank holds the same list: every rank refuses alike
        raise MetadataConflictError(
            f"save of step {step}: a DTensor on a sub-mesh (FSDP2's `mesh[\"dp\"]`) is stored "
            "once, from the rank at coordinate 0 along the mesh dims it lacks, as a copy of the "
            f"other ranks' along them; {'; '.join(copied[:3])}"
            f"{' ...' if len(copied) > 3 else ''}. Nothing was saved. Save a pipeline-"
            "parallel job through DCP (docs/dcp.md, 'Pipeline parallelism')"
        )
    differ = diverged(replicas)
    return storage, plan, sent[0]["id"], differ, diverged_parameters(replicas, differ)


def _take_from_others(plan: SavePlan, sent: list[Any]) -> None:
    """Rank 0: the plain values other ranks store, and the DCP object paths of what they store.

    Both are entries rank 0 writes (:data:`VALUES_ENTRY`, :data:`DCP_ITEMS_ENTRY`).
    """
    values = {k: v for d in sent[1:] for k, v in d.get("values", {}).items()}
    paths = {k: tuple(p) for d in sent[1:] for k, p in d.get("paths", {}).items()}
    if not values and not paths:
        return
    entries = {e.name: e for e in plan.entries}
    if values:
        mine = entries[VALUES_ENTRY].value if VALUES_ENTRY in entries else {}
        entries[VALUES_ENTRY] = _global(VALUES_ENTRY, {**mine, **values})
    # Values have an item record beside them (readers would otherwise guess which are lists).
    items = entries.get(DCP_ITEMS_ENTRY)
    known = dict(read_dcp_items(items.value) or {}) if items is not None else {}
    items_value = dcp_items_value({**paths, **known}.values())
    entries[DCP_ITEMS_ENTRY] = _global(DCP_ITEMS_ENTRY, items_value)
    plan.entries = list(entries.values())


def _global(name: str, value: Any) -> PlannedEntry:
    return PlannedEntry(name, value, "pck:json/1", "global", None)


def _publish_everywhere(
    publisher: Any, comm: Comm, storage: Storage, attempt_id: str, text: str, step: int
) -> None:
    """Every node root gets the record; a node that cannot take it fails the save on every rank.

    A full or read-only node disk failed one rank alone while the others went on to their next
    collective, and every later save of the group timed out.
    """
    comm.all_gather_step(
        "save/publish",
        lambda: (publisher.after_commit(comm, storage, attempt_id, text), None),
        what=f"save of step {step} (the commit record on every node root)",
        outcome=f"{attempt_id} is committed on some node roots only",
    )


def _contract_of(
    opts: SaveOptions, rank: int, differ: list[str], weights: list[str]
) -> SaveOptions:
    """``opts`` with contract ``statistical`` when plain tensors differ between ranks.

    One copy of a plain tensor is stored: an exact continuation would be a false claim
    (BatchNorm statistics under FSDP2, which does not synchronise buffers). Said by rank 0.
    Unless the caller asked for ``statistical``, a module's parameters that differ (``weights``)
    refuse the save on every rank: the other ranks' weights would be lost (MoE review E2:
    experts keyed by local index, 75 % of them gone with one line on stderr).
    """
    if not differ or opts.continuation != "exact":
        return opts
    if weights:
        shown = ", ".join(repr(k) for k in weights[:5]) + (", ..." if len(weights) > 5 else "")
        raise MetadataConflictError(
            f"save of step {opts.step}: model parameters that are plain tensors differ between "
            f"ranks ({len(weights)}: {shown}): one copy is stored of a key every rank holds, "
            "so the other ranks' weights would be lost. Nothing was saved. Experts keyed by "
            "local index (the same keys on every rank) look so: key them by global expert id, "
            "or stack them into a DTensor (docs/torch.md, 'Mixture of experts'). Pipeline "
            "stages with stage-local names (layers.0 on every stage): save through DCP with "
            "whole-model names (docs/dcp.md, 'Pipeline parallelism'). Replicated "
            "parameters that drifted apart (gradients not all-reduced alike): make them equal. "
            "Parameters that differ by design (local SGD between synchronisations): pass "
            "continuation='statistical' to store rank 0's copy"
        )
    if rank == 0:
        shown = ", ".join(repr(k) for k in differ[:5]) + (", ..." if len(differ) > 5 else "")
        msg = (
            f"save of step {opts.step}: plain tensors, values or global entries differ between "
            f"ranks ({len(differ)}: {shown}); one copy is stored (rank 0's, or that of the "
            "lowest rank that holds it) and the version's contract "
            "is 'statistical' (an exact continuation is impossible); the other ranks' values are "
            "NOT stored. Keep them equal (SyncBatchNorm, an all-reduce), make tensors DTensors, "
            "and keep what is each rank's own in a per-rank entry (DataPosition, or a StateEntry "
            "of your own with scope = 'per_rank'). Weights that differ by rank (experts keyed "
            "by local index) are lost so: docs/torch.md, 'Mixture of experts'"
        )
        _log.warning("%s", msg)
        say(msg)
    return dataclasses.replace(opts, continuation="statistical")


_WARNED_NO_RNG: list[bool] = []


def _warn_exact_without_rng(opts: SaveOptions, rank: int, plan: SavePlan) -> None:
    """Say once per process (rank 0) that an ``exact`` version holds no RNG state.

    ``exact`` is the default; dropout, shuffling and augmentation draw from generators the
    version would not hold, and the resumed job diverged without a word (continuation review
    F3). A job that draws no random numbers may ignore it.
    """
    if rank != 0 or opts.continuation != "exact" or _WARNED_NO_RNG:
        return
    if any(e.schema == RNGState.schema for e in plan.entries):
        return
    _WARNED_NO_RNG.append(True)
    msg = (
        f"save of step {opts.step}: the version's contract is 'exact' but the state holds no "
        "RNGState(): if training draws random numbers (dropout, shuffling, augmentation), the "
        "resumed job draws others. Add \"rng\": RNGState() to the state (and a GeneratorState "
        "for each torch or NumPy generator of your own), or pass continuation='statistical' "
        "(also for a state that is no training run to continue: weights to evaluate, an "
        "adapter, an EMA snapshot). Said once per process"
    )
    _log.warning("%s", msg)
    say(msg)


class RankWrite:
    """A rank's write phase: its pieces and entries through its own ShardWriter (this process).

    Subclasses write elsewhere by overriding :meth:`write_index` and :meth:`abort`.
    """

    def __init__(
        self, storage: Storage, attempt_id: str, comm: Comm, plan: SavePlan, opts: SaveOptions
    ) -> None:
        self.storage, self.attempt_id, self.plan, self.opts = storage, attempt_id, plan, opts
        self.rank, self.world, self.comm = comm.rank, comm.world_size, comm
        self.writer: ShardWriter | None = None
        #: Rank 0's own index: the committer is this process, so it is kept in memory.
        self.own_index: WriterIndex | None = None

    def __call__(self) -> tuple[int, Any]:
        """Write; return the bytes written and the writer index (JSON) for the committer."""
        if self.opts.publisher is not None:
            return self._write_node_local(self.opts.publisher)
        try:
            return self.write_transport()
        finally:
            self.plan.release()  # staged views and live references

    def write_transport(self) -> tuple[int, dict[str, Any]]:
        """Write the plan; return the bytes written and the index in its transport form.

        Rank 0 (the committer) sends ``{"own": True}`` instead and keeps its index: encoding
        it, sending it to itself, decoding and re-validating what its own writer built cost
        about a third of a many-tensor save (issue 13); the commit record made from it is
        still parsed as a reader parses it before it is published (R-COMMIT-4).
        """
        written, index = self.write_index()
        if self.rank == 0:
            self.own_index = index
            return written, {"own": True}
        return written, index.to_transport()

    def commit(self, transports: list[Any], **kwargs: Any) -> int:
        """Rank 0: check every writer's index (transport form) and publish; return the bytes."""
        indexes = [
            self.own_index if i == 0 and self.own_index is not None and d == {"own": True}
            else WriterIndex.from_transport(d)
            for i, d in enumerate(transports)
        ]
        manifest = commit(self.storage, self.attempt_id, indexes=indexes, **kwargs)
        return files_bytes(manifest.files)

    def _write_node_local(self, publisher: Any) -> tuple[int, Any]:
        """Write, agree that every rank wrote, then exchange files between the nodes.

        The exchange is point to point: a rank whose own write failed (a full node disk) and
        left it would leave its peers blocked until the collective timeout, and the group
        broken for every later save, durable ones included.
        """

        def write() -> tuple[tuple[int, WriterIndex], None]:
            try:
                return self.write_index(), None
            finally:
                self.plan.release()  # staged views and live references

        (written, index), _ = self.comm.all_gather_step(
            "save/written", write, what=f"save of step {self.opts.step} (write)",
            outcome=NOTHING_PUBLISHED,
        )
        placed = publisher.after_write(self.comm, self.storage, self.attempt_id, index)
        return written, {"index": index.to_transport(), "placed": placed}

    def write_index(self) -> tuple[int, WriterIndex]:
        """Write the plan; return the bytes written and this writer's index."""
        options = self.opts.writer_options(len(self.plan.pieces), self.world)
        writer = self.writer = ShardWriter(self.storage, self.attempt_id, self.rank, **options)
        self._write(writer)
        index = writer.finish()  # before reading the count: finish() writes the last bytes
        return writer.stats.bytes_written, index

    def _write(self, writer: ShardWriter) -> None:
        for p in self.plan.pieces:
            if p.array is None:
                writer.declare_tensor(p.key, p.dtype, p.global_shape)
            else:
                writer.add_tensor(p.key, p.array, offsets=p.offsets, global_shape=p.global_shape)
        for e in self.plan.entries:
            writer.add_entry(
                e.name,
                e.value,
                e.schema,
                scope=e.scope,
                rank=self.rank if e.scope == "per_rank" else None,
                world_size_policy=e.policy,
            )

    def abort(self) -> None:
        """Remove what this rank wrote (the save is known to have failed everywhere)."""
        if self.writer is not None:
            self.writer.abort(dirs=True)


def _commit(
    write: RankWrite, world: int, plan: SavePlan, opts: SaveOptions, transports: list[Any]
) -> Any:
    """Rank 0: publish the version from every writer's index; return its total size.

    With a publisher: ``{"bytes", "manifest"}`` (the record every node root gets).
    """
    storage, attempt_id = write.storage, write.attempt_id
    kwargs: dict[str, Any] = {
        "step": opts.step,
        "expected_writers": list(range(world)),
        "continuation": Continuation(contract=opts.continuation, world_size=world, mesh=plan.mesh),
    }
    if opts.publisher is not None:
        indexes = [WriterIndex.from_transport(d["index"]) for d in transports]
        manifest, text = opts.publisher.commit(  # JSON tensors: a table file would be on
            storage, attempt_id, [d["placed"] for d in transports], indexes=indexes,  # node 0
            tensor_table=False, **kwargs,
        )
        return {"bytes": files_bytes(manifest.files), "manifest": text}
    return write.commit(transports, **kwargs)


# -- the public function ---------------------------------------------------------------------------


def save(
    state_dict: Mapping[str, Any], root: Root, **options: Unpack[SaveKeywords]
) -> CheckpointInfo:
    """Save ``state_dict`` as one new version under ``root`` (a collective over the group).

    Every rank of the group calls this with its own state. Plain tensors must be identical on
    every rank (rank 0 writes them); DTensors are written shard by shard by the owning ranks.

    Args:
        state_dict: Nested dict of tensors, DTensors, JSON scalars, lists, objects with
            ``state_dict()``/``load_state_dict()`` and :mod:`portable_ckpt.torch.state` helpers.
        root: Checkpoint root (local path, ``s3://...`` or a :class:`Storage`).
        **options: ``step`` (required) and the other keyword arguments of
            :class:`SaveOptions`: ``process_group``, ``continuation``, ``codec``, ``timeout``,
            ``block_size``, ``max_file_bytes``, ``if_busy``, ``tensor_table``.

    Returns:
        :class:`CheckpointInfo` on every rank once the version is committed.

    Raises:
        CheckpointError: on every rank when any rank fails; nothing is published.

    """
    # No full collection of the training heap mid-save (portable_ckpt._gc); run_save pauses
    # again, ending before it takes the save's seconds.
    with paused_gc():
        opts = SaveOptions.of("save", options)
        wait_idle(opts.if_busy)
        t0 = time.perf_counter()
        comm = make_comm(opts.process_group, opts.timeout)
        prepared = prepare(state_dict, root, comm, copy=False, step=opts.step)
    return run_save(prepared, comm, opts, t_start=t0, blocking=0.0)
