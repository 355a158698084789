"""The plain values and state entries a load restores, and targets grown below an empty dict.

Tensors below an empty dict of the target (a fresh Stateful's EMA, an optimizer's state before
its first step) are made from the version's records; plain values and entries are read on a
worker while the tensors load and applied after them, RNG last; optimizer param groups are
checked against the target's first.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

import torch

from portable_ckpt._printable import spans
from portable_ckpt._threads import worker
from portable_ckpt.errors import EntryMissingError, EntrySchemaError, EntryTargetError
from portable_ckpt.format.keys import (
    JsonTree,
    KeyTrie,
    RecordedShapes,
    escape_component,
    recorded_items,
    split_key,
)
from portable_ckpt.io.reader import NO_VALUE, Checkpoint
from portable_ckpt.torch._hyperparameters import GROUP_MEMBER
from portable_ckpt.torch._inflight import say
from portable_ckpt.torch._load_messages import instead
from portable_ckpt.torch._tensors import torch_dtype
from portable_ckpt.torch.flatten import (
    VALUES_ENTRY,
    FlatState,
    StateEntry,
    decode_json,
    encode_json,
)
from portable_ckpt.torch.info import LoadInfo

__all__ = ["EntryReads", "load_entries", "load_values", "restore_entry", "tensors_into_empty",
           "with_tensors"]


def tensors_into_empty(
    ck: Checkpoint, flat: FlatState, *, whole: bool
) -> dict[str, dict[str, torch.Tensor]]:
    """New tensors for the stored tensors below an empty dict of the target.

    An empty dict is a place for everything stored below it: a Stateful's dict that grows in
    training (EMA weights keyed by parameter name, filled at the first update) got its plain
    values back but lost its tensors, listed only in ``LoadInfo.unexpected_keys`` (odd-states
    review O14). Each is made whole on the CPU, with the stored dtype and global shape, and
    read like any plain tensor target. In a group (``whole`` false), only tensors stored whole
    (one range: a plain tensor) are made so: a sharded one (an FSDP2 EMA) made whole on every
    rank could exhaust the host, and a plain tensor where the job keeps a DTensor breaks its
    next update (diff review D6); it stays in ``LoadInfo.unexpected_keys``. Returns, per empty
    dict, its new tensors by their key below it.
    """
    places = {k for k, v in flat.values.items() if isinstance(v, dict) and not v and k}
    if not places:
        return {}
    grown: dict[str, dict[str, torch.Tensor]] = {}
    for name, entry in ck.tensors.items():
        if name in flat.tensors:
            continue
        cut = name.find("/")
        while cut != -1 and name[:cut] not in places:  # the shortest enclosing place
            cut = name.find("/", cut + 1)
        if cut != -1 and (whole or _range_count(entry) == 1):
            t = torch.empty(tuple(entry.shape), dtype=torch_dtype(entry.dtype))
            flat.tensors[name] = t
            grown.setdefault(name[:cut], {})[name[cut + 1:]] = t
    return grown


def _range_count(entry: Any) -> int:
    """How many range records a tensor entry has (a table's without building them)."""
    count = getattr(entry, "range_count", None)  # a property of a table's entries
    return int(count) if count is not None else len(entry.ranges)


def with_tensors(
    value: Any,
    tensors: Mapping[str, torch.Tensor],
    *,
    by_int: bool,
    where: str = "",
    shapes: RecordedShapes | None = None,
) -> Any:
    """The loaded value of an empty dict with its new tensors put in place by their keys.

    ``by_int``: its own keys that are decimal become ints (an optimizer's ``state``). A list
    the stored values already made (the values of a list of dicts that also hold tensors) takes
    the tensors at its positions: it was replaced by a dict of the tensors alone, and its values
    were lost without a word (zoo review Z3). Then each container that was a list when saved (a
    list of tensors: ``shapes``, or one the values made) is a list again, not a dict keyed
    ``"0"``, ``"1"`` (zoo review Z2).
    """
    if not isinstance(value, dict):
        return value  # a stored value there (not a dict): the tensors stay unexpected
    made: set[str] = set()  # the lists the values made (all a version without a record says)
    for rel, t in tensors.items():
        node, at = value, where
        comps = rel.split("/")
        for i, comp in enumerate(comps):
            name = split_key(comp)[0]
            if i == len(comps) - 1:
                node[name] = t
                break
            child = node.get(name)
            if isinstance(child, list):  # positions join the tensors' keys; a list again below
                child = node[name] = {str(j): v for j, v in enumerate(child)}
                made.add(f"{at}/{comp}")
            elif not isinstance(child, dict):
                child = node[name] = {}
            node, at = child, f"{at}/{comp}"
    value = _as_lists(value, where, made | shapes.lists if shapes is not None else made)
    if by_int:
        ints = {k: int(k) for k in value if isinstance(k, str) and k.isdecimal()
                and str(int(k)) == k}
        value = {ints.get(k, k): v for k, v in value.items()}
    return value


def _as_lists(value: dict[str, Any], where: str, lists: set[str]) -> dict[str, Any]:
    """``value`` (grown at ``where``) with the dicts that were lists made lists again.

    Only a dict at a key of ``lists`` whose keys are the positions ``0..n-1`` changes.
    """
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        node, key = stack.pop()
        kids = list(node.items() if isinstance(node, dict) else enumerate(node))
        for name, child in kids:
            if not isinstance(child, dict | list):
                continue
            at = f"{key}/{escape_component(str(name))}"
            if (isinstance(child, dict) and at in lists
                    and sorted(child) == sorted(str(i) for i in range(len(child)))):
                child = node[name] = [child[str(i)] for i in range(len(child))]
            stack.append((child, at))
    return value


class EntryReads:
    """The entry values this rank's load restores, read on a worker while its tensors are read.

    Read after the tensors, a version's small entry files queued behind the other ranks' large
    reads of the same disk: 15-70 ms of a 0.55 s cold 4-rank load of the realistic state. Read
    while the tensors are planned and read, they cost nothing the load waits for. Each value is
    read once (``torch.values`` was read again for every entry rebuilt from its leaves).
    Failures are raised where the value is used, in the order the load always had.
    """

    def __init__(self, ck: Checkpoint, flat: FlatState, info: LoadInfo) -> None:
        self.ck = ck
        self.rank = info.rank
        self.world_size = info.world_size
        self._reads: dict[tuple[str, int | None, int | None], Future[Any]] = {}
        wanted: list[tuple[str, int | None, int | None]] = []
        if VALUES_ENTRY in ck.entries and (flat.values or flat.entries):
            wanted.append((VALUES_ENTRY, None, None))
        for key in flat.entries:
            stored = ck.entries.get(key)
            if stored is not None:
                per_rank = stored.scope == "per_rank"
                wanted.append((key, self.rank, self.world_size) if per_rank else (key, None, None))
        pool = worker("pck-entries")
        for w in wanted:
            self._reads[w] = pool.submit(ck.entry, *w)

    def __enter__(self) -> EntryReads:
        return self

    def __exit__(self, *exc: object) -> None:
        # Nothing reads the version after the load returns: drop what was not started, wait
        # for what was.
        for fut in self._reads.values():
            fut.cancel()
        for fut in self._reads.values():
            if not fut.cancelled():
                fut.exception()

    @functools.cached_property
    def shapes(self) -> RecordedShapes | None:
        """Which containers were lists, where the version records it (read when first asked)."""
        items = recorded_items(self.ck)
        return None if items is None else RecordedShapes(items)

    def get(self, name: str, *, per_rank: bool = False) -> Any:
        """The value of entry ``name`` (this rank's for a ``per_rank`` one)."""
        key = (name, self.rank, self.world_size) if per_rank else (name, None, None)
        fut = self._reads.get(key)
        if fut is None:
            return self.ck.entry(*key)
        return fut.result()


#: Members of every optimizer's param groups, whatever its class, and those LR schedulers add
#: (OneCycleLR, CyclicLR, SWALR): a fine-tune with another schedule is no other optimizer.
_GROUP_COMMON = frozenset({"params", "param_names", "lr", "weight_decay", "maximize", "foreach",
                           "differentiable", "fused", "capturable", "initial_lr", "max_lr",
                           "min_lr", "base_lr", "max_momentum", "base_momentum", "swa_lr"})


@functools.cache
def _optimizer_members() -> frozenset[str]:
    """The hyper-parameters torch's optimizers take, but those every one has or schedules add."""
    names: set[str] = set()
    for c in vars(torch.optim).values():
        if isinstance(c, type) and issubclass(c, torch.optim.Optimizer):
            with contextlib.suppress(TypeError, ValueError):
                names |= set(inspect.signature(c.__init__).parameters)
    return frozenset(names - _GROUP_COMMON - {"self", "args", "kwargs", "defaults"})


def _group_members(keys: Any) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for k in keys:
        text = f"{k}"
        m = GROUP_MEMBER.match(text) if "param_groups/" in text else None  # the literal first
        if m:
            out.setdefault((m.group(1) or "", m.group(2)), set()).add(m.group(3))
    return out


def _same_optimizers(stored: dict[str, Any], target: Mapping[str, Any], path: str) -> None:
    """Refuse stored param groups of another optimizer class than the target's.

    Loaded into an SGD, an AdamW's groups set the pretraining run's learning rate and weight
    decay and left out ``momentum`` (fine-tuning review 21, M7). Groups are told apart by their
    hyper-parameters: each side holding some the other lacks (``betas`` and ``eps`` against
    ``momentum`` and ``dampening``), among the hyper-parameters torch's optimizers take: one
    side's extra members alone are a newer torch's, and a group's own (a ``name``) tell nothing.
    """
    wanted = _group_members(target)
    if not wanted:
        return
    have = _group_members(stored)
    known = _optimizer_members()  # a group's own members (a "name" to log) tell nothing
    for (head, idx), names in sorted(wanted.items()):
        got = have.get((head, idx))
        if got is None:
            continue
        theirs, ours = (got - names) & known, (names - got) & known
        if theirs and ours:
            raise EntryTargetError(
                f"optimizer {head or '(top)'!r} of {path}: its param group {idx} holds "
                f"{sorted(theirs)[:6]}, the target's holds {sorted(ours)[:6]}: the state of "
                "another optimizer class (an AdamW's into an SGD would set the saved learning "
                "rate and weight decay); build the optimizer the version saved, or leave it out "
                "of the loaded state (a fine-tune builds it fresh)"
            )


def _same_group_count(stored: dict[str, Any], target: Mapping[str, Any], path: str) -> None:
    """Refuse stored param groups beyond the target optimizer's (``strict`` loads only).

    A group added during training (``add_param_group`` for a layer unfrozen at step N) is
    stored; a restarted job that builds its optimizer without it got the other groups and
    trained on with that layer frozen and its optimizer state dropped, listed only among
    ``LoadInfo.unexpected_keys`` (zoo review Z6). torch's ``load_state_dict`` refuses another
    number of groups; so does this, naming the groups and the fix.
    """
    wanted = _group_members(target)
    if not wanted:
        return
    ours: dict[str, set[int]] = {}
    for head, idx in wanted:
        ours.setdefault(head, set()).add(int(idx))
    theirs: dict[str, set[int]] = {}
    for head, idx in _group_members(stored):
        if head in ours:
            theirs.setdefault(head, set()).add(int(idx))
    for head, groups in sorted(theirs.items()):
        extra = sorted(groups - ours[head])
        if not extra:
            continue
        pre = f"{head}/" if head else ""
        named = "; ".join(
            f"group {i}: lr {stored.get(f'{pre}param_groups/{i}/lr')!r}, params "
            f"{_params_of(stored, f'{pre}param_groups/{i}/params')}" for i in extra[:3]
        )
        raise EntryTargetError(
            f"optimizer {head or '(top)'!r} of {path}: the version holds {max(groups) + 1} param "
            f"groups, the target's optimizer {len(ours[head])} ({named}): a group added during "
            "training (add_param_group) must be added again before the restore, or its "
            "parameters train on without it; pass strict=False to load the others "
            "(LoadInfo.unexpected_keys names the rest)"
        )


def _params_of(stored: dict[str, Any], key: str) -> str:
    """A stored group's parameters (names, or ids), the first four."""
    params = [stored[f"{key}/{i}"] for i in range(5) if f"{key}/{i}" in stored]
    return repr(params[:4])[:-1] + (", ...]" if len(params) > 4 else "]")


def load_values(
    entries: EntryReads, flat: FlatState, info: LoadInfo, *, strict: bool
) -> dict[str, Any]:
    """The target's plain (JSON) leaves from the ``VALUES_ENTRY`` entry."""
    if not flat.values:
        return {}
    ck = entries.ck
    stored: Any = {}
    if VALUES_ENTRY in ck.entries:
        stored = entries.get(VALUES_ENTRY)
        if not isinstance(stored, dict):
            raise EntryMissingError(f"entry {VALUES_ENTRY!r} is not an object")
        info.entries_loaded += 1
    _same_optimizers(stored, flat.values, ck.path)
    if strict:
        _same_group_count(stored, flat.values, ck.path)
    loaded, whole = _load_whole(stored, flat, lambda: entries.shapes)
    for k, v in flat.values.items():
        if whole.on_path(k):
            continue  # in a list loaded whole
        if k in stored:
            loaded[k] = decode_json(stored[k])
        elif isinstance(v, list | tuple | dict) and not v:
            continue  # an empty container of the target: versions before 2026-12-03 lack it
        elif strict:
            raise EntryMissingError(
                f"value {k!r} is in the target state but not in entry {VALUES_ENTRY!r} of "
                f"{ck.path}"
                + (instead(ck, k, wanted="value") or "; pass strict=False to keep the current value")
            )
        else:
            info.missing_keys.append(k)
    # Stored values the target does not ask for are reported, as stored tensors are (a config
    # key added between save and load went unnoticed: fidelity review F7).
    info.unexpected_keys += sorted(
        k for k in stored if k not in flat.values and not whole.on_path(k)
    )
    return loaded


def _load_whole(
    stored: dict[str, Any],
    flat: FlatState,
    shapes: Callable[[], RecordedShapes | None] = lambda: None,
) -> tuple[dict[str, Any], KeyTrie]:
    """The lists DCP keeps as one item, and the target's empty containers, loaded whole.

    As ``dcp.load`` replaces such a list, the stored one takes the target's place whatever
    their lengths: a target made fresh (``history = []``) gets the saved history, never the
    target's positions only. Returns the values and a trie of their keys.
    """
    empty = {k: v for k, v in flat.values.items() if isinstance(v, list | tuple | dict) and not v}
    if not flat.lists and not empty:
        return {}, KeyTrie()  # nothing to load whole: no copy of the stored leaves
    tree = JsonTree(stored, shapes=shapes() if empty else None)  # what an empty dict grows
    loaded = {
        k: tree.value(k, node, item=not isinstance(node, dict))
        for k, node in {**flat.lists, **empty}.items()
        if k in tree  # stored: as a leaf, or as leaves below k
    }
    return loaded, KeyTrie(loaded)


def load_entries(
    entries: EntryReads, flat: FlatState, info: LoadInfo, *, strict: bool
) -> list[tuple[str, StateEntry, Any]]:
    """Restore every entry now, except the ``restore_last`` ones: returned with their values."""
    ck = entries.ck
    last: list[tuple[str, StateEntry, Any]] = []
    for key, e in flat.entries.items():
        if key not in ck.entries and (value := _entry_from_values(entries, key, e)) is not None:
            restore_entry(e, value, key, ck)  # a DCP save stored its state_dict() as JSON leaves
            info.entries_loaded += 1
            continue
        if key not in ck.entries:
            if strict:
                raise EntryMissingError(
                    f"entry {key!r} ({e.schema}) is in the target state but not in {ck.path}; "
                    f"pass strict=False to keep the current state"
                )
            info.missing_keys.append(key)
            continue
        stored = ck.entries[key]
        value = entries.get(key, per_rank=stored.scope == "per_rank")
        if value is NO_VALUE:  # policy "drop": the application keeps its fresh state
            continue
        if (stored.schema_id == "pck:rng/1" and stored.world_size_policy == "modulo"
                and info.world_size > info.saved_world_size and info.rank == 0):
            # Documented, yet silent: a new rank r draws what stored rank r mod W drew (async
            # review F21: dropout masks and augmentations correlated across ranks).
            saved, world = info.saved_world_size, info.world_size
            who = (f"rank {saved} continues the RNG streams of saved rank 0" if world == saved + 1
                   else f"ranks {', '.join(spans(list(range(saved, world))))} continue the RNG "
                   f"streams of saved ranks r mod {saved}")
            say(f"load of {key!r}: {who} (policy modulo), so their random draws repeat those "
                "ranks'; reseed them (torch.manual_seed(seed + rank)) where that matters")
        if e.restore_last:
            last.append((key, e, value))
        else:
            restore_entry(e, value, key, ck)
        info.entries_loaded += 1
    return last


def restore_entry(e: StateEntry, value: Any, key: str, ck: Checkpoint) -> None:
    """``e.restore(value)``, a value it refuses named by entry and version."""
    try:
        e.restore(value)
    except EntrySchemaError as exc:  # the same class: a manager tells the caller's own apart
        raise type(exc)(f"entry {key!r} of {ck.path}: {exc.message}", path=exc.path) from exc


def _entry_from_values(entries: EntryReads, key: str, e: StateEntry) -> Any:
    """A global entry's value rebuilt from ``torch.values`` leaves below ``key``, or ``None``.

    ``dcp.save`` of ``{"sched": scheduler}`` stores ``scheduler.state_dict()`` as the leaves
    ``sched/...`` (DCP flattens it); the entry's own capture shapes the rebuilt value.
    """
    if e.scope != "global" or e.restore_last or VALUES_ENTRY not in entries.ck.entries:
        return None
    stored = entries.get(VALUES_ENTRY)
    tree = JsonTree(stored if isinstance(stored, dict) else {})
    if key not in tree:
        return None
    return encode_json(tree.value(key, decode_json(e.capture())), key=key)
