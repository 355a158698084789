"""The key rule of nested state and its mapping to DCP's dotted FQNs (no torch needed).

Key rule (:mod:`portable_ckpt.torch.flatten` applies it to a state dict): a leaf's key is the path
of container keys from the top, joined with ``/``; dict keys are strings or ints (decimal), list
positions are decimal; inside a component ``~`` is written ``~0`` and ``/`` is written ``~1``, so
splitting a key on ``/`` gives the components back. JSON-scalar leaves are stored, each under its
own key, in the global ``pck:json/1`` entry :data:`VALUES_ENTRY`.

DCP flattens a nested state dict into *dotted FQNs*: the same path joined with ``.``
(``{"model": {"fc.weight": w}}`` → ``model.fc.weight``). The dots inside module names make that
lossy, so the portable key of a DCP item is built from the item's *path* (DCP's planner records
it per FQN in ``planner_data``): :func:`portable_key`. The other way, a portable key shows to
DCP as its components joined with ``.``: :func:`dcp_fqn`. One implementation serves the DCP
storage layer (:mod:`portable_ckpt.torch.dcp`) and the converter (:mod:`portable_ckpt.convert`).

DCP's non-tensor items are JSON here, split into the leaves ``portable_ckpt.torch.save``
produces for the same state (:func:`json_leaves`); :class:`JsonTree` rebuilds item values from
stored leaves.

Which leaves make up one DCP item is not in the key: ``a/betas/0`` may be a position inside the
list item ``a.betas`` or the item ``a.betas.0`` of a dict keyed ``0``. Writers therefore record
the DCP object path (list positions as ints) of each item the key alone does not name in the
global entry :data:`DCP_ITEMS_ENTRY`; versions without it are read with DCP's own rule for lists
(:func:`list_item_key`).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

from portable_ckpt.errors import UnsupportedValueError, UsageError
from portable_ckpt.format.manifest import has_control_chars

__all__ = [
    "DCP_ITEMS_ENTRY",
    "VALUES_ENTRY",
    "DcpPath",
    "MAX_KEY",
    "LIST_ROOM",
    "JsonTree",
    "KeyTrie",
    "TrieNode",
    "TriePos",
    "dcp_fqn",
    "dcp_items_value",
    "has_position",
    "is_key",
    "decode_json",
    "encode_json",
    "float_if_exact",
    "escape_component",
    "has_surrogates",
    "join_key",
    "json_item_paths",
    "json_items",
    "json_leaves",
    "json_terminal",
    "list_item_key",
    "list_room",
    "needs_record",
    "lists_fit",
    "portable_key",
    "read_dcp_items",
    "recorded_items",
    "split_key",
    "unflatten_keys",
    "similar_keys",
]

#: Name of the global entry holding every JSON-scalar leaf.
VALUES_ENTRY = "torch.values"

#: Name of the global entry recording the DCP object path of every item that is not one stored
#: leaf at a path of dict keys: lists kept as one item, and items (tensors too) below a list
#: position (:func:`dcp_items_value`). Every other ``torch.values`` leaf is an item of its own.
DCP_ITEMS_ENTRY = "torch.dcp_items"

#: Longest key the key rule makes (the format's limit on tensor keys): a longer stored key is
#: in no container. (Prefix checks do not rely on it: :class:`KeyTrie` is linear in the bytes.)
MAX_KEY = 1024

#: A DCP object path: dict keys as ``str``, list positions as ``int`` (``planner_data``'s form).
DcpPath = tuple[str | int, ...]

#: List positions a record may ask readers to allocate beyond those stored: each list may reach
#: twice the positions stored in it plus 16, and all lists together ``LIST_ROOM`` more
#: (DCP's template-free load fills every position up to the largest): :func:`lists_fit`.
LIST_ROOM = 1 << 16


def list_room(stored: int, last: int) -> int:
    """What a list of ``stored`` positions, the largest ``last``, adds to :data:`LIST_ROOM`.

    Negative where it takes room; lists fit while ``LIST_ROOM`` plus their sum is >= 0.
    """
    return stored + 16 - (last + 1 - stored)  # holes beyond stored + 16 use the room


def lists_fit(lists: Iterable[tuple[int, int]]) -> bool:
    """Whether lists given as ``(positions stored, largest position)`` fit :data:`LIST_ROOM`."""
    return LIST_ROOM + sum(list_room(stored, last) for stored, last in lists) >= 0


def is_key(key: object) -> bool:
    """Whether ``key`` may name a tensor (spec §8.1): 1 to ``MAX_KEY`` characters, no control."""
    return isinstance(key, str) and 0 < len(key) <= MAX_KEY and not has_control_chars(key)


def has_surrogates(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate (U+D800–U+DFFF), which UTF-8 cannot encode."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


_SURROGATE_FIX = (
    "a lone surrogate (U+D800–U+DFFF), which UTF-8 and so the checkpoint cannot hold (a file "
    "name decoded with errors='surrogateescape'?); decode it properly or replace it"
)


def escape_component(c: str) -> str:
    """Escape one path component (``~`` → ``~0``, ``/`` → ``~1``)."""
    return c.replace("~", "~0").replace("/", "~1")


def join_key(parts: list[str]) -> str:
    """Join already-escaped components into a key."""
    return "/".join(parts)


def split_key(key: str) -> list[str]:
    """Split a key into its unescaped components (inverse of the key rule).

    Raises:
        UsageError: ``key`` is no string (an int was a ``TypeError`` from inside).

    """
    if not isinstance(key, str):
        raise UsageError(
            f"split_key: key must be a flat key (a str such as 'model/fc.weight'), got "
            f"{type(key).__name__} {key!r:.80}"
        )
    if "~" not in key:
        return key.split("/")
    return [p.replace("~1", "/").replace("~0", "~") for p in key.split("/")]


def unflatten_keys(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Build nested dicts from flat keys; flattening the result gives the same keys.

    Raises:
        UsageError: ``flat`` is no mapping, or holds a key that is no string.
        UnsupportedValueError: a key nests below another key's leaf.

    """
    if not isinstance(flat, Mapping):  # (a list was an AttributeError on .items())
        raise UsageError(
            f"unflatten_keys: flat must be a dict (flat key → value), got "
            f"{type(flat).__name__} {flat!r:.80}"
        )
    root: dict[str, Any] = {}
    for key, value in flat.items():
        if not isinstance(key, str):
            raise UsageError(
                f"unflatten_keys: flat's keys must be flat keys (str), got "
                f"{type(key).__name__} {key!r:.80}"
            )
        parts = split_key(key)
        node = root
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise UnsupportedValueError(f"key {key!r} nests below the leaf {p!r}")
            node = nxt
        node[parts[-1]] = value
    return root


