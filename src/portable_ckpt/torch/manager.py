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

A failed background save does not stop training: rank 0 says so on stderr (``FAILED``), the
error waits in ``last_error`` (raised by ``wait()``/``close()``), and after ``max_failed_saves``
failed saves in a row (default 3) the next ``maybe_save``/``save`` raises on every rank, so a
job never runs on for days without a checkpoint.

Phases of one ``maybe_save``: **agree** (one max-reduction of three integers on the manager's
own gloo group: rank 0's policy decision, every rank's preemption flag and failed-save count),
**save** (collective :func:`~portable_ckpt.torch.save` or :func:`~portable_ckpt.torch.async_save`,
whose metadata travels on its own side group), then **after the commit**, on a background
thread of each rank: telemetry, and on rank 0 sampled verification, retention and replication
to the durable root.
Stateful values of ``state`` (anything with ``state_dict()``/``load_state_dict()``) are asked for
their state at the moment of each save, so nothing stale is ever saved.

The class is the public surface and the save phase; its other jobs live beside it: decisions and
preemption (:mod:`._manager_decisions`), tiers (:mod:`._manager_tiers`), post-commit work —
telemetry, verification, replication, retention (:mod:`._manager_post`) —, restore
(:mod:`._manager_restore`), exit safety (:mod:`._manager_exit`) and what a save adds to the
state (:mod:`._manager_state`).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from portable_ckpt.errors import CheckpointError, UsageError
from portable_ckpt.format.usage import (
    mapping,
    process_group_or_none,
    require_non_negative_int,
    require_one_of,
    require_seconds,
    strict_int,
    timeout_seconds,
)
from portable_ckpt.format.vocab import CODECS, CONTRACTS, DEFAULT_GRACE_SECONDS
from portable_ckpt.manager.decisions import Decision, SavePolicy
from portable_ckpt.manager.records import (
    MANAGER_ENTRY,
    manager_entry_value,
    placement_entry_schema,
)
from portable_ckpt.manager.telemetry import Telemetry, events_path
from portable_ckpt.manager.tiers import PLACEMENT_ENTRY
from portable_ckpt.storage import root_text
from portable_ckpt.torch._collectives import Comm
from portable_ckpt.torch._hyperparameters import (
    OPTIMIZER_HYPERPARAMETERS,
    Hyperparameters,
    OptimizerHyperparameters,
)
from portable_ckpt.torch._inflight import DEFAULT_EXIT_TIMEOUT, inflight_save, say
from portable_ckpt.torch._manager_decisions import (
    Preemption,
    agree,
    agreement_due,
    make_group,
    release_groups,
)
from portable_ckpt.torch._manager_exit import (
    open_on_root,
    register_after_async_save,
    register_exit,
)
from portable_ckpt.torch._manager_nodelocal import background_comm
from portable_ckpt.torch._manager_post import (
    UNSTORABLE,
    after_failure,
    after_save,
    note_commit,
    too_many_failures,
)
from portable_ckpt.torch._manager_restore import restore as _restore
from portable_ckpt.torch._manager_state import ManagerEntry, ModelOptimizerState, warn_stale
from portable_ckpt.torch._manager_tiers import Tier, durable_tier, fast_tier
from portable_ckpt.torch._nodelocal import NodeLocalPublisher
from portable_ckpt.torch.async_saving import ASYNC_MODES, AsyncSaveHandle, async_save
from portable_ckpt.torch.info import CheckpointInfo, LoadInfo
from portable_ckpt.torch.saving import save

__all__ = ["CheckpointManager", "ModelOptimizerState"]

