"""Read one tensor stored by ``torch.save`` (zip format) without torch and without unpickling.

The zip is located by ``(path, offset, length)`` — DCP concatenates one such zip per chunk in its
``.distcp`` files. The tensor's metadata comes from ``data.pkl`` interpreted by
:mod:`portable_ckpt.convert._pickle_scan` (no code runs); its bytes are the ``data/<key>`` member,
which ``torch.save`` stores uncompressed, so they are mapped straight from the file
(:func:`map_torch_tensor`, no copy) or ``pread`` into a new array (:func:`read_torch_tensor`);
:func:`load_torch_tensor` picks one by size and checks the member's CRC-32 on the bytes it got.

Every member is read from where its local header puts it (as torch's own reader, miniz, does)
and checked against the CRC-32 its zip records: a damaged member is refused
(``PCK-CHECKSUM``), never converted into a version whose fresh checksums would call it good.
Two members of one name (torch's reader folds ASCII case) are refused: ``torch.load`` reads
one of them, and a converter could read the other.
"""

from __future__ import annotations

import io
import math
import mmap
import os
import struct
import zipfile
import zlib
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from portable_ckpt.convert._model import MAP_MIN_BYTES
from portable_ckpt.convert._pickle_scan import (
    Call,
    Global,
    PersistentId,
    PickleScanError,
    WalkBudget,
    scan_pickle,
)
from portable_ckpt.errors import (
    ChecksumError,
    CodecError,
    DtypeUnsupportedError,
    FileSizeError,
    LimitError,
    ShardHeaderError,
    StorageError,
    transient_errno,
)
from portable_ckpt.format.dtypes import DTYPES, numpy_dtype
from portable_ckpt.format.manifest import MAX_NDIM

__all__ = [
    "MAX_ITEM_MEMBERS",
    "TORCH_DTYPE_NAMES",
    "ZIP_ERRORS",
    "CrcChecks",
    "DuplicateMemberError",
    "StoredMember",
    "TorchArchive",
    "TorchTensorLayout",
    "is_tensor_node",
    "is_zip",
    "check_member_crc",
    "load_torch_tensor",
    "map_torch_tensor",
    "open_torch_archive",
    "parse_torch_zip",
    "pread_into",
    "read_torch_tensor",
    "tensor_layout",
]

#: torch dtype attribute name → format dtype name: every format dtype under its own name
#: (derived: a new row of the format's table needs no second copy here, maintainer review M4),
#: and torch's aliases.
TORCH_DTYPE_NAMES: dict[str, str] = {
    **{name: name for name in DTYPES},
    "double": "float64",
    "float": "float32",
    "half": "float16",
    "long": "int64",
    "int": "int32",
    "short": "int16",
}

_STORAGE_DTYPES = {
    "DoubleStorage": "float64",
    "FloatStorage": "float32",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
    "ComplexFloatStorage": "complex64",
}

_MAX_PKL = 64 << 20
#: Most zip members of one DCP tensor chunk: ``torch.save`` of one tensor writes about eight
#: (data.pkl, byteorder, version, data/0, ...). A byte item's zip has no such bound (its
#: members cost its bytes: see ``_dcp_meta.decode_byte_item``).
MAX_ITEM_MEMBERS = 64
#: What :mod:`zipfile` raises for a damaged or unsupported archive (``NotImplementedError``, a
#: ``RuntimeError``, for a newer "version needed"; ``RuntimeError`` for an encrypted member).
ZIP_ERRORS = (zipfile.BadZipFile, OSError, ValueError, EOFError, RuntimeError)
_REBUILD = ("torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor_v3")
#: Bytes read at a time when a member's CRC-32 is checked apart from the tensor's own read.
_CRC_BLOCK = 16 << 20
#: ``str.translate`` table folding ASCII case, as torch's zip reader (miniz) compares names.
_ASCII_FOLD = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


class DuplicateMemberError(ShardHeaderError):
    """Two members of one ``torch.save`` zip have one name (``PCK-SHARD-HEADER``).

    Apart from other damage because a DCP byte item with it is refused, not skipped as an item
    that is no ``torch.save`` zip: its value is whichever member a reader picks.
    """


