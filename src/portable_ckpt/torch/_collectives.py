"""Small JSON collectives over a dedicated gloo group, and the protocol steps built on them.

Every save/load exchanges a few small JSON documents (attempt id, status, writer indexes). They
travel over a side gloo group with its own timeout, created once per (ranks, timeout) and
cached, so that an async save's background thread never interleaves with the training
collectives of the main group, and so a dead or stuck peer yields a PCK-DISTRIBUTED error after
``timeout`` seconds instead of a hang. JSON travels as UTF-8 bytes in uint8 tensors (no pickle).

Failure handling lives here, once: a protocol step runs a function on every rank, exchanges each
rank's :class:`StepStatus`, and either returns on every rank or raises on every rank
(:meth:`Comm.all_gather_step`, :meth:`Comm.coordinator_step`). The rank that failed raises its
own error; the others raise one :class:`~portable_ckpt.errors.DistributedError` carrying every
rank's :class:`~portable_ckpt.errors.RankFailure`.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import torch
import torch.distributed as dist

from portable_ckpt.errors import (
    CheckpointError,
    CommitOutcomeUnknownError,
    DistributedError,
    RankFailure,
    VersionDeletedError,
    error_for_code,
)

__all__ = ["Comm", "DEFAULT_TIMEOUT_S", "StepStatus", "by_rank", "make_comm", "new_gloo_group"]


def by_rank(values: list[Any], noun: str) -> str:
    """What each rank gave, grouped: ``step 1 on rank(s) [0], step 2 on rank(s) [1]``.

    For the messages of a collective that found the ranks disagree (the first few values,
    and the first ranks of each).
    """
    ranks: dict[Any, list[int]] = {}
    for r, v in enumerate(values):
        ranks.setdefault(v, []).append(r)
    parts = [f"{noun} {v!r} on rank(s) {r[:8]}{' ...' if len(r) > 8 else ''}"
             for v, r in ranks.items()]
    return ", ".join(parts[:4]) + (", ..." if len(parts) > 4 else "")

#: Default timeout of metadata collectives (seconds), the process group default.
DEFAULT_TIMEOUT_S = (
    float(dist.default_pg_timeout.total_seconds())
    if hasattr(dist, "default_pg_timeout")
    else 1800.0
)

_GROUPS: dict[tuple[tuple[int, ...], float], Any] = {}
_PEERS: dict[tuple[tuple[int, ...], float], list[Any]] = {}
_LOCK = threading.Lock()
#: Keys of cached side groups a collective failed on: made anew at their next use.
_BROKEN: set[tuple[tuple[int, ...], float]] = set()

T = TypeVar("T")


def _failure(rank: int, e: BaseException, *, coordinator: bool = False) -> RankFailure:
    code = e.code if isinstance(e, CheckpointError) else "PCK-DISTRIBUTED"
    # A Ctrl-C (or SystemExit) that interrupted the coordinator's work may have come after it
    # took effect: the commit record linked, its directory sync or the return still running.
    # Then nothing may be undone: the files of a committed version were deleted (notebook
    # review F1). gc classifies the attempt later.
    unknown = isinstance(e, CommitOutcomeUnknownError) or (
        coordinator and not isinstance(e, Exception)
    )
    text = f"{type(e).__name__}: {e}"
    if not str(e) and not isinstance(e, Exception):
        text = f"{type(e).__name__} (interrupted)"
    deleted = isinstance(e, VersionDeletedError)
    return RankFailure(rank, code, text, coordinator, unknown, deleted)


@dataclass(frozen=True)
class StepStatus:
    """One rank's outcome of a protocol step (or the coordinator's verdict), as exchanged.

    Attributes:
        value: The JSON value the rank shares when it succeeded.
        failures: Empty on success; else why the step failed (one entry from a rank, every
            failed rank's entry in a coordinator's verdict).

    """

    value: Any = None
    failures: tuple[RankFailure, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether the step succeeded."""
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        """Return the JSON document sent to the other ranks."""
        return {
            "ok": self.ok,
            "value": self.value,
            "failures": [
                {
                    "rank": f.rank,
                    "code": f.code,
                    "message": f.message,
                    "coordinator": f.coordinator,
                    "unknown": f.unknown,
                    "deleted": f.deleted,
                }
                for f in self.failures
            ],
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> StepStatus:
        """Parse a document made by :meth:`to_json` (on any rank)."""
        failures = tuple(
            RankFailure(
                int(f["rank"]),
                str(f["code"]),
                str(f["message"]),
                bool(f["coordinator"]),
                bool(f.get("unknown", False)),
                bool(f.get("deleted", False)),
            )
            for f in doc["failures"]
        )
        return cls(doc["value"], failures)


class Comm:
    """JSON collectives among the ranks of one group (a single process when ``group`` is None).

    Attributes:
        rank: This process's rank in the group.
        world_size: Number of ranks.
        timeout: Seconds a collective may wait for peers.

    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        group: Any,
        global_ranks: list[int],
        timeout: float,
        peers: Sequence[Sequence[Any]] = (),
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.group = group
        self.global_ranks = global_ranks
        self.timeout = timeout
        #: ``[host, pid]`` of every rank (exchanged when the side group was made).
        self.peers = [list(p) for p in peers]
        #: A collective failed on this group (on this rank): it is not used again.
        self.broken = False

    def dead_peers(self, grace: float = 0.5) -> list[int]:
        """Ranks on this host whose process is gone (others cannot be checked).

        A killed peer's sockets close while its process is still exiting, so a collective can
        fail a moment before the process is gone: look again for up to ``grace`` seconds.
        """
        host = socket.gethostname()
        local = [
            (r, int(p[1]))
            for r, p in enumerate(self.peers)
            if r != self.rank and len(p) == 2 and p[0] == host
        ]
        deadline = time.monotonic() + grace
        while True:
            dead = [r for r, pid in local if _process_gone(pid)]
            if dead or not local or time.monotonic() >= deadline:
                return dead
            time.sleep(0.05)

    # -- protocol steps ----------------------------------------------------------------------------

    def all_gather_step(
        self, name: str, fn: Callable[[], tuple[T, Any]], *, what: str, outcome: str
    ) -> tuple[T, list[Any]]:
        """Run ``fn`` on every rank, then exchange the outcomes; every rank returns or raises.

        Args:
            name: The step (names the collective in a timeout message).
            fn: Returns ``(local, shared)``: ``local`` stays on this rank, ``shared`` (JSON) is
                sent to every rank.
            what: The operation, for messages (``"save of step 3 (prepare)"``).
            outcome: What a failure leaves behind, for messages.

        Returns:
            This rank's ``local`` and every rank's ``shared``, in rank order.

        Raises:
            CheckpointError: this rank's own error when ``fn`` raised one here, else
                :class:`DistributedError` naming the failed ranks.

        """
        local, own, status = self._run_local(fn)
        docs = self._exchange(lambda: self.allgather_json(status.to_json(), name), outcome)
        statuses = [StepStatus.from_json(d) for d in docs]
        failures = [f for s in statuses for f in s.failures]
        if failures:
            self._raise(failures, own, what=what, outcome=outcome)
        return local, [s.value for s in statuses]

    def coordinator_step(
        self,
        name: str,
        local_fn: Callable[[], tuple[T, Any]],
        rank0_fn: Callable[[list[Any]], Any],
        *,
        what: str,
        outcome: str,
        on_failure: Callable[[], None] | None = None,
    ) -> tuple[T, Any]:
        """Run ``local_fn`` on every rank, ``rank0_fn`` on rank 0 over all shared values, agree.

        Rank 0 gathers every rank's status; when all succeeded it runs ``rank0_fn`` on their
        shared values and broadcasts its JSON result (or its failure). A failure of a peer's
        ``local_fn`` raises :class:`DistributedError` on the others; a failure of ``rank0_fn``
        is raised on every rank with its own code (it is the shared outcome, e.g.
        PCK-COMMIT-CONFLICT).

        Args:
            name: The step (names the collectives in a timeout message).
            local_fn: Returns ``(local, shared)`` like :meth:`all_gather_step`'s ``fn``.
            rank0_fn: Rank 0's work over every rank's ``shared``; returns JSON.
            what: The operation, for messages.
            outcome: What a failure leaves behind, for messages.
            on_failure: Called on every rank before raising when the step is known to have
                failed; never when the exchange itself failed or ``rank0_fn``'s outcome is
                unknown (:class:`CommitOutcomeUnknownError`): then rank 0 may have succeeded,
                so nothing may be undone.

        Returns:
            This rank's ``local`` and ``rank0_fn``'s result.

        """
        local, own, status = self._run_local(local_fn)
        docs = self._exchange(
            lambda: self.gather_json(status.to_json(), f"{name} (gather)"), outcome
        )
        verdict = StepStatus()
        if docs is not None:
            verdict, rank0_error = self._coordinate(docs, rank0_fn)
            own = own or rank0_error
        verdict = self._announce(verdict, f"{name} (outcome)", docs is not None, outcome)
        if not verdict.ok:
            if on_failure is not None and not any(f.unknown for f in verdict.failures):
                on_failure()
            self._raise(list(verdict.failures), own, what=what, outcome=outcome)
        return local, verdict.value

    def _announce(
        self, verdict: StepStatus, name: str, coordinator: bool, outcome: str
    ) -> StepStatus:
        """Broadcast rank 0's verdict; a failure says what this rank knows of the outcome."""
        if not coordinator:
            unknown = (
                "the outcome is unknown on this rank: rank 0 may have published it (see "
                "`portable-ckpt ls`); nothing was removed"
            )
        elif verdict.ok:
            unknown = "rank 0 did publish it, but not every rank could be told"
        else:
            unknown = outcome
        sent = verdict.to_json()
        return StepStatus.from_json(
            self._exchange(lambda: self.broadcast_json(sent, name), unknown)
        )

    def _run_local(
        self, fn: Callable[[], tuple[T, Any]]
    ) -> tuple[Any, BaseException | None, StepStatus]:
        try:
            local, shared = fn()
        except BaseException as e:  # every failure, even KeyboardInterrupt, is reported to peers
            return None, e, StepStatus(failures=(_failure(self.rank, e),))
        return local, None, StepStatus(shared)

    def _coordinate(
        self, docs: list[Any], rank0_fn: Callable[[list[Any]], Any]
    ) -> tuple[StepStatus, BaseException | None]:
        statuses = [StepStatus.from_json(d) for d in docs]
        failures = tuple(f for s in statuses for f in s.failures)
        if failures:
            return StepStatus(failures=failures), None
        try:
            return StepStatus(rank0_fn([s.value for s in statuses])), None
        except BaseException as e:
            return StepStatus(failures=(_failure(self.rank, e, coordinator=True),)), e

    def _raise(
        self, failures: Sequence[RankFailure], own: BaseException | None, *, what: str, outcome: str
    ) -> NoReturn:
        if own is not None:
            if isinstance(own, VersionDeletedError):
                own.failures = tuple(failures)  # the peers' too: a group retries together
            if isinstance(own, CheckpointError):
                raise own
            if not isinstance(own, Exception):
                # KeyboardInterrupt, SystemExit: the caller stops this process, after the peers
                # were told (race review F3: a Ctrl-C became a save failure and training went on)
                raise own
            raise DistributedError(
                f"rank {self.rank}: {what} failed: {type(own).__name__}: {own}", failures=failures
            ) from own
        if len(failures) == 1 and failures[0].coordinator:
            f = failures[0]
            if f.unknown:
                raise CommitOutcomeUnknownError(
                    f"{what}: the outcome is unknown: {f.message} (rank {f.rank}); the "
                    "version may be committed and nothing was removed"
                )
            raise error_for_code(f.code)(
                f"{what} failed on the coordinator (rank {f.rank}): {f.message}; {outcome}"
            )
        ranks = [f.rank for f in failures]
        detail = "; ".join(f"rank {f.rank}: {f.message}" for f in failures[:4])
        raise DistributedError(
            f"{what} failed on rank(s) {ranks} ({detail}); {outcome}", failures=failures
        )

    def exchange(self, run: Callable[[], T], outcome: str) -> T:
        """Run a collective after a step (e.g. a broadcast); a failure says ``outcome``."""
        return self._exchange(run, outcome)

    @staticmethod
    def _exchange(run: Callable[[], T], outcome: str) -> T:
        """Run a collective of a step; a failure says what the step leaves behind."""
        try:
            return run()
        except DistributedError as e:
            raise DistributedError(f"{e.message}; {outcome}", failures=e.failures) from e

    # -- JSON collectives --------------------------------------------------------------------------

    def _fail(self, what: str, e: BaseException) -> DistributedError:
        # A gloo group whose collective failed (a timeout closes its pairs) never works again:
        # the next save or load of this process makes a new one (async review F8: one stall
        # ended checkpointing for the rest of the job). Every rank of a failed collective sees
        # it fail, so all of them rebuild at their next call, in the same order.
        if self.group is not None:
            with _LOCK:
                _BROKEN.update(k for k, g in _GROUPS.items() if g is self.group)
        if not dist.is_initialized() or "is not registered" in str(e):
            # torch's text ("create group with the new_group API") would mislead
            return DistributedError(
                f"rank {self.rank}/{self.world_size}: collective '{what}' failed: the process "
                "group was destroyed while this step still needed it; call mgr.close() (or "
                "wait for the pending save) before destroy_process_group()"
            )
        dead = self.dead_peers()
        if dead:
            who = ", ".join(f"rank {r} (pid {self.peers[r][1]})" for r in dead)
            cause = f"{who} died (its process is gone)"
            failures = [RankFailure(r, "PCK-DISTRIBUTED", "process died") for r in dead]
        else:
            cause = (
                f"a peer rank died, raised outside the protocol, or exceeded the "
                f"{self.timeout:.0f}s timeout"
            )
            failures = []
        return DistributedError(
            f"rank {self.rank}/{self.world_size}: collective '{what}' failed: {e}. {cause}",
            failures=failures,
        )

    def _wait(self, work: Any, what: str) -> None:
        try:
            if work is not None:
                work.wait(_dt.timedelta(seconds=self.timeout))
        except Exception as e:
            raise self._fail(what, e) from e

    def _padded(self, data: bytes, what: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Exchange sizes; return ``data`` in a buffer of the largest size, and every size."""
        size = torch.tensor([len(data)], dtype=torch.int64)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        self._wait(dist.all_gather(sizes, size, group=self.group, async_op=True), what)
        buf = torch.zeros(max(int(s.item()) for s in sizes), dtype=torch.uint8)
        if data:
            buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return buf, sizes

    def _collective(self, what: str, run: Callable[[], T]) -> T:
        try:
            return run()
        except DistributedError:
            raise
        except Exception as e:
            raise self._fail(what, e) from e

    def allgather_json(self, obj: Any, what: str) -> list[Any]:
        """Every rank's ``obj``, in rank order."""
        return [json.loads(b) for b in self.allgather_bytes(_encode(obj), what)]

    def gather_json(self, obj: Any, what: str) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (``None`` elsewhere)."""
        data = _encode(obj)
        if self.group is None:
            return [json.loads(data)]

        def run() -> list[Any] | None:
            buf, sizes = self._padded(data, what)
            outs = (
                [torch.empty_like(buf) for _ in range(self.world_size)] if self.rank == 0 else None
            )
            dst = self.global_ranks[0]
            self._wait(dist.gather(buf, outs, dst=dst, group=self.group, async_op=True), what)
            return None if outs is None else _decode_all(outs, sizes)

        return self._collective(what, run)

    def broadcast_json(self, obj: Any, what: str) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if self.group is None:
            return obj
        return json.loads(self.broadcast_bytes(_encode(obj) if self.rank == 0 else b"", what))

    def broadcast_bytes(self, data: bytes, what: str) -> bytes:
        """Rank 0's ``data`` on every rank (the others pass anything, e.g. ``b""``)."""
        if self.group is None:
            return data
        src = self.global_ranks[0]

        def run() -> bytes:
            size = torch.tensor([len(data) if self.rank == 0 else 0], dtype=torch.int64)
            self._wait(dist.broadcast(size, src=src, group=self.group, async_op=True), what)
            if self.rank == 0:
                buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else (
                    torch.zeros(0, dtype=torch.uint8)
                )
            else:
                buf = torch.empty(int(size.item()), dtype=torch.uint8)
            self._wait(dist.broadcast(buf, src=src, group=self.group, async_op=True), what)
            return data if self.rank == 0 else bytes(buf.numpy())

        return self._collective(what, run)

    def allgather_bytes(self, data: bytes, what: str) -> list[bytes]:
        """Every rank's ``data``, in rank order."""
        if self.group is None:
            return [data]

        def run() -> list[bytes]:
            buf, sizes = self._padded(data, what)
            outs = [torch.empty_like(buf) for _ in range(self.world_size)]
            self._wait(dist.all_gather(outs, buf, group=self.group, async_op=True), what)
            return [bytes(o[: int(s.item())].numpy()) for o, s in zip(outs, sizes, strict=True)]

        return self._collective(what, run)

    def start_allgather_ints(
        self, values: Sequence[int], what: str
    ) -> Callable[[], list[list[int]]]:
        """Start an all-gather of ``values`` (as many on every rank, signed 64-bit integers).

        Returns the function that waits for it and gives every rank's values, in rank order:
        the caller works meanwhile (a save stages its tensors). One collective.
        """
        if self.group is None:
            return lambda: [list(values)]
        mine = torch.tensor(list(values), dtype=torch.int64)
        outs = [torch.empty_like(mine) for _ in range(self.world_size)]
        work = self._collective(
            what, lambda: dist.all_gather(outs, mine, group=self.group, async_op=True)
        )

        def finish() -> list[list[int]]:
            self._wait(work, what)
            return [[int(v) for v in o.tolist()] for o in outs]

        return finish


def _encode(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _decode_all(outs: list[torch.Tensor], sizes: list[torch.Tensor]) -> list[Any]:
    return [json.loads(bytes(o[: int(s.item())].numpy())) for o, s in zip(outs, sizes, strict=True)]


def _process_gone(pid: int) -> bool:
    """Whether process ``pid`` no longer runs: absent, or a zombie its parent has not reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # exists, owned by someone else
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False  # no /proc here: it exists
    return state in (b"Z", b"X")


def make_comm(process_group: Any = None, timeout: float | None = None) -> Comm:
    """Return the :class:`Comm` for ``process_group`` (default group, or one process).

    Creating the side group is itself collective: every rank of the group must call this in the
    same order (save and load do).
    """
    t = float(timeout) if timeout is not None else DEFAULT_TIMEOUT_S
    if not (dist.is_available() and dist.is_initialized()):
        return Comm(0, 1, None, [0], t)
    pg = process_group if process_group is not None else dist.group.WORLD
    ranks = [int(r) for r in dist.get_process_group_ranks(pg)]
    world = len(ranks)
    rank = dist.get_rank(pg)
    if world == 1:
        return Comm(0, 1, None, ranks, t)
    with _LOCK:
        side = _GROUPS.get((tuple(ranks), t))
        if side is None or (tuple(ranks), t) in _BROKEN or not _alive(side):
            _BROKEN.discard((tuple(ranks), t))
            side = _new_side_group(ranks, rank, t)
            _GROUPS[(tuple(ranks), t)] = side
            # Who is who, so a failed collective can name a peer whose process is gone.
            me = [socket.gethostname(), os.getpid()]
            _PEERS[(tuple(ranks), t)] = Comm(rank, world, side, ranks, t).allgather_json(
                me, "peers"
            )
    return Comm(rank, world, side, ranks, t, _PEERS.get((tuple(ranks), t), ()))


def _alive(group: Any) -> bool:
    try:  # the group dies with destroy_process_group(); then make a new one
        dist.get_process_group_ranks(group)
    except Exception:
        return False
    return True


def new_gloo_group(ranks: list[int], timeout: float | None) -> Any:
    """A gloo group of ``ranks`` (a collective of those ranks only) that every member names alike.

    torch names a group made with local synchronization after the number of groups the calling
    rank is a member of. Once a job has made a group that not every rank is in (pipeline stage
    pairs, an evaluation group), that number differs between ranks, they compute different
    names and never meet. A group of the whole world is therefore made without local
    synchronization (every rank calls; the name is torch's shared counter). A group of some
    ranks must use it (the others do not call): its members must be members of the same
    earlier groups, which groups made by a DeviceMesh or by every member alike are.
    """
    kwargs: dict[str, Any] = {"backend": "gloo"}
    if timeout is not None:
        kwargs["timeout"] = _dt.timedelta(seconds=timeout)
    whole = sorted(ranks) == list(range(dist.get_world_size()))
    group = dist.new_group(ranks=ranks, use_local_synchronization=not whole, **kwargs)
    # gloo's constructor returns on a rank once its own side of each pair is up. A rank that
    # then left (a manager opened and closed at once: a job restarted after its last step)
    # closed its sockets while a peer was still connecting, and the peer's constructor failed
    # with "Connection closed by peer" (6 of 60 two-rank open/close runs on a loaded host).
    # A barrier returns on no member before every member's constructor returned.
    dist.barrier(group=group)
    return group


def _new_side_group(ranks: list[int], rank: int, timeout: float) -> Any:
    try:
        return new_gloo_group(ranks, timeout)
    except Exception as e:
        # A peer that never came: one whose previous save is still writing (a stalled disk),
        # a pause longer than the timeout, or a process that is gone (manager review 25, M1:
        # only gloo's "wait timeout ... keys" was said, and the loop died without knowing why).
        raise DistributedError(
            f"rank {rank}: cannot create the metadata group of ranks {_ranks_text(ranks)} "
            f"within {timeout:g} s: a rank did not reach this save or load in time (its "
            "previous save still writing to a stalled storage, a pause longer than `timeout`, "
            "or its process gone); this call failed on the ranks that waited, nothing was "
            "published; catch PCK-DISTRIBUTED to go on (the next call makes the group again), "
            f"or raise `timeout` ({e})") from e


def _ranks_text(ranks: list[int]) -> str:
    """``0..7``, or the first few ranks of a group that is not a range."""
    if ranks == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"{ranks[0]}..{ranks[-1]}"
    return ", ".join(map(str, ranks[:8])) + (", ..." if len(ranks) > 8 else "")
