"""``torch.save`` files (``.pt``/``.bin`` state dicts) ↔ the portable format.

The file is a zip; its ``data.pkl`` is interpreted symbolically by
:mod:`portable_ckpt.convert._pickle_scan` (nothing is imported or called — strictly safer than
``torch.load(weights_only=True)``, and it needs no torch), and each tensor's bytes are mapped
(``mmap``, no copy; a tensor under 1 MiB is read) from its storage member one tensor at a time,
so memory stays at one tensor. Each storage member's CRC-32 is checked once, on the bytes read
for the conversion (``PCK-CHECKSUM``: damage is never converted into fresh checksums). Recognised
structure: dicts/OrderedDicts (string or int keys), lists/tuples, tensors (``_rebuild_tensor_v2``
/``v3``, ``nn.Parameter``), ``torch.Size`` and plain JSON scalars. Nested containers are
flattened to dotted keys (``"state.0.exp_avg"``); a list or dict without tensors below it becomes
one ``pck:json/1`` entry. Anything else is reported and skipped.

Files in the legacy (pre-1.6, non-zip) format are refused (``PCK-UNSUPPORTED-VALUE``, with the
re-save that makes them zips): ``torch.load`` of a crafted legacy file corrupts the heap, and
nothing of this module's checks can make that loader safe.

Writing (:func:`write_target`, :mod:`portable_ckpt.convert._torch_export`): one ``torch.save``
file of the nested state (mapped keys) or of a flat ``{key: tensor}`` dict (verbatim), readable
with ``torch.load(path, weights_only=True)``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np

from portable_ckpt.convert._dcp_meta import (
    DICT_CTORS,
    KeyCollisionError,
    NotJsonError,
    json_key,
    symbolic_to_json,
)
from portable_ckpt.convert._model import (
    ChunkSpec,
    ConvertOptions,
    ConvertWarning,
    EntrySpec,
    KeyMode,
    SourcePlan,
    TensorSpec,
    WriteResult,
    name_lost,
)
from portable_ckpt.convert._pickle_scan import (
    Call,
    ExpansionError,
    Global,
    PickleScanError,
    WalkBudget,
    scan_pickle,
)
from portable_ckpt.convert._torchzip import (
    CrcChecks,
    TorchArchive,
    TorchTensorLayout,
    is_tensor_node,
    is_zip,
    load_torch_tensor,
    open_torch_archive,
    tensor_layout,
)
from portable_ckpt.errors import (
    CoverageOverlapError,
    DtypeUnsupportedError,
    FileMissingError,
    LimitError,
    ShardHeaderError,
    UnsupportedValueError,
    UsageError,
)
from portable_ckpt.format.dtypes import DTYPES
from portable_ckpt.format.keys import (
    DCP_ITEMS_ENTRY,
    VALUES_ENTRY,
    DcpPath,
    dcp_items_value,
    encode_json,
    escape_component,
    has_position,
    json_items,
    json_leaves,
    needs_record,
)
from portable_ckpt.storage._posix import file_kind, open_regular

__all__ = [
    "TORCH_INDEX_SUFFIXES",
    "find_torch_files",
    "read_source",
    "read_torch_shards",
    "read_torch_source",
    "write_target",
]


def read_source(src: str, options: ConvertOptions) -> SourcePlan:
    """The registry's reader: :func:`read_torch_source` with the conversion's options.

    ``src`` is a file, a directory holding one ``.pt``/``.pth``/``.bin`` file, or a sharded set
    (``pytorch_model-00001-of-00003.bin`` … with ``pytorch_model.bin.index.json``, as
    ``transformers`` saves weights without safetensors): the directory or its index
    (:func:`read_torch_shards`).
    """
    index, files = find_torch_files(src)
    if index is not None:
        return read_torch_shards(index, options)
    return read_torch_source(
        files[0], strict=options.strict, allow_expand=options.allow_expand, keys=options.keys
    )


#: How the index of a sharded set of ``torch.save`` files ends (``transformers`` writes
#: ``pytorch_model.bin.index.json``; others name theirs after their ``.pt``/``.pth`` shards).
TORCH_INDEX_SUFFIXES = (".bin.index.json", ".pt.index.json", ".pth.index.json")
#: The files a directory source may hold one of (``.ckpt`` only as a file named alone).
_FILE_SUFFIXES = (".pt", ".pth", ".bin")


def find_torch_files(src: str) -> tuple[str | None, list[str]]:
    """Return ``(index path or None, [the one file])`` for a file, index or directory ``src``.

    Raises:
        FileMissingError: a directory without a ``torch.save`` file or an index.
        UsageError: a directory with several files and no index, or several indexes.

    """
    if file_kind(src, what=f"source {src}") == "file":
        return (src, []) if src.endswith(TORCH_INDEX_SUFFIXES) else (None, [src])
    names = sorted(os.listdir(src))
    indexes = [n for n in names if n.endswith(TORCH_INDEX_SUFFIXES)]
    if "pytorch_model.bin.index.json" in indexes:
        return os.path.join(src, "pytorch_model.bin.index.json"), []
    if len(indexes) == 1:
        return os.path.join(src, indexes[0]), []
    if indexes:
        raise UsageError(f"{src} holds several indexes ({', '.join(indexes)}); pass one of "
                         "them as SRC")
    files = [os.path.join(src, n) for n in names
             if n.endswith(_FILE_SUFFIXES) and os.path.isfile(os.path.join(src, n))]
    if len(files) == 1:
        return None, files
    if not files:
        raise FileMissingError(f"{src} holds no torch.save file (.pt, .pth or .bin) and no "
                               "index of one", path=src)
    raise UsageError(
        f"{src} holds {len(files)} torch.save files ({', '.join(os.path.basename(f) for f in files[:3])}"
        f"{', ...' if len(files) > 3 else ''}) but no index of them (pytorch_model.bin.index.json); "
        "pass one file as SRC"
    )


def read_torch_shards(index: str, options: ConvertOptions) -> SourcePlan:
    """Describe a sharded set of ``torch.save`` files as one source, by its index.

    Each file the index's ``weight_map`` names is read as :func:`read_torch_source` reads one
    file; the index is checked against them as an HF index is (a shard missing, a tensor in two
    shards, a tensor the index misplaces or does not list, a listed tensor no shard holds): a
    set that does not add up converts to nothing. Non-tensor values of the shards are kept
    where each has its own entries; two shards giving the same entry are refused.
    """
    from portable_ckpt.convert.hf import _indexed_shards, _load_index

    mapped = options.keys == "mapped"
    # The index names tensors as the state dict did; a flat state dict's names are its keys
    # (one component each under mapped keys, where a "/" in a name is escaped).
    weight_map = {(escape_component(n) if mapped else n): f for n, f in _load_index(index).items()}
    plans: dict[str, SourcePlan] = {}
    for path in _indexed_shards(index, weight_map):
        plan = read_torch_source(path, strict=options.strict, allow_expand=options.allow_expand,
                                 keys=options.keys)  # (a failure closes its own file)
        plan.close()  # planned: its tensors open the file again as they load
        plans[path] = plan
    return _merged(index, weight_map, plans, mapped=mapped)


def _merged(
    index: str, weight_map: dict[str, str], plans: dict[str, SourcePlan], *, mapped: bool
) -> SourcePlan:
    """One source of the shards' plans, by shard path (each checked as a file of its own)."""
    from portable_ckpt.convert.hf import _check_all_stored, _check_placed

    where: dict[str, str] = {}
    entries: dict[str, str] = {}
    tensors: list[TensorSpec] = []
    out_entries: list[EntrySpec] = []
    for path, plan in plans.items():
        for t in plan.tensors:
            if t.key in where:
                raise CoverageOverlapError(
                    f"tensor {t.key!r} is stored in both {where[t.key]} and {path}; each tensor "
                    "must be in exactly one shard", path=path)
            where[t.key] = path
            _check_placed(t.key, path, index, weight_map)
            tensors.append(t)
        for e in plan.entries:
            if e.name in entries:
                raise UnsupportedValueError(
                    f"{index}: {entries[e.name]} and {path} both hold non-tensor values of entry "
                    f"{e.name!r} (the format has one of each entry); convert each file alone",
                    path=path)
            entries[e.name] = path
            out_entries.append(e)
    _check_all_stored(index, weight_map, set(where))
    # A tensor of one shard and a value of another under one key: one file cannot hold both
    # (its dict has one of each key), so the set is inconsistent. Kept, the torch export gave
    # the value alone (the tensor silently gone) and DCP exports dropped one or crashed
    # (reatk31 R1). Mapped, the values are leaves of the one shard's torch.values entry, and a
    # leaf below a tensor's key ("a/k" under "a") is such a clash too.
    values = {e.name: entries[e.name] for e in out_entries}
    if mapped and VALUES_ENTRY in entries:
        leaves = next(e.value for e in out_entries if e.name == VALUES_ENTRY)
        parts = [leaf.split("/") for leaf in leaves]
        values = {"/".join(p[:i]): entries[VALUES_ENTRY] for p in parts for i in range(1, len(p) + 1)}
    for key in sorted(values.keys() & where.keys()):
        raise UnsupportedValueError(
            f"{index}: {where[key]} holds tensor {key!r} and {values[key]} a non-tensor value "
            f"of the same key (the format has one of each key); convert each file alone",
            path=values[key])
    # (every shard's file is closed already: nothing for the merged plan to close)
    return SourcePlan("torch", tensors, out_entries, [w for p in plans.values() for w in p.warnings])


