"""Per-rank programs of the DCP storage-layer and FSDP2 + TP tests (run through run_group).

One model everywhere: ``MLP`` (``up`` 6→10, ``down`` 10→6, so 10 rows split unevenly), trained
two AdamW steps from a fixed seed on the saving layout. The saving group records every value as
``full_tensor()`` in ``expected.json``; every loading layout compares its filled state with it.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)
from torch.distributed.tensor.placement_types import _StridedShard

import portable_ckpt.torch as pckt
from portable_ckpt.torch.dcp import (
    PortableLoadPlanner,
    PortableSavePlanner,
    PortableStorageReader,
    PortableStorageWriter,
)
from portable_ckpt.torch.layout import PlacementSpec, dtensor_layout, local_pieces


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(6, 10)
        self.down = nn.Linear(10, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def build(layout: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The model on ``layout``: ``fsdp_tp`` (dp x tp mesh), ``fsdp``, ``tp`` or ``single``."""
    torch.manual_seed(0)
    model = MLP()
    world = dist.get_world_size() if dist.is_initialized() else 1
    if layout.startswith("fsdp_tp"):
        tp = int(layout.rsplit("_", 1)[1]) if layout.count("_") == 2 else 2
        mesh = init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(model, mesh=mesh["dp"])
    elif layout == "fsdp":
        fully_shard(model, mesh=init_device_mesh("cpu", (world,), mesh_dim_names=("dp",)))
    elif layout == "tp":
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    return model, torch.optim.AdamW(model.parameters(), lr=0.05)


def train(model: nn.Module, optim: torch.optim.Optimizer, steps: int) -> None:
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(4, 6, generator=gen)
        model(x).pow(2).sum().backward()
        optim.step()
        optim.zero_grad()


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def tensors_of(state: dict[str, Any], prefix: str = "") -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for k, v in state.items():
        if isinstance(v, torch.Tensor):
            out[prefix + k] = full(v.detach())
        elif isinstance(v, dict):
            out.update(tensors_of(v, f"{prefix}{k}/"))
    return out


def job_state(model: nn.Module, optim: torch.optim.Optimizer) -> dict[str, Any]:
    msd, osd = get_state_dict(model, optim)
    return {"model": msd, "optim": osd, "extra": {"epoch": 3, "hist": [1.5, 2.5], "tag": "run"}}


def snapshot(state: dict[str, Any]) -> dict[str, Any]:
    """Every tensor as a full list, plus the optimizer's hyper-parameters (JSON)."""
    values = {k: t.tolist() for k, t in tensors_of(state).items()}
    group = {k: v for k, v in state["optim"]["param_groups"][0].items() if k != "params"}
    return {"tensors": values, "group": json.loads(json.dumps(group)), "extra": state["extra"]}


