"""Rank functions of test_process_groups.py (importable by forkserver children)."""

from __future__ import annotations

from typing import Any


def save_after_asymmetric_group(rank: int, world: int, root: str) -> dict[str, Any]:
    """The job made a group of ranks 1 and 3 first (a pipeline pair); then saves and loads."""
    import torch
    import torch.distributed as dist

    import portable_ckpt.torch as pckt

    dist.new_group([1, 3])  # ranks 0 and 2 are not members
    state = {"w": torch.arange(4, dtype=torch.float32)}  # replicated: the same on every rank
    info = pckt.save(state, f"{root}/plain", step=1)
    handle = pckt.async_save(state, f"{root}/plain", step=2)
    handle.committed.result(timeout=60)
    back = {"w": torch.zeros(4)}
    loaded = pckt.load(back, f"{root}/plain")
    return {"id": info.checkpoint_id, "step": loaded.step, "w": back["w"].tolist()}


def managers_on_disjoint_groups(rank: int, world: int, root: str) -> dict[str, Any]:
    """Ranks 0-1 and 2-3 each run a CheckpointManager of their own, on their own group."""
    import torch
    import torch.distributed as dist

    import portable_ckpt.torch as pckt

    group_a, group_b = dist.new_group([0, 1]), dist.new_group([2, 3])
    mine, tag = (group_a, "a") if rank < 2 else (group_b, "b")
    value = 1.0 if tag == "a" else 2.0
    with pckt.CheckpointManager(
        f"{root}/{tag}", save_every=1, async_save=False, process_group=mine
    ) as mgr:
        mgr.maybe_save(1, {"w": torch.full((4,), value)})
        back = {"w": torch.zeros(4)}
        info = mgr.restore(back)
    return {"tag": tag, "step": info.step if info else None, "w": back["w"].tolist()}


