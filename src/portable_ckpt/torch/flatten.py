"""Flattening a nested state dict into logical tensor keys and schema'd non-tensor values.

Key rule (stable and collision-free; defined in :mod:`portable_ckpt.format.keys`, re-exported here):

* A leaf's key is the path of container keys from the top of the state dict to the leaf, joined
  with ``/``.
* Dict keys are strings (used as is) or ints (written in decimal); list and tuple positions are
  written in decimal. Inside a component, ``~`` is written ``~0`` and ``/`` is written ``~1``
  (the JSON-Pointer escapes), so splitting a key on ``/`` gives back the components, and two
  different leaves of one state dict never share a key. A dict holding both ``1`` and ``"1"`` is
  refused.
* An object with ``state_dict()``/``load_state_dict()`` contributes the keys of its
  ``state_dict()`` below its own path.

Example: ``{"model": {"fc.weight": w}, "optim": {"state": {"fc.weight": {"exp_avg": m}}}}``
gives ``model/fc.weight`` and ``optim/state/fc.weight/exp_avg``.

Leaves: tensors (plain or DTensor) become tensor keys; JSON scalars (``None``, ``bool``, ``int``,
``float``, ``str``) are collected into one global ``pck:json/1`` entry (``torch.values``) keyed by
their flat key; :class:`StateEntry` objects (RNG, data position, LR scheduler, gradient scaler)
become one entry each, named by their flat key, with their built-in schema. Nothing is pickled:
any other value is refused with PCK-UNSUPPORTED-VALUE.
"""

from __future__ import annotations

import abc
import enum
import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from portable_ckpt.errors import UnsupportedValueError
from portable_ckpt.format.keys import (
    VALUES_ENTRY,
    DcpPath,
    decode_json,
    encode_json,
    escape_component,
    float_if_exact,
    has_position,
    has_surrogates,
    is_key,
    join_key,
    scalar_fix,
    split_key,
    unflatten_keys,
)

__all__ = [
    "MAX_DEPTH",
    "VALUES_ENTRY",
    "FlatState",
    "StateEntry",
    "decode_json",
    "encode_json",
    "escape_component",
    "flatten_state",
    "join_key",
    "split_key",
    "unflatten_keys",
]


class StateEntry(abc.ABC):
    """Base class of leaves stored as one non-tensor entry each (RNG, scheduler, ...).

    Subclasses set ``schema`` (a built-in id), ``scope`` (``"global"`` or ``"per_rank"``) and,
    for per-rank entries, ``world_size_policy``; and implement :meth:`capture` and
    :meth:`restore`. ``restore_last`` entries (RNG) are restored after everything else so a
    load has no RNG side effect.

    A ``global`` entry is stored once, as rank 0 captured it; every rank captures it at each
    save and a value that differs between ranks makes an ``exact`` contract ``statistical``
    (said on stderr), as for plain values. State that is each rank's own belongs in a
    ``per_rank`` entry. ``compare_ranks = False`` leaves out of that check an entry that is
    no training state (the manager's bookkeeping, whose metrics may be a rank's own).
    """

    schema: str = "pck:json/1"
    scope: str = "global"
    world_size_policy: str | None = None
    restore_last: bool = False
    compare_ranks: bool = True

    @abc.abstractmethod
    def capture(self) -> Any:
        """Return this rank's JSON value now.

        Dict keys are strings, or ints, stored as their decimal strings (the key rule:
        :meth:`restore` gets ``"1"`` for ``1``); a key of another kind (a float, a bool,
        ``None``) is refused at the save, as the core API's entries refuse every key that
        is no string.
        """

    @abc.abstractmethod
    def restore(self, value: Any) -> None:
        """Apply a stored JSON value (not called when a ``drop`` policy left no value)."""


