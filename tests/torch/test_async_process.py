"""Async save with the writer in a separate process (``mode="process"``): real processes, files.

Single-process saves here (no process group); the multi-rank protocol with a writer killed on
one rank is in ``test_distributed.py``'s neighbour ``test_async_process_dist``. What is shown:
the staged copy is what gets written (mutations after staging never leak), every dtype and
layout travels through the shared segment, the writer dies → the save fails with
PCK-WRITER-PROCESS, publishes nothing, leaves none of its files, and the next save works with a
new writer; shared memory never appears in ``/dev/shm`` and is freed on every path.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import portable_ckpt  # noqa: E402
import portable_ckpt.torch as pckt  # noqa: E402
from portable_ckpt.errors import UsageError, WriterProcessError  # noqa: E402
from portable_ckpt.format.naming import data_file_name, entry_file_name, index_file_name  # noqa: E402
from portable_ckpt.storage import open_process_spec  # noqa: E402
from portable_ckpt.storage.local import LocalStorage  # noqa: E402
from portable_ckpt.storage.s3 import S3Options, S3Storage  # noqa: E402
from portable_ckpt.torch import _process_write  # noqa: E402
from portable_ckpt.torch._shm import SHARED  # noqa: E402

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[2]
SEGMENT = "memfd:pck-staging"


def _state(salt: float = 0.0) -> dict[str, Any]:
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6) + salt
    return {
        "f32": base.float(),
        "bf16": (base * 0.5).to(torch.bfloat16),
        "i64": (base * 7).long(),
        "flags": base.long() % 3 == 0,
        "scalar": torch.tensor(3.5 + salt),
        "empty": torch.zeros(0, 5),
        "transposed": base.float().t(),  # not contiguous: staged contiguous, box unchanged
        "nested": {"f16": base[1].half(), "n": 7, "name": "run", "xs": [1.5, None]},
    }


def _zeros_like(v: Any) -> Any:
    """The same structure with every tensor zeroed and every scalar at its type's zero."""
    if isinstance(v, dict):
        return {k: _zeros_like(w) for k, w in v.items()}
    if isinstance(v, list):
        return [_zeros_like(w) for w in v]
    if isinstance(v, torch.Tensor):
        return torch.zeros_like(v.contiguous())
    return type(v)() if v is not None else None


def _equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    for k, v in a.items():
        w = b[k]
        if isinstance(v, dict):
            if not _equal(v, w):
                return False
        elif isinstance(v, torch.Tensor):
            if v.dtype != w.dtype or not torch.equal(v, w):
                return False
        elif v != w:
            return False
    return True


def _maps_segment(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8") as f:
            return any(SEGMENT in line for line in f)
    except FileNotFoundError:
        return False


def _shm_names() -> set[str]:
    """Names in /dev/shm that this code could create (its non-Linux fallback names them so)."""
    if not os.path.isdir("/dev/shm"):
        return set()
    return {n for n in os.listdir("/dev/shm") if n.startswith("pck-staging")}


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if _zombie(pid):
            return True
        time.sleep(0.05)
    return False


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, IndexError):
        return True


