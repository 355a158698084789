"""torch.distributed adapter: collective save, async save and resharding load.

Start with :class:`CheckpointManager` (every rank of the group runs this)::

    import portable_ckpt.torch as pckt

    state = {"train": pckt.ModelOptimizerState(model, optim), "sched": scheduler,
             "scaler": scaler, "rng": pckt.RNGState(), "data": data_position}
    with pckt.CheckpointManager("/ckpts/run1", save_every=500, keep_last=3) as mgr:
        info = mgr.restore(state)                       # None on the first run
        for step in range((info.step + 1) if info else 1, total + 1):
            ...
            mgr.maybe_save(step, state, metrics={"loss": loss})
            if mgr.preempted:
                break

Underneath: ``pckt.save(state, root, step=...)``, ``async_save`` and ``load(state, root)``
(fills ``state`` in place). Values with ``state_dict()``/``load_state_dict()`` are asked for
their state at each save; a dict taken from ``get_state_dict`` earlier is a stale snapshot.

Modules, by verb: :mod:`~portable_ckpt.torch.saving` (options and the collective save protocol),
:mod:`~portable_ckpt.torch.async_saving` (the background save), :mod:`~portable_ckpt.torch.plan`
(which rank writes what), :mod:`~portable_ckpt.torch.staging` (reused host buffers),
:mod:`~portable_ckpt.torch.loading` (the resharding load), :mod:`~portable_ckpt.torch.info`
(their results). See :mod:`portable_ckpt.torch.flatten` for the key rule and
:mod:`portable_ckpt.torch.state` for the continuation-state helpers.
"""

from __future__ import annotations

from portable_ckpt.torch._inflight import wait_for_pending_save
from portable_ckpt.torch._tensors import as_tensor
from portable_ckpt.torch.async_saving import AsyncSaveHandle, async_save
from portable_ckpt.torch.flatten import StateEntry, flatten_state, split_key, unflatten_keys
from portable_ckpt.torch.info import CheckpointInfo, LoadInfo
from portable_ckpt.torch.loading import load
from portable_ckpt.torch.manager import CheckpointManager, ModelOptimizerState
from portable_ckpt.torch.saving import save
from portable_ckpt.torch.staging import staging_bytes
from portable_ckpt.torch.state import (
    DataPosition,
    GeneratorState,
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
    "GeneratorState",
    "GradScalerState",
    "LRSchedulerState",
    "LoadInfo",
    "ModelOptimizerState",
    "RNGState",
    "StateEntry",
    "as_tensor",
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
