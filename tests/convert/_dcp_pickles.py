"""Build DCP ``.metadata`` pickles without torch, in the shapes of several torch versions.

Stand-in classes pickle exactly like torch's own (same reduce protocol: ``NEWOBJ`` + ``BUILD`` of
``__dict__`` or ``__getstate__``, ``torch.Size`` and enums by ``REDUCE``, dtypes by name), and a
pickler subclass writes them under torch's module/class names. Variants:

* ``modern`` (torch >= 2.4): ``Metadata`` with ``storage_meta`` (``StorageMeta`` with a
  ``pathlib.PosixPath``) and ``version``; ``TensorProperties`` in
  ``torch.distributed.checkpoint.metadata`` with its tuple ``__getstate__``; ``_StorageInfo``
  whose ``__getstate__`` drops ``None`` fields (``transform_descriptors`` when given).
* ``legacy`` (torch 1.13 - 2.0): three-field ``Metadata``; ``TensorProperties`` and
  ``MEM_FORMAT_ENCODING`` from ``torch.distributed._shard.sharded_tensor.metadata``;
  ``_StorageInfo`` with a plain ``__dict__`` state.
* ``dict_state``: ``TensorProperties`` pickled with a ``__dict__`` state (no ``__getstate__``).

Any pickle protocol 0-5 can be used.
"""

from __future__ import annotations

import io
import pathlib
import pickle
import types
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from portable_ckpt.convert._dcp_meta import DcpMetadata

MD = "torch.distributed.checkpoint.metadata"
SHARD_MD = "torch.distributed._shard.sharded_tensor.metadata"
FS = "torch.distributed.checkpoint.filesystem"


class _Named:
    """A symbol pickled as the global ``module.name`` (torch dtypes)."""

    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.name = name

    def __reduce__(self) -> str:
        return self.name


def _get_layout(name: str) -> Any:  # stands for torch.serialization._get_layout
    raise AssertionError("never called")


class _Layout:
    def __reduce__(self) -> Any:
        return (_get_layout, ("torch.strided",))


class Size(tuple):
    def __reduce__(self) -> Any:
        return (Size, (tuple(self),))


class MemFormat:
    def __init__(self, value: int) -> None:
        self.value = value

    def __reduce__(self) -> Any:
        return (MemFormat, (self.value,))


class TensorProperties:
    def __init__(self, dtype: str) -> None:
        self.dtype = _Named("torch", dtype)
        self.layout = _Layout()
        self.requires_grad = False
        self.memory_format = MemFormat(0)
        self.pin_memory = False

    def __getstate__(self) -> Any:
        return (self.dtype, self.layout, self.requires_grad, self.memory_format, self.pin_memory)


class DictStateTensorProperties:
    def __init__(self, dtype: str) -> None:
        self.dtype = _Named("torch", dtype)
        self.layout = _Layout()
        self.requires_grad = False
        self.pin_memory = False


