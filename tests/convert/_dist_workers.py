"""Worker functions run in spawned gloo processes (importable by the spawn start method)."""

from __future__ import annotations

import os
import traceback
from typing import Any


def _init(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )


def _run(fn: Any, rank: int, world: int, port: int, args: tuple[Any, ...], errq: Any) -> None:
    import torch.distributed as dist

    try:
        _init(rank, world, port)
        fn(rank, world, *args)
        dist.barrier()
    except BaseException:
        errq.put((rank, traceback.format_exc()))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    # Done and reported: leave without the interpreter's teardown, where torch's native threads
    # can rarely abort a finished process ("terminate called without an active exception").
    os._exit(0)


def save_dtensor_and_fsdp(rank: int, world: int, ckpt: str, ref: str) -> None:
    """dcp.save of DTensors (uneven Shard(0), Shard(1)), an FSDP2 model and AdamW state."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    full_a = torch.randn(7, 5)
    full_b = torch.arange(6 * 9, dtype=torch.float32).reshape(6, 9).to(torch.bfloat16)
    full_r = torch.randn(4)
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 3))
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(1 + rank)
    loss = model(torch.randn(8, 6)).sum()
    loss.backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
    state = {
        "dt": {
            "a": distribute_tensor(full_a, mesh, [Shard(0)]),
            "b": distribute_tensor(full_b, mesh, [Shard(1)]),
            "r": distribute_tensor(full_r, mesh, [Replicate()]),
        },
        "model": msd,
        "optim": osd,
        "step": 7,
        "meta": {"name": "run1", "lrs": [0.1, 0.01]},
    }
    dcp.save(state, checkpoint_id=ckpt)
    # Reference: the full tensors, by the same flattened keys DCP uses.
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    flat, _ = flatten_state_dict(state)
    full = {}
    for k, v in flat.items():
        if hasattr(v, "full_tensor"):
            full[k] = v.full_tensor().detach().clone()
        elif isinstance(v, torch.Tensor):
            full[k] = v.detach().clone()
    nested = _full_nested(state)  # full_tensor() is collective: every rank takes part
    if rank == 0:
        torch.save(full, ref)
        torch.save(nested, ref + ".nested")  # the job's nested state, tensors whole


def _full_nested(node: Any) -> Any:
    if hasattr(node, "full_tensor"):
        return node.full_tensor().detach().clone()
    if hasattr(node, "detach"):
        return node.detach().clone()
    if isinstance(node, dict):
        return {k: _full_nested(v) for k, v in node.items()}
    if isinstance(node, list | tuple):
        return type(node)(_full_nested(v) for v in node)
    return node


def load_dcp_into_dtensors(rank: int, world: int, ckpt: str, ref: str) -> None:
    """dcp.load a (converted) DCP directory into DTensors sharded over ``world`` ranks."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    full = torch.load(ref, weights_only=True)
    target = {}
    for k, v in full.items():
        if v.dim() >= 1 and v.shape[0] >= 1:
            target[k] = distribute_tensor(torch.zeros_like(v), mesh, [Shard(0)])
        else:
            target[k] = torch.zeros_like(v)
    dcp.load(target, checkpoint_id=ckpt)
    for k, v in full.items():
        got = target[k].full_tensor() if hasattr(target[k], "full_tensor") else target[k]
        if not torch.equal(got, v) or got.dtype != v.dtype:
            raise AssertionError(f"rank {rank}: {k} differs after dcp.load")


def read_portable_boxes(rank: int, world: int, root: str, ref: str) -> None:
    """Each rank reads its own Shard(0)/Shard(1) boxes of every tensor via ck.read."""
    import numpy as np
    import torch

    import portable_ckpt

    ck = portable_ckpt.open(root)
    full = torch.load(ref, weights_only=True)
    for k, v in full.items():
        want = v.contiguous().reshape(-1).view(torch.uint8).numpy()
        nd = v.dim()
        if nd == 0:
            got = ck.read(k)
            assert got.reshape(-1).view(np.uint8).tobytes() == want.tobytes(), k
            continue
        for dim in range(nd):
            n = v.shape[dim]
            per = -(-n // world)
            lo, hi = min(rank * per, n), min((rank + 1) * per, n)
            if hi <= lo:
                continue
            offs = [0] * nd
            lens = list(v.shape)
            offs[dim], lens[dim] = lo, hi - lo
            got = ck.read(k, offs, lens)
            sl = [slice(None)] * nd
            sl[dim] = slice(lo, hi)
            exp = v[tuple(sl)].contiguous().reshape(-1).view(torch.uint8).numpy()
            assert got.dtype.itemsize == v.element_size(), k
            assert np.ascontiguousarray(got).reshape(-1).view(np.uint8).tobytes() == exp.tobytes(), (k, dim)


def save_replicated(rank: int, world: int, ckpt: str) -> None:
    """dcp.save of a small replicated state: DCP's dedup leaves the last rank without items."""
    import torch
    import torch.distributed.checkpoint as dcp

    state = {"model": {"w": torch.ones(3), "b": torch.zeros(2)}, "step": 11}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(ckpt))


def save_uneven(rank: int, world: int, ckpt: str) -> None:
    """dcp.save of a DTensor of 6 rows on 4 ranks (2, 2, 2, 0: rank 3 stores an empty chunk)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    full = torch.arange(6 * 3, dtype=torch.float32).reshape(6, 3)
    state = {"rep": torch.full((2,), 7.0), "sh": distribute_tensor(full, mesh, [Shard(0)])}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(ckpt))
