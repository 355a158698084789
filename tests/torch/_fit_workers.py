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

    if rank == 0:  # one process writes the version (torch.save of the group is collective)
        portable_ckpt.save_arrays(root, {"stage0/w": np.arange(4.0, dtype=np.float32)}, step=1)
    torch.distributed.barrier()
    if every_rank_new:
        target = {"renamed": {"w": torch.zeros(4)}}
    else:
        target = {"stage0": {"w": torch.zeros(4)}} if rank == 0 else {"stage1": {"w": torch.zeros(4)}}
    try:
        info = pckt.load(target, root, strict=False, allow_statistical=True)
    except CheckpointError as exc:
        return {"code": exc.code, "message": exc.message}
    value = next(iter(target.values()))["w"].tolist()
    return {"code": None, "missing": info.missing_keys, "w": value}