def load_full_state_dict_stateful(rank: int, world: int, root: str) -> dict[str, Any]:
    """FSDP2 + AdamW through ModelOptimizerState(options=full_state_dict): save, then load.

    ``get_state_dict`` with ``full_state_dict=True`` all-gathers on the default group inside
    ``state_dict()``: the load must ask every rank for it at the same point.
    """
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import portable_ckpt.torch as pckt

    mesh = init_device_mesh("cpu", (world,))
    opts = StateDictOptions(full_state_dict=True)

    def build(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        model(torch.ones(2, 8)).sum().backward()
        opt.step()
        return model, opt

    model, opt = build(0)
    pckt.save({"train": pckt.ModelOptimizerState(model, opt, options=opts)}, root, step=1,
              timeout=60)
    model2, opt2 = build(9)
    info = pckt.load({"train": pckt.ModelOptimizerState(model2, opt2, options=opts)}, root,
                     timeout=60)
    same = all(
        torch.equal(a.full_tensor(), b.full_tensor())
        for a, b in zip(model.parameters(), model2.parameters(), strict=True)
    )
    return {"step": info.step, "same": same}


def partial_load_on_the_same_2d_mesh(rank: int, world: int, root: str) -> dict[str, Any]:
    """dp2 x tp2: save the whole model, then load only the FSDP-only parameters (on mesh["dp"])."""
    import torch
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    import portable_ckpt.torch as pckt

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up, self.down = torch.nn.Linear(6, 8), torch.nn.Linear(8, 6)
            self.norm = torch.nn.LayerNorm(6)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.norm(self.down(self.up(x)))

    def build(seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        model = Mlp()
        parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(model, mesh=mesh["dp"])
        return model

    saved = get_model_state_dict(build(0))
    info = pckt.save({"model": saved}, root, step=1)
    target = get_model_state_dict(build(3))
    part = {"model": {k: v for k, v in target.items() if k.startswith("norm.")}}
    loaded = pckt.load(part, root, strict=False)
    same = all(
        torch.equal(part["model"][k].full_tensor(), saved[k].full_tensor()) for k in part["model"]
    )
    import portable_ckpt

    mesh_saved = portable_ckpt.open(info.path).manifest.continuation.mesh
    return {"saved_mesh": list(mesh_saved.shape) if mesh_saved else None,
            "contract": loaded.contract, "same": same}


def exact_onto_another_mesh_of_the_same_world(rank: int, world: int,
                                              root: str) -> dict[str, Any]:
    """Save a DTensor on a (2, 2) mesh (contract exact), load it on (4,) and on (2, 2) again."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import portable_ckpt
    import portable_ckpt.torch as pckt
    from portable_ckpt.errors import CheckpointError

    full = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    grid = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    info = pckt.save({"w": distribute_tensor(full, grid, [Shard(0), Shard(1)])}, root, step=1)
    saved = portable_ckpt.open(info.path).manifest.continuation
    line = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    target = {"w": distribute_tensor(torch.zeros(4, 4), line, [Shard(0)])}
    out: dict[str, Any] = {"saved": [saved.contract, saved.world_size, list(saved.mesh.shape)]}
    try:
        out["refused"] = pckt.load(target, root).contract
    except CheckpointError as e:
        out["refused"] = e.code
    out["untouched"] = target["w"].full_tensor().sum().item() == 0.0
    out["allowed"] = pckt.load(target, root, allow_statistical=True).contract
    out["values"] = torch.equal(target["w"].full_tensor(), full)
    back = {"w": distribute_tensor(torch.zeros(4, 4), grid, [Shard(0), Shard(1)])}
    out["same_mesh"] = pckt.load(back, root).contract
    return out


def stall_then_save(rank: int, world: int, root: str) -> dict[str, Any]:
    """Rank 1 stalls past the timeout once; later saves work (async review F8: the side group
    a timeout closed was kept, and every later save and load of the job failed at once)."""
    import time

    import torch

    import portable_ckpt.torch as pckt
    from portable_ckpt.errors import CheckpointError

    state = {"w": torch.arange(64.0), "k": 1}
    out: dict[str, Any] = {"steps": []}
    for step in (1, 2, 3):
        if step == 2 and rank == 1:
            time.sleep(14)  # a slow rank (a GC pause, a stuck file system) beyond the timeout
        try:
            # 10 s: a loaded CI machine's ranks may reach the first save seconds apart
            out["steps"].append([step, pckt.save(state, root, step=step, timeout=10).step])
        except CheckpointError as e:
            out["steps"].append([step, e.code])
    # A load issued while an async save is in flight waits for it (F9: both timed out).
    handle = pckt.async_save(state, root, step=4, timeout=20)
    target = {"w": torch.zeros(64), "k": 0}
    info = pckt.load(target, root, timeout=20)
    out["load"] = [info.step, handle.committed.done(), target["w"].tolist() == state["w"].tolist()]
    return out


def load_rng_upscaled(rank: int, world: int, root: str) -> dict[str, Any]:
    """Load a one-rank version's RNG on ``world`` ranks (policy modulo), stderr captured."""
    import contextlib
    import io

    import torch

    import portable_ckpt.torch as pckt

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        pckt.load({"w": torch.zeros(2), "rng": pckt.RNGState()}, root, allow_statistical=True,
                  timeout=60)
    return {"stderr": err.getvalue(), "draw": torch.rand(1).item()}


def pipeline_stages_on_dp_submeshes(rank: int, world: int, root: str, local_names: bool,
                                    mode: str) -> dict[str, Any]:
    """pp2 x dp2: each stage FSDP2-shards its own layers on ``mesh["dp"]`` and saves natively.

    The stored copy of a DTensor on a sub-mesh is the one at pp coordinate 0: stage 1's layers
    were silently left out (HSDP/PP review F0). ``local_names``: both stages call their layers
    ``layers.0`` and ``layers.1`` (same keys and shapes, other values).
    """
    import os

    import torch
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import portable_ckpt.torch as pckt
    from portable_ckpt.errors import CheckpointError

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    stage = mesh.get_coordinate()[0]
    torch.manual_seed(10 + stage)
    first = 0 if local_names else 2 * stage
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleDict(
        {str(first + i): torch.nn.Linear(8, 8) for i in range(2)}
    )
    fully_shard(model, mesh=mesh["dp"])
    state = {"model": get_model_state_dict(model)}
    out: dict[str, Any] = {"keys": sorted(state["model"])}
    try:
        if mode == "async":
            pckt.async_save(state, root, step=1).result()
        else:
            pckt.save(state, root, step=1)
        out["error"] = None
    except CheckpointError as e:
        out["error"], out["message"] = e.code, str(e)
    out["published"] = [n for n in os.listdir(root)
                        if os.path.exists(os.path.join(root, n, "manifest.json"))]
    return out


def submesh_copy_cases(rank: int, world: int, root: str, case: str) -> dict[str, Any]:
    """The sub-mesh copy check (diff review 4): cases it must refuse and one it must accept.

    ``strided``: pp2 x dp2, stage-local names, local shards that are transposed views (their
    values were compared only when contiguous). ``same_head``: the stages' shards agree in
    their first 64 elements only. ``offset_group``: 6 ranks, a job on ranks 2-5 with a (dp, tp)
    mesh and a norm weight on ``mesh["dp"]`` alike across tp (global ranks were taken for the
    group's ranks: every rank refused).
    """
    import os

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    import portable_ckpt.torch as pckt
    from portable_ckpt.errors import CheckpointError

    group = None
    if case == "offset_group":
        dist.new_group([0, 1])
        group = dist.new_group([2, 3, 4, 5])
        mesh = DeviceMesh("cpu", [[2, 3], [4, 5]], mesh_dim_names=("dp", "tp"))
        # Every group connected before ranks 0 and 1 leave: rank 1 exiting while rank 0 still
        # connected their pair failed the test on a loaded machine (gloo: closed by peer).
        dist.barrier()
        if rank < 2:
            return {"skipped": True}
        state = {"norm": distribute_tensor(torch.arange(8.0), mesh["dp"], [Shard(0)])}
    else:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
        stage = mesh.get_coordinate()[0]
        if case == "strided":
            local = (torch.arange(16.0).reshape(4, 4) + stage).t()
            state = {"w": DTensor.from_local(local, mesh["dp"], [Shard(0)], run_check=False)}
        else:
            full = torch.zeros(8, 64)
            full[1:4] = full[5:8] = stage + 1.0
            state = {"w": distribute_tensor(full, mesh["dp"], [Shard(0)])}
    out: dict[str, Any] = {"error": None}
    try:
        pckt.save(state, root, step=1, process_group=group)
    except CheckpointError as e:
        out["error"], out["message"] = e.code, str(e)
    out["published"] = [n for n in os.listdir(root)
                        if os.path.exists(os.path.join(root, n, "manifest.json"))]
    return out


def sleep_for(rank: int, world: int, seconds: float) -> int:
    """A rank that outlives a parent killed meanwhile (test_group_sweep.py)."""
    import time

    time.sleep(seconds)
    return rank


def sleep_through_ctrl_c(rank: int, world: int, seconds: float) -> int:
    """A rank that ignores SIGINT (a job that traps Ctrl-C to save first): only a kill ends it."""
    import signal
    import time

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    time.sleep(seconds)
    return rank


def managers_opened_and_closed(rank: int, world: int, root: str, times: int) -> int:
    """Open a manager and close it at once, ``times`` times (a job restarted after its last step).

    Each manager makes its own gloo group; a rank that closed its manager while its peer was
    still connecting to that group failed the peer's constructor (a loaded host)."""
    import portable_ckpt.torch as pckt

    for i in range(times):
        with pckt.CheckpointManager(f"{root}/{i}", save_every=1):
            pass
    return rank


def manager_complex64_dtensor(rank: int, world: int, root: str, mode: str) -> dict[str, Any]:
    """A manager saving a ``complex64`` rope table sharded as a DTensor and an ``e8m0`` scale
    (format 1.3), async in ``mode``; a second manager restores them into zeros."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import portable_ckpt.torch as pckt

    mesh = init_device_mesh("cpu", (world,))
    freqs = torch.polar(torch.ones(8, 4), torch.arange(32.0).reshape(8, 4))
    scale = torch.tensor([0.5, 1.0, 4.0], dtype=torch.float32).to(torch.float8_e8m0fnu)
    state = {"freqs_cis": distribute_tensor(freqs, mesh, [Shard(0)]), "scale": scale}
    with pckt.CheckpointManager(root, save_every=1, async_save=True, async_mode=mode,
                                continuation="statistical") as mgr:
        for step in (1, 2):
            mgr.maybe_save(step, state)
    target = {"freqs_cis": distribute_tensor(torch.zeros(8, 4, dtype=torch.complex64), mesh,
                                             [Shard(0)]),
              "scale": torch.zeros(3, dtype=torch.float8_e8m0fnu)}
    with pckt.CheckpointManager(root, save_every=1, continuation="statistical") as mgr:
        info = mgr.restore(target)
    return {"step": info.step if info else None,
            "freqs": bool(torch.equal(target["freqs_cis"].full_tensor(), freqs)),
            "scale": target["scale"].view(torch.uint8).tolist() == scale.view(torch.uint8).tolist()}
