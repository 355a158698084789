"""Per-rank programs of the manager tests (run through portable_ckpt.torch.launch.run_group)."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from typing import Any

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import portable_ckpt
import portable_ckpt.torch as pckt
from portable_ckpt.errors import CheckpointError


class Trainer:
    """A tiny stateful 'model': a sharded weight, a step counter and an lr schedule."""

    def __init__(self, world: int, salt: float = 0.0) -> None:
        self.mesh = init_device_mesh("cpu", (world,))
        self.w = distribute_tensor(torch.arange(24.0).reshape(12, 2) + salt, self.mesh, [Shard(0)])
        self.lr = 0.1

    def step(self, step: int) -> float:
        with torch.no_grad():
            self.w += 1.0
        self.lr = 0.1 * (0.5 ** (step // 3))
        return float(100.0 / step)

    def state_dict(self) -> dict[str, Any]:
        return {"w": self.w, "lr": self.lr}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.lr = float(sd["lr"])  # w was filled in place


def _events(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def loop(rank: int, world: int, root: str, fast: str, events: str, kill_at: int) -> dict[str, Any]:
    """Decisions by steps, seconds, listed steps and fast_every; SIGTERM to the last rank only."""
    tr = Trainer(world)
    state = {"model": tr}
    mgr = pckt.CheckpointManager(
        root,
        save_every=4,
        save_steps=[5],
        keep_last=3,
        keep_best=("loss", 1, "min"),
        fast_root=fast,
        fast_every=1,
        fast_keep=2,
        verify_sample=1.0,
        events=events,
        timeout=30,
    )
    first = mgr.restore(state)
    saved: list[tuple[int, bool]] = []
    rng = random.Random(rank * 7 + 1)
    last = 0
    for step in range(1, 40):
        loss = tr.step(step)
        time.sleep(rng.random() * 0.05)  # every rank's clock reads differently
        if step == kill_at and rank == world - 1:
            os.kill(os.getpid(), signal.SIGTERM)  # only this rank is told
        saved.append((step, mgr.maybe_save(step, state, metrics={"loss": loss})))
        last = step
        if mgr.preempted:
            break
    mgr.close()
    # Wall-clock decisions: every rank's clock and pace differ; rank 0 decides for all.
    # replicate=True: durable saves land on the fast tier, then are copied to the root.
    clock = pckt.CheckpointManager(
        root + "-seconds",
        save_every_seconds=0.1,
        # Agree at every call: with the default 0.5 s between agreements, 8 steps of ~0.24 s
        # could all fall before the next one (no save by time at all, seen once under load).
        decision_interval=0,
        timeout=30,
        async_save=False,
        fast_root=root + "-seconds-fast",
        replicate=True,
        keep_last=2,
    )
    by_time = []
    for step in range(1, 9):
        time.sleep(rng.random() * 0.06)
        by_time.append(clock.maybe_save(step, {"model": tr}))
    clock.close()
    return {
        "by_time": by_time,
        "replicated": [e for e in clock.telemetry.history if e["event"] == "replicate"],
        "first": None if first is None else first.step,
        "saved": saved,
        "last": last,
        "preempted": mgr.preempted,
        "events": [e for e in mgr.telemetry.history],
    }


def resume(rank: int, world: int, root: str, fast: str, allow: bool) -> dict[str, Any]:
    tr = Trainer(world, salt=1000.0)
    state = {"model": tr}
    mgr = pckt.CheckpointManager(root, save_every=4, fast_root=fast, fast_every=1, timeout=30)
    info = mgr.restore(state, allow_statistical=allow)
    tr.step((info.step if info else 0) + 1)
    mgr.mark_resumed()
    full = tr.w.full_tensor()
    mgr.close()
    return {
        "step": None if info is None else info.step,
        "id": None if info is None else info.checkpoint_id,
        "w0": float(full[0, 0]),
        "lr": tr.lr,
        "events": mgr.telemetry.history,
    }


def failing_and_inflight(rank: int, world: int, root: str) -> dict[str, Any]:
    """A failing save keeps the older versions; an in-flight attempt survives retention."""
    tr = Trainer(world)
    mgr = pckt.CheckpointManager(root, save_every=1, keep_last=1, timeout=30)
    mgr.maybe_save(1, {"model": tr})
    mgr.wait()
    error = None
    try:
        mgr.maybe_save(2, {"model": tr, "bad": object()})  # PCK-UNSUPPORTED-VALUE on every rank
        mgr.wait()
    except CheckpointError as e:
        error = e.code
    after_fail = [v.step for v in portable_ckpt.list_versions(root) if v.status == "committed"]
    if rank == 0:  # another writer's attempt in progress: files, no manifest yet
        from portable_ckpt.io.writer import new_attempt_id

        busy = new_attempt_id(3)
        os.makedirs(os.path.join(root, busy, "data"))
        with open(os.path.join(root, busy, "data", "w00000-0000.safetensors"), "wb") as f:
            f.write(b"x" * 64)
    torch.distributed.barrier()
    mgr.maybe_save(4, {"model": tr})
    mgr.close()
    versions = [(v.step, v.status) for v in portable_ckpt.list_versions(root)]
    return {
        "error": error,
        "after_fail": after_fail,
        "versions": versions,
        "events": mgr.telemetry.history,
    }


def kill_mid_async(rank: int, world: int, root: str) -> dict[str, Any]:
    """SIGKILL of the last rank while an async save of step 2 is being written."""
    tr = Trainer(world)
    mgr = pckt.CheckpointManager(root, save_every=1, timeout=6)
    mgr.maybe_save(1, {"model": tr})
    mgr.wait()
    if rank == world - 1:
        from tests.torch._workers import die_after_first_shard

        die_after_first_shard()
    tr.step(2)
    mgr.maybe_save(2, {"model": tr})
    try:
        mgr.wait()
        return {"error": None}
    except CheckpointError as e:
        return {
            "error": e.code,
            "message": e.message,
            "failed": list(getattr(e, "failed_ranks", [])),
        }


def exit_pending(rank: int, world: int, root: str) -> dict[str, Any]:
    """Return with an async save in flight and without close(): interpreter exit finishes it."""
    tr = Trainer(world)
    big = distribute_tensor(torch.randn(256, 1024), tr.mesh, [Shard(0)])
    mgr = pckt.CheckpointManager(root, save_every=1, timeout=30)
    mgr.maybe_save(1, {"model": tr, "big": big})
    return {"pending": mgr._pending is not None and not mgr._pending.done()}


def load_options(rank: int, world: int, root: str) -> dict[str, Any]:
    """Mesh names do not count; a version directory loads; dtype casts warn once or refuse."""
    import logging

    named = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    unnamed = init_device_mesh("cpu", (world,))

    def build(mesh: Any, fill: bool, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
        return {
            "layers": [
                {
                    "w": distribute_tensor(
                        torch.full((4, 2), float(i) if fill else 0.0, dtype=dtype), mesh, [Shard(0)]
                    )
                }
                for i in range(3)
            ]
        }

    def full(state: dict[str, Any], i: int) -> torch.Tensor:
        return state["layers"][i]["w"].full_tensor()

    layers = build(named, True)
    info = pckt.save(layers, root, step=1, timeout=30)
    target = build(unnamed, False)
    exact = pckt.load(target, info.path, timeout=30)  # a version directory, mesh "dim0"
    same = all(torch.equal(full(target, i), full(layers, i)) for i in range(3))
    bf16 = build(unnamed, False, torch.bfloat16)
    seen: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Grab(level=logging.WARNING)
    logging.getLogger("portable_ckpt").addHandler(handler)
    pckt.load(bf16, root, timeout=30)
    logging.getLogger("portable_ckpt").removeHandler(handler)
    cast_ok = float(full(bf16, 2)[0, 0]) == 2.0
    refused = None
    try:
        pckt.load(bf16, root, strict_dtype=True, timeout=30)
    except CheckpointError as e:
        refused = e.code
    mismatch = None
    try:
        pckt.load(
            target,
            info.path,
            checkpoint_id="s000000000009-20260101T000000000000Z-0000000000000000",
            timeout=30,
        )
    except CheckpointError as e:
        mismatch = e.code
    return {
        "contract": exact.contract,
        "same": same,
        "casts": [m for m in seen if "cast" in m],
        "cast_ok": cast_ok,
        "refused": refused,
        "mismatch": mismatch,
    }


#: Node-local configurations: fast replicas, and replication with sampled verification.
NODE_CONFIGS: dict[str, dict[str, Any]] = {
    "0": {"fast_replicas": 0},
    "1": {"fast_replicas": 1},
    "rep": {"fast_replicas": 0, "replicate": True, "verify_sample": 1.0},
}


def _node_mgr(root: str, config: str) -> Any:
    return pckt.CheckpointManager(
        root,
        save_every=3,
        fast_root=root + "-fast/node{node}",
        fast_every=1,
        fast_keep=2,
        ranks_per_node=2,
        timeout=120,
        **NODE_CONFIGS[config],
    )


def _restored(mgr: Any, info: Any, fresh: Trainer) -> dict[str, Any]:
    ev = next(e for e in mgr.telemetry.history if e["event"] == "restore")
    return {
        "step": info.step if info else None,
        "tier": ev["tier"],
        "fetched": ev["fetched_from_peers"],
        "fallbacks": ev["fallbacks"],
        "w": fresh.w.full_tensor().tolist(),
    }


def _failed_node_verification(rank: int, world: int, root: str) -> dict[str, Any]:
    """Damage rank 2's file (node 1) of the newest fast version; verify it again on every rank.

    The failure is found by the rank that owns the file, agreed by all, recorded in both node
    roots, and the manager's restore skips the version (the older fast one is restored).
    """
    import torch.distributed as dist

    from portable_ckpt.torch._manager_nodelocal import verify_node_local

    mgr = _node_mgr(root, "rep")
    tier = mgr.tiers["fast"]
    newest = [v for v in portable_ckpt.list_versions(tier.storage) if v.status == "committed"][-1]
    if rank == 2:
        path = os.path.join(newest.path, "data", "w00002-0000.safetensors")
        with open(path, "r+b") as f:
            f.seek(-5, os.SEEK_END)
            byte = f.read(1)
            f.seek(-5, os.SEEK_END)
            f.write(bytes([byte[0] ^ 0xFF]))
    dist.barrier()
    got = verify_node_local(mgr._bg_comm, tier.layout, tier.storage, newest.id, 1.0)
    fresh = Trainer(world, salt=500.0)
    info = mgr.restore({"model": fresh})
    mgr.close()
    return {
        "ok": got.ok,
        "codes": sorted({e["code"] for e in got.errors}),
        "chunks_by_rank": got.chunks_by_rank,
        "failed_id": newest.id,
        "restored": info.step if info else None,
        "tier": _restored(mgr, info, fresh)["tier"],
    }


def node_local_save(rank: int, world: int, base: str) -> dict[str, Any]:
    """2 nodes x 2 ranks: save to node-local roots (each configuration), restore; lose node 1.

    One process group for the whole scenario (a launch of 4 ranks costs more than the saves):
    after the intact restores, rank 0 moves every ``node1`` root away (the test inspects it
    there) — node 1 is lost and replaced by an empty node — and every configuration restores
    again.
    """
    import shutil

    import torch.distributed as dist

    out: dict[str, Any] = {"intact": {}, "lost": {}}
    for config in NODE_CONFIGS:
        root = f"{base}/r{config}"
        tr = Trainer(world)
        with _node_mgr(root, config) as mgr:
            for step in range(1, 5):
                tr.step(step)
                mgr.maybe_save(step, {"model": tr})
        fresh = Trainer(world, salt=500.0)
        with _node_mgr(root, config) as again:
            info = again.restore({"model": fresh})
        out["intact"][config] = _restored(again, info, fresh)
        kinds = ("replicate", "verify")
        out["intact"][config]["events"] = [e for e in mgr.telemetry.history if e["event"] in kinds]
    out["bad"] = _failed_node_verification(rank, world, f"{base}/rrep")
    dist.barrier()
    if rank == 0:
        for config in NODE_CONFIGS:
            fast = f"{base}/r{config}-fast"
            shutil.move(f"{fast}/node1", f"{fast}/node1-lost")
    dist.barrier()
    for config in NODE_CONFIGS:
        fresh = Trainer(world, salt=500.0)
        with _node_mgr(f"{base}/r{config}", config) as lost:
            info = lost.restore({"model": fresh})
        out["lost"][config] = _restored(lost, info, fresh)
    return out


def sigterm_chain(rank: int, world: int, root: str) -> str:
    """The first SIGTERM preempts (the next maybe_save saves); a second one terminates."""
    mgr = pckt.CheckpointManager(root, save_every=100, async_save=False)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)  # the handler runs between bytecodes
    saved = mgr.maybe_save(1, {"x": torch.zeros(2)})
    with open(os.path.join(root, "after-one.json"), "w", encoding="utf-8") as f:
        json.dump([saved, mgr.preempted], f)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)
    return "survived the second SIGTERM"


class _SlowWrites:
    """A storage whose writers wait ``seconds`` before each write (a loaded node's slow disk).

    A local file is written in place: meanwhile it exists, empty, under its name.
    """

    def __init__(self, storage: Any, seconds: float) -> None:
        self._storage, self._seconds = storage, seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._storage, name)

    def open_writer(self, path: str, **kwargs: Any) -> Any:
        writer, seconds = self._storage.open_writer(path, **kwargs), self._seconds

        class Slow:
            close, abort = writer.close, writer.abort

            def write(self, data: Any) -> None:
                time.sleep(seconds)
                writer.write(data)

        return Slow()


def _four_node_local_saves(world: int, root: str) -> str:
    """Steps 1 to 4 saved with fast_replicas=1 (fast: every step; durable: step 3); ``root``."""
    tr = Trainer(world)
    with _node_mgr(root, "1") as mgr:
        for step in range(1, 5):
            tr.step(step)
            mgr.maybe_save(step, {"model": tr})
    return root


def node_lost_slow_fetch(rank: int, world: int, base: str) -> dict[str, Any]:
    """fast_replicas=1, node 1 lost and replaced; there rank 2's fetched files land slowly.

    Both ranks of the new node 1 need rank 0's files (global entries): each is fetched once
    per node, by rank 2, while rank 3 fetches only its own shard (quickly). Rank 3 must not
    judge the version before rank 2 has written them: the restore comes from the fast tier.
    """
    import shutil

    import torch.distributed as dist

    from portable_ckpt.torch import _transfer

    root = _four_node_local_saves(world, f"{base}/r1")
    dist.barrier()
    if rank == 0:
        shutil.move(f"{root}-fast/node1", f"{root}-fast/node1-lost")
    dist.barrier()
    if rank == 2:
        recv = _transfer._recv

        def slow_recv(storage: Any, *args: Any) -> int:
            return recv(_SlowWrites(storage, 1.0), *args)

        _transfer._recv = slow_recv
    fresh = Trainer(world, salt=500.0)
    with _node_mgr(root, "1") as lost:
        info = lost.restore({"model": fresh})
    return _restored(lost, info, fresh)


def node_slow_publish(rank: int, world: int, base: str) -> dict[str, Any]:
    """replicate=True on node-local roots, no verification; node 1's leader publishes slowly.

    Rank 3 returns from the save before rank 2 published the commit record in node 1's root;
    the replication it starts must not look for the record there before it is published.
    """
    root = f"{base}/slow"
    mgr = pckt.CheckpointManager(
        root,
        save_every=2,
        fast_root=root + "-fast/node{node}",
        fast_every=1,
        ranks_per_node=2,
        replicate=True,
        timeout=120,
    )
    if rank == 2:
        storage = mgr.tiers["fast"].storage
        create = storage.create_if_absent

        def slow_create(path: str, data: bytes) -> bool:
            time.sleep(1.0)
            return bool(create(path, data))

        storage.create_if_absent = slow_create
    tr = Trainer(world)
    error = None
    try:
        for step in range(1, 3):
            tr.step(step)
            mgr.maybe_save(step, {"model": tr})
        mgr.close()
    except CheckpointError as e:
        error = e.message
    events = [e for e in mgr.telemetry.history if e["event"] == "replicate"]
    return {"error": error, "replicated": [(e["ok"], e.get("message")) for e in events]}


def failing_saves(rank: int, world: int, root: str) -> dict[str, Any]:
    """Rank 1's disk is full from step 2: each failure is said on stderr, the 3rd in a row stops.

    Each step waits for the save's background work, so the raise comes at a known step.
    """
    import contextlib
    import dataclasses
    import io

    from portable_ckpt.storage.faults import Fault, FaultyStorage

    tr = Trainer(world)
    err = io.StringIO()
    out: dict[str, Any] = {"raised": None}
    with contextlib.redirect_stderr(err):
        mgr = pckt.CheckpointManager(root, save_every=1, timeout=30)  # max_failed_saves=3
        tier = mgr.tiers["durable"]
        full = FaultyStorage(tier.storage, [Fault(op="write", path="*/data/*", error="ENOSPC")])
        for step in range(1, 7):
            if step == 2 and rank == 1:
                mgr.tiers["durable"] = dataclasses.replace(tier, storage=full)
            try:
                mgr.maybe_save(step, {"model": tr}, metrics={"loss": 1.0})
            except CheckpointError as e:
                out["raised"] = [step, e.code, e.message, repr(e.__cause__)]
                break
            for fut in list(mgr._post):
                fut.result()  # the failure of this step is known before the next call
        out["last_error_after_raise"] = repr(mgr.last_error)
        mgr.tiers["durable"] = tier  # the disk has room again: training goes on, saves work
        mgr.maybe_save(7, {"model": tr}, metrics={"loss": 1.0})
        mgr.close()  # nothing left to raise: the failures were surfaced by the raise
    out["stderr"] = err.getvalue()
    out["commits"] = [
        [e["step"], e["ok"], e.get("failed_in_a_row")]
        for e in mgr.telemetry.history
        if e["event"] == "commit"
    ]
    return out


def tier_failures(rank: int, world: int, root: str, fast: str, failing: str) -> dict[str, Any]:
    """Rank 1's ``failing`` tier cannot be written: durable at even steps, fast at odd ones."""
    import contextlib
    import dataclasses
    import io

    from portable_ckpt.storage.faults import Fault, FaultyStorage

    tr = Trainer(world)
    err = io.StringIO()
    out: dict[str, Any] = {"raised": None}
    with contextlib.redirect_stderr(err):
        mgr = pckt.CheckpointManager(root, save_every=2, fast_root=fast, fast_every=1, timeout=30)
        tier = mgr.tiers[failing]
        if rank == 1:
            full = FaultyStorage(tier.storage, [Fault(op="write", path="*/data/*", error="ENOSPC")])
            mgr.tiers[failing] = dataclasses.replace(tier, storage=full)
        for step in range(1, 9):
            try:
                mgr.maybe_save(step, {"model": tr}, metrics={"loss": 1.0})
            except CheckpointError as e:
                out["raised"] = [step, e.code]
                break
            for fut in list(mgr._post):
                fut.result()
        mgr.tiers[failing] = tier
        with contextlib.suppress(CheckpointError):
            mgr.close()
    out["stderr"] = err.getvalue()
    commits = [e for e in mgr.telemetry.history if e["event"] == "commit" and e["ok"]]
    out["fast_ok"] = [e["step"] for e in commits if e["tier"] == "fast"]
    out["durable_ok"] = [e["step"] for e in commits if e["tier"] == "durable"]
    return out


def _sigint_outcome() -> str:
    """Send this process a SIGINT: ``"KeyboardInterrupt"`` or ``"survived"`` (5 s later)."""
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    except KeyboardInterrupt:
        return "KeyboardInterrupt"
    return "survived"


def sigint_preempts(rank: int, world: int, root: str) -> dict[str, Any]:
    """handle_sigint=True: a first SIGINT preempts, a second is KeyboardInterrupt; off: as ever."""
    out: dict[str, Any] = {}
    mgr = pckt.CheckpointManager(root, save_every=100, async_save=False, handle_sigint=True)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)  # the handler runs between bytecodes
    out["saved"] = mgr.maybe_save(1, {"x": torch.zeros(2)})
    out["preempted"] = mgr.preempted
    out["events"] = [e for e in mgr.telemetry.history if e["event"] in ("preempted", "save")]
    out["second"] = _sigint_outcome()
    mgr.close()
    plain = pckt.CheckpointManager(root, save_every=100)  # handle_sigint=False by default
    out["default"] = _sigint_outcome()
    out["default_preempted"] = plain._preemption.seen.is_set()
    plain.close()
    return out


