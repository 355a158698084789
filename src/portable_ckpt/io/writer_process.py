"""A writer in a separate process: it writes one rank's share of a save from shared memory.

An async save in ``mode="process"`` copies the rank's tensors into one anonymous shared-memory
segment (``memfd``: it has no name in ``/dev/shm``, so nothing can leak there, and the kernel
frees it once neither process maps it) and hands the segment's file descriptor and a JSON job to
this process, which runs the :class:`~portable_ckpt.io.writer.ShardWriter` (checksums, writes,
fsync) and answers with the writer index. On rank 0 it also commits the version (the writer
indexes gathered by the training process go to it; it checks them and the files and publishes
the record). The training process keeps only the small metadata collectives; its interpreter
runs neither the writer's nor the committer's Python code, and the writer runs at a lower CPU
priority (``nice``), so the training loop keeps the cores it needs.

The protocol is JSON frames over a Unix socket pair, file descriptors passed with
``SCM_RIGHTS``; nothing is pickled. The writer imports neither torch nor the training code. It
exits when its socket closes or its parent process is gone, and ignores SIGINT/SIGTERM (the
training process decides when a save ends). On Linux the kernel sends it SIGCONT when its parent
dies, so a writer stopped (SIGSTOP) when its trainer was killed resumes, removes its unsent
files and exits too.

Run as ``python -m portable_ckpt.io.writer_process SOCKET_FD NICE PARENT_PID`` by
:class:`WriterProcess`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from portable_ckpt._threads import BACKGROUND_NICE
from portable_ckpt.errors import CheckpointError, WriterProcessError, error_for_code
from portable_ckpt.logs import EVENT_ATTR, LOGGER_NAME

__all__ = [
    "WriterAnsweredError",
    "WriterProcess",
    "anonymous_fd",
    "main",
    "recv_msg",
    "relog",
    "send_msg",
]

_HEADER = struct.Struct("<Q")
#: Largest frame either side accepts (a writer index of millions of ranges stays far below).
MAX_FRAME = 1 << 30
#: CPU niceness of the writer process: the training loop wins every contended core.
WRITER_NICE = BACKGROUND_NICE
_MAX_FDS = 4


# -- framing ----------------------------------------------------------------------------------------


def send_msg(sock: socket.socket, obj: Any, fds: Sequence[int] = ()) -> None:
    """Send one JSON frame (the file descriptors travel with its header)."""
    body = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8")
    header = _HEADER.pack(len(body))
    if fds:
        socket.send_fds(sock, [header], list(fds))
    else:
        sock.sendall(header)
    sock.sendall(body)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise EOFError("the other side closed the connection")
        got += k
    return bytes(buf)


def recv_msg(sock: socket.socket) -> tuple[Any, list[int]]:
    """Receive one JSON frame and the file descriptors sent with it.

    Raises:
        EOFError: the other side closed the socket (before or inside a frame).

    """
    data, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, _MAX_FDS)
    if not data:
        raise EOFError("the other side closed the connection")
    head = data + _recv_exact(sock, _HEADER.size - len(data)) if len(data) < _HEADER.size else data
    (size,) = _HEADER.unpack(head)
    if size > MAX_FRAME:
        for fd in fds:
            os.close(fd)
        raise EOFError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    return json.loads(_recv_exact(sock, size)), list(fds)


# -- shared memory --------------------------------------------------------------------------------


def anonymous_fd(size: int, name: str = "pck-staging") -> int:
    """A file descriptor of ``size`` bytes of shared memory that has no name anywhere.

    ``memfd_create`` on Linux; elsewhere a temporary file that is unlinked before this returns.
    """
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None:
        fd = int(memfd(name, getattr(os, "MFD_CLOEXEC", 1)))
    else:  # pragma: no cover - non-Linux
        import tempfile

        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, path = tempfile.mkstemp(prefix=f"{name}-", dir=base)
        os.unlink(path)
    try:
        os.ftruncate(fd, size)
    except OSError as exc:
        os.close(fd)
        # A file-size limit (ulimit -f) or a memory cgroup: said as what it is, not as a
        # foreign OSError of the save's prepare step (resource review R3).
        import resource

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        why = (f"; the file-size limit is {limit:,} bytes (ulimit -f)"
               if limit != resource.RLIM_INFINITY and limit < size else "")
        raise WriterProcessError(
            f"could not make the {size:,}-byte shared-memory segment the writer process stages "
            f"the state in ({exc.strerror or exc}){why}; raise the limit, or save with "
            "mode='thread'"
        ) from exc
    except BaseException:
        os.close(fd)
        raise
    return fd


# -- the client (training process side) -------------------------------------------------------------


class WriterProcess:
    """One writer process and the socket to it (started on construction).

    Args:
        nice: CPU niceness added in the writer (``0``: the training process's priority).

    """

    def __init__(self, nice: int = WRITER_NICE) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen(
                # -P: `-m` put the working directory first on sys.path, so a `numpy.py` there
                # (a shared directory) ran inside the writer as the trainer (tenant review F1).
                [sys.executable, "-P", "-m", "portable_ckpt.io.writer_process",
                 str(child.fileno()), str(int(nice)), str(os.getpid())],
                pass_fds=[child.fileno()],
                stdin=subprocess.DEVNULL,
                # It writes nothing there; holding the job's stdout kept a pipeline reading it
                # open while a stopped writer outlived its trainer (async review F2).
                stdout=subprocess.DEVNULL,
                env=_child_env(),
                start_new_session=True,  # a terminal's Ctrl-C or a group kill goes to training
            )
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        self.sock = parent
        self.lock = threading.Lock()

    @property
    def pid(self) -> int:
        """The writer's process id."""
        return int(self.proc.pid)

    def alive(self) -> bool:
        """Whether the writer process still runs."""
        return self.proc.poll() is None

    def request(
        self,
        msg: dict[str, Any],
        fds: Sequence[int] = (),
        *,
        what: str,
        stopped_limit: float | None = None,
    ) -> Any:
        """Send ``msg`` and wait for the answer's ``value`` (re-raise the writer's error).

        Waits as long as the writer lives and runs (a write to slow storage may take long); its
        death is noticed within a second. A writer *stopped* (SIGSTOP, a debugger) for more
        than ``stopped_limit`` seconds is killed: the save failed, and without the bound it
        would wait for ever, and the next save with it (async review F1).

        Raises:
            WriterProcessError: the writer died, stayed stopped, or broke the protocol.
            CheckpointError: the writer's own error (same class and code).

        """
        with self.lock:
            try:
                send_msg(self.sock, msg, fds)
                stopped_since: float | None = None
                while not select.select([self.sock], [], [], 1.0)[0]:
                    if not self.alive():
                        break
                    if not _stopped(self.pid):
                        stopped_since = None
                        continue
                    now = time.monotonic()
                    stopped_since = now if stopped_since is None else stopped_since
                    if stopped_limit is not None and now - stopped_since > stopped_limit:
                        self.proc.kill()
                        self.proc.wait()
                        raise WriterProcessError(
                            f"{what}: the writer process (pid {self.pid}) was stopped (SIGSTOP "
                            f"or a debugger) for more than {stopped_limit:.0f} s; it was killed "
                            "and the next save starts a new one"
                        )
                reply, extra = recv_msg(self.sock)
            except (OSError, EOFError, ValueError) as e:
                raise self._died(what, e) from e
        for fd in extra:
            os.close(fd)
        if isinstance(reply, dict):
            relog(reply.get("log"), f"{what}, pid {self.pid}")
        if not isinstance(reply, dict) or "ok" not in reply:
            raise WriterProcessError(f"{what}: the writer process (pid {self.pid}) sent {reply!r}")
        if not reply["ok"]:
            code, kind = str(reply.get("code")), str(reply.get("type"))
            path = reply.get("path") if isinstance(reply.get("path"), str) else None
            if code == "PCK-WRITER-PROCESS":  # a fault of the writer's code: it answered
                raise WriterAnsweredError(f"{what}: {kind}: {reply.get('message')}", path=path)
            cls = error_for_code(code, kind)
            # A known class says what it is (commit-child review F4); an unknown one, its name
            named = "" if cls is not CheckpointError else f"{kind}: "
            raise cls(f"{what}: {named}{reply.get('message')}", path=path)
        return reply.get("value")

    def _died(self, what: str, e: BaseException) -> WriterProcessError:
        deadline = time.monotonic() + 2.0
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        code = self.proc.poll()
        if code is None:
            how = f"stopped answering ({type(e).__name__}: {e})"
        elif code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
        else:
            how = (f"exited with status {code} (why is the line it wrote on stderr, prefixed "
                   "'portable_ckpt writer process:')")
        return WriterProcessError(
            f"{what}: the writer process (pid {self.pid}) {how}; the next save starts a new one"
        )

    def close(self, timeout: float = 5.0) -> None:
        """Close the socket (the writer exits on its own) and reap the process."""
        with contextlib.suppress(OSError):
            self.sock.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (state ``T``, or ``t`` under a tracer); Linux only."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"T", b"t")
    except (OSError, IndexError):
        return False


def _child_env() -> dict[str, str]:
    """The writer imports this same copy of portable_ckpt, and uses one thread per library."""
    pkg_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    # What the trainer itself imports from (its script's or `-m` directory included): a
    # storage backend kept there must load in the writer too, which `-P` keeps from looking in
    # the working directory (last review 4 F1). Never "" (the writer's working directory).
    trainer = [p for p in sys.path if p and os.path.isabs(p) and os.path.isdir(p)]
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (pkg_parent, *trainer, env.get("PYTHONPATH", "")) if p
    )
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")
    return env


