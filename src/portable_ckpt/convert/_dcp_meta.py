"""Read DCP's ``.metadata`` and byte items without torch and without running pickle code.

``torch.distributed.checkpoint`` (``FileSystemWriter``) pickles a
``torch.distributed.checkpoint.metadata.Metadata`` into ``.metadata``. This module interprets that
pickle with the symbolic scanner of :mod:`portable_ckpt.convert._pickle_scan` (nothing is imported
or called) and maps the inert records onto plain data (:class:`DcpMetadata`):

* ``state_dict_metadata``: fqn → :class:`DcpTensor` (torch dtype name, global size, chunks as
  offsets/sizes) or :class:`DcpBytes`;
* ``storage_data``: ``(fqn, chunk offsets or None)`` — the identity of a ``MetadataIndex``, whose
  ``index`` hint takes no part in equality — → :class:`DcpStorage` (relative path, offset,
  length, stream transform descriptors).

Only the globals of :data:`METADATA_GLOBALS` may appear (DCP's metadata classes across torch
versions — including ``TensorProperties`` from ``torch.distributed._shard.sharded_tensor.metadata``
of torch ≤ 2.0 — ``_StorageInfo``, ``torch.Size``, torch dtypes, ``torch.serialization._get_layout``,
``collections.OrderedDict``, ``pathlib`` paths of ``StorageMeta.checkpoint_id`` and the protocol 0/1
object constructor ``copyreg._reconstructor``). Any other global is refused with
``PCK-UNSUPPORTED-VALUE`` naming the file and the global, before anything is written; a malformed,
truncated or unexpectedly shaped pickle gives ``PCK-SHARD-HEADER``.

Byte items (``BytesStorageMetadata``) are ``torch.save`` zips; :func:`decode_byte_item` interprets
their ``data.pkl`` the same way and returns JSON data (``None``, bools, ints, finite floats,
strings, and lists/tuples/dicts — string or int keys, ``OrderedDict`` — of these; ``torch.Size``
becomes a list), or raises :class:`NotJsonError` with the reason (e.g. a set, a tensor, a bytes
value, or any other class).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from portable_ckpt.convert._model import short_text
from portable_ckpt.convert._pickle_scan import (
    CONSUMED,
    Call,
    ExpansionError,
    Global,
    OpaqueKey,
    PickleGlobalError,
    PickleScanError,
    Resolved,
    WalkBudget,
    scan_pickle,
)
from portable_ckpt.errors import (
    CheckpointError,
    ChecksumError,
    FileSizeError,
    LimitError,
    ShardHeaderError,
    UnsupportedValueError,
)
from portable_ckpt.format.manifest import MAX_NDIM
from portable_ckpt.storage._posix import read_regular

__all__ = [
    "DICT_CTORS",
    "METADATA_GLOBALS",
    "DcpBytes",
    "DcpChunk",
    "DcpMetadata",
    "DcpStorage",
    "DcpTensor",
    "KeyCollisionError",
    "NotJsonError",
    "decode_byte_item",
    "json_key",
    "parse_dcp_metadata",
    "read_dcp_metadata",
    "symbolic_to_json",
]

#: Largest ``.metadata`` read (a 1M-chunk checkpoint's metadata is ~150 MB).
MAX_METADATA_BYTES = 1 << 30

_MD = "torch.distributed.checkpoint.metadata"
_SHARD_MD = "torch.distributed._shard.sharded_tensor.metadata"
_FS = "torch.distributed.checkpoint.filesystem"

#: torch dtype attribute names (torch 1.13 … 2.13); the format's own table is narrower
#: (:data:`portable_ckpt.convert._torchzip.TORCH_DTYPE_NAMES`): others give PCK-DTYPE-UNSUPPORTED.
TORCH_DTYPE_ATTRS = frozenset(
    """bfloat16 bit bits16 bits1x8 bits2x4 bits4x2 bits8 bool cdouble cfloat chalf complex128
    complex32 complex64 double float float16 float32 float4_e2m1fn_x2 float64 float8_e4m3fn
    float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz float8_e8m0fnu half int int1 int16 int2 int3 int32
    int4 int5 int6 int64 int7 int8 long qint32 qint8 quint2x4 quint4x2 quint8 short uint1 uint16
    uint2 uint3 uint32 uint4 uint5 uint6 uint64 uint7 uint8""".split()
)

_PATH_CLASSES = ("PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath", "Path")

#: Every global a DCP ``.metadata`` pickle may reference.
METADATA_GLOBALS = frozenset(
    {
        f"{_MD}.Metadata",
        f"{_MD}.TensorStorageMetadata",
        f"{_MD}.ChunkStorageMetadata",
        f"{_MD}.BytesStorageMetadata",
        f"{_MD}.TensorProperties",
        f"{_MD}.MetadataIndex",
        f"{_MD}.StorageMeta",
        f"{_MD}._MEM_FORMAT_ENCODING",
        f"{_SHARD_MD}.TensorProperties",
        f"{_SHARD_MD}.MEM_FORMAT_ENCODING",
        f"{_FS}._StorageInfo",
        "torch.Size",
        "torch.serialization._get_layout",
        "collections.OrderedDict",
        "copyreg._reconstructor",
        "builtins.object",
        *(f"torch.{d}" for d in TORCH_DTYPE_ATTRS),
        *(f"pathlib.{c}" for c in _PATH_CLASSES),
        *(f"pathlib._local.{c}" for c in _PATH_CLASSES),
    }
)

DICT_CTORS = ("collections.OrderedDict", "builtins.dict")
_MAX_DEPTH = 64


@dataclass(frozen=True, slots=True)
class DcpChunk:
    """One stored chunk of a DCP tensor: its box in the global tensor."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]


