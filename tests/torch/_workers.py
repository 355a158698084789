"""Per-rank programs of the multi-process torch tests (run through portable_ckpt.torch.launch)."""

from __future__ import annotations

import contextlib
import io
import math
import os
import signal
import time
from typing import Any

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

import portable_ckpt
import portable_ckpt.torch as pckt
from portable_ckpt.errors import CheckpointError, ContractError

SPECS: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
    "w": ((10, 6), torch.float32),
    "b": ((7,), torch.bfloat16),
    "i": ((5, 3, 2), torch.int64),
    "m": ((6, 8), torch.float32),
    "r": ((9,), torch.float16),
    "e": ((0, 4), torch.float32),
}


def g(shape: tuple[int, ...], dtype: torch.dtype, salt: float = 0.0) -> torch.Tensor:
    n = math.prod(shape)
    base = torch.arange(n, dtype=torch.float64).reshape(shape)
    if dtype.is_floating_point:
        return (base * 0.37 - 3 + salt).to(dtype)
    return (base * 7 - 50 + int(salt)).to(dtype)


PLACEMENTS: dict[str, dict[str, list[Any]]] = {
    # save layouts
    "save4": {
        "w": [Shard(0)],
        "b": [Shard(0)],
        "i": [Shard(1)],
        "m": [Shard(1)],
        "r": [Replicate()],
        "e": [Shard(0)],
    },
    "save22": {
        "w": [Shard(0), Shard(1)],
        "b": [Replicate(), Shard(0)],
        "i": [Shard(2), Replicate()],
        "m": [Shard(0), Shard(0)],
        "r": [Replicate(), Replicate()],
        "e": [Shard(1), Shard(0)],
    },
    "save2": {
        "w": [Shard(1)],
        "b": [Replicate()],
        "i": [Shard(0)],
        "m": [Shard(0)],
        "r": [Shard(0)],
        "e": [Replicate()],
    },
    # load layouts
    "load2": {
        "w": [Shard(1)],
        "b": [Replicate()],
        "i": [Shard(0)],
        "m": [Shard(0)],
        "r": [Shard(0)],
        "e": [Shard(0)],
    },
    "load3": {
        "w": [Shard(0)],
        "b": [Shard(0)],
        "i": [Shard(0)],
        "m": [Shard(1)],
        "r": [Shard(0)],
        "e": [Shard(1)],
    },
    "load4": {
        "w": [Shard(1)],
        "b": [Shard(0)],
        "i": [Shard(2)],
        "m": [Replicate()],
        "r": [Shard(0)],
        "e": [Shard(0)],
    },
}


def _mesh(world: int, layout: str) -> Any:
    if layout == "save22":
        return init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    return init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))


def make_state(world: int, layout: str, *, zeros: bool, salt: float = 0.0) -> dict[str, Any]:
    mesh = _mesh(world, layout)
    pl = PLACEMENTS[layout]
    t: dict[str, Any] = {}
    for k, (shape, dtype) in SPECS.items():
        full = torch.zeros(shape, dtype=dtype) if zeros else g(shape, dtype, salt)
        t[k] = distribute_tensor(full, mesh, pl[k])
    return {
        "params": {"w": t["w"], "b": t["b"]},
        "list": [t["i"], {"r": t["r"], "m": t["m"]}],
        "zero_size": t["e"],
        "scalars": {
            "z": torch.tensor(0.0 if zeros else 2.5 + salt),
            "zi": torch.tensor(0 if zeros else 42, dtype=torch.int32),
        },
        "meta": {
            "name": "" if zeros else "run-1",
            "n": 0 if zeros else 3,
            "lr": 0.0 if zeros else 0.5,
            "none": 1 if zeros else None,
            "pair": (0, 0.0) if zeros else (1, float("inf")),
        },
        "rng": pckt.RNGState(),
        "data": pckt.DataPosition(0, 0) if zeros else pckt.DataPosition(2, 96, {"sampler_seed": 5}),
    }


