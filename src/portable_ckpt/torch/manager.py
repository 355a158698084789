"""CheckpointManager: when to save, what to keep, where, resume, preemption and telemetry.

The torch binding of :mod:`portable_ckpt.manager` (whose policy code needs no torch). Every rank
of the job creates one manager with the same arguments and calls it at the same points::

    mgr = CheckpointManager("/ckpts/run1", save_every=500, keep_last=3, async_save=True)
    state = {"train": ModelOptimizerState(model, optim), "sched": sched, "rng": RNGState()}
    info = mgr.restore(state)                  # None on the first run: start from scratch
    start = info.step + 1 if info else 1
    for step in range(start, total + 1):
        loss = train_step()
        mgr.maybe_save(step, state, metrics={"loss": loss})
        if mgr.preempted:                      # SIGTERM: the step was saved synchronously
            break
    mgr.close()                                # finishes a pending async save

Phases of one ``maybe_save``: **agree** (one max-reduction of two integers on the manager's own
gloo group: rank 0's policy decision and every rank's preemption flag), **save** (collective
:func:`~portable_ckpt.torch.save` or :func:`~portable_ckpt.torch.async_save`, whose metadata
travels on its own side group), then **after the commit**, on a background thread of each rank:
telemetry, and on rank 0 sampled verification, retention and replication to the durable root.
Stateful values of ``state`` (anything with ``state_dict()``/``load_state_dict()``) are asked for
their state at the moment of each save, so nothing stale is ever saved.
"""

from __future__ import annotations

import concurrent.futures as cf
import datetime as _dt
import logging
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from portable_ckpt.errors import (
    CheckpointError,
    ContractError,
    DistributedError,
    EntryMissingError,
    FileMissingError,
    TensorMissingError,
    UnsupportedValueError,
    UsageError,
)
from portable_ckpt.format.vocab import CONTRACTS
from portable_ckpt.io.versions import list_versions, timestamp_key
from portable_ckpt.manager.decisions import Decision, SavePolicy, decide
from portable_ckpt.manager.records import (
    MANAGER_ENTRY,
    candidates_of,
    manager_entry_schema,
    manager_entry_value,
    placement_entry_schema,
)
from portable_ckpt.manager.retention import RetentionPolicy, plan_retention
from portable_ckpt.manager.telemetry import Telemetry
from portable_ckpt.manager.tiers import PLACEMENT_ENTRY, NodeLayout
from portable_ckpt.storage import Storage, open_storage
from portable_ckpt.torch._collectives import make_comm
from portable_ckpt.torch._inflight import at_interpreter_exit
from portable_ckpt.torch._nodelocal import NodeLocalPublisher, prepare_fast_restore
from portable_ckpt.torch.async_saving import AsyncSaveHandle, async_save
from portable_ckpt.torch.flatten import StateEntry
from portable_ckpt.torch.info import CheckpointInfo, LoadInfo
from portable_ckpt.torch.loading import load
from portable_ckpt.torch.saving import save

__all__ = ["CheckpointManager", "ModelOptimizerState"]

_log = logging.getLogger("portable_ckpt")
_MIB = float(1 << 20)
#: Errors of the caller's target state: every version would fail the same way (no fallback).
_CALLER_ERRORS = (
    ContractError,
    UsageError,
    TensorMissingError,
    EntryMissingError,
    UnsupportedValueError,
)