@dataclass
class FlatState:
    """A state dict taken apart.

    Attributes:
        tensors: Flat key → tensor (plain or DTensor), in traversal order.
        values: Flat key → JSON scalar leaf.
        entries: Flat key → :class:`StateEntry`.
        objects: Flat key (of the object) → ``(object, its state_dict() template)``.
        dcp_paths: Flat key → DCP object path of each item DCP's default planner would make
            of the state that is not a single value at a path of dict keys: a list of plain
            values (one item) and any item below a list position (saved as ``torch.dcp_items``,
            so ``dcp.load`` sees the items ``dcp.save`` would have made).
        lists: Flat key → each list or tuple of plain values that DCP keeps as one item. A load
            replaces it whole with the stored one, as ``dcp.load`` does, whatever its length
            in the target (a history that grew since the target was made).
        params: Keys of plain tensors that are parameters of a module in the state (an
            ``nn.Module``, or the ``model`` of a Stateful such as ``ModelOptimizerState``),
            found by their storage (saves only).

    """

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    entries: dict[str, StateEntry] = field(default_factory=dict)
    objects: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    dcp_paths: dict[str, DcpPath] = field(default_factory=dict)
    lists: dict[str, Any] = field(default_factory=dict)
    params: set[str] = field(default_factory=set)


def _is_stateful(node: Any) -> bool:
    return callable(getattr(node, "state_dict", None)) and callable(
        getattr(node, "load_state_dict", None)
    )


def _wrap_known(node: Any) -> StateEntry | None:
    """Auto-wrap LR schedulers and gradient scalers into their built-in-schema entries."""
    from portable_ckpt.torch.state import (
        GradScalerState,
        LRSchedulerState,
        is_grad_scaler,
        is_lr_scheduler,
    )

    if is_lr_scheduler(node):
        return LRSchedulerState(node)
    if is_grad_scaler(node):
        return GradScalerState(node)
    return None


def _child_components(node: Any, key: str) -> list[tuple[Any, str]]:
    """``(child key in the container, escaped component)`` for a dict, list or tuple."""
    if isinstance(node, Mapping):
        seen: dict[str, Any] = {}
        out = []
        for k in node:
            if type(k) is not str and (isinstance(k, bool) or not isinstance(k, str | int)):
                raise UnsupportedValueError(
                    f"state at {key or '<top>'!r}: dict key {k!r} of type {type(k).__name__} is "
                    f"not a str or int"
                )
            comp = escape_component(str(k))
            if comp in seen:
                raise UnsupportedValueError(
                    f"state at {key or '<top>'!r}: keys {seen[comp]!r} and {k!r} map to the same "
                    f"component {comp!r}; rename one"
                )
            seen[comp] = k
            out.append((k, comp))
        return out
    return [(i, str(i)) for i in range(len(node))]


def _sub(key: str, comp: str) -> str:
    return f"{key}/{comp}" if key else comp


def flatten_state(state: Any, *, for_load: bool = False) -> FlatState:
    """Take a state dict apart according to the key rule (see the module docstring).

    Args:
        state: The (nested) state dict.
        for_load: The state is a load target: a plain ``torch.optim.Optimizer`` whose state is
            still empty gets it initialised first (zero-gradient step with ``lr=0``, as
            ``torch.distributed.checkpoint.state_dict`` does) so the template has its tensors.

    Raises:
        UnsupportedValueError: a value that cannot be stored, a key collision, or a bad key.

    """
    if not isinstance(state, Mapping):
        raise UnsupportedValueError(f"the state must be a dict, got {type(state).__name__}")
    flat = FlatState()
    _flatten(state, "", flat, for_load, (), False)
    return flat


#: Keys ``_check_key`` found good: a state's keys are the same at every save (half a
#: millisecond per save of a 400-tensor state). Emptied past this many characters in all.
_GOOD_KEYS: set[str] = set()
_GOOD_KEYS_CHARS = 1 << 22
_good_chars = 0


def _check_key(key: str) -> None:
    global _good_chars
    if key in _GOOD_KEYS:
        return
    _refuse_bad_key(key)
    if _good_chars + len(key) > _GOOD_KEYS_CHARS:
        _GOOD_KEYS.clear()
        _good_chars = 0
    _GOOD_KEYS.add(key)
    _good_chars += len(key)


def _refuse_bad_key(key: str) -> None:
    if not is_key(key):
        raise UnsupportedValueError(
            f"flat key {key!r} must be 1–1024 characters without control characters; shorten or "
            f"rename the dict keys on its path"
        )
    if has_surrogates(key):  # named here: the writer's JSON error named no key (odd states O8)
        raise UnsupportedValueError(
            f"flat key {key!r} holds a lone surrogate (U+D800–U+DFFF), which UTF-8 and so the "
            "checkpoint cannot hold; rename the dict key on its path"
        )


