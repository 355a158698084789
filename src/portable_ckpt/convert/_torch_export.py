"""portable → one ``torch.save`` file that ``torch.load(path, weights_only=True)`` reads.

With mapped keys the file holds the nested state the keys describe (the inverse of
:mod:`portable_ckpt.convert.torch_save`'s reading and of ``portable_ckpt.torch.save``): a key's
components are nested dicts; a container whose components are ``0..n-1`` is a list when the
version's ``torch.dcp_items`` record says so (``param_groups``, ``betas`` — tuples come back as
lists), or, for a version without the record, when it holds no tensor; other decimal
components are int dict keys (an optimizer's ``state``), every other component a str key.
JSON leaves come from the ``torch.values`` entry and the other global entries. With verbatim keys
the file is a flat ``{key: tensor}`` dict plus one item per global entry.

Memory: each tensor is assembled in bounded C-order slabs into a scratch file beside the target
and mapped (``torch.from_file``), so ``torch.save`` copies page-cache pages, not a second copy of
the state in anonymous memory. The file appears with one ``rename`` after an ``fsync``.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from portable_ckpt.convert._model import (
    ConvertOptions,
    ConvertWarning,
    WriteResult,
    fail_if_lost,
    refuse_shared_keys,
)
from portable_ckpt.convert._publish import open_staged, staged
from portable_ckpt.convert.hf import HF_METADATA_ENTRY, slabs
from portable_ckpt.errors import UnsupportedValueError
from portable_ckpt.format.keys import (
    DCP_ITEMS_ENTRY,
    LIST_ROOM,
    VALUES_ENTRY,
    decode_json,
    escape_component,
    json_leaves,
    list_room,
    portable_key,
    recorded_items,
    split_key,
)
from portable_ckpt.torch.state import without_scheduler_class

__all__ = ["nest", "save_portable_as_torch"]

_SLAB = 64 << 20


def save_portable_as_torch(
    ck: Any, dst: str, *, options: ConvertOptions, progress: Callable[[int], None]
) -> WriteResult:
    """Write (an export view of) a portable version as the ``torch.save`` file ``dst``.

    Raises:
        UnsupportedValueError: keys that cannot nest (a key below another key's leaf), or with
            per-rank entries (a file has no ranks) unless ``options.drop_unsupported``.

    """
    warnings = [
        ConvertWarning(name, "per-rank entry: a torch.save file has no ranks; skipped")
        for name in sorted(ck.entries)
        if ck.entries[name].scope != "global"
    ]
    fail_if_lost(warnings, options, dst, target="torch")
    written = 0
    with staged(dst, directory=False) as tmp:
        # A private directory of a random name (0700): `<tmp>.tensors` told another user of
        # the directory the staged file's name (tenant review F4). It lies in the staging
        # directory beside the staged file, so what a kill leaves is swept with it (review M4).
        scratch = tempfile.mkdtemp(prefix=".pck-export-", dir=os.path.dirname(tmp))
        try:
            values = _values(ck, mapped=options.keys == "mapped")
            if options.keys != "mapped":
                refuse_shared_keys(values, ck.tensors, "a flat dict has one of each key")
            tensors: dict[str, torch.Tensor] = {}
            for i, key in enumerate(sorted(ck.tensors)):
                tensors[key] = _mapped_tensor(ck, ck.tensors[key], os.path.join(scratch, str(i)))
                written += ck.tensors[key].nbytes
                progress(ck.tensors[key].nbytes)
            decimal: list[str] = []
            state = (
                nest(tensors, values, kinds=_kinds(ck), decimal=decimal)
                if options.keys == "mapped"
                else {**tensors, **values}
            )
            warnings += [
                ConvertWarning(
                    k or "<top>", "a dict keyed by decimal strings: the version does not record "
                    "whether its keys were ints, so they are strings here (an optimizer's state "
                    "is keyed by int)", kind="note")
                for k in decimal
            ]
            with open_staged(tmp) as f, _interrupts_kept() as caught:
                try:
                    torch.save(state, f)  # a full disk met here: convert's _write_failed says so
                except (RuntimeError, OSError):
                    if caught:  # torch's writer made the Ctrl-C a short write (review N10)
                        raise caught[0].with_traceback(None) from None
                    raise
            del state, tensors
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return WriteResult(len(ck.tensors), written, exported_entries(ck, options), warnings)


def exported_entries(ck: Any, options: ConvertOptions) -> int:
    """The entries an export to torch.save or DCP carries.

    The global ones (per-rank entries have no place there), less an HF source's metadata where
    keys are mapped (it is the safetensors files', not the job's), and less the record of the
    values' DCP items: it is how the values are cut, no value of its own, and counting it said
    "2 entries" of a state whose one value was left out (reatk30).
    """
    return sum(
        1
        for n in ck.entries
        if ck.entries[n].scope == "global"
        and n != DCP_ITEMS_ENTRY
        and not (options.keys == "mapped" and n == HF_METADATA_ENTRY)
    )


@contextlib.contextmanager
def _interrupts_kept() -> Iterator[list[BaseException]]:
    """Yield the interrupts (Ctrl-C, the CLI's SIGTERM) that arrive meanwhile.

    A ``KeyboardInterrupt`` raised while torch's C++ zip writer calls back into Python comes
    out of ``torch.save`` as a short write ("unexpected pos"): the CLI said "disk full", exit
    75, not "interrupted", 130 (conversion review atkconv2 N10). The Python-level handlers in
    place are wrapped to note what they raise; only the main thread can set handlers.
    """
    caught: list[BaseException] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    before: dict[int, Any] = {}

    def noting(signum: int, frame: Any) -> None:
        try:
            before[signum](signum, frame)
        except BaseException as exc:
            caught.append(exc)
            raise

    for sig in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(sig)
        if callable(handler):
            before[sig] = handler
            signal.signal(sig, noting)
    try:
        yield caught
    finally:
        for signum, prev in before.items():
            signal.signal(signum, prev)


def _mapped_tensor(ck: Any, info: Any, path: str) -> torch.Tensor:
    """Assemble a tensor into ``path`` in slabs and map it (no copy in anonymous memory)."""
    tdtype = getattr(torch, info.dtype)
    numel = math.prod(info.shape)
    if numel == 0:
        return torch.empty(tuple(info.shape), dtype=tdtype)
    with open(path, "wb") as f:
        for arr in slabs(ck, info, _SLAB):
            f.write(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data)
    return torch.from_file(path, shared=False, size=numel, dtype=tdtype).reshape(tuple(info.shape))


def _values(ck: Any, *, mapped: bool) -> dict[str, Any]:
    """The JSON leaves of the global entries (``torch.values`` leaves by their own keys).

    Mapped, the safetensors ``__metadata__`` an HF source left is not written: it describes
    the HF files, and ``load_state_dict`` of the result would refuse it as an unexpected key.
    """
    out: dict[str, Any] = {}
    for name in sorted(ck.entries):
        if ck.entries[name].scope != "global" or name == DCP_ITEMS_ENTRY:
            continue  # torch.dcp_items describes DCP's items, it is no part of the state
        if mapped and name == HF_METADATA_ENTRY:
            continue
        value = ck.entry(name)
        if ck.entries[name].schema_id == "pck:lr-scheduler/1":
            value = without_scheduler_class(value)
        if name == VALUES_ENTRY and isinstance(value, dict):
            out.update({k: decode_json(v) for k, v in value.items()})
        else:
            out[name] = decode_json(value)
    return out


def _kinds(ck: Any) -> tuple[set[str], set[str]] | None:
    """From ``torch.dcp_items``: the keys of the lists above items, and of the items.

    ``None`` for a version without the record (the shape is guessed from the keys).
    """
    record = recorded_items(ck)
    if record is None:
        return None
    lists = {portable_key(p[:i]) for p in record.values() for i in range(1, len(p)) if type(p[i]) is int}
    return lists, set(record) - set(ck.tensors)


#: The deepest nesting a torch target is built with (the pickler and ``_finish`` recurse per
#: level; state dicts nest a handful of levels, the key rule allows ~500).
MAX_NESTING = 100


def nest(
    tensors: dict[str, Any],
    values: dict[str, Any],
    *,
    kinds: tuple[set[str], set[str]] | None = None,
    decimal: list[str] | None = None,
) -> dict[Any, Any]:
    """Build the nested state that mapped keys describe (see the module docstring).

    ``decimal`` receives the keys of the dicts with decimal keys left as strings (every dict's
    but an optimizer's ``state``).

    ``kinds`` (the version's ``torch.dcp_items``: keys of the lists above items, keys of the
    items) says which containers were lists: a container keyed ``0..n-1`` outside every item
    and not such a list is a dict. Without it, and inside items (lists of plain values), the
    keys ``0..n-1`` make a list.

    Raises:
        UnsupportedValueError: a key lies below another key's leaf (``a`` and ``a/b``).

    """
    tree: dict[str, Any] = {}
    leaves = {k: v for key, val in values.items() for k, v in _split(key, val)}
    # Containers a stored JSON value holds as arrays: lists, whatever the keys' record says
    # (an LR scheduler's base_lrs came back {"0": ...}: fine-tuning review F2).
    arrays: set[str] = set()
    for key, val in values.items():
        _arrays(key, val, arrays)
    both = leaves.keys() & tensors.keys()
    if both:
        raise UnsupportedValueError(
            f"key {min(both)!r} is both a tensor and a value; export with --keys verbatim (keys='verbatim')"
        )
    leaves.update(tensors)
    for key, leaf in leaves.items():
        node = tree
        parts = split_key(key)
        if len(parts) > MAX_NESTING:
            raise UnsupportedValueError(
                f"key {key if len(key) <= 60 else key[:60] + '…'!r} nests {len(parts)} levels, more than the {MAX_NESTING} a "
                "torch.save file holds here (torch.save recurses once per level); export with "
                "--keys verbatim (keys='verbatim') for a flat dict"
            )
        for i, p in enumerate(parts[:-1]):
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict) or _is_leaf(nxt):
                raise UnsupportedValueError(
                    f"key {key!r} lies below the value {'/'.join(parts[: i + 1])!r}; export with "
                    "--keys verbatim (keys='verbatim')"
                )
            node = nxt
        if parts[-1] in node:
            raise UnsupportedValueError(f"key {key!r} is both a value and a container; export "
                                        "with --keys verbatim (keys='verbatim')")
        node[parts[-1]] = _Leaf(leaf)
    out = _finish(tree, (), kinds, False, [LIST_ROOM], decimal=decimal, arrays=arrays)
    return out if isinstance(out, dict) else dict(enumerate(out))


def _arrays(key: str, value: Any, out: set[str], depth: int = 0) -> None:
    """Add the keys of the non-empty JSON arrays in ``value`` (stored at ``key``) to ``out``."""
    if depth > MAX_NESTING:
        return  # nest() refuses such a key anyway
    if isinstance(value, list) and value:
        out.add(key)
        for i, v in enumerate(value):
            _arrays(f"{key}/{i}", v, out, depth + 1)
    elif isinstance(value, dict):
        for k, v in value.items():
            _arrays(f"{key}/{escape_component(k)}", v, out, depth + 1)


def _split(key: str, value: Any) -> Iterator[tuple[str, Any]]:
    """A stored JSON leaf, or an entry's container value split into leaves."""
    if isinstance(value, dict | list) and value:
        yield from json_leaves(key, value, fqn=key).items()
    else:
        yield key, value


class _Leaf:
    """A finished value in the tree (a tensor or a JSON value), never descended into."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _is_leaf(node: Any) -> bool:
    return isinstance(node, _Leaf)


def _finish(
    node: Any,
    path: tuple[str, ...],
    kinds: tuple[set[str], set[str]] | None,
    in_item: bool,
    room: list[int],
    int_keys: bool = False,
    decimal: list[str] | None = None,
    arrays: set[str] | frozenset[str] = frozenset(),
) -> Any:
    """The finished value of ``node``; ``room``: what recorded lists may still add in holes.

    ``int_keys``: ``node`` is an optimizer's ``state`` (a sibling of ``param_groups``), keyed
    by parameter index as ``torch.optim`` makes it. Only there do decimal keys become ints: the
    format does not record a key's type, and every decimal key of any dict came back an int
    (``{"0": ...}`` became ``{0: ...}``: odd-states review O3).
    """
    if isinstance(node, _Leaf):
        return node.value
    key = "/".join(escape_component(c) for c in path)
    in_item = in_item or (kinds is not None and key in kinds[1])
    optimizer = "param_groups" in node
    kids = {
        c: _finish(v, (*path, c), kinds, in_item, room, optimizer and c == "state", decimal,
                   arrays)
        for c, v in node.items()
    }
    positions = set(kids) == {str(i) for i in range(len(kids))}
    if positions and key in arrays:
        return [kids[str(i)] for i in range(len(kids))]  # a JSON array of a stored value
    known = kinds is not None and not in_item
    ints = {c: int(c) for c in kids if c.isdecimal() and str(int(c)) == c}
    if known and kinds is not None and key in kinds[0] and len(ints) == len(kids):
        # A recorded list: positions nothing was stored at are None, as DCP's set_element
        # leaves them, within the room the DCP reader gives a record's lists (LIST_ROOM).
        top = max(ints.values())
        room[0] += list_room(len(ints), top)
        if room[0] < 0:
            raise UnsupportedValueError(
                f"the version records {key!r} as a list with position {top}, but holds "
                f"{len(ints)} of its positions: with the version's other lists, more holes than "
                f"the {LIST_ROOM:,} a load fills; export with --keys verbatim (keys='verbatim')"
            )
        out: list[Any] = [None] * (top + 1)
        for c, v in kids.items():
            out[ints[c]] = v
        return out
    if positions and not known and not _holds_tensor(kids.values()):
        return [kids[str(i)] for i in range(len(kids))]
    if int_keys:
        return {ints.get(c, c): v for c, v in kids.items()}
    if ints and decimal is not None:
        decimal.append(key)
    return kids


def _holds_tensor(values: Any) -> bool:
    for v in values:
        if isinstance(v, torch.Tensor):
            return True
        if isinstance(v, dict) and _holds_tensor(v.values()):
            return True
        if isinstance(v, list) and _holds_tensor(v):
            return True
    return False
