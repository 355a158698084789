"""Optimizer hyper-parameters that a load finds changed: compared, said, and which values win.

torch's ``Optimizer.load_state_dict`` (and DCP's ``set_state_dict``) replaces every member of
each param group by the stored one: a job restarted with a new ``weight_decay`` (or ``lr``,
``betas``, ``eps``) in its config trained on with the old one, and nobody was told (manager
review L3). A load compares the members of the target's param groups (every one but
``params``: ``param_names`` too) as they were before it with the stored ones; rank 0 says the
differences once (a WARNING of event ``load.optimizer_hyperparameters``, the same lines on
stderr); every rank lists its own in ``LoadInfo.changed_hyperparameters``; and the stored values
win (``"checkpoint"``, as torch and DCP do) or the current ones (``"current"``). Values compare
as numbers (``0`` is ``0.0``, but ``True`` is not ``1``), and NaN equals NaN.

The members an LR scheduler in the state sets are its own: ``lr`` and ``initial_lr``, and
``momentum`` and ``betas`` where it cycles momentum (``cycle_momentum`` set: ``OneCycleLR`` and
``CyclicLR`` by default). A fresh scheduler sets them at construction, so they differ from the
stored ones at every restart, and the restored scheduler goes on from the stored ones. They are
restored whatever the choice, and never reported.

A member held as a tensor (a tensor ``lr`` of a ``capturable`` or ``fused`` optimizer, or
``betas`` of tensors) is compared by value like any other (in the target's dtype), and reported
as a number (a list for a tuple or a tensor of more than one value). The stored value is read
into the target's own tensor, in place, as any tensor; ``"current"`` copies the value from
before the load back into that tensor (the same object, on its device). A tensor member of more
than ``_SMALL`` elements, or a DTensor, is loaded and not compared (no optimizer of torch's has
one).

The members that choose an implementation, not the maths (``foreach``, ``fused``,
``capturable`` and ``differentiable``: those of torch's optimizers; ``maximize`` is maths) are
never reported, and keep the optimizer's current values whatever the choice: its state was made
by the current optimizer and is loaded into it (a ``capturable`` or ``fused`` one holds ``step``
on the device), and its config chose the kernels for this machine. torch's ``load_state_dict``
would apply the stored ones (``capturable=True`` saved on a GPU fails the first step on a CPU).
"""

from __future__ import annotations

import copy
import logging
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal, get_args

import torch

from portable_ckpt._printable import one_line, printable, spans
from portable_ckpt.format.keys import unflatten_keys
from portable_ckpt.torch.flatten import FlatState
from portable_ckpt.torch.info import LoadInfo

__all__ = [
    "GROUP_MEMBER",
    "OPTIMIZER_HYPERPARAMETERS",
    "Hyperparameters",
    "OptimizerHyperparameters",
]

#: Which values a load keeps where the stored hyper-parameters differ from the current ones.
OptimizerHyperparameters = Literal["checkpoint", "current"]
OPTIMIZER_HYPERPARAMETERS: Final[tuple[OptimizerHyperparameters, ...]] = get_args(
    OptimizerHyperparameters
)

#: A member of an optimizer's param group: ``<optimizer>/param_groups/<index>/<member>``.
GROUP_MEMBER: Final = re.compile(r"^(?:(.*)/)?param_groups/(\d+)/([^/]+)")

#: Members an LR scheduler sets (at construction, and at each step).
_SCHEDULED: Final = frozenset({"lr", "initial_lr"})
#: Members a scheduler that cycles momentum (``cycle_momentum=True``) sets besides.
_CYCLED: Final = frozenset({"momentum", "betas"})
#: Members that choose an implementation (the kernels), not the maths: never reported, and
#: the current values kept whatever the choice.
_IMPLEMENTATION: Final = frozenset({"foreach", "fused", "capturable", "differentiable"})
#: Tensor members of at most this many elements are compared (torch's are 0-d).
_SMALL: Final = 64
#: Member lines a message shows (the rest are counted, and all are in LoadInfo).
_SHOWN: Final = 8


