"""A load's first phase: rank 0 finds the version; every rank gets its commit record.

The record is read once per load, by the ranks together (:class:`RecordShare`): rank 0 names
the attempt it will most likely pick and the size of its ``manifest.json``; each rank reads one
slice of it (at least 64 KiB) and the slices are exchanged. Every rank then parses the whole
record at the same time, rank 0 while it classifies the attempts (it does not read the record
again). Before, rank 0 read all of it and sent it, and the other ranks parsed it after rank 0:

* a 2 M-parameter model's 260 KB record was 4 % of the bytes rank 0 read for its 6.2 MB of
  targets (the other ranks read none of it); a 64-rank job's multi-MB record was one read (one
  GET on S3) that every rank waited for;
* the parse on the other ranks came after rank 0's: 8-12 ms before the first data read of a
  cold 4→2 load of the realistic benchmark's state.

The likely attempt is nearly always the one rank 0 picks. When it is not (several attempts of
one step, a newer record that does not validate), rank 0 sends the one it picked in a second
broadcast; every rank knows to expect it because the pick is exchanged in the resolve step.

Rank 0's own copy of the record has the last word, as when it read the record alone. The ranks
may read different copies (each node's root of a node-local tier holds one): when the record
assembled from slices of other ranks does not validate but rank 0's own copy does, rank 0
resolves again from its own reads and sends the record it picked.
"""

from __future__ import annotations

from collections.abc import Callable

from portable_ckpt.errors import CheckpointError, UsageError
from portable_ckpt.format import jsonio
from portable_ckpt.format.manifest import Manifest, parse_manifest
from portable_ckpt.format.naming import ATTEMPT_ID_RE
from portable_ckpt.io.versions import (
    COMMITTED,
    attempt_names,
    classify_attempt,
    classify_record,
    latest,
    likely_record,
    load_manifest,
)
from portable_ckpt.storage import Storage
from portable_ckpt.torch._collectives import Comm

__all__ = ["MIN_SLICE", "RESOLVE_FAILED", "RecordShare", "received", "record_bytes", "resolve"]

RESOLVE_FAILED = "the target state was not touched"
_WHAT = "load/manifest"


def resolve(
    storage: Storage,
    step: int | None,
    checkpoint_id: str | None,
    known: dict[str, bytes] | None = None,
    names: list[str] | None = None,
) -> tuple[str, Manifest]:
    """Rank 0: the attempt id to load and its manifest (a given id must have a readable one).

    ``known``: records read already, by attempt id (not read again); ``names``: the attempts
    of ``step`` listed already (not listed again).
    """
    if checkpoint_id is not None:
        manifest = load_manifest(storage, checkpoint_id, known=known)
        if step is not None and manifest.step != step:
            raise UsageError(f"load: version {checkpoint_id} holds step {manifest.step}, not {step}")
        return checkpoint_id, manifest
    return latest(storage, step, known=known, names=names)


def record_bytes(manifest: Manifest) -> bytes:
    """The bytes of ``manifest.json`` as read (or the record encoded, when it was not read)."""
    if manifest.source is not None:
        return manifest.source
    return jsonio.dumps(manifest.to_json())


def received(record: bytes, attempt_id: str) -> Manifest:
    """Parse and validate the manifest rank 0 sent (the checks of a manifest read from storage)."""
    what = f"{attempt_id}/manifest.json (from rank 0)"
    doc = jsonio.loads(record, what=what, max_bytes=jsonio.MAX_MANIFEST_BYTES)
    return parse_manifest(doc, what=what, directory_name=attempt_id)


