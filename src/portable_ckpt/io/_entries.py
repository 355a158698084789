"""A version's non-tensor entries: the value a rank gets, read, decoded and checked.

:meth:`Checkpoint.entry <portable_ckpt.io.reader.Checkpoint.entry>` is :func:`entry_value`; the
deep and shallow verification (:mod:`portable_ckpt.io._verify`) reads every value with
:func:`load_json_value`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from portable_ckpt.errors import (
    ContractError,
    EntryMissingError,
    JsonInvalidError,
    StepMismatchError,
    UsageError,
)
from portable_ckpt.format import jsonio
from portable_ckpt.format.manifest import Entry
from portable_ckpt.format.usage import strict_int
from portable_ckpt.io.codec import decompress_frame

if TYPE_CHECKING:
    from portable_ckpt.io.reader import Checkpoint

__all__ = ["NO_VALUE", "entry_value", "load_json_value"]


class _NoValue:
    """The value of a ``drop`` entry on another world size (distinct from a stored ``null``)."""

    _instance: _NoValue | None = None

    def __new__(cls) -> _NoValue:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NO_VALUE"

    def __bool__(self) -> bool:
        return False


#: Returned by :meth:`Checkpoint.entry` when a ``drop`` policy leaves a rank without a value.
NO_VALUE = _NoValue()


def entry_value(
    ck: Checkpoint, name: str, rank: int | None = None, world_size: int | None = None
) -> Any:
    """The value of non-tensor entry ``name`` for ``rank``: :meth:`Checkpoint.entry`'s body."""
    if rank is not None:
        rank = strict_int(rank, f"entry {name!r}: rank", minimum=0)
    if world_size is not None:
        world_size = strict_int(world_size, f"entry {name!r}: world_size", minimum=1)
    e = ck.manifest.entries.get(name)
    if e is None:
        raise EntryMissingError(f"entry {name!r} is not in checkpoint {ck.path}")
    if e.scope == "global":
        if len(e.values) != 1:
            raise EntryMissingError(
                f"global entry {name!r} has {len(e.values)} values, not one"
            )
        path = e.values[0].file
    else:
        if rank is None:
            raise UsageError(
                f"entry {name!r} is per_rank: pass rank= (and world_size= if it changed)"
            )
        saved = ck.manifest.continuation.world_size
        size = world_size if world_size is not None else saved
        if not 0 <= rank < size:
            raise UsageError(f"entry {name!r}: rank {rank} is outside 0..{size - 1}")
        target = rank
        if world_size is not None and world_size != saved:
            policy = e.world_size_policy
            if policy == "require_same":
                raise ContractError(
                    f"entry {name!r} (per_rank, policy require_same) was saved on {saved} ranks "
                    f"and cannot be restored on {world_size}"
                )
            if policy == "drop":
                return NO_VALUE
            target = 0 if policy == "rank0" else rank % saved
        match = [v for v in e.values if v.rank == target]
        if not match:
            raise EntryMissingError(f"entry {name!r} has no value for rank {target}")
        path = match[0].file
    return load_json_value(ck, e, path)


def load_json_value(ck: Checkpoint, e: Entry, path: str) -> Any:
    """Read, decode and check one value file of entry ``e`` (R-ENTRY-2/-3/-6/-13)."""
    value = _decode_value(ck, e, path)
    if e.schema_id == "pck:step/1" and isinstance(value, dict) and value.get("step") != ck.step:
        raise StepMismatchError(
            f"{ck._rel(path)!r}: entry {e.name!r} records step {value.get('step')!r}, the "
            f"manifest's step is {ck.step} (R-ENTRY-13)",
            path=path,
        )
    return value


def _decode_value(ck: Checkpoint, e: Entry, path: str) -> Any:
    rec = ck._file(path)
    if rec.size > jsonio.MAX_DOCUMENT_BYTES:
        raise JsonInvalidError(
            f"{ck._rel(path)!r}: entry value of {rec.size} bytes exceeds the limit of "
            f"{jsonio.MAX_DOCUMENT_BYTES}",
            path=path,
        )
    buf = bytearray(rec.size)
    ck._read_verified(path, 0, rec.size, memoryview(buf))
    data = bytes(buf)
    if e.encoding == "json+zstd":
        data = decompress_frame(
            data,
            expect=None,
            limit=jsonio.MAX_DOCUMENT_BYTES,
            what=f"{ck._rel(path)}: entry {e.name!r}",
        )
    # A user value: bounded by its count of values (R-SEC-15), not by the cost per byte
    # of format documents (a list of small objects is denser than any of those).
    value = jsonio.loads(
        data, what=ck._rel(path), max_nodes=jsonio.MAX_VALUE_NODES, max_cost_per_byte=None
    )
    # jsonschema is imported only when an entry is validated (keeps open() fast).
    from portable_ckpt.format.schemas import validate_entry_value

    validate_entry_value(value, e.schema, name=e.name, what=ck._rel(path))
    return value
