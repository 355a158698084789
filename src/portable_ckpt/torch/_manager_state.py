"""What the manager saves besides the caller's state, and the Stateful model+optimizer view.

:class:`ModelOptimizerState` is read at call time (the cure for the stale-state trap of issue 14,
docs/torch.md); :class:`ManagerEntry` carries the ``pck.manager`` and ``pck.placement`` entries
of a save; :func:`warn_stale` names a snapshot optimizer dict passed by mistake.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from portable_ckpt.errors import UsageError
from portable_ckpt.manager.records import manager_entry_schema
from portable_ckpt.torch.flatten import StateEntry

__all__ = ["ManagerEntry", "ModelOptimizerState", "warn_stale"]

_log = logging.getLogger("portable_ckpt")


class ModelOptimizerState:
    """A Stateful view of an FSDP2 (or plain) model and its optimizer, read at call time.

    ``state_dict()`` calls ``get_state_dict(model, optimizer)`` every time it is asked, so a
    manager always saves the live values (learning rates included); ``load_state_dict()`` hands
    the loaded dicts to ``set_state_dict``. Put it in the manager's state instead of dicts
    obtained from ``get_state_dict`` once (which go stale: see docs/torch.md).
    """

    def __init__(self, model: torch.nn.Module, optimizer: Any = None, *, options: Any = None):
        if getattr(options, "broadcast_from_rank0", False):
            # set_state_dict then broadcasts from rank 0 while the other ranks, which hold no
            # full state, are already in the load's next collective: a hang until the timeout
            raise UsageError(
                "ModelOptimizerState: StateDictOptions(broadcast_from_rank0=True) is not "
                "supported: every rank reads its own part of a version, no broadcast is needed; "
                "pass the options without it"
            )
        self.model = model
        self.optimizer = optimizer
        self.options = options

    def state_dict(self) -> dict[str, Any]:
        """``{"model": ..., "optim": ...}`` from ``get_state_dict`` (now).

        Before the optimizer's first step, ``get_state_dict`` makes its state with a step of
        zero gradients at learning rate 0, which counts as a step (AdamW's ``step`` becomes 1,
        shifting the bias correction of every later step). The live optimizer is given its empty
        state back, and the state returned counts the steps taken: ``step`` 0, so a job resumed
        from it takes the same steps as one that never saved (zero moments are Adam's own start).
        """
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if self.optimizer is None:
            return {"model": get_model_state_dict(self.model, options=self.options)}
        fresh = not self.optimizer.state
        msd, osd = get_state_dict(self.model, self.optimizer, options=self.options)
        if fresh and self.optimizer.state:
            self.optimizer.state.clear()  # the state made above is no longer the optimizer's
            states: Any = osd.get("state", {})
            for per_param in states.values() if isinstance(states, dict) else ():
                if not isinstance(per_param, dict):
                    continue
                step = per_param.get("step")
                if isinstance(step, torch.Tensor):
                    step.zero_()
                elif isinstance(step, int | float) and not isinstance(step, bool):
                    per_param["step"] = type(step)(0)
        return {"model": msd, "optim": osd}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Apply loaded dicts with ``set_state_dict``."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        if self.optimizer is None:
            set_model_state_dict(self.model, state["model"], options=self.options)
            return
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=self.options,
        )


class ManagerEntry(StateEntry):
    """The ``pck.manager`` entry (step, reason, metrics) of one save."""

    scope = "global"
    compare_ranks = False  # bookkeeping: a rank's metrics may be its own (its loss)

    def __init__(self, value: dict[str, Any], schema: dict[str, Any] | None = None) -> None:
        self.schema = schema or manager_entry_schema()  # type: ignore[assignment]
        self.value = value

    def capture(self) -> Any:
        return self.value

    def restore(self, value: Any) -> None:  # pragma: no cover - never loaded into a state
        self.value = value


#: How deep :func:`warn_stale` looks into nested dicts (``{"train": {"optim": osd}}`` is 2).
STALE_DEPTH = 4


def warn_stale(
    state: Mapping[str, Any], warned: set[str], _path: str = "", _depth: int = 0
) -> None:
    """The stale-state trap: an optimizer state dict taken once is a snapshot (issue 14).

    Looks at the values of ``state`` and of the dicts nested in it (up to :data:`STALE_DEPTH`
    levels; Stateful objects are read at save time and never looked into); warns once per key.
    """
    for key, value in state.items():
        if not isinstance(value, Mapping):
            continue
        path = f"{_path}[{key!r}]"
        if "param_groups" in value:
            if path not in warned:
                warned.add(path)
                _log.warning(
                    "state%s is an optimizer state dict: a snapshot whose learning rates and "
                    "hyper-parameters go stale as training continues. Pass the live objects "
                    "instead, e.g. state = {'train': ModelOptimizerState(model, optimizer)}",
                    path,
                )
        elif _depth + 1 < STALE_DEPTH:
            warn_stale(value, warned, path, _depth + 1)