class StoredMember(NamedTuple):
    """Where one stored zip member's bytes are, and the CRC-32 its zip records for them."""

    name: str
    #: Absolute file offset of the member's first byte.
    offset: int
    size: int
    #: ``None`` where the zip records none: ``torch.save`` under
    #: ``torch.serialization.set_crc32_options(False)`` writes 0 for every member, and
    #: ``torch.load`` reads such files.
    crc: int | None


@dataclass(frozen=True)
class TorchTensorLayout:
    """Where a ``torch.save``'d tensor's elements live in the containing file.

    Attributes:
        dtype: format dtype name.
        data_offset: absolute file offset of the storage bytes.
        storage_nbytes: size of the storage in bytes.
        storage_offset: offset of the tensor's first element in the storage, in elements.
        shape: tensor shape.
        stride: tensor strides in elements.

    """

    dtype: str
    data_offset: int
    storage_nbytes: int
    storage_offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    #: The storage's zip member (for messages) and its recorded CRC-32 (:class:`StoredMember`).
    member: str = ""
    crc: int | None = None

    @property
    def span(self) -> tuple[int, int]:
        """``(file offset, bytes)`` of the part of the storage the view addresses (``0`` bytes: none)."""
        item = DTYPES[self.dtype].itemsize
        start = self.data_offset + self.storage_offset * item
        if math.prod(self.shape) == 0:
            return start, 0
        count = 1 + sum((d - 1) * s for d, s in zip(self.shape, self.stride, strict=True))
        return start, count * item

    @property
    def covers_storage(self) -> bool:
        """Whether :attr:`span` is the whole storage member (its CRC-32 can be summed on it)."""
        return self.span == (self.data_offset, self.storage_nbytes)

    @property
    def repeats_elements(self) -> bool:
        """Whether the view has more elements than the storage span it addresses.

        Then some stored element appears more than once (a zero stride: ``expand``, or
        overlapping strides), and converting it writes more bytes than the source holds.
        """
        n = math.prod(self.shape)
        if n == 0:
            return False
        span = 1 + sum((d - 1) * s for d, s in zip(self.shape, self.stride, strict=True))
        return n > span

    @property
    def is_contiguous(self) -> bool:
        """Return whether the elements are in C order without gaps."""
        expected = 1
        for dim, st in zip(reversed(self.shape), reversed(self.stride), strict=True):
            if dim != 1 and st != expected:
                return False
            expected *= dim
        return True


class _Window(io.RawIOBase):
    """A read-only seekable view of ``[offset, offset+length)`` of a file descriptor."""

    def __init__(self, fd: int, offset: int, length: int) -> None:
        self._fd = fd
        self._off = offset
        self._len = length
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = 0) -> int:
        if whence == 0:
            self._pos = pos
        elif whence == 1:
            self._pos += pos
        else:
            self._pos = self._len + pos
        self._pos = max(0, self._pos)
        return self._pos

    def readinto(self, b: object) -> int:
        mv = memoryview(b).cast("B")  # type: ignore[arg-type]
        n = max(0, min(len(mv), self._len - self._pos))
        if n == 0:
            return 0
        data = os.pread(self._fd, n, self._off + self._pos)
        mv[: len(data)] = data
        self._pos += len(data)
        return len(data)


def _as_int_tuple(value: object, what: str, where: str) -> tuple[int, ...]:
    if isinstance(value, tuple) and len(value) > MAX_NDIM:
        # before any walk over it: a shape shared by many tensors (memo references, a few bytes
        # each) cost tensors x rank (conversion review atkconv2 N1, N2)
        raise LimitError(
            f"{where}: a tensor {what} of {len(value):,} dimensions, above the format's limit "
            f"of {MAX_NDIM}: the source is damaged"
        )
    if not isinstance(value, tuple) or not all(isinstance(v, int) for v in value):
        raise ShardHeaderError(f"{where}: torch.save pickle has a malformed {what} {value!r}")
    return tuple(int(v) for v in value)