@dataclass(frozen=True)
class DcpTensor:
    """A tensor of the DCP state dict.

    Attributes:
        dtype: the torch dtype's attribute name (``"float32"``, ``"bfloat16"``, ...).
        size: the global shape.
        chunks: the stored chunks, in ``.metadata`` order (their position is the
            ``MetadataIndex.index`` hint).

    """

    dtype: str
    size: tuple[int, ...]
    chunks: tuple[DcpChunk, ...]


@dataclass(frozen=True)
class DcpBytes:
    """A non-tensor item of the DCP state dict (stored as a ``torch.save`` zip)."""


@dataclass(frozen=True, slots=True)
class DcpStorage:
    """Where one item is stored: ``[offset, offset + length)`` of ``relative_path``."""

    relative_path: str
    offset: int
    length: int
    transforms: tuple[str, ...] = ()


@dataclass
class DcpMetadata:
    """The plain content of a DCP ``.metadata`` (see the module docstring)."""

    state_dict_metadata: dict[str, DcpTensor | DcpBytes]
    storage_data: dict[tuple[str, tuple[int, ...] | None], DcpStorage]
    version: str | None = None
    #: fqn → the item's object path in the saved state (``planner_data`` of DCP's default
    #: planner, which flattened the state); empty when the planner recorded none.
    paths: dict[str, tuple[str | int, ...]] = field(default_factory=dict)

    def storage_for(self, fqn: str, offsets: tuple[int, ...] | None = None) -> DcpStorage | None:
        """Return where item ``fqn`` (the tensor chunk at ``offsets``) is stored, if recorded."""
        return self.storage_data.get((fqn, offsets))


class NotJsonError(ValueError):
    """A byte item's value is not JSON data (the message says what it is)."""


class KeyCollisionError(NotJsonError):
    """Two keys of one dict (``1`` and ``"1"``) become one JSON key: a value would be lost."""

    def __init__(self, first: Any, second: Any, key: str) -> None:
        self.first, self.second, self.key = first, second, key
        super().__init__(
            f"a dict whose keys {short_text(repr(first))} and {short_text(repr(second))} both become the "
            f"key {short_text(repr(key))} (JSON keys are strings: one value would be lost)"
        )


class _Bad(ValueError):
    """The pickle is well formed but not shaped like DCP metadata."""


# -- .metadata --------------------------------------------------------------------------------