_FLOAT_TAG = "__float__"


def encode_json(value: Any, *, key: str = "?") -> Any:
    """Return a JSON-safe copy of ``value`` (tuples become lists, non-finite floats are tagged)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        if has_surrogates(value):
            raise UnsupportedValueError(
                f"value at {key!r}: the string {value!r} holds {_SURROGATE_FIX}"
            )
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return float(value)
        return {_FLOAT_TAG: "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str | int) or isinstance(k, bool):
                raise UnsupportedValueError(f"value at {key!r}: dict key {k!r} is not a str or int")
            sk = str(k)
            if has_surrogates(sk):
                raise UnsupportedValueError(
                    f"value at {key!r}: the dict key {sk!r} holds {_SURROGATE_FIX}"
                )
            if sk in out:
                raise UnsupportedValueError(f"value at {key!r}: dict keys collide on {sk!r}")
            out[sk] = encode_json(v, key=f"{key}/{sk}")
        return out
    if isinstance(value, list | tuple):
        return [encode_json(v, key=f"{key}/{i}") for i, v in enumerate(value)]
    if hasattr(value, "item") and hasattr(value, "dtype") and getattr(value, "ndim", 1) == 0:
        item = value.item()  # numpy / torch scalars
        if item is None or isinstance(item, bool | str | int | float):
            return encode_json(item, key=key)
        # np.longdouble(...).item() is an np.longdouble again: it recursed without end
        # (odd-states review O7); a complex scalar has no JSON form either
        raise UnsupportedValueError(
            f"value at {key!r}: a {type(value).__name__} scalar has no JSON form; "
            f"{scalar_fix(value)}"
        )
    raise UnsupportedValueError(
        f"value at {key!r} of type {type(value).__name__} cannot be stored without pickle; "
        f"store a tensor, a JSON scalar, or an object with state_dict()/load_state_dict()"
    )


def decode_json(value: Any) -> Any:
    """Inverse of :func:`encode_json` for tagged floats (containers stay dicts/lists)."""
    if isinstance(value, dict):
        if len(value) == 1 and _FLOAT_TAG in value and isinstance(value[_FLOAT_TAG], str):
            return float(value[_FLOAT_TAG])
        return {k: decode_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_json(v) for v in value]
    return value


def portable_key(path: Sequence[str | int]) -> str:
    """The portable key of a DCP object path (``("model", "fc.weight")`` → ``model/fc.weight``)."""
    return "/".join(escape_component(str(p)) for p in path)


def dcp_fqn(key: str) -> str:
    """DCP's dotted FQN of a portable key (``optim/state/fc.weight/exp_avg`` → ``optim.state.fc.weight.exp_avg``)."""
    return ".".join(split_key(key))