class TorchArchive(NamedTuple):
    """An opened ``torch.save`` zip: the scanned ``data.pkl`` and where the storages are."""

    root: Any
    storages: dict[str, StoredMember]
    #: Size of ``data.pkl``: walks over ``root`` are budgeted by it (:class:`WalkBudget`).
    pickle_bytes: int

    def budget(self, where: str) -> WalkBudget:
        """A fresh :class:`WalkBudget` for walks over :attr:`root`."""
        return WalkBudget(self.pickle_bytes, what=f"{where}: data.pkl ({self.pickle_bytes} bytes)")


def _stored_member(
    fd: int, offset: int, length: int, info: zipfile.ZipInfo, crc: bool, where: str
) -> StoredMember:
    """Locate an uncompressed member's bytes from its local header, as torch's reader does.

    ``crc``: whether the zip records CRC-32s (:attr:`StoredMember.crc`).
    """
    name = info.filename
    if info.compress_type != zipfile.ZIP_STORED:
        raise CodecError(
            f"{where}: zip member {name} is compressed (method {info.compress_type}); "
            "torch.save stores every member uncompressed"
        )
    if info.flag_bits & 0x61:  # encrypted (0x1, 0x40) or patch data (0x20): zipfile's refusals
        raise ShardHeaderError(
            f"{where}: zip member {name} is encrypted or patch data (flags {info.flag_bits:#x}): "
            "not a torch.save member"
        )
    if info.compress_size != info.file_size:
        raise ShardHeaderError(
            f"{where}: zip member {name} is stored but records {info.compress_size} bytes "
            f"stored and {info.file_size} bytes long: not a torch.save member"
        )
    header = os.pread(fd, 30, offset + info.header_offset) if info.header_offset >= 0 else b""
    if len(header) != 30 or header[:4] != b"PK\x03\x04":
        raise ShardHeaderError(f"{where}: bad zip local header for {name}")
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    data_offset = offset + info.header_offset + 30 + name_len + extra_len
    if data_offset - offset + info.file_size > length:
        raise FileSizeError(f"{where}: zip member {name} extends past the file (truncated)")
    return StoredMember(name, data_offset, info.file_size, info.CRC if crc else None)


def _crc_mismatch(
    member: StoredMember, got: int, where: str, path: str | None
) -> ChecksumError:
    return ChecksumError(
        f"{where}: zip member {member.name} is damaged: its {member.size:,} bytes have CRC-32 "
        f"{got:08x}, its zip records {member.crc:08x}; nothing of it is converted: copy or "
        "download the file again (or save it again from its source)",
        path=path,
        span=(member.offset, member.offset + member.size),
    )


def check_member_crc(
    fd: int, member: StoredMember, *, where: str, data: Any = None, path: str | None = None
) -> None:
    """Check ``member``'s bytes against its recorded CRC-32 (nothing where none is recorded).

    ``data``: the member's bytes when the caller has them (any buffer; the sum runs on them, no
    second read); otherwise they are read ``_CRC_BLOCK`` at a time. ``path``: the file, for the
    error's :attr:`~portable_ckpt.CheckpointError.path`.

    Raises:
        ChecksumError: the bytes differ from what the zip recorded.
        FileSizeError: the file ends inside the member.

    """
    if member.crc is None:
        return
    if data is not None:
        got = zlib.crc32(data)
    else:
        got, done = 0, 0
        buf = np.empty(min(member.size, _CRC_BLOCK), dtype=np.uint8)
        while done < member.size:
            n = min(len(buf), member.size - done)
            pread_into(fd, buf[:n], member.offset + done, where=where)
            got = zlib.crc32(buf[:n].data, got)
            done += n
    if got != member.crc:
        raise _crc_mismatch(member, got, where, path)