class _FullDisk(_SlowWrites):
    """A storage whose writers fail with ENOSPC at their first write (a replacement node's
    full NVMe)."""

    def __init__(self, storage: Any) -> None:
        super().__init__(storage, 0.0)

    def open_writer(self, path: str, **kwargs: Any) -> Any:
        from portable_ckpt.errors import StorageError

        writer = self._storage.open_writer(path, **kwargs)

        class Full:
            close, abort = writer.close, writer.abort

            def write(self, data: Any) -> None:
                raise StorageError(f"write {path!r}: No space left on device (errno 28)")

        return Full()


def node_damage_falls_back(rank: int, world: int, base: str) -> dict[str, Any]:
    """A node whose copy of the newest record is torn, then a replacement node whose disk is
    full: each made two ranks fail outside any agreement while the others waited for the
    collective timeout (tier review F8, F9). Both fall back, agreed and promptly."""
    import shutil

    import torch.distributed as dist

    from portable_ckpt.torch import _transfer

    root = _four_node_local_saves(world, f"{base}/r1")
    out: dict[str, Any] = {}
    dist.barrier()
    if rank == 0:  # node 1's copy of step 4's record: torn on its disk
        [newest] = [p for p in os.listdir(f"{root}-fast/node1") if p.startswith("s000000000004-")]
        record = f"{root}-fast/node1/{newest}/manifest.json"
        shutil.copy(record, f"{base}/record.bak")
        with open(record, "r+b") as f:
            f.truncate(200)
    dist.barrier()

    def timed_restore() -> dict[str, Any]:
        t0 = time.monotonic()
        fresh = Trainer(world, salt=500.0)
        with _node_mgr(root, "1") as mgr:
            info = mgr.restore({"model": fresh})
        return {**_restored(mgr, info, fresh), "seconds": time.monotonic() - t0}

    out["torn"] = timed_restore()
    dist.barrier()
    if rank == 0:  # node 1 lost and replaced by a node whose disk is full
        shutil.move(f"{root}-fast/node1", f"{root}-fast/node1-lost")
    dist.barrier()
    if rank in (2, 3):
        recv = _transfer._recv

        def full_recv(storage: Any, *args: Any) -> int:
            return recv(_FullDisk(storage), *args)

        _transfer._recv = full_recv
    out["full"] = timed_restore()
    dist.barrier()
    node1 = f"{root}-fast/node1"  # the replacement node's root: no record of what it lacks
    out["node1_records"] = sorted(
        d for d in (os.listdir(node1) if os.path.isdir(node1) else [])
        if os.path.exists(f"{node1}/{d}/manifest.json")
    )
    return out