def read_dcp_metadata(path: str) -> DcpMetadata:
    """Read and interpret the DCP ``.metadata`` file at ``path`` (see :func:`parse_dcp_metadata`).

    Raises:
        FileMissingError: ``path`` does not exist.
        LimitError: the file is larger than :data:`MAX_METADATA_BYTES`.
        StorageError: it cannot be read.
        UnsupportedValueError, ShardHeaderError: see :func:`parse_dcp_metadata`.

    """
    # Below its directory, O_NONBLOCK + fstat: a FIFO named .metadata is refused, not waited on.
    data = read_regular(
        os.path.basename(path), below=os.path.dirname(path) or ".", max_size=MAX_METADATA_BYTES,
        what=path,
    )
    return parse_dcp_metadata(data, path=path)


def parse_dcp_metadata(data: bytes, *, path: str) -> DcpMetadata:
    """Interpret the bytes of a DCP ``.metadata`` pickle without executing it.

    Args:
        data: the file's content.
        path: the file, for messages.

    Returns:
        The plain metadata.

    Raises:
        UnsupportedValueError: the pickle references a global outside :data:`METADATA_GLOBALS`
            (``PCK-UNSUPPORTED-VALUE``; the message names the file and the global).
        ShardHeaderError: the pickle is malformed or truncated, or is not a DCP ``Metadata``
            written by ``FileSystemWriter`` (``PCK-SHARD-HEADER``).

    """
    try:
        root = scan_pickle(
            data,
            allowed_globals=METADATA_GLOBALS,
            max_ops=None,
            unwrap_calls=("torch.Size",),
            build_hooks=_BUILD_HOOKS,
        )
    except PickleGlobalError as exc:
        raise UnsupportedValueError(
            f"{path} references the Python global {exc.qualname}, which is not one a DCP "
            "FileSystemWriter .metadata contains (DCP's metadata classes, _StorageInfo, "
            "torch.Size, torch dtypes, OrderedDict, pathlib paths); refusing to read it",
            path=path,
        ) from None
    except PickleScanError as exc:
        raise ShardHeaderError(
            f"{path} is not a readable DCP metadata pickle ({exc}); the file is damaged or "
            "truncated, re-copy the checkpoint",
            path=path,
        ) from None
    try:
        # Each chunk, item and storage record appears about once per ~40 bytes of a real file.
        budget = WalkBudget(len(data), what=f"{path} ({len(data)} bytes)", per_byte=4)
        return _metadata(root, budget)
    except ExpansionError as exc:
        raise LimitError(str(exc), path=path) from None
    except _TooManyDims as exc:
        raise LimitError(f"{path}: {exc}", path=path) from None
    except _Bad as exc:
        raise ShardHeaderError(f"{path}: unexpected DCP metadata structure: {exc}", path=path) from None
    except RecursionError:
        raise ShardHeaderError(f"{path}: DCP metadata nested too deeply", path=path) from None


def _describe(node: Any) -> str:
    if node is CONSUMED:
        return "a consumed object state (an object's __dict__ referenced again)"
    if isinstance(node, Call):
        return f"object {node.func.qualname}" if isinstance(node.func, Global) else "an object"
    if isinstance(node, Global):
        return f"reference to {node.qualname}"
    return f"value of type {type(node).__name__}"


def _instance(node: Any, *classes: str) -> tuple[str, dict[str, Any], tuple[Any, ...]]:
    """Return ``(qualname, state dict, constructor args)`` of an object record of ``classes``."""
    if not isinstance(node, Call) or not isinstance(node.func, Global):
        raise _Bad(f"expected {' or '.join(classes)}, found {_describe(node)}")
    qual = node.func.qualname
    args = node.args
    if qual == "copyreg._reconstructor":  # protocols 0/1: _reconstructor(cls, object, None)
        if not args or not isinstance(args[0], Global):
            raise _Bad("malformed copyreg._reconstructor call")
        qual, args = args[0].qualname, ()
    if qual not in classes:
        raise _Bad(f"expected {' or '.join(classes)}, found {_describe(node)}")
    state = node.state
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
        merged = dict(state[0]) if isinstance(state[0], dict) else {}  # (dict state, slot state)
        merged.update(state[1])
        return qual, merged, args
    if state is None:
        return qual, {}, args
    if isinstance(state, dict):
        return qual, state, args
    return qual, {"__state__": state}, args


