"""Small JSON collectives over a dedicated gloo group (metadata only; never tensor data).

Every save/load exchanges a few small JSON documents (attempt id, status, writer indexes). They
travel over a side gloo group with its own timeout, created once per (ranks, timeout) and
cached, so that an async save's background thread never interleaves with the training
collectives of the main group, and so a dead or stuck peer yields a PCK-DISTRIBUTED error after
``timeout`` seconds instead of a hang. JSON travels as UTF-8 bytes in uint8 tensors (no pickle).
"""

from __future__ import annotations

import datetime as _dt
import json
import threading
from typing import Any

import torch
import torch.distributed as dist

from portable_ckpt.errors import DistributedError

__all__ = ["Comm", "DEFAULT_TIMEOUT_S", "make_comm"]

#: Default timeout of metadata collectives (seconds), the process group default.
DEFAULT_TIMEOUT_S = (
    float(dist.default_pg_timeout.total_seconds())
    if hasattr(dist, "default_pg_timeout")
    else 1800.0
)

_GROUPS: dict[tuple[tuple[int, ...], float], Any] = {}
_LOCK = threading.Lock()


class Comm:
    """JSON collectives among the ranks of one group (a single process when ``group`` is None).

    Attributes:
        rank: This process's rank in the group.
        world_size: Number of ranks.
        timeout: Seconds a collective may wait for peers.

    """

    def __init__(
        self, rank: int, world_size: int, group: Any, global_ranks: list[int], timeout: float
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.group = group
        self.global_ranks = global_ranks
        self.timeout = timeout

    def _fail(self, what: str, e: BaseException) -> DistributedError:
        return DistributedError(
            f"rank {self.rank}/{self.world_size}: collective '{what}' failed: {e}. A peer rank "
            f"died, raised outside the protocol, or exceeded the {self.timeout:.0f}s timeout; "
            f"nothing was published by this operation"
        )

    def _wait(self, work: Any, what: str) -> None:
        try:
            if work is not None:
                work.wait(_dt.timedelta(seconds=self.timeout))
        except Exception as e:
            raise self._fail(what, e) from e

    def allgather_json(self, obj: Any, what: str) -> list[Any]:
        """Every rank's ``obj``, in rank order."""
        data = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8")
        if self.group is None:
            return [json.loads(data)]
        try:
            size = torch.tensor([len(data)], dtype=torch.int64)
            sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
            self._wait(dist.all_gather(sizes, size, group=self.group, async_op=True), what)
            n = max(int(s.item()) for s in sizes)
            buf = torch.zeros(n, dtype=torch.uint8)
            buf[: len(data)] = (
                torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else buf[:0]
            )
            outs = [torch.empty(n, dtype=torch.uint8) for _ in range(self.world_size)]
            self._wait(dist.all_gather(outs, buf, group=self.group, async_op=True), what)
        except DistributedError:
            raise
        except Exception as e:
            raise self._fail(what, e) from e
        return [
            json.loads(bytes(o[: int(s.item())].numpy())) for o, s in zip(outs, sizes, strict=True)
        ]

    def gather_json(self, obj: Any, what: str) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (``None`` elsewhere)."""
        data = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8")
        if self.group is None:
            return [json.loads(data)]
        dst = self.global_ranks[0]
        try:
            size = torch.tensor([len(data)], dtype=torch.int64)
            sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
            self._wait(dist.all_gather(sizes, size, group=self.group, async_op=True), what)
            n = max(int(s.item()) for s in sizes)
            buf = torch.zeros(n, dtype=torch.uint8)
            if data:
                buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            outs = (
                [torch.empty(n, dtype=torch.uint8) for _ in range(self.world_size)]
                if self.rank == 0
                else None
            )
            self._wait(dist.gather(buf, outs, dst=dst, group=self.group, async_op=True), what)
        except DistributedError:
            raise
        except Exception as e:
            raise self._fail(what, e) from e
        if outs is None:
            return None
        return [
            json.loads(bytes(o[: int(s.item())].numpy())) for o, s in zip(outs, sizes, strict=True)
        ]

    def broadcast_json(self, obj: Any, what: str) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if self.group is None:
            return obj
        src = self.global_ranks[0]
        try:
            data = (
                json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8")
                if self.rank == 0
                else b""
            )
            size = torch.tensor([len(data)], dtype=torch.int64)
            self._wait(dist.broadcast(size, src=src, group=self.group, async_op=True), what)
            n = int(size.item())
            buf = torch.zeros(n, dtype=torch.uint8)
            if self.rank == 0 and data:
                buf[:] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            self._wait(dist.broadcast(buf, src=src, group=self.group, async_op=True), what)
        except DistributedError:
            raise
        except Exception as e:
            raise self._fail(what, e) from e
        return json.loads(bytes(buf.numpy()))


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
    cache_key = (tuple(ranks), t)
    with _LOCK:
        side = _GROUPS.get(cache_key)
        if side is not None:
            try:  # the group dies with destroy_process_group(); then make a new one
                dist.get_process_group_ranks(side)
            except Exception:
                side = None
        if side is None:
            try:
                side = dist.new_group(
                    ranks=ranks,
                    timeout=_dt.timedelta(seconds=t),
                    backend="gloo",
                    use_local_synchronization=True,
                )
            except Exception as e:
                raise DistributedError(f"rank {rank}: cannot create the metadata group: {e}") from e
            _GROUPS[cache_key] = side
    return Comm(rank, world, side, ranks, t)