def _init_optimizer(node: Any) -> None:
    """Give a fresh plain optimizer its state before it serves as a load template.

    An optimizer whose state cannot be made so (LBFGS needs a closure, SparseAdam refuses
    dense gradients) keeps its empty state, which then grows like any empty dict of the target:
    its stored state comes back keyed by int, whole, as a fresh ``load_state_dict`` takes it.
    """
    if isinstance(node, torch.optim.Optimizer) and not node.state:
        try:
            init_optimizer_state(node)
        except Exception:  # any optimizer's own error: the state grows instead
            pass


def init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """``torch.distributed.checkpoint``'s ``_init_optim_state``, undone where it fails.

    It makes the state with a step of zero gradients at learning rate 0, and a step that
    raises (LBFGS without a closure, SparseAdam's dense gradients) left every group's ``lr`` at
    0 and zero gradients on the parameters: a job that went on after the failed save or load
    trained at learning rate 0, silently (zoo review Z1). On failure the learning rates, the
    gradients and the (empty) state are put back before the error is raised.
    """
    from torch.distributed.checkpoint.state_dict import _init_optim_state

    lrs = [(g, g["lr"]) for g in optimizer.param_groups if "lr" in g]
    grads = [(p, p.grad) for g in optimizer.param_groups for p in g["params"]]
    try:
        _init_optim_state(optimizer)
    except BaseException:
        for group, lr in lrs:
            group["lr"] = lr
        for p, grad in grads:
            p.grad = grad
        optimizer.state.clear()  # it was empty: a part made before the failure goes
        raise


#: Deepest nesting of dicts, lists and tuples a state may have: far beyond any real state, and
#: within Python's recursion limit (a deeper one failed with a bare RecursionError).
MAX_DEPTH = 256

#: Exact types that are plain containers or JSON scalars, never a scheduler, scaler or Stateful
#: object: they skip those checks (a training state has hundreds of them).
_PLAIN_CONTAINERS = (dict, list, tuple)
_PLAIN_SCALARS = (type(None), bool, int, float, str)


def _scalar(v: Any) -> bool:
    return type(v) in _PLAIN_SCALARS or (
        not isinstance(v, torch.Tensor)
        and hasattr(v, "item")
        and hasattr(v, "dtype")
        and getattr(v, "ndim", 1) == 0
    )


def _json_like(v: Any, depth: int = 0) -> bool:
    """Only dicts, lists, tuples and JSON scalars below ``v`` (no tensor, no object)."""
    if depth > 64:
        return False
    if type(v) in (dict, list, tuple):
        kids = v.values() if type(v) is dict else v
        return all(_json_like(x, depth + 1) for x in kids)
    return _scalar(v)


def _plain_list(node: Any, depth: int = 0) -> bool:
    """Whether DCP keeps the list as one item.

    No dict lies below it through lists, and no tensor or object is in it (a tuple in it is one
    value to DCP, so it may hold dicts). Past MAX_DEPTH it is not (the walk then says why).
    """
    return depth < MAX_DEPTH and all(
        _scalar(v)
        or (type(v) is list and _plain_list(v, depth + 1))
        or (type(v) is tuple and _json_like(v))
        for v in node
    )


def _flatten(
    node: Any, key: str, flat: FlatState, for_load: bool, path: DcpPath, in_item: bool
) -> None:
    # ``path`` is DCP's object path (list positions as ints); ``in_item``: below a list that
    # DCP keeps as one item. Only items DCP could not name from the key alone are recorded.
    if isinstance(node, torch.Tensor):
        _check_key(key)
        flat.tensors[key] = node
        if has_position(path):
            flat.dcp_paths[key] = path
        return
    if type(node) in _PLAIN_CONTAINERS:
        _walk(node, key, flat, for_load, path, in_item)
        return
    if type(node) in _PLAIN_SCALARS:
        _value(node, key, flat, path, in_item)
        return
    if isinstance(node, StateEntry):
        _check_key(key)
        flat.entries[key] = node
        return
    known = _wrap_known(node)
    if known is not None:
        _check_key(key)
        flat.entries[key] = known
        return
    if _is_stateful(node) and not isinstance(node, Mapping):
        if for_load:
            _init_optimizer(node)
        template = node.state_dict()
        flat.objects[key] = (node, template)
        first = len(flat.tensors)
        _flatten(template, key, flat, for_load, path, in_item)
        if not for_load:
            _mark_parameters(node, flat, first)
        return
    if isinstance(node, Mapping | list | tuple):
        _walk(node, key, flat, for_load, path, in_item)
        return
    if node is None or isinstance(node, bool | int | float | str):
        _value(node, key, flat, path, in_item)
        return
    if hasattr(node, "item") and hasattr(node, "dtype") and getattr(node, "ndim", 1) == 0:
        item = node.item()
        if not (item is None or isinstance(item, bool | int | float | str)):
            # np.longdouble's item() is itself: it recursed without end (odd-states O7)
            raise UnsupportedValueError(
                f"state at {key!r}: a {type(node).__name__} scalar has no JSON form; "
                f"{scalar_fix(node)}"
            )
        _value(item, key, flat, path, in_item)
        return
    raise UnsupportedValueError(
        f"state at {key or '<top>'!r}: value of type {type(node).__name__} cannot be stored "
        f"without pickle; store tensors, JSON scalars, dicts/lists of them, or objects with "
        f"state_dict()/load_state_dict()"
    )