def node_disk_full_save(rank: int, world: int, base: str) -> dict[str, Any]:
    """Node 1's fast root refuses every write (full): its node-local saves fail on every rank,
    at once, and the durable saves go on (tier review F2: the group timed out for good)."""
    from portable_ckpt.errors import CheckpointError, StorageError

    root = f"{base}/r0"
    tr = Trainer(world)
    t0 = time.monotonic()
    closed = None
    mgr = _node_mgr(root, "0")
    if rank == 2:  # node 1's leader: shards, fetched copies and the record all refused
        st = mgr.tiers["fast"].storage

        def full(path: str, *a: Any, **k: Any) -> Any:
            raise StorageError(f"create {path!r}: No space left on device (errno 28)")

        st.create_if_absent = full
        st.open_writer = full
    for step in range(1, 7):
        tr.step(step)
        mgr.maybe_save(step, {"model": tr})
    try:
        mgr.close()
    except CheckpointError as e:
        closed = e.code
    return {
        "seconds": time.monotonic() - t0,
        "durable": [v.step for v in portable_ckpt.list_versions(root)],
        "closed": closed,
    }


def node_replication_fails(rank: int, world: int, base: str) -> dict[str, Any]:
    """replicate=True on node-local roots; rank 2 cannot write to the durable root (full).

    Each failed copy is agreed, so the stop after ``max_failed_saves`` names the replication
    error on every rank (tier review F7: ranks other than 0 said "last error: None").
    """
    import dataclasses

    from portable_ckpt.errors import CheckpointError
    from portable_ckpt.storage.faults import Fault, FaultyStorage

    root = f"{base}/r"
    tr = Trainer(world)
    out: dict[str, Any] = {"raised": None}
    mgr = pckt.CheckpointManager(
        root,
        save_every=1,
        fast_root=root + "-fast/node{node}",
        fast_every=1,
        ranks_per_node=2,
        replicate=True,
        max_failed_saves=2,
        timeout=60,
    )
    if rank == 2:
        tier = mgr.tiers["durable"]
        full = FaultyStorage(tier.storage, [Fault(op="write", path="*/data/*", error="ENOSPC")])
        mgr.tiers["durable"] = dataclasses.replace(tier, storage=full)
    for step in range(1, 5):
        tr.step(step)
        try:
            mgr.maybe_save(step, {"model": tr})
        except CheckpointError as e:
            out["raised"] = [step, e.code, e.message]
            break
        for fut in list(mgr._post):
            fut.result()  # the copy's outcome is known before the next call
    out["durable"] = [
        [v.step, v.status] for v in portable_ckpt.list_versions(root)
    ]
    out["fast"] = [v.step for v in portable_ckpt.list_versions(f"{root}-fast/node0")]
    mgr.close()
    return out


