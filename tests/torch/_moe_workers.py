"""Per-rank programs of the mixture-of-experts tests: plain tensors held by some ranks only."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import torch

import portable_ckpt
import portable_ckpt.torch as pckt
from portable_ckpt.torch._collectives import Comm

EXPERTS = 8


def expert(gid: int, salt: float = 0.0) -> torch.Tensor:
    """Expert ``gid``'s weight: distinct values per expert and per step (``salt``)."""
    return torch.arange(12, dtype=torch.float32).reshape(3, 4) + 100 * gid + salt


def owned(rank: int, world: int) -> range:
    per = EXPERTS // world
    return range(rank * per, (rank + 1) * per)


def expert_state(rank: int, world: int, salt: float = 0.0) -> dict[str, Any]:
    """Experts keyed by global id, each held by its own rank only, beside a replicated router."""
    return {
        "model": {
            "router": torch.full((4, 8), 0.5 + salt),
            "experts": {str(g): expert(g, salt) for g in owned(rank, world)},
        },
        "step": int(salt),
    }


def _count_exchanges() -> dict[str, int]:
    """Count this rank's metadata all-gathers by name (the blocking part's, and in all)."""
    seen: dict[str, int] = {}
    gather, ints = Comm.allgather_json, Comm.start_allgather_ints

    def counting(self: Any, obj: Any, what: str) -> list[Any]:
        seen[what] = seen.get(what, 0) + 1
        return gather(self, obj, what)

    def counting_ints(self: Any, values: Any, what: str) -> Any:
        seen[what] = seen.get(what, 0) + 1
        return ints(self, values, what)

    Comm.allgather_json = counting  # type: ignore[method-assign]
    Comm.start_allgather_ints = counting_ints  # type: ignore[method-assign]
    return seen


def save_experts(rank: int, world: int, root: str, mode: str) -> dict[str, Any]:
    """Two saves of experts held by their own ranks (``mode``: sync, thread, process, manager).

    An async save's state is changed as soon as the call returns: the version must hold the
    values of the call. Reports the exchanges made inside each call (the blocking part).
    """
    seen = _count_exchanges()
    out: dict[str, Any] = {"contracts": [], "blocking": [], "written": []}
    mgr = (
        pckt.CheckpointManager(root, save_every=1, timeout=30, verify_sample=0.0)
        if mode == "manager" else None
    )
    for step in (1, 2):
        state = expert_state(rank, world, salt=float(step))
        before = dict(seen)
        if mgr is not None:
            mgr.save(step, state)
            blocking = {k: v - before.get(k, 0) for k, v in seen.items() if v != before.get(k, 0)}
            mgr.wait()
            info = None
        elif mode == "sync":
            info = pckt.save(state, root, step=step, timeout=30)
            blocking = {}
        else:
            handle = pckt.async_save(state, root, step=step, mode=mode, timeout=30)
            blocking = {k: v - before.get(k, 0) for k, v in seen.items() if v != before.get(k, 0)}
            with torch.no_grad():  # training goes on: the version holds the values of the call
                for t in state["model"]["experts"].values():
                    t.add_(1000)
                state["model"]["router"].add_(1000)
            info = handle.committed.result(timeout=60)
        # (the background may have begun: only the exchanges of the blocking part count)
        out["blocking"].append({k: v for k, v in blocking.items() if k.startswith("save/plain")})
        if info is not None:
            out["contracts"].append(info.contract)
            out["written"].append(info.bytes_written)
    if mgr is not None:
        mgr.close()
    out["exchanges"] = {k: v for k, v in seen.items() if k.startswith("save/plain")}
    return out


def load_experts(rank: int, world: int, root: str, step: int) -> dict[str, Any]:
    """Load this rank's experts (by global id) from ``root``'s newest version, onto ``world``."""
    target = {
        "model": {
            "router": torch.zeros(4, 8),
            "experts": {str(g): torch.zeros(3, 4) for g in owned(rank, world)},
        },
        "step": 0,
    }
    info = pckt.load(target, root, timeout=30, allow_statistical=True, strict=False)
    bad = [g for g in owned(rank, world)
           if not torch.equal(target["model"]["experts"][str(g)], expert(g, float(step)))]
    return {
        "step": info.step, "contract": info.contract, "bad": bad, "loaded_step": target["step"],
        "router": bool(torch.equal(target["model"]["router"], torch.full((4, 8), 0.5 + step))),
        "unexpected": len(info.unexpected_keys),
    }


