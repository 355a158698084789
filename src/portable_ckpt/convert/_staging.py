"""Staging directories of conversions: named by their owner, swept when provably stale.

Staging and what a killed conversion leaves (conversion review M4): an exception or a signal
the process handles (Ctrl-C, SIGTERM) removes the staging, but ``kill -9``, the OOM killer or a
lost host cannot; a DCP → HF conversion of 1.6 GiB left 3.2 GiB of hidden directories beside
DST that nothing ever removed. Every staging directory is therefore named so that it tells,
by its name alone, that it is this tool's and who made it (:func:`make_staging`)::

    .pck-staging-<host>-<pid>-<start>-<machine>-<random>

``start`` is the process's start time (``/proc/<pid>/stat``, clock ticks since boot), and
``machine`` 12 hex digits of a hash of the kernel's boot id and the process's pid namespace:
two hosts (or containers) with one host name, or one host after a reboot, have different
``machine`` values, so a pid is only ever looked up where it means the same process. The name
is the record: it is made atomically with the directory (``mkdir``), so there is no owner file
that a kill could leave unwritten, and nothing has to be read to classify it.

Every conversion to a non-portable target first sweeps the destination's directory
(:func:`sweep_staging`). A staging directory is removed only when positively classified as
this tool's and stale:

* the exact name above, a real directory (``lstat``: a symbolic link is never followed nor
  removed), owned by this user;
* and its owner provably gone: same ``machine``, and the pid is absent (``ESRCH``), a zombie,
  or a different process (another start time) — or, where that cannot be told (another host,
  an unreadable ``/proc``), nothing inside it (every entry's modification time, ``lstat``) was
  changed for :data:`STAGING_GRACE_SECONDS`, measured on the file system's clock (a probe file's
  modification time, as gc measures its grace) so that another host's clock does not count.

Anything else is kept: a live owner on this host (whatever its age: a stopped or slow
conversion keeps its staging), a fresh directory from another host, a directory that could
not be read or dated in full ("could not read" is never "abandoned"), another user's, a
foreign entry with a similar name. Each kept one that is not provably live, and each removed
one, is told (path, bytes, why, and for a kept one the command that removes it), in the
conversion's report and the log (``convert.staging_removed`` / ``convert.staging_kept``).
Staging that earlier versions of this module left (``.pck-convert-*``, ``.pck-export-*``,
``.<DST>.tmp-*``) names no owner: it is told, never removed.

A removal first renames the directory to ``.pck-swept-<random>`` (one ``rename``, so two
sweeps never both remove it, and an owner that is in fact still running, say stopped for
longer than the grace period on another host, fails at its own ``rename`` onto DST with
"nothing was published" instead of publishing a half-removed directory), then removes it with
:func:`_remove_tree` (bottom-up, never following a symbolic link and never entering another
file system: a mount inside is left, and said). A sweep killed after that rename leaves a
``.pck-swept-*`` directory, which the next sweep removes. Work is bounded: one listing of the directory, at most
:data:`MAX_SWEPT` staging directories looked at, and at most :data:`MAX_WALK` entries dated per
directory (a larger one is dated as "could not read": kept, unless its owner is provably gone).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import secrets
import shlex
import socket
import stat
from dataclasses import dataclass
from typing import Any

from portable_ckpt.logs import human_bytes, log_event

__all__ = [
    "MAX_SWEPT",
    "MAX_WALK",
    "STAGING_GRACE_SECONDS",
    "StagingNote",
    "make_staging",
    "sweep_staging",
]

_log = logging.getLogger("portable_ckpt.convert")

#: A staging directory whose owner cannot be asked (another host) is removed once nothing in it
#: changed for this long (an hour, as gc's leftover probes): a conversion writes its staging
#: continuously, so an hour without a write is a conversion that is gone or stopped.
STAGING_GRACE_SECONDS = 3600.0
#: Staging directories looked at per sweep (the others are told, and looked at next time).
MAX_SWEPT = 64
#: Entries dated (or counted) per staging directory.
MAX_WALK = 100_000

_PREFIX = ".pck-staging-"
_STAGING_RE = re.compile(
    r"\.pck-staging-(?P<host>[A-Za-z0-9._-]{1,40})-(?P<pid>[1-9][0-9]{0,9})-(?P<start>[0-9]{1,20})"
    r"-(?P<machine>[0-9a-f]{12}|none)-[0-9a-f]{12}\Z"
)
_SWEPT_RE = re.compile(r"\.pck-swept-[0-9a-f]{12}\Z")
#: What earlier versions left: tempfile.mkdtemp names, and ``staged``'s ``.<DST>.tmp-<hex>``.
_LEGACY_RE = re.compile(r"\.pck-(?:convert|export)-[a-z0-9_]{8}\Z")


def make_staging(parent: str) -> str:
    """Make and return a new private (0700) staging directory in ``parent``.

    Its name says whose it is (host, pid, start time, machine: the module's docstring), so that
    a later sweep can tell a dead owner's from a live one's without reading anything in it.
    """
    host, pid, start, machine = _me()
    name = f"{_PREFIX}{host}-{pid}-{start}-{machine}-{secrets.token_hex(6)}"
    path = os.path.join(parent, name)
    os.mkdir(path, 0o700)
    return path


_ME: dict[int, tuple[str, int, int, str]] = {}


def _me() -> tuple[str, int, int, str]:
    """The (host, pid, start ticks or 0, machine or ``none``) of this process; kept per pid (fork)."""
    pid = os.getpid()
    if pid not in _ME:
        host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:40] or "host"
        _ME[pid] = (host, pid, _start_ticks(pid) or 0, _machine())
    return _ME[pid]


def _machine() -> str:
    """12 hex digits naming this boot of this kernel and this pid namespace, or ``none``.

    Only where two names agree on it is a pid in one a process the other can look up: the host
    name alone is no such proof (containers, cloned VMs), and a reboot reuses pids.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        ns = os.readlink("/proc/self/ns/pid")
    except (OSError, ValueError):
        return "none"
    if not boot or not ns:
        return "none"
    return hashlib.sha256(f"{boot}\0{ns}".encode()).hexdigest()[:12]


def _proc_stat(pid: int) -> tuple[bytes, int] | None:
    """(state, start ticks) of ``pid`` from ``/proc``, or ``None`` when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0], int(fields[19])  # fields 3 (state) and 22 (starttime) of proc(5)
    except (OSError, IndexError, ValueError):
        return None


def _start_ticks(pid: int) -> int | None:
    got = _proc_stat(pid)
    return None if got is None else got[1]


def _owner_gone(pid: int, start: int) -> bool | None:
    """Whether the process that made a staging name on this machine is gone; ``None``: unknown.

    Gone: no such pid (``ESRCH``), a zombie, or a process with another start time (the pid was
    reused). Running: the pid with the recorded start time. Unknown: the name recorded no start
    time, or ``/proc`` hides the process (``hidepid``) while ``kill(pid, 0)`` says it exists.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # exists, another user's
    except OSError:
        return None
    got = _proc_stat(pid)
    if got is None:
        return None
    state, ticks = got
    if state in (b"Z", b"X"):
        # A main thread that exited while others write on shows as a zombie (re-attack 25,
        # L2): gone only when no thread is left.
        try:
            return len(os.listdir(f"/proc/{pid}/task")) <= 1
        except OSError:
            return True
    if start == 0:
        return None
    return ticks != start


@dataclass
class StagingNote:
    """A staging directory a sweep removed or kept (and told: it was not provably live).

    Attributes:
        path: the directory.
        bytes: bytes of the files in it (``None``: not counted; a lower bound past
            :data:`MAX_WALK` entries).
        removed: whether this sweep removed it.
        why: why it was removed or kept, and for a kept one how to remove it.

    """

    path: str
    bytes: int | None
    removed: bool
    why: str

    def to_json(self) -> dict[str, Any]:
        """The note as JSON data (the ``staging`` list of ``convert --json``)."""
        return {"path": self.path, "bytes": self.bytes, "removed": self.removed, "why": self.why}


def sweep_staging(
    parent: str, *, dst: str | None = None, grace_seconds: float = STAGING_GRACE_SECONDS
) -> list[StagingNote]:
    """Remove the stale staging of killed conversions in ``parent``; return what was told.

    What is removed and what is kept, and why: the module's docstring. ``dst`` (a destination
    in ``parent``) also tells staging an earlier version left for it (``.<name>.tmp-*``).
    Never raises for what it finds: what it cannot read is kept and told. Each note is logged
    (``convert.staging_removed`` / ``convert.staging_kept``, WARNING).
    """
    old_tmp = (re.compile(re.escape(f".{os.path.basename(os.path.abspath(dst))}.tmp-")
                          + r"[0-9a-f]{12}\Z") if dst is not None else None)
    try:
        with os.scandir(parent) as it:  # one listing; only names are looked at here
            names = sorted(e.name for e in it if e.name.startswith(".pck-") or (
                old_tmp is not None and old_tmp.match(e.name)))
    except OSError as exc:
        _log.info("could not list %s to look for stale conversion staging: %s", parent, exc)
        return []
    ours = [n for n in names if _STAGING_RE.match(n) or _SWEPT_RE.match(n)]
    legacy = [n for n in names if _LEGACY_RE.match(n) or (old_tmp and old_tmp.match(n))]
    notes: list[StagingNote] = []
    now = _fs_now(parent) if ours else None
    for name in ours[:MAX_SWEPT]:
        note = _sweep_one(os.path.join(parent, name), now, grace_seconds)
        if note is not None:
            notes.append(note)
    for name in legacy[:MAX_SWEPT]:
        path = os.path.join(parent, name)
        notes.append(StagingNote(
            path, _walk(path)[0], False,
            "a conversion's staging as earlier portable_ckpt versions named it, which names "
            "no owner: never removed here; once no conversion writes to "
            f"{parent}, remove it: rm -rf -- {_quote(path)}"))
    more = len(ours[MAX_SWEPT:]) + len(legacy[MAX_SWEPT:])
    if more:
        notes.append(StagingNote(parent, None, False, f"{more} more staging entries not looked "
                                 f"at (at most {MAX_SWEPT} per conversion): the next "
                                 "conversion here looks at them"))
    for note in notes:
        size = "size unknown" if note.bytes is None else human_bytes(note.bytes)
        log_event(
            _log, "convert.staging_removed" if note.removed else "convert.staging_kept",
            note.to_json(), "%s conversion staging %s (%s): %s",
            "removed" if note.removed else "kept", note.path, size, note.why,
            level=logging.WARNING,
        )
    return notes


def _quote(path: str) -> str:
    return shlex.quote(path)


def _fs_now(parent: str) -> float | None:
    """The file system's time now: the modification time it gives a new probe file in ``parent``.

    Ages are measured on the clock that dated the files (a host whose clock is off would
    otherwise remove a live conversion's staging): the probe is the clock probe of spec §15.2
    (``.pck-clock-<16 hex>``, deleted at once). ``None`` when it cannot be made: nothing is
    then removed for its age.
    """
    probe = os.path.join(parent, f".pck-clock-{secrets.token_hex(8)}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    except OSError:
        return None
    try:
        return os.fstat(fd).st_mtime
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)


def _walk(path: str) -> tuple[int | None, float | None, str | None]:
    """(bytes, newest modification time, why it could not be dated) of a tree, never followed.

    At most :data:`MAX_WALK` entries: past them the bytes are a lower bound and the tree is
    not dated. Any error (a directory it cannot list) leaves it undated too.
    """
    total, newest, seen = 0, None, 0
    todo = [path]
    try:
        top = os.lstat(path)
        newest = top.st_mtime
        if not stat.S_ISDIR(top.st_mode):
            return top.st_size, newest, None
        while todo:
            with os.scandir(todo.pop()) as it:
                for e in it:
                    seen += 1
                    if seen > MAX_WALK:
                        return total, None, f"more than {MAX_WALK:,} entries: not dated in full"
                    st = e.stat(follow_symlinks=False)
                    if st.st_dev != top.st_dev:  # a mount inside: neither counted nor entered
                        return total, None, f"{e.path} is another file system (a mount)"
                    newest = max(newest, st.st_mtime)
                    if e.is_dir(follow_symlinks=False):
                        todo.append(e.path)
                    else:
                        total += st.st_size
    except OSError as exc:
        return (total or None), None, f"could not read it ({exc.strerror or exc})"
    return total, newest, None


def _mount_points() -> frozenset[str]:
    """The mount points this process sees (``/proc/self/mountinfo``; none where it is absent).

    A bind mount of a directory of the same file system has the same ``st_dev``: only the
    mount table tells it (re-attack 25, M1).
    """
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return frozenset()
    out = set()
    for line in lines:
        fields = line.split(" ")
        if len(fields) > 4:
            # (octal escapes for space, tab, newline and backslash)
            out.add(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4]))
    return frozenset(out)


