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

from portable_ckpt.errors import UnsupportedValueError, UsageError
from portable_ckpt.manager.records import manager_entry_schema
from portable_ckpt.torch.flatten import StateEntry, init_optimizer_state

__all__ = ["ManagerEntry", "ModelOptimizerState", "warn_stale"]

_log = logging.getLogger("portable_ckpt")


class ModelOptimizerState:
    """A Stateful view of an FSDP2 (or plain) model and its optimizer, read at call time.

    ``state_dict()`` calls ``get_state_dict(model, optimizer)`` every time it is asked, so a
    manager always saves the live values (learning rates included); ``load_state_dict()`` hands
    the loaded dicts to ``set_state_dict``. Put it in the manager's state instead of dicts
    obtained from ``get_state_dict`` once (which go stale: see docs/torch.md). ``optimizer``
    may be several optimizers over disjoint parameters of the model (a list: AdamW for some
    parameters, another optimizer for the rest), as ``get_state_dict`` takes them.
    """

    def __init__(self, model: torch.nn.Module, optimizer: Any = None, *, options: Any = None):
        """Hold ``model``, its ``optimizer`` (one, a list, or ``None``) and ``options``.

        Raises:
            UsageError: ``model`` is no ``torch.nn.Module``, ``optimizer`` no optimizer (or
                list of them), ``options`` no ``StateDictOptions``, or options the manager
                cannot honour.

        """
        # Checked here: ModelOptimizerState(5) was taken, and failed at the first save or
        # restore, deep in get_state_dict (api review 31).
        if not isinstance(model, torch.nn.Module):
            raise UsageError(
                "ModelOptimizerState: model must be a torch.nn.Module (the FSDP2 or plain "
                f"model), got {type(model).__name__} {model!r:.80}"
            )
        if options is not None:
            from torch.distributed.checkpoint.state_dict import StateDictOptions

            if not isinstance(options, StateDictOptions):
                raise UsageError(
                    "ModelOptimizerState: options must be a torch.distributed.checkpoint."
                    f"state_dict.StateDictOptions or None, got {type(options).__name__} "
                    f"{options!r:.80}"
                )
        if getattr(options, "broadcast_from_rank0", False):
            # set_state_dict then broadcasts from rank 0 while the other ranks, which hold no
            # full state, are already in the load's next collective: a hang until the timeout
            raise UsageError(
                "ModelOptimizerState: StateDictOptions(broadcast_from_rank0=True) is not "
                "supported: every rank reads its own part of a version, no broadcast is needed; "
                "pass the options without it"
            )
        if getattr(options, "full_state_dict", False) and getattr(options, "cpu_offload", False):
            # get_state_dict then gives the whole state to rank 0 and empty dicts to the others,
            # which a save of rank-0 copies refuses with a conflict (integrator review F14)
            raise UsageError(
                "ModelOptimizerState: StateDictOptions(full_state_dict=True, cpu_offload=True) "
                "gives the state to rank 0 only; drop one of them (every rank writes its own "
                "shard anyway: full_state_dict is not needed to save or to reshard)"
            )
        self.model = model
        self.optimizer = optimizer
        #: Optimizers that had no state when ``state_dict()`` last ran (a load's template).
        self._fresh: set[int] = set()
        self.optimizers: list[Any] = [] if optimizer is None else (
            [optimizer] if isinstance(optimizer, torch.optim.Optimizer) else _listed(optimizer))
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
        fresh = [o for o in self.optimizers if not o.state]
        self._fresh = {id(o) for o in fresh}
        # get_state_dict makes a fresh optimizer's state only when no parameter has a gradient
        # yet: after a warm-up backward the template had no optimizer state, and a restore
        # into it loaded none, silently (integrator review F15). The gradients wait aside.
        pending = {id(p): (p, p.grad) for o in fresh for g in o.param_groups
                   for p in g["params"] if p.grad is not None}
        for p, _ in pending.values():
            p.grad = None
        try:
            for o in fresh:  # made here so that a failure is undone and named (zoo review Z1)
                _made_state(o)
            msd, osd = get_state_dict(self.model, self._given(), options=self.options)
        finally:
            for p, grad in pending.values():
                p.grad = grad
        if fresh:
            # Only the entries of optimizers that had not stepped (all of them, usually).
            only = None if len(fresh) == len(self.optimizers) else _names_of(self.model, fresh)
            for o in fresh:
                o.state.clear()  # the state made above is no longer the optimizer's
            states: Any = osd.get("state", {})
            for name, per_param in states.items() if isinstance(states, dict) else ():
                if not isinstance(per_param, dict) or (only is not None and name not in only):
                    continue
                step = per_param.get("step")
                if isinstance(step, torch.Tensor):
                    step.zero_()
                elif isinstance(step, int | float) and not isinstance(step, bool):
                    per_param["step"] = type(step)(0)

        return {"model": msd, "optim": osd}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Apply loaded dicts with ``set_state_dict``.

        A parameter whose loaded state never stepped (``step`` 0: the version was saved before
        its first step, or had no state of it and the template's was kept) gets no state: its
        optimizer makes it at its first step, as in a job that never saved. The state the
        template made by a step at learning rate 0 is not that for every optimizer: SGD's
        dampening, NAdam's and ASGD's running products differ, and Rprop's step sizes were
        set from the learning rate 0, so its parameters all but stopped (odd-states review
        O1). Only optimizers that had no state when the template was made (they make their
        state lazily) are changed. An optimizer that counts no steps (SGD) keeps the made-up
        state (a zero momentum buffer): with ``dampening`` > 0 it weights that parameter's first
        gradient by ``1 - dampening``.
        """
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        if self.optimizer is None:
            set_model_state_dict(self.model, state["model"], options=self.options)
            return
        set_state_dict(
            self.model,
            self._given(),
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=self.options,
        )
        for o in self.optimizers:
            if id(o) in self._fresh:
                for p in [p for p, st in o.state.items() if _never_stepped(st)]:
                    del o.state[p]


    def _given(self) -> Any:
        """The optimizer as ``get_state_dict`` takes it: one, or a tuple of several."""
        return self.optimizers[0] if len(self.optimizers) == 1 else tuple(self.optimizers)


def _made_state(optimizer: torch.optim.Optimizer) -> None:
    """A fresh optimizer's state as ``get_state_dict`` makes it, or an actionable refusal."""
    try:
        init_optimizer_state(optimizer)
    except Exception as e:
        raise UnsupportedValueError(
            f"ModelOptimizerState: torch's get_state_dict cannot make the state of "
            f"{type(optimizer).__name__} (its step with zero gradients at learning rate 0 "
            f"failed: {type(e).__name__}: {e}); the optimizer was left as it was. Put the "
            f"optimizer in the state by itself beside the model, e.g. "
            f'{{"train": ModelOptimizerState(model), "optim": optimizer}}'
        ) from e


def _never_stepped(per_param: Any) -> bool:
    """Whether a parameter's optimizer state says it took no step (``step`` 0)."""
    step = per_param.get("step") if isinstance(per_param, Mapping) else None
    if isinstance(step, torch.Tensor):
        return step.numel() == 1 and float(step) == 0.0
    return isinstance(step, int | float) and not isinstance(step, bool) and step == 0


def _listed(optimizers: Any) -> list[Any]:
    """Several optimizers, each checked (``UsageError`` for anything else)."""
    try:
        out = list(optimizers)
    except TypeError:
        out = [optimizers]
    bad = [o for o in out if not isinstance(o, torch.optim.Optimizer)]
    if not out or bad:
        raise UsageError(
            "ModelOptimizerState: optimizer must be a torch.optim.Optimizer or a list of them "
            f"(over disjoint parameters of the model), got {type(bad[0] if bad else optimizers).__name__}"
        )
    return out


def _names_of(model: torch.nn.Module, optimizers: list[Any]) -> set[str]:
    """The parameter names of ``model`` that ``optimizers`` update."""
    mine = {id(p) for o in optimizers for g in o.param_groups for p in g["params"]}
    return {name for name, p in model.named_parameters() if id(p) in mine}


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
