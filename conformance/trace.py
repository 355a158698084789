"""System-call tracing of adapter processes (``strace``): durability and atomic-publish checks.

A writer or committer is a foreign process: what it *did* on the file system is visible only in
its system calls. The harness runs every adapter process under ``strace -f`` (children and
threads included) and checks the trace:

* **durability** (R-COMMIT-6, R-INDEX-1): every file the process created or wrote under the
  attempt is ``fsync``-ed after its last write, and every name it created (files, directories —
  the attempt directory's name in the root included) is made durable by an ``fsync`` of the
  directory holding it; a writer does both for its data and entry files *before* it creates its
  index, and for the index before it exits; a committer does both for the files it adds (a tensor
  table) before it publishes (R-COMMIT-17);
* **atomic publish** (R-COMMIT-7, R-COMMIT-8): ``manifest.json`` appears only through ``link()``
  (or ``renameat2(RENAME_NOREPLACE)``) of ``manifest.json.<16 hex>.tmp``, whose data was synced
  first; the temporary name is removed afterwards and the attempt directory synced; the manifest
  is never opened for writing, never the target of a plain ``rename()``;
* **commit conflicts** (R-COMMIT-9): with a manifest already there, the committer neither writes,
  renames, truncates nor removes it.

``fsync``/``fdatasync`` on a descriptor, ``sync``/``syncfs``, and files opened ``O_SYNC`` or
``O_DSYNC`` count as synchronisation. Not understood (reported as not durable): ``io_uring``,
``msync`` of mapped files, ``sync_file_range``. Relative paths are resolved against the directory
strace reports for ``AT_FDCWD``, or the process's working directory: the adapter's, followed
through ``chdir`` and ``fchdir`` per process (a child starts in its parent's, ``clone``/``fork``).
A short call is padded by strace before its ``=`` (``chdir("..")     = 0``): parsed all the same.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "outside_writes",
    "Call",
    "FsEvent",
    "TraceStatus",
    "committer_problems",
    "conflict_problems",
    "count_progress",
    "fs_events",
    "parse_trace",
    "traced_argv",
    "tracing_status",
    "writer_problems",
]

#: the calls traced: everything that creates, writes, syncs, links, renames or removes a name.
#: ``?`` marks calls an architecture may lack (aarch64 has no ``open``, ``mkdir``, ...).
TRACED = ("?open,openat,?openat2,?creat,write,pwrite64,writev,pwritev,?pwritev2,truncate,"
          "ftruncate,fsync,fdatasync,sync,syncfs,?link,linkat,?symlink,symlinkat,?rename,"
          "renameat,?renameat2,?unlink,unlinkat,?rmdir,?mkdir,mkdirat,chdir,fchdir,?clone,?clone3,"
          "?fork,?vfork")
#: the calls that make a process (or thread): its working directory starts as its parent's.
_FORKS = frozenset({"clone", "clone3", "fork", "vfork"})
_WRITES = frozenset({"write", "pwrite64", "writev", "pwritev", "pwritev2", "ftruncate",
                     "truncate"})
_OPENS = frozenset({"open", "openat", "openat2", "creat"})
_MUTATING = _WRITES | _OPENS | frozenset({"fsync", "fdatasync", "link", "linkat", "rename",
                                          "renameat", "renameat2", "unlink", "unlinkat",
                                          "mkdir", "mkdirat", "symlink", "symlinkat", "rmdir"})
_WRITE_FLAGS = ("O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND")
_TMP_MANIFEST = re.compile(r"^manifest\.json\.[0-9a-f]{16}\.tmp$")


@dataclass(frozen=True)
class TraceStatus:
    """Whether system calls can be traced here, and why not."""

    available: bool
    detail: str  # the strace version, or why tracing is unavailable (and the fix)


@functools.cache
def tracing_status() -> TraceStatus:
    """Probe ``strace`` once: present on PATH and allowed to trace (ptrace) a child."""
    exe = shutil.which("strace")
    if exe is None:
        return TraceStatus(False, "strace is not installed (Debian/Ubuntu: apt-get install -y "
                                  "strace)")
    try:
        probe = subprocess.run([exe, "-f", "-qq", "-o", os.devnull, "-e", "trace=fsync", "true"],
                               capture_output=True, text=True, timeout=30)
        version = subprocess.run([exe, "-V"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return TraceStatus(False, f"strace could not be run: {exc}")
    if probe.returncode != 0:
        return TraceStatus(False, f"strace cannot trace here ({probe.stderr.strip()[:200]}): "
                                  "ptrace is forbidden (container seccomp profile or "
                                  "kernel.yama.ptrace_scope)")
    return TraceStatus(True, version.stdout.splitlines()[0] if version.stdout else "strace")


def traced_argv(argv: list[str], out: Path) -> list[str]:
    """``argv`` run under strace, the trace written to ``out`` (one line per call, flushed)."""
    return ["strace", "-f", "-qq", "-ttt", "-T", "-y", "-s", "0", "-e", "signal=none",
            "-e", f"trace={TRACED}", "--seccomp-bpf", "-o", str(out), "--", *argv]


# ------------------------------------------------------------------------------------ parsing
@dataclass
class Call:
    """One completed system call of the trace."""

    pid: int
    start: float
    end: float
    name: str
    args: list[str]
    ok: bool
    ret: str = ""  # the return value as strace shows it (a new process's id for a fork)


_LINE = re.compile(r"^(\d+)\s+(\d+\.\d+)\s(.*)$")
_RESUMED = re.compile(r"^<\.\.\. (\w+) resumed>(.*)$")
_CALL = re.compile(r"^(\w+)\((.*)$")
_DURATION = re.compile(r"\s<(\d+\.\d+)>$")
#: the end of the arguments: strace pads a short call with spaces before ``=``
#: (``chdir("..")     = 0``), aligning return values (re-attack 26).
_RETURN = re.compile(r"\) *= ")
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
_FD = re.compile(r"^(?:-?\d+|AT_FDCWD)<(.*)>$")


def parse_trace(path: Path) -> tuple[list[Call], float]:
    """The completed calls of an strace output file, and the time the last process exited."""
    calls: list[Call] = []
    pending: dict[int, tuple[float, str]] = {}
    last = 0.0
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return [], 0.0
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        pid, ts, rest = int(m.group(1)), float(m.group(2)), m.group(3)
        last = max(last, ts)
        if rest.startswith("+++"):
            continue
        if rest.endswith("<unfinished ...>"):
            pending[pid] = (ts, rest[: -len("<unfinished ...>")])
            continue
        r = _RESUMED.match(rest)
        start = ts
        if r is not None:
            if pid not in pending:
                continue
            start, head = pending.pop(pid)
            rest = head + r.group(2)
        call = _parse_call(pid, start, rest)
        if call is not None:
            calls.append(call)
            last = max(last, call.end)
    calls.sort(key=lambda c: c.start)
    return calls, last


def _parse_call(pid: int, start: float, text: str) -> Call | None:
    d = _DURATION.search(text)
    dur = float(d.group(1)) if d else 0.0
    if d:
        text = text[: d.start()]
    m = _CALL.match(text)
    if m is None:
        return None
    inner = m.group(2)
    ends = list(_RETURN.finditer(inner))
    if not ends:
        return None
    body, ret = inner[: ends[-1].start()], inner[ends[-1].end():].strip()
    return Call(pid, start, start + dur, m.group(1), _split_args(body),
                not ret.startswith(("-1", "?")), ret)


def _split_args(body: str) -> list[str]:
    """Top-level arguments: commas outside strings, brackets and ``<...>`` fd annotations."""
    out: list[str] = []
    depth, cur, i, n = 0, [], 0, len(body)
    while i < n:
        c = body[i]
        if c == '"':
            m = _STRING.match(body, i)
            j = m.end() if m else n
            cur.append(body[i:j])
            i = j
            continue
        if c == "<" and depth == 0:
            j = body.find(">", i)
            j = n if j < 0 else j + 1
            cur.append(body[i:j])
            i = j
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            i += 1
            continue
        cur.append(c)
        i += 1
    if cur:
        out.append("".join(cur).strip())
    return out


def _unquote(arg: str) -> str | None:
    m = _STRING.fullmatch(arg.split("...")[0]) if arg.startswith('"') else None
    if m is None:
        return None
    return re.sub(r"\\(x[0-9a-f]{2}|[0-7]{1,3}|.)", _unescape, m.group(1))


def _unescape(m: re.Match[str]) -> str:
    e = m.group(1)
    if e.startswith("x"):
        return chr(int(e[1:], 16))
    if e.isdigit():
        return chr(int(e, 8))
    return {"n": "\n", "t": "\t", "r": "\r"}.get(e, e)


def _fd_path(arg: str) -> str | None:
    m = _FD.match(arg)
    if m is None:
        return None
    return m.group(1).removesuffix(" (deleted)")


# ---------------------------------------------------------------------------- file-system model
@dataclass
class FsEvent:
    """A file-system effect of a call, with absolute, normalised paths."""

    kind: str  # open | write | sync | syncall | link | rename | unlink | mkdir | symlink
    path: str
    start: float
    end: float
    src: str = ""  # link/rename source
    flags: str = ""


def fs_events(calls: list[Call], cwd: str) -> list[FsEvent]:
    """The successful calls as :class:`FsEvent` in start order (relative paths resolved).

    Each process has its own working directory (re-attack 26: a child's ``chdir`` re-based
    its parent's relative paths): a new one (``clone``, ``clone3``, ``fork``, ``vfork``, from
    the call's return value) starts in its parent's, a thread (``CLONE_FS``) shares it, and a
    process first seen without a known parent starts in ``cwd``, the adapter's.
    """
    out: list[FsEvent] = []
    cwds: dict[int, list[str]] = {}  # pid: its working directory, a cell threads share
    for c in calls:
        cell = cwds.setdefault(c.pid, [cwd])
        if not c.ok:
            continue
        if c.name in _FORKS:
            child = c.ret.split(" ", 1)[0]
            if child.isdigit():
                shared = c.name.startswith("clone") and "CLONE_FS" in " ".join(c.args)
                cwds[int(child)] = cell if shared else [cell[0]]
            continue
        if c.name in ("chdir", "fchdir"):
            new = _at(c.args, 0, cell[0]) if c.name == "chdir" else (
                _fd_path(c.args[0]) if c.args else None)
            cell[0] = new or cell[0]
            continue
        ev = _event(c, cell[0])
        if ev is not None:
            out.append(ev)
    return out


def _at(args: list[str], i: int, cwd: str, dirfd: int | None = None) -> str | None:
    """Absolute path of string argument ``i`` (relative to ``args[dirfd]`` or ``cwd``)."""
    if i >= len(args):
        return None
    p = _unquote(args[i])
    if p is None:
        return None
    if not p.startswith("/"):
        base = _fd_path(args[dirfd]) if dirfd is not None else None
        p = os.path.join(base or cwd, p)
    return os.path.normpath(p)


def _event(c: Call, cwd: str) -> FsEvent | None:
    n, a = c.name, c.args

    def ev(kind: str, path: str | None, src: str | None = "", flags: str = "") -> FsEvent | None:
        return FsEvent(kind, path, c.start, c.end, src or "", flags) if path else None

    if n in _OPENS:
        path = _at(a, 1, cwd, 0) if n in ("openat", "openat2") else _at(a, 0, cwd)
        flags = "O_CREAT|O_WRONLY|O_TRUNC" if n == "creat" else (a[2] if len(a) > 2 and
                                                                  n != "open" else
                                                                  a[1] if len(a) > 1 else "")
        return ev("open", path, flags=flags) if any(f in flags for f in _WRITE_FLAGS) else None
    if n in _WRITES:
        return ev("write", _at(a, 0, cwd) if n == "truncate" else _fd_path(a[0]) if a else None)
    if n in ("fsync", "fdatasync"):
        return ev("sync", _fd_path(a[0]) if a else None)
    if n in ("sync", "syncfs"):
        return FsEvent("syncall", "/", c.start, c.end)
    if n in ("link", "rename", "symlink"):
        kind = n
        return ev(kind, _at(a, 1, cwd), _at(a, 0, cwd) if n != "symlink" else "")
    if n in ("linkat", "renameat", "renameat2"):
        flags = a[4] if len(a) > 4 else ""
        return ev("link" if n == "linkat" else "rename", _at(a, 3, cwd, 2), _at(a, 1, cwd, 0),
                  flags)
    if n == "symlinkat":
        return ev("symlink", _at(a, 2, cwd, 1))
    if n in ("unlink", "rmdir"):
        return ev("unlink", _at(a, 0, cwd))
    if n == "unlinkat":
        return ev("unlink", _at(a, 1, cwd, 0))
    if n in ("mkdir", "mkdirat"):
        return ev("mkdir", _at(a, 0, cwd) if n == "mkdir" else _at(a, 1, cwd, 0))
    return None


#: Paths whose writes are no one's files: devices, kernel interfaces, Python's bytecode caches.
_NOT_FILES = ("/dev/", "/proc/", "/sys/")
#: How strace names a descriptor that is no file: ``pipe:[864478]``, ``anon_inode:[eventfd]``.
_NO_FILE = re.compile(r"(pipe|socket|anon_inode|net|mnt|user|pid|uts|ipc|cgroup|time):")


def outside_writes(events: list[FsEvent], root: str) -> list[str]:
    """Paths outside ``root`` that a traced process created, wrote, renamed, linked or removed.

    The protocol lets an adapter write only below ``root``: the working directory is the user's.
    Devices (``/dev/null``; ``/dev/shm`` holds files and counts), ``/proc`` and ``__pycache__``
    directories (an interpreter's own caches) are not counted, nor descriptors that are no file
    (``pipe:[…]``, ``socket:[…]``, ``anon_inode:…``: a shell wrapper such as a pyenv shim
    writes to pipes, conformance review C7).
    """
    out: set[str] = set()
    for e in events:
        if e.kind in ("sync", "syncall"):
            continue
        for p in (e.path, e.src):
            if not p or p == root or p.startswith(root + "/") or "/__pycache__" in p or (
                    p.startswith(_NOT_FILES) and not p.startswith("/dev/shm/")) or (
                    _NO_FILE.match(p)):
                continue
            out.add(p)
    return sorted(out)


def count_progress(line: str, root: str) -> bool:
    """True when a trace line is a mutating call on a path below ``root`` (kill timing)."""
    m = _LINE.match(line)
    if m is None or root not in line:
        return False
    head = m.group(3).split("(", 1)[0]
    return head in _MUTATING


# ---------------------------------------------------------------------------------- analysis
@dataclass
class _Inode:
    writes: list[float] = field(default_factory=list)  # end times of writes (creation too)
    syncs: list[tuple[float, float]] = field(default_factory=list)
    osync: bool = False

    def durable(self, t: float, global_syncs: list[tuple[float, float]]) -> bool:
        done = [e for e in self.writes if e <= t]
        if not done or self.osync:
            return True
        last = max(done)
        return any(s >= last and e <= t for s, e in self.syncs + global_syncs)


@dataclass
class _Name:
    inode: _Inode | None  # None for a directory
    created: float  # end of the call that created the name
    created_start: float


class _Model:
    """Replays file-system events below a root: inodes, names this process created, syncs."""

    def __init__(self, events: list[FsEvent], root: str) -> None:
        self.root = root
        self.names: dict[str, _Name] = {}
        self.dir_syncs: dict[str, list[tuple[float, float]]] = {}
        self.global_syncs: list[tuple[float, float]] = []
        for e in events:
            self._apply(e)

    def inside(self, p: str) -> bool:
        return p == self.root or p.startswith(self.root + "/")

    def _apply(self, e: FsEvent) -> None:
        if e.kind == "syncall":
            self.global_syncs.append((e.start, e.end))
            return
        if not self.inside(e.path) and not self.inside(e.src or "/"):
            return
        name = self.names.get(e.path)
        if e.kind == "open":
            if name is None:
                if "O_CREAT" not in e.flags:
                    return  # writes to a file this process did not create: not its durability
                name = self.names[e.path] = _Name(_Inode(), e.end, e.start)
            if name.inode is not None:
                name.inode.writes.append(e.end)
                name.inode.osync |= "O_SYNC" in e.flags or "O_DSYNC" in e.flags
        elif e.kind == "write" and name is not None and name.inode is not None:
            name.inode.writes.append(e.end)
        elif e.kind == "sync":
            if name is not None and name.inode is not None:
                name.inode.syncs.append((e.start, e.end))
            else:
                self.dir_syncs.setdefault(e.path, []).append((e.start, e.end))
        elif e.kind == "mkdir":
            self.names[e.path] = _Name(None, e.end, e.start)
        elif e.kind in ("link", "rename", "symlink"):
            src = self.names.get(e.src) if e.src else None
            inode = src.inode if src is not None else _Inode(writes=[e.end])
            self.names[e.path] = _Name(inode, e.end, e.start)
            if e.kind == "rename":
                self.names.pop(e.src, None)
        elif e.kind == "unlink":
            self.names.pop(e.path, None)

    def name_durable(self, path: str, t: float) -> bool:
        created = self.names[path].created
        syncs = self.dir_syncs.get(os.path.dirname(path), []) + self.global_syncs
        return any(s >= created and e <= t for s, e in syncs)

    def problems(self, paths: list[str], t: float, when: str, rule: str) -> list[str]:
        """Why each of ``paths`` is not durable at time ``t``."""
        out = []
        for p in paths:
            name = self.names[p]
            rel = os.path.relpath(p, self.root)
            if name.inode is not None and not name.inode.durable(t, self.global_syncs):
                out.append(f"{rel}: its data was not fsync-ed {when} ({rule})")
            if not self.name_durable(p, t):
                kind = "directory" if name.inode is None else "file"
                out.append(f"{rel}: the new {kind} name was not made durable by an fsync of "
                           f"{self._holder(p)} {when} ({rule})")
        return out

    def _holder(self, path: str) -> str:
        """The directory holding ``path``, named for a message.

        The root by its absolute path (it was ``./``, read as the working directory: outside
        review 21b), others by their path below it.
        """
        parent = os.path.dirname(path)
        if parent == self.root:
            return f"the root {parent}"
        return f"its directory {os.path.relpath(parent, self.root)}/"


def _listed_files(index: str, adir: str) -> set[str] | None:
    """Absolute paths of the files a writer index lists; ``None`` when it cannot be read."""
    try:
        with open(index, "rb") as f:
            doc = json.loads(f.read(64 << 20))
        return {os.path.normpath(os.path.join(adir, k)) for k in doc["files"]}
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None


def writer_problems(events: list[FsEvent], root: str, attempt: str, writer: int,
                    exit_time: float) -> list[str]:
    """Durability and ordering faults of a writer that exited 0 (R-COMMIT-6, R-INDEX-1)."""
    model = _Model(events, root)
    index = os.path.join(root, attempt, "index", f"w{writer:05d}.json")
    if index not in model.names:
        return [f"the writer exited 0 but created no {os.path.relpath(index, root)} (R-INDEX-1) "
                "that the trace shows"]
    t_index = model.names[index].created_start
    ancestors = {os.path.dirname(index), os.path.join(root, attempt)}
    # A file made after the index began and not listed in it is a stray file (the checker's
    # R-FILES-1 warning), not a file the index needed durable first.
    listed = _listed_files(index, os.path.join(root, attempt))
    before = [p for p, n in model.names.items() if p != index and p not in ancestors
              and (n.created_start < t_index or listed is None or p in listed
                   or any(f.startswith(p + "/") for f in listed))]
    out = model.problems(before, t_index, "before the writer index was created", "R-COMMIT-6, "
                         "R-INDEX-1: the index is written after the files it lists are durable")
    out += model.problems([index, *sorted(a for a in ancestors if a in model.names)], exit_time,
                          "before the writer exited", "R-COMMIT-6")
    return out + overwrite_problems(events, os.path.join(root, attempt))


def overwrite_problems(events: list[FsEvent], adir: str) -> list[str]:
    """Files of the attempt that the process opened for writing again after it made them.

    R-LAYOUT-2: files are created exclusively and never overwritten. The bytes may even be the
    same (a rewrite after the fsync), which no check of the finished version can see
    (traceability audit F8): the trace is the one place it shows.
    """
    made: set[str] = set()
    reopened: set[str] = set()  # opened for writing again: a write to it then overwrites
    out: dict[str, str] = {}

    def broken(path: str, how: str) -> None:
        rel = os.path.relpath(path, adir)
        out.setdefault(rel, f"{rel}: {how} after it was made: files of an attempt are created "
                            "exclusively and never overwritten (R-LAYOUT-2)")

    for e in events:
        if not e.path.startswith(adir + "/"):
            continue
        if e.kind in ("link", "rename"):
            made.add(e.path)
        elif e.kind == "write" and e.path in reopened:
            broken(e.path, "written again")
        elif e.kind == "open" and e.path in made:
            if "O_TRUNC" in e.flags or "O_APPEND" in e.flags:
                broken(e.path, f"opened for writing again ({e.flags})")
            elif "O_WRONLY" in e.flags or "O_RDWR" in e.flags:
                reopened.add(e.path)  # to fsync it, perhaps: only a write breaks the rule (D6)
        elif e.kind == "open" and "O_CREAT" in e.flags:
            made.add(e.path)
    return list(out.values())


def committer_problems(events: list[FsEvent], root: str, attempt: str,
                       exit_time: float) -> tuple[list[str], list[str]]:
    """Publish-protocol faults of a committer that exited 0 (R-COMMIT-7, R-COMMIT-8).

    Returns ``(errors, warnings)``. A file the committer itself adds (a tensor table), or a
    directory it creates, whose data or name is not yet durable when the manifest is published
    is an error (R-COMMIT-17; a warning before that rule existed). No warning is left today; the
    pair stays for callers that report both.
    """
    adir = os.path.join(root, attempt)
    manifest = os.path.join(adir, "manifest.json")
    out = _direct_writes(events, manifest, "R-COMMIT-8: write manifest.json.<16 hex>.tmp, fsync "
                         "it, then link() it to manifest.json")
    publishes = [e for e in events if e.path == manifest and e.kind in ("link", "rename",
                                                                        "symlink")]
    if not publishes:
        return (out or ["manifest.json appeared, but the trace shows no link()/rename() that "
                        "created it (R-COMMIT-7)"]), []
    pub = publishes[0]
    out += _publish_call_problems(pub, adir)
    pre = _Model([e for e in events if e.start < pub.start], root)
    tmp = pre.names.get(pub.src)
    if tmp is not None and tmp.inode is not None and \
            not tmp.inode.durable(pub.start, pre.global_syncs):
        out.append("the temporary manifest was not fsync-ed before it was linked "
                   "(R-COMMIT-7 step 2)")
    added = [p for p in pre.names if p != pub.src]
    out += pre.problems(added, pub.start, "before manifest.json, which lists it, was published",
                        "R-COMMIT-17: a crash before step 5 of R-COMMIT-7 can leave a visible "
                        "version that lacks this file")
    out += _after_publish_problems(events, pub, manifest, adir, exit_time, root)
    return out, []


def _direct_writes(events: list[FsEvent], manifest: str, fix: str) -> list[str]:
    return [f"manifest.json was opened for writing ({e.flags.split(',')[0]}) instead of being "
            f"published atomically ({fix})" for e in events
            if e.path == manifest and e.kind == "open"]


def _publish_call_problems(pub: FsEvent, adir: str) -> list[str]:
    out = []
    if pub.kind == "symlink":
        return ["manifest.json was created as a symbolic link (R-COMMIT-7)"]
    if pub.kind == "rename" and "RENAME_NOREPLACE" not in pub.flags:
        out.append("manifest.json was published with a plain rename(), which replaces an existing "
                   "manifest (R-COMMIT-8: use link() or renameat2(RENAME_NOREPLACE))")
    if os.path.dirname(pub.src) != adir or not _TMP_MANIFEST.match(os.path.basename(pub.src)):
        out.append(f"manifest.json was published from {pub.src!r}, not from "
                   "manifest.json.<16 hex digits>.tmp in the attempt directory (R-COMMIT-7 step 1)")
    return out


def _after_publish_problems(events: list[FsEvent], pub: FsEvent, manifest: str, adir: str,
                            exit_time: float, root: str) -> list[str]:
    out = []
    after = [e for e in events if e.start >= pub.end]
    if pub.kind == "link" and not any(e.kind == "unlink" and e.path == pub.src for e in after):
        out.append("the temporary manifest name was not removed after link() (R-COMMIT-7 step 4)")
    model = _Model(events, root)
    if manifest in model.names and not model.name_durable(manifest, exit_time):
        out.append("the attempt directory was not fsync-ed after manifest.json was linked "
                   "(R-COMMIT-7 step 5)")
    for e in after:
        if (e.path == manifest and e.kind in ("open", "write", "unlink", "rename")) or \
                e.src == manifest:
            out.append(f"manifest.json was modified after publication ({e.kind}; R-COMMIT-14)")
    return out


def conflict_problems(events: list[FsEvent], manifest: str) -> list[str]:
    """What a committer did to a ``manifest.json`` that existed before it ran (R-COMMIT-9)."""
    out = []
    for e in events:
        if e.path == manifest and e.kind in ("open", "write", "unlink", "rename", "link",
                                             "symlink"):
            out.append(f"the existing manifest.json was touched ({e.kind} {e.flags}".strip()
                       + "; R-COMMIT-9: the committer must not modify or remove it)")
        elif e.src == manifest and e.kind == "rename":
            out.append("the existing manifest.json was renamed away (R-COMMIT-9)")
    return out