def check_state(state: dict[str, Any], salt: float = 0.0) -> list[str]:
    bad = []
    tensors = {
        "w": state["params"]["w"],
        "b": state["params"]["b"],
        "i": state["list"][0],
        "r": state["list"][1]["r"],
        "m": state["list"][1]["m"],
        "e": state["zero_size"],
    }
    for k, dt in tensors.items():
        shape, dtype = SPECS[k]
        if not torch.equal(dt.full_tensor(), g(shape, dtype, salt)):
            bad.append(k)
    if float(state["scalars"]["z"]) != 2.5 + salt or int(state["scalars"]["zi"]) != 42:
        bad.append("scalars")
    meta = state["meta"]
    if meta != {"name": "run-1", "n": 3, "lr": 0.5, "none": None, "pair": (1, float("inf"))}:
        bad.append(f"meta={meta}")
    d = state["data"]
    if (d.epoch, d.global_sample_index, d.extra) != (2, 96, {"sampler_seed": 5}):
        bad.append(f"data={d}")
    return bad


def save_layout(rank: int, world: int, root: str, layout: str, step: int) -> dict[str, Any]:
    torch.manual_seed(100 + rank)
    out: dict[str, Any] = {}
    if layout == "save4":
        # Partial placement: refused on every rank, nothing published.
        mesh = _mesh(world, layout)
        p = DTensor.from_local(torch.ones(2), mesh, [Partial()])
        try:
            pckt.save({"p": p}, root, step=step, timeout=30)
            out["partial"] = None
        except CheckpointError as e:
            out["partial"] = e.code
    state = make_state(world, layout, zeros=False)
    info = pckt.save(state, root, step=step, timeout=30)
    out.update(
        id=info.checkpoint_id, next_rand=torch.rand(1).item(), bytes_written=info.bytes_written
    )
    return out


def save_layout_table(rank: int, world: int, root: str, layout: str, step: int) -> dict[str, Any]:
    """save_layout with tensor tables forced on (format 1.1, spec §8.5)."""
    torch.manual_seed(100 + rank)
    state = make_state(world, layout, zeros=False)
    info = pckt.save(state, root, step=step, timeout=30, tensor_table=True)
    return {"id": info.checkpoint_id, "next_rand": torch.rand(1).item()}


