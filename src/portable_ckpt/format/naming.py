"""Attempt identities and file names chosen by writers."""

from __future__ import annotations

import datetime as _dt
import re
import secrets

from portable_ckpt.errors import AttemptIdError, UsageError

__all__ = [
    "ATTEMPT_ID_RE",
    "PROBE_PREFIX",
    "PROBE_RE",
    "MAX_STEP",
    "attempt_time",
    "check_attempt_id",
    "data_file_name",
    "entry_file_name",
    "index_file_name",
    "new_attempt_id",
    "parse_attempt_step",
    "utc_now_iso",
]

#: Attempt ids: step, UTC time to the microsecond, 64 random bits.
ATTEMPT_ID_RE = re.compile(r"^s([0-9]{12})-([0-9]{8}T[0-9]{12})Z-([0-9a-f]{16})\Z")
#: A probe object at a root's top (spec §15.2): a clock probe ``.pck-clock-<16 hex>`` (gc's
#: clock, copy's same-root test) or any other probe ``.pck-probe-<16 hex>`` (the S3 backend's
#: checksum and ``If-None-Match`` probes): readers ignore it, ``ls`` does not list it among
#: foreign entries, gc deletes a leftover an hour old.
PROBE_RE = re.compile(r"\.pck-(?:clock|probe)-[0-9a-f]{16}\Z")
#: The name of a probe that is no clock probe (spec §15.2), without its 16 hex digits.
PROBE_PREFIX = ".pck-probe-"
#: Largest step an attempt id can carry.
MAX_STEP = 10**12 - 1


def utc_now_iso() -> str:
    """Current UTC time as ``YYYY-MM-DDTHH:MM:SS.ffffffZ``."""
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def new_attempt_id(step: int, *, now: _dt.datetime | None = None) -> str:
    """Return a fresh, never-reused attempt id for ``step``.

    Raises:
        UsageError: ``step`` is no int in ``[0, MAX_STEP]``, or ``now`` no ``datetime``.

    """
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEP:
        raise UsageError(f"step must be an int in [0, {MAX_STEP}], got {step!r}")
    if now is not None and not isinstance(now, _dt.datetime):  # (was AttributeError: strftime)
        raise UsageError(
            "new_attempt_id: now must be a datetime.datetime (UTC) or None, got "
            f"{type(now).__name__} {now!r:.80}"
        )
    t = now or _dt.datetime.now(_dt.UTC)
    return f"s{step:012d}-{t.strftime('%Y%m%dT%H%M%S%f')}Z-{secrets.token_hex(8)}"


def check_attempt_id(value: object, *, what: str = "attempt id") -> str:
    """Validate an attempt id and return it (``AttemptIdError`` otherwise)."""
    if not isinstance(value, str) or not ATTEMPT_ID_RE.match(value):
        raise AttemptIdError(
            f"{what} {value!r} is not a valid attempt id (expected s<12-digit step>-<YYYYMMDD>T"
            "<HHMMSSffffff>Z-<16 hex>)"
        )
    return value


def parse_attempt_step(attempt_id: str) -> int | None:
    """Return the step encoded in an attempt id, or ``None`` if it is not one."""
    m = ATTEMPT_ID_RE.match(attempt_id)
    return int(m.group(1)) if m else None


def attempt_time(attempt_id: str) -> float | None:
    """Return the creation time (epoch seconds) encoded in an attempt id, or ``None``."""
    m = ATTEMPT_ID_RE.match(attempt_id)
    if not m:
        return None
    try:
        t = _dt.datetime.strptime(m.group(2), "%Y%m%dT%H%M%S%f").replace(tzinfo=_dt.UTC)
    except ValueError:
        return None
    return t.timestamp()


def data_file_name(writer: int, seq: int) -> str:
    """Relative path of a writer's ``seq``-th shard file."""
    return f"data/w{writer:05d}-{seq:04d}.safetensors"


def index_file_name(writer: int) -> str:
    """Relative path of a writer's index document."""
    return f"index/w{writer:05d}.json"


_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def entry_file_name(name: str, rank: int | None, compressed: bool) -> str:
    """Relative path of one value of a non-tensor entry (name sanitised, made unique by a hash)."""
    import hashlib

    base = _SAFE.sub("_", name)[:80].strip(".") or "entry"
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:8]
    scope = "g" if rank is None else f"r{rank:05d}"
    return f"entries/{base}-{digest}.{scope}.json" + (".zst" if compressed else "")