_log = logging.getLogger("portable_ckpt")


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
        pin_kept: Pin (spec §15.3) the durable versions that ``keep_every`` and ``keep_best``
            keep, so that every gc keeps them too (a platform's ``gc --keep N`` over many
            roots); the manager unpins its own pins when its policy lets a version go, and never
            removes a pin it did not write.
        async_save: Save in the background (the loop blocks only while the state is staged).
        async_mode: Where async saves write: ``"thread"`` (a background thread) or
            ``"process"`` (a separate writer process, staged through shared memory; the
            manager's roots are paths or URLs, which it can always open). See
            :func:`async_save`.
        continuation: ``"exact"`` or ``"statistical"`` (recorded in every version).
        fast_root: A fast tier (local disk, tmpfs, fast shared file system).
        fast_every: Save to the fast tier every N steps (needs ``fast_root``).
        fast_keep: Versions kept on the fast tier.
        fast_replicas: With a node-local fast tier, also keep each node's files on the next
            node (0 or 1), so losing one node still restores from the fast tier.
        ranks_per_node: Consecutive ranks per node (default: ``LOCAL_WORLD_SIZE`` as torchrun
            sets it, else one node). With several nodes the fast tier is node-local: ``{node}``
            in ``fast_root`` is replaced by the node index, every rank touches only its node's
            root, and the version records which node holds what (``pck.placement``).
        replicate: Write durable saves to the fast tier and copy them to ``root`` in the
            background (verified, manifest last), instead of writing ``root`` directly. With a
            node-local fast tier every node copies what its root holds and rank 0 publishes the
            manifest once every node reported (``root`` must be reachable from every rank).
        verify_sample: After each commit re-read this fraction of the chunks (rank 0); a version
            that fails is marked (a verification record) and never restored.
        events: Telemetry sink: JSON lines, or a Prometheus textfile when it ends in ``.prom``;
            ``{rank}`` in it gives every rank its own file (otherwise rank 0 writes).
        process_group: A torch.distributed ProcessGroup (default: the default group).
        timeout: Seconds a collective may wait for peers. It also bounds how much later than
            the others a rank may reach a ``maybe_save`` where the ranks agree (see
            ``decision_interval``): a rank that late fails that call with ``PCK-DISTRIBUTED``
            on every rank, and the next call works. Keep it above the longest pause between
            steps (evaluation).
        decision_interval: Seconds of training between two agreements of the ranks (a
            collective) at most, by rank 0's measured pace and never more than 32 steps apart.
            The steps between are known to save nothing (``save_every``, ``save_steps`` and
            ``fast_every`` still save at exactly their steps), so a SIGTERM or a
            ``save_every_seconds`` interval is acted on up to about this much later. ``0``:
            agree at every ``maybe_save`` (one collective per step). Every rank must pass the
            same steps (each agreement checks: ``PCK-USAGE`` otherwise).
        handle_sigterm: Install a SIGTERM handler (main thread only): the first SIGTERM sets
            ``preempted``; a second one, or one once closing, terminates as before.
        handle_sigint: Treat SIGINT (Ctrl-C; torchrun forwards it to every worker) like SIGTERM:
            the first one preempts (the step is saved, ``preempted`` is set), a second one, or
            one once closing, raises ``KeyboardInterrupt`` as before (main thread only).
        max_failed_saves: After this many durable checkpoints failed in a row (saves, or their
            copies with ``replicate``), the next ``save`` or agreeing ``maybe_save`` raises on
            every rank (``DistributedError`` in a group, naming the steps). Fast-tier failures never
            count. ``None``: never; failures are then only reported (stderr, ``last_error``).
        grace_seconds: Age after which retention's gc removes abandoned attempts (of earlier
            runs: attempts this job created are never its retention's to delete, its next save
            may be writing already).
        codec: Chunk codec of every save (``"none"`` or ``"zstd"``).
        exit_timeout: Seconds the interpreter-exit hook waits for pending work; after that the
            save is reported ABANDONED on stderr and the process exits with status 1 at once
            (the stuck thread would otherwise hold the exit until its collectives time out).

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
        pin_kept: bool = False,
        async_save: bool = True,
        async_mode: str = "thread",
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
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        codec: str = "none",
        exit_timeout: float = DEFAULT_EXIT_TIMEOUT,
        handle_sigint: bool = False,
        max_failed_saves: int | None = 3,
        decision_interval: float = 0.5,
    ) -> None:
        self.policy = SavePolicy.build(
            save_every=save_every,
            save_every_seconds=save_every_seconds,
            save_steps=save_steps,
            fast_every=fast_every,
        )
        require_one_of(continuation, CONTRACTS, "continuation")
        # Checked here, not at the first save hours later on every rank (api review 31).
        require_one_of(codec, CODECS, "codec")
        strict_int(fast_keep, "fast_keep", minimum=1)  # (was refused as "keep_last")
        if ranks_per_node is not None:  # (0 was taken as "not given", -2 as a layout)
            strict_int(ranks_per_node, "ranks_per_node", minimum=1)
        timeout = timeout_seconds(timeout, "timeout")
        process_group_or_none(process_group, "process_group")
        if (
            isinstance(verify_sample, bool)
            or not isinstance(verify_sample, int | float)
            or not 0.0 <= float(verify_sample) <= 1.0
        ):
            raise UsageError(f"verify_sample must be a fraction in [0, 1], got {verify_sample!r}")
        if replicate and fast_root is None:
            raise UsageError("replicate=True needs fast_root= (the tier durable saves go to first)")
        if fast_every is not None and fast_root is None:
            raise UsageError(
                "fast_every= needs fast_root= (the fast tier's root); without it nothing would "
                "ever be saved at those steps (use save_every= for the durable root)"
            )
        if max_failed_saves is not None and (
            isinstance(max_failed_saves, bool)
            or not isinstance(max_failed_saves, int)
            or max_failed_saves < 1
        ):
            raise UsageError(
                f"max_failed_saves must be an int >= 1 or None, got {max_failed_saves!r}"
            )
        self.max_failed_saves = max_failed_saves
        if async_mode not in ASYNC_MODES:
            raise UsageError(f"async_mode must be one of {ASYNC_MODES}, got {async_mode!r}")
        self.async_save = bool(async_save)
        self.async_mode = async_mode
        self.codec = codec
        self.continuation = continuation
        self.verify_sample = float(verify_sample)
        self.replicate = bool(replicate)
        self.pin_kept = bool(pin_kept)
        if self.pin_kept and keep_every is None and keep_best is None:
            raise UsageError("pin_kept=True pins what keep_every= and keep_best= keep; give one")
        self.timeout = timeout
        self.grace_seconds = require_seconds(grace_seconds, "grace_seconds")
        self.exit_timeout = require_seconds(exit_timeout, "exit_timeout")
        self.decision_interval = require_seconds(decision_interval, "decision_interval")
        self.process_group = process_group
        self._group, self.rank, self.world_size = make_group(process_group, timeout)
        self._group_broken = False  # a decision failed on it: made anew at the next one
        self._spent_groups: list[Any] = []  # groups replaced since: destroyed at close
        self._bg_comm: Comm | None = None
        self._bg_broken = False  # a background collective failed: made anew at the next agreement
        # replicate=True: this rank's last fast-tier save failed (a full node disk); agreed,
        # durable saves then go to the durable root directly until a fast save works again
        self._fast_failed = False
        self._fast_failing = False
        self._direct_saves = 0
        events_path(events, self.rank)  # before a tier's root is made (api review 31)
        durable = durable_tier(
            root, keep_last=keep_last, keep_every=keep_every, keep_best=keep_best
        )
        self.tiers: dict[str, Tier] = {"durable": durable}
        if fast_root is not None:
            fast = fast_tier(
                fast_root,
                durable.root,
                keep=fast_keep,
                replicas=fast_replicas,
                ranks_per_node=ranks_per_node,
                rank=self.rank,
                world=self.world_size,
            )
            if fast.layout is not None and (self.replicate or self.verify_sample > 0):
                self._bg_comm = background_comm(process_group, timeout)
            self.tiers["fast"] = fast
        self._init_runtime(events, handle_sigterm, handle_sigint)

    def _init_runtime(
        self, events: str | os.PathLike[str] | None, handle_sigterm: bool, handle_sigint: bool
    ) -> None:
        self.telemetry = Telemetry(events, self.rank, root=self.tiers["durable"].root)
        # From 0, so that a restarted job's first failed save is an increase (SRE review 2, W5).
        self.telemetry.start_counters(self.tiers)
        self.preempted = False
        self.last_error: BaseException | None = None
        #: The failure wait() raised last (a stop after max_failed_saves names it: notebook F7).
        self._last_raised: BaseException | None = None
        self._failed_saves = 0  # failed saves in a row seen by this rank (reset by a commit)
        self._saves_started = 0  # saves this manager started (a save's number: after_save's seq)
        #: Saves numbered below it were started before the last stop after max_failed_saves,
        #: which surfaced their failures: a failure learned later is not counted again.
        self._stopped_before = 0
        self._failed_steps: list[int] = []
        self._agreed_failed_saves = 0  # the most any rank had seen at the last agreement
        #: The first and last step any rank had seen fail (in a row) at the last agreement:
        #: a rank that learns of failures late still names them when the job stops.
        self._agreed_failed_range: tuple[int, int] | None = None
        #: The step of the ranks' next agreement (None: the next call agrees), the last call's.
        self._agreed: int | None = None
        self._last_call_step: int | None = None
        self._agreed_at: tuple[int, float] | None = None  # rank 0: (step, monotonic time)
        self._agreements = 0
        self._last_save_step: int | None = None
        #: Steps this manager saved, less those whose save failed (a step saved again is said).
        self._saved_steps: set[int] = set()
        self._last_save_time = time.monotonic()  # intervals only: a stepped clock must not stop saves
        #: Attempts created since are this job's: its retention never deletes them as abandoned.
        self._started = time.time()
        self._pending: AsyncSaveHandle | None = None
        self._post: list[cf.Future[None]] = []
        self._copies: list[cf.Future[Any]] = []
        #: Fast-tier versions whose copy to the durable root runs (retention keeps them).
        self._copying: set[str] = set()
        #: Saves whose post-save work is queued or running (a retention pass with another one
        #: queued behind it is left to that one: soak review F6).
        self._saves_queued: dict[str, int] = {}
        #: tier -> the own version of the retention pass a commit skipped for a queued save.
        self._retain_owed: dict[str, str | None] = {}
        self._retain_lock = threading.Lock()
        self._bg = cf.ThreadPoolExecutor(1, thread_name_prefix="pck-manager")
        #: Retention passes of node-local tiers and replication, beside the background thread
        #: (whose collectives the peers wait on); tier -> the own version of the one queued.
        self._retainer = cf.ThreadPoolExecutor(1, thread_name_prefix="pck-retention")
        self._aside_own: dict[str, str] = {}
        #: Tier -> the newest version whose post-save work began: the ones committed after it
        #: wait for their verification and copy, and retention keeps them until then.
        self._handled: dict[str, str] = {}
        #: This job's committed versions in commit order (``_manager_post.note_commit``).
        self._commit_order: dict[str, int] = {}
        self._commits_noted = 0
        #: Held by each retention pass: passes of the two threads never overlap.
        self._pass_lock = threading.Lock()
        self._restored_at: float | None = None
        self._restored_step: int | None = None
        self._fetched: dict[str, Any] | None = None
        self._warned: set[str] = set()
        self._closed = False
        self._closing = False
        self._main_waiting = 0  # the main thread waits for background work (wait, a sync save)
        self._exiting = False  # closing from the interpreter-exit hook
        self._preemption = Preemption(handle_sigterm, handle_sigint)
        self._signal_flags = (handle_sigterm, handle_sigint)
        url = self.tiers["durable"].storage.url
        if self.rank == 0 and open_on_root(url, self) is not None:
            # A notebook cell run again made a second manager beside the first (notebook
            # review F3): two managers save and prune one root, and a restore by the new one
            # ran before the old one's save committed.
            print(f"portable_ckpt: another CheckpointManager on {url} is open in this "
                  "process; two managers save to and prune one root. Close the first "
                  "(mgr.close(), or a `with` block) before making a new one", file=sys.stderr)
        register_exit(self)

    # -- saving ------------------------------------------------------------------------------

    def request_preemption(self) -> None:
        """Act as if this process got SIGTERM: every rank saves at the ranks' next agreement.

        For trainers that own their signals (a SLURM ``--signal=USR1`` requeue handler, a
        framework's signal connector, torchelastic): call it from that handler (it only sets a
        flag, safe in a signal handler) or from any thread, with ``handle_sigterm=False``. One
        rank calling it is enough; the flag travels in the next agreement, and ``preempted``
        becomes true on every rank (integrator review F9).
        """
        self._preemption.signal_name = "request_preemption"
        self._preemption.seen.set()

    def maybe_save(
        self, step: int, state: Mapping[str, Any], metrics: Mapping[str, Any] | None = None
    ) -> bool:
        """Save ``state`` at ``step`` when the policy (or a preemption) says so.

        Every rank calls this at every step, with the same ``step``. Returns True when a save
        was started (finished, for a preemption save). After a SIGTERM (acted on at the ranks'
        next agreement: within about ``decision_interval`` seconds), ``preempted`` is true on
        every rank and the save is synchronous, so the loop can exit right after. Raises on
        every rank once ``max_failed_saves`` saves in a row failed. ``metrics``: numbers of
        this step (a loss, an accuracy; floats, ints, 0-d tensors), stored in the version's
        ``pck.manager`` entry and ranked by ``keep_best``.
        """
        self._check_open()
        require_non_negative_int(step, "maybe_save: step")  # before any collective
        # (a list as the state was an AttributeError in the stale-state check: api review 31)
        mapping(state, "maybe_save: state")
        mapping(metrics, "maybe_save: metrics", allow_none=True)
        self.mark_resumed()
        if not agreement_due(self, step):
            return False  # the last agreement said no rule saves before its next one
        decision = agree(self, step)
        self._raise_if_failing(decision)
        if not decision.saves:
            return False
        self._save(step, state, metrics, decision)
        return True

    def save(
        self, step: int, state: Mapping[str, Any], metrics: Mapping[str, Any] | None = None
    ) -> None:
        """Save ``state`` at ``step`` durably, whatever the policy says (a collective)."""
        self._check_open()
        require_non_negative_int(step, "save: step")
        # (a list as the state was an AttributeError in the stale-state check: api review 31)
        mapping(state, "save: state")
        mapping(metrics, "save: metrics", allow_none=True)
        self.mark_resumed()
        decision = agree(self, step, Decision("durable", "requested"))
        self._raise_if_failing(decision)
        self._save(step, state, metrics, decision)

    def _raise_if_failing(self, decision: Decision) -> None:
        """Raise (every rank: the count was agreed) once ``max_failed_saves`` saves failed."""
        limit = self.max_failed_saves
        unstorable = self._agreed_failed_saves >= UNSTORABLE  # no save can store the state
        if not unstorable and (
            limit is None or self._agreed_failed_saves < limit or decision.reason == "preemption"
        ):
            return  # a preemption save is the last chance: it is tried (and raises if it fails)
        err = too_many_failures(self)
        self._failed_saves, self._failed_steps, self._agreed_failed_saves = 0, [], 0
        self._agreed_failed_range = None
        self._stopped_before = self._saves_started
        last, self.last_error = self.last_error, None  # surfaced here, not again by wait()
        raise err from last

    def _warn_unranked(
        self, step: int, metrics: Mapping[str, Any] | None, decision: Decision
    ) -> None:
        """keep_best never deletes a version without its metric: say so once (rank 0, stderr)."""
        best = self.tiers["durable"].retention.keep_best
        if best is None or decision.tier != "durable" or "keep_best" in self._warned:
            return
        # Ranked on the values stored (a 0-d tensor's number: integrator review F7).
        if best.score(manager_entry_value(step, decision.reason, metrics)["metrics"]) is not None:
            return
        self._warned.add("keep_best")
        given = sorted(str(k) for k in metrics) if metrics else None
        text = (
            f"keep_best=({best.metric!r}, {best.n}, {best.mode!r}) ranks durable versions by "
            f"{best.metric!r}, but the save of step {step} carries no finite {best.metric!r} "
            f"value (metrics given: {given}): retention never deletes such a version, whatever "
            f"keep_last and keep_every say. Pass metrics={{{best.metric!r}: value}} to every "
            f"maybe_save and save (said once)."
        )
        _log.warning("%s", text)
        if self.rank == 0:
            say(text)

    def _target(self, decision: Decision) -> Tier:
        """The tier a save writes: with ``replicate``, durable steps go to the fast tier first.

        Not while the fast tier fails (agreed by every rank): a full node disk then stopped
        every durable checkpoint and the job, with the durable root healthy (SRE review F4).
        """
        if decision.tier == "fast" or (
            self.replicate and decision.reason != "preemption" and not self._fast_failing
        ):
            return self.tiers["fast"]
        return self.tiers["durable"]

    def _full_state(
        self, step: int, state: Mapping[str, Any], metrics: Any, decision: Decision, tier: Tier
    ) -> dict[str, Any]:
        """The caller's state plus the manager's entries (step, reason, metrics, placement)."""
        for reserved in (MANAGER_ENTRY, PLACEMENT_ENTRY):
            if reserved in state:
                raise UsageError(f"the state key {reserved!r} is reserved for the manager")
        warn_stale(state, self._warned)
        full = {
            **state,
            MANAGER_ENTRY: ManagerEntry(manager_entry_value(step, decision.reason, metrics)),
        }
        if tier.layout is not None:
            full[PLACEMENT_ENTRY] = ManagerEntry(tier.layout.to_json(), placement_entry_schema())
        return full

    def _save_options(self, step: int, tier: Tier) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "step": step,
            "process_group": self.process_group,
            "continuation": self.continuation,
            "timeout": self.timeout,
            "codec": self.codec,
        }
        if tier.layout is not None:
            kwargs["publisher"] = NodeLocalPublisher(tier.layout)
        return kwargs

    def _save(
        self,
        step: int,
        state: Mapping[str, Any],
        metrics: Mapping[str, Any] | None,
        decision: Decision,
    ) -> None:
        tier = self._target(decision)
        self._warn_unranked(step, metrics, decision)
        last = max(self._saved_steps, default=None)  # saves that did not fail
        if last is not None and step <= last and self.rank == 0 and "step-again" not in self._warned:
            # A cell run again saved one step twice: two committed versions of it, the later
            # one restored, and nothing said (notebook review F4).
            self._warned.add("step-again")
            later = ("the later version of that step wins a restore" if step == last
                     else "a restore takes the higher step")
            say(f"step {step} is not after this manager's last save (step {last}): {later} "
                "(a cell run again, or maybe_save and save of one step; said once)")
        full = self._full_state(step, state, metrics, decision, tier)
        self._last_save_step = step
        self._last_save_time = time.monotonic()  # intervals only: a stepped clock must not stop saves
        sync = decision.sync or not self.async_save
        if sync:
            self._settle_pending()
        t0 = time.perf_counter()
        kwargs = self._save_options(step, tier)
        seq, self._saves_started = self._saves_started, self._saves_started + 1
        handle: AsyncSaveHandle | None = None
        info: CheckpointInfo | None = None
        if sync:
            try:
                info = save(full, tier.storage, **kwargs)
            except CheckpointError as e:
                after_failure(self, step, tier, decision, e, raised=True)
                raise
            note_commit(self, info.checkpoint_id)
        else:
            handle = self._pending = async_save(
                full, tier.storage, mode=self.async_mode, exit_timeout=self.exit_timeout, **kwargs
            )
            handle.committed.add_done_callback(self._note_commit)
            register_after_async_save()
        # Saved (sync) or staged (async; a later failure takes it out again): a Ctrl-C before
        # this point left it counted, and its save again was called a repeat (last review 4 F5).
        self._saved_steps.add(step)
        pause = time.perf_counter() - t0
        # Finished post-save work leaves the list (it grew by one future per save until
        # wait(), soak review F4); a future that raised stays for wait() to raise.
        with self._retain_lock:  # the copy callbacks append to both (race review F8)
            self._post = [f for f in self._post if not f.done() or f.exception() is not None]
            self._copies = [c for c in self._copies if not c.done()]  # reported by callbacks
            fut = self._bg.submit(
                after_save, self, step, tier, decision, handle, info, pause, self._bg_comm, seq
            )
            # Counted once submitted (the job's decrement waits for this lock): a Ctrl-C in
            # between leaves the count one low (a pass too many), never one high (retention
            # skipped for the rest of the job: race review F10).
            self._saves_queued[tier.name] = self._saves_queued.get(tier.name, 0) + 1
            self._post.append(fut)
        if sync:
            self._main_waiting += 1  # no agreement comes while this waits (usable_comm)
            try:
                fut.result()  # a preemption save is verified and replicated before the loop exits
            finally:
                self._main_waiting -= 1

    def _note_commit(self, fut: cf.Future[CheckpointInfo]) -> None:
        """Number a committed async save (a done callback: failures are after_save's)."""
        if not fut.cancelled() and fut.exception() is None:
            note_commit(self, fut.result().checkpoint_id)

    def _settle_pending(self) -> None:
        """Wait for the in-flight async save (its failure was already reported)."""
        h, self._pending = self._pending, None
        if h is not None:
            try:
                h.committed.result()
            except BaseException:
                pass

    # -- restore -----------------------------------------------------------------------------

    def restore(
        self,
        state: Mapping[str, Any],
        *,
        step: int | None = None,
        checkpoint: str | os.PathLike[str] | None = None,
        allow_statistical: bool = False,
        record_ranges: bool = False,
        strict: bool = True,
        strict_dtype: bool = False,
        optimizer_hyperparameters: OptimizerHyperparameters = "checkpoint",
    ) -> LoadInfo | None:
        """Fill ``state`` from the newest committed, verified version over both tiers.

        Returns the :class:`LoadInfo`, or ``None`` when no tier holds a version (the first run
        of a job: start from scratch). A damaged, partial or missing fast-tier version falls back
        to the next candidate (the durable tier); errors of the target state itself (contract,
        shapes, missing keys) are raised at once. ``checkpoint`` restores one explicit version
        directory (e.g. a seed from another run) instead; with ``step``, it must hold that
        step (``PCK-USAGE`` otherwise; a root given as ``checkpoint`` gives its newest version
        of ``step``). ``allow_statistical``: restore a
        version of contract ``exact`` on another world size or mesh (``PCK-CONTRACT``
        otherwise), as :func:`~portable_ckpt.torch.load`. ``record_ranges`` is passed to
        :func:`~portable_ckpt.torch.load`, and so is ``strict``: ``False`` keeps the current
        value of what the version lacks (listed in ``LoadInfo.missing_keys``), e.g. the RNG and
        data position of a converted checkpoint restored as a seed, which has neither.
        ``strict_dtype`` too: ``True`` refuses a target whose dtype differs from the stored
        one; otherwise values are cast, rank 0 says so on stderr (``LoadInfo.casts``), and a
        cast that would make finite values infinite, more than half of a box's non-zero values 0,
        or change an integer, is refused (``PCK-USAGE``). A version found damaged gets a failed verification
        record (not tried again until an operator clears it, spec §14.5); restoring an older ``step`` than the job's newest is said on
        stderr (the newer steps would win the next restore). Newer versions passed over (damaged,
        an invalid commit record, a failed verification) are named by rank 0 on stderr and in a
        WARNING, with the roots holding a verified copy of each (``LoadInfo.passed_over``).
        ``optimizer_hyperparameters``: which values the optimizers' param groups get where the
        stored hyper-parameters (``lr``, ``weight_decay``, ``betas``, ``eps``, every member
        but ``params``) differ from the optimizers' current ones (a changed config; their values
        before the restore): ``"checkpoint"`` (default) the stored ones, as torch and DCP do, or
        ``"current"`` the current ones; rank 0 names each difference once, on stderr and in a
        WARNING (``LoadInfo.changed_hyperparameters``), as
        :func:`~portable_ckpt.torch.load` does (NaN equal to NaN; a tensor member, a ``fused``
        or ``capturable`` optimizer's ``lr``, by value). The members an LR scheduler in
        ``state`` sets on the optimizer it drives are left to it: ``lr`` and ``initial_lr``,
        and ``momentum`` and ``betas`` where it cycles momentum (``OneCycleLR``, ``CyclicLR``
        with their default ``cycle_momentum=True``): restored with its state whatever the
        choice, and not named. ``foreach``, ``fused``, ``capturable`` and ``differentiable``
        (kernels, not maths) keep the optimizers' current values, and are not named.

        Raises:
            StorageError: a tier could not be listed, or a version that may be newer than the
                one to restore has an unreadable commit record (never "nothing to resume",
                spec R-ID-5): retry.
            NotFoundError: ``step`` was given and no tier holds it, or every version the
                tiers hold failed verification (never "start from scratch"); or
                ``checkpoint`` names a path that holds no committed version (of ``step``):
                on every rank, without a second read.
            DistributedError: every candidate failed.

        """
        self._check_open()
        hyper = Hyperparameters(require_one_of(
            optimizer_hyperparameters, OPTIMIZER_HYPERPARAMETERS, "optimizer_hyperparameters"))
        # step="10" or -1 was looked for as such: "no committed version of step 10" (api
        # review 31)
        step = None if step is None else strict_int(step, "restore: step", minimum=0)
        if checkpoint is not None:
            root_text(checkpoint)  # (5 was a TypeError from os.fspath deep in the restore)
        self._settle_pending()
        # This process's async save of another manager (or of async_save) on this root must
        # be in the listing: a second manager's restore ran before the first's save committed
        # and answered None, and the loop restarted from step 1 (notebook review F3).
        roots = {t.storage.url for t in self.tiers.values()}
        in_flight = inflight_save(roots)
        if in_flight is not None:  # bounded as the exit's wait for it (last review F5)
            future, bound = in_flight
            cf.wait([future], timeout=bound)
        return _restore(
            self, state, step, checkpoint, allow_statistical, record_ranges, strict, strict_dtype,
            hyper,
        )

    def mark_resumed(self) -> None:
        """Tell the manager the first step after a restore completed (time to resume)."""
        if self._restored_at is None:
            return
        seconds = time.perf_counter() - self._restored_at
        self._restored_at = None
        self.telemetry.emit("resume", seconds=round(seconds, 6), step=self._restored_step)

    # -- waiting and exit --------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the pending save, its post-commit work and replications; re-raise a failure.

        Raises the last failure of a background save or copy (``last_error``, once) so the
        loop's end surfaces it, or else the first unexpected failure of post-commit work
        (once, after the work queued behind it finished: attack review 4 A8), and
        ``TimeoutError`` when ``timeout`` seconds passed first (the work goes on).
        """
        self._main_waiting += 1  # no agreement comes while this waits (usable_comm)
        try:
            self._wait(timeout)
        finally:
            self._main_waiting -= 1

    def _wait(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        h = self._pending
        if h is not None:
            try:
                h.committed.result(left())
            except CheckpointError:
                pass  # reported by after_save; re-raised below as last_error
            self._pending = None
        failures: list[BaseException] = []

        def settle(futures: list[cf.Future[Any]], *, keep: bool = True) -> None:
            for fut in futures:
                try:
                    fut.result(left())
                except BaseException as e:
                    if not fut.done():
                        raise  # timed out: the work goes on
                    if keep:  # (a copy's failure is reported by its callback: last_error)
                        failures.append(e)

        settle(list(self._post))
        with self._retain_lock:
            copies = list(self._copies)
        settle(copies, keep=False)
        settle(list(self._post))  # retention queued after the copies
        with self._retain_lock:
            self._post = [f for f in self._post if not f.done()]  # each failure raised once
        err, self.last_error = self.last_error, None
        err = err if err is not None else next(iter(failures), None)
        if err is not None:
            self._last_raised = err  # still named by a later max_failed_saves stop (F7)
            if self._failed_saves >= UNSTORABLE:  # raised here: the caller knows of it now
                self._failed_saves = len(self._failed_steps)
            raise err

    def _busy(self) -> bool:
        """Whether a save, its post-commit work or a replication is still running."""
        running = [f for f in (*self._post, *self._copies) if not f.done()]
        return bool(running) or (self._pending is not None and not self._pending.done())

    def close(self, timeout: float | None = None) -> None:
        """Finish pending work (see :meth:`wait`), restore the signal handler, stop threads.

        SIGTERM gets its previous disposition back first: a closing manager no longer acts on
        preemption, so a SIGTERM while it finishes stops the process as it would without it.
        """
        if self._closed:
            return
        self._closing = True  # background work waiting for a renewed group stops waiting
        self._preemption.restore()
        try:
            self.wait(timeout)
        except BaseException as e:
            if not isinstance(e, Exception):
                # Ctrl-C while it finished: not closed, so close() again (or the exit hook)
                # still finishes the save, its retention and its failure (notebook review F5:
                # marked closed, the save's later failure was a stderr line and exit 0). Open
                # as before: its preemption handling comes back (last review F3: a SIGTERM
                # then killed the job without a preemption save).
                self._closing = False
                seen = self._preemption.seen.is_set()
                self._preemption = Preemption(*self._signal_flags)
                if seen:
                    self._preemption.seen.set()
                raise
            self._shut()
            raise
        self._shut()

    def _shut(self) -> None:
        """Mark closed and stop the background thread (left behind when still busy)."""
        self._closed = True
        busy = self._busy()  # timed out: the stuck thread is left behind, not joined
        self._bg.shutdown(wait=not busy, cancel_futures=busy)
        self._retainer.shutdown(wait=not busy, cancel_futures=busy)
        if not busy:
            release_groups(self)

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError("this CheckpointManager was closed")

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """Close; while an exception leaves the block, a failed save never replaces it.

        The save's error is then said on stderr and kept in ``last_error``, and the caller's
        exception goes on (a framework classifying errors sees its own).
        """
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except Exception as e:  # the caller's exception is the one that matters
            self.last_error = e
            say(
                f"rank {self.rank}: while leaving the manager's block on "
                f"{type(exc).__name__}, the pending checkpoint failed: "
                f"[{getattr(e, 'code', type(e).__name__)}] {getattr(e, 'message', str(e))[:1000]}"
            )