def write_target(
    src: Any, dst: str, options: ConvertOptions, progress: Callable[[int], None]
) -> WriteResult:
    """The registry's writer: one ``torch.save`` file at ``dst`` (imports torch)."""
    from portable_ckpt.convert._torch_export import save_portable_as_torch

    return save_portable_as_torch(src, dst, options=options, progress=progress)


class _Values:
    """Non-tensor values of a source under the key mode: leaves of one entry, or entries.

    Mapped keys also record, as ``torch.dcp_items``, the items whose key alone does not say
    where they lie (below a list position, or a list of plain values), as
    ``portable_ckpt.torch.save`` does: a list stays a list through every target.
    """

    def __init__(self, keys: KeyMode, where: str = "") -> None:
        self.mapped = keys == "mapped"
        self.where = where
        self.paths: dict[str, tuple[Any, ...]] = {}  # each value's key -> its source path
        self.entries: list[EntrySpec] = []
        self.leaves: dict[str, Any] = {}
        self.items: list[DcpPath] = []

    def join(self, prefix: str, comp: str) -> str:
        if self.mapped:
            return f"{prefix}/{escape_component(comp)}" if prefix else escape_component(comp)
        return f"{prefix}.{comp}" if prefix else comp

    def add(self, name: str, value: Any, path: DcpPath, raw: tuple[Any, ...] = ()) -> None:
        shown = raw or path
        if self.mapped:
            leaves = json_leaves(name, value, fqn=name)
            for leaf in leaves:
                if leaf in self.leaves:
                    raise _collision(self.where, leaf, self.paths[leaf], shown, "value")
                self.paths[leaf] = shown
            self.leaves.update(leaves)
            self.items.extend(p for p, item in json_items(value, path) if needs_record(p, item))
        else:
            if name in self.paths:
                raise _collision(self.where, name, self.paths[name], shown, "value")
            self.paths[name] = shown
            self.entries.append(EntrySpec(name, encode_json(value, key=name)))

    def tensor_at(self, path: DcpPath) -> None:
        if self.mapped and has_position(path):
            self.items.append(path)

    def all(self) -> list[EntrySpec]:
        out = list(self.entries)
        if self.leaves:
            out.append(EntrySpec(VALUES_ENTRY, dict(sorted(self.leaves.items()))))
        if self.leaves or self.items:
            out.append(EntrySpec(DCP_ITEMS_ENTRY, dcp_items_value(self.items)))
        return out


