"""A second look at the damage a verification found, before it is recorded for ever.

A failed verification is never undone (R-DRILL-8): a version recorded as failed is never
restored again. A finding that a second read of the file does not reproduce is a fault of that
read (a flipped bit on its way, an inconsistent store), not of the version.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast

from portable_ckpt.errors import (
    DAMAGE_CODES,
    CheckpointError,
    ChecksumError,
    FileMissingError,
    StorageError,
)
from portable_ckpt.format.manifest import FileRecord, Manifest
from portable_ckpt.storage import Storage

if TYPE_CHECKING:
    from portable_ckpt.io.checksum import DamagedBlocks

__all__ = ["PLACEMENT_ENTRY", "ReadDamageVerdict", "absent_by_design", "confirm_damage",
           "confirmed_findings", "elsewhere", "holdings", "placement", "read_file_again",
           "record_read_damage", "writer_of"]


def confirm_damage(
    storage: Storage,
    attempt_id: str,
    files: Mapping[str, FileRecord],
    errors: Sequence[CheckpointError],
) -> list[CheckpointError]:
    """``errors`` with each finding of damage that a second look does not reproduce replaced.

    A verification's verdict is kept for ever (R-DRILL-8): one bit flipped on its way (a flaky
    NIC, a bad DIMM, a client cache), or one 404 of an inconsistent store, must not condemn an
    intact version (multi-job review F10, attack review 2 F12). So the file of each finding is
    read and checked once more (a local file's cached pages dropped first); a file answered
    absent must also be absent from a listing of its directory. A finding that does not come
    back becomes a ``StorageError`` saying so: a problem of this read, not of the version.
    A finding that names no file of the version, or that comes from checksum-verified bytes
    (a codec, header or dtype error), is kept as it is. Each file is read once, however many
    findings name it; a checksum finding is confirmed by damage found again in its own bytes
    (a deep verification names every damaged block of a file: incident review R6).
    """
    from portable_ckpt.io.checksum import DamagedBlocks

    out: list[CheckpointError] = []
    again: dict[str, tuple[CheckpointError | None, DamagedBlocks]] = {}
    listed: dict[str, set[str] | CheckpointError] = {}  # one listing per directory (F17)
    # How far each file is read again: to the end of the last bytes its findings name (a
    # restore's one bad block at the start of a 256 MiB shard was confirmed by reading all of
    # it while the other ranks waited); a file none of whose findings names bytes (a restore's
    # message, a size) only to its first damage, as before deep verifications named every
    # block; a file with both, whole.
    until: dict[str, int | None] = {}
    spans: set[str] = set()
    for e in errors:
        rel = _file_of(e, attempt_id, files) if e.code in _READ_AGAIN else None
        if rel is None:
            continue
        span = e.span if isinstance(e, ChecksumError) else None
        if span is not None:
            spans.add(rel)
        if span is None:
            until[rel] = None  # the whole file
        elif rel not in until:
            until[rel] = span[1]
        elif (end := until[rel]) is not None:
            until[rel] = max(end, span[1])
    for e in errors:
        rel = _file_of(e, attempt_id, files) if e.code in _READ_AGAIN else None
        if rel is None:
            out.append(e)
            continue
        if rel not in again:  # once per file, however many of its blocks a finding names
            log = DamagedBlocks()
            found = read_file_again(storage, f"{attempt_id}/{rel}", files[rel], listed,
                                    log if rel in spans else None, until=until[rel])
            again[rel] = (found, log)
        second = _here(e, *again[rel], files[rel].checksum.block_size)
        first = f"{e.path or rel}: a first read found [{e.code}] {e.message[:300]}"
        if second is None:
            out.append(StorageError(
                f"{first} — not found again when the file was read a second time: a transient "
                "fault of the storage or of this host, not damage of the version (not recorded)",
                path=e.path,
            ))
        elif second.code in DAMAGE_CODES:
            out.append(e)
        else:  # the second look did not happen: nothing is known either way (F8)
            out.append(StorageError(
                f"{first} — and the file could not be read a second time ([{second.code}] "
                f"{second.message[:300]}): not recorded; run the verification again when the "
                "storage answers",
                path=e.path, retryable=second.retryable,
            ))
    return out


def confirmed_findings(
    storage: Storage,
    attempt_id: str,
    files: Mapping[str, FileRecord],
    found: Sequence[tuple[str, str, str | None]],
) -> tuple[list[dict[str, str]], list[CheckpointError]]:
    """Findings of damage ``(code, message, path)`` that a second read of their file finds again.

    For a reader that met the damage (a restore, a drill) and records it as a failed
    verification (R-DRILL-8). A finding whose file cannot be told (another rank's, naming no
    file of the version) is not recorded: a later verification will look. A node root's
    files are told from lost ones by :func:`record_read_damage`, which calls this.

    Returns:
        The confirmed findings as ``{"code", "message"}``, and the errors that say why the
        others were not confirmed.

    """
    from portable_ckpt.errors import error_for_code

    errors: list[CheckpointError] = []
    for code, message, path in found:
        if code not in DAMAGE_CODES:
            continue
        rel = _finding_file(message, path, attempt_id, files)
        if rel:
            errors.append(error_for_code(code)(message, path=f"{attempt_id}/{rel}"))
    again = confirm_damage(storage, attempt_id, files, errors)
    kept = [{"code": x.code, "message": x.message[:4096]} for x in again if x.code in DAMAGE_CODES]
    return kept, [x for x in again if x.code not in DAMAGE_CODES]


def _finding_file(
    message: str, path: str | None, attempt_id: str, files: Collection[str]
) -> str:
    """The file of the version a reader's finding names (``""``: none).

    By its path, else by its message: another rank's finding arrives as text.
    """
    rel = (path or "").removeprefix(f"{attempt_id}/")
    if rel in files:
        return rel
    # The longest name the message holds: `data/s1.bin` is in a message about `data/s10.bin`.
    return max((f for f in files if f in message), key=len, default="")


#: What :func:`record_read_damage` did: recorded; nothing to record (``"none"``); the damage
#: was not found again (``"unconfirmed"``); every finding is a node root's file that a
#: node-local version keeps elsewhere (``"elsewhere"``); confirmed or not, it could not be
#: recorded, or the files could not be listed to tell (``"unrecorded"``).
ReadDamageVerdict = Literal["recorded", "none", "unconfirmed", "elsewhere", "unrecorded"]


def record_read_damage(
    storage: Storage,
    attempt_id: str,
    manifest: Manifest,
    found: Sequence[tuple[str, str, str | None]],
    *,
    verifier: str,
    confirmed: bool = False,
) -> tuple[ReadDamageVerdict, str | None, list[CheckpointError]]:
    """A reader (a restore, a drill) met damage: record what a second read finds again.

    The one way a reader's findings ``(code, message, path)`` become a failed verification
    (R-DRILL-8: never restored automatically again). A node-local version read through one
    node root lacks the other nodes' files by design (spec §14.7): which are absent is told by
    a listing of the version's directory, since a reader met only the files it needed (a
    drill of such a version through one node root recorded it as failed for good). Findings
    not ``confirmed`` yet are read again first (:func:`confirmed_findings`).

    Returns:
        The verdict (:data:`ReadDamageVerdict`), the record's path when one was written, and
        the errors that say why a finding was not recorded.

    """
    from portable_ckpt.io.annotations import write_verification_record

    damage = [f for f in found if f[0] in DAMAGE_CODES]
    if not damage:
        return "none", None, []
    if PLACEMENT_ENTRY in manifest.entries:
        try:
            # The version's files that are here: a file it does not list, named like another
            # node's shard, made a node root look like no node's (attack review 12b, B3).
            present = {o.path.removeprefix(f"{attempt_id}/")
                       for o in storage.list(f"{attempt_id}/")} & set(manifest.files)
        except CheckpointError as exc:  # cannot tell absent by design from lost
            return "unrecorded", None, [exc.with_traceback(None)]
        away = absent_by_design(placement(storage, attempt_id, manifest),
                                set(manifest.files) - present, present)
        damage = [f for f in damage if not (
            f[0] == "PCK-FILE-MISSING" and _finding_file(f[1], f[2], attempt_id, away))]
        if not damage:
            return "elsewhere", None, []
    notes: list[CheckpointError] = []
    if confirmed:
        kept = [{"code": c, "message": m[:4096]} for c, m, _ in damage]
    else:
        kept, notes = confirmed_findings(storage, attempt_id, manifest.files, damage)
        if not kept:
            return "unconfirmed", None, notes
    try:
        path = write_verification_record(
            storage, attempt_id, ok=False, mode="sample", fraction=1.0,  # it read what it met
            chunks=sum(t.range_count for t in manifest.tensors.values()),
            errors=kept[:64], verifier=verifier,
        )
    except CheckpointError as exc:
        return "unrecorded", None, [*notes, exc.with_traceback(None)]
    return "recorded", path, notes


def _here(
    e: CheckpointError, second: CheckpointError | None, log: DamagedBlocks, block_size: int
) -> CheckpointError | None:
    """What the second read found of finding ``e``: ``second``, narrowed to ``e``'s bytes.

    A checksum finding names its bytes: the second read confirms it only by damage there. A
    file damaged elsewhere, or read past those bytes before a storage error, does not.
    """
    span = e.span if isinstance(e, ChecksumError) else None
    if span is None or second is None:
        return second
    if log.overlaps(span[0], span[1], block_size):
        return second if second.code in DAMAGE_CODES else e  # found again before it stopped
    if second.code == "PCK-CHECKSUM" or log.checked >= span[1]:
        return None
    return second


#: Findings a second read can contradict. The others (a codec, header, dtype or layout error)
#: come from bytes whose checksums were verified first: the committed bytes say so every time.
_READ_AGAIN = frozenset({"PCK-CHECKSUM", "PCK-FILE-SIZE", "PCK-FILE-MISSING"})


def _file_of(e: CheckpointError, attempt_id: str, files: Mapping[str, FileRecord]) -> str | None:
    path = (e.path or "").removeprefix(f"{attempt_id}/")
    return path if path in files else None


def read_file_again(
    storage: Storage,
    full: str,
    rec: FileRecord,
    listed: dict[str, set[str] | CheckpointError] | None = None,
    damaged: DamagedBlocks | None = None,
    *,
    until: int | None = None,
) -> CheckpointError | None:
    """What a second read of ``full`` finds.

    ``None`` (intact), damage (a code of :data:`DAMAGE_CODES`), or the error that kept it from
    being read. ``listed``: the listings of directories made so far (one per directory, not
    one per missing file: 2,000 files took 25 s, attack review 3 F17). ``damaged``: the read
    goes on to the end of the file and logs every damaged block there (the first one is
    returned); without it, it stops at the first. ``until``: with ``damaged``, the read may
    stop past byte ``until - 1`` (the findings it confirms lie before).
    """
    from portable_ckpt.io.checksum import verify_file

    local = storage.local_root()
    if local is not None:  # read the device again, not the pages the first read cached
        with contextlib.suppress(OSError):
            # Never blocking: a FIFO under the file's name waited for a writer for ever, and
            # hung verify and every restart's restore (attack review 4 A2).
            fd = os.open(os.path.join(local, full),
                         os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    try:
        verify_file(storage, full, rec, damaged=damaged, until=until)  # its size asked again
        if damaged:
            return damaged.errors(full, rec.checksum.block_size, rec.size)[0]
    except FileMissingError as exc:
        parent = full.rsplit("/", 1)[0] + "/"
        listed = {} if listed is None else listed
        if parent not in listed:
            try:
                listed[parent] = {i.path for i in storage.list(parent, recursive=False)}
            except CheckpointError as why:
                listed[parent] = why.with_traceback(None)
        names = listed[parent]
        if isinstance(names, CheckpointError):
            return names
        if full in names:
            return StorageError(f"{full}: answered absent, yet listed")
        return exc.with_traceback(None)
    except CheckpointError as exc:
        return exc.with_traceback(None)
    return None


#: The entry of a version written to node-local roots (spec §14.7).
PLACEMENT_ENTRY = "pck.placement"


def elsewhere(
    storage: Storage, attempt_id: str, manifest: Manifest, errors: Sequence[CheckpointError]
) -> tuple[list[CheckpointError], list[str]]:
    """``errors`` without the files a node-local version keeps on other nodes; and those files.

    A version with a valid ``pck.placement`` entry was published in every node root while each
    holds only the files of the writers its node keeps (spec §14.7): read through one node
    root, another node's file is absent by design. Recorded as damage it condemned an intact
    version for good (SRE review F1, F2). Which files are spared is decided by
    :func:`absent_by_design`. Checksum and size findings of files that are there stay damage.
    """
    if PLACEMENT_ENTRY not in manifest.entries:
        return list(errors), []
    missing = {rel for e in errors if e.code == "PCK-FILE-MISSING"
               for rel in [_file_of(e, attempt_id, manifest.files)] if rel is not None}
    if not missing:
        return list(errors), []
    away = absent_by_design(
        placement(storage, attempt_id, manifest), missing, set(manifest.files) - missing
    )
    return [e for e in errors if _file_of(e, attempt_id, manifest.files) not in away], sorted(away)


def placement(storage: Storage, attempt_id: str, manifest: Manifest) -> dict[str, Any] | None:
    """The version's ``pck.placement`` value, or ``None``: no entry, or one that is not valid.

    Valid: readable, of the manager's placement schema, and consistent (one node per writer,
    nodes numbered from 0). Any other value spares nothing: the entry's name alone is no proof
    that a version was written to node roots (attack review 5 F4).
    """
    if PLACEMENT_ENTRY not in manifest.entries:
        return None
    from portable_ckpt.format.schemas import validate_document
    from portable_ckpt.io.reader import Checkpoint

    try:
        value = Checkpoint(storage, attempt_id, manifest).entry(PLACEMENT_ENTRY)
        validate_document(value, "entries/manager-placement.schema.json", what=PLACEMENT_ENTRY)
    except CheckpointError:
        return None
    nodes, of_rank = value["nodes"], value["node_of_rank"]
    if set(of_rank) != set(range(nodes)) or any(w >= len(of_rank) for w in value["everywhere"]):
        return None
    return cast(dict[str, Any], value)


def holdings(value: Mapping[str, Any]) -> list[set[int]]:
    """The writers whose files each node root holds, by ``pck.placement`` (spec §14.7).

    A node holds its own ranks' writers, those of the ``replicas`` preceding nodes, and the
    writers in ``everywhere``.
    """
    nodes, of_rank, replicas = value["nodes"], value["node_of_rank"], value["replicas"]
    return [
        {w for w, n in enumerate(of_rank) if (node - n) % nodes <= replicas}
        | set(value["everywhere"])
        for node in range(nodes)
    ]


def absent_by_design(
    value: Mapping[str, Any] | None, missing: Collection[str], present: Collection[str]
) -> set[str]:
    """Of a node-local version's ``missing`` files, those a node root holding ``present`` lacks.

    ``value``: the version's valid ``pck.placement`` (:func:`placement`); ``None`` spares
    nothing. A missing file is spared when the files here can be one node's root (every
    present file's writer is among the writers that node holds) and its writer is not among
    them. When ``present`` fits no node (a durable copy, which holds every writer, that lost
    some of them: review of the change F7, attack review 5 F4), every missing file is damage.
    A durable copy that lost exactly the writers some node lacks looks like that node's root:
    files alone cannot tell them apart, so a caller must not call a verification that spared
    files a pass unless it knows it reads a node root (``verify --node-root``). A file named by
    no writer (``wNNNNN`` or a per-rank entry's ``rNNNNN``) is never spared.
    """
    if value is None or not missing:
        return set()
    here = {w for w in (writer_of(p) for p in present) if w is not None}
    fitting = [held for held in holdings(value) if here <= held]
    if not fitting:
        return set()
    # An intact node root has a file of every writer it holds: the nodes that leave the fewest
    # held writers without a file here are the ones these files can be the root of, and a
    # file is spared only if each of them lacks its writer (diff review 3 F1: a union over
    # every fitting node spared all but writer 0's files of a copy that kept only those).
    fewest = min(len(held - here) for held in fitting)
    best = [held for held in fitting if len(held - here) == fewest]
    return {rel for rel in missing
            if (w := writer_of(rel)) is not None and all(w not in held for held in best)}


_WRITER = re.compile(
    r"data/w([0-9]{5,})-[^/]*|index/w([0-9]{5,})\.json|entries/[^/]*\.r([0-9]{5,})\.json(?:\.zst)?"
)


def writer_of(rel: str) -> int | None:
    """The writer a file's recommended name gives.

    ``data/w00003-0000…``, ``index/w00003.json``, a per-rank entry value
    ``entries/<name>-<hash>.r00003.json``; a global entry's value belongs to no writer.
    """
    m = _WRITER.fullmatch(rel)  # by directory: an entry's own name may read "w00003-..."
    if m is None:
        return None
    return int(next(g for g in m.groups() if g is not None))