def _mapping(node: Any, what: str) -> list[tuple[Any, Any]]:
    if isinstance(node, dict):
        return list(node.items())
    if (
        isinstance(node, Call)
        and isinstance(node.func, Global)
        and node.func.qualname in DICT_CTORS
        and not node.args
    ):
        return list(node.setitems)
    raise _Bad(f"{what} is {_describe(node)}, not a dict")


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Bad(f"{what} is {_describe(value)}, not an integer")
    return value


_TORCH_SIZE = Global("torch", "Size")


class _TooManyDims(ValueError):
    """A shape of more dimensions than the format allows (:data:`MAX_NDIM`)."""


def _size(node: Any, what: str) -> tuple[int, ...]:
    """``torch.Size((...))`` (or a plain tuple/list) of at most 64 non-negative ints."""
    if type(node) is Call and node.func == _TORCH_SIZE:
        if len(node.args) != 1:
            raise _Bad(f"{what}: torch.Size with {len(node.args)} arguments")
        node = node.args[0]
    if isinstance(node, tuple | list) and len(node) > MAX_NDIM:
        # before any walk over it (conversion review atkconv2 N1): one shape shared by many
        # tensors through memo references cost tensors x rank
        raise _TooManyDims(
            f"{what} has {len(node):,} dimensions, above the format's limit of {MAX_NDIM}: "
            "the .metadata is damaged"
        )
    if type(node) is not tuple:
        if not isinstance(node, tuple | list):
            raise _Bad(f"{what} is {_describe(node)}, not a torch.Size")
        node = tuple(node)
    for v in node:
        if type(v) is not int:
            _int(v, what)
    out: tuple[int, ...] = node
    if out and min(out) < 0:
        raise _Bad(f"{what} has a negative entry {list(out)}")
    return out


def _dtype(props: Any, fqn: str) -> str:
    _, state, _ = _instance(props, f"{_MD}.TensorProperties", f"{_SHARD_MD}.TensorProperties")
    if "__state__" in state:  # __getstate__: (dtype, layout, requires_grad, memory_format, pin)
        st = state["__state__"]
        if not isinstance(st, tuple) or not st:
            raise _Bad(f"tensor {fqn!r}: malformed TensorProperties state")
        dtype = st[0]
    elif "dtype" in state:
        dtype = state["dtype"]
    else:
        raise _Bad(f"tensor {fqn!r}: TensorProperties without a dtype")
    if not isinstance(dtype, Global) or dtype.module != "torch":
        raise _Bad(f"tensor {fqn!r}: dtype is {_describe(dtype)}")
    return dtype.name


def _tensor(node: Any, fqn: str, budget: WalkBudget) -> DcpTensor:
    _, state, _ = _instance(node, f"{_MD}.TensorStorageMetadata")
    for key in ("properties", "size", "chunks"):
        if key not in state:
            raise _Bad(f"tensor {fqn!r}: TensorStorageMetadata without {key!r}")
    size = _size(state["size"], f"tensor {fqn!r} size")
    chunks_node = state["chunks"]
    if not isinstance(chunks_node, list | tuple):
        raise _Bad(f"tensor {fqn!r}: chunks is {_describe(chunks_node)}, not a list")
    budget.spend(len(chunks_node))  # a chunk list shared by many tensors is charged each time
    chunks = []
    rank = len(size)
    for ch in chunks_node:
        if type(ch) is DcpChunk:  # resolved by _hook_chunk
            if len(ch.offsets) != rank:
                raise _Bad(
                    f"tensor {fqn!r}: chunk {list(ch.offsets)}+{list(ch.sizes)} has the wrong "
                    f"rank for size {list(size)}"
                )
            chunks.append(ch)
            continue
        _, cst, _ = _instance(ch, f"{_MD}.ChunkStorageMetadata")
        if "offsets" not in cst or "sizes" not in cst:
            raise _Bad(f"tensor {fqn!r}: ChunkStorageMetadata without offsets/sizes")
        offsets = _size(cst["offsets"], f"tensor {fqn!r} chunk offsets")
        sizes = _size(cst["sizes"], f"tensor {fqn!r} chunk sizes")
        if len(offsets) != len(size) or len(sizes) != len(size):
            raise _Bad(
                f"tensor {fqn!r}: chunk {list(offsets)}+{list(sizes)} has the wrong rank for "
                f"size {list(size)}"
            )
        chunks.append(DcpChunk(offsets, sizes))
    return DcpTensor(_dtype(state["properties"], fqn), size, tuple(chunks))