def list_item_key(key: str) -> str:
    """The key of the DCP item a stored JSON leaf belongs to, for versions without an item record.

    DCP keeps a list of plain values as one item, so the trailing run of decimal components of a
    leaf (``a/betas/1``) are taken as positions inside that item (``a/betas``). A dict keyed
    ``0..n-1`` is read as such a list: only :data:`DCP_ITEMS_ENTRY` tells the two apart.
    """
    parts = key.split("/")
    while len(parts) > 1 and parts[-1].isdecimal():
        parts.pop()
    return "/".join(parts)


def json_terminal(value: Any, depth: int = 0) -> bool:
    """Whether DCP keeps ``value`` as one item: a list or tuple with no dict below it, or a scalar.

    DCP's default planner walks dicts, keeps a list holding only scalars and such lists as one
    item, and walks any other list by position (``torch.distributed.checkpoint._traverse``).
    """
    if isinstance(value, Mapping):
        return False
    if isinstance(value, list | tuple):
        return depth < 64 and all(json_terminal(v, depth + 1) for v in value)
    return True


def json_item_paths(value: Any, path: DcpPath) -> Iterator[DcpPath]:
    """The DCP object paths DCP's default planner makes of a JSON ``value`` stored at ``path``."""
    return (here for here, _ in json_items(value, path))


def json_items(value: Any, path: DcpPath) -> Iterator[tuple[DcpPath, Any]]:
    """``(DCP object path, item value)`` of each item DCP's default planner makes of ``value``."""
    stack: list[tuple[DcpPath, Any]] = [(path, value)]
    while stack:
        here, node = stack.pop()
        if isinstance(node, Mapping) and len(here) < 64:  # an empty dict is no item, as in DCP
            stack.extend((here + (str(k),), v) for k, v in node.items())
        elif isinstance(node, list | tuple) and not json_terminal(node) and len(here) < 64:
            stack.extend((here + (i,), v) for i, v in enumerate(node))
        else:
            yield here, node


def needs_record(path: DcpPath, item: Any) -> bool:
    """Whether the item ``item`` at ``path`` must be in :data:`DCP_ITEMS_ENTRY`.

    Its key alone does not say it: it lies below a list position, or it is a list (stored as
    one leaf per position, which a reader would otherwise take for a dict keyed ``0..n-1``).
    """
    return has_position(path) or (isinstance(item, list | tuple) and bool(item))


def has_position(path: DcpPath) -> bool:
    """Whether a DCP object path goes through a list (an ``int`` component)."""
    return int in map(type, path)


def recorded_items(ck: Any) -> dict[str, DcpPath] | None:
    """The :data:`DCP_ITEMS_ENTRY` record of an opened version (``None``: none, or malformed)."""
    e = ck.entries.get(DCP_ITEMS_ENTRY)
    if e is None or e.scope != "global":
        return None
    return read_dcp_items(ck.entry(DCP_ITEMS_ENTRY))


class RecordedShapes:
    """Which containers of a version were lists, from its :data:`DCP_ITEMS_ENTRY` record.

    The key rule writes a list position and an int dict key alike (``h/0``), so a container
    rebuilt without a target to follow (below an empty dict of the target) had its kind guessed
    from its children: ``{0: 0.5, 1: 0.7}`` came back as a list, and a list of tensors as a dict
    keyed ``"0"``, ``"1"`` (zoo review Z2). The record names every item below a list position
    with that position as an int: the containers it passes through at an int are the lists, any
    other container is a dict. Below an item (a plain list DCP keeps whole) nothing is recorded,
    and the children decide as before.
    """

    def __init__(self, items: Mapping[str, DcpPath]) -> None:
        self.lists = {portable_key(p[:i]) for p in items.values() for i, c in enumerate(p)
                      if type(c) is int}
        self.items = KeyTrie(items)

    def is_list(self, key: str) -> bool | None:
        """Whether the container at ``key`` was a list (``None``: within an item, not known)."""
        if self.items.on_path(key):
            return None
        return key in self.lists