def mounted_below(path: str) -> str | None:
    """A mount point strictly below ``path`` (resolved), or None."""
    top = os.path.realpath(path).rstrip("/") + "/"
    return next((m for m in sorted(_mount_points()) if m.startswith(top)), None)


def _remove_tree(top: str) -> list[str]:
    """Remove the tree at ``top`` bottom-up; what could not be removed (empty: all of it).

    Never follows a symbolic link, and never enters another file system: a mount point inside
    a dead conversion's staging (a bind mount) is left with what it holds, and said
    (re-attack 25, M1: ``shutil.rmtree`` descended into it and deleted the mounted files).
    Iterative: a tree thousands of levels deep is no ``RecursionError`` (L1).
    """
    errors: list[str] = []
    try:
        dev = os.lstat(top).st_dev
    except OSError as exc:
        return [] if exc.errno == errno.ENOENT else [f"{top}: {exc.strerror}"]
    mounts = _mount_points()
    # Only mount points below ``top`` can be met (no link is followed); each is known by what
    # stands there (its device and inode), so that a directory is resolved (``realpath``, one
    # lstat per component) only when it is one of them: resolved for every directory, a dead
    # staging 1,500 levels deep took 36 s to remove (its depth squared in lstat calls).
    under = os.path.realpath(top).rstrip("/") + "/"
    marks: set[tuple[int, int]] = set()
    unknown = False  # a mount point that could not be looked at: resolve every directory
    for m in mounts:
        if m.startswith(under):
            try:
                st = os.lstat(m)
            except OSError:
                unknown = True
            else:
                marks.add((st.st_dev, st.st_ino))
    stack: list[tuple[str, bool]] = [(top, False)]
    while stack:
        path, listed = stack.pop()
        if listed:
            try:
                os.rmdir(path)
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    errors.append(f"{path}: {exc.strerror}")
            continue
        stack.append((path, True))
        try:
            with os.scandir(path) as it:
                entries = list(it)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                errors.append(f"{path}: {exc.strerror}")
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    if st.st_dev != dev or (
                        (unknown or (st.st_dev, st.st_ino) in marks)
                        and os.path.realpath(e.path) in mounts
                    ):
                        errors.append(f"{e.path}: another file system is mounted there (left "
                                      "as it is)")
                        continue
                    stack.append((e.path, False))
                else:
                    os.unlink(e.path)
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    errors.append(f"{e.path}: {exc.strerror}")
    return errors