class RecordShare:
    """Rank 0's commit record on every rank, read in slices by all of them.

    The collectives, in the same order on every rank:

    1. a broadcast of the likely attempt id and the size of its record (empty when rank 0
       has none, or failed before it looked);
    2. when there is one: an all-gather of the slices, each marked read or failed;
    3. the resolve step's all-gather, which carries the attempt id rank 0 picked and whether
       it kept the record read together (:meth:`pick`, :meth:`trust`);
    4. only when it picked another attempt, or did not keep that record: a broadcast of the
       picked record (:meth:`share`).
    """

    def __init__(self, comm: Comm) -> None:
        self.comm = comm
        self.likely: str | None = None  # the attempt whose record was read together
        self.record: bytes | None = None  # its bytes, when every slice was read (and trusted)
        self.mixed = False  # ranks other than 0 read some of them
        self.names: list[str] | None = None  # rank 0: the root's attempts, listed once
        self._parsed: Manifest | Exception | None = None  # ranks > 0: the record, parsed
        self._announced = False

    # -- steps 1 and 2 --------------------------------------------------------------------------

    def announce(self, storage: Storage, step: int | None, checkpoint_id: str | None) -> None:
        """Rank 0: name the likely attempt, then read its record with the others."""
        likely = None
        if checkpoint_id is None:
            try:
                self.names = attempt_names(storage, step)
            except CheckpointError:
                self.names = None  # listed again by the resolve, which reports the error
            else:
                likely = likely_record(storage, step, names=self.names)
        elif ATTEMPT_ID_RE.match(checkpoint_id):
            likely = _sized(storage, checkpoint_id)
        self._exchange(storage, likely)

    def close(self) -> None:
        """Rank 0, at the end of its resolve (failed or not): every peer waits for step 1."""
        if not self._announced:
            self._exchange(None, None)

    def receive(self, storage: Callable[[], Storage]) -> None:
        """Ranks > 0, before the resolve step: read a slice, assemble the record, parse it.

        A parse error is kept: it matters only if rank 0 picks that attempt, and then it is
        raised where every rank learns of it (:meth:`manifest`, inside the load step).
        """
        self._exchange(storage, None)
        if self.likely is not None and self.record is not None:
            try:
                self._parsed = received(self.record, self.likely)
            except Exception as e:  # raised in the load step, where every rank hears of it
                self._parsed = e

    def _exchange(
        self, storage: Storage | Callable[[], Storage] | None, likely: tuple[str, int] | None
    ) -> None:
        self._announced = True
        comm = self.comm
        said = f"{likely[0]}\n{likely[1]}".encode("ascii") if likely else b""
        if comm.rank == 0:
            comm.exchange(lambda: comm.broadcast_bytes(said, _WHAT), RESOLVE_FAILED)
        else:
            said = comm.exchange(lambda: comm.broadcast_bytes(b"", _WHAT), RESOLVE_FAILED)
        name, _, size_text = said.decode("ascii", "replace").partition("\n")
        if not said or not ATTEMPT_ID_RE.match(name) or not size_text.isdigit():
            return
        size = int(size_text)
        mine = _slice(storage, name, size, comm.rank, comm.world_size)
        parts = comm.exchange(lambda: comm.allgather_bytes(mine, _WHAT), RESOLVE_FAILED)
        self.likely = name
        if all(p[:1] == _READ for p in parts):
            record = b"".join(p[1:] for p in parts)
            self.record = record if len(record) == size else None
            self.mixed = any(len(p) > 1 for p in parts[1:])

    # -- rank 0's pick ---------------------------------------------------------------------------

    def pick(
        self, storage: Storage, step: int | None, checkpoint_id: str | None
    ) -> tuple[str, Manifest]:
        """Rank 0: resolve from the record read together; its own copy decides on a doubt.

        A doubt is the likely record failing to validate while other ranks read some of it:
        then rank 0 classifies its own copy, and when that one validates, it resolves again
        without the slices (and the record goes to the others in a second broadcast).
        """
        known, names = self.known(), self.names
        if not known or not self.mixed:
            return resolve(storage, step, checkpoint_id, known, names)
        likely = next(iter(known))
        try:
            found = resolve(storage, step, checkpoint_id, known, names)
        except CheckpointError:
            self.record = None  # the given id's record: re-read alone (its own error if any)
            return resolve(storage, step, checkpoint_id, None, names)
        if found[0] != likely and classify_record(likely, known[likely]).status != COMMITTED:
            if classify_attempt(storage, likely).status == COMMITTED:
                self.record = None  # the slices did not match this rank's copy
                return resolve(storage, step, checkpoint_id, None, names)
        return found

    def trust(self, together: bool) -> None:
        """Ranks > 0, after the resolve step: whether rank 0 kept the record read together."""
        if not together:
            self.record = None

    # -- steps 3 and 4 --------------------------------------------------------------------------

    def share(self, attempt_id: str, picked: Manifest | None) -> bytes:
        """After the resolve step: the picked record's bytes when they were not read together.

        Rank 0 passes the manifest it picked (and sends its bytes when needed); the others
        pass ``None`` and get the bytes (``b""`` when the record read together was the one).
        """
        if self._together(attempt_id) or self.comm.world_size == 1:
            return b""
        comm = self.comm
        record = record_bytes(picked) if picked is not None else b""
        return comm.exchange(lambda: comm.broadcast_bytes(record, _WHAT), RESOLVE_FAILED)

    def _together(self, attempt_id: str) -> bool:
        return self.likely == attempt_id and self.record is not None

    def manifest(self, attempt_id: str, record: bytes) -> Manifest:
        """Ranks > 0, in the load step: the picked record, parsed (or its parse error)."""
        if not self._together(attempt_id):
            return received(record, attempt_id)
        if isinstance(self._parsed, Exception):
            raise self._parsed
        if self._parsed is None:  # pragma: no cover - read together implies parsed or failed
            raise UsageError(f"load: the record of {attempt_id} was not parsed")
        return self._parsed

    def known(self) -> dict[str, bytes]:
        """Rank 0: the record read together, for :func:`resolve` (it is not read again)."""
        if self.likely is None or self.record is None:
            return {}
        return {self.likely: self.record}

    @property
    def together(self) -> bool:
        """Whether the record read together is still trusted (rank 0's word, after :meth:`pick`)."""
        return self.likely is not None and self.record is not None


_READ, _FAILED = b"\x01", b"\x00"
MIN_SLICE = 64 << 10  # a rank reads at least this much of a record (fewer, larger reads)


def _slice(
    storage: Storage | Callable[[], Storage] | None, name: str, size: int, rank: int, world: int
) -> bytes:
    """A rank's slice of ``<name>/manifest.json``, marked read or failed.

    On a failure anywhere, rank 0 reads the record alone, as if it had not been read together,
    and reports what it finds; a storage this rank cannot open is opened again, and its error
    raised, in the resolve step. Any exception counts: one raised here, outside a step, would
    leave the other ranks waiting in the exchange of the slices.
    """
    part = max(MIN_SLICE, -(-size // world))
    lo, hi = rank * part, min(size, (rank + 1) * part)
    if lo >= hi:
        return _READ
    try:
        st = storage() if callable(storage) else storage
        if st is None:
            return _FAILED
        data = st.read_range(f"{name}/manifest.json", lo, hi - lo)
    except Exception:
        return _FAILED
    return _READ + data if len(data) == hi - lo else _FAILED


def _sized(storage: Storage, attempt_id: str) -> tuple[str, int] | None:
    """A given attempt and the size of its record (``None`` when rank 0 should read it alone)."""
    rel = f"{attempt_id}/manifest.json"
    try:
        size = storage.size(rel) if storage.exists(rel) else 0
    except CheckpointError:  # rank 0 reads it alone, and reports what it finds
        return None
    return (attempt_id, size) if 0 < size <= jsonio.MAX_MANIFEST_BYTES else None