def late_rank_once(rank: int, world: int, root: str) -> dict[str, Any]:
    """Rank 1 is late past the timeout once; the caught failure is the only one (async review
    F8: the decision group a timeout closed was kept, and every later maybe_save failed)."""
    from portable_ckpt.errors import CheckpointError

    tr = Trainer(world)
    out: list[Any] = []
    # 10 s: a loaded CI machine's ranks may reach the first decision seconds apart
    mgr = pckt.CheckpointManager(root, save_every=1, timeout=10, async_save=False)
    for step in range(1, 5):
        if step == 2 and rank == 1:
            time.sleep(14)
        try:
            out.append([step, mgr.maybe_save(step, {"model": tr})])
        except CheckpointError as e:
            out.append([step, e.code])
    mgr.close()
    return {"steps": out, "committed": [v.step for v in portable_ckpt.list_versions(root)]}


def _paced(mgr: Any, steps: range, x: torch.Tensor, kill: int | None = None) -> list[int]:
    """maybe_save at each step of ``steps`` (2 ms apart); the steps it saved. ``kill``: the
    step at which this process sends itself a SIGTERM (before that step's call)."""
    saved = []
    for s in steps:
        time.sleep(0.002)
        if s == kill:
            os.kill(os.getpid(), signal.SIGTERM)
        if mgr.maybe_save(s, {"x": x}):
            saved.append(s)
        if mgr.preempted:
            break
    return saved