def _sweep_one(path: str, now: float | None, grace: float) -> StagingNote | None:
    """Remove one staging directory if stale; a note, or ``None`` (gone, or provably live)."""
    name = os.path.basename(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None  # another sweep, or its owner, removed it meanwhile
    except OSError as exc:
        return StagingNote(path, None, False, f"could not read it ({exc.strerror}); kept")
    if not stat.S_ISDIR(st.st_mode):
        return StagingNote(path, None, False, "named like this tool's staging but not a "
                           "directory (a symbolic link is never followed): not removed")
    if st.st_uid != os.geteuid():
        return StagingNote(path, None, False, f"owned by uid {st.st_uid}, not by this user: "
                           f"kept; that user can remove it: rm -rf -- {_quote(path)}")
    m = _STAGING_RE.match(name)
    if m is None:
        return _remove(path, st, "the rest of a removal an earlier sweep began")
    host, pid, start, machine = m["host"], int(m["pid"]), int(m["start"]), m["machine"]
    owner = f"pid {pid} on {host}"
    me = _me()
    gone: bool | None = None
    if machine != "none" and machine == me[3]:
        if (pid, start) == (me[1], me[2]):
            return None  # this process's own (another thread's conversion)
        gone = _owner_gone(pid, start)
        if gone is False:
            return None  # a live conversion's: kept, whatever its age
        if gone:
            return _remove(path, st, f"left by a conversion that is gone ({owner})")
    size, newest, unread = _walk(path)
    rm = f"rm -rf -- {_quote(path)}"
    if unread is not None:
        return StagingNote(path, size, False, f"staging of {owner}: {unread}; kept. If that "
                           f"conversion is gone: {rm}")
    if now is None or newest is None:
        return StagingNote(path, size, False, f"staging of {owner}, which cannot be asked from "
                           f"here, and the age of its files could not be measured (no probe "
                           f"file could be made); kept. If that conversion is gone: {rm}")
    age = now - newest
    if age < grace:
        return StagingNote(path, size, False, f"staging of {owner}, which cannot be asked from "
                           f"here, changed {max(age, 0.0):.0f} s ago: kept (a conversion that may "
                           f"still run); removed by a conversion here once untouched for "
                           f"{grace:.0f} s. If that conversion is gone: {rm}")
    return _remove(path, st, f"left by {owner}, which cannot be asked from here: nothing in it "
                   f"changed for {age:.0f} s (over {grace:.0f} s)")


def _remove(path: str, st: os.stat_result, why: str) -> StagingNote | None:
    """Claim ``path`` by renaming it to ``.pck-swept-<hex>`` (checked: the same inode), remove it."""
    parent = os.path.dirname(path)
    inside = mounted_below(path)
    if inside is not None:
        return StagingNote(path, None, False, f"{why}; {inside} is mounted inside it: kept; "
                           f"unmount it, then remove it: rm -rf -- {_quote(path)}")
    claimed = path
    if not _SWEPT_RE.match(os.path.basename(path)):
        claimed = os.path.join(parent, f".pck-swept-{secrets.token_hex(6)}")
        try:
            os.rename(path, claimed)
        except FileNotFoundError:
            return None  # another sweep claimed it first
        except OSError as exc:
            return StagingNote(path, None, False, f"{why}; could not claim it for removal "
                               f"({exc.strerror}): kept; remove it: rm -rf -- {_quote(path)}")
        try:
            now = os.lstat(claimed)
        except OSError:
            now = None
        if now is None or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            with contextlib.suppress(OSError):  # replaced between lstat and rename: not ours
                os.rename(claimed, path)
            return StagingNote(path, None, False, "replaced while it was looked at: kept")
    size = _walk(claimed)[0]
    errors = _remove_tree(claimed)
    if errors:
        return StagingNote(path, size, False, f"{why}; its removal failed ({errors[0]}): the "
                           f"rest is in {claimed}; remove it: rm -rf -- {_quote(claimed)}")
    return StagingNote(path, size, True, why)