def _index(node: Any) -> tuple[str, tuple[int, ...] | None]:
    _, state, args = _instance(node, f"{_MD}.MetadataIndex")
    fqn = state.get("fqn", args[0] if args else None)
    if not isinstance(fqn, str):
        raise _Bad(f"MetadataIndex fqn is {_describe(fqn)}")
    offset = state.get("offset", args[1] if len(args) > 1 else None)
    return fqn, None if offset is None else _size(offset, f"MetadataIndex {fqn!r} offset")


def _storage(node: Any, fqn: str) -> DcpStorage:
    _, state, _ = _instance(node, f"{_FS}._StorageInfo")
    rel = state.get("relative_path")
    if not isinstance(rel, str):
        raise _Bad(f"item {fqn!r}: _StorageInfo relative_path is {_describe(rel)}")
    offset = _int(state.get("offset"), f"item {fqn!r} storage offset")
    length = _int(state.get("length"), f"item {fqn!r} storage length")
    if offset < 0 or length < 0:
        raise _Bad(f"item {fqn!r}: negative storage offset/length {offset}/{length}")
    tds = state.get("transform_descriptors") or ()
    if not isinstance(tds, list | tuple) or not all(isinstance(t, str) for t in tds):
        raise _Bad(f"item {fqn!r}: transform_descriptors is {_describe(tds)}")
    return DcpStorage(rel, offset, length, tuple(tds))


# -- early resolution ---------------------------------------------------------------------------
# A 128k-chunk .metadata holds ~400k DCP objects. Their records and state dicts are turned into
# the final plain values as soon as the scanner's BUILD gives them their state (build hooks), so
# the symbolic graph is never held in full. A hook only resolves a state of exactly the expected
# shape and returns None otherwise: the record then stays, and the checks below report the problem
# with the item's name.


class _Index(tuple[str, tuple[int, ...] | None], Resolved):
    """A resolved ``MetadataIndex``: ``(fqn, offsets or None)``."""

    __slots__ = ()


def _size_or_none(node: Any) -> tuple[int, ...] | None:
    # More than MAX_NDIM entries: left unresolved, for _size to refuse with the item's name.
    # (An _Index is hashed each time the pickle uses it as a dict key: the cap bounds that too,
    # conversion review atkconv2 N3.)
    if type(node) is not tuple or len(node) > MAX_NDIM:
        return None
    for v in node:
        if type(v) is not int or v < 0:
            return None
    return node


def _hook_chunk(args: tuple[Any, ...], state: dict[Any, Any]) -> DcpChunk | None:
    if args or len(state) != 2:
        return None
    offsets = _size_or_none(state.get("offsets"))
    sizes = _size_or_none(state.get("sizes"))
    if offsets is None or sizes is None or len(offsets) != len(sizes):
        return None
    return DcpChunk(offsets, sizes)


def _hook_index(args: tuple[Any, ...], state: dict[Any, Any]) -> _Index | None:
    if args or not 2 <= len(state) <= 3:
        return None
    fqn = state.get("fqn")
    if type(fqn) is not str or "offset" not in state:
        return None
    if len(state) == 3 and "index" not in state:
        return None
    offset = state["offset"]
    if offset is None:
        return _Index((fqn, None))
    offsets = _size_or_none(offset)
    return None if offsets is None else _Index((fqn, offsets))