def _walk(
    node: Any, key: str, flat: FlatState, for_load: bool, path: DcpPath, in_item: bool
) -> None:
    """A dict, list or tuple: its children, under DCP's path components (list positions: ints).

    An empty list or tuple is a value of its own (``[]``), as DCP keeps it: an item, or a place
    in one; so is an empty dict inside an item. Any other empty dict is nothing to save, as in
    DCP; in a load target it is a place for what is stored below it (a Stateful's dict that
    grows during training came back empty: fidelity review F7).
    """
    if len(path) >= MAX_DEPTH:  # a container that holds itself, or a runaway nesting
        raise UnsupportedValueError(
            f"state at {key[:120]!r}...: containers nested more than {MAX_DEPTH} levels deep "
            "(a dict or list that contains itself?); flatten the state"
        )
    is_map = isinstance(node, Mapping)
    if not node and key and (in_item or not is_map or for_load):
        _value({} if is_map else [], key, flat, path, in_item)
        return
    # DCP keeps a list of plain values, and any tuple, as one item (a tuple that holds a tensor
    # cannot be one here: its tensors are stored as tensors, by position)
    if not is_map and not in_item and key and (
        _plain_list(node, len(path)) if isinstance(node, list) else all(_json_like(v) for v in node)
    ):
        flat.dcp_paths[key] = path
        flat.lists[key] = node
        in_item = True
    for k, comp in _child_components(node, key):
        sub = path + ((str(k),) if is_map else (k,))
        _flatten(node[k], _sub(key, comp), flat, for_load, sub, in_item)


def _mark_parameters(node: Any, flat: FlatState, first: int) -> None:
    """Add to ``flat.params`` the plain tensors flattened since ``first`` that are parameters.

    Of ``node`` if it is a module, else of its ``model``; a tensor is one when its data is a
    (non-DTensor) parameter's, as ``state_dict()`` gives them (a detached view). A plain parameter
    that differs between ranks is no buffer that drifted (unsynchronised BatchNorm statistics):
    storing one rank's copy loses weights (experts keyed by local index, MoE review E2).
    """
    model = node if isinstance(node, torch.nn.Module) else getattr(node, "model", None)
    if not isinstance(model, torch.nn.Module) or len(flat.tensors) == first:
        return
    ptrs = set()
    for p in model.parameters():
        if not hasattr(p, "device_mesh"):  # a DTensor's is stored per shard: never compared
            ptrs.add(_data_ptr(p))
    ptrs.discard(0)  # no storage (zero-size, meta)
    if not ptrs:
        return
    for k, t in itertools.islice(flat.tensors.items(), first, None):
        if not hasattr(t, "device_mesh") and _data_ptr(t) in ptrs:
            flat.params.add(k)


def _data_ptr(t: torch.Tensor) -> int:
    try:
        return int(t.data_ptr())
    except (RuntimeError, NotImplementedError):  # a tensor subclass without one storage
        return 0


def _value(value: Any, key: str, flat: FlatState, path: DcpPath, in_item: bool) -> None:
    _check_key(key)
    flat.values[key] = value
    if not in_item and has_position(path):
        flat.dcp_paths[key] = path


