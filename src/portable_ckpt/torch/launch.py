"""Run a function on a fresh local gloo process group (loopback), one process per rank.

Used by ``portable-ckpt demo``, restore drills and the tests. Processes come from
``torch.multiprocessing`` with the ``forkserver`` start method (torch is imported once in the
fork server, so each group starts in well under a second after the first). Results travel back as
JSON files, never pickles.
"""

from __future__ import annotations

import json
import multiprocessing.connection as mp_connection
import os
import signal
import socket
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch.multiprocessing as tmp

__all__ = ["GROUP_PREFIX", "GroupResult", "free_port", "run_group", "sweep_abandoned_groups"]

#: The fork server of this process answered once (:func:`_start_fork_server`).
_SERVER_READY = False

_PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.distributed.tensor",
    "torch.distributed.device_mesh",
    "torch.distributed.fsdp",
    "torch.distributed.checkpoint.state_dict",
    "torch.distributed._functional_collectives",
    "torch._dynamo",
    "torch.onnx",
    "numpy",
    "numpy.random",
    "portable_ckpt.torch",
]


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class GroupResult:
    """What a group run produced.

    Attributes:
        results: Per rank, the JSON value the function returned (``None`` if it failed).
        exitcodes: Per rank, the process exit code (negative: killed by that signal).
        errors: Per rank, the traceback text of an exception (``None`` when it returned).
        seconds: Wall time of the whole group.

    """

    results: list[Any]
    exitcodes: list[int | None]
    errors: list[str | None]
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether every rank returned normally."""
        return all(c == 0 for c in self.exitcodes) and all(e is None for e in self.errors)

    def raise_for_errors(self) -> None:
        """Raise ``RuntimeError`` with every failed rank's traceback."""
        if not self.ok:
            parts = [
                f"rank {r}: exit {c}\n{e or ''}"
                for r, (c, e) in enumerate(zip(self.exitcodes, self.errors, strict=True))
                if c != 0 or e is not None
            ]
            raise RuntimeError("process group run failed:\n" + "\n".join(parts))


def _resolve_fn(fn: Callable[..., Any] | str, sys_path: Sequence[str]) -> Callable[..., Any]:
    if callable(fn):
        return fn
    import importlib
    import sys

    for p in reversed(list(sys_path)):
        if p not in sys.path:
            sys.path.insert(0, p)
    module, _, name = fn.partition(":")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{fn} is not callable")
    return obj


def _entry(
    rank: int,
    world_size: int,
    init: str,
    outdir: str,
    fn: Callable[..., Any] | str,
    args: Sequence[Any],
    threads: int,
    timeout: float,
    sys_path: Sequence[str] = (),
    backend: str = "gloo",
    sigint: bool = True,
    safepath: str | None = None,
) -> None:
    import datetime as dt

    # The fork server ran with PYTHONSAFEPATH=1 (_start_fork_server); the caller's own value
    # comes back for what this rank starts.
    if safepath is None:
        os.environ.pop("PYTHONSAFEPATH", None)
    else:
        os.environ["PYTHONSAFEPATH"] = safepath

    import torch
    import torch.distributed as dist

    # The fork server ignores SIGINT (_start_fork_server); a rank takes Ctrl-C as Python does,
    # unless the caller ignores it too (started with nohup, or in the background of a script).
    if sigint:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(threads)
    out = os.path.join(outdir, f"rank{rank:05d}.json")
    try:
        if backend == "nccl":  # one GPU per rank, before NCCL sees the device
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(
            backend,
            init_method=init,
            rank=rank,
            world_size=world_size,
            timeout=dt.timedelta(seconds=timeout),
        )
        if backend == "gloo":
            # gloo's constructor returns on a rank as soon as its side of each pair is up: a
            # rank with nothing to say (no collective) ran, exited and closed its sockets while
            # a slower peer was still connecting, and that peer's init failed ("connectFullMesh
            # failed ... Connection closed by peer", 3 % of two-rank groups on a loaded host).
            dist.barrier()
        value = _resolve_fn(fn, sys_path)(rank, world_size, *args)
        doc: dict[str, Any] = {"result": value, "error": None}
    except KeyboardInterrupt:
        os._exit(130)  # Ctrl-C reached the whole terminal group: the parent reports it
    except BaseException:
        doc = {"result": None, "error": traceback.format_exc()}
    try:
        with open(out + ".tmp", "w", encoding="utf-8") as f:
            json.dump(doc, f)
        os.replace(out + ".tmp", out)
    except OSError:
        os._exit(1)  # the parent is gone (its directory with it): nobody reads a result
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass
    if doc["error"] is not None:
        os._exit(1)