def _rchar() -> int:
    """Bytes this process got from read()/pread() so far (``/proc/self/io``)."""
    with open("/proc/self/io", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar"))


def load_layout(rank: int, world: int, root: str, layout: str, step: int) -> dict[str, Any]:
    torch.manual_seed(999)
    state = make_state(world, layout, zeros=True)
    out: dict[str, Any] = {}
    try:
        pckt.load(state, root, step=step, timeout=30)
        out["refused"] = None
    except ContractError as e:
        out["refused"] = e.code
    info = pckt.load(state, root, step=step, allow_statistical=True, timeout=30)
    rchar = _rchar()  # again, first-use imports done: what one load reads
    again = pckt.load(state, root, step=step, allow_statistical=True, timeout=30)
    out.update(
        rchar=_rchar() - rchar,
        bytes_read=again.bytes_read,
        manifest_bytes=os.path.getsize(os.path.join(info.path, "manifest.json")),
        contract=info.contract,
        bad=check_state(state),
        next_rand=torch.rand(1).item(),
        covered=info.elements_covered,
        blocks=info.blocks_verified,
        target_bytes=info.target_bytes,
        per_rank=info.per_rank,
    )
    return out


def load_then_save(rank: int, world: int, root: str, out_root: str) -> dict[str, Any]:
    a = load_layout(rank, world, root, "load2", 1)
    state = make_state(world, "save2", zeros=False)
    info = pckt.save(state, out_root, step=7, timeout=30)
    a["saved"] = info.checkpoint_id
    a["saved_next_rand"] = torch.rand(1).item()  # the first draw of the RNG stream it saved
    return a


# -- async snapshot ---------------------------------------------------------------------------------


def async_snapshot(rank: int, world: int, root: str) -> dict[str, Any]:
    mesh = init_device_mesh("cpu", (world,))
    w = distribute_tensor(g((16, 4), torch.float32), mesh, [Shard(0)])
    p = g((5,), torch.float32)
    state = {"w": w, "p": p, "n": {"x": 1}}
    h = pckt.async_save(state, root, step=3, timeout=30)
    staged = h.staged.done()
    # Mutate everything right after staging.
    w.to_local().add_(100.0)
    p.mul_(0)
    state["n"]["x"] = 2
    info = h.committed.result()
    pool1 = pckt.staging_bytes()
    # A second save (waits for nothing now) reuses the staging buffers.
    h3 = pckt.async_save(state, root, step=5, timeout=30)
    h3.committed.result()
    pool2 = pckt.staging_bytes()
    target = {
        "w": distribute_tensor(torch.zeros(16, 4), mesh, [Shard(0)]),
        "p": torch.zeros(5),
        "n": {"x": 0},
    }
    li = pckt.load(target, root, step=3, timeout=30)
    ok = torch.equal(target["w"].full_tensor(), g((16, 4), torch.float32)) and torch.equal(
        target["p"], g((5,), torch.float32)
    )
    return {
        "staged": staged,
        "ok": ok,
        "x": target["n"]["x"],
        "id": info.checkpoint_id,
        "pool1": pool1,
        "pool2": pool2,
        "blocking": h.blocking_seconds,
        "step": li.step,
    }


# -- kill a rank during a save ----------------------------------------------------------------------


def die_after_first_shard() -> None:
    """Make this process SIGKILL itself once its first shard file is written."""
    from portable_ckpt.io.writer import ShardWriter

    orig = ShardWriter._write_shard

    def dying(self: Any, rel: str, group: Any) -> Any:
        orig(self, rel, group)
        os.kill(os.getpid(), signal.SIGKILL)

    ShardWriter._write_shard = dying  # type: ignore[method-assign]


def kill_during_save(rank: int, world: int, root: str) -> dict[str, Any]:
    mesh = init_device_mesh("cpu", (world,))
    state = {"w": distribute_tensor(g((12, 4), torch.float32), mesh, [Shard(0)])}
    first = pckt.save(state, root, step=1, timeout=20)
    state2 = {"w": distribute_tensor(g((12, 4), torch.float32, 1.0), mesh, [Shard(0)])}
    if rank == world - 1:
        die_after_first_shard()
    t0 = time.monotonic()
    try:
        pckt.save(state2, root, step=2, timeout=20)
        return {"first": first.checkpoint_id, "error": None}
    except CheckpointError as e:
        return {
            "first": first.checkpoint_id,
            "error": e.code,
            "seconds": time.monotonic() - t0,
            "message": e.message,
        }


def load_plain(rank: int, world: int, root: str) -> dict[str, Any]:
    mesh = init_device_mesh("cpu", (world,))
    target = {"w": distribute_tensor(torch.zeros(12, 4), mesh, [Shard(0)])}
    info = pckt.load(target, root, allow_statistical=True, timeout=30)
    ok = torch.equal(target["w"].full_tensor(), g((12, 4), torch.float32))
    versions = [(v.step, v.status) for v in portable_ckpt.list_versions(root)]
    return {"step": info.step, "ok": ok, "versions": versions}


def hung_peer(rank: int, world: int, root: str) -> dict[str, Any]:
    state = {"w": torch.arange(4.0)}
    pckt.save(state, root, step=1, timeout=4)  # creates the metadata group on every rank
    if rank == 1:
        time.sleep(14)  # alive but never joins the next saves
        return {"error": None}
    t0 = time.monotonic()
    try:
        pckt.save(state, root, step=2, timeout=4)
        return {"error": None}
    except CheckpointError as e:
        out: dict[str, Any] = {"error": e.code, "seconds": time.monotonic() - t0}
    try:  # the group is made again, and the peer still does not come
        pckt.save(state, root, step=3, timeout=4)
    except CheckpointError as e:
        out.update(again=e.code, again_message=e.message)
    return out


# -- failures inside the protocol ---------------------------------------------------------------------


class _BrokenState:
    """A stateful object whose state_dict() raises something that is not a CheckpointError."""

    def state_dict(self) -> dict[str, Any]:
        raise RuntimeError("state_dict exploded")

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        pass


def _outcome(fn: Any) -> dict[str, Any]:
    t0 = time.monotonic()
    try:
        fn()
    except CheckpointError as e:
        return {
            "code": e.code,
            "failed": getattr(e, "failed_ranks", None),
            "cause": type(e.__cause__).__name__ if e.__cause__ is not None else None,
            "seconds": time.monotonic() - t0,
            "message": e.message,
        }
    return {"code": None}


def protocol_failures(rank: int, world: int, root: str, scratch: str) -> dict[str, Any]:
    """One failure per protocol step, each on one rank: who raises what, and how fast."""
    last = world - 1

    def state(epoch: int = 1, policy: str = "rank0", n: int = 6) -> dict[str, Any]:
        data = pckt.DataPosition(1, 2, world_size_policy=policy)
        # Set on the holder, as a loop sets it: the constructor refuses -1 itself, the save's
        # schema check is what this test needs to fail on one rank
        data.epoch = epoch
        return {"w": torch.arange(float(n)), "data": data}

    pckt.save(state(), root, step=1, timeout=30)
    out: dict[str, Any] = {}
    # The last rank's entry value breaks its schema: its write fails, nothing is committed.
    out["write"] = _outcome(
        lambda: pckt.save(state(-1 if rank == last else 1), root, step=2, timeout=30)
    )
    # Writers disagree on an entry's policy: rank 0's commit refuses (PCK-METADATA-CONFLICT).
    out["commit"] = _outcome(
        lambda: pckt.save(
            state(policy="modulo" if rank == 1 else "rank0"), root, step=3, timeout=30
        )
    )
    # A non-checkpoint exception while preparing on rank 1.
    broken = {**state(), "obj": _BrokenState()} if rank == 1 else state()
    out["prepare"] = _outcome(lambda: pckt.save(broken, root, step=4, timeout=30))
    # Rank 1 cannot open its root (a path under a regular file): every rank hears of it at once.
    blocker = os.path.join(scratch, f"file-{rank}")
    with open(blocker, "w") as f:
        f.write("x")
    where = os.path.join(blocker, "ckpt") if rank == 1 else root
    out["storage"] = _outcome(lambda: pckt.save(state(), where, step=5, timeout=30))
    # The last rank's target has another shape: its load fails, the others learn which rank.
    target = state(n=5 if rank == last else 6)
    out["load"] = _outcome(lambda: pckt.load(target, root, timeout=30))
    out["committed"] = [
        v.step for v in portable_ckpt.list_versions(root) if v.status == "committed"
    ]
    return out


def die_after_gather(rank: int, world: int, root: str) -> dict[str, Any]:
    """The last rank dies once rank 0 has its index: rank 0 commits, then cannot tell everyone."""
    state = {"w": torch.arange(6.0)}
    pckt.save(state, root, step=1, timeout=10)
    if rank == world - 1:
        from portable_ckpt.torch._collectives import Comm

        orig = Comm.gather_json

        def dying(self: Any, obj: Any, what: str) -> Any:
            out = orig(self, obj, what)
            os.kill(os.getpid(), signal.SIGKILL)
            return out

        Comm.gather_json = dying  # type: ignore[method-assign]
    return _outcome(lambda: pckt.save({"w": torch.arange(6.0) + 1}, root, step=2, timeout=10))


# -- the shared commit record of a load ---------------------------------------------------------------


def _watch_record(rank: int) -> dict[str, Any]:
    """Count this rank's collectives of a load's commit record and log its reads of records."""
    from portable_ckpt.storage.local import LocalStorage
    from portable_ckpt.torch._collectives import Comm

    seen: dict[str, Any] = {"broadcast": 0, "allgather": 0, "reads": [], "listings": 0}
    bcast, gather = Comm.broadcast_bytes, Comm.allgather_bytes
    read_range, read_all = LocalStorage.read_range, LocalStorage.read_all
    list_dirs = LocalStorage.list_dirs

    def listing(self: Any, prefix: str = "") -> list[str]:
        seen["listings"] += prefix == ""
        return list_dirs(self, prefix)

    def broadcasting(self: Any, data: bytes, what: str) -> bytes:
        seen["broadcast"] += what == "load/manifest"
        return bcast(self, data, what)

    def gathering(self: Any, data: bytes, what: str) -> list[bytes]:
        seen["allgather"] += what == "load/manifest"
        return gather(self, data, what)

    def ranged(self: Any, path: str, offset: int, length: int) -> bytes:
        if path.endswith("/manifest.json"):
            seen["reads"].append((path.split("/")[-2], offset, length))
            if seen.get("fail") == rank:
                raise portable_ckpt.errors.StorageError(f"{path}: injected read failure")
            if seen.get("differs") == rank:  # this rank's copy is not rank 0's (a node root)
                return b"#" * length
        return read_range(self, path, offset, length)

    def whole(self: Any, path: str, *, max_size: int) -> bytes:
        data = read_all(self, path, max_size=max_size)
        if path.endswith("/manifest.json"):
            seen["reads"].append((path.split("/")[-2], 0, len(data)))
        return data

    Comm.broadcast_bytes = broadcasting  # type: ignore[method-assign]
    Comm.allgather_bytes = gathering  # type: ignore[method-assign]
    LocalStorage.read_range = ranged  # type: ignore[method-assign]
    LocalStorage.read_all = whole  # type: ignore[method-assign]
    LocalStorage.list_dirs = listing  # type: ignore[method-assign]
    return seen


def record_share(rank: int, world: int, root: str, scratch: str) -> dict[str, Any]:
    """Loads whose likely attempt is, or is not, the one rank 0 picks; failures on the way."""
    import torch.distributed as dist

    from portable_ckpt.format.naming import new_attempt_id

    seen = _watch_record(rank)
    out: dict[str, Any] = {}

    def load(name: str, where: str = root, n: int = 6, **kw: Any) -> None:
        seen.update(broadcast=0, allgather=0, reads=[], listings=0)
        target = {"w": torch.zeros(n), "epoch": 0}
        try:
            info = pckt.load(target, where, timeout=30, **kw)
            res: dict[str, Any] = {"step": info.step, "id": info.checkpoint_id}
            res["epoch"], res["w"] = target["epoch"], target["w"].tolist()
        except CheckpointError as e:
            res = {"code": e.code, "failed": getattr(e, "failed_ranks", None)}
        out[name] = {**res, "broadcast": seen["broadcast"], "allgather": seen["allgather"]}
        out[name]["reads"] = list(seen["reads"])  # a copy: the next save's reads are not its
        out[name]["listings"] = seen["listings"]

    pckt.save({"w": torch.arange(6.0), "epoch": 1}, root, step=1, timeout=30)
    load("first")
    pckt.save({"w": torch.arange(6.0) + 1, "epoch": 2}, root, step=1, timeout=30)
    load("newest_of_the_step")
    if rank == 0:  # a record of a newer step that does not validate: read, then skipped
        torn = os.path.join(root, new_attempt_id(5))
        os.makedirs(torn)
        with open(os.path.join(torn, "manifest.json"), "wb") as f:
            f.write(b'{"format": "portable-ckpt", "format_ver')
    dist.barrier()
    load("torn_newer_step")
    save_many_tensors(rank, world, os.path.join(scratch, "big"))
    seen["fail"] = 2  # the last rank cannot read its slice: rank 0 reads the record alone
    load("slice_unreadable", where=os.path.join(scratch, "big"), n=6)
    seen.pop("fail")
    load("missing_id", checkpoint_id=new_attempt_id(1) if rank == 0 else None)
    blocker = os.path.join(scratch, "file")
    if rank == 0:
        with open(blocker, "w") as f:
            f.write("x")
    dist.barrier()
    load("rank0_cannot_open", where=os.path.join(blocker, "ckpt") if rank == 0 else root)
    big = os.path.join(scratch, "big")  # a record of three slices: rank 1 has one to read
    load("rank1_cannot_open", where=os.path.join(blocker, "ckpt") if rank == 1 else big)
    # The last rank reads a copy that is not rank 0's: rank 0's own copy decides.
    big2 = os.path.join(scratch, "big2")
    save_many_tensors(rank, world, big2)
    save_many_tensors(rank, world, big2)  # two attempts of step 3: the newer is likely
    seen["differs"] = 2
    load("copy_differs_only_version", where=big)
    load("copy_differs_newer_attempt", where=big2)
    newest = max(n for n in os.listdir(big2) if n.startswith("s"))
    load("copy_differs_given_id", where=big2, checkpoint_id=newest)
    seen.pop("differs")
    out["big2_newest"] = newest
    return out


def save_many_tensors(rank: int, world: int, root: str) -> None:
    """A version whose record is over 3 x 64 KiB (1,500 tensors): three ranks read a slice each."""
    state = {"w": torch.arange(6.0), "epoch": 3, **{f"t{i:04d}": torch.zeros(1) for i in range(1500)}}
    pckt.save(state, root, step=3, timeout=30)


def load_sliced(rank: int, world: int, root: str) -> dict[str, Any]:
    seen = _watch_record(rank)
    state = {"w": torch.zeros(6), "epoch": 0, **{f"t{i:04d}": torch.ones(1) for i in range(1500)}}
    info = pckt.load(state, root, timeout=30)
    ok = state["epoch"] == 3 and all(float(state[f"t{i:04d}"]) == 0.0 for i in range(1500))
    return {"step": info.step, "ok": ok, **{k: seen[k] for k in ("broadcast", "allgather", "reads")}}


def save_divergent_plain(rank: int, world: int, root: str) -> dict[str, Any]:
    """A plain buffer that differs per rank (BatchNorm statistics under FSDP2) beside a DTensor."""
    mesh = init_device_mesh("cpu", (world,))
    w = distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Shard(0)])
    same = {"w": w, "count": torch.tensor([7])}
    exact = pckt.save(same, f"{root}/same", step=1, timeout=30)
    differ = {"w": w, "count": torch.tensor([7]), "bn": {"running_mean": torch.full((3,), float(rank))}}
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        info = pckt.save(differ, f"{root}/differ", step=1, timeout=30)
    target = {"w": distribute_tensor(torch.zeros(4, 2), mesh, [Shard(0)]), "count": torch.zeros(1, dtype=torch.int64),
              "bn": {"running_mean": torch.zeros(3)}}
    loaded = pckt.load(target, f"{root}/differ", timeout=30)
    conflicts = {}
    for name, extra in {
        "shape": torch.arange(6.0).reshape((2, 3) if rank == 0 else (3, 2)),
        "dtype": torch.ones(4) if rank == 0 else torch.ones(4).view(torch.int32),
        "only-rank-1": None if rank == 0 else torch.ones(2),
        "value-only-rank-1": None if rank == 0 else 5,
        "tensor-or-value": torch.ones(4) if rank == 0 else 5,
    }.items():
        state = {"w": w} if extra is None else {"w": w, "buf": extra}
        try:
            pckt.save(state, f"{root}/conflict-{name}", step=1, timeout=30)
            conflicts[name] = "saved"
        except portable_ckpt.CheckpointError as e:
            conflicts[name] = f"{e.code}: {e.message}"
    neg = torch.tensor([1 + 2j]).conj().imag  # a view with the negative bit: values equal
    negative = pckt.save({"w": w, "neg": neg}, f"{root}/negative", step=1, timeout=30).contract
    # Fidelity review F16: plain values are rank 0's too; they were never compared.
    err2 = io.StringIO()
    with contextlib.redirect_stderr(err2):
        values = pckt.save({"w": w, "offset": 1000 * rank, "name": f"r{rank}", "same": [1, 2]},
                           f"{root}/values", step=1, timeout=30).contract
    equal = pckt.save({"w": w, "same": [1, 2], "x": float("nan")}, f"{root}/values-equal", step=1,
                      timeout=30).contract
    # Continuation review F2: a global StateEntry holding a rank's own cursor was stored as
    # rank 0's under "exact", silently (the warning's own advice led there).
    from portable_ckpt.torch.flatten import StateEntry

    class Cursor(StateEntry):
        def __init__(self, value: object, compare: bool = True) -> None:
            self.value, self.compare_ranks = value, compare

        def capture(self) -> object:
            if self.value is RuntimeError:  # lives on rank 0 only (a tracker, a logger)
                raise RuntimeError("the tracker lives on rank 0 only")
            return self.value

        def restore(self, value: object) -> None:
            self.value = int(value)  # type: ignore[call-overload]

    err3 = io.StringIO()
    entries = {}
    with contextlib.redirect_stderr(err3):
        for name, entry in {"own": Cursor(100 + rank), "equal": Cursor(7),
                            "unchecked": Cursor(100 + rank, compare=False),
                            "rank0-only": Cursor(7) if rank == 0 else None,
                            # attack review 2 F5: int keys (stored as strings) broke the check
                            "int-keys": Cursor({1: 0.5, "best": 2}),
                            "captured-on-rank0": Cursor(7 if rank == 0 else RuntimeError),
                            }.items():
            state = {"w": w} if entry is None else {"w": w, "cursor": entry}
            entries[name] = pckt.save(state, f"{root}/entry-{name}", step=1, timeout=30).contract
    # Continuation review F5: a plain tensor above 1 MiB that is each rank's own (an
    # error-feedback buffer) was stored as rank 0's under "exact"; now compared by a sample.
    err4 = io.StringIO()
    big = {}
    with contextlib.redirect_stderr(err4):
        for name, tensor in {"own": torch.full((600_000,), float(rank)),
                             "equal": torch.arange(600_000, dtype=torch.float32),
                             "own-tail": torch.cat([torch.zeros(599_999),
                                                    torch.full((1,), float(rank))])}.items():
            big[name] = pckt.save({"w": w, "buf": tensor}, f"{root}/big-{name}", step=1,
                                  timeout=30).contract
    return {"exact": exact.contract, "saved": info.contract, "loaded": loaded.contract,
            "mean": target["bn"]["running_mean"].tolist(), "stderr": err.getvalue(),
            "conflicts": conflicts, "negative": negative, "values": values,
            "values_stderr": err2.getvalue(), "values_equal": equal, "entries": entries,
            "entries_stderr": err3.getvalue(), "big": big, "big_stderr": err4.getvalue()}