def decision_schedule(rank: int, world: int, root: str) -> dict[str, Any]:
    """Agreements between step-rule saves (decision_interval), a SIGTERM to the last rank only,
    a loop that goes back, ranks that pass different steps."""
    out: dict[str, Any] = {}
    x = torch.arange(4.0)  # the same on every rank
    kw: dict[str, Any] = {"async_save": False, "timeout": 30}
    for name, interval in (("default", None), ("every step", 0)):
        extra = {} if interval is None else {"decision_interval": interval}
        with pckt.CheckpointManager(
            f"{root}/{name}", save_every=40, save_steps=[57], handle_sigterm=False, **kw, **extra
        ) as mgr:
            saved = _paced(mgr, range(1, 121), x)
            out[name] = {"saved": saved, "agreements": mgr._agreements}
    # A SIGTERM to the last rank at step 30; no step rule saves before step 1000.
    with pckt.CheckpointManager(f"{root}/sigterm", save_every=1000, **kw) as mgr:
        saved = _paced(mgr, range(1, 300), x, kill=30 if rank == world - 1 else None)
        out["sigterm"] = {"saved": saved, "preempted": mgr.preempted}
    # A loop that goes back (restarted after a restore) agrees at once.
    with pckt.CheckpointManager(
        f"{root}/back", save_every=1000, decision_interval=60, handle_sigterm=False, **kw
    ) as mgr:
        _paced(mgr, range(1, 20), x)
        before = mgr._agreements
        _paced(mgr, range(5, 6), x)
        out["back"] = mgr._agreements - before
    # Ranks that pass different steps: every rank is told at the agreement, then it works.
    with pckt.CheckpointManager(f"{root}/differ", save_every=2, handle_sigterm=False, **kw) as mgr:
        try:
            mgr.maybe_save(1 + rank, {"x": x})
            out["differ"] = None
        except CheckpointError as e:
            out["differ"] = [e.code, str(e)]
        out["after"] = mgr.maybe_save(2, {"x": x})
    return out


def _slow_share_of_step_2(rank: int) -> None:
    """Rank 1's copy share of step 2 takes 5 s, the background group's timeout 3 s."""
    import portable_ckpt.torch._manager_nodelocal as nl

    nl.BACKGROUND_TIMEOUT_S = 3.0
    real = nl._copy_files

    def slow(src: Any, dst: Any, attempt: str, recs: Any) -> Any:
        if rank == 1 and attempt.startswith("s000000000002"):
            time.sleep(5.0)
        return real(src, dst, attempt, recs)

    nl._copy_files = slow