def _member(key: str) -> tuple[str, str, int, str] | None:
    """``(member's key, optimizer path, group index, member)`` of a key at or below a member."""
    # The literal first: the pattern's leading ``(.*)/`` backtracks over every key of a state.
    m = GROUP_MEMBER.match(key) if "param_groups/" in key else None
    if m is None or m.group(3) == "params":
        return None
    return key[: m.end()], m.group(1) or "", int(m.group(2)), m.group(3)


def _same(a: Any, b: Any) -> bool:
    """Equal as hyper-parameters: ``0`` is ``0.0`` and NaN is NaN, but ``True`` is not ``1``."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b) and isinstance(a, bool) == isinstance(b, bool)


def _plain(value: Any) -> Any:
    """``value`` as JSON would hold it (tuples as lists, a tensor as its numbers)."""
    if isinstance(value, torch.Tensor):
        return _numbers(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _numbers(t: torch.Tensor) -> Any:
    """A small tensor's values as Python numbers (nested lists but for a 0-d one).

    A float32 (or half) value becomes the shortest decimal that reads back as it (``0.9``, not
    ``0.8999999761581421``): one number per value, so comparing them compares the tensors.
    """
    t = t.detach().cpu()
    if not t.is_floating_point() or t.dtype == torch.float64:
        return t.tolist()
    values = [float(str(x)) for x in t.float().numpy().reshape(-1)]
    return values[0] if t.dim() == 0 else _shaped(values, list(t.shape))


def _shaped(values: list[Any], shape: list[int]) -> Any:
    """``values`` nested as ``shape`` (row-major)."""
    if len(shape) <= 1:
        return values
    size = len(values) // shape[0] if shape[0] else 0
    return [_shaped(values[i * size:(i + 1) * size], shape[1:]) for i in range(shape[0])]


def _comparable(t: torch.Tensor) -> bool:
    """A plain tensor small enough to keep a copy of and compare."""
    return (isinstance(t, torch.Tensor) and not hasattr(t, "device_mesh") and not t.is_meta
            and t.numel() <= _SMALL)


def _assemble(parts: Mapping[str, Any]) -> Any:
    """A member's value from its parts, by their keys below it (``""``: the member itself)."""
    if "" in parts:
        return parts[""]
    return _lists(unflatten_keys(parts))


def _lists(node: Any) -> Any:
    """Dicts keyed ``0`` to ``n-1`` (a tuple's or a list's positions) as lists."""
    if not isinstance(node, dict):
        return node
    kids = {k: _lists(v) for k, v in node.items()}
    if kids and set(kids) == {str(i) for i in range(len(kids))}:
        return [kids[str(i)] for i in range(len(kids))]
    return kids