def _read_stored(fd: int, member: StoredMember, limit: int, where: str) -> bytes:
    """Read a small member (``data.pkl``, ``byteorder``), never more than ``limit`` bytes.

    A compressed member (torch.save writes none) could declare a few bytes and inflate to
    gigabytes in one call: it is refused before it is read (:func:`_stored_member`).
    """
    if member.size > limit:
        raise ShardHeaderError(f"{where}: {member.name} is {member.size} bytes; too large")
    data = os.pread(fd, member.size, member.offset)
    if len(data) != member.size:
        raise FileSizeError(f"{where}: zip member {member.name} extends past the file (truncated)")
    check_member_crc(fd, member, where=where, data=data)
    return data


def is_zip(f: Any) -> bool:
    """:func:`zipfile.is_zipfile` on an open file, where a damaged end record means a damaged zip.

    ``is_zipfile`` raises ``BadZipFile`` for some end records (a zip64 locator naming several
    disks) instead of answering: such a file is a zip, and its reader reports the damage.
    """
    try:
        return zipfile.is_zipfile(f)
    except (zipfile.BadZipFile, ValueError, EOFError):
        return True


def open_torch_archive(
    fd: int, offset: int, length: int, *, where: str, max_members: int | None = None
) -> TorchArchive:
    """Open the ``torch.save`` zip at ``[offset, offset+length)`` of ``fd``.

    Returns:
        The symbolic tree of ``data.pkl`` (see :mod:`._pickle_scan`), per storage key
        ``(absolute data offset, size in bytes)``, and the pickle's size. ``max_members``
        refuses a zip of more members (a DCP item holds one ``torch.save`` of one value).

    Raises:
        FileSizeError: the file is shorter than ``offset + length`` (truncated).
        ShardHeaderError: not a torch zip, or its pickle cannot be interpreted.
        CodecError: a member is compressed.

    """
    size = os.fstat(fd).st_size
    if offset + length > size:
        raise FileSizeError(
            f"{where}: item needs bytes [{offset}, {offset + length}) but the file has {size} "
            "bytes (truncated); re-copy the checkpoint",
        )
    try:
        zf = zipfile.ZipFile(_Window(fd, offset, length))
    except ZIP_ERRORS as exc:
        raise ShardHeaderError(
            f"{where}: not a torch.save zip ({exc}); only torch's zip serialization is supported"
        ) from None
    storages: dict[str, StoredMember] = {}
    with zf:
        infos = zf.infolist()
    if max_members is not None and len(infos) > max_members:
        raise ShardHeaderError(
            f"{where}: a zip of {len(infos):,} members, more than the "
            f"{max_members} read for one tensor chunk (a torch.save of one tensor holds "
            "about eight): not converted"
        )
    members = _unique_members(infos, where)
    # torch.save under set_crc32_options(False) records 0 for every member (torch.load reads
    # it); where any member records a CRC-32, every member's is checked.
    crc = any(i.CRC for i in infos)
    pkl = [n for n in members if n.endswith("data.pkl") and n.count("/") == 1]
    if len(pkl) != 1:
        raise ShardHeaderError(f"{where}: torch zip without a single data.pkl")
    prefix = pkl[0][: -len("data.pkl")]
    pickled = _stored_member(fd, offset, length, members[pkl[0]], crc, where)  # compressed? no
    order = members.get(prefix + "byteorder")
    if order is not None:
        stored = _stored_member(fd, offset, length, order, crc, where)
        value = _read_stored(fd, stored, 64, where)
        if value == b"big":
            raise ShardHeaderError(f"{where}: big-endian torch.save data is not supported")
        if value != b"little":
            # torch.load takes exactly these two ("Unknown endianness type"): anything else is
            # no file torch wrote (mutation audit 30: b"" and " little\n" were read as little)
            raise ShardHeaderError(
                f"{where}: byteorder member {value[:16]!r} is neither b'little' nor b'big' "
                "(torch.load refuses it too): not a torch.save file, or damaged"
            )
    raw = _read_stored(fd, pickled, _MAX_PKL, where)
    try:
        root = scan_pickle(raw, max_ops=None)  # bounded by _MAX_PKL
    except PickleScanError as exc:
        raise ShardHeaderError(f"{where}: cannot interpret data.pkl: {exc}") from None
    dprefix = prefix + "data/"
    for name, member in members.items():
        if not name.startswith(dprefix) or "/" in name[len(dprefix) :]:
            continue
        storages[name[len(dprefix) :]] = _stored_member(fd, offset, length, member, crc, where)
    return TorchArchive(root, storages, len(raw))