def dcp_items_value(paths: Iterable[DcpPath]) -> list[list[str | int]]:
    """The :data:`DCP_ITEMS_ENTRY` value of ``paths``: one JSON array per item, sorted by key."""
    by_key = {portable_key(p): [c if type(c) is int else str(c) for c in p] for p in paths if p}
    return [by_key[k] for k in sorted(by_key)]


def read_dcp_items(value: Any) -> dict[str, DcpPath] | None:
    """``{portable key: DCP object path}`` of a :data:`DCP_ITEMS_ENTRY` value, ``None`` if malformed.

    A malformed record is ignored (readers fall back to :func:`list_item_key`): it only names
    items, and a wrong name costs a DCP reader a missing key, never a wrong value.
    """
    if not isinstance(value, list):
        return None
    out: dict[str, DcpPath] = {}
    for p in value:
        if not isinstance(p, list) or not p:
            return None
        for c in p:
            if not (type(c) is str or (type(c) is int and c >= 0)):
                return None
        out[portable_key(p)] = tuple(p)
    return out


def scalar_fix(value: Any) -> str:
    """How to store a numpy or torch scalar that has no JSON form, for its kind.

    The one advice given to all, ``float(x)``, raises for a datetime, a timedelta and bytes
    (zoo review Z4).
    """
    kind = getattr(getattr(value, "dtype", None), "kind", "")
    if kind == "M":
        return "store str(x) (ISO 8601), or x.astype('int64') with its unit, and convert it back"
    if kind == "m":
        return "store x / np.timedelta64(1, 's') (seconds as a float), or x.astype('int64')"
    if kind in ("S", "V"):
        return "store x.tobytes() as a uint8 tensor, or decode it to a str"
    if kind == "c":
        return "store x.real and x.imag as two floats, or a tensor through view_as_real"
    return "convert it (float(x), or a float64 tensor) before saving"


#: How a value JSON cannot hold is to be changed (the fix of "the value" refusals).
_JSON_FIX = (
    "non-tensor items are stored as JSON (None, bool, int, float, str, and lists, tuples and "
    "dicts of them). Convert it (bytes to a base64 str or a uint8 tensor, an object to its "
    "state_dict(); DCP calls state_dict() only on top-level values)"
)


def _unsupported(
    fqn: str, key: str, value: Any, why: str, fix: str = _JSON_FIX
) -> UnsupportedValueError:
    """The refusal of DCP item ``fqn``: ``why`` for what is at ``key``, and that case's ``fix``."""
    return UnsupportedValueError(
        f"DCP item {fqn!r} (key {key!r}): {why} ({type(value).__name__}) cannot be stored "
        f"without pickle; {fix}"
    )


def _tensor_refused(fqn: str, key: str, inside: str | None) -> UnsupportedValueError:
    """The refusal of a tensor inside the non-tensor DCP item ``fqn``: one message, one fix."""
    why, fix = _tensor_inside(inside)
    return UnsupportedValueError(f"DCP item {fqn!r} (key {key!r}): {why}; {fix}")


def json_leaves(
    key: str, value: Any, *, fqn: str, is_tensor: Callable[[Any], bool] | None = None
) -> dict[str, Any]:
    """Split a non-tensor value into ``{portable key: JSON scalar}`` (empty containers as is).

    ``is_tensor`` recognises tensors nested in the value (refused: they belong in tensors).

    Raises:
        UnsupportedValueError: a value JSON cannot hold (naming the DCP item and the key).

    """
    out: dict[str, Any] = {}
    _leaves(key, value, out, fqn, 0, is_tensor)
    return out