class Hyperparameters:
    """One load's (or one restore's, over its candidates) choice and the values before it.

    Args:
        choice: ``"checkpoint"`` (the stored values win) or ``"current"``.

    """

    def __init__(self, choice: OptimizerHyperparameters = "checkpoint") -> None:
        self.choice: OptimizerHyperparameters = choice
        #: Key of a member (or of a leaf below one) → the target's value before the first load
        #: (a tensor's: a copy, on its device).
        self.before: dict[str, Any] = {}

    def remember(self, flat: FlatState) -> None:
        """Keep the target's members as they are now, unless an earlier load kept them.

        A restore's candidate that failed part way (damage on another rank) has loaded its
        stored values into the optimizers of some ranks: the next candidate compares with, and
        keeps, the values from before the first.
        """
        for key, value in (*flat.values.items(), *flat.lists.items()):
            if key not in self.before and _member(key) is not None:
                self.before[key] = copy.deepcopy(value)
        for key, t in flat.tensors.items():
            if key not in self.before and _member(key) is not None and _comparable(t):
                with torch.no_grad():
                    self.before[key] = t.detach().clone()

    def settle(self, flat: FlatState, loaded: dict[str, Any], info: LoadInfo) -> None:
        """Compare the stored values about to be applied with the values before.

        ``loaded`` holds the stored plain values; the stored tensors were read into the
        target's (``flat.tensors``). Lists the differences in ``info.changed_hyperparameters``;
        with ``"current"`` (and for an implementation flag whatever the choice), puts the
        values before in ``loaded``'s place and copies those of tensors back into them. A
        member stored but not in the target, or in the target but not stored (in part: one
        of a tuple's tensors), is not compared (``LoadInfo.unexpected_keys`` and
        ``missing_keys`` name them).
        """
        scheduled = _Scheduled(flat)
        missing = set(info.missing_keys)
        members: dict[str, tuple[str, int, str, list[str]]] = {}
        for key in (*flat.values, *flat.lists, *flat.tensors):
            where = _member(key)
            if where is not None and not _below_list(key, where[0], flat.lists):
                path, head, index, name = where
                members.setdefault(path, (head, index, name, []))[3].append(key)
        rows: list[dict[str, Any]] = []
        for path, (head, index, name, keys) in members.items():
            if name in scheduled.members(head):
                continue
            parts = self._parts(path, keys, flat, loaded, missing)
            if parts is None:
                continue
            stored = _assemble({rel: _plain(s) for rel, (s, _) in parts.items()})
            current = _assemble({rel: _plain(c) for rel, (_, c) in parts.items()})
            if _same(stored, current):
                continue
            implementation = name in _IMPLEMENTATION
            if not implementation:
                rows.append({"optimizer": head, "group": index, "key": name, "stored": stored,
                             "current": current, "applied": self.choice})
            if implementation or self.choice == "current":
                for key in keys:
                    before = self.before[key]
                    if key in flat.tensors:
                        with torch.no_grad():
                            flat.tensors[key].copy_(before)  # the target's own tensor
                    else:
                        loaded[key] = copy.deepcopy(before)
        # in the target's order: by optimizer, then group (a tensor member came last)
        heads = {h: i for i, h in enumerate(dict.fromkeys(r["optimizer"] for r in rows))}
        rows.sort(key=lambda r: (heads[r["optimizer"]], r["group"]))
        info.changed_hyperparameters = rows

    def _parts(
        self, path: str, keys: list[str], flat: FlatState, loaded: Mapping[str, Any],
        missing: set[str],
    ) -> dict[str, tuple[Any, Any]] | None:
        """``{key below the member: (stored, before)}``, or None where a part is not loaded."""
        parts: dict[str, tuple[Any, Any]] = {}
        for key in keys:
            if key not in self.before:
                return None  # a large tensor, a DTensor, or a part new since the first load
            if key in flat.tensors:
                if key in missing:
                    return None
                stored: Any = flat.tensors[key]
            elif key in loaded:
                stored = loaded[key]
            else:
                return None
            parts[key[len(path) + 1:]] = (stored, self.before[key])
        return parts

    def say(self, info: LoadInfo, log: logging.Logger) -> None:
        """Rank 0: the changed hyper-parameters, once per load (the logger and stderr)."""
        rows = info.changed_hyperparameters
        if info.rank != 0 or not rows:
            return
        from portable_ckpt.logs import log_event
        from portable_ckpt.torch._inflight import say

        kept = self.choice == "checkpoint"
        lines = [
            f"rank 0: loaded step {info.step} ({info.path}): {len(rows)} optimizer "
            "hyper-parameter(s) stored in the version differ from the optimizer's current ones "
            "(a changed config?); "
            + ("the stored ones were applied, as torch's load_state_dict does"
               if kept else "the current ones were kept (optimizer_hyperparameters='current')")
            + ":"
        ]
        merged = _merged(rows)
        lines += [f"  {line}" for line in merged[:_SHOWN]]
        if len(merged) > _SHOWN:
            lines.append(f"  and {len(merged) - _SHOWN} more (LoadInfo.changed_hyperparameters)")
        lines.append(
            "  To train on the current values, pass optimizer_hyperparameters='current' to "
            "CheckpointManager.restore() (or load()); to keep the stored ones, set them in the "
            "config, so that this is not said at every restart"
            if kept else
            "  The next save stores the current values; optimizer_hyperparameters='checkpoint' "
            "(the default) restores the stored ones"
        )
        text = "\n".join(printable(line) for line in lines)
        log_event(
            log, "load.optimizer_hyperparameters",
            {"step": info.step, "version": info.path, "applied": self.choice, "changed": rows},
            "%s", text, rank=info.rank, level=logging.WARNING if kept else logging.INFO,
        )
        for line in lines:
            say(line)


