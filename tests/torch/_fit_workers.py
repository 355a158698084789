"""Per-rank programs of tests/torch/test_target_fits.py (run by ``run_group``)."""

from __future__ import annotations

from typing import Any


def stage_all_new(rank: int, world: int, root: str, every_rank_new: bool) -> dict[str, Any]:
    """Rank 0 (a pipeline stage) finds its layers; rank 1's are all new (a grown model), or,
    with ``every_rank_new``, no rank's target fits the version."""
    import numpy as np
    import torch

    import portable_ckpt
    import portable_ckpt.torch as pckt
    from portable_ckpt.errors import CheckpointError

    if every_rank_new:  # the version holds a plain value and a data position too
        pckt.save({"stage0": {"w": torch.arange(4.0)}, "seen": 7, "pos": pckt.DataPosition(2, 70)},
                  root, step=1, continuation="statistical")
    elif rank == 0:  # one process writes the version (torch.save of the group is collective)
        portable_ckpt.save_arrays(root, {"stage0/w": np.arange(4.0, dtype=np.float32)}, step=1)
    torch.distributed.barrier()
    if every_rank_new:
        pos = pckt.DataPosition(0, 0)
        target = {"renamed": {"w": torch.zeros(4)}, "seen": 0, "pos": pos}
        try:
            pckt.load(target, root, strict=False, allow_statistical=True)
        except CheckpointError as exc:  # refused before anything changed, on every rank
            return {"code": exc.code, "message": exc.message, "seen": target["seen"],
                    "pos": [pos.epoch, pos.global_sample_index, pos.restored]}
        return {"code": None}
    else:
        target = {"stage0": {"w": torch.zeros(4)}} if rank == 0 else {"stage1": {"w": torch.zeros(4)}}
    try:
        info = pckt.load(target, root, strict=False, allow_statistical=True)
    except CheckpointError as exc:
        return {"code": exc.code, "message": exc.message}
    value = next(iter(target.values()))["w"].tolist()
    return {"code": None, "missing": info.missing_keys, "w": value}


def damaged_beside_a_new_stage(rank: int, world: int, root: str) -> dict[str, Any]:
    """Rank 1's stage is new (none of its tensors stored); the newest version's rank-1 entry
    value is damaged: the manager passes over it to the older version (diff review 21, 2)."""
    import glob

    import torch

    import portable_ckpt.torch as pckt

    for step in (1, 2):
        pckt.save({"a": torch.full((4,), float(step)), "pos": pckt.DataPosition(0, 10 * step + rank)},
                  root, step=step, continuation="statistical")
    torch.distributed.barrier()
    if rank == 0:
        [f] = glob.glob(f"{root}/s000000000002-*/entries/pos*.r00001.json")
        data = bytearray(open(f, "rb").read())
        at = data.index(b"21")
        data[at:at + 2] = b"91"  # the CRC no longer matches
        with open(f, "wb") as out:
            out.write(bytes(data))
    torch.distributed.barrier()
    target: dict[str, Any] = {"a": torch.zeros(4)} if rank == 0 else {"b_new": torch.zeros(4)}
    target["pos"] = pckt.DataPosition(0, 0)
    with pckt.CheckpointManager(root, save_every=100) as mgr:
        info = mgr.restore(target, strict=False)
    return {"step": info.step, "pos": target["pos"].global_sample_index}


def renamed_beside_an_empty_dict(rank: int, world: int, root: str) -> dict[str, Any]:
    """A renamed model beside an empty ``ema`` dict the version fills: refused on any number
    of ranks (diff review 21, 4: loaded on two with the model left unloaded)."""
    import numpy as np
    import torch

    import portable_ckpt
    import portable_ckpt.torch as pckt
    from portable_ckpt.errors import CheckpointError

    if rank == 0:
        portable_ckpt.save_arrays(root, {"model/w": np.ones(4, np.float32),
                                         "ema/w": np.ones(4, np.float32)}, step=1)
    torch.distributed.barrier()
    try:
        pckt.load({"module": {"w": torch.zeros(4)}, "ema": {}}, root, strict=False,
                  allow_statistical=True)
    except CheckpointError as exc:
        return {"code": exc.code}
    return {"code": None}


def check_fails_on_one_rank(rank: int, world: int, root: str) -> dict[str, Any]:
    """Rank 1's check step fails (its contract check raises, injected around the real one):
    rank 0's error must say that the target was not touched, which is true of that step."""
    import torch

    import portable_ckpt.torch as pckt
    import portable_ckpt.torch.loading as loading
    from portable_ckpt.errors import CheckpointError, ContractError

    pckt.save({"w": torch.arange(4.0), "seen": 7}, root, step=1, continuation="statistical")
    torch.distributed.barrier()
    if rank == 1:
        real = loading._new_info

        def refuse(*args: Any, **kwargs: Any) -> Any:
            real(*args, **kwargs)
            raise ContractError("injected: this rank's contract check failed")

        loading._new_info = refuse  # type: ignore[assignment]
    target = {"w": torch.zeros(4), "seen": 0}
    try:
        pckt.load(target, root)
    except CheckpointError as exc:
        return {"code": exc.code, "message": exc.message, "w": target["w"].tolist(),
                "seen": target["seen"]}
    return {"code": None}