def load_while_pruned(rank: int, world: int, root: str, newer: str) -> dict[str, Any]:
    """Load a root while retention deletes the version read (rank 0's first read brings a newer
    version in and runs gc): the group loads the root's latest again, together."""
    import shutil

    from portable_ckpt.io.gc import gc
    from portable_ckpt.io.reader import Checkpoint

    real = Checkpoint.read_many
    done = [rank != 0]

    def pruned_under_it(self: Checkpoint, requests: Any) -> Any:
        if not done[0]:
            done[0] = True
            (attempt,) = [n for n in os.listdir(newer) if n.startswith("s")]
            shutil.copytree(os.path.join(newer, attempt), os.path.join(root, attempt),
                            ignore=shutil.ignore_patterns("manifest.json"))
            shutil.copy(os.path.join(newer, attempt, "manifest.json"),
                        os.path.join(root, attempt, "manifest.json"))  # committed last
            gc(root, keep=1, grace_seconds=0)  # the version being read goes
        return real(self, requests)

    Checkpoint.read_many = pruned_under_it  # type: ignore[method-assign]
    target = {f"l{i}": torch.zeros(64) for i in range(6)}
    info = pckt.load(target, root, strict=False)
    return {"step": info.step, "values": [float(t[0]) for t in target.values()],
            "left": info.left_from_failed, "missing": info.missing_keys}