def node_copy_share_too_slow(rank: int, world: int, base: str) -> dict[str, Any]:
    """Race review F5: one node's copy share of step 2 outlasts the background group's timeout
    (3 s here). That replication fails, counted and said; the group is made anew at the next
    agreement and the later replications go on."""
    _slow_share_of_step_2(rank)
    mgr = pckt.CheckpointManager(
        f"{base}/durable", fast_root=f"{base}/fast{{node}}", ranks_per_node=1, replicate=True,
        save_every=1, timeout=3, continuation="statistical", max_failed_saves=3, keep_last=100,
        async_save=False,
    )
    state = {"x": torch.arange(4.0)}
    seen = []
    for step in range(1, 5):
        mgr.maybe_save(step, state)
        time.sleep(7.0 if step == 2 else 0.2)  # the failure is known before step 3
        seen.append(mgr._failed_saves)
    try:
        mgr.close()
    except CheckpointError as e:
        seen.append(e.code)
    committed = [v.step for v in portable_ckpt.list_versions(f"{base}/durable")
                 if v.status == "committed"]
    events = [e for e in mgr.telemetry.history if e["event"] == "replicate"]
    return {"failed": seen, "committed": committed,
            "replicated": [(e["checkpoint_id"][:13], e["ok"]) for e in events]}


def node_copy_share_too_slow_saves_go_on(rank: int, world: int, base: str) -> dict[str, Any]:
    """Attack review 4 A3: as node_copy_share_too_slow, but the loop goes on saving (async,
    every 0.3 s) while rank 1's share of step 2 runs: every replication queued behind it had
    the group that broke and failed at once, counted (11 failures, the job stopped)."""
    _slow_share_of_step_2(rank)
    mgr = pckt.CheckpointManager(
        f"{base}/durable", fast_root=f"{base}/fast{{node}}", ranks_per_node=1, replicate=True,
        save_every=1, timeout=3, continuation="statistical", max_failed_saves=3, keep_last=100,
        handle_sigterm=False, decision_interval=0,
    )
    state = {"x": torch.arange(4.0)}
    most = 0
    for step in range(1, 25):  # on past the failure (~4 s): its group is renewed mid-loop
        mgr.maybe_save(step, state)  # max_failed_saves=3 would raise here
        most = max(most, mgr._failed_saves)
        time.sleep(0.3)
    mgr.close()
    committed = [v.step for v in portable_ckpt.list_versions(f"{base}/durable")
                 if v.status == "committed"]
    events = [e for e in mgr.telemetry.history if e["event"] == "replicate"]
    return {"most_failed": most, "committed": committed,
            "failed_steps": [int(e["checkpoint_id"][1:13]) for e in events if not e["ok"]]}


def _node_local_run(rank: int, world: int, base: str, steps: int) -> dict[str, Any]:
    """Save ``steps`` steps of a sharded DTensor on node-local roots (one per rank) with
    replication and full sampled verification; then restore in a fresh manager."""
    kw: dict[str, Any] = dict(
        fast_root=f"{base}/fast{{node}}", ranks_per_node=1, replicate=True, save_every=1,
        timeout=10, continuation="statistical", max_failed_saves=None, keep_last=100,
        fast_keep=100, handle_sigterm=False, verify_sample=1.0, async_save=False,
    )
    mesh = init_device_mesh("cpu", (world,))
    with pckt.CheckpointManager(f"{base}/durable", **kw) as mgr:
        for step in range(1, steps + 1):
            mgr.maybe_save(step, {"w": distribute_tensor(torch.arange(8.0) * step, mesh,
                                                         [Shard(0)])})
    failed = sorted(int(v.step) for v in portable_ckpt.list_versions(f"{base}/fast{rank}")
                    if v.verification_failed)
    w = distribute_tensor(torch.zeros(8), mesh, [Shard(0)])
    with pckt.CheckpointManager(f"{base}/durable", **kw) as m2:
        info = m2.restore({"w": w})
    durable = [v.step for v in portable_ckpt.list_versions(f"{base}/durable")
               if v.status == "committed"]
    return {"durable": durable, "failed": failed, "restored": None if info is None else info.step,
            "w": w.to_local().tolist()}


def node_local_with_tensor_tables(rank: int, world: int, base: str) -> dict[str, Any]:
    """Attack review 4 A6: a job large enough for tensor tables (threshold 0 here) could not
    save to a node-local tier: the committer could not read other nodes' writer tables."""
    import portable_ckpt.torch.saving as saving

    saving.TABLE_THRESHOLD = 0
    return _node_local_run(rank, world, base, 3)


def node_local_stat_eio(rank: int, world: int, base: str) -> dict[str, Any]:
    """Attack review 4 A7: one EIO of a size during step 2's node-local verification made an
    intact file "on no node root": failed for good, not replicated, step 1 restored."""
    import portable_ckpt.torch._manager_nodelocal as nl
    from portable_ckpt.errors import StorageError
    from portable_ckpt.storage.local import LocalStorage

    armed = {"on": False, "done": False}
    real_size = LocalStorage.size

    def flaky(self: Any, path: str) -> int:
        if armed["on"] and rank == 1 and "s000000000002" in path and "/data/w00001" in path \
                and not armed["done"]:
            armed["done"] = True
            raise StorageError(f"stat {path}: Input/output error (errno 5) [injected]", path=path)
        return int(real_size(self, path))

    LocalStorage.size = flaky  # type: ignore[method-assign]
    real_verify = nl.verify_node_local

    def verify(*a: Any, **k: Any) -> Any:
        armed["on"] = True
        try:
            return real_verify(*a, **k)
        finally:
            armed["on"] = False

    nl.verify_node_local = verify
    out = _node_local_run(rank, world, base, 2)
    out["injected"] = armed["done"]
    return out


def node_local_then_one_node(rank: int, world: int, base: str) -> dict[str, Any]:
    """SRE review F1: a node-local fast version (step 3) restored by a job now on one node: the
    other node's files are not in this node root; the restore falls back to the durable step 2
    and must not record the fast version as damaged (it is whole across the two nodes)."""
    mesh = init_device_mesh("cpu", (world,))
    kw: dict[str, Any] = dict(fast_root=f"{base}/fast{{node}}", save_every=2, fast_every=1,
                              timeout=20, continuation="statistical", handle_sigterm=False,
                              async_save=False)
    with pckt.CheckpointManager(f"{base}/durable", ranks_per_node=1, **kw) as mgr:
        for step in (1, 2, 3):
            mgr.maybe_save(step, {"w": distribute_tensor(torch.arange(8.0) * step, mesh,
                                                         [Shard(0)])})
    w = distribute_tensor(torch.zeros(8), mesh, [Shard(0)])
    with pckt.CheckpointManager(f"{base}/durable", ranks_per_node=world, **kw) as m2:
        info = m2.restore({"w": w})
    return {"restored": None if info is None else info.step,
            "failed": [v.step for v in portable_ckpt.list_versions(f"{base}/fast0")
                       if v.verification_failed],
            "passed_over": [] if info is None else [
                [r["step"], r["reason"], r["recorded_failed"]] for r in info.passed_over]}