def _hook_storage(args: tuple[Any, ...], state: dict[Any, Any]) -> DcpStorage | None:
    if args:
        return None
    rel = state.get("relative_path")
    offset = state.get("offset")
    length = state.get("length")
    tds = state.get("transform_descriptors")
    n = 3 if "transform_descriptors" not in state else 4
    if (
        len(state) != n
        or type(rel) is not str
        or type(offset) is not int
        or type(length) is not int
        or offset < 0
        or length < 0
    ):
        return None
    if tds is None or tds == []:
        return DcpStorage(rel, offset, length)
    if type(tds) is not list or not all(type(t) is str for t in tds):
        return None
    return DcpStorage(rel, offset, length, tuple(tds))


_BUILD_HOOKS = {
    f"{_MD}.ChunkStorageMetadata": _hook_chunk,
    f"{_MD}.MetadataIndex": _hook_index,
    f"{_FS}._StorageInfo": _hook_storage,
}


def _metadata(root: Any, budget: WalkBudget) -> DcpMetadata:
    _, state, _ = _instance(root, f"{_MD}.Metadata")
    if "state_dict_metadata" not in state:
        raise _Bad("Metadata without state_dict_metadata")
    items: dict[str, DcpTensor | DcpBytes] = {}
    for fqn, md in _mapping(state["state_dict_metadata"], "state_dict_metadata"):
        budget.spend()
        if not isinstance(fqn, str):
            raise _Bad(f"state_dict_metadata key is {_describe(fqn)}, not a string")
        qual, _, _ = _instance(md, f"{_MD}.TensorStorageMetadata", f"{_MD}.BytesStorageMetadata")
        items[fqn] = DcpBytes() if qual.endswith(".BytesStorageMetadata") else _tensor(md, fqn, budget)
    storage_node = state.get("storage_data")
    if storage_node is None:
        raise _Bad(
            "Metadata has no storage_data (written by a storage writer other than "
            "FileSystemWriter?)"
        )
    storage: dict[tuple[str, tuple[int, ...] | None], DcpStorage] = {}
    for idx, info in _mapping(storage_node, "storage_data"):
        budget.spend()
        key = (idx[0], idx[1]) if type(idx) is _Index else _index(idx)
        storage[key] = info if type(info) is DcpStorage else _storage(info, key[0])
    version = state.get("version")
    paths = _paths(state.get("planner_data"), items)
    return DcpMetadata(items, storage, version if isinstance(version, str) else None, paths)


def _paths(node: Any, items: dict[str, Any]) -> dict[str, tuple[str | int, ...]]:
    """The object paths DCP's default planner records, for the items it lists.

    ``planner_data`` belongs to the planner: anything other than a mapping of item FQNs to
    tuples of str/int components (e.g. a custom planner's data) is ignored, not refused.
    """
    try:
        pairs = _mapping(node, "planner_data")
    except _Bad:
        return {}
    out: dict[str, tuple[str | int, ...]] = {}
    for fqn, path in pairs:
        if (
            isinstance(fqn, str)
            and fqn in items
            and isinstance(path, tuple | list)
            and path
            and all(isinstance(c, str | int) and not isinstance(c, bool) for c in path)
            and ".".join(str(c) for c in path) == fqn  # DCP's own rule; else not its path
        ):
            out[fqn] = tuple(path)
    return out


# -- byte items -------------------------------------------------------------------------------