def _leaves(
    key: str,
    value: Any,
    out: dict[str, Any],
    fqn: str,
    depth: int,
    is_tensor: Callable[[Any], bool] | None,
    inside: str | None = None,
) -> None:
    if depth > 64:
        raise _unsupported(
            fqn, key, value, "a value nested more than 64 levels deep",
            "non-tensor items are stored as JSON of at most 64 levels: flatten it",
        )
    if is_tensor is not None and is_tensor(value):
        raise _tensor_refused(fqn, key, inside)
    if isinstance(value, Mapping):
        if not value:
            out[key] = {}
        seen: set[str] = set()
        for k, v in value.items():
            if isinstance(k, bool) or not isinstance(k, str | int):
                raise _unsupported(
                    fqn, key, k, f"the dict key {k!r}",
                    "dict keys are stored as strings: use str or int keys",
                )
            comp = escape_component(str(k))
            if comp in seen:
                raise _unsupported(
                    fqn, key, value, f"a dict whose keys collide on {str(k)!r}",
                    "two of its keys would be one stored key: rename one",
                )
            seen.add(comp)
            # A dict reaches here only when the planner did not flatten it into items.
            _leaves(f"{key}/{comp}", v, out, fqn, depth + 1, is_tensor, inside or _IN_ITEM)
        return
    if isinstance(value, list | tuple):
        if not value:
            out[key] = []
        # DCP's flattening keeps a tuple as one item, and a list only without a tensor or a
        # dict in it: a tensor below a tuple is the tuple's case, else the planner's
        below = _IN_TUPLE if isinstance(value, tuple) else inside or _IN_ITEM
        for i, v in enumerate(value):
            _leaves(f"{key}/{i}", v, out, fqn, depth + 1, is_tensor, below)
        return
    try:
        out[key] = encode_json(value, key=key)
    except UnsupportedValueError:
        raise _unsupported(fqn, key, value, "the value") from None


#: A tensor below a container of an item: why it is there, and the fix (:func:`_tensor_inside`).
_IN_ITEM = "item"
_IN_TUPLE = "tuple"


def _tensor_inside(inside: str | None) -> tuple[str, str]:
    """``(why, fix)`` of a tensor found inside a non-tensor item."""
    if inside == _IN_TUPLE:
        return (
            "a tensor inside a tuple cannot be stored: DCP's planner keeps a tuple as one "
            "non-tensor item",
            "a tensor is stored only as an item of its own: make the tuple a list (DCP "
            "flattens a list holding tensors into items) or a dict",
        )
    if inside == _IN_ITEM:
        return (
            "a tensor inside a dict or list that the planner kept as one non-tensor item (as "
            "DefaultSavePlanner(flatten_state_dict=False) does) cannot be stored",
            "a tensor is stored only as an item of its own: save with DCP's default planner "
            "(DefaultSavePlanner(), whose flatten_state_dict=True makes each tensor an item) or "
            "PortableSavePlanner(), or have a custom planner flatten the state",
        )
    return (
        "a tensor given as a non-tensor item cannot be stored",
        "have the planner give it as a tensor item (DefaultSavePlanner() or "
        "PortableSavePlanner() do)",
    )


class TrieNode:
    """A node of :class:`KeyTrie`: a stored key, or a prefix where stored keys part ways."""

    __slots__ = ("below", "depth", "flags", "key", "kids", "label")

    def __init__(self, key: str, label: str, depth: int, flags: int = 0) -> None:
        #: The prefix this node stands for (its components joined with ``/``).
        self.key = key
        #: Its components after the parent's (the whole key below the root).
        self.label = label
        #: Its number of components (0: the root, which stands for no component at all).
        self.depth = depth
        #: The nodes below, by the first component of their label, in order of first insertion.
        self.kids: dict[str, TrieNode] | None = None
        #: The flags the keys added at exactly this prefix carry (0: no key ends here).
        self.flags = flags
        #: The flags of the keys strictly below it, ORed.
        self.below = 0


#: A place in a :class:`KeyTrie`: the prefix ``node.key[:end]`` (``end`` at a component
#: boundary); ``node`` is the first node at or below it.
TriePos = tuple[TrieNode, int]


def _step(node: TrieNode, key: str, pos: int) -> tuple[TrieNode | None, int, bool]:
    """The edge below ``node`` that ``key``'s component at ``pos`` takes.

    Returns ``(kid, stop, along)``: the node the edge leads to (``None``: no edge), where its
    label would end in ``key``, and whether ``key`` runs along the whole label (ending there or
    going on after a ``/``).
    """
    end = key.find("/", pos)
    kid = node.kids.get(key[pos:] if end < 0 else key[pos:end]) if node.kids else None
    if kid is None:
        return None, pos, False
    stop = pos + len(kid.label)
    return kid, stop, key.startswith(kid.label, pos) and (stop == len(key) or key[stop] == "/")


def _first_component(label: str) -> str:
    end = label.find("/")
    return label if end < 0 else label[:end]


def _common_chars(a: str, start: int, b: str) -> int:
    """Length of the common prefix of ``a[start:]`` and ``b`` (C-level comparisons, O(len))."""
    lo, hi = 0, min(len(a) - start, len(b))
    while lo < hi:  # each probe compares a slice half the size of the one before
        mid = (lo + hi + 1) // 2
        if a.startswith(b[lo:mid], start + lo):
            lo = mid
        else:
            hi = mid - 1
    return lo


