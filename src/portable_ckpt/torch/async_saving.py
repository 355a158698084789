"""The async save: stage on the caller's thread, write and commit in the background.

The caller is blocked only while its state is copied into reused host staging buffers
(:mod:`portable_ckpt.torch.staging`); the collective protocol of :mod:`portable_ckpt.torch.saving`
then runs on one background thread per process. Its metadata collectives use a dedicated gloo
group (:mod:`portable_ckpt.torch._collectives`), so they never interleave with training
collectives. At most one async save per process is in flight (:mod:`portable_ckpt.torch._inflight`).

Two places for the writing (checksums, writes, fsync):

* ``mode="thread"``: the background thread itself, in the training process (staging buffers are
  private tensors);
* ``mode="process"``: a separate writer process (:mod:`portable_ckpt.io.writer_process`) that
  maps the staged bytes from one anonymous shared-memory segment and runs at a lower CPU
  priority; the training interpreter then runs none of the writer's code (no GIL contention),
  and the background thread only waits and exchanges the small metadata documents.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Unpack

from portable_ckpt._gc import paused_gc
from portable_ckpt._threads import BACKGROUND_NICE, worker
from portable_ckpt.errors import UsageError
from portable_ckpt.format.usage import require_seconds
from portable_ckpt.storage import open_storage
from portable_ckpt.torch._collectives import Comm, make_comm
from portable_ckpt.torch._inflight import (
    DEFAULT_EXIT_TIMEOUT,
    LOCK,
    InFlight,
    WatchedFuture,
    track,
    wait_idle,
)
from portable_ckpt.torch.info import CheckpointInfo
from portable_ckpt.torch.saving import (
    Prepared,
    RankWrite,
    Root,
    SaveKeywords,
    SaveOptions,
    prepare,
    run_save,
)
from portable_ckpt.torch.staging import Staging, staging_bytes

__all__ = ["ASYNC_MODES", "AsyncSaveHandle", "async_save"]

#: Where an async save writes: ``"thread"`` (in this process) or ``"process"`` (a writer process).
ASYNC_MODES = ("thread", "process")


class AsyncSaveHandle:
    """An async save in progress.

    Attributes:
        step: The step being saved.
        staged: Future resolving (to a dict with ``seconds`` and ``staging_bytes``) once the state
            was copied; from then on the caller may mutate every tensor and object it passed.
            It raises this rank's error when the copy failed (nothing of the state will be
            written; the caller may mutate it too).
        committed: Future resolving to the :class:`CheckpointInfo` after the commit record is
            published, or raising the save's :class:`CheckpointError`.
        staging_bytes: Size of this process's reusable staging buffers.

    """

    def __init__(self, step: int) -> None:
        self.step = step
        self.staged: cf.Future[dict[str, Any]] = cf.Future()
        self.committed: cf.Future[CheckpointInfo] = WatchedFuture()
        self.staging_bytes = 0
        self.blocking_seconds = 0.0
        self._gate = threading.Lock()  # the caller's interruption vs the job's start
        self._started = False

    def result(self, timeout: float | None = None) -> CheckpointInfo:
        """Wait for the commit and return its :class:`CheckpointInfo` (or raise)."""
        return self.committed.result(timeout)

    def done(self) -> bool:
        """Whether the save finished (committed or failed)."""
        return self.committed.done()


def _background(job: Callable[[], None]) -> None:
    """Run ``job`` on the one thread per process that writes and commits async saves.

    The thread, and the workers it writes with, run at a lower CPU priority
    (:data:`~portable_ckpt._threads.BACKGROUND_NICE`, as the writer process of ``"process"``
    mode): on a contended CPU the training loop wins every core.
    """
    worker("pck-async-save", nice=BACKGROUND_NICE).submit(job)


def async_save(
    state_dict: Mapping[str, Any],
    root: Root,
    *,
    mode: str = "thread",
    exit_timeout: float = DEFAULT_EXIT_TIMEOUT,
    **options: Unpack[SaveKeywords],
) -> AsyncSaveHandle:
    """Like :func:`save`, but returns once the state is staged; I/O and commit run in the background.

    The state (tensors into reused host staging buffers, non-tensor values as JSON) is copied
    before this returns, so ``handle.staged`` is already resolved and training may continue and
    mutate everything. ``handle.committed`` resolves after the version is published. A second
    save while one is in flight waits for it (``if_busy="wait"``) or raises (``"raise"``).
    Metadata collectives use a dedicated gloo group, so they never interleave with training
    collectives; one of them (32 bytes per rank: which rank stores each plain tensor) is
    posted before staging and awaited after it, so the call returns once every rank of the
    group has reached it. Takes the keyword arguments of :func:`save` (see
    :class:`SaveOptions`).

    Args:
        state_dict: As for :func:`save`.
        root: As for :func:`save`; with ``mode="process"`` a local path, an ``s3://`` URL, or
            a :class:`~portable_ckpt.storage.Storage` whose ``process_spec()`` is not ``None``.
        mode: ``"thread"``: write on a background thread of this process. ``"process"``:
            stage into shared memory and write in a separate, lower-priority writer process
            (started on first use, reused; a new one replaces one that died, whose save then
            fails with PCK-WRITER-PROCESS and publishes nothing).
        exit_timeout: Seconds interpreter exit waits for this save while it is in flight (the
            setting of ``CheckpointManager``). Past it the process says on stderr that the
            save was ABANDONED (naming the step and the attempt, which stays incomplete; the
            newest committed version remains the latest) and exits with status 1 at once.
        **options: ``step`` (required) and the other keyword arguments of :func:`save`.

    Raises:
        UsageError: an unknown ``mode``, a negative ``exit_timeout``, or a root that cannot
            travel to a writer process.

    """
    if mode not in ASYNC_MODES:
        raise UsageError(f"mode must be one of {ASYNC_MODES}, got {mode!r}")
    bound = require_seconds(exit_timeout, "exit_timeout")
    opts = SaveOptions.of("async_save", options)
    into, write_with = _mode(mode, root)
    t0 = time.perf_counter()
    with LOCK:
        wait_idle(opts.if_busy)
        handle = AsyncSaveHandle(opts.step)
        comm = make_comm(opts.process_group, opts.timeout)  # collective on first use: main thread
        # The blocking part: no full collection of the training heap while staging
        # (portable_ckpt._gc); the background write runs with the caller's collector settings.
        with paused_gc():
            prepared = prepare(state_dict, root, comm, copy=True, into=into, step=opts.step)
        _mark_staged(handle, prepared, t0)
        try:
            root_url = prepared.storage.url if prepared.storage is not None else None
            slot = track(opts.step, handle.committed, bound, root=root_url)
            _background(lambda: _finish(handle, slot, prepared, comm, opts, t0, write_with))
        except BaseException as e:
            # A Ctrl-C between the two left a tracked save that nothing would run: every later
            # save waited for it for ever (race review F9). Unless the job started, it never
            # will (it finds ``committed`` resolved).
            with handle._gate:
                if not handle._started and not handle.committed.done():
                    handle.committed.set_exception(e)
            raise
    if prepared.error is not None and not isinstance(prepared.error, Exception):
        # Ctrl-C (or sys.exit) while staging: the background tells the peers the save failed;
        # the caller's thread stops as it asked (race review F3), and has seen why: the exit
        # is not reported ABANDONED for it (exit status 1) nor a later wait re-raised it.
        slot.interrupted = True
        raise prepared.error
    return handle


def _mode(mode: str, root: Root) -> tuple[Staging | None, type[RankWrite] | None]:
    """The staging and the write phase of ``mode`` (checks that the root can travel)."""
    if mode == "thread":
        return None, None
    from portable_ckpt.torch._process_write import ProcessWrite, check_can_travel
    from portable_ckpt.torch._shm import SHARED

    check_can_travel(open_storage(root, create=True))
    return SHARED, ProcessWrite


def _mark_staged(handle: AsyncSaveHandle, prepared: Prepared, t0: float) -> None:
    handle.staging_bytes = staging_bytes()
    handle.blocking_seconds = time.perf_counter() - t0
    if prepared.error is not None:
        # Nothing was copied: a caller that waits on ``staged`` alone must hear of it (it
        # resolved with an "error" key nobody read, async review F11). The state may still be
        # mutated: no copy of it will be written. ``committed`` raises the agreed failure.
        handle.staged.set_exception(prepared.error)
        return
    handle.staged.set_result({"seconds": prepared.seconds, "staging_bytes": handle.staging_bytes})


def _finish(
    handle: AsyncSaveHandle,
    slot: InFlight,
    prepared: Prepared,
    comm: Comm,
    opts: SaveOptions,
    t0: float,
    write_with: type[RankWrite] | None,
) -> None:
    """Background thread: run the collective save; resolve ``handle.committed`` either way."""
    with handle._gate:
        if handle.committed.done():
            return  # the caller was interrupted before this job was known to run
        handle._started = True
    try:
        info = run_save(
            prepared, comm, opts, t_start=t0, blocking=handle.blocking_seconds,
            write_with=write_with, on_attempt=slot.agreed,
        )
    except BaseException as e:
        handle.committed.set_exception(e)
    else:
        handle.committed.set_result(info)