def requested_preemption(rank: int, world: int, base: str) -> dict[str, Any]:
    """Integrator review F9: a trainer that owns its signals (handle_sigterm=False) asks for the
    preemption save from its own handler on one rank; every rank saves and stops."""
    import signal as _signal

    mgr = pckt.CheckpointManager(base, save_every=1000, handle_sigterm=False, timeout=30,
                                 continuation="statistical")
    if rank == 1:
        _signal.signal(_signal.SIGUSR1, lambda *_: mgr.request_preemption())
    x = torch.arange(4.0)
    stopped = None
    for step in range(1, 200):
        if rank == 1 and step == 5:
            os.kill(os.getpid(), _signal.SIGUSR1)  # the trainer's requeue signal
        mgr.maybe_save(step, {"x": x + step})
        if mgr.preempted:
            stopped = step
            break
        time.sleep(0.01)
    mgr.close()
    committed = [v.step for v in portable_ckpt.list_versions(base) if v.status == "committed"]
    return {"stopped": stopped, "committed": committed}


def node_local_rollback(rank: int, world: int, base: str) -> str:
    """SRE review F6: a rollback (restore(step=...)) with newer steps on a node-local fast tier
    was not said (the warning looked at shared tiers only); the next restart undid it."""
    import contextlib
    import io

    mesh = init_device_mesh("cpu", (world,))
    kw: dict[str, Any] = dict(fast_root=f"{base}/fast{{node}}", ranks_per_node=1, fast_every=1,
                              fast_keep=3, save_every=100, timeout=20, async_save=False,
                              continuation="statistical", handle_sigterm=False)
    with pckt.CheckpointManager(f"{base}/durable", **kw) as mgr:
        for step in (1, 2, 3):
            mgr.maybe_save(step, {"w": distribute_tensor(torch.arange(8.0) * step, mesh,
                                                         [Shard(0)])})
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pckt.CheckpointManager(f"{base}/durable", **kw) as m2:
        m2.restore({"w": distribute_tensor(torch.zeros(8), mesh, [Shard(0)])}, step=2)
    return err.getvalue()


def many_managers(rank: int, world: int, base: str) -> dict[str, Any]:
    """Integrator review F10: every closed manager kept its gloo group (~5 fds, 2 sockets)."""
    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    def one(i: int) -> None:
        with pckt.CheckpointManager(f"{base}/r{i}", save_every=1, async_save=False,
                                    handle_sigterm=False, continuation="statistical") as mgr:
            mgr.maybe_save(1, {"x": torch.arange(4.0)})

    one(0)  # first use: torch's own lazily made state
    before = fds()
    for i in range(1, 11):
        one(i)
    return {"grown": fds() - before}


def node_local_replicated(rank: int, world: int, base: str) -> None:
    """A node-local version copied to the durable root (its record keeps ``pck.placement``)."""
    with pckt.CheckpointManager(f"{base}/durable", fast_root=f"{base}/fast{{node}}",
                                ranks_per_node=1, replicate=True, save_every=1,
                                async_save=False, handle_sigterm=False,
                                continuation="statistical") as mgr:
        mgr.maybe_save(1, {"w": torch.arange(1000.0) + rank})


class _StopsOnLoad:
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def state_dict(self) -> dict[str, Any]:
        return {"v": 1}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        if self.rank == 1:
            raise KeyboardInterrupt


def interrupted_restore(rank: int, world: int, root: str) -> dict[str, Any]:
    """Race review F3: Ctrl-C in rank 1's load_state_dict. Rank 1 stops (KeyboardInterrupt),
    rank 0 fails at once naming it, without trying older versions (which would wait for a
    rank that left)."""
    x = torch.arange(4.0)
    with pckt.CheckpointManager(root, save_every=1, async_save=False, timeout=30,
                                handle_sigterm=False, continuation="statistical") as mgr:
        for step in (1, 2):
            mgr.maybe_save(step, {"x": x, "s": _StopsOnLoad(rank)})
    mgr = pckt.CheckpointManager(root, save_every=1, timeout=30, handle_sigterm=False,
                                 continuation="statistical")
    t0 = time.monotonic()
    try:
        mgr.restore({"x": torch.zeros(4), "s": _StopsOnLoad(rank)})
        out = "restored"
    except KeyboardInterrupt:
        out = "KeyboardInterrupt"
    except CheckpointError as e:
        out = e.code + (" names rank 1" if "rank 1" in str(e) else "")
    seconds = time.monotonic() - t0
    mgr.close()
    return {"out": out, "seconds": seconds}


def late_restore(rank: int, world: int, root: str) -> dict[str, Any]:
    """Race review F4: a rank later than ``timeout`` to restore() made it raise gloo's own
    RuntimeError, and the next maybe_save failed on every rank (the group was left broken)."""
    x = torch.arange(4.0)
    mgr = pckt.CheckpointManager(root, save_every=1, async_save=False, timeout=3,
                                 handle_sigterm=False, continuation="statistical")
    mgr.maybe_save(1, {"x": x})
    if rank == 1:
        time.sleep(5.0)
    try:
        mgr.restore({"x": torch.zeros(4)})
        out = "restored"
    except Exception as e:
        out = f"{type(e).__name__} {getattr(e, 'code', '')}"
    time.sleep(1.0 if rank == 0 else 0.0)  # both past their failures
    saved = mgr.maybe_save(2, {"x": x})
    mgr.close()
    return {"restore": out, "saved": saved}


def _prom_samples(path: str) -> dict[str, float]:
    """The samples of a Prometheus textfile as ``{"metric|tier": value}``."""
    out: dict[str, float] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            name, rest = line.split("{", 1)
            tier = rest.split('tier="', 1)[1].split('"', 1)[0]
            out[f"{name}|{tier}"] = float(line.rsplit(" ", 1)[1])
    return out