def run_group(
    fn: Callable[..., Any] | str,
    world_size: int,
    args: Sequence[Any] = (),
    *,
    timeout: float = 120.0,
    threads: int = 1,
    pg_timeout: float = 60.0,
    start_method: str = "forkserver",
    sys_path: Sequence[str] = (),
    backend: str = "gloo",
    progress: Callable[[int, int], None] | None = None,
) -> GroupResult:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` fresh processes in one group.

    ``fn`` is a module-level function or a ``"module:function"`` string (imported in each rank,
    after prepending ``sys_path``); it returns a JSON-serialisable value.
    Rendezvous uses a fresh ``file://`` store, so no port can be taken by a concurrent run;
    gloo connects over loopback (``GLOO_SOCKET_IFNAME=lo``), and every gloo rank passes a
    barrier before ``fn`` runs. On an interrupt every rank still alive is killed before the
    ``KeyboardInterrupt`` propagates.

    Args:
        fn: The per-rank function.
        world_size: Number of processes.
        args: Extra JSON-friendly arguments.
        timeout: Seconds to wait for the whole group before killing it.
        threads: ``torch.set_num_threads`` in each rank.
        pg_timeout: The process group's collective timeout (seconds).
        start_method: ``forkserver`` (default) or ``spawn``.
        sys_path: Directories prepended to ``sys.path`` in each rank (for string ``fn``).
        backend: The default group's backend: ``"gloo"``, or ``"nccl"`` (rank r uses GPU
            r mod the device count).
        progress: Called as ``progress(ranks_exited, world_size)`` each time ranks exit.

    """
    ctx: Any = tmp.get_context(start_method)
    if start_method == "forkserver":
        try:
            ctx.set_forkserver_preload(_PRELOAD)
        except Exception:
            pass
        _start_fork_server(ctx)
    sigint = signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
    t0 = time.perf_counter()
    sweep_abandoned_groups()
    with tempfile.TemporaryDirectory(prefix=GROUP_PREFIX) as outdir:
        _write_owners(outdir, [])
        init = "file://" + os.path.join(outdir, "store")
        procs = []
        for rank in range(world_size):
            p = ctx.Process(
                target=_entry,
                args=(
                    rank,
                    world_size,
                    init,
                    outdir,
                    fn,
                    tuple(args),
                    threads,
                    pg_timeout,
                    tuple(sys_path),
                    backend,
                    sigint,
                    os.environ.get("PYTHONSAFEPATH"),
                ),
                daemon=False,
            )
            p.start()
            procs.append(p)
        _write_owners(outdir, [p.pid for p in procs])
        try:
            _wait_all(procs, time.monotonic() + timeout, progress)
        finally:  # also on Ctrl-C: no rank outlives the group's directory
            _kill_all(procs)
        results: list[Any] = []
        errors: list[str | None] = []
        for rank, p in enumerate(procs):
            path = os.path.join(outdir, f"rank{rank:05d}.json")
            try:
                with open(path, encoding="utf-8") as f:
                    doc = json.load(f)
                results.append(doc["result"])
                errors.append(doc["error"])
            except FileNotFoundError:
                results.append(None)
                errors.append(f"no result (exit code {p.exitcode})")
        return GroupResult(results, [p.exitcode for p in procs], errors, time.perf_counter() - t0)


#: Prefix of a group's directory (its rendezvous store and the ranks' results).
GROUP_PREFIX = "pck-group-"
#: The file naming the processes of a group's directory (:func:`sweep_abandoned_groups`).
_OWNERS = "owners.json"


def _started(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # Field 22, counted after the command name, which may hold spaces and parentheses.
    return int(stat[stat.rindex(b")") + 2:].split()[19])


def _pid_space() -> str | None:
    """The boot and PID namespace of this process (None: unknown); pids mean these only.

    Containers sharing a ``$TMPDIR`` (a pod's shared ``/tmp``) see other PID namespaces'
    group directories; there the owners' pids name nothing, or other processes.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f"{f.read().strip()} {os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def _write_owners(outdir: str, ranks: list[int | None]) -> None:
    """Name this process and the ranks (pid and start time) as the users of ``outdir``."""
    me = os.getpid()
    known = ((p, _started(p)) for p in ranks if p)
    doc = {"owner": [me, _started(me)], "ranks": [[p, t] for p, t in known if t is not None],
           "pid_space": _pid_space()}
    with open(os.path.join(outdir, _OWNERS + ".tmp"), "w", encoding="utf-8") as f:
        json.dump(doc, f)
    os.replace(os.path.join(outdir, _OWNERS + ".tmp"), os.path.join(outdir, _OWNERS))


#: Far beyond an owners file of any run (a pid and a start time per rank).
_MAX_OWNERS_BYTES = 1 << 20


def _read_owners(path: str) -> bytes:
    """An owners file's bytes: a regular file only, not followed, bounded.

    A FIFO or a link to one there blocked the sweep, and so the drill or demo that ran it,
    for good; a link to ``/dev/zero`` read without end (re-attack 29).
    """
    import stat as st

    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not st.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path} is not a regular file")
        data = os.read(fd, _MAX_OWNERS_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > _MAX_OWNERS_BYTES:
        raise ValueError(f"{path} is larger than an owners file")
    return data


def sweep_abandoned_groups(tmpdir: str | None = None) -> list[str]:
    """Remove group directories that a killed run left behind; returns the paths removed.

    A run killed with SIGKILL (a drill's parent, an out-of-memory kill) runs no ``finally``:
    its directory stayed in the temporary directory for good. One is removed only when it is
    positively known abandoned: a directory of this user named :data:`GROUP_PREFIX`, whose
    owners file names its run and ranks, none of which is still running (a process id of
    another start time is another process), in this boot and PID namespace. Anything else is
    kept (no ``/proc``: nothing is known, nothing removed).
    """
    import shutil
    import stat as st

    base = tmpdir or tempfile.gettempdir()
    removed: list[str] = []
    space = _pid_space()
    if space is None:
        return removed
    try:
        names = [n for n in os.listdir(base) if n.startswith(GROUP_PREFIX)]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(base, name)
        try:
            info = os.lstat(path)
            if not st.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                continue
            doc = json.loads(_read_owners(os.path.join(path, _OWNERS)))
            procs = [doc["owner"], *doc["ranks"]]
            if not all(isinstance(pid, int) and isinstance(t, int) for pid, t in procs):
                continue
            if doc.get("pid_space") != space:
                continue  # its pids are another namespace's (or boot's): nothing is known
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            continue  # not a group directory this code wrote, or not readable: kept
        if any(_started(pid) == t for pid, t in procs):
            continue  # its run or a rank is still running
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _start_fork_server(ctx: Any) -> None:
    """Start the fork server (once per process) with SIGINT ignored, and wait until it serves.

    It imports torch before it sets its own handlers: a Ctrl-C in those seconds printed its
    traceback (the terminal signals the whole group), so it starts with SIGINT ignored (ranks
    restore the handler in ``_entry``). The first process it forks waits for those imports; that
    one is a no-op here, so a Ctrl-C meanwhile leaves no rank waiting for a group that is gone.
    """
    global _SERVER_READY
    if _SERVER_READY:
        return
    from multiprocessing import forkserver

    # The server is `python -c`, which puts the working directory first on sys.path: a module
    # planted there (a shared directory) ran in it, and so in every rank (tenant review F1).
    # PYTHONSAFEPATH keeps it out; the ranks drop the variable again (_entry) so that what
    # they start themselves runs as the caller's own processes would.
    had = os.environ.get("PYTHONSAFEPATH")
    os.environ["PYTHONSAFEPATH"] = "1"
    try:
        if threading.current_thread() is threading.main_thread():
            old = signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                forkserver.ensure_running()
            finally:
                signal.signal(signal.SIGINT, old)
        else:
            forkserver.ensure_running()
    finally:
        if had is None:
            os.environ.pop("PYTHONSAFEPATH", None)
        else:
            os.environ["PYTHONSAFEPATH"] = had
    warm = ctx.Process(target=os.getpid, daemon=True)
    warm.start()
    warm.join()
    _SERVER_READY = True


def _kill_all(procs: list[Any]) -> None:
    """Kill and reap every process still alive, even through further interrupts.

    ``timeout -s INT`` signals the caller, then its process group: the second signal landed
    in this loop, skipped the kills, and a rank that outlived the first signal (busy in native
    code, or ignoring SIGINT) was then joined by multiprocessing at exit, so the command hung
    after it had said it was interrupted. An interrupt here waits until every rank is gone.
    """
    interrupt: BaseException | None = None
    for p in procs:
        while True:
            try:
                if p.is_alive():
                    p.kill()
                    p.join(5)
                break
            except KeyboardInterrupt as exc:
                interrupt = interrupt or exc
    if interrupt is not None:
        raise interrupt


def _wait_all(procs: list[Any], deadline: float, progress: Callable[[int, int], None] | None) -> None:
    """Wait until every process exited or the deadline passed, reporting exits as they happen."""
    pending = {p.sentinel: p for p in procs}
    while pending and (left := deadline - time.monotonic()) > 0:
        for sentinel in mp_connection.wait(list(pending), timeout=left):
            pending.pop(cast(int, sentinel)).join()
        if progress is not None:
            progress(len(procs) - len(pending), len(procs))