def moved_keys(rank: int, world: int, root: str, mode: str) -> dict[str, Any]:
    """Plain tensors that change holders between saves (4 ranks; ``mode``: sync or thread).

    ``x`` on ranks 1 and 2, then 2 only, then 1 and 2 again (a redundant expert that load
    balancing places and removes), ``z`` on rank 1, then on rank 3; then ``x`` on ranks 1 and
    2 with other values (stored from rank 1, statistical). Reports each save's contract (or
    error) and the bytes staged for it.
    """
    x, z = torch.arange(5.0), torch.arange(6.0) * 2

    def state(holds_x: tuple[int, ...], holds_z: tuple[int, ...], differ: bool = False) -> Any:
        s: dict[str, Any] = {"w": torch.ones(2)}
        if rank in holds_x:
            s["x"] = x + (rank if differ else 0)
        if rank in holds_z:
            s["z"] = z
        return s

    out: dict[str, Any] = {}
    for step, (hx, hz, differ) in enumerate([
        ((1, 2), (1,), False), ((2,), (3,), False), ((1, 2), (3,), False), ((2,), (3,), False),
        ((1, 2), (3,), True),
    ], start=1):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                if mode == "sync":
                    info = pckt.save(state(hx, hz, differ), root, step=step, timeout=30)
                    out[f"staged{step}"] = None
                else:
                    handle = pckt.async_save(state(hx, hz, differ), root, step=step, timeout=30)
                    out[f"staged{step}"] = handle.staging_bytes
                    info = handle.committed.result(timeout=60)
            out[str(step)] = info.contract
        except portable_ckpt.CheckpointError as e:
            out[str(step)] = f"{e.code}: {e.message}"
        out[f"stderr{step}"] = err.getvalue()
    return out


def keys_new_everywhere(rank: int, world: int, root: str) -> dict[str, Any]:
    """Data parallelism: optimizer state that appears after the first save, on every rank.

    Only rank 0 stores it: the others stage nothing (review of E1, R3: every rank staged the
    new keys once, in full).
    """
    staged = []
    for step in (1, 2, 3):
        state: dict[str, Any] = {"w": torch.ones(1000)}
        if step > 1:
            state["m"] = torch.full((250_000,), float(step))
        handle = pckt.async_save(state, root, step=step, timeout=30)
        staged.append(handle.staging_bytes)
        handle.committed.result(timeout=60)
    return {"staged": staged}


def lost_records(rank: int, world: int, root: str) -> dict[str, Any]:
    """A rank whose record of the last exchange is gone or stale (3 ranks).

    Step 2: rank 1 lost its record (a new process in a group made anew). Step 4: rank 2 keeps
    the record of step 2 while the others learnt step 3's (a Ctrl-C just after the exchange):
    it would store ``x``, which rank 1 now stores too. Review of E1, R1: ranks decided alone
    whether to exchange, and the collectives went out of step for good.
    """
    from portable_ckpt.torch import _owners

    x = torch.arange(4.0)
    out: dict[str, Any] = {}
    kept = None
    for step, holds in enumerate([(2,), (2,), (1, 2), (1, 2), (1, 2)], start=1):
        if step == 2 and rank == 1:
            _owners._RECORDS.clear()
        if step == 4 and rank == 2:
            _owners._RECORDS.update(kept)
        state: dict[str, Any] = {"w": torch.ones(2)}
        if rank in holds:
            state["x"] = x
        try:
            out[str(step)] = pckt.save(state, root, step=step, timeout=30).contract
        except portable_ckpt.CheckpointError as e:
            out[str(step)] = f"{e.code}: {e.message}"
        if step == 2:
            kept = dict(_owners._RECORDS)
    return out