def _wait_for_new_data_file(root: Path, old_attempt: str, timeout: float = 60.0) -> None:
    """Poll (1 ms) until a data file of an attempt other than ``old_attempt`` exists."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.parent.parent.name != old_attempt for p in root.glob("*/data/*")):
            return
        time.sleep(0.001)
    raise AssertionError("the writer process created no data file")


def test_process_mode_writes_the_staged_copy(tmp_path: Path) -> None:
    """Every dtype and layout round-trips; mutating the state after staging changes nothing."""
    shm_before = _shm_names()
    state = _state()
    expect = _state()
    h = pckt.async_save(state, str(tmp_path), step=1, mode="process")
    assert h.staged.done() and h.staging_bytes >= SHARED.nbytes > 0
    for v in (state["f32"], state["bf16"], state["i64"], state["scalar"], state["transposed"]):
        v.add_(100)
    state["flags"].logical_not_()
    state["nested"]["f16"].mul_(0)
    state["nested"]["n"] = 8
    info = h.result(timeout=120)
    assert info.step == 1 and info.bytes_written > 0 and info.staging_bytes == pckt.staging_bytes()
    pid = _process_write.writer_process().pid
    segment = SHARED.segment
    # A second save reuses the writer process and the segment.
    h2 = pckt.async_save(state, str(tmp_path), step=2, mode="process")
    h2.result(timeout=120)
    assert _process_write.writer_process().pid == pid and SHARED.segment is segment
    loaded = _zeros_like(expect)
    assert pckt.load(loaded, str(tmp_path), step=1).step == 1
    assert _equal(expect, loaded), loaded
    assert portable_ckpt.open(str(tmp_path), step=1).verify(deep=True) == []
    # The writer maps the segment only while it writes; nothing is ever named in /dev/shm.
    assert not _maps_segment(pid) and _shm_names() <= shm_before


def test_writer_death_fails_the_save_and_the_next_one_works(tmp_path: Path) -> None:
    """SIGKILL of the writer mid-save: PCK-WRITER-PROCESS, nothing published or left behind."""
    state = {"big": torch.ones(16 << 20, dtype=torch.float32), "n": 1}
    first = pckt.async_save(state, str(tmp_path), step=1, mode="process").result(timeout=120)
    proc = _process_write.writer_process()
    os.kill(proc.pid, signal.SIGSTOP)  # held until the job is queued, then let go ...
    h = pckt.async_save(state, str(tmp_path), step=2, mode="process")
    os.kill(proc.pid, signal.SIGCONT)
    _wait_for_new_data_file(tmp_path, first.checkpoint_id)
    os.kill(proc.pid, signal.SIGSTOP)  # ... and frozen inside its first data file, killed there
    assert not h.done()
    os.kill(proc.pid, signal.SIGKILL)
    with pytest.raises(WriterProcessError) as e:
        h.result(timeout=120)
    assert e.value.code == "PCK-WRITER-PROCESS" and "SIGKILL" in str(e.value)
    assert f"pid {proc.pid}" in str(e.value) and "the next save starts a new one" in str(e.value)
    versions = portable_ckpt.list_versions(str(tmp_path))
    assert [v.step for v in versions if v.status == "committed"] == [1]
    # The failed attempt holds none of the writer's files (the data file it was inside is gone).
    left = [p for p in tmp_path.rglob("*") if p.is_file() and first.checkpoint_id not in p.parts]
    assert left == []
    state["big"].fill_(2.0)
    info = pckt.async_save(state, str(tmp_path), step=3, mode="process").result(timeout=120)
    assert _process_write.writer_process().pid != proc.pid
    assert portable_ckpt.open(str(tmp_path)).id == info.checkpoint_id
    assert float(portable_ckpt.open(str(tmp_path)).read("big")[-1]) == 2.0


_KILLED = """
import os, signal, sys, torch
import portable_ckpt.torch as pckt
from portable_ckpt.torch import _process_write
state = {"big": torch.ones(8 << 20, dtype=torch.float32)}
pckt.async_save(state, sys.argv[1], step=1, mode="process").result()
h = pckt.async_save(state, sys.argv[1], step=2, mode="process")
print(_process_write.writer_process().pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_training_process_killed_mid_save_takes_its_writer_along(tmp_path: Path) -> None:
    """SIGKILL of the training process: its writer exits at once; no segment survives them."""
    shm_before = _shm_names()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED, str(tmp_path)], capture_output=True, text=True,
        timeout=120, env=env,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    writer = int(proc.stdout.split()[0])
    assert _gone(writer, timeout=10.0), f"writer {writer} outlived its training process"
    assert _shm_names() <= shm_before
    versions = portable_ckpt.list_versions(str(tmp_path))
    assert [v.step for v in versions if v.status == "committed"] == [1]


def test_released_segment_is_unmapped(tmp_path: Path) -> None:
    """After ``release()`` this process maps no staging segment (the memory went back)."""
    pckt.async_save({"w": torch.ones(1000)}, str(tmp_path), step=1, mode="process").result(60)
    assert SHARED.nbytes > 0 and _maps_segment(os.getpid())
    SHARED.release()
    assert SHARED.nbytes == 0 and not _maps_segment(os.getpid())