def _replace(node: Any, value: Any) -> Any:
    """``value`` in place of the container ``node``: the same list or dict object where it fits.

    The target's container type is kept: a ``torch.Size``, a namedtuple or an ``OrderedDict``
    loaded whole comes back as one (a tuple is stored as a JSON list; subclasses were left
    with the target's values, fidelity review F5).
    """
    if isinstance(node, list) and isinstance(value, list):
        node[:] = value
        return node
    if isinstance(node, dict) and isinstance(value, dict):
        node.clear()
        node.update(value)
        return node
    if isinstance(node, tuple) and isinstance(value, list | tuple):
        if type(node) is tuple:
            return tuple(value)
        return node._make(value) if hasattr(node, "_make") else type(node)(value)
    return value


def fill_state(
    node: Any,
    flat: FlatState,
    loaded_values: Mapping[str, Any],
    *,
    key: str = "",
    on_object: Callable[[Any, Any], None] | None = None,
) -> Any:
    """Write loaded JSON leaves back into the structure ``flatten_state`` walked; return the node.

    Dicts and lists are updated in place; tuples are rebuilt. A container loaded whole (a list
    DCP keeps as one item, or an empty container of the target) takes the loaded value's place.
    Tensors were filled in place by the reader; entries are restored by the caller. For a
    stateful object, its template (from ``flat.objects``) is filled and passed to
    ``load_state_dict`` (or to ``on_object``).
    """
    if isinstance(node, torch.Tensor | StateEntry):
        return node
    if key in loaded_values and isinstance(node, _PLAIN_CONTAINERS) and (
        key not in flat.objects or node is flat.objects[key][1]
    ):
        # Also an object's own template (a Stateful whose fresh state_dict() is {}): it took
        # the object's key, and came back empty (odd-states review O13).
        return _replace(node, loaded_values[key])
    if key in flat.entries:
        return node
    if key in flat.objects and not isinstance(node, Mapping):
        obj, template = flat.objects[key]
        filled = fill_state(template, flat, loaded_values, key=key, on_object=on_object)
        if on_object is not None:
            on_object(obj, filled)
        else:
            obj.load_state_dict(filled)
        return node
    if isinstance(node, Mapping):
        for k, comp in _child_components(node, key):
            new = fill_state(node[k], flat, loaded_values, key=_sub(key, comp), on_object=on_object)
            if new is not node[k]:
                node[k] = new  # type: ignore[index]
        return node
    if isinstance(node, list):
        for i in range(len(node)):
            node[i] = fill_state(
                node[i], flat, loaded_values, key=_sub(key, str(i)), on_object=on_object
            )
        return node
    if isinstance(node, tuple):
        items = [
            fill_state(v, flat, loaded_values, key=_sub(key, str(i)), on_object=on_object)
            for i, v in enumerate(node)
        ]
        if hasattr(node, "_make"):
            return node._make(items)
        return type(node)(items)
    if key in loaded_values:
        value = loaded_values[key]
        if isinstance(node, tuple) and isinstance(value, list):
            return tuple(value)
        if isinstance(node, float) and isinstance(value, int) and not isinstance(value, bool):
            return float_if_exact(value)
        return _like(node, value)
    return node


def _like(node: Any, value: Any) -> Any:
    """``value`` in the target's own scalar type where its value was stored.

    An IntEnum member, a numpy scalar or a 0-d array is stored as its value; it came back as a
    plain int or float (float32 arithmetic became float64, ``isinstance`` checks failed:
    fidelity review F8). A value the type refuses stays as loaded, and so does a finite one the
    type would make infinite (``1e300`` into an ``np.float32`` became ``inf``, said only by
    numpy's overflow warning: zoo review Z5), as a cast of a tensor is refused for it.
    """
    if value is None or isinstance(value, dict | list):
        return value
    if isinstance(value, str) and not isinstance(node, enum.Enum | np.str_):
        return value  # (a str enum and np.str_ came back as str: zoo review, left by Z4)
    try:
        if isinstance(node, enum.Enum):
            return type(node)(value)
        with np.errstate(over="ignore"):
            if isinstance(node, np.generic):
                out: Any = node.dtype.type(value)
            elif isinstance(node, np.ndarray) and node.ndim == 0:
                out = np.asarray(value, dtype=node.dtype)
            else:
                return value
        # An int too (a state that held 65536 where the target holds an np.float16: re-attack
        # 29); one beyond every float raised OverflowError above.
        finite = isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
        if finite and not np.all(np.isfinite(out)):
            return value
        return out
    except (ValueError, TypeError, OverflowError):
        pass
    return value
