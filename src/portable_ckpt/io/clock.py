"""The storage's clock and the probes that ask it (spec §15.2).

Ages that decide deletions (gc's grace period, copy's wait for a stale attempt) are measured
on the storage's clock, the one that dated the files: a probe ``.pck-clock-<hex>`` is written
at the root, its listed modification time read, and the probe deleted. The same probe,
written through one root URL and looked for through another, tells whether two URLs name one
root (:func:`same_root`).
"""

from __future__ import annotations

import logging
import secrets

from portable_ckpt.errors import CheckpointError
from portable_ckpt.format.naming import PROBE_RE
from portable_ckpt.storage import Storage

__all__ = ["PROBE_LEFTOVER_SECONDS", "same_root", "storage_clock"]

_log = logging.getLogger("portable_ckpt.io.gc")  # (its messages were gc's: same logger)

#: A probe's name (spec §15.2: a clock probe, or another tool's ``.pck-probe-<16 hex>``, such
#: as the S3 backend's); one older than an hour is a leftover any gc may delete.
_PROBE = PROBE_RE


PROBE_LEFTOVER_SECONDS = 3600.0


def _probe_name() -> str:
    """A fresh probe name (:data:`~portable_ckpt.format.naming.PROBE_RE`, spec §15.2)."""
    return f".pck-clock-{secrets.token_hex(8)}"


def same_root(root: Storage, other: Storage) -> bool | None:
    """Whether ``other`` is ``root`` under another name: a probe put into ``other`` shows in ``root``.

    Two spellings of one root of a registered scheme (``quirk:///w/q``, ``quirk:///w/./q``),
    or a bucket behind two endpoints, are no independent copy: compared as text they were,
    and ``gc --require-copy`` counted a version's "copy" in its own root (backend review B2).
    The probe is named and emptied as the clock probe (spec §15.2: readers ignore it, gc
    deletes a leftover). ``None`` when it cannot tell (``other`` refused the probe).
    """
    name = _probe_name()
    try:
        other.put(name, b"")
    except CheckpointError:
        return None
    try:
        return root.exists(name)
    except CheckpointError:
        return None
    finally:
        try:
            other.delete(name)
        except CheckpointError as exc:
            _log.warning("%s: could not delete the probe %s (%s); a later gc deletes it once "
                         "it is an hour old", other.url, name, exc)


def storage_clock(storage: Storage, *, tidy: bool = True) -> float | None:
    """The storage's time now: the modification time it gives a probe file written at its root.

    ``None`` when it cannot be asked (a read-only root, no listing of the probe). The probe
    (``.pck-clock-<16 hex>``, empty, spec §15.2) is deleted again; readers ignore such names
    (R-LAYOUT-4). ``tidy``: also delete probes of either name (``.pck-clock-`` and
    ``.pck-probe-``) the same listing shows older than :data:`PROBE_LEFTOVER_SECONDS` (a failed
    delete, a store that answered a delete without deleting, or a killed tool left them: F15).
    """
    name = _probe_name()
    try:
        storage.put(name, b"")
    except CheckpointError:
        return None
    try:
        listed = [o for o in storage.list("", recursive=False) if _PROBE.match(o.path)]
    except CheckpointError:
        listed = []
    there = next((o.mtime for o in listed if o.path == name), None)
    stale = [o.path for o in listed if there is not None and o.path != name
             and there - o.mtime > PROBE_LEFTOVER_SECONDS] if tidy else []
    for path in [name, *stale]:
        try:
            storage.delete(path)
        except CheckpointError as exc:
            _log.warning("%s: could not delete the clock probe %s (%s); a later gc deletes it "
                         "once it is an hour old", storage.url, path, exc)
    return there