def ops_signals_first_run(rank: int, world: int, root: str, prom: str) -> None:
    """Steps 1 and 2, with a Prometheus textfile per rank (SRE review 2, W5)."""
    tr = Trainer(world)
    with pckt.CheckpointManager(root, save_every=1, keep_last=5, timeout=30,
                                events=prom) as mgr:
        for step in (1, 2):
            tr.step(step)
            mgr.maybe_save(step, {"model": tr})


def ops_signals_restart(rank: int, world: int, root: str, prom: str) -> dict[str, Any]:
    """Restart: restore, rank 1's disk full at step 3, step 4 saved; each rank's file twice."""
    import contextlib
    import dataclasses
    import io

    from portable_ckpt.storage.faults import Fault, FaultyStorage

    tr = Trainer(world, salt=1000.0)
    path = prom.replace("{rank}", str(rank))
    out: dict[str, Any] = {"raised": None}
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        mgr = pckt.CheckpointManager(root, save_every=1, keep_last=5, timeout=30, events=prom)
        info = mgr.restore({"model": tr})
        out["restored"] = None if info is None else info.step
        out["seeded"] = _prom_samples(path)
        tier = mgr.tiers["durable"]
        if rank == 1:
            mgr.tiers["durable"] = dataclasses.replace(tier, storage=FaultyStorage(
                tier.storage, [Fault(op="write", path="*/data/*", error="ENOSPC")]))
        for step in (3, 4):
            tr.step(step)
            try:
                mgr.maybe_save(step, {"model": tr})
            except CheckpointError as e:
                out["raised"] = [step, e.code]
            for fut in list(mgr._post):
                fut.result()  # this step's commit, retention and events are done
            mgr.tiers["durable"] = tier  # room again from step 4
        mgr.close()
    out["after"] = _prom_samples(path)
    out["stderr"] = err.getvalue()
    return out


def node_local_foreign_record_and_lost_fetch(rank: int, world: int, base: str) -> dict[str, Any]:
    """2 nodes x 1 rank, one fast replica (mutation audit B N02 and N04).

    ``foreign``: node 1's root already holds another commit record at the attempt's path when
    its leader publishes the record there (planted just before the real publish): the save
    fails on every rank. ``lost``: node 1 is replaced by an empty node; the restore fetches its
    files from node 0's replica, and node 1's disk loses one fetched file of step 2 right after
    the real transfer: step 2 is not usable, node 1's root gets no commit record of it, and
    step 1 is restored from the fast tier.
    """
    import shutil

    import torch.distributed as dist

    from portable_ckpt.torch import _nodelocal

    mesh = init_device_mesh("cpu", (world,))
    kw: dict[str, Any] = dict(ranks_per_node=1, fast_replicas=1, fast_every=1, timeout=20,
                              continuation="statistical", handle_sigterm=False, async_save=False,
                              max_failed_saves=None)
    out: dict[str, Any] = {}

    real_after_commit = _nodelocal.NodeLocalPublisher.after_commit

    def plant_then_publish(self: Any, comm: Any, storage: Any, attempt: str, text: str) -> None:
        storage.put(f"{attempt}/manifest.json", b'{"not": "the agreed commit record"}\n')
        real_after_commit(self, comm, storage, attempt, text)

    if rank == 1:
        _nodelocal.NodeLocalPublisher.after_commit = plant_then_publish  # type: ignore[method-assign]
    errors: list[str] = []
    with pckt.CheckpointManager(f"{base}/a", fast_root=f"{base}/a-fast{{node}}", save_every=100,
                                **kw) as mgr:
        try:
            mgr.maybe_save(1, {"w": distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])})
        except CheckpointError as e:
            errors.append(e.message)
        errors += [str(e.get("error")) for e in mgr.telemetry.history
                   if e["event"] == "save" and not e.get("ok", True)]
        failed = mgr._failed_saves
    _nodelocal.NodeLocalPublisher.after_commit = real_after_commit  # type: ignore[method-assign]
    out["foreign"] = {"errors": errors, "failed": failed, "committed": [
        v.step for v in portable_ckpt.list_versions(f"{base}/a-fast0") if v.status == "committed"]}

    root = f"{base}/b"
    with pckt.CheckpointManager(root, fast_root=f"{root}-fast{{node}}", save_every=100,
                                **kw) as mgr:
        for step in (1, 2):
            mgr.maybe_save(step, {"w": distribute_tensor(torch.arange(8.0) * step, mesh,
                                                         [Shard(0)])})
    dist.barrier()
    if rank == 0:  # node 1 lost, replaced by an empty node
        shutil.move(f"{root}-fast1", f"{root}-fast1-lost")
    dist.barrier()
    real_exchange = _nodelocal._exchange
    lost: list[str] = []

    def exchange_then_lose_a_file(comm: Any, transfers: Any, storage: Any, attempt: str,
                                  paths: Any = ()) -> int:
        n = real_exchange(comm, transfers, storage, attempt, paths)
        if rank == 1 and attempt.startswith("s000000000002-"):
            for info in storage.list(f"{attempt}/data/"):
                storage.delete(info.path)
                lost.append(info.path)
                break
        return n

    _nodelocal._exchange = exchange_then_lose_a_file
    w = distribute_tensor(torch.zeros(8), mesh, [Shard(0)])
    with pckt.CheckpointManager(root, fast_root=f"{root}-fast{{node}}", save_every=100,
                                **kw) as m2:
        info = m2.restore({"w": w})
        ev = next(e for e in m2.telemetry.history if e["event"] == "restore")
    _nodelocal._exchange = real_exchange
    node1 = f"{root}-fast1"
    out["lost"] = {
        "lost": lost,
        "restored": None if info is None else info.step,
        "tier": ev["tier"],
        "w": w.full_tensor().tolist(),
        "node1_records": sorted(d for d in (os.listdir(node1) if os.path.isdir(node1) else [])
                                if os.path.exists(f"{node1}/{d}/manifest.json")),
    }
    return out
