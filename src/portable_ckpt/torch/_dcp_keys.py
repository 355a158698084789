"""How DCP's names and non-tensor items map onto portable keys and JSON values.

DCP flattens a nested state dict into *dotted FQNs*: the path of dict keys (``str(k)``) and list
positions from the top, joined with ``.`` (``{"model": {"fc.weight": w}}`` → ``model.fc.weight``).
The dots inside module names make that rule lossy, so the portable key of a DCP item is built from
the item's *path* (DCP's planner records it per FQN), with the key rule of
:mod:`portable_ckpt.torch.flatten`: components joined with ``/`` (``~`` → ``~0``, ``/`` → ``~1``),
list positions and int keys in decimal (``model/fc.weight``). The other way, a portable key
shows to DCP as its components joined with ``.`` — DCP's own rule applied to the same path.

DCP's non-tensor items (its planner would ``torch.save`` them) are JSON here, split to the same
leaves ``portable_ckpt.torch.save`` produces for the same state: every scalar under its own key
in the global ``pck:json/1`` entry ``torch.values`` (``optim/param_groups/0/betas/1``); an empty
list or dict is stored as itself. Anything JSON cannot hold is refused (PCK-UNSUPPORTED-VALUE).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from portable_ckpt.errors import UnsupportedValueError
from portable_ckpt.torch.flatten import decode_json, encode_json, escape_component, split_key

__all__ = ["JsonTree", "byte_item_fqns", "dcp_fqn", "json_leaves", "portable_key"]


def portable_key(path: Sequence[str | int]) -> str:
    """The portable key of a DCP object path (``("model", "fc.weight")`` → ``model/fc.weight``)."""
    return "/".join(escape_component(str(p)) for p in path)


def dcp_fqn(key: str) -> str:
    """DCP's dotted FQN of a portable key (``optim/state/fc.weight/exp_avg`` → ``optim.state.fc.weight.exp_avg``)."""
    return ".".join(split_key(key))


def byte_item_fqns(key: str) -> Iterator[tuple[str, str]]:
    """``(fqn, key)`` of every DCP item a stored JSON leaf can belong to.

    DCP keeps a list or tuple of plain values as one item, so a leaf ``a/betas/1`` may be the
    item ``a.betas.1`` itself or part of the item ``a.betas``: each trailing run of decimal
    components can be the positions inside one item.
    """
    parts = key.split("/")
    yield dcp_fqn(key), key
    while len(parts) > 1 and parts[-1].isdecimal():
        parts.pop()
        prefix = "/".join(parts)
        yield dcp_fqn(prefix), prefix


def _unsupported(fqn: str, key: str, value: Any, why: str) -> UnsupportedValueError:
    return UnsupportedValueError(
        f"DCP item {fqn!r} (key {key!r}): {why} ({type(value).__name__}) cannot be stored without "
        f"pickle; non-tensor items are stored as JSON (None, bool, int, float, str, and lists, "
        f"tuples and dicts of them). Convert it (bytes to a base64 str or a uint8 tensor, an "
        f"object to its state_dict(); DCP calls state_dict() only on top-level values)"
    )


def json_leaves(key: str, value: Any, *, fqn: str) -> dict[str, Any]:
    """Split a non-tensor value into ``{portable key: JSON scalar}`` (empty containers as is).

    Raises:
        UnsupportedValueError: a value JSON cannot hold (naming the DCP item and the key).

    """
    out: dict[str, Any] = {}
    _leaves(key, value, out, fqn, 0)
    return out


def _leaves(key: str, value: Any, out: dict[str, Any], fqn: str, depth: int) -> None:
    if depth > 64:
        raise _unsupported(fqn, key, value, "a value nested more than 64 levels deep")
    if isinstance(value, torch.Tensor):
        raise _unsupported(fqn, key, value, "a tensor inside a tuple or a plain list")
    if isinstance(value, Mapping):
        if not value:
            out[key] = {}
        seen: set[str] = set()
        for k, v in value.items():
            if isinstance(k, bool) or not isinstance(k, str | int):
                raise _unsupported(fqn, key, k, f"the dict key {k!r}")
            comp = escape_component(str(k))
            if comp in seen:
                raise _unsupported(fqn, key, value, f"a dict whose keys collide on {str(k)!r}")
            seen.add(comp)
            _leaves(f"{key}/{comp}", v, out, fqn, depth + 1)
        return
    if isinstance(value, list | tuple):
        if not value:
            out[key] = []
        for i, v in enumerate(value):
            _leaves(f"{key}/{i}", v, out, fqn, depth + 1)
        return
    try:
        out[key] = encode_json(value, key=key)
    except UnsupportedValueError:
        raise _unsupported(fqn, key, value, "the value") from None


class JsonTree:
    """Stored JSON leaves, rebuilt into the values DCP items stand for.

    ``value(key, template)`` gives the value below ``key``: the stored leaf itself, or the
    container of the leaves below it, shaped like ``template`` (the load target's current
    value: a tuple stays a tuple, int dict keys stay ints); without a template, children
    ``0..n-1`` make a list and any other children a dict.
    """

    def __init__(self, leaves: Mapping[str, Any]) -> None:
        self._leaves = dict(leaves)
        self._children: dict[str, list[str]] = {}
        seen: set[str] = set()
        for k in self._leaves:
            parts = k.split("/")
            for i in range(1, len(parts)):
                parent, child = "/".join(parts[:i]), "/".join(parts[: i + 1])
                if child not in seen:
                    seen.add(child)
                    self._children.setdefault(parent, []).append(parts[i])

    def __contains__(self, key: str) -> bool:
        return key in self._leaves or key in self._children

    def value(self, key: str, template: Any = None) -> Any:
        """The value stored below ``key``, shaped like ``template``."""
        if key in self._leaves:
            return _like(decode_json(self._leaves[key]), template)
        comps = self._children.get(key, [])
        if isinstance(template, list | tuple) or (
            template is None and comps == [str(i) for i in range(len(comps))]
        ):
            items = [
                self.value(f"{key}/{i}", template[i] if template and i < len(template) else None)
                for i in range(len(comps))
            ]
            return tuple(items) if isinstance(template, tuple) else items
        by_comp = (
            {escape_component(str(k)): k for k in template} if isinstance(template, Mapping) else {}
        )
        return {
            by_comp.get(c, split_key(c)[0]): self.value(
                f"{key}/{c}", template.get(by_comp[c]) if c in by_comp else None
            )
            for c in comps
        }


def _like(value: Any, template: Any) -> Any:
    """A stored scalar in the target's type where JSON lost it (an int where a float was)."""
    if isinstance(template, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(template, tuple) and isinstance(value, list):
        return tuple(value)
    return value