class ChunkStorageMetadata:
    def __init__(self, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> None:
        self.offsets = Size(offsets)
        self.sizes = Size(sizes)


class TensorStorageMetadata:
    def __init__(self, properties: Any, size: tuple[int, ...], chunks: list[Any]) -> None:
        self.properties = properties
        self.size = Size(size)
        self.chunks = chunks


class BytesStorageMetadata:
    pass


class MetadataIndex:
    def __init__(self, fqn: str, offset: tuple[int, ...] | None = None, index: int | None = None) -> None:
        self.fqn = fqn
        self.index = index
        if offset is not None:
            self.offset = Size(offset)


class StorageInfo:
    def __init__(self, rel: str, offset: int, length: int, transforms: list[str] | None) -> None:
        self.relative_path = rel
        self.offset = offset
        self.length = length
        self.transform_descriptors = transforms

    def __getstate__(self) -> Any:
        return {k: v for k, v in self.__dict__.items() if v is not None}


class LegacyStorageInfo:
    def __init__(self, rel: str, offset: int, length: int) -> None:
        self.relative_path = rel
        self.offset = offset
        self.length = length


class StorageMeta:
    def __init__(self) -> None:
        self.checkpoint_id = pathlib.PurePosixPath("/tmp/ckpt")
        self.save_id = "1234"
        self.load_id = None
        self.modules: list[str] = []


class Metadata:
    pass


class LegacyTensorProperties(TensorProperties):
    pass


class LegacyMemFormat(MemFormat):
    def __reduce__(self) -> Any:
        return (LegacyMemFormat, (self.value,))


_NAMES: dict[Any, tuple[str, str]] = {
    _get_layout: ("torch.serialization", "_get_layout"),
    Size: ("torch", "Size"),
    MemFormat: (MD, "_MEM_FORMAT_ENCODING"),
    LegacyMemFormat: (SHARD_MD, "MEM_FORMAT_ENCODING"),
    TensorProperties: (MD, "TensorProperties"),
    DictStateTensorProperties: (MD, "TensorProperties"),
    LegacyTensorProperties: (SHARD_MD, "TensorProperties"),
    ChunkStorageMetadata: (MD, "ChunkStorageMetadata"),
    TensorStorageMetadata: (MD, "TensorStorageMetadata"),
    BytesStorageMetadata: (MD, "BytesStorageMetadata"),
    MetadataIndex: (MD, "MetadataIndex"),
    StorageInfo: (FS, "_StorageInfo"),
    LegacyStorageInfo: (FS, "_StorageInfo"),
    StorageMeta: (MD, "StorageMeta"),
    Metadata: (MD, "Metadata"),
}


class TorchNamesPickler(pickle._Pickler):  # type: ignore[name-defined,misc]
    """The pure-Python pickler, writing the stand-ins under torch's names."""

    # pickle._Pickler dispatches functions to its own save_global, not to an override
    dispatch: ClassVar[dict[Any, Any]] = {
        **pickle._Pickler.dispatch,  # type: ignore[attr-defined]
        types.FunctionType: lambda self, obj: self.save_global(obj),
    }

    def __init__(self, file: Any, protocol: int, extra: dict[Any, tuple[str, str]]) -> None:
        super().__init__(file, protocol=protocol)
        self.extra = extra

    def save_global(self, obj: Any, name: str | None = None) -> None:
        if isinstance(obj, _Named):
            module, qual = obj.module, obj.name
        else:
            try:
                module, qual = self.extra.get(obj) or _NAMES[obj]
            except (KeyError, TypeError):
                return super().save_global(obj, name)  # type: ignore[no-any-return]
        if self.proto >= 4:
            self.save(module)
            self.save(qual)
            self.write(pickle.STACK_GLOBAL)
        else:
            self.write(pickle.GLOBAL + f"{module}\n{qual}\n".encode())
        self.memoize(obj)


def dumps(obj: Any, protocol: int = 4, extra: dict[Any, tuple[str, str]] | None = None) -> bytes:
    """Pickle ``obj`` with the stand-ins named as torch's classes."""
    buf = io.BytesIO()
    TorchNamesPickler(buf, protocol, extra or {}).dump(obj)
    return buf.getvalue()


def metadata(
    tensors: dict[str, tuple[str, tuple[int, ...], list[tuple[tuple[int, ...], tuple[int, ...], str, int, int]]]],
    byte_items: dict[str, tuple[str, int, int]] | None = None,
    *,
    variant: str = "modern",
    transforms: list[str] | None = None,
    planner_extra: Any = None,
) -> Metadata:
    """Build a stand-in ``Metadata``: tensors as (dtype, size, [(offsets, sizes, file, offset, length)])."""
    legacy = variant == "legacy"
    sdm: dict[str, Any] = {}
    storage: dict[Any, Any] = {}
    for fqn, (dtype, size, chunks) in tensors.items():
        if legacy:
            props: Any = LegacyTensorProperties(dtype)
            props.memory_format = LegacyMemFormat(0)
        elif variant == "dict_state":
            props = DictStateTensorProperties(dtype)
        else:
            props = TensorProperties(dtype)
        sdm[fqn] = TensorStorageMetadata(props, size, [ChunkStorageMetadata(o, s) for o, s, *_ in chunks])
        for i, (o, _s, rel, off, ln) in enumerate(chunks):
            info = LegacyStorageInfo(rel, off, ln) if legacy else StorageInfo(rel, off, ln, transforms)
            storage[MetadataIndex(fqn, o, i)] = info
    for fqn, (rel, off, ln) in (byte_items or {}).items():
        sdm[fqn] = BytesStorageMetadata()
        storage[MetadataIndex(fqn)] = LegacyStorageInfo(rel, off, ln) if legacy else StorageInfo(rel, off, ln, None)
    md = Metadata()
    md.state_dict_metadata = sdm  # type: ignore[attr-defined]
    md.planner_data = {k: (k,) for k in sdm} if planner_extra is None else planner_extra  # type: ignore[attr-defined]
    md.storage_data = storage  # type: ignore[attr-defined]
    if not legacy:
        md.storage_meta = StorageMeta()  # type: ignore[attr-defined]
        md.version = "1.0.0"  # type: ignore[attr-defined]
    return md


def from_torch(md: Any) -> DcpMetadata:
    """The same plain view, from torch's own unpickling (the reference)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from portable_ckpt.convert._dcp_meta import (
        DcpBytes,
        DcpChunk,
        DcpMetadata,
        DcpStorage,
        DcpTensor,
    )

    items: dict[str, DcpTensor | DcpBytes] = {}
    for fqn, m in md.state_dict_metadata.items():
        if isinstance(m, TensorStorageMetadata):
            items[fqn] = DcpTensor(
                str(m.properties.dtype).removeprefix("torch."),
                tuple(m.size),
                tuple(DcpChunk(tuple(c.offsets), tuple(c.sizes)) for c in m.chunks),
            )
        else:
            items[fqn] = DcpBytes()
    storage = {
        (k.fqn, None if k.offset is None else tuple(k.offset)): DcpStorage(
            v.relative_path, v.offset, v.length, tuple(getattr(v, "transform_descriptors", None) or ())
        )
        for k, v in md.storage_data.items()
    }
    paths = {
        fqn: tuple(path)
        for fqn, path in (getattr(md, "planner_data", None) or {}).items()
        if fqn in items and isinstance(path, tuple | list) and ".".join(map(str, path)) == fqn
    }
    return DcpMetadata(items, storage, getattr(md, "version", None), paths)