def _collision(
    src: str, name: str, first: tuple[Any, ...], second: tuple[Any, ...], what: str
) -> UnsupportedValueError:
    """Two places of the source that become one key (attack review M3).

    The source's content, which no flag can change where both modes collide: the source's
    problem (``PCK-UNSUPPORTED-VALUE``, exit 1), as the same collision inside a value is
    (review rev22 D3).
    """

    def shown(p: tuple[Any, ...]) -> str:
        return "the top level" if not p else "[" + "][".join(repr(c) for c in p) + "]"

    # Paths of different lengths ({"a": {"b": t}} and "a.b") are apart under --keys mapped,
    # whose components stay components; others (1 and "1", "" and "value") collide in both
    # modes (conversion review atkconv2 N8).
    other = ", or convert with --keys mapped" if len(first) != len(second) else ""
    return UnsupportedValueError(
        f"{src}: the source's {what}s at {shown(first)} and {shown(second)} both become the "
        f"key {name!r} (the format has one of each key), so nothing was written: rename one "
        f"in the source{other}",
        path=src,
    )


def _children(node: Any) -> list[tuple[str | int, Any, Any]] | None:
    """Return (DCP path component, child, key as stored) of a container node, or None for a leaf.

    A dict key is a ``str``, a list or tuple position an ``int`` (DCP's object path).
    """
    if isinstance(node, dict):
        return [(json_key(k), v, k) for k, v in node.items()]
    if isinstance(node, Call) and isinstance(node.func, Global) and node.func.qualname in DICT_CTORS:
        if node.args:
            # OrderedDict(pairs): the items are in the constructor's arguments (a custom
            # __reduce__), not SETITEMS; read as no items, a top-level one converted to an
            # empty version while torch.load gives them all (mutation audit 30)
            raise NotJsonError(f"a {node.func.qualname} built from constructor arguments")
        return [(json_key(k), v, k) for k, v in node.setitems]
    if isinstance(node, list | tuple):
        return [(i, v, i) for i, v in enumerate(node)]
    return None