def _unique_members(infos: list[zipfile.ZipInfo], where: str) -> dict[str, zipfile.ZipInfo]:
    """The members by name, refusing two of one name.

    ``zipfile`` keeps the last of two members of one name; torch's reader finds one of them by
    a binary search of names compared without ASCII case. A file with both converted to other
    values than ``torch.load`` reads (the re-added ``data/0`` of an edited zip): refused.
    """
    seen: dict[str, str] = {}
    for info in infos:
        folded = info.filename.translate(_ASCII_FOLD)
        first = seen.get(folded)
        if first is not None:
            both = (
                f"two members named {first!r}" if first == info.filename else
                f"members {first!r} and {info.filename!r}, one name to torch's reader (which "
                "does not tell ASCII case apart)"
            )
            raise DuplicateMemberError(
                f"{where}: the zip holds {both}: torch.load reads one of them and a conversion "
                "could read the other, so the file is refused; save it again with torch.save"
            )
        seen[folded] = info.filename
    return {info.filename: info for info in infos}


def tensor_layout(
    node: object, storages: dict[str, StoredMember], *, where: str
) -> TorchTensorLayout:
    """Return the layout of a ``_rebuild_tensor_v2/v3`` call node of a scanned ``data.pkl``.

    Raises:
        ShardHeaderError: not a plain dense tensor, or inconsistent with its storage.
        DtypeUnsupportedError: the tensor's dtype is outside the format's table.

    """
    key, numel, (dtype, storage_offset, shape, stride) = _tensor_from_pickle(node, where)
    if key not in storages:
        raise ShardHeaderError(f"{where}: torch zip lacks storage member data/{key}")
    member = storages[key]
    data_offset, storage_nbytes = member.offset, member.size
    item = DTYPES[dtype].itemsize
    if numel >= 0 and numel * item != storage_nbytes and numel != storage_nbytes:
        raise ShardHeaderError(
            f"{where}: storage size {storage_nbytes} B disagrees with its element count {numel}"
        )
    if any(d < 0 for d in shape) or any(s < 0 for s in stride) or len(shape) != len(stride):
        raise ShardHeaderError(f"{where}: bad shape/stride {shape}/{stride}")
    if math.prod(shape) > 0:
        last = storage_offset + sum((d - 1) * s for d, s in zip(shape, stride, strict=True))
        if storage_offset < 0 or (last + 1) * item > storage_nbytes:
            raise ShardHeaderError(f"{where}: tensor view exceeds its storage")
    return TorchTensorLayout(
        dtype, data_offset, storage_nbytes, storage_offset, shape, stride, member.name, member.crc
    )


def is_tensor_node(node: object) -> bool:
    """Return whether a scanned pickle node is a tensor rebuild call."""
    return (
        isinstance(node, Call)
        and isinstance(node.func, Global)
        and node.func.qualname in _REBUILD
    )


def parse_torch_zip(
    fd: int, offset: int, length: int, *, where: str, max_members: int | None = None
) -> TorchTensorLayout:
    """Parse a ``torch.save`` zip holding exactly one tensor (a DCP chunk).

    Raises:
        FileSizeError, ShardHeaderError, CodecError, DtypeUnsupportedError: see
            :func:`open_torch_archive` and :func:`tensor_layout`.

    """
    archive = open_torch_archive(fd, offset, length, where=where, max_members=max_members)
    return tensor_layout(archive.root, archive.storages, where=where)