def differences(state: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    got = snapshot(state)
    bad = [k for k, v in expected["tensors"].items() if got["tensors"].get(k) != v]
    bad += [f"group/{k}" for k, v in expected["group"].items() if got["group"].get(k) != v]
    if got["extra"] != expected["extra"]:
        bad.append("extra")
    return bad


def fresh_state(layout: str) -> tuple[nn.Module, torch.optim.Optimizer, dict[str, Any]]:
    """A new model on ``layout`` whose state is zeroed: loading must fill all of it."""
    model, optim = build(layout)
    return model, optim, cleared(model, optim)


def cleared(model: nn.Module, optim: torch.optim.Optimizer) -> dict[str, Any]:
    """The job state with every tensor (the model's and optimizer's own memory) zeroed."""
    state = job_state(model, optim)
    with torch.no_grad():
        for v in _locals(state):
            v.zero_()
    state["optim"]["param_groups"][0]["lr"] = 9.0
    state["optim"]["param_groups"][0]["betas"] = (0.0, 0.0)
    state["extra"] = {"epoch": 0, "hist": [0.0, 0.0], "tag": ""}
    return state


def _locals(state: dict[str, Any]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for v in state.values():
        if isinstance(v, torch.Tensor):
            out.append(v.to_local() if hasattr(v, "to_local") else v)
        elif isinstance(v, dict):
            out.extend(_locals(v))
    return out


def apply(model: nn.Module, optim: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])


def codes(exc: BaseException) -> list[str]:
    """Error codes of a DCP CheckpointException (one per failed rank) or of our own error."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict):
        return sorted({str(getattr(e, "code", type(e).__name__)) for e, _ in failures.values()})
    return [str(getattr(exc, "code", type(exc).__name__))]


def refused(fn: Callable[[], Any]) -> list[str]:
    try:
        fn()
    except BaseException as e:  # CheckpointException derives from BaseException
        return codes(e)
    return []


# -- the saving group: FSDP2 + TP on a 2 x 2 mesh ---------------------------------------------------


def big_tensor() -> torch.Tensor:
    """256 KiB saved beside the model, for checking that a load reads only its share."""
    return torch.arange(512 * 128, dtype=torch.float32).reshape(512, 128)


def save_fsdp_tp(rank: int, world: int, roots: dict[str, str]) -> dict[str, Any]:
    """Train on dp=2 x tp=2, save through DCP (sync + thread async) and portable_ckpt.torch."""
    model, optim = build("fsdp_tp")
    train(model, optim, 2)
    state = job_state(model, optim)
    placements = {k: str(v.placements) for k, v in state["model"].items()}
    expected = snapshot(state)
    if rank == 0:
        with open(roots["expected"], "w", encoding="utf-8") as f:
            json.dump(expected, f)
    big = {"big": distribute_tensor(big_tensor(), init_device_mesh("cpu", (world,)), [Shard(0)])}
    writer = PortableStorageWriter(roots["dcp"], step=2, block_size=4096)
    dcp.save({**state, **big}, storage_writer=writer)
    pckt.save(state, roots["pckt"], step=2)
    staged = _async_thread_save(model, optim, state, roots["dcp"])
    back = _reload_exact(roots["dcp"], expected)
    return {"placements": placements, "staged_ok": staged, **back, "layouts": layout_cases(rank)}


def _async_thread_save(
    model: nn.Module, optim: torch.optim.Optimizer, state: dict[str, Any], root: str
) -> bool:
    """async_save (thread mode), then train on while it writes: step 3 holds the staged values."""
    before = snapshot(state)
    resp = dcp.async_save(
        state,
        storage_writer=PortableStorageWriter(root, step=3),
        async_checkpointer_type=AsyncCheckpointerType.THREAD,
    )
    fut = getattr(resp, "upload_completion", resp)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(100.0)  # the live state moves on; the saved version must not
    fut.result()
    check_state = fresh_state("fsdp_tp")[2]
    dcp.load(check_state, storage_reader=PortableStorageReader(root, step=3))
    return differences(check_state, before) == []


def _reload_exact(root: str, expected: dict[str, Any]) -> dict[str, Any]:
    model, optim, state = fresh_state("fsdp_tp")
    reader = PortableStorageReader(root, step=2)
    dcp.load(state, storage_reader=reader)
    apply(model, optim, state)
    return {
        "exact_bad": differences(job_state(model, optim), expected),
        "bytes_read": reader.stats.bytes_read,
        "blocks": reader.stats.blocks_verified,
    }


def layout_cases(rank: int, cases: int = 16) -> list[str]:
    """Random layouts on the real 4-rank group: boxes vs DTensor's local tensors and gathers.

    Every case checks that the boxes hold exactly the local tensor. Where DTensor's own
    gathers are defined (every ``_StridedShard`` is undone by the ``Shard`` placements after
    it, as FSDP2 on TP builds them) ``full_tensor()`` and ``redistribute`` must give the
    tensor back too; for other strided combinations torch 2.13's gathers do not.
    """
    rnd = random.Random(7)  # the same cases on every rank
    meshes = {m: init_device_mesh("cpu", m) for m in ((4,), (2, 2))}
    bad: list[str] = []
    for i in range(cases):
        mesh_shape = rnd.choice(sorted(meshes))
        shape = tuple(rnd.randint(1, 11) for _ in range(rnd.randint(1, 2)))
        specs = [_random_spec(rnd, len(shape)) for _ in mesh_shape]
        mesh = meshes[mesh_shape]
        g = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
        # Local split (DTensor's own code); the gathers below are the real collectives.
        dt = distribute_tensor(g, mesh, [_placement(p) for p in specs], src_data_rank=None)
        _, pieces = local_pieces(shape, mesh_shape, mesh.get_coordinate(), specs)
        local = dt.to_local()
        for p in pieces:
            glob = tuple(slice(o, o + n) for o, n in zip(p.offsets, p.lengths, strict=True))
            if not torch.equal(local[p.local_slices()], g[glob]):
                bad.append(f"case {i}: {specs} {p}")
        if _gathers_defined(mesh_shape, specs) and not (
            torch.equal(dt.full_tensor(), g)
            and torch.equal(dt.redistribute(mesh, [Replicate()] * len(mesh_shape)).to_local(), g)
        ):
            bad.append(f"case {i}: DTensor does not round-trip {specs}")
    return bad


def _gathers_defined(mesh_shape: tuple[int, ...], specs: list[PlacementSpec]) -> bool:
    for i, p in enumerate(specs):
        if p.kind == "strided":
            later = [
                mesh_shape[j]
                for j in range(i + 1, len(specs))
                if specs[j].kind == "shard" and specs[j].dim == p.dim
            ]
            if p.split_factor != math.prod(later):
                return False
    return True


def _random_spec(rnd: random.Random, ndim: int) -> PlacementSpec:
    kind = rnd.choice(["shard", "strided", "replicate"])
    if kind == "replicate":
        return PlacementSpec("replicate")
    return PlacementSpec(kind, rnd.randrange(ndim), rnd.randint(1, 3) if kind == "strided" else 1)


def _placement(p: PlacementSpec) -> Any:
    if p.kind == "shard":
        return Shard(p.dim)
    if p.kind == "strided":
        return _StridedShard(p.dim, split_factor=p.split_factor)
    return Replicate()


# -- loading groups ---------------------------------------------------------------------------------


def _load_all(layout: str, roots: dict[str, str], expected: dict[str, Any]) -> dict[str, Any]:
    """The 2 x 2 versions into ``layout``: through DCP and portable_ckpt.torch, both writers."""
    model, optim, state = fresh_state(layout)
    out: dict[str, Any] = {
        "contract": refused(
            lambda: dcp.load(state, storage_reader=PortableStorageReader(roots["dcp"], step=2))
        )
    }
    for name, root in (("dcp", roots["dcp"]), ("pckt", roots["pckt"])):
        state = cleared(model, optim)
        reader = PortableStorageReader(root, step=2, allow_statistical=True)
        dcp.load(state, storage_reader=reader)
        apply(model, optim, state)
        out[f"dcp_load_{name}"] = differences(job_state(model, optim), expected)
        state = cleared(model, optim)
        pckt.load(state, root, step=2, allow_statistical=True)
        apply(model, optim, state)
        out[f"pckt_load_{name}"] = differences(job_state(model, optim), expected)
    return out


def load_dp(rank: int, world: int, roots: dict[str, str]) -> dict[str, Any]:
    """FSDP2 only (dp = world) loads the 2 x 2 versions."""
    with open(roots["expected"], encoding="utf-8") as f:
        expected = json.load(f)
    out = _load_all("fsdp", roots, expected)
    target = {
        "big": distribute_tensor(
            torch.zeros(512, 128), init_device_mesh("cpu", (world,)), [Shard(0)]
        )
    }
    reader = PortableStorageReader(roots["dcp"], step=2, allow_statistical=True)
    dcp.load(target, storage_reader=reader)
    out["big_ok"] = torch.equal(target["big"].full_tensor(), big_tensor())
    out["big_bytes_read"] = reader.stats.bytes_read
    out["big_blocks"] = reader.stats.blocks_verified
    return out


def load_two(rank: int, world: int, roots: dict[str, str]) -> dict[str, Any]:
    """On 2 ranks: FSDP x TP 2 x 1 and TP only load the 2 x 2 versions; process-mode async save;
    a strided layout of several boxes per rank through the portable planners."""
    with open(roots["expected"], encoding="utf-8") as f:
        expected = json.load(f)
    out = {
        "fsdp_tp_2x1": _load_all("fsdp_tp_1", roots, expected),
        "tp": _load_all("tp", roots, expected),
    }
    out["strided"] = _strided_boxes(rank, roots["strided"])
    out["process"] = _async_process_save(rank, roots["process"])
    return out


def _strided_boxes(rank: int, root: str) -> dict[str, Any]:
    """[_StridedShard(0, sf=2)] on 2 ranks over 9 rows: rank 0 holds rows 0-2 and 5-6."""
    mesh = init_device_mesh("cpu", (2,))
    g = torch.arange(27.0).reshape(9, 3)
    state = {
        "s": distribute_tensor(g, mesh, [_StridedShard(0, split_factor=2)], src_data_rank=None)
    }
    out: dict[str, Any] = {"boxes": len(dtensor_layout(state["s"]).pieces)}
    out["default_planner"] = refused(
        lambda: dcp.save(state, storage_writer=PortableStorageWriter(root, step=1))
    )
    dcp.save(
        state, storage_writer=PortableStorageWriter(root, step=2), planner=PortableSavePlanner()
    )
    strided = {
        "s": distribute_tensor(
            torch.zeros(9, 3), mesh, [_StridedShard(0, split_factor=2)], src_data_rank=None
        )
    }
    out["default_load"] = refused(
        lambda: dcp.load(strided, storage_reader=PortableStorageReader(root, step=2))
    )
    dcp.load(
        strided, storage_reader=PortableStorageReader(root, step=2), planner=PortableLoadPlanner()
    )
    rows = {"s": distribute_tensor(torch.zeros(9, 3), mesh, [Shard(0)])}
    dcp.load(rows, storage_reader=PortableStorageReader(root, step=2))
    plain = {"s": torch.zeros(9, 3)}
    pckt.load(plain, root, step=2)
    out["values_ok"] = [
        torch.equal(strided["s"].full_tensor(), g),
        torch.equal(rows["s"].full_tensor(), g),
        torch.equal(plain["s"], g),
        _strided_portable(root, mesh),
    ]
    return out


def _strided_portable(root: str, mesh: Any) -> bool:
    """The same through portable_ckpt.torch: async_save stages both boxes of a rank (8 rows:
    rank 0 holds rows 0-1 and 4-5, two buffers of one shape), load fills a strided target."""
    placement = [_StridedShard(0, split_factor=2)]
    g = torch.arange(24.0).reshape(8, 3)
    state = {"s": distribute_tensor(g, mesh, placement, src_data_rank=None)}
    pckt.async_save(state, root, step=3).result()
    target = {"s": distribute_tensor(torch.zeros(8, 3), mesh, placement, src_data_rank=None)}
    pckt.load(target, root, step=3)
    return torch.equal(target["s"].full_tensor(), g)


def _async_process_save(rank: int, root: str) -> dict[str, Any]:
    """async_save in process mode: the writer travels to DCP's checkpoint process and commits."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    mesh = init_device_mesh("cpu", (2,))
    g = torch.arange(30.0).reshape(10, 3)
    state = {"w": distribute_tensor(g, mesh, [Shard(0)]), "b": torch.ones(4), "n": {"k": 5}}
    resp = dcp.async_save(
        state,
        storage_writer=PortableStorageWriter(root, step=4),
        async_checkpointer_type=AsyncCheckpointerType.PROCESS,
    )
    getattr(resp, "upload_completion", resp).result()
    back = {
        "w": distribute_tensor(torch.zeros(10, 3), mesh, [Shard(0)]),
        "b": torch.zeros(4),
        "n": {"k": 0},
    }
    dcp.load(back, storage_reader=PortableStorageReader(root, step=4))
    return {
        "ok": torch.equal(back["w"].full_tensor(), g) and torch.equal(back["b"], torch.ones(4)),
        "n": back["n"]["k"],
    }


# -- ranks that open different versions in one dcp.load --------------------------------------------


def mixed_versions(rank: int, world: int, base: str) -> dict[str, Any]:
    """Versions of steps 1 and 2 under ``a``, 7 under ``b``; one load where the ranks were given
    different steps, one where they were given different roots: each load's error, as DCP
    raises it on this rank (code and message of the first failure)."""
    for step, root in ((1, "a"), (2, "a"), (7, "b")):
        dcp.save({"w": torch.full((4,), float(step))},
                 storage_writer=PortableStorageWriter(f"{base}/{root}", step=step))
    readers = {
        "steps": PortableStorageReader(f"{base}/a", step=1 + rank),
        "roots": PortableStorageReader(f"{base}/{'a' if rank == 0 else 'b'}",
                                       allow_statistical=True),
        "same": PortableStorageReader(f"{base}/a", step=2),
    }
    out: dict[str, Any] = {}
    for name, reader in readers.items():
        target = {"w": torch.zeros(4)}
        try:
            dcp.load(target, storage_reader=reader)
        except BaseException as e:  # CheckpointException derives from BaseException
            failures = getattr(e, "failures", None)
            err = next(iter(failures.values()))[0] if failures else e
            out[name] = {"code": getattr(err, "code", type(err).__name__), "message": str(err)}
        else:
            out[name] = {"loaded": target["w"].tolist()}
    return out