def _unwrap_param(node: Any) -> Any:
    while (
        isinstance(node, Call)
        and isinstance(node.func, Global)
        and node.func.qualname in ("torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state")
        and node.args
    ):
        node = node.args[0]
    return node


class _Walk:
    """The walks over one scanned ``data.pkl``, sharing one :class:`WalkBudget`."""

    def __init__(self, budget: WalkBudget) -> None:
        self.budget = budget
        self._tensor_below: dict[int, bool] = {}  # id(node) -> has a tensor below (memoised)
        self._keep: list[Any] = []  # the nodes of those ids stay alive during the walk

    def has_tensor(self, node: Any, depth: int = 0) -> bool:
        node = _unwrap_param(node)
        hit = self._tensor_below.get(id(node))
        if hit is not None:
            return hit
        self.budget.spend()
        found = is_tensor_node(node)
        if not found and depth <= 200:
            try:
                kids = _children(node)
            except NotJsonError:
                kids = None
            found = any(self.has_tensor(v, depth + 1) for _, v, _ in kids or [])
        if isinstance(node, list | dict | Call):
            self._tensor_below[id(node)] = found
            self._keep.append(node)
        return found


def read_torch_source(
    path: str, *, strict: bool = False, allow_expand: bool = False, keys: KeyMode = "mapped"
) -> SourcePlan:
    """Describe the ``torch.save`` file ``path`` (see the module docstring).

    Args:
        path: The file.
        strict: Fail on items that cannot be converted instead of skipping them.
        allow_expand: Accept tensor views that repeat stored elements (``expand``, zero or
            overlapping strides); they are materialised, so the output can be far larger than
            the file (the conversion's output bound still applies).
        keys: ``"mapped"``: nested dicts become the key rule of ``portable_ckpt.torch`` (JSON
            scalars in the ``torch.values`` entry); ``"verbatim"``: dotted names as stored.

    Raises:
        FileMissingError: the file does not exist.
        DtypeUnsupportedError: a tensor's dtype is outside the format's table.
        ShardHeaderError: the archive is damaged.
        UnsupportedValueError: a view repeats stored elements and ``allow_expand`` is false.
        LimitError: ``data.pkl``'s shared references expand beyond its walk budget.

    """
    fd = open_regular(path, what=f"torch.save file {path}")  # a FIFO is refused, never waited on
    # torch.load takes a file for a zip by its first bytes (a local header), zipfile by its end
    # record: a legacy stream with a zip appended was converted from the zip, while torch.load
    # gives the legacy content (stop 23's attack). Both must agree.
    starts_as_zip = os.pread(fd, 4, 0) == b"PK\x03\x04"
    with os.fdopen(os.dup(fd), "rb") as f:
        zipped = starts_as_zip and is_zip(f)
    if not zipped:
        try:
            if starts_as_zip:  # but no end record
                raise ShardHeaderError(
                    f"{path}: a damaged or truncated torch.save zip (it starts as a zip, but its "
                    "end record is missing): copy or download it again",
                    path=path,
                )
            _refuse_legacy(path, fd)
        finally:
            os.close(fd)
    try:
        archive = open_torch_archive(fd, 0, os.fstat(fd).st_size, where=path)
        plan = _plan(path, fd, archive, strict=strict, allow_expand=allow_expand, keys=keys)
    except BaseException:
        os.close(fd)
        raise
    return plan