def expert_lists(rank: int, world: int, root: str) -> dict[str, Any]:
    """Experts whose weights are a list (a DCP item path through a list position)."""
    state = {"experts": {str(g): [expert(g), expert(g, 0.5)] for g in owned(rank, world)},
             "lr": 0.1}
    info = pckt.save(state, root, step=1, timeout=30)
    return {"contract": info.contract}


class _ExpertModel(torch.nn.Module):
    """A router every rank holds and the experts of this rank only, keyed by global id."""

    def __init__(self, rank: int, world: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.router = torch.nn.Linear(4, EXPERTS)
        self.experts = torch.nn.ModuleDict()
        for g in range(EXPERTS):
            torch.manual_seed(100 + g)
            lin = torch.nn.Linear(4, 4)
            if g in owned(rank, world):
                self.experts[str(g)] = lin


def _train_step(model: _ExpertModel, optim: Any, world: int, i: int) -> None:
    import torch.distributed as dist

    torch.manual_seed(1000 + i)
    x = torch.randn(16, 4)
    loss = model.router(x).pow(2).mean()
    for g, e in model.experts.items():
        loss = loss + e(x).pow(2).mean() * (1 + int(g))
    optim.zero_grad()
    loss.backward()
    if world > 1:
        for p in model.router.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
    optim.step()


def _trainer(rank: int, world: int, flat: bool) -> tuple[_ExpertModel, Any, dict[str, Any]]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    model = _ExpertModel(rank, world)
    optim = torch.optim.AdamW(model.parameters(), lr=0.01)
    options = StateDictOptions(flatten_optimizer_state_dict=True) if flat else None
    return model, optim, {"train": pckt.ModelOptimizerState(model, optim, options=options),
                          "rng": pckt.RNGState()}


def _params(model: _ExpertModel) -> dict[str, list[float]]:
    return {k: v.detach().flatten().tolist() for k, v in model.named_parameters()}


def train_experts(rank: int, world: int, root: str, flat: bool) -> dict[str, Any]:
    """Two AdamW steps of expert-parallel training, a save, and the third step."""
    model, optim, state = _trainer(rank, world, flat)
    for i in range(2):
        _train_step(model, optim, world, i)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        info = pckt.save(state, root, step=2, timeout=30)
    _train_step(model, optim, world, 2)
    return {"contract": info.contract, "stderr": err.getvalue(), "params": _params(model)}


def resume_experts(rank: int, world: int, root: str, flat: bool) -> dict[str, Any]:
    """Restore the version onto ``world`` ranks and take the third step."""
    model, optim, state = _trainer(rank, world, flat)
    info = pckt.load(state, root, timeout=30, allow_statistical=True)
    _train_step(model, optim, world, 2)
    return {"contract": info.contract, "params": _params(model)}


class _LocalExperts(torch.nn.Module):
    """Two experts keyed by local index (``experts.0`` on every rank, this rank's weights)."""

    def __init__(self, rank: int, world: int, same: bool = False) -> None:
        super().__init__()
        self.experts = torch.nn.ModuleDict()
        for i, g in enumerate(owned(rank, world)[:2]):
            torch.manual_seed(100 + (i if same else g))
            self.experts[str(i)] = torch.nn.Linear(4, 4)
        self.norm = torch.nn.BatchNorm1d(4)
        with torch.no_grad():
            self.norm.running_mean.fill_(float(rank))  # statistics of this rank's batches


def local_index_experts(rank: int, world: int, root: str) -> dict[str, Any]:
    """Saves of experts keyed by local index (MoE review E2), and of buffers that differ."""
    model = _LocalExperts(rank, world)
    out: dict[str, Any] = {}
    cases: dict[str, tuple[Any, str]] = {
        "module": ({"model": model}, "exact"),
        "model-optimizer": ({"train": pckt.ModelOptimizerState(model)}, "exact"),
        "state-dict": ({"model": model.state_dict()}, "exact"),
        "asked-statistical": ({"model": model}, "statistical"),
        "buffers-only": ({"model": _LocalExperts(rank, world, same=True)}, "exact"),
    }
    for name, (state, contract) in cases.items():
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                info = pckt.save(state, f"{root}/{name}", step=1, timeout=30,
                                 continuation=contract)
            out[name] = info.contract
        except portable_ckpt.CheckpointError as e:
            out[name] = f"{e.code}: {e.message}"
        out[f"{name}-stderr"] = err.getvalue()
    return out


def manager_restore_experts(rank: int, world: int, root: str, drop_router: bool) -> dict[str, Any]:
    """``CheckpointManager.restore`` of this rank's experts; ``drop_router``: no rank holds it."""
    target: dict[str, Any] = {
        "model": {"experts": {str(g): torch.zeros(3, 4) for g in owned(rank, world)}}, "step": 0,
    }
    if not drop_router:
        target["model"]["router"] = torch.zeros(4, 8)
    mgr = pckt.CheckpointManager(root, save_every=1, timeout=30)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        info = mgr.restore(target, allow_statistical=True)
    mgr.close()
    experts = target["model"]["experts"]
    ok = all(torch.equal(experts[str(g)], expert(g, 2.0)) for g in owned(rank, world))
    return {"step": None if info is None else info.step, "ok": ok, "stderr": err.getvalue()}


def interrupted_exchange(rank: int, world: int, root: str) -> dict[str, Any]:
    """A Ctrl-C on rank 1 just after a save's first all-gather, when the key lists must follow.

    Diff review 7, D1: rank 1 skipped the key-list all-gather, its next one met its peer's,
    and gloo aborted rank 0. Now rank 1 takes part, the save fails on both ranks, and the
    next save works.
    """
    from portable_ckpt.torch import _owners

    state = {"x": torch.arange(4.0)} if rank == 0 else {"y": torch.arange(3.0)}
    same_keys, calls = _owners.same_keys, []

    def interrupted(docs: Any) -> bool:
        calls.append(1)
        if rank == 1 and len(calls) == 1:
            raise KeyboardInterrupt
        return same_keys(docs)

    _owners.same_keys = interrupted  # type: ignore[assignment]
    out: dict[str, Any] = {}
    for step in (1, 2):
        try:
            out[str(step)] = pckt.save(state, root, step=step, timeout=20).contract
        except KeyboardInterrupt:
            out[str(step)] = "KeyboardInterrupt"
        except portable_ckpt.CheckpointError as e:
            out[str(step)] = f"{e.code}: {e.message}"
    return out


def peer_fails_before_exchange(rank: int, world: int, root: str) -> dict[str, Any]:
    """Rank 1's state cannot be taken apart at step 2: the others stage once, not again."""
    import portable_ckpt.torch.saving as saving

    stage, staged = saving.stage, []

    def counting(*args: Any, **kwargs: Any) -> Any:
        staged.append(1)
        return stage(*args, **kwargs)

    saving.stage = counting  # type: ignore[assignment]
    out: dict[str, Any] = {}
    for step in (1, 2):
        state: dict[str, Any] = {"w": torch.ones(3)}
        if step == 2 and rank == 1:
            state["bad"] = {(1, 2): 3}  # no key of a state: refused while taken apart
        staged.clear()
        try:
            handle = pckt.async_save(state, root, step=step, timeout=20)
            out[str(step)] = handle.committed.result(timeout=60).contract
        except portable_ckpt.CheckpointError as e:
            out[str(step)] = f"{e.code}: {e.message}"
        out[f"staged{step}"] = len(staged)
    return out


def dtensor_here_plain_there(rank: int, world: int, root: str) -> dict[str, Any]:
    """``w`` a DTensor on rank 0 and a plain tensor on rank 1, then alike on both."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (world,))
    w: Any = torch.full((4, 4), 7.0)
    if rank == 0:
        w = DTensor.from_local(torch.full((2, 4), 1.0), mesh, [Shard(0)], run_check=False,
                               shape=torch.Size([4, 4]), stride=(4, 1))
    out: dict[str, Any] = {}
    for step, state in ((1, {"w": w}), (2, {"w": torch.full((4, 4), 7.0)})):
        try:
            out[str(step)] = pckt.save(state, root, step=step, timeout=20).contract
        except portable_ckpt.CheckpointError as e:
            out[str(step)] = f"{e.code}: {e.message}"
    return out
