"""What a manager stores in a version (the ``pck.manager`` entry) and reads back (no torch).

The entry is a global entry with an embedded JSON Schema (spec §14.6; the schema is
``spec/schemas/entries/manager-metrics.schema.json``): the step, why it was saved and the
metrics passed to ``maybe_save``. Retention's ``keep_best`` reads the metrics from there, so
the choice survives restarts and is visible to every tool.
"""

from __future__ import annotations

import functools
import json
import math
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


#: Each committed version's manager entry, read once per process: a manager's retention after
#: every save parsed every kept version's record and read its entry again (ops review F20).
_ENTRIES: dict[tuple[str, str, str | None], dict[str, Any] | None] = {}
_ENTRIES_MAX = 4096


def candidates_of(storage: Any, *, in_flight: set[str] | None = None) -> list[Any]:
    """Retention candidates of a root: every attempt, with metrics, drills and verifications."""
    from portable_ckpt.io.reader import Checkpoint
    from portable_ckpt.io.versions import list_versions, load_manifest
    from portable_ckpt.manager.retention import Candidate

    out = []
    for v in list_versions(storage):
        if v.status != "committed":
            out.append(Candidate(v.id, v.step, committed=False))
            continue
        key = (storage.url, v.id, v.committed_at)
        if key in _ENTRIES:  # a committed version's entry never changes
            value = _ENTRIES[key]
        else:
            try:
                value = read_manager_entry(Checkpoint(storage, v.id, load_manifest(storage, v.id)))
            except CheckpointError:
                out.append(Candidate(v.id, v.step, classified=False))
                continue
            _ENTRIES[key] = value
            while len(_ENTRIES) > _ENTRIES_MAX:
                _ENTRIES.pop(next(iter(_ENTRIES)))
        out.append(
            Candidate(
                v.id,
                v.step,
                metrics=None if value is None else value.get("metrics"),
                drilled=v.drilled,
                verification_failed=v.verification_failed,
                in_flight=v.id in (in_flight or set()),
                committed_at=v.committed_at,
            )
        )
    return out