class ModelOptimizerState:
    """A Stateful view of an FSDP2 (or plain) model and its optimizer, read at call time.

    ``state_dict()`` calls ``get_state_dict(model, optimizer)`` every time it is asked, so a
    manager always saves the live values (learning rates included); ``load_state_dict()`` hands
    the loaded dicts to ``set_state_dict``. Put it in the manager's state instead of dicts
    obtained from ``get_state_dict`` once (which go stale: see docs/torch.md).
    """

    def __init__(self, model: torch.nn.Module, optimizer: Any = None, *, options: Any = None):
        self.model = model
        self.optimizer = optimizer
        self.options = options

    def state_dict(self) -> dict[str, Any]:
        """``{"model": ..., "optim": ...}`` from ``get_state_dict`` (now)."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if self.optimizer is None:
            return {"model": get_model_state_dict(self.model, options=self.options)}
        msd, osd = get_state_dict(self.model, self.optimizer, options=self.options)
        return {"model": msd, "optim": osd}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Apply loaded dicts with ``set_state_dict``."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        if self.optimizer is None:
            set_model_state_dict(self.model, state["model"], options=self.options)
            return
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=self.options,
        )


class _ManagerEntry(StateEntry):
    """The ``pck.manager`` entry (step, reason, metrics) of one save."""

    scope = "global"

    def __init__(self, value: dict[str, Any], schema: dict[str, Any] | None = None) -> None:
        self.schema = schema or manager_entry_schema()  # type: ignore[assignment]
        self.value = value

    def capture(self) -> Any:
        return self.value

    def restore(self, value: Any) -> None:  # pragma: no cover - never loaded into a state
        self.value = value


@dataclass
class _Tier:
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


def _storage_url(root: str | os.PathLike[str]) -> str:
    text = os.fspath(root)
    return (
        text
        if "://" in text and not text.startswith("file://")
        else os.path.abspath(text.removeprefix("file://"))
    )


def _fallback(tier: str, ident: str, e: CheckpointError) -> dict[str, Any]:
    """A restore candidate that failed, as telemetry reports it."""
    return {"tier": tier, "checkpoint_id": ident, "code": e.code, "message": e.message[:500]}


def _warn_stale(state: Mapping[str, Any], warned: set[str]) -> None:
    """The stale-state trap: an optimizer state dict taken once is a snapshot (issue 14)."""
    for key, value in state.items():
        if isinstance(value, Mapping) and "param_groups" in value and key not in warned:
            warned.add(key)
            _log.warning(
                "state[%r] is an optimizer state dict: a snapshot whose learning rates and "
                "hyper-parameters go stale as training continues. Pass the live objects instead, "
                "e.g. state = {'train': ModelOptimizerState(model, optimizer)}",
                key,
            )


class CheckpointManager:
    """The whole checkpoint life of a training loop (see the module docstring).

    Args:
        root: The durable root (local path or ``s3://``).
        save_every: Durable save every N steps.
        save_every_seconds: Durable save once S seconds passed since the previous save started
            (rank 0's clock decides, every rank follows).
        save_steps: Steps always saved durably.
        keep_last: Keep the N newest durable versions.
        keep_every: Keep durable versions whose step is a multiple of M forever.
        keep_best: ``(metric, n, "min"|"max")``: keep the n best by a metric of ``maybe_save``.
        async_save: Save in the background (the loop blocks only while the state is staged).
        continuation: ``"exact"`` or ``"statistical"`` (recorded in every version).
        fast_root: A fast tier (local disk, tmpfs, fast shared file system).
        fast_every: Save to the fast tier every N steps.
        fast_keep: Versions kept on the fast tier.
        fast_replicas: With a node-local fast tier, also keep each node's files on the next
            node (0 or 1), so losing one node still restores from the fast tier.
        ranks_per_node: Consecutive ranks per node (default: ``LOCAL_WORLD_SIZE`` as torchrun
            sets it, else one node). With several nodes the fast tier is node-local: ``{node}``
            in ``fast_root`` is replaced by the node index, every rank touches only its node's
            root, and the version records which node holds what (``pck.placement``).
        replicate: Write durable saves to the fast tier and copy them to ``root`` in the
            background (verified, manifest last), instead of writing ``root`` directly.
        verify_sample: After each commit re-read this fraction of the chunks (rank 0); a version
            that fails is marked (a verification record) and never restored.
        events: Telemetry sink: JSON lines, or a Prometheus textfile when it ends in ``.prom``;
            ``{rank}`` in it gives every rank its own file (otherwise rank 0 writes).
        process_group: The group (default: the default group).
        timeout: Seconds a collective may wait for peers.
        handle_sigterm: Install a SIGTERM handler (main thread only) that sets ``preempted``.
        grace_seconds: Age after which retention's gc removes abandoned attempts.
        codec: Chunk codec of every save (``"none"`` or ``"zstd"``).

    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        save_every: int | None = None,
        save_every_seconds: float | None = None,
        save_steps: Sequence[int] = (),
        keep_last: int | None = None,
        keep_every: int | None = None,
        keep_best: Any = None,
        async_save: bool = True,
        continuation: str = "exact",
        fast_root: str | os.PathLike[str] | None = None,
        fast_every: int | None = None,
        fast_keep: int = 2,
        fast_replicas: int = 0,
        ranks_per_node: int | None = None,
        replicate: bool = False,
        verify_sample: float = 0.0,
        events: str | os.PathLike[str] | None = None,
        process_group: Any = None,
        timeout: float | None = None,
        handle_sigterm: bool = True,
        grace_seconds: float = 3600.0,
        codec: str = "none",
    ) -> None:
        self.policy = SavePolicy.build(
            save_every=save_every,
            save_every_seconds=save_every_seconds,
            save_steps=save_steps,
            fast_every=fast_every,
        )
        if continuation not in CONTRACTS:
            raise UsageError(f"continuation must be 'exact' or 'statistical', got {continuation!r}")
        if not 0.0 <= float(verify_sample) <= 1.0:
            raise UsageError(f"verify_sample must be a fraction in [0, 1], got {verify_sample!r}")
        if replicate and fast_root is None:
            raise UsageError("replicate=True needs fast_root= (the tier durable saves go to first)")
        self.async_save = bool(async_save)
        self.codec = codec
        self.continuation = continuation
        self.verify_sample = float(verify_sample)
        self.replicate = bool(replicate)
        self.timeout = timeout
        self.grace_seconds = float(grace_seconds)
        self.process_group = process_group
        self._group, self.rank, self.world_size = self._make_group(process_group, timeout)
        durable = _storage_url(root)
        self.tiers: dict[str, _Tier] = {
            "durable": _Tier(
                "durable",
                durable,
                open_storage(durable, create=True),
                RetentionPolicy.build(
                    keep_last=keep_last, keep_every=keep_every, keep_best=keep_best
                ),
            )
        }
        if fast_root is not None:
            self.tiers["fast"] = self._fast_tier(
                fast_root, durable, fast_keep, fast_replicas, ranks_per_node
            )
        self.telemetry = Telemetry(events, self.rank)
        self.preempted = False
        self.last_error: BaseException | None = None
        self._signal_seen = threading.Event()
        self._last_save_step: int | None = None
        self._last_save_time = time.time()
        self._pending: AsyncSaveHandle | None = None
        self._post: list[cf.Future[None]] = []
        self._copies: list[cf.Future[Any]] = []
        self._bg = cf.ThreadPoolExecutor(1, thread_name_prefix="pck-manager")
        self._restored_at: float | None = None
        self._fetched: dict[str, Any] | None = None
        self._warned: set[str] = set()
        self._closed = False
        self._prev_handler: Any = None
        if handle_sigterm and threading.current_thread() is threading.main_thread():
            self._prev_handler = signal.signal(signal.SIGTERM, self._on_signal)
        _register_exit(self)

    # -- setup -------------------------------------------------------------------------------

    def _fast_tier(
        self,
        fast_root: str | os.PathLike[str],
        durable: str,
        keep: int,
        replicas: int,
        ranks_per_node: int | None,
    ) -> _Tier:
        per_node = ranks_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size))
        layout = NodeLayout.contiguous(self.world_size, per_node, replicas)
        node = layout.node_of_rank[self.rank]
        fast = _storage_url(os.fspath(fast_root).replace("{node}", str(node)))
        if fast == durable:
            raise UsageError("fast_root must differ from root")
        if layout.nodes > 1 and self.replicate:
            raise UsageError("replicate=True needs a fast tier every rank reaches (one node)")
        retention = RetentionPolicy.build(keep_last=keep)
        storage = open_storage(fast, create=True)
        return _Tier("fast", fast, storage, retention, layout if layout.nodes > 1 else None)

    @staticmethod
    def _make_group(process_group: Any, timeout: float | None) -> tuple[Any, int, int]:
        """The manager's own gloo group: decisions never interleave with a save's collectives."""
        if not (dist.is_available() and dist.is_initialized()):
            return None, 0, 1
        pg = process_group if process_group is not None else dist.group.WORLD
        ranks = [int(r) for r in dist.get_process_group_ranks(pg)]
        rank = dist.get_rank(pg)
        if len(ranks) == 1:
            return None, 0, 1
        t = _dt.timedelta(seconds=timeout) if timeout is not None else None
        kwargs: dict[str, Any] = {"timeout": t} if t is not None else {}
        group = dist.new_group(ranks=ranks, backend="gloo", **kwargs)
        return group, rank, len(ranks)

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Only set a flag here: logging or collectives inside a signal handler can deadlock.
        self._signal_seen.set()

    # -- decisions ---------------------------------------------------------------------------

    def _agree(self, step: int, forced: Decision | None = None) -> Decision:
        """Rank 0's decision and every rank's preemption flag, combined by one max-reduction."""
        mine = Decision("none")
        if self.rank == 0:
            mine = forced or decide(
                self.policy,
                step,
                now=time.time(),
                last_save_time=self._last_save_time,
                last_save_step=self._last_save_step,
                has_fast="fast" in self.tiers,
            )
        flags = torch.tensor([mine.encode(), int(self._signal_seen.is_set())], dtype=torch.int64)
        if self._group is not None:
            try:
                work = dist.all_reduce(
                    flags, op=dist.ReduceOp.MAX, group=self._group, async_op=True
                )
                work.wait()
            except Exception as e:
                raise DistributedError(
                    f"rank {self.rank}: the save decision for step {step} could not be agreed "
                    f"({e}); a peer rank died or stopped calling maybe_save"
                ) from e
        decision = Decision.decode(int(flags[0]))
        if int(flags[1]) and not self.preempted:
            self.preempted = True
            self.telemetry.emit("preempted", step=step, signal="SIGTERM")
        if self.preempted and forced is None:
            pre = decide(
                self.policy,
                step,
                now=0.0,
                last_save_time=None,
                last_save_step=self._last_save_step,
                has_fast=False,
                preempted=True,
            )
            decision = pre if pre.saves else decision
        return decision

    # -- saving ------------------------------------------------------------------------------

    def maybe_save(
        self, step: int, state: Mapping[str, Any], metrics: Mapping[str, Any] | None = None
    ) -> bool:
        """Save ``state`` at ``step`` when the policy (or a preemption) says so.

        Every rank calls this at every step. Returns True when a save was started (finished,
        for a preemption save). After a SIGTERM, ``preempted`` is true on every rank and the
        save is synchronous, so the loop can exit right after.
        """
        self._check_open()
        self.mark_resumed()
        decision = self._agree(step)
        if not decision.saves:
            return False
        self._save(step, state, metrics, decision)
        return True

    def save(
        self, step: int, state: Mapping[str, Any], metrics: Mapping[str, Any] | None = None
    ) -> None:
        """Save ``state`` at ``step`` durably, whatever the policy says (a collective)."""
        self._check_open()
        self.mark_resumed()
        self._save(step, state, metrics, self._agree(step, Decision("durable", "requested")))

    def _target(self, decision: Decision) -> _Tier:
        if decision.tier == "fast" or (self.replicate and decision.reason != "preemption"):
            return self.tiers["fast"]
        return self.tiers["durable"]

    def _save(
        self,
        step: int,
        state: Mapping[str, Any],
        metrics: Mapping[str, Any] | None,
        decision: Decision,
    ) -> None:
        for reserved in (MANAGER_ENTRY, PLACEMENT_ENTRY):
            if reserved in state:
                raise UsageError(f"the state key {reserved!r} is reserved for the manager")
        _warn_stale(state, self._warned)
        tier = self._target(decision)
        full = {
            **state,
            MANAGER_ENTRY: _ManagerEntry(manager_entry_value(step, decision.reason, metrics)),
        }
        if tier.layout is not None:
            full[PLACEMENT_ENTRY] = _ManagerEntry(tier.layout.to_json(), placement_entry_schema())
        self._last_save_step = step
        self._last_save_time = time.time()
        sync = decision.sync or not self.async_save
        if sync:
            self._settle_pending()
        t0 = time.perf_counter()
        kwargs: dict[str, Any] = {
            "step": step,
            "process_group": self.process_group,
            "continuation": self.continuation,
            "timeout": self.timeout,
            "codec": self.codec,
        }
        if tier.layout is not None:
            kwargs["publisher"] = NodeLocalPublisher(tier.layout)
        if sync:
            try:
                info = save(full, tier.storage, **kwargs)
            except CheckpointError as e:
                self._after_failure(step, tier, decision, e)
                raise
            handle: AsyncSaveHandle | None = None
            pause = time.perf_counter() - t0
        else:
            handle = async_save(full, tier.storage, **kwargs)
            self._pending = handle
            pause = time.perf_counter() - t0
            info = None
        fut = self._bg.submit(self._after_save, step, tier, decision, handle, info, pause)
        self._post.append(fut)
        if sync:
            fut.result()  # a preemption save is verified and replicated before the loop exits

    def _settle_pending(self) -> None:
        """Wait for the in-flight async save (its failure was already reported)."""
        h, self._pending = self._pending, None
        if h is not None:
            try:
                h.committed.result()
            except BaseException:
                pass

    # -- after a commit (background thread) --------------------------------------------------

    def _after_save(
        self,
        step: int,
        tier: _Tier,
        decision: Decision,
        handle: AsyncSaveHandle | None,
        info: CheckpointInfo | None,
        pause: float,
    ) -> None:
        if handle is not None:
            try:
                info = handle.committed.result()
            except CheckpointError as e:
                self._after_failure(step, tier, decision, e)
                return
            except BaseException as e:  # pragma: no cover - non-checkpoint failure
                self._after_failure(step, tier, decision, DistributedError(str(e)))
                return
        if info is None:  # pragma: no cover - guarded by the callers
            return
        mib_s = info.bytes_written / _MIB / info.seconds if info.seconds > 0 else 0.0
        self.telemetry.emit(
            "save",
            tier=tier.name,
            step=step,
            checkpoint_id=info.checkpoint_id,
            reason=decision.reason,
            mode="sync" if handle is None else "async",
            pause_s=round(pause, 6),
            seconds=round(info.seconds, 6),
            bytes=info.bytes_written,
            total_bytes=info.total_bytes,
            mib_per_s=round(mib_s, 6),
        )
        if tier.layout is not None:
            if tier.leads(self.rank):
                self._retain(tier)  # each node's leader keeps its own node root
            if self.rank != 0:
                return
        elif self.rank != 0:
            return
        self.telemetry.emit(
            "commit",
            tier=tier.name,
            step=step,
            checkpoint_id=info.checkpoint_id,
            ok=True,
            expected_writers=info.world_size,
            reported_writers=info.world_size,
            code=None,
        )
        if tier.layout is not None:
            return  # node-local: no single rank can read the whole version
        bad = self._verify(tier, info.checkpoint_id) is False
        if tier.name == "fast" and self.replicate and decision.tier == "durable" and not bad:
            self._replicate(tier, info.checkpoint_id)
        self._retain(tier)

    def _after_failure(
        self, step: int, tier: _Tier, decision: Decision, e: CheckpointError
    ) -> None:
        self.last_error = e
        _log.error("checkpoint of step %d to the %s tier failed: %s", step, tier.name, e)
        failed = getattr(e, "failed_ranks", None) or None
        self.telemetry.emit(
            "commit",
            tier=tier.name,
            step=step,
            ok=False,
            expected_writers=self.world_size,
            reported_writers=None if failed is None else self.world_size - len(failed),
            failed_ranks=failed,
            code=e.code,
            message=e.message[:2000],
            reason=decision.reason,
        )
        # A failed save keeps every older version: retention does not run.

    def _verify(self, tier: _Tier, attempt: str) -> bool | None:
        """Sampled verification of a fresh version on rank 0; records the result beside it."""
        if self.verify_sample <= 0:
            return None
        import portable_ckpt
        from portable_ckpt.io.versions import write_verification_record

        seed = int.from_bytes(os.urandom(4), "big")
        try:
            ck = portable_ckpt.open(f"{tier.root.rstrip('/')}/{attempt}")
            chunks = sum(len(t.ranges) for t in ck.tensors.values())
            errors = ck.verify(sample=self.verify_sample, seed=seed)
        except CheckpointError as e:
            chunks, errors = 0, [e]
        ok = not errors
        n = min(chunks, max(1, -(-int(chunks * self.verify_sample * 1e6) // 1_000_000)))
        try:
            write_verification_record(
                tier.storage,
                attempt,
                ok=ok,
                mode="sample",
                fraction=self.verify_sample,
                chunks=n if chunks else 0,
                seed=seed,
                errors=[x.to_json() for x in errors[:64]],
                verifier="portable_ckpt CheckpointManager",
            )
        except CheckpointError as e:
            _log.error("cannot record the verification of %s: %s", attempt, e)
        self.telemetry.emit(
            "verify",
            tier=tier.name,
            checkpoint_id=attempt,
            fraction=self.verify_sample,
            chunks=n if chunks else 0,
            ok=ok,
            errors=[x.to_json() for x in errors[:8]],
        )
        if not ok:
            _log.error("version %s failed sampled verification: %s", attempt, errors[0])
        return ok

    def _replicate(self, tier: _Tier, attempt: str) -> None:
        from portable_ckpt.io.copy import copy_version_async

        durable = self.tiers["durable"]
        fut = copy_version_async(f"{tier.root.rstrip('/')}/{attempt}", durable.root)
        self._copies.append(fut)

        def done(f: cf.Future[Any]) -> None:
            try:
                res = f.result()
            except BaseException as e:
                self.last_error = e
                self.telemetry.emit(
                    "replicate",
                    tier="durable",
                    checkpoint_id=attempt,
                    ok=False,
                    code=getattr(e, "code", "PCK-STORAGE"),
                    message=str(e)[:2000],
                )
                return
            self.telemetry.emit(
                "replicate",
                tier="durable",
                checkpoint_id=attempt,
                ok=True,
                bytes=res.bytes,
                seconds=round(res.seconds, 6),
                mib_per_s=round(res.mib_per_s, 3),
            )
            self._bg.submit(self._retain, durable)
            self._bg.submit(self._retain, tier)  # the fast tier, now that the copy is done

        fut.add_done_callback(done)

    def _retain(self, tier: _Tier) -> None:
        """Apply the tier's retention policy with the core gc (rank 0, background thread)."""
        from portable_ckpt.io.versions import gc

        if not tier.retention.active:
            return
        if tier.name == "fast" and any(not c.done() for c in self._copies):
            return  # a version being replicated is never deleted under the copy
        try:
            decisions = plan_retention(candidates_of(tier.storage), tier.retention)
            keep = [d.id for d in decisions if not d.delete]
            report = gc(tier.storage, keep=1, keep_ids=keep, grace_seconds=self.grace_seconds)
        except CheckpointError as e:
            _log.error("retention on the %s tier failed: %s", tier.name, e)
            self.telemetry.emit(
                "retention", tier=tier.name, ok=False, code=e.code, message=e.message[:2000]
            )
            return
        why = {d.id: d.reasons for d in decisions}
        self.telemetry.emit(
            "retention",
            tier=tier.name,
            ok=True,
            policy=tier.retention.describe(),
            deleted=[{"id": i, "reasons": why.get(i, ["gc"])} for i in report.deleted],
            deleted_count=len(report.deleted),
            abandoned=report.abandoned,
            kept=[{"id": d.id, "reasons": d.reasons} for d in decisions if not d.delete],
        )

    # -- restore -----------------------------------------------------------------------------

    def _listing(self, name: str, step: int | None) -> list[list[Any]]:
        """``[step, committed_at, id]`` of this rank's view of a tier: restorable versions."""
        tier = self.tiers[name]
        try:
            versions = list_versions(tier.storage)
        except CheckpointError as e:
            _log.warning("cannot list the %s tier %s: %s", name, tier.root, e)
            return []
        return [
            [v.step, v.committed_at, v.id]
            for v in versions
            if v.status == "committed"
            and not v.verification_failed
            and (step is None or v.step == step)
        ]

    def _candidates(self, step: int | None) -> list[tuple[str, str]]:
        """``(tier, attempt id)`` newest first over both tiers (fast first on ties), everywhere.

        A node-local fast tier is listed by every rank (its own node root): a version any node
        holds is a candidate; whether every rank can reach its bytes is settled when it is tried.
        """
        found: dict[tuple[str, str], tuple[int, tuple[int, int], int]] = {}
        fast = self.tiers.get("fast")
        views: list[tuple[int, str, list[list[Any]]]] = []
        if fast is not None and fast.layout is not None:
            comm = make_comm(self.process_group, self.timeout)
            for seen in comm.allgather_json(self._listing("fast", step), "restore/fast-list"):
                views.append((1, "fast", seen))
        elif fast is not None and self.rank == 0:
            views.append((1, "fast", self._listing("fast", step)))
        if self.rank == 0:
            views.append((0, "durable", self._listing("durable", step)))
        for order, name, listing in views:
            for v_step, committed_at, ident in listing:
                found[(name, ident)] = (int(v_step), timestamp_key(committed_at), order)
        ranked = sorted(found.items(), key=lambda kv: kv[1], reverse=True)
        local = [(name, ident) for (name, ident), _ in ranked]
        return [tuple(c) for c in self._broadcast(local if self.rank == 0 else None)]

    def _broadcast(self, obj: Any) -> Any:
        """Rank 0's JSON value on every rank (the manager's group)."""
        import json

        if self._group is None:
            return obj
        data = json.dumps(obj).encode() if self.rank == 0 else b""
        size = torch.tensor([len(data)], dtype=torch.int64)
        src = dist.get_global_rank(self._group, 0)
        dist.broadcast(size, src=src, group=self._group)
        buf = torch.zeros(int(size.item()), dtype=torch.uint8)
        if self.rank == 0 and data:
            buf[:] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        dist.broadcast(buf, src=src, group=self._group)
        return json.loads(bytes(buf.numpy()))

    def _any(self, flag: bool) -> bool:
        t = torch.tensor([int(flag)], dtype=torch.int64)
        if self._group is not None:
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._group)
        return bool(int(t.item()))

    def restore(
        self,
        state: Mapping[str, Any],
        *,
        step: int | None = None,
        checkpoint: str | os.PathLike[str] | None = None,
        allow_statistical: bool = False,
        record_ranges: bool = False,
    ) -> LoadInfo | None:
        """Fill ``state`` from the newest committed, verified version over both tiers.

        Returns the :class:`LoadInfo`, or ``None`` when no tier holds a version (the first run
        of a job: start from scratch). A damaged, partial or missing fast-tier version falls back
        to the next candidate (the durable tier); errors of the target state itself (contract,
        shapes, missing keys) are raised at once. ``checkpoint`` restores one explicit version
        directory (e.g. a seed from another run) instead. ``record_ranges`` is passed to
        :func:`~portable_ckpt.torch.load`.
        """
        self._check_open()
        self._settle_pending()
        t0 = time.perf_counter()
        if checkpoint is not None:
            cands = [("explicit", os.fspath(checkpoint))]
        else:
            cands = self._candidates(step)
        fallbacks: list[dict[str, Any]] = []
        for tier_name, ident in cands:
            try:
                info = self._load_one(state, tier_name, ident, allow_statistical, record_ranges)
            except Exception as e:
                # Every rank takes part in this agreement, whatever it saw: one rank's damage
                # is its peers' PCK-DISTRIBUTED, and an error of the target state (contract,
                # shapes, keys) would repeat on every version, so it is raised everywhere.
                caller = not isinstance(e, CheckpointError) or isinstance(e, _CALLER_ERRORS)
                if self._any(caller) or not isinstance(e, CheckpointError):
                    raise
                fallbacks.append(_fallback(tier_name, ident, e))
                _log.warning(
                    "restore of %s from the %s tier failed (%s); trying the next candidate",
                    ident,
                    tier_name,
                    e,
                )
                continue
            self._after_restore(info, tier_name, t0, fallbacks)
            return info
        self.telemetry.emit(
            "restore",
            ok=not fallbacks,
            tier=None,
            step=None,
            seconds=round(time.perf_counter() - t0, 6),
            fallbacks=fallbacks,
            candidates=len(cands),
        )
        if fallbacks:
            raise DistributedError(
                f"no version could be restored: {len(fallbacks)} candidate(s) failed, last "
                f"{fallbacks[-1]['checkpoint_id']} ({fallbacks[-1]['code']}: "
                f"{fallbacks[-1]['message']})"
            )
        return None

    def _load_one(
        self,
        state: Mapping[str, Any],
        tier_name: str,
        ident: str,
        allow_statistical: bool,
        record_ranges: bool = False,
    ) -> LoadInfo:
        kwargs: dict[str, Any] = {
            "process_group": self.process_group,
            "allow_statistical": allow_statistical,
            "timeout": self.timeout,
            "record_ranges": record_ranges,
        }
        if tier_name == "explicit":
            return load(state, ident, **kwargs)  # a version directory
        tier = self.tiers[tier_name]
        if tier.layout is not None:
            self._reach_node_local(tier, state, ident)
        return load(state, tier.storage, checkpoint_id=ident, **kwargs)

    def _reach_node_local(self, tier: _Tier, state: Mapping[str, Any], ident: str) -> None:
        """Make the bytes every rank needs present in its node root, or raise (fallback)."""
        from portable_ckpt.format import jsonio

        if tier.layout is None:  # pragma: no cover - only called for node-local tiers
            return
        comm = make_comm(self.process_group, self.timeout)
        rel = f"{ident}/manifest.json"
        mine = None
        if tier.storage.exists(rel):
            raw = tier.storage.read_all(rel, max_size=jsonio.MAX_MANIFEST_BYTES)
            mine = raw.decode("utf-8")
        text = next((t for t in comm.allgather_json(mine, "restore/fast-manifest") if t), None)
        if text is None:
            raise FileMissingError(f"no node root of the fast tier holds {rel}", path=rel)
        usable, report = prepare_fast_restore(comm, tier.layout, tier.storage, ident, state, text)
        self._fetched = report
        if not usable:
            raise FileMissingError(
                f"fast tier version {ident}: {report['unreachable']} file(s) a rank needs are on "
                f"no reachable node root ({report['missing']} missing before fetching)",
                path=ident,
            )

    def _after_restore(
        self, info: LoadInfo, tier_name: str, t0: float, fallbacks: list[dict[str, Any]]
    ) -> None:
        self._last_save_step = info.step
        self._last_save_time = time.time()
        self._restored_at = time.perf_counter()
        per = info.per_rank or [info.counters()]
        slowest = max(range(len(per)), key=lambda r: float(per[r].get("seconds", 0.0)))
        total = sum(int(p.get("bytes_read", 0)) for p in per)
        seconds = time.perf_counter() - t0
        self.telemetry.emit(
            "restore",
            ok=True,
            tier=tier_name,
            step=info.step,
            checkpoint_id=info.checkpoint_id,
            contract=info.contract,
            seconds=round(seconds, 6),
            bytes=total,
            mib_per_s=round(total / _MIB / seconds, 3) if seconds > 0 else 0.0,
            slowest_rank=slowest,
            slowest_rank_seconds=round(float(per[slowest].get("seconds", 0.0)), 6),
            fallbacks=fallbacks,
            fetched_from_peers=self._fetched,
        )
        self._fetched = None

    def mark_resumed(self) -> None:
        """Tell the manager the first step after a restore completed (time to resume)."""
        if self._restored_at is None:
            return
        seconds = time.perf_counter() - self._restored_at
        self._restored_at = None
        self.telemetry.emit("resume", seconds=round(seconds, 6), step=self._last_save_step)

    # -- waiting and exit --------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the pending save, its post-commit work and replications; re-raise a failure.

        Raises the last failure of a background save (once) so the loop's end surfaces it.
        """
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        h = self._pending
        if h is not None:
            try:
                h.committed.result(left())
            except CheckpointError:
                pass  # reported by _after_save; re-raised below as last_error
            self._pending = None
        for fut in list(self._post):
            fut.result(left())
        for c in list(self._copies):
            try:
                c.result(left())
            except BaseException:
                pass
        for fut in list(self._post):  # retention queued after the copies
            fut.result(left())
        self._post = [f for f in self._post if not f.done()]
        err, self.last_error = self.last_error, None
        if err is not None:
            raise err

    def close(self, timeout: float | None = None) -> None:
        """Finish pending work (see :meth:`wait`), restore the signal handler, stop threads."""
        if self._closed:
            return
        try:
            self.wait(timeout)
        finally:
            self._closed = True
            self._bg.shutdown(wait=True)
            if self._prev_handler is not None:
                try:
                    signal.signal(signal.SIGTERM, self._prev_handler)
                except (ValueError, TypeError):  # pragma: no cover - not the main thread
                    pass
                self._prev_handler = None

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError("this CheckpointManager was closed")

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _at_exit(self) -> None:
        """Interpreter exit: finish a pending save, or say loudly that it was abandoned."""
        if self._closed:
            return
        h = self._pending
        try:
            self.close()
        except BaseException as e:
            step = h.step if h is not None else self._last_save_step
            self.telemetry.emit(
                "abandoned", step=step, code=getattr(e, "code", None), message=str(e)[:2000]
            )
            print(
                f"portable_ckpt: rank {self.rank}: the checkpoint of step {step} could not be "
                f"finished at exit and was ABANDONED: {e}. Its attempt stays incomplete (never "
                f"restored); the previous version remains the latest. Call mgr.close() before "
                f"destroy_process_group() and before the process exits.",
                file=sys.stderr,
                flush=True,
            )


_MANAGERS: weakref.WeakSet[CheckpointManager] = weakref.WeakSet()


def _finish_all_at_exit() -> None:
    for mgr in list(_MANAGERS):
        mgr._at_exit()


def _register_exit(mgr: CheckpointManager) -> None:
    """Finish the managers' pending work at interpreter exit (see ``_inflight``)."""
    _MANAGERS.add(mgr)
    at_interpreter_exit("checkpoint-managers", _finish_all_at_exit)