# -- the writer process ------------------------------------------------------------------------------


class WriterAnsweredError(WriterProcessError):
    """The writer process answered that its job failed (an error of its own code).

    Unlike the other :class:`WriterProcessError` cases (it died, stayed stopped, broke the
    protocol), the writer is there and says what happened: the job's outcome is known.
    """


class _Service:
    """The writer's jobs: ``write`` a rank's share, ``commit`` (rank 0), ``abort`` or ``forget``."""

    def __init__(self) -> None:
        self.writers: dict[str, Any] = {}
        # The writer of a write whose index was not sent yet: no commit can list its files.
        self.in_progress: Any = None

    def handle(self, msg: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        """Run one job; the warnings it logged travel back with the answer."""
        _FORWARD.records.clear()
        reply = self._run(msg, fds)
        if _FORWARD.records:
            reply["log"] = list(_FORWARD.records)
        return reply

    def _run(self, msg: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        try:
            op = msg.get("op")
            if op == "write":
                return {"ok": True, "value": self.write(msg, fds)}
            for fd in fds:
                os.close(fd)
            if op == "commit":
                return {"ok": True, "value": self.commit(msg)}
            if op == "abort":
                w = self.writers.pop(str(msg["attempt"]), None)
                if w is not None:
                    w.abort(dirs=True)  # asked after the failure was agreed
                return {"ok": True, "value": None}
            if op == "forget":
                self.writers.pop(str(msg["attempt"]), None)
                return {"ok": True, "value": None}
            if op == "ping":
                return {"ok": True, "value": os.getpid()}
            return {"ok": False, "code": "PCK-USAGE", "type": "UsageError",
                    "message": f"unknown operation {op!r}"}
        except BaseException as e:  # every failure goes back to the training process
            if isinstance(e, CheckpointError):
                return {"ok": False, "code": e.code, "type": type(e).__name__,
                        "message": e.message, "path": e.path}
            return {"ok": False, "code": "PCK-WRITER-PROCESS", "type": type(e).__name__,
                    "message": str(e)}

    def write(self, msg: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        """Map the segment, write the pieces and entries, return the bytes and the index."""
        from portable_ckpt.io.writer import ShardWriter
        from portable_ckpt.storage import open_process_spec

        seg = _map_segment(fds, int(msg["segment_bytes"]))
        # A storage of its own for each job (about 0.1 s of CPU for an S3 client): one kept
        # across saves held its client's frozen credentials after a rotation and failed every
        # later save, and a failed save's deferred fsync errors failed the next one
        # (re-attack 28 of a kept storage, findings 1 and 3).
        storage = open_process_spec(msg["storage"])
        attempt, rank = str(msg["attempt"]), int(msg["writer"])
        writer = ShardWriter(storage, attempt, rank, **msg["options"])
        self.writers = {attempt: writer}  # only the newest attempt can still be aborted
        self.in_progress = writer
        _add_job(writer, msg, seg)
        # The arrays over the mapping live in the writer until finish() wrote them; then the
        # mapping goes with the last of them (nothing maps a replaced segment between saves).
        del seg
        index = writer.finish()
        # Only now can the index reach the training process, and the attempt be committed.
        self.in_progress = None
        return {"bytes_written": writer.stats.bytes_written, "index": index.to_transport()}

    def commit(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Rank 0's commit: check every writer's index and files, publish the record.

        Here rather than in the training process: parsing the indexes and building and checking
        the record is Python work that grows with the ranks, and in the training process it
        holds the interpreter lock while the loop runs.
        """
        from portable_ckpt.format.manifest import Continuation, WriterIndex, files_bytes
        from portable_ckpt.io.commit import commit
        from portable_ckpt.storage import open_process_spec

        manifest = commit(
            open_process_spec(msg["storage"]),
            str(msg["attempt"]),
            step=int(msg["step"]),
            indexes=[WriterIndex.from_transport(d) for d in msg["transports"]],
            expected_writers=[int(w) for w in msg["expected_writers"]],
            continuation=Continuation.from_json(msg["continuation"]),
        )
        return {"files": len(manifest.files), "bytes": files_bytes(manifest.files)}


class _Forward(logging.Handler):
    """The package's warnings logged in the writer process, for the training process's log.

    A retried S3 request or a store that does not check uploads is logged where the storage
    work runs: here nothing listens (commit-child review F6), so each job's records go back
    with its answer and are logged again there. ``commit.*`` events are not: the training
    process logs the commit it asked for itself.
    """

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, EVENT_ATTR, None)
        if isinstance(event, dict) and str(event.get("event", "")).startswith("commit."):
            return
        if len(self.records) < _MAX_FORWARDED:
            self.records.append({"name": record.name, "level": record.levelno,
                                 "message": record.getMessage()[:4096], "event": event})


#: Records forwarded per job at most (a storm of retries is summarised by its first ones).
_MAX_FORWARDED = 100
_FORWARD = _Forward()


def relog(records: Any, what: str) -> None:
    """Log again, in this process, the records a writer process sent back with an answer."""
    for r in records if isinstance(records, list) else []:
        if not isinstance(r, dict) or not str(r.get("name", "")).startswith(LOGGER_NAME):
            continue
        extra = {EVENT_ATTR: r["event"]} if isinstance(r.get("event"), dict) else None
        logging.getLogger(str(r["name"])).log(
            int(r.get("level", logging.WARNING)), "%s (%s)", r.get("message"), what, extra=extra)


def _map_segment(fds: list[int], size: int) -> mmap.mmap:
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise WriterProcessError(f"a write job needs one segment descriptor, got {len(fds)}")
    try:
        return mmap.mmap(fds[0], size, prot=mmap.PROT_READ)
    finally:
        os.close(fds[0])  # the mapping keeps the memory; no descriptor stays open here


def _add_job(writer: Any, msg: dict[str, Any], seg: mmap.mmap) -> None:
    """Plan the job's pieces (views of the segment, no copy) and entries in ``writer``."""
    from portable_ckpt.format.dtypes import numpy_dtype

    for p in msg["pieces"]:
        if p.get("at") is None:
            writer.declare_tensor(p["key"], p["dtype"], p["global_shape"])
            continue
        count = int(np.prod(p["shape"], dtype=np.int64))
        arr = np.frombuffer(seg, dtype=numpy_dtype(p["dtype"]), count=count, offset=int(p["at"]))
        writer.add_tensor(
            p["key"], arr.reshape(p["shape"]), offsets=p["offsets"], global_shape=p["global_shape"]
        )
    for e in msg["entries"]:
        writer.add_entry(
            e["name"], e["value"], e["schema"], scope=e["scope"], rank=e["rank"],
            world_size_policy=e["policy"],
        )


def _watch_parent(ppid: int, service: _Service) -> None:
    """Exit at once when the training process is gone (its socket may live on in its forks).

    The files of the write in progress go first: nobody will commit or abort that attempt, and
    they stayed on disk until gc's grace period, a whole shard per rank (async review F14).
    """
    while os.getppid() == ppid:
        time.sleep(0.05)
    writer = service.in_progress  # never a finished one: its attempt may be committed
    if writer is not None:
        with contextlib.suppress(BaseException):
            writer.abort()
    os._exit(3)


#: ``prctl`` option: the signal this process gets when its parent dies (linux/prctl.h).
_PR_SET_PDEATHSIG = 1


def _continue_when_orphaned() -> None:
    """Ask the kernel for SIGCONT when the parent dies (Linux; elsewhere nothing).

    A writer stopped (SIGSTOP, job control) when its trainer was killed never ran its parent
    watch: it stayed stopped, holding the job's stderr, for as long as nobody continued it
    (async review F2). SIGCONT, not SIGKILL: continued, the writer removes the files of its
    unsent write first. The kernel sends it when the *thread* that started the writer ends too
    (an async save's thread); a running process ignores SIGCONT, so that costs nothing.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGCONT), 0, 0, 0)


def _lower_priority(nice: int) -> None:
    """Run ``nice`` below the training process's main thread.

    Relative to that thread, not to the thread that started this process: an async save starts
    it from its own, already lowered thread, whose niceness a child inherits.
    """
    with contextlib.suppress(OSError):
        base = os.getpriority(os.PRIO_PROCESS, os.getppid())  # the parent's main thread
        os.setpriority(os.PRIO_PROCESS, 0, min(19, max(base + nice, os.nice(0))))


def main(argv: Sequence[str] | None = None) -> int:
    """The writer process: serve jobs until the socket closes."""
    args = list(sys.argv[1:] if argv is None else argv)
    sock = socket.socket(fileno=int(args[0]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _lower_priority(int(args[1]) if len(args) > 1 else WRITER_NICE)
    _continue_when_orphaned()
    # The parent's pid as it passed it: one that died before this line leaves getppid() at
    # the reaper's, which the watch would take for the parent.
    ppid = int(args[2]) if len(args) > 2 else os.getppid()
    service = _Service()
    logging.getLogger(LOGGER_NAME).addHandler(_FORWARD)
    threading.Thread(target=_watch_parent, args=(ppid, service), daemon=True).start()
    while True:
        try:
            msg, fds = recv_msg(sock)
        except (EOFError, OSError):  # the training rank is gone (a reset socket: it was killed)
            return 0
        reply = service.handle(msg, fds)
        try:
            send_msg(sock, reply)
        except OSError:
            return 0


def _run_main() -> int:
    """:func:`main`, a failure said in one line on the job's stderr, not a traceback.

    Under a task limit the writer could not start its watch thread: its traceback went into
    the training job's log, and the save said only "exited with status 1" (resource review R4).
    """
    try:
        return main()
    except Exception as exc:
        print(f"portable_ckpt writer process: {type(exc).__name__}: {exc} (a limit on "
              "threads, processes or memory is the usual cause; the save that started it "
              "fails, the next one starts a new writer)", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(_run_main())