def data_positions_across_world_sizes(rank: int, world: int, root: str) -> dict[str, Any]:
    """Ranks 0 and 1 save per-rank DataPositions of each world-size policy (each with its own
    ``shard``); then all ``world`` ranks load them (a larger job): which stored rank each got."""
    import torch.distributed as dist

    def state(policies: tuple[str, ...], shard: int = -1) -> dict[str, Any]:
        return {"w": torch.zeros(4) if shard < 0 else torch.arange(4.0),
                **{p: pckt.DataPosition(3, 40, {"shard": shard}, world_size_policy=p)
                   for p in policies}}

    pair = dist.new_group([0, 1])  # every rank makes it; only its members save through it
    if rank < 2:
        pckt.save(state(("rank0", "modulo"), rank), root, step=1, process_group=pair,
                  timeout=30)
        pckt.save(state(("require_same",), rank), root, step=2, process_group=pair, timeout=30)
    dist.barrier()
    target = state(("rank0", "modulo"))
    info = pckt.load(target, root, step=1, allow_statistical=True, timeout=30)
    return {
        "worlds": [info.saved_world_size, info.world_size],
        "got": {p: (target[p].extra.get("shard"), target[p].epoch, target[p].restored)
                for p in ("rank0", "modulo")},
        "require_same": _outcome(lambda: pckt.load(state(("require_same",)), root, step=2,
                                                   allow_statistical=True, timeout=30)),
    }
