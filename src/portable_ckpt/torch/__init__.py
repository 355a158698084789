"""torch.distributed adapter: collective save, async save and resharding load.

Example (every rank of the group runs this)::

    import portable_ckpt.torch as pckt
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    msd, osd = get_state_dict(model, optim)
    state = {"model": msd, "optim": osd, "sched": scheduler, "scaler": scaler,
             "rng": pckt.RNGState(), "data": data_position}
    pckt.save(state, "/ckpts/run1", step=step)

    info = pckt.load(state, "/ckpts/run1", allow_statistical=True)   # fills `state` in place
    set_state_dict(model, optim, model_state_dict=msd, optim_state_dict=osd)

See :mod:`portable_ckpt.torch.flatten` for the key rule and :mod:`portable_ckpt.torch.state` for
the continuation-state helpers.
"""

from __future__ import annotations

from portable_ckpt.torch.checkpoint import (
    AsyncSaveHandle,
    CheckpointInfo,
    LoadInfo,
    async_save,
    load,
    save,
    staging_bytes,
    wait_for_pending_save,
)
from portable_ckpt.torch.flatten import StateEntry, flatten_state, split_key, unflatten_keys
from portable_ckpt.torch.manager import CheckpointManager, ModelOptimizerState
from portable_ckpt.torch.state import (
    DataPosition,
    GradScalerState,
    LRSchedulerState,
    RNGState,
    capture_rng,
    restore_rng,
)

__all__ = [
    "AsyncSaveHandle",
    "CheckpointInfo",
    "CheckpointManager",
    "DataPosition",
    "GradScalerState",
    "LRSchedulerState",
    "LoadInfo",
    "ModelOptimizerState",
    "RNGState",
    "StateEntry",
    "async_save",
    "capture_rng",
    "flatten_state",
    "load",
    "restore_rng",
    "save",
    "split_key",
    "staging_bytes",
    "unflatten_keys",
    "wait_for_pending_save",
]