def symbolic_to_json(node: Any, depth: int = 0, *, budget: WalkBudget | None = None) -> Any:
    """Return a scanned pickle value as JSON data, or raise :class:`NotJsonError`.

    Recognised: ``None``, bools, ints, floats (inf and nan too), strings, lists/tuples (tuples become
    lists), dicts and ``OrderedDict`` with string or int keys (int keys become strings), and
    ``torch.Size`` (a list). Every value visited is charged to ``budget`` (shared references are
    expanded: :class:`ExpansionError` past it).
    """
    if budget is not None:
        budget.spend()
    if depth > _MAX_DEPTH:
        raise NotJsonError("nested too deeply")
    if node is None or isinstance(node, bool | str):
        return node
    if isinstance(node, int):
        return node
    if isinstance(node, float):
        # inf and nan too: stored as the torch adapter stores them ({"__float__": "inf"}, by
        # json_leaves or encode_json). They were skipped, and with them the whole container
        # above (fidelity review F10, F11).
        return node
    if isinstance(node, list | tuple):
        return [symbolic_to_json(v, depth + 1, budget=budget) for v in node]
    if isinstance(node, dict) or (
        isinstance(node, Call) and isinstance(node.func, Global) and node.func.qualname in DICT_CTORS
    ):
        try:
            pairs = _mapping(node, "value")
        except _Bad as exc:
            raise NotJsonError(str(exc)) from None
        out: dict[str, Any] = {}
        raw: dict[str, Any] = {}
        for k, v in pairs:
            jk = json_key(k)
            if jk in raw and (type(raw[jk]) is not type(k) or raw[jk] != k):
                # {1: 5, "1": 6} became {"1": 6}, silently (conversion review atkconv2 N8)
                raise KeyCollisionError(raw[jk], k, jk)
            raw[jk] = k
            out[jk] = symbolic_to_json(v, depth + 1, budget=budget)
        return out
    if isinstance(node, Call) and isinstance(node.func, Global) and node.func.qualname == "torch.Size":
        if len(node.args) == 1 and isinstance(node.args[0], tuple):
            return symbolic_to_json(node.args[0], depth + 1, budget=budget)
    if isinstance(node, Call) and isinstance(node.func, Global):
        if node.func.qualname.startswith("torch._utils._rebuild_"):
            raise NotJsonError("a tensor value")
        if node.func.qualname == "_codecs.encode":  # how pickle protocol 2 spells bytes
            raise NotJsonError("a bytes value, such as pickle.dumps output")
        raise NotJsonError(f"an object of type {node.func.qualname}")
    if isinstance(node, Global):
        raise NotJsonError(f"a reference to {node.qualname}")
    raise NotJsonError(f"a value of type {type(node).__name__}")


def json_key(k: Any) -> str:
    """A pickled dict key as a JSON object key: strings as they are, ints in decimal.

    A key the scan stored unhashed (:class:`OpaqueKey`: a float, a tuple, an int of 2^61 or more)
    is judged by the value it wraps.
    """
    if isinstance(k, str):
        return k
    if type(k) is OpaqueKey:
        k = k.value
    if isinstance(k, int) and not isinstance(k, bool):
        try:
            return str(k)
        except ValueError:  # more digits than sys.get_int_max_str_digits() allows
            raise NotJsonError(f"an integer dict key of {k.bit_length():,} bits") from None
    raise NotJsonError(f"a dict key of type {type(k).__name__}")


def decode_byte_item(fd: int, offset: int, length: int, *, where: str) -> Any:
    """Decode the DCP byte item ``[offset, offset + length)`` of ``fd`` into JSON data.

    The item is a ``torch.save`` zip; its ``data.pkl`` is interpreted symbolically.

    Raises:
        FileSizeError: the file is shorter than the item (truncated).
        ChecksumError: a member's bytes differ from the CRC-32 its zip records (damage).
        DuplicateMemberError: the zip holds two members of one name (its value is whichever
            a reader picks).
        NotJsonError: the value is not JSON data, or the item is not a ``torch.save`` zip (e.g. a
            raw ``io.BytesIO`` item); the message says why.

    """
    from portable_ckpt.convert._torchzip import DuplicateMemberError, open_torch_archive

    # No bound on the members: a byte item may be a torch.save of a tuple of many tensors (DCP
    # stores tuples as one item), and its zip's members cost at least 76 bytes of it each (a
    # local and a central header): reading them costs the item's bytes, which no other item
    # shares (review rev22 D12).
    try:
        archive = open_torch_archive(fd, offset, length, where=where)
    except (FileSizeError, ChecksumError, DuplicateMemberError):
        # damage (a truncated file, bytes that differ from their CRC-32) or a zip whose value
        # is whichever of two members a reader picks: refused, not a value that isn't JSON
        raise
    except CheckpointError as exc:  # not a torch.save zip: a raw BytesIO item, or damaged
        raise NotJsonError(exc.message.removeprefix(f"{where}: ")) from None
    try:
        return symbolic_to_json(archive.root, budget=archive.budget(where))
    except ExpansionError as exc:
        raise LimitError(str(exc), path=where) from None