def _merged(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per optimizer, member and change, naming every group it holds for."""
    groups: dict[tuple[str, str, str, str], list[int]] = {}
    for r in rows:
        stored, current = one_line(repr(r["stored"]), 120), one_line(repr(r["current"]), 120)
        groups.setdefault((r["optimizer"], r["key"], stored, current), []).append(r["group"])
    out = []
    for (head, name, stored, current), indexes in groups.items():
        which = f"group {indexes[0]}" if len(indexes) == 1 else f"groups {', '.join(spans(indexes))}"
        out.append(f"optimizer {head or '(top)'!r} {which} {name}: stored {stored}, "
                   f"current {current}")
    return out


class _Scheduled:
    """The members the LR schedulers of a state set, by optimizer path.

    An optimizer path whose owner in the state is an optimizer, or a Stateful holding
    ``optimizers`` (``ModelOptimizerState``), gets the members of the schedulers that drive one
    of them; any other (a plain optimizer state dict) those of every scheduler in the state.
    """

    def __init__(self, flat: FlatState) -> None:
        from portable_ckpt.torch.state import LRSchedulerState

        self.flat = flat
        self.by_optimizer: dict[int, set[str]] = {}
        for entry in flat.entries.values():
            if isinstance(entry, LRSchedulerState):
                for sched in _with_nested(entry.scheduler):
                    members = set(_SCHEDULED)
                    if getattr(sched, "cycle_momentum", False):
                        members |= _CYCLED
                    opt = getattr(sched, "optimizer", None)
                    self.by_optimizer.setdefault(id(opt), set()).update(members)
        self.every = frozenset(m for ms in self.by_optimizer.values() for m in ms)
        self._cache: dict[str, frozenset[str]] = {}

    def members(self, head: str) -> frozenset[str]:
        if not self.by_optimizer:
            return frozenset()
        if head not in self._cache:
            owner = max((k for k in self.flat.objects
                         if head == k or head.startswith(f"{k}/")), key=len, default=None)
            obj = None if owner is None else self.flat.objects[owner][0]
            optims = ([obj] if isinstance(obj, torch.optim.Optimizer)
                      else list(getattr(obj, "optimizers", None) or ()))
            self._cache[head] = (
                frozenset(m for o in optims for m in self.by_optimizer.get(id(o), ()))
                if optims else self.every
            )
        return self._cache[head]


def _with_nested(sched: Any) -> list[Any]:
    """A scheduler and those it chains (``SequentialLR``, ``ChainedScheduler``)."""
    inner = getattr(sched, "_schedulers", None)
    out = [sched]
    for s in inner if isinstance(inner, list | tuple) else ():
        out += _with_nested(s)
    return out


def _below_list(key: str, path: str, lists: Mapping[str, Any]) -> bool:
    """Whether ``key`` lies below a list loaded whole at or below the member ``path``."""
    cut = len(path)
    while cut != -1 and cut < len(key):
        if key[:cut] in lists:
            return True
        cut = key.find("/", cut + 1)
    return False