def _plan(
    path: str, fd: int, archive: TorchArchive, *, strict: bool, allow_expand: bool, keys: KeyMode
) -> SourcePlan:
    storages = archive.storages
    tensors: list[TensorSpec] = []
    values = _Values(keys, path)
    warnings: list[ConvertWarning] = []
    walker = _Walk(archive.budget(path))
    tensor_paths: dict[str, tuple[Any, ...]] = {}  # each tensor's key -> its source path
    on_path: set[int] = set()  # the containers the walk is inside (a cycle refers to one)
    checks = CrcChecks()  # each storage member's CRC-32 once, however many tensors view it

    source = _File(path, fd)

    def loader(layout: TorchTensorLayout, where: str) -> Callable[[], np.ndarray[Any, Any]]:
        # Small tensors are read, not mapped: a mapping holds a descriptor until the writer
        # drops its batch, and 4,800 small tensors ran out of them (EMFILE, review H2).
        return lambda: source.load(layout, where, checks)

    def add_tensor(name: str, node: Any) -> None:
        where = f"{path} (tensor {name!r})"
        try:
            layout = tensor_layout(node, storages, where=where)
        except DtypeUnsupportedError as exc:
            raise DtypeUnsupportedError(exc.message, path=path) from None
        if layout.repeats_elements and not allow_expand:
            raise UnsupportedValueError(
                f"{where}: a view of shape {list(layout.shape)} with strides "
                f"{list(layout.stride)} repeats stored elements (expand or overlapping strides): "
                f"converting it writes {math.prod(layout.shape)} elements from "
                f"{layout.storage_nbytes} stored bytes; pass allow_expand=True (--allow-expand) "
                "to materialise it",
                path=path,
            )
        nbytes = math.prod(layout.shape) * DTYPES[layout.dtype].itemsize
        chunks = []
        if nbytes:
            chunks.append(ChunkSpec((0,) * len(layout.shape), layout.shape, nbytes, path, loader(layout, where)))
        tensors.append(TensorSpec(name, layout.dtype, layout.shape, chunks))

    def walk(prefix: str, node: Any, depth: int, dcp_path: DcpPath, raw: tuple[Any, ...]) -> None:
        walker.budget.spend()
        node = _unwrap_param(node)
        name = prefix or "value"
        if is_tensor_node(node):
            if name in tensor_paths:
                raise _collision(path, name, tensor_paths[name], raw, "tensor")
            if not values.mapped and name in values.paths:  # {"a.b": 1, "a": {"b": t}}
                raise _collision(path, name, values.paths[name], raw, "item")
            tensor_paths[name] = raw
            add_tensor(name, node)
            values.tensor_at(dcp_path)
            return
        kids = None
        if depth < 64 and (walker.has_tensor(node) or (values.mapped and not prefix)):
            try:
                kids = _children(node)
            except NotJsonError as exc:
                warnings.append(ConvertWarning(name, f"{exc}; skipped"))
                return
        if kids is not None:
            if id(node) in on_path:  # attack review L3: x = [t, x] gave 63 copies of t
                msg = f"{path}: a container inside itself (a cycle), which cannot be converted"
                warnings.append(ConvertWarning(name, f"{msg}; skipped"))
                return
            seen: dict[str | int, Any] = {}
            for k, _, raw_k in kids:
                # Two keys of one dict that become one (1 and "1", or two equal keys the scan
                # keeps apart: torch.load keeps only the last, rev22 re-attack R2): refused.
                if k in seen:
                    raise _collision(path, values.join(prefix, str(k)), (*raw, seen[k]),
                                     (*raw, raw_k), "key")
                seen[k] = raw_k
            on_path.add(id(node))
            for k, v, raw_k in kids:
                walk(values.join(prefix, str(k)), v, depth + 1, (*dcp_path, k), (*raw, raw_k))
            on_path.discard(id(node))
            return
        try:
            value = symbolic_to_json(node, budget=walker.budget)
        except KeyCollisionError as exc:
            raise UnsupportedValueError(
                f"{path}: value {name!r} holds {exc}, so nothing was written: change one of "
                "the keys in the source",
                path=path,
            ) from None
        except NotJsonError as exc:
            warnings.append(ConvertWarning(name, f"{path}: {exc} is not convertible; skipped"))
            return
        if not values.mapped and name in tensor_paths:
            # Dotted verbatim names: {"a": {"b": t}, "a.b": 1} gave tensor and entry "a.b",
            # and the torch export kept the value alone (reatk31 R2).
            raise _collision(path, name, tensor_paths[name], raw, "item")
        values.add(name, value, dcp_path, raw)

    try:
        walk("", archive.root, 0, (), ())
    except ExpansionError as exc:
        raise LimitError(str(exc), path=path) from None
    except RecursionError:
        raise ShardHeaderError(f"{path}: data.pkl is nested too deeply", path=path) from None
    if strict:
        _refuse_skipped(path, warnings)
    return SourcePlan("torch", tensors, values.all(), warnings, close=source.close)