def _segment_inodes() -> list[int]:
    """The staging memfd behind each descriptor of this process (the mmap holds a dup too)."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if SEGMENT in os.readlink(f"/proc/self/fd/{name}"):
                out.append(os.stat(f"/proc/self/fd/{name}").st_ino)
        except OSError:
            continue
    return out


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_release_closes_the_segment_descriptor(tmp_path: Path) -> None:
    """mutation audit 22 B2-09 / B2-14: ``release()`` closes the memfd, not only the mapping.

    A descriptor left open keeps the whole segment's memory alive after the mapping is gone.
    """
    pckt.async_save({"w": torch.ones(1000)}, str(tmp_path), step=1, mode="process").result(60)
    assert SHARED.segment is not None
    assert os.fstat(SHARED.segment.fd).st_ino in _segment_inodes()
    SHARED.release()
    assert _segment_inodes() == []


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_a_replaced_segment_closes_its_descriptor(tmp_path: Path) -> None:
    """mutation audit 22 B2-14: a segment replaced by a bigger one closes its memfd.

    Each growth would otherwise leak one descriptor (and the old segment's memory with it).
    """
    SHARED.release()
    pckt.async_save({"w": torch.ones(1000)}, str(tmp_path), step=1, mode="process").result(60)
    assert SHARED.segment is not None
    first = os.fstat(SHARED.segment.fd).st_ino
    assert set(_segment_inodes()) == {first}
    pckt.async_save({"w": torch.ones(1 << 20)}, str(tmp_path), step=2, mode="process").result(60)
    assert SHARED.segment is not None
    second = os.fstat(SHARED.segment.fd).st_ino
    assert second != first and set(_segment_inodes()) == {second}
    SHARED.release()
    assert _segment_inodes() == []


def test_the_segment_shrinks_when_the_state_does(tmp_path: Path) -> None:
    """mutation audit 22 B2-12: a segment more than twice what a save needs is replaced by a
    smaller one; a job that once staged a large state (an evaluation checkpoint, a state
    before pruning) kept that much shared memory for every later save."""
    SHARED.release()
    big = {"w": torch.ones(1 << 21)}  # 8 MiB
    pckt.async_save(big, str(tmp_path), step=1, mode="process").result(60)
    assert SHARED.nbytes >= 8 << 20
    small = {"w": torch.ones(1 << 18)}  # 1 MiB
    pckt.async_save(small, str(tmp_path), step=2, mode="process").result(60)
    assert 1 << 20 <= SHARED.nbytes <= 2 << 20, SHARED.nbytes
    loaded = _zeros_like(small)
    pckt.load(loaded, str(tmp_path), step=2)
    assert _equal(small, loaded)
    SHARED.release()


def test_rank_zero_gives_up_a_stopped_commit_writer_before_the_peers_stop_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mutation audit 22 B2-25: rank 0's commit gives a stopped writer at most half the save's
    ``timeout`` (the other ranks' wait for rank 0), so the outcome reaches them before they give
    up; at twice the timeout they stopped waiting first and the save's outcome split. Observed
    on the limits a real process-mode save passes to its writer's requests."""
    from portable_ckpt.io.writer_process import WriterProcess

    asked: list[tuple[str, float | None]] = []
    real = WriterProcess.request

    def request(self: Any, msg: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        asked.append((str(msg.get("op")), kwargs.get("stopped_limit")))
        return real(self, msg, *args, **kwargs)

    monkeypatch.setattr(WriterProcess, "request", request)
    info = pckt.async_save(_state(), str(tmp_path), step=1, mode="process",
                           timeout=40).result(timeout=120)
    assert info.step == 1
    limits = dict(asked)
    assert limits["commit"] is not None and 0 < limits["commit"] <= 20, asked


def test_roots_travel_by_description(tmp_path: Path) -> None:
    """Local and S3 roots reopen in another process from their JSON description alone."""
    local = LocalStorage(str(tmp_path), create=True)
    spec = local.process_spec()
    assert spec is not None
    again = open_process_spec(json.loads(json.dumps(spec)))
    assert type(again) is LocalStorage and again.root == local.root
    options = S3Options(part_size=6 << 20, endpoint_url="http://127.0.0.1:9", region="eu-west-1")
    s3 = S3Storage("bucket", "runs/a", options=options)
    spec = s3.process_spec()
    assert spec is not None and "credentials" not in json.dumps(spec).lower()
    again = open_process_spec(json.loads(json.dumps(spec)))
    assert type(again) is S3Storage and again.url == s3.url and again.options == options
    with pytest.raises(UsageError, match="no known backend"):
        open_process_spec({"kind": "ftp"})


class _Wrapped(LocalStorage):
    """A subclass may change behaviour: it never travels to a writer process."""


def test_process_mode_refuses_a_root_that_cannot_travel(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot be opened by another process"):
        pckt.async_save({"w": torch.ones(3)}, _Wrapped(str(tmp_path), create=True), step=1,
                        mode="process")
    with pytest.raises(UsageError, match="mode must be one of"):
        pckt.async_save({"w": torch.ones(3)}, str(tmp_path), step=1, mode="fork")
    assert os.listdir(tmp_path) == []  # refused before anything was touched


class _PathSpec(LocalStorage):
    """Backend review B1: a backend whose url is a path, travelling as {"kind": "url"}."""

    def process_spec(self) -> dict[str, object]:
        return {"kind": "url", "url": self.url}


class _OtherRoot(LocalStorage):
    """Its description opens a plain LocalStorage at another directory."""

    def process_spec(self) -> dict[str, object]:
        return {"kind": "local", "root": self.root + "-elsewhere"}


def test_process_mode_refuses_a_description_of_the_same_backend_at_another_root(
    tmp_path: Path,
) -> None:
    """mutation audit 22 B2-17: a description that opens the very same backend type, but at
    another root, is refused (not only one of another type): the writer would commit where
    this root never looks and the save would report success."""
    store = LocalStorage(str(tmp_path / "here"), create=True)
    (tmp_path / "there").mkdir()
    store.process_spec = lambda: {  # type: ignore[method-assign]
        "kind": "local", "root": str(tmp_path / "there")}  # a wrong description, injected
    with pytest.raises(UsageError, match=r"opens a LocalStorage at .*there.* not this"):
        pckt.async_save({"w": torch.ones(3)}, store, step=1, mode="process")
    assert os.listdir(tmp_path / "here") == [] and os.listdir(tmp_path / "there") == []


class _Registered(LocalStorage):
    """A backend of a scheme registered in this process only (backend review B3)."""

    def process_spec(self) -> dict[str, object]:
        return {"kind": "url", "url": self.url}


def test_process_mode_refuses_a_description_that_opens_another_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Backend review B1, B3: a backend whose url is a path was reopened by the writer process
    as a local directory: the save committed where the backend never looks and reported
    success. A scheme registered in this process only failed at the commit, after staging.
    Both are refused before anything is staged, naming the fix."""
    from portable_ckpt.storage import register_scheme

    state = {"w": torch.ones(3)}
    with pytest.raises(UsageError, match="not a path"):
        pckt.async_save(state, _PathSpec(str(tmp_path / "a"), create=True), step=1,
                        mode="process")
    with pytest.raises(UsageError, match=r"opens a LocalStorage at .*-elsewhere"):
        pckt.async_save(state, _OtherRoot(str(tmp_path / "b"), create=True), step=1,
                        mode="process")
    scheme = f"regonly{os.getpid()}"

    def opener(url: str) -> _Registered:
        store = _Registered(url.split("://", 1)[1], create=True)
        store.url = url
        return store

    register_scheme(scheme, opener)
    with pytest.raises(UsageError, match="registered in this process only"):
        pckt.async_save(state, f"{scheme}://{tmp_path / 'c'}", step=1, mode="process")
    for d in ("a", "b", "c"):
        assert os.listdir(tmp_path / d) == []  # refused before anything was written
    # An S3 subclass is refused for its type, not as a scheme registered here only (D5).
    from portable_ckpt.storage.s3 import S3Storage

    class _S3Sub(S3Storage):
        def process_spec(self) -> dict[str, object]:
            return {"kind": "url", "url": self.url}

    with pytest.raises(UsageError, match="opens a S3Storage at"):
        _process_write.check_can_travel(_S3Sub("bucket", "runs/a"))
    # A scheme an installed package declares (an entry point), whose opener gives back the
    # very object it opened before (a cache): the check does not close it (D2).
    site = tmp_path / "site"
    dist = site / "cachedstore-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: cachedstore\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        f"[portable_ckpt.storage]\n{scheme}c = cachedstore:opener\n")
    (site / "cachedstore.py").write_text("CACHED = None\n\ndef opener(url):\n    return CACHED\n")
    monkeypatch.syspath_prepend(str(site))
    import cachedstore  # type: ignore[import-not-found]

    cached = _Registered(str(tmp_path / "d"), create=True)
    cached.url = f"{scheme}c://{tmp_path / 'd'}"
    closed: list[bool] = []
    cached.close = lambda: closed.append(True)  # type: ignore[method-assign]
    cachedstore.CACHED = cached
    assert _process_write.check_can_travel(cached)["url"] == cached.url and closed == []
    with pytest.raises(UsageError, match="not a path"):
        open_process_spec({"kind": "url", "url": str(tmp_path)})


@given(st.integers(0, 99999), st.integers(0, 99999), st.integers(0, 9999), st.booleans())
def test_own_files_are_exactly_the_writers(writer: int, other: int, seq: int, per_rank: bool) -> None:
    """The cleanup after a dead writer matches its own names and never another writer's."""
    own = _process_write.is_own_file
    assert own(data_file_name(writer, seq), writer)
    assert own(index_file_name(writer), writer)
    assert own(index_file_name(writer).removesuffix(".json") + ".tensors.safetensors", writer)
    entry = entry_file_name("cfg/x", writer if per_rank else None, compressed=seq % 2 == 0)
    assert own(entry, writer) == (per_rank or writer == 0)
    if other != writer:
        assert not own(data_file_name(other, seq), writer)
        assert not own(index_file_name(other), writer)
        assert not own(entry_file_name("cfg/x", other, compressed=False), writer)
    assert not own("manifest.json", writer) and not own(f"data/sub/w{writer:05d}-0", writer)


def test_two_ranks_process_mode_and_a_writer_killed_on_one(tmp_path: Path) -> None:
    """Two gloo ranks: Shard, _StridedShard (same mesh and shape), Replicate and plain tensors
    round-trip while training collectives run on the default group; then rank 1's writer is
    killed mid-save: rank 1 fails with PCK-WRITER-PROCESS, rank 0 with PCK-DISTRIBUTED naming
    rank 1, nothing is published, and the next save works on both with new writers."""
    from portable_ckpt.torch.launch import run_group

    res = run_group("tests.torch._async_workers:process_save_and_writer_death", 2,
                    (str(tmp_path),), timeout=240, pg_timeout=90, sys_path=[str(ROOT)])
    res.raise_for_errors()
    r0, r1 = res.results
    for r in (r0, r1):
        assert r["staged"] and r["busy_ok"] and r["values_ok"] and r["epoch"] == 3, r
        assert r["committed_after_death"] == [1] and r["after"] == 3
    assert r0["id"] == r1["id"]
    assert r1["death_code"] == "PCK-WRITER-PROCESS" and "SIGKILL" in r1["death_message"]
    assert r0["death_code"] == "PCK-DISTRIBUTED" and "rank 1" in r0["death_message"], r0
    assert r1["new_writer"] and not r0["new_writer"]


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread niceness is Linux's")
@pytest.mark.parametrize("mode", ["thread", "process"])
def test_async_save_writes_below_the_training_threads_priority(tmp_path: Path, mode: str) -> None:
    """The threads (and the writer process) of an async save run BACKGROUND_NICE lower than
    the training thread; the training thread itself keeps its priority."""
    import threading

    from portable_ckpt._threads import BACKGROUND_NICE

    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    want = min(19, base + BACKGROUND_NICE)
    h = pckt.async_save(_state(), str(tmp_path), step=1, mode=mode)
    h.result(timeout=120)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base
    saving = [t for t in threading.enumerate() if t.name.startswith("pck-async-save")]
    assert saving and all(t.name.startswith("pck-async-save-low") for t in saving)
    for t in saving:
        assert t.native_id is not None and os.getpriority(os.PRIO_PROCESS, t.native_id) == want
    if mode == "thread":  # the checksummed chunks were written by a lowered write worker
        writes = [t for t in threading.enumerate() if t.name.startswith("pck-write-low")]
        assert writes and all(
            t.native_id is not None and os.getpriority(os.PRIO_PROCESS, t.native_id) == want
            for t in writes
        )
    else:  # the writer process: relative to this process's main thread, not to its starter
        proc = _process_write._CURRENT.proc
        assert proc is not None
        assert os.getpriority(os.PRIO_PROCESS, proc.proc.pid) == want


def test_a_reset_connection_ends_the_writer_quietly() -> None:
    """A training rank gone with a reply unread ends the writer with status 0 and no output.

    Under torchrun a rank killed mid-save made the writer's receive fail with
    ConnectionResetError, printed as a traceback before torchrun's summary (the first one an
    on-call engineer reads); every ``OSError`` of the receive now ends it as end-of-file does.
    A socketpair closed here gives end-of-file on this kernel, not the reset."""
    import socket
    import subprocess
    import sys

    from portable_ckpt.io.writer_process import recv_msg, send_msg

    ours, theirs = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-m", "portable_ckpt.io.writer_process", str(theirs.fileno())],
        pass_fds=[theirs.fileno()], stderr=subprocess.PIPE, text=True,
    )
    theirs.close()
    send_msg(ours, {"op": "ping"})
    recv_msg(ours)
    send_msg(ours, {"op": "ping"})
    ours.settimeout(60)
    assert ours.recv(1, socket.MSG_PEEK)  # the reply is there, the writer waits for more
    ours.close()  # with the reply unread: the writer's recv gets ECONNRESET
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err, err


_FORK_SCRIPT = """
import os, signal, sys, time
import torch
import portable_ckpt.torch as pckt
from portable_ckpt.torch._process_write import _CURRENT
root = sys.argv[1]
state = {"w": torch.arange(1 << 16, dtype=torch.float32)}
pckt.async_save(state, root, step=1, mode="process").committed.result(120)
writer = _CURRENT.proc.pid
os.kill(writer, signal.SIGSTOP)  # step 2 stays in flight
h = pckt.async_save(state, root, step=2, mode="process", exit_timeout=60)
t0 = time.monotonic()
pid = os.fork()
if pid == 0:
    sys.exit(0)  # an ordinary exit of a forked child
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), round(time.monotonic() - t0, 1), flush=True)
os.kill(writer, signal.SIGCONT)
print("parent", h.committed.result(120).step, flush=True)
"""


def test_a_forked_child_does_not_own_the_parents_save(tmp_path: Path) -> None:
    """Async review F10: a plain fork child's exit waited ``exit_timeout`` for its parent's
    save, said it was ABANDONED and exited 1; the parent's save then committed."""
    script = tmp_path / "fork.py"
    script.write_text(_FORK_SCRIPT)
    res = subprocess.run([sys.executable, str(script), str(tmp_path / "r")], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.split("\n")
    _, code, seconds = lines[0].split()
    assert code == "0" and float(seconds) < 30, res.stdout  # not the 60 s exit_timeout
    assert lines[1] == "parent 2" and "ABANDONED" not in res.stderr, (res.stdout, res.stderr)


_STOP_SCRIPT = """
import os, signal, sys, time
import torch
import portable_ckpt.torch as pckt
from portable_ckpt.torch._process_write import _CURRENT
from portable_ckpt.errors import CheckpointError
root = sys.argv[1]
state = {"w": torch.arange(1 << 16, dtype=torch.float32)}
pckt.async_save(state, root, step=1, mode="process").committed.result(120)
os.kill(_CURRENT.proc.pid, signal.SIGSTOP)
t0 = time.monotonic()
h = pckt.async_save(state, root, step=2, mode="process", timeout=3)
try:
    h.committed.result(120)
except CheckpointError as e:
    print(e.code, round(time.monotonic() - t0, 1), flush=True)
print(pckt.async_save(state, root, step=3, mode="process").committed.result(120).step)
"""


def test_a_stopped_writer_fails_its_save_and_the_next_save_works(tmp_path: Path) -> None:
    """Async review F1: a writer stopped (SIGSTOP, a debugger) hung the save for ever, and the
    next save waited on it; now one stopped past the save's timeout is killed, the save fails
    with PCK-WRITER-PROCESS, and the next one starts a new writer."""
    script = tmp_path / "stop.py"
    script.write_text(_STOP_SCRIPT)
    res = subprocess.run([sys.executable, str(script), str(tmp_path / "r")], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    failed, committed = res.stdout.split("\n")[:2]
    code, seconds = failed.split()
    assert code == "PCK-WRITER-PROCESS" and 3 <= float(seconds) < 30, res.stdout
    assert committed == "3", res.stdout


_UNASKED_SCRIPT = """
import sys, time
import torch
import portable_ckpt.torch as pckt
root, ask = sys.argv[1], sys.argv[2] == "ask"
open(root, "w").write("a file where the root should be")  # the save fails at once
h = pckt.async_save({"w": torch.ones(4)}, root, step=1)
while not h.done():
    time.sleep(0.05)
if ask:
    try:
        h.committed.result()
    except Exception as e:
        print("seen", e.code, flush=True)
"""


@pytest.mark.parametrize("ask", [False, True])
def test_a_failed_save_nobody_asked_about_fails_the_exit(tmp_path: Path, ask: bool) -> None:
    """Async review F7: a raw async_save that failed before exit, its handle never asked,
    ended the process with status 0 and nothing said: the only checkpoint was lost."""
    script = tmp_path / "unasked.py"
    script.write_text(_UNASKED_SCRIPT)
    res = subprocess.run([sys.executable, str(script), str(tmp_path / "r"), "ask" if ask else "-"],
                         capture_output=True, text=True, timeout=300)
    if ask:  # the caller saw the failure: its exit is its own
        assert res.returncode == 0 and res.stdout.startswith("seen PCK-"), (res.stdout, res.stderr)
        assert "ABANDONED" not in res.stderr
    else:
        assert res.returncode == 1, (res.stdout, res.stderr)
        assert "ABANDONED" in res.stderr and "its handle was never asked" in res.stderr


_KILLED_TRAINER = """
import sys
import torch
import portable_ckpt.torch as pckt
state = {f"t{i}": torch.full((1 << 24,), float(i)) for i in range(4)}  # 256 MiB
for step in range(1, 100):
    pckt.async_save(state, sys.argv[1], step=step, mode="process").committed.result()
    print("committed", step, flush=True)
"""


def test_a_killed_trainers_writer_removes_the_files_of_its_unfinished_write(
    tmp_path: Path,
) -> None:
    """Async review F14: after kill -9 of the training process its writer finished the whole
    shard, and the files stayed until gc's grace period; the writer now removes the files of
    a write whose index it never sent (no commit can name them) when its trainer is gone.
    F2: a writer stopped when its trainer died stayed stopped; now it goes too."""
    root = tmp_path / "r"
    script = tmp_path / "trainer.py"
    script.write_text(_KILLED_TRAINER)
    p = subprocess.Popen([sys.executable, str(script), str(root)], stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().startswith("committed 1")
        writer = int(subprocess.run(["pgrep", "-P", str(p.pid), "-f", "writer_process"],
                                    capture_output=True, text=True).stdout.split()[0])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list(root.glob("s000000000002-*/data/*")):
            time.sleep(0.005)
        os.kill(writer, signal.SIGSTOP)  # mid-write: its index is not sent yet
        assert list(root.glob("s000000000002-*/data/*"))
    finally:
        p.kill()
        p.wait()
    # The stopped writer does not hold the trainer's stdout: a pipeline reading it ends (F2).
    import select

    assert p.stdout is not None
    fd, deadline, eof = p.stdout.fileno(), time.monotonic() + 10, False
    while not eof and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.5)[0]:
            eof = os.read(fd, 65536) == b""
    assert eof, "the trainer's stdout stays open while its stopped writer lives"
    # Nobody continues it: the kernel's SIGCONT at its parent's death does (Linux), and the
    # writer cleans up and exits; it stayed stopped for ever before (F2).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and os.path.exists(f"/proc/{writer}"):
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{writer}")
    assert not [str(f) for f in root.glob("s000000000002-*/**/*") if f.is_file()]
    assert [v.step for v in portable_ckpt.list_versions(root) if v.status == "committed"] == [1]


_FORK_HOLDS = """
import os, sys, time
import torch
import portable_ckpt.torch as pckt
pckt.async_save({"w": torch.ones(1 << 22)}, sys.argv[1], step=1, mode="process").committed.result(120)
r, w = os.pipe()
ready_r, ready_w = os.pipe()
pid = os.fork()
if pid == 0:  # a DataLoader-like worker that outlives the next saves
    os.write(ready_w, b"r")  # the at-fork hooks have run
    os.read(r, 1)
    os._exit(0)
os.read(ready_r, 1)
maps = open(f"/proc/{pid}/maps").read()
fds = [os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd")]
print(sum("pck-staging" in line for line in maps.splitlines()),
      sum("pck-staging" in f for f in fds), flush=True)
os.write(w, b"x")
os.waitpid(pid, 0)
"""


def test_a_forked_child_holds_none_of_the_staging_memory(tmp_path: Path) -> None:
    """Async review F18: a forked worker kept the staging segment mapped (and its descriptor
    open), so a replaced segment's memory stayed in use while the worker lived."""
    script = tmp_path / "holds.py"
    script.write_text(_FORK_HOLDS)
    res = subprocess.run([sys.executable, str(script), str(tmp_path / "r")], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["0", "0"], res.stdout  # no mapping, no descriptor


def test_rank_zeros_writer_process_commits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """The commit (parsing every index, checking the files, building and parsing the record)
    runs in rank 0's writer process, not under the training process's interpreter lock; the
    training process still logs it as commit.* events. Shown by a commit that cannot run in
    this process: the process-mode save commits, a thread-mode save of the same state fails."""
    import logging

    import portable_ckpt.io.commit as commit_mod

    def not_here(*a: Any, **k: Any) -> Any:
        raise AssertionError("the commit ran in the training process")

    monkeypatch.setattr(commit_mod, "_commit", not_here)
    state = _state()
    with caplog.at_level(logging.INFO, logger="portable_ckpt.io"):
        info = pckt.async_save(state, str(tmp_path), step=1, mode="process").result(timeout=120)
    events = {r.pck_event["event"]: r.pck_event for r in caplog.records  # type: ignore[attr-defined]
              if hasattr(r, "pck_event")}
    assert events["commit.started"]["attempt_id"] == info.checkpoint_id
    done = events["commit.finished"]
    assert done["bytes"] == info.total_bytes > 0 and done["files"] >= 3
    loaded = _zeros_like(state)
    assert pckt.load(loaded, str(tmp_path), step=1).checkpoint_id == info.checkpoint_id
    assert _equal(state, loaded)
    with pytest.raises(portable_ckpt.CheckpointError, match="ran in the training process"):
        pckt.async_save(state, str(tmp_path), step=2, mode="thread").result(timeout=120)


_AFTER_PUBLISH = """
import os, signal
_how = os.environ.get("PCK_TEST_AFTER_PUBLISH")
if _how:
    from portable_ckpt.errors import CommitOutcomeUnknownError
    from portable_ckpt.storage.local import LocalStorage
    _orig = LocalStorage.create_if_absent
    def create_if_absent(self, path, data):
        if _how == "die-before" and path.endswith("/manifest.json"):
            os.kill(os.getpid(), signal.SIGKILL)  # an upload may still be in flight
        out = _orig(self, path, data)
        if path.endswith("/manifest.json"):  # published
            if _how == "die":
                os.kill(os.getpid(), signal.SIGKILL)  # the answer never leaves
            raise CommitOutcomeUnknownError(f"create {path}: the directory sync failed (test)")
        return out
    LocalStorage.create_if_absent = create_if_absent
    if _how == "bug":  # a bug in the commit before its record is created: the writer answers
        # (Not in create_if_absent: a backend's own exception there, no record after it, is an
        # unknown outcome, its request perhaps in flight: re-attack 27, 3.)
        import portable_ckpt.io.commit as _commit
        def _bug(*args, **kwargs):
            raise KeyError("a bug in the commit")
        _commit._readable = _bug
"""


def _run_after_publish(tmp_path: Path, how: str, script: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` with the commit record's creation followed by ``how`` (in every process)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_AFTER_PUBLISH)
    path = tmp_path / "s.py"
    path.write_text(script)
    env = {**os.environ, "PCK_TEST_AFTER_PUBLISH": how,
           "PYTHONPATH": os.pathsep.join([str(site), str(ROOT / "src"),
                                          os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(path), str(tmp_path / "r")], capture_output=True,
                          text=True, timeout=300, env=env)


_AFTER_PUBLISH_SCRIPT = """
import sys, torch
import portable_ckpt, portable_ckpt.torch as pckt
from portable_ckpt.torch import _process_write
root = sys.argv[1]
for step in (1, 2):
    info = pckt.async_save({"w": torch.arange(10.0) + step}, root, step=step,
                           mode="process").result(timeout=120)
    pid = _process_write._CURRENT.proc.pid
    print(step, info.checkpoint_id, info.total_bytes, pid, flush=True)
t = {"w": torch.zeros(10)}
print(pckt.load(t, root).step, t["w"].tolist(), flush=True)
"""


def test_a_writer_killed_after_publishing_is_a_committed_save(tmp_path: Path) -> None:
    """SIGKILL of rank 0's writer process right after it published the record: the answer is
    lost, but the version is committed; the save reads the record back and reports it
    committed (not failed while it is the latest), and the next save starts a new writer."""
    res = _run_after_publish(tmp_path, "die", _AFTER_PUBLISH_SCRIPT)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    saves = [line.split() for line in lines[:2]]
    assert [s[0] for s in saves] == ["1", "2"] and saves[0][3] != saves[1][3]  # a new writer
    versions = portable_ckpt.list_versions(str(tmp_path / "r"))
    assert [(v.step, v.id, v.status) for v in versions] == [
        (1, saves[0][1], "committed"), (2, saves[1][1], "committed")]
    for (_, attempt, nbytes, _), v in zip(saves, versions):
        assert v.id == attempt and int(nbytes) == sum(f.size for f in portable_ckpt.open(
            str(tmp_path / "r"), step=v.step).manifest.files.values())
    assert lines[2] == "2 " + str([float(i + 2) for i in range(10)])


_UNKNOWN_SCRIPT = """
import sys, torch
import portable_ckpt, portable_ckpt.torch as pckt
root = sys.argv[1]
for step, mode in ((1, "process"), (2, "thread")):
    try:
        pckt.async_save({"w": torch.arange(10.0) + step}, root, step=step,
                        mode=mode).result(timeout=120)
        print(mode, "committed", flush=True)
    except portable_ckpt.CheckpointError as e:
        print(mode, type(e).__name__, e.code, flush=True)
"""


def test_an_unknown_commit_outcome_keeps_its_class_and_the_files(tmp_path: Path) -> None:
    """Outcome-unknown review F1: the record was created, then its directory sync failed
    (CommitOutcomeUnknownError). In the writer process the class was lost on the way back
    (a plain PCK-STORAGE), so every rank aborted and removed its files: a committed version,
    the latest, without data. Now the class comes back, as in thread mode, and nothing is
    removed: both versions load."""
    res = _run_after_publish(tmp_path, "unknown", _UNKNOWN_SCRIPT)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        "process CommitOutcomeUnknownError PCK-STORAGE",
        "thread CommitOutcomeUnknownError PCK-STORAGE",
    ], res.stdout
    root = str(tmp_path / "r")
    assert [(v.step, v.status) for v in portable_ckpt.list_versions(root)] == [
        (1, "committed"), (2, "committed")]
    for step in (1, 2):
        assert portable_ckpt.open(root, step=step).verify(deep=True) == []
        t = {"w": torch.zeros(10)}
        pckt.load(t, root, step=step)
        assert torch.equal(t["w"], torch.arange(10.0) + step)


_DIES_BEFORE_SCRIPT = """
import sys, torch
import portable_ckpt, portable_ckpt.torch as pckt
root = sys.argv[1]
try:
    pckt.async_save({"w": torch.arange(10.0)}, root, step=1, mode="process").result(timeout=120)
    print("committed", flush=True)
except portable_ckpt.CheckpointError as e:
    print(type(e).__name__, e.code, flush=True)
"""


def test_a_writer_killed_while_committing_is_an_unknown_outcome_that_removes_nothing(
    tmp_path: Path,
) -> None:
    """Commit-child review F2, F5: a writer killed while the commit record was on its way (an
    object store may still complete the upload) was reported failed as soon as the record
    could not be read back, and every rank removed its files: a version committed a moment
    later without data. The outcome is unknown now: nothing is removed, and the attempt,
    which never committed here, is left to gc."""
    res = _run_after_publish(tmp_path, "die-before", _DIES_BEFORE_SCRIPT)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["CommitOutcomeUnknownError", "PCK-STORAGE"], res.stdout
    root = tmp_path / "r"
    [attempt] = [d for d in root.iterdir() if d.name.startswith("s0")]
    assert sorted(p.parent.name for p in attempt.rglob("*") if p.is_file()) == [
        "data", "index"]  # the writer's files stay: the record may yet appear
    assert [v.status for v in portable_ckpt.list_versions(root)] == ["incomplete"]



def test_a_commit_the_writer_answers_failed_is_a_known_failure(tmp_path: Path) -> None:
    """Diff review 3 F3: a writer that answered that its commit failed (a bug in its code) was
    taken for a lost writer: an unknown outcome on every rank, files left. It answered: the
    save failed, nothing was published, and its files are removed, as in thread mode."""
    res = _run_after_publish(tmp_path, "bug", _DIES_BEFORE_SCRIPT)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["WriterAnsweredError", "PCK-WRITER-PROCESS"], res.stdout
    root = tmp_path / "r"
    assert [p for p in root.rglob("*") if p.is_file()] == []
    assert portable_ckpt.list_versions(root) == [] or all(
        v.status != "committed" for v in portable_ckpt.list_versions(root))


def test_a_file_size_limit_on_the_staging_segment_is_named(tmp_path: Path) -> None:
    """Resource review R3: under ``ulimit -f``, sizing the shared-memory staging segment failed
    as "PCK-DISTRIBUTED ... (prepare) failed: OSError: [Errno 27]", naming neither the segment
    nor the limit, in a process without a group."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(f"""
        import resource, torch, portable_ckpt.torch as p
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
        try:
            p.async_save({{"w": torch.ones(512, 1024)}}, {str(tmp_path)!r}, step=1,
                         mode="process", continuation="statistical").committed.result(60)
        except Exception as e:
            print(getattr(e, "code", type(e).__name__), e)
    """)
    src = str(Path(__file__).resolve().parents[2] / "src")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                       env=dict(os.environ, PYTHONPATH=src), check=False)
    assert p.stdout.startswith("PCK-WRITER-PROCESS"), p.stdout + p.stderr
    assert "ulimit -f" in p.stdout and "mode='thread'" in p.stdout, p.stdout


def test_a_writer_process_that_cannot_start_says_why_in_one_line() -> None:
    """Resource review R4: a writer that failed at start (a task limit: its watch thread could
    not start) printed a traceback into the training job's log; the save said only "exited
    with status 1". Now one line, prefixed as the save's error says."""
    src = str(Path(__file__).resolve().parents[2] / "src")
    p = subprocess.run([sys.executable, "-P", "-m", "portable_ckpt.io.writer_process", "-1"],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=src), check=False)
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr and p.stderr.startswith("portable_ckpt writer process:")
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_a_forked_child_holds_none_of_the_parents_writer_process(tmp_path: Path) -> None:
    """mutation audit 22 B2-21: a forked child (a DataLoader worker) must not keep its
    parent's writer process: its saves would talk to the parent's writer over the shared
    socket. After the fork the child holds no writer (its next save starts its own)."""
    pckt.async_save(_state(), str(tmp_path), step=1, mode="process").result(timeout=120)
    parent = _process_write._CURRENT.proc
    assert parent is not None and parent.alive()
    pid = os.fork()
    if pid == 0:  # the child reports by its exit code only, and skips pytest's exit
        os._exit(0 if _process_write._CURRENT.proc is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _process_write._CURRENT.proc is parent and parent.alive()  # the parent's is untouched