def _tensor_from_pickle(
    root: object, where: str
) -> tuple[str, int, tuple[str, int, tuple[int, ...], tuple[int, ...]]]:
    if not (is_tensor_node(root) and isinstance(root, Call) and len(root.args) >= 4):
        raise ShardHeaderError(f"{where}: data.pkl is not a plain dense tensor")
    pid = root.args[0]
    if not isinstance(pid, PersistentId) or not isinstance(pid.value, tuple) or len(pid.value) < 5:
        raise ShardHeaderError(f"{where}: data.pkl has no storage reference")
    tag, stype, key, _loc, numel = pid.value[:5]
    if tag != "storage" or not isinstance(stype, Global) or not isinstance(key, str):
        raise ShardHeaderError(f"{where}: data.pkl storage reference malformed")
    if not isinstance(numel, int):
        raise ShardHeaderError(f"{where}: storage size malformed")
    if root.func.name == "_rebuild_tensor_v3":
        if len(root.args) < 7 or not isinstance(root.args[6], Global):
            raise ShardHeaderError(f"{where}: _rebuild_tensor_v3 without a dtype")
        tname = root.args[6].name
        dtype = TORCH_DTYPE_NAMES.get(tname)
        if dtype is None:
            raise DtypeUnsupportedError(f"{where}: torch dtype {tname!r} is not in the format's table")
        numel_items = -1  # untyped storage: numel counts bytes
        numel_bytes = numel
    else:
        sname = stype.name
        dtype_or_none = _STORAGE_DTYPES.get(sname)
        if dtype_or_none is None:
            raise DtypeUnsupportedError(f"{where}: torch storage {sname!r} is not in the format's table")
        dtype = dtype_or_none
        numel_items = numel
        numel_bytes = -1
    offset = root.args[1]
    if not isinstance(offset, int):
        raise ShardHeaderError(f"{where}: storage offset malformed")
    shape = _as_int_tuple(root.args[2], "size", where)
    stride = _as_int_tuple(root.args[3], "stride", where)
    count = numel_items if numel_items >= 0 else numel_bytes
    return key, count, (dtype, offset, shape, stride)


class CrcChecks:
    """The storage members of one source whose CRC-32 was checked: each is checked once.

    Tensors sharing one storage (views, tied weights) and DCP chunks naming one range load the
    same member; its bytes are summed by the first load only. Loaders run one at a time
    (:mod:`._model`), so a set suffices.
    """

    def __init__(self) -> None:
        self._done: set[tuple[str, int]] = set()

    def claim(self, file: str, layout: TorchTensorLayout) -> bool:
        """Return whether ``layout``'s member of ``file`` is still to be checked, and mark it."""
        key = (file, layout.data_offset)
        if layout.crc is None or key in self._done:
            return False
        self._done.add(key)
        return True


def load_torch_tensor(
    fd: int, layout: TorchTensorLayout, *, where: str, file: str, checks: CrcChecks
) -> np.ndarray:
    """The tensor ``layout`` describes, its storage member's CRC-32 checked once per ``checks``.

    Tensors of at least :data:`~portable_ckpt.convert._model.MAP_MIN_BYTES` are mapped (no
    copy), smaller ones read into a fresh array: a mapping holds a descriptor until the writer
    drops its batch, and 4,800 small tensors of a torch.save file (a DCP checkpoint's 128k
    256-byte chunks) ran out of them, EMFILE on every run (conversion review 25, H2).

    The CRC-32 is summed on the bytes just mapped or read when they are the whole member (a
    plain tensor, a DCP chunk: no second pass); a view of part of its storage has the member
    read apart (once per member: at most the bytes present).

    Raises:
        ChecksumError: the storage member differs from its recorded CRC-32 (``where`` names the
            file and the tensor, the message the member).
        FileSizeError: the file is shorter than the tensor's bytes (truncated).
        StorageError: the mapping fails.

    """
    dt = numpy_dtype(layout.dtype)
    n = math.prod(layout.shape)
    if n == 0:
        return np.empty(layout.shape, dtype=dt)
    nbytes = n * dt.itemsize
    start, span = layout.span
    if span < MAP_MIN_BYTES:
        flat = np.empty(span, dtype=np.uint8)
        pread_into(fd, flat, start, where=where)
    else:
        flat = _map_bytes(fd, start, span, where)
    if checks.claim(file, layout):
        member = StoredMember(layout.member, layout.data_offset, layout.storage_nbytes, layout.crc)
        data = flat if layout.covers_storage else None
        check_member_crc(fd, member, where=where, data=data, path=file)
    view = _view(flat, layout)
    if span >= MAP_MIN_BYTES and nbytes < MAP_MIN_BYTES:
        # a few elements strided across a large span: copied out, so that the mapping (and
        # its descriptor) goes now, not when the writer drops a batch of such small tensors
        return np.array(view)
    return view