class _File:
    """A source file's descriptor, open while the file is planned.

    A file converted alone keeps it until the conversion closes it. Once it is closed (a
    shard of a set, right after it is planned), each tensor's load opens the file again: every
    shard of a 1,100-file set open at once ran out of descriptors (reatk31 R3), where an HF
    set opens a shard per tensor.
    """

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd = fd

    def load(self, layout: TorchTensorLayout, where: str, checks: CrcChecks) -> np.ndarray[Any, Any]:
        if self._fd >= 0:
            return load_torch_tensor(self._fd, layout, where=where, file=self.path, checks=checks)
        fd = open_regular(self.path, what=f"torch.save file {self.path}")  # a FIFO is refused
        try:
            return load_torch_tensor(fd, layout, where=where, file=self.path, checks=checks)
        finally:
            os.close(fd)  # a mapped tensor keeps its own duplicate

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)


def _refuse_skipped(path: str, warnings: list[ConvertWarning]) -> None:
    """--strict refuses what a plain run skips (docs/convert.md), every such item at once.

    The walk goes on past the first (review 26: one item named per run, a fix-and-retry loop
    on a file with many).
    """
    lost = [w for w in warnings if w.kind == "skipped"]
    if not lost:
        return
    raise UnsupportedValueError(
        f"{path}: {len(lost)} item(s) are not convertible, and --strict refuses what a "
        f"conversion would skip: {name_lost(lost, source=path)}. Drop --strict to skip them, or change them "
        "in the source",
        path=path,
    )


#: The first pickle of a legacy (pre-1.6, non-zip) torch.save file.
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def _refuse_legacy(path: str, fd: int) -> NoReturn:
    """Refuse a file that is no zip: a legacy (pre-1.6) torch.save file, or none at all.

    Legacy files went to ``torch.load(weights_only=True)``, which no check before it can make
    safe: its legacy loader resizes a storage that a view of it still points into, and a
    crafted file of 406 bytes wrote its own bytes into freed heap memory (glibc aborted);
    others crashed, ran for hours (keys chosen to share a hash; a tar header it tries first),
    or gave heap contents as tensor values (conversion attack on the legacy path, stop 23).
    The first pickle tells a legacy file (torch's magic number) from other files, for the
    message; nothing else of it is read.
    """
    # The magic number's pickle is 15 bytes; the scan stops at its STOP. (pread allocates
    # what it is asked for: ask for no more than is there.)
    head = os.pread(fd, min(os.fstat(fd).st_size, 1024), 0)
    try:
        magic = scan_pickle(head, max_ops=None)
    except PickleScanError:
        magic = None
    if magic != _LEGACY_MAGIC:
        raise ShardHeaderError(
            f"{path}: not a torch.save file: neither a zip nor a legacy file (which starts with "
            "torch's magic number)",
            path=path,
        )
    raise UnsupportedValueError(
        f"{path}: a legacy (pre-1.6, non-zip) torch.save file, which convert does not read: "
        "torch's loader for that format cannot be made safe against a crafted file. If you "
        "trust the file, save it again in the zip format with torch (python -c \"import torch; "
        "torch.save(torch.load('OLD', weights_only=True), 'NEW')\"), then convert NEW",
        path=path,
    )