class KeyTrie:
    """Keys split at ``/`` as a compressed trie: a node per key and per prefix where keys part.

    A run of components that only one branch goes through is one edge, not a node (nor a prefix
    string) per component, so adding a key and every query cost time linear in that key's
    characters, and the trie holds a bounded number of objects per key whatever its number of
    components (a 1,024-character key of 1,000 empty components is one node, not 1,000
    prefixes). Each key carries flags (small ints ORed, e.g. a key's role); a node records the
    flags of the keys at it and below it.
    """

    def __init__(self, keys: Iterable[str] = (), flag: int = 1) -> None:
        self.root = TrieNode("", "", 0)
        for k in keys:
            self.add(k, flag)

    def add(self, key: str, flag: int = 1) -> None:
        """Add ``key`` with ``flag`` (ORed onto the flags it already has)."""
        node, pos = self.root, 0  # pos: where the component after ``node`` starts in ``key``
        while True:
            node.below |= flag
            kid, stop, along = _step(node, key, pos)
            if kid is None:
                depth = node.depth + 1 + key.count("/", pos)
                rest = key[pos:] if pos else key
                if node.kids is None:
                    node.kids = {}
                node.kids[_first_component(rest)] = TrieNode(key, rest, depth, flag)
                return
            if along:
                if stop == len(key):
                    kid.flags |= flag
                    return
                node, pos = kid, stop + 1
                continue
            # ``key`` leaves the edge to ``kid`` after ``n`` characters of its label: a node there
            label = kid.label
            n = _shared_components(key, pos, label)
            mid = TrieNode(key[: pos + n], label[:n], node.depth + 1 + label.count("/", 0, n))
            kid.label = label[n + 1 :]
            mid.kids = {_first_component(kid.label): kid}
            mid.below = kid.flags | kid.below
            cast(dict[str, TrieNode], node.kids)[_first_component(label)] = mid  # same place
            if pos + n == len(key):
                mid.flags = flag
                return
            node, pos = mid, pos + n + 1

    def find(self, key: str) -> TriePos | None:
        """The place of ``key`` if it is a key or a prefix (at ``/``) of one, else ``None``."""
        node, pos = self.root, 0
        while True:
            end = key.find("/", pos)
            comp = key[pos:] if end < 0 else key[pos:end]
            kid = node.kids.get(comp) if node.kids else None
            if kid is None:
                return None
            label = kid.label
            rest = len(key) - pos
            if rest <= len(label):
                if (rest == len(label) or label[rest] == "/") and key.startswith(label[:rest], pos):
                    return kid, len(kid.key) - len(label) + rest
                return None
            if not (key.startswith(label, pos) and key[pos + len(label)] == "/"):
                return None
            node, pos = kid, pos + len(label) + 1

    def below(self, key: str) -> int:
        """The flags of the keys strictly below ``key`` (``key`` a proper prefix of them), ORed."""
        at = self.find(key)
        if at is None:
            return 0
        node, end = at
        return node.below if end == len(node.key) else node.flags | node.below

    def on_path(self, key: str) -> int:
        """The flags of the keys equal to ``key`` or above it (prefixes of it at ``/``), ORed."""
        flags, node, pos = 0, self.root, 0
        while True:
            kid, stop, along = _step(node, key, pos)
            if kid is None or not along:
                return flags
            flags |= kid.flags
            if stop == len(key):
                return flags
            node, pos = kid, stop + 1

    def reach(self, key: str) -> tuple[int, bool]:
        """How far ``key`` runs along the trie: ``(components, more)``.

        ``components``: how many leading components of ``key`` are a place in the trie;
        ``more``: whether some key lies strictly below that place.
        """
        node, pos = self.root, 0
        while True:
            kid, stop, along = _step(node, key, pos)
            if kid is None:
                return node.depth, node.depth > 0 and node.below != 0
            if along:
                if stop == len(key):
                    return kid.depth, kid.below != 0
                node, pos = kid, stop + 1
                continue
            n = _shared_components(key, pos, kid.label)  # inside the edge: ``kid`` lies below
            return node.depth + 1 + kid.label.count("/", 0, n), True

    def path(self, key: str) -> list[TrieNode]:
        """The nodes from the top down to ``key``'s own (``key`` must have been added)."""
        out: list[TrieNode] = []
        node, pos = self.root, 0
        while True:
            end = key.find("/", pos)
            kid = cast(dict[str, TrieNode], node.kids)[key[pos:] if end < 0 else key[pos:end]]
            out.append(kid)
            pos += len(kid.label) + 1
            if pos > len(key):
                return out
            node = kid

    def nodes(self) -> Iterator[tuple[TrieNode, TrieNode]]:
        """Every node but the root with its parent, each parent before its nodes."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            for kid in (node.kids or {}).values():
                yield kid, node
                stack.append(kid)

    def kids(self, at: TriePos | None) -> list[tuple[str, TriePos]]:
        """The components right below a place, each with its place, in order of insertion."""
        if at is None:
            return []
        node, end = at
        key = node.key
        if end < len(key) and node is not self.root:  # inside an edge: one component
            nxt = key.find("/", end + 1)
            stop = len(key) if nxt < 0 else nxt
            return [(key[end + 1 : stop], (node, stop))]
        out: list[tuple[str, TriePos]] = []
        for comp, kid in (node.kids or {}).items():
            start = len(kid.key) - len(kid.label)
            out.append((comp, (kid, start + len(comp))))
        return out


def _shared_components(key: str, pos: int, label: str) -> int:
    """Characters of ``label`` that ``key[pos:]`` shares with it, cut back to a component end.

    ``key`` and ``label`` share their first component and ``key`` does not run along all of it.
    """
    n = _common_chars(key, pos, label)
    if n < len(label) and label[n] == "/" and pos + n == len(key):
        return n  # key ends where a component of the label ends
    return label.rfind("/", 0, n)


class JsonTree:
    """Stored JSON leaves, rebuilt into the values DCP items stand for.

    ``value(key, template)`` gives the value below ``key``: the stored leaf itself, or the
    container of the leaves below it. Without a template, children ``0..n-1`` make a list and
    any other children a dict. A template (the load target's current value) gives the types
    JSON lost where it fits what is stored: a tuple stays a tuple, int dict keys stay ints, an
    int where a float was becomes a float; where it does not (a scalar or a list where a
    container of other children is stored) the stored shape wins, as with DCP's own storage,
    which puts the stored object in place of the target's.

    ``positions_in_any_order``: children that are the positions ``0..n-1`` stored in another
    order (a version ``convert`` wrote from DCP stores its leaves sorted as strings,
    ``params/10`` before ``params/2``) are taken in numeric order, as a list's; by default
    only children stored in the order ``0..n-1`` are.
    """

    def __init__(
        self,
        leaves: Mapping[str, Any],
        *,
        positions_in_any_order: bool = False,
        shapes: RecordedShapes | None = None,
    ) -> None:
        self._leaves = dict(leaves)
        self._keys: KeyTrie | None = None
        self._any_order = positions_in_any_order
        self._shapes = shapes

    @property
    def _trie(self) -> KeyTrie:
        if self._keys is None:  # built on first use
            # Longer keys: no key rule makes them; each is a leaf of its own, in no container.
            self._keys = KeyTrie(k for k in self._leaves if len(k) <= MAX_KEY)
        return self._keys

    def __contains__(self, key: str) -> bool:
        return key in self._leaves or self._trie.find(key) is not None

    def value(self, key: str, template: Any = None, *, item: bool = False) -> Any:
        """The value stored below ``key``, shaped like ``template``.

        ``item``: ``key`` is a DCP item of a flattening planner, whose stored value is a list or
        a scalar, never a dict (DCP walks dicts into items): stored positions ``0..n-1`` below
        it make a list even where the template holds a dict.
        """
        if key in self._leaves:
            return _like(decode_json(self._leaves[key]), template)
        stack = [self._open(self._trie.find(key), template, item)]
        while True:  # no recursion: a value nested as deep as a key allows rebuilds too
            top = stack[-1]
            if len(top.values) < len(top.kids):
                at, sub = top.kids[len(top.values)], top.template_of(len(top.values))
                node, end = at
                if end == len(node.key) and node.flags:
                    top.values.append(_like(decode_json(self._leaves[node.key]), sub))
                else:
                    stack.append(self._open(at, sub, False))
                continue
            done = stack.pop().build()
            if not stack:
                return done
            stack[-1].values.append(done)

    def _open(self, at: TriePos | None, template: Any, item: bool) -> _Rebuild:
        kids = self._trie.kids(at)
        comps = [c for c, _ in kids]
        dense = comps == [str(i) for i in range(len(comps))]
        if not dense and self._any_order and _positions(comps):
            kids = sorted(kids, key=lambda kid: int(kid[0]))
            comps = [c for c, _ in kids]
            dense = True
        if isinstance(template, list | tuple) and dense:
            # a tuple subclass (torch.Size, a namedtuple) stays itself (fidelity review F13)
            kind = type(template) if isinstance(template, tuple) else list
            return _Rebuild(kids, kind, None, template)
        if isinstance(template, Mapping) and not (item and dense):
            by_comp = {escape_component(str(k)): k for k in template}
            names = [by_comp.get(c, split_key(c)[0]) for c in comps]
            temps = [template.get(by_comp[c]) if c in by_comp else None for c in comps]
            return _Rebuild(kids, dict, names, temps)
        # no template, or one that does not explain the stored children: the stored shape
        if dense and not (
            self._shapes is not None and at is not None
            and self._shapes.is_list(at[0].key[: at[1]]) is False
        ):
            return _Rebuild(kids, list, None, None)
        return _Rebuild(kids, dict, [split_key(c)[0] for c in comps], None)


def _positions(comps: list[str]) -> bool:
    """``comps`` are the positions ``0..n-1`` (distinct, as a node's children are), any order.

    A position is written as the key rule writes it: ``"0"``, ``"17"``, never ``"007"``.
    """
    n = len(comps)
    for c in comps:
        if not (c.isascii() and c.isdigit() and len(c) <= 18) or (c[0] == "0" and c != "0"):
            return False
        if int(c) >= n:
            return False
    return True


class _Rebuild:
    """One container of :meth:`JsonTree.value` being rebuilt: its places, then its values."""

    __slots__ = ("kids", "kind", "names", "templates", "values")

    def __init__(
        self,
        kids: list[tuple[str, TriePos]],
        kind: type,
        names: list[Any] | None,
        templates: Sequence[Any] | None,
    ) -> None:
        self.kids = [at for _, at in kids]
        self.kind = kind
        self.names = names
        self.templates = templates
        self.values: list[Any] = []

    def template_of(self, i: int) -> Any:
        t = self.templates
        return t[i] if t is not None and i < len(t) else None

    def build(self) -> Any:
        if self.kind is dict:
            return dict(zip(cast(list[Any], self.names), self.values, strict=True))
        if self.kind is list:
            return self.values
        return _as_tuple(self.kind, self.values)


def _like(value: Any, template: Any) -> Any:
    """A stored scalar in the target's type where JSON lost it (an int where a float was).

    Only where the float is the same number: an int a float cannot hold (above 2^53, say)
    stays the int it was saved as, not silently rounded (DCP integrator review 23, 6).
    """
    if isinstance(template, float) and isinstance(value, int) and not isinstance(value, bool):
        return float_if_exact(value)
    if isinstance(template, tuple) and isinstance(value, list):
        return _as_tuple(type(template), value)
    return value


def float_if_exact(value: int) -> float | int:
    """``value`` as a float where the float is the same number, else the int itself.

    A stored int loaded where the target holds a float: above 2^53 a float rounds it
    (``2**70 + 1``), and the value would change without a word (DCP integrator review 23, 6).
    """
    try:
        as_float = float(value)
    except OverflowError:
        return value
    return as_float if as_float == value else value


def _as_tuple(kind: type, values: list[Any]) -> Any:
    """``values`` as a ``kind`` (a tuple or a subclass: a namedtuple, ``torch.Size``)."""
    if kind is tuple:
        return tuple(values)
    make = getattr(kind, "_make", None)
    try:
        return make(values) if make is not None else kind(values)
    except (TypeError, ValueError):  # a subclass that takes other arguments: a plain tuple
        return tuple(values)


def similar_keys(key: str, keys: Iterable[str], n: int = 3) -> list[str]:
    """Stored keys that look like a missing ``key``: a renamed prefix, a typo.

    Keys ending with ``/key`` first (``model/w`` stored as ``train/model/w``), at any count;
    else the close matches of :mod:`difflib`, only among at most 1,000 keys (it compares every
    pair: 10,000 keys took 0.55 s, paid by code that probes keys: diff review D4).
    """
    keys = list(keys)
    found = [k for k in keys if k.endswith("/" + key)][:n]
    if not found and len(keys) <= 1_000:
        found = difflib.get_close_matches(key, keys, n=n, cutoff=0.6)
    return found