def read_torch_tensor(fd: int, layout: TorchTensorLayout, *, where: str) -> np.ndarray:
    """Read the tensor described by ``layout`` from ``fd`` into a new numpy array.

    Only the bytes the view covers are read when it is contiguous; a strided view reads its
    storage span and returns a strided view of it (the format writer accepts any strides).
    No CRC-32 is checked (:func:`load_torch_tensor` checks it).
    """
    dt = numpy_dtype(layout.dtype)
    if math.prod(layout.shape) == 0:
        return np.empty(layout.shape, dtype=dt)
    start, span = layout.span
    buf = np.empty(span, dtype=np.uint8)
    pread_into(fd, buf, start, where=where)
    return _view(buf, layout)


def map_torch_tensor(fd: int, layout: TorchTensorLayout, *, where: str) -> np.ndarray:
    """Return the tensor described by ``layout`` as a read-only array over a mapping of ``fd``.

    Only the bytes the view spans are mapped (``MAP_POPULATE``: faulted in at once, from the page
    cache when they are there); nothing is copied. A strided view maps its storage span and is
    returned as a strided array (the format writer accepts any strides). The mapping lives as
    long as the array does, so a consumer that drops the array after writing it keeps memory at
    the chunks in flight. No CRC-32 is checked (:func:`load_torch_tensor` checks it).

    Raises:
        FileSizeError: the file is shorter than the tensor's bytes (truncated).
        StorageError: the mapping fails.

    """
    dt = numpy_dtype(layout.dtype)
    if math.prod(layout.shape) == 0:
        return np.empty(layout.shape, dtype=dt)
    start, span = layout.span
    return _view(_map_bytes(fd, start, span, where), layout)


def _map_bytes(fd: int, start: int, nbytes: int, where: str) -> np.ndarray:
    """A read-only ``uint8`` array over a mapping of ``fd``'s bytes ``[start, start+nbytes)``."""
    size = os.fstat(fd).st_size
    if start + nbytes > size:
        raise FileSizeError(
            f"{where}: tensor bytes [{start}, {start + nbytes}) extend past the end of the file "
            f"({size} bytes): truncated; re-copy the checkpoint"
        )
    page = mmap.ALLOCATIONGRANULARITY
    base = start // page * page
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    try:
        mm = mmap.mmap(fd, start + nbytes - base, flags=flags, prot=mmap.PROT_READ, offset=base)
    except (OSError, ValueError) as exc:
        raise StorageError(f"{where}: cannot map the tensor bytes: {exc}",
                           retryable=transient_errno(getattr(exc, "errno", None))) from None
    return np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=start - base)


def _view(flat: np.ndarray, layout: TorchTensorLayout) -> np.ndarray:
    """The tensor of ``layout`` over ``flat``, the bytes of its :attr:`~TorchTensorLayout.span`."""
    dt = numpy_dtype(layout.dtype)
    typed = flat.view(dt)
    if layout.is_contiguous:
        return typed.reshape(layout.shape)
    return np.lib.stride_tricks.as_strided(
        typed, shape=layout.shape, strides=tuple(s * dt.itemsize for s in layout.stride),
        writeable=False,
    )


def pread_into(fd: int, buf: np.ndarray, offset: int, *, where: str) -> None:
    """Fill ``buf`` from ``fd`` at ``offset`` (``FileSizeError`` naming ``where`` if short)."""
    mv = memoryview(buf).cast("B")  # type: ignore[arg-type]
    done = 0
    total = len(mv)
    while done < total:
        n = os.preadv(fd, [mv[done : done + (1 << 30)]], offset + done)
        if n <= 0:
            raise FileSizeError(f"{where}: short read at offset {offset + done}: file truncated")
        done += n
