"""The format's fixed vocabularies, defined once: each a ``Literal`` type and its values.

Every other module (parsers, writers, the committer, tensor tables, the torch adapter, the CLI)
takes its values from here, so a value set cannot drift between modules. The independent
conformance checker keeps its own copy on purpose.

* chunk codecs (spec §8.3); their position in :data:`CODECS` is the code a tensor table stores
  (spec §8.5), so the order is part of the format;
* continuation contracts (spec §13), entry scopes and world-size policies (spec §12), entry
  encodings;
* the entry-name rule (spec §12.1);
* extension names (spec §8.5, §16.1) and gc's default grace period (spec §15.2).
"""

from __future__ import annotations

import re
from typing import Final, Literal, TypeGuard, TypeVar, get_args

_T = TypeVar("_T")

__all__ = [
    "CODECS",
    "DEFAULT_GRACE_SECONDS",
    "SHORT_GRACE_SECONDS",
    "TABLE_EXTENSION",
    "CODEC_CODES",
    "CONTRACTS",
    "ENCODINGS",
    "ENTRY_NAME_CHARS",
    "ENTRY_NAME_MAX",
    "POLICIES",
    "SCOPES",
    "Codec",
    "Contract",
    "Encoding",
    "Scope",
    "WorldSizePolicy",
    "is_entry_name",
    "one_of",
]

#: A chunk codec (spec §8.3).
Codec = Literal["none", "zstd"]
#: Every codec, in on-disk code order: a tensor table stores a record's codec as its index here.
CODECS: Final[tuple[Codec, ...]] = get_args(Codec)
#: Codec name → its tensor-table code.
CODEC_CODES: Final[dict[str, int]] = {c: i for i, c in enumerate(CODECS)}

#: A continuation contract (spec §13).
Contract = Literal["exact", "statistical"]
CONTRACTS: Final[tuple[Contract, ...]] = get_args(Contract)

#: Who stores an entry's values: rank 0 once (``global``) or every rank (``per_rank``).
Scope = Literal["global", "per_rank"]
SCOPES: Final[tuple[Scope, ...]] = get_args(Scope)

#: What a per-rank entry gives a rank when the world size changed (spec §12.4).
WorldSizePolicy = Literal["require_same", "modulo", "rank0", "drop"]
POLICIES: Final[tuple[WorldSizePolicy, ...]] = get_args(WorldSizePolicy)

#: How an entry value is stored.
Encoding = Literal["json", "json+zstd"]
ENCODINGS: Final[tuple[Encoding, ...]] = get_args(Encoding)

#: The extension a manifest with a tensor table lists in ``must_understand`` (spec §8.5, 1.1).
TABLE_EXTENSION: Final = "tensor-table"

#: gc's default grace period (spec §15.2, R-GC-4): the library, the manager and the CLI.
DEFAULT_GRACE_SECONDS: Final = 3600.0
#: A grace period below this may delete a save still running: the CLI warns.
SHORT_GRACE_SECONDS: Final = 600.0

#: Longest entry name (characters).
ENTRY_NAME_MAX: Final = 256
#: The characters of an entry name, as stated in messages.
ENTRY_NAME_CHARS: Final = "[A-Za-z0-9._/-]"
_ENTRY_NAME: Final = re.compile(rf"^{ENTRY_NAME_CHARS}{{1,{ENTRY_NAME_MAX}}}\Z")  # \Z: no final "\n"


def is_entry_name(name: object) -> TypeGuard[str]:
    """Whether ``name`` is a valid entry name (spec §12.1).

    1-256 characters of ``[A-Za-z0-9._/-]``, and no empty, ``.`` or ``..`` part between slashes.
    """
    return (
        isinstance(name, str)
        and _ENTRY_NAME.match(name) is not None
        and all(p not in ("", ".", "..") for p in name.split("/"))
    )


def one_of(value: object, values: tuple[_T, ...]) -> TypeGuard[_T]:
    """Whether ``value`` is one of ``values`` (narrows ``value`` to their ``Literal`` type)."""
    return value in values
