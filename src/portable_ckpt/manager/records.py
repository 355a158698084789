"""What a manager stores in a version (the ``pck.manager`` entry) and reads back (no torch).

The entry is a global entry with an embedded JSON Schema (spec §14.6; the schema is
``spec/schemas/entries/manager-metrics.schema.json``): the step, why it was saved and the
metrics passed to ``maybe_save``. Retention's ``keep_best`` reads the metrics from there, so
the choice survives restarts and is visible to every tool.
"""

from __future__ import annotations

import collections
import functools
import json
import math
import threading
from collections.abc import Mapping
from typing import Any

from portable_ckpt.errors import CheckpointError, UsageError

__all__ = [
    "MANAGER_ENTRY",
    "candidates_of",
    "manager_entry_schema",
    "manager_entry_value",
    "placement_entry_schema",
    "read_manager_entry",
]

#: Name of the manager's global entry.
MANAGER_ENTRY = "pck.manager"


@functools.cache
def _schema_text(name: str) -> str:
    from portable_ckpt.format.schemas import schema_dir

    doc = json.loads((schema_dir() / "entries" / name).read_text("utf-8"))
    doc.pop("$id", None)  # embedded: no base URI of its own
    doc.pop("title", None)
    return json.dumps(doc, sort_keys=True)


def manager_entry_schema() -> dict[str, Any]:
    """The embedded-schema declaration ``{"json_schema": ...}`` of ``pck.manager``."""
    return {"json_schema": json.loads(_schema_text("manager-metrics.schema.json"))}


def placement_entry_schema() -> dict[str, Any]:
    """The embedded-schema declaration of ``pck.placement`` (node-local tiers, spec §14.7)."""
    return {"json_schema": json.loads(_schema_text("manager-placement.schema.json"))}


def manager_entry_value(
    step: int, reason: str, metrics: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Build the entry's value; refuses metrics that are not finite JSON scalars (PCK-USAGE)."""
    clean: dict[str, Any] = {}
    for k, v in (metrics or {}).items():
        if not isinstance(k, str) or not 1 <= len(k) <= 256:
            raise UsageError(f"metric name {k!r:.60} must be a str of 1-256 characters")
        if hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
            v = v.item()  # torch / numpy scalars
        if isinstance(v, float) and not math.isfinite(v):
            v = None  # a diverged loss is stored as "no value", never as NaN
        if v is not None and not isinstance(v, bool | int | float | str):
            raise UsageError(f"metric {k!r}: {type(v).__name__} is not a number, str or bool")
        clean[k] = v
    return {"step": int(step), "reason": reason or "requested", "metrics": clean}


def read_manager_entry(ck: Any) -> dict[str, Any] | None:
    """The ``pck.manager`` value of an open version, or ``None`` when it has none."""
    if MANAGER_ENTRY not in ck.entries:
        return None
    value = ck.entry(MANAGER_ENTRY)
    return value if isinstance(value, dict) else None


#: Each committed version's manager metrics (``None`` without an entry), read once per process:
#: a manager's retention after every save parsed every kept version's record and read its entry
#: again (ops review F20). Each entry keeps the tick of its last use: a pass of
#: :func:`candidates_of` never evicts what it used itself (it thrashed as the listings' caches
#: did, scale review C: :func:`~portable_ckpt.io.annotations.listing_pass`).
_ENTRIES: collections.OrderedDict[
    tuple[str, str, str | None], tuple[Any, int]
] = collections.OrderedDict()


#: Entries at most, as the listings' summaries (a root listed from that cache finds its
#: versions' metrics here too): each about 600 bytes with a few metrics (measured), so about
#: 10 MiB (was 4,096, evicted oldest first: past that every pass read every manifest again).
_ENTRIES_MAX = 16384


_ENTRIES_LOCK = threading.Lock()


def _metrics_of(storage: Any, attempt_id: str) -> Any:
    """The metrics of a committed version's manager entry (``None``: no entry, or none there)."""
    from portable_ckpt.io.reader import Checkpoint
    from portable_ckpt.io.versions import load_manifest

    value = read_manager_entry(Checkpoint(storage, attempt_id, load_manifest(storage, attempt_id)))
    return None if value is None else value.get("metrics")


def candidates_of(storage: Any, *, in_flight: set[str] | None = None) -> list[Any]:
    """Retention candidates of a root: every attempt, with metrics, drills and verifications."""
    from portable_ckpt.io.annotations import listing_pass

    with listing_pass():  # entries this pass used stay (see _ENTRIES)
        return _candidates_of(storage, in_flight)


def _candidates_of(storage: Any, in_flight: set[str] | None) -> list[Any]:
    """:func:`candidates_of` within its listing pass."""
    from portable_ckpt.io.annotations import evictable, tick
    from portable_ckpt.io.versions import list_versions
    from portable_ckpt.manager.retention import Candidate

    out = []
    for v in list_versions(storage, missing_ok=True):  # (a root not saved to yet)
        if v.status != "committed":
            out.append(Candidate(v.id, v.step, committed=False))
            continue
        key = (storage.url, v.id, v.committed_at)
        with _ENTRIES_LOCK:  # a committed version's entry never changes
            kept = _ENTRIES.get(key)
            if kept is not None:
                _ENTRIES[key] = (kept[0], tick())
                _ENTRIES.move_to_end(key)
        if kept is not None:
            metrics = kept[0]
        else:
            try:
                metrics = _metrics_of(storage, v.id)
            except CheckpointError:
                out.append(Candidate(v.id, v.step, classified=False))
                continue
            with _ENTRIES_LOCK:  # least recently used first; what this pass used stays
                while (key not in _ENTRIES and len(_ENTRIES) >= _ENTRIES_MAX
                       and evictable(next(iter(_ENTRIES.values()))[1])):
                    _ENTRIES.popitem(last=False)
                if len(_ENTRIES) < _ENTRIES_MAX:  # else full of this pass's own: not kept
                    _ENTRIES[key] = (metrics, tick())
        out.append(
            Candidate(
                v.id,
                v.step,
                metrics=metrics,
                drilled=v.drilled,
                verification_failed=v.verification_failed,
                in_flight=v.id in (in_flight or set()),
                committed_at=v.committed_at,
            )
        )
    return out
