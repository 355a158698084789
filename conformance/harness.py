"""Writer harness: drives any writer through the adapter protocol (see conformance/README.md).

For every generated logical state the harness writes one *write job* per writer and runs
``CMD write-job.json`` for all writers concurrently, then one *commit job* (``CMD commit.json``).
It then checks the result with :func:`conformance.checker.check_version` (deep) and compares every
tensor byte for byte and every entry value with its own reader (:mod:`conformance.reader`).

Format 1.1: jobs carry ``tensor_table`` (and ``table_codec``), a request the writer MAY honour by
holding tensor entries in a tensor table (spec §8.5) in its writer index or the manifest; every
check accepts both forms.

Atomic-publish scenarios save a first state A, then attempt a second state B with a fault:
a writer asked to fail (``fail_at``), a writer or the committer killed with SIGKILL at a random
moment, or the committer asked to fail before publishing. Afterwards no partial attempt may be
visible as committed, every committed version must conform, and the latest version must be A
(or B, only if B was completely committed).
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st

from conformance.checker import check, check_version
from conformance.reader import committed_versions, latest_committed, load_version
from conformance.spec import DTYPES

__all__ = [
    "PROTOCOL",
    "CrashCase",
    "EntrySpec",
    "HarnessFailure",
    "SaveCase",
    "TensorSpec",
    "crash_cases",
    "new_attempt_id",
    "run_crash_case",
    "run_save_case",
    "run_writer_suite",
    "check_writer",
    "commit_job",
    "save_cases",
    "verify_saved",
    "write_jobs",
]

PROTOCOL = "portable-ckpt-writer-job/1"
_CONTROL = "".join(chr(i) for i in range(32)) + "\x7f"
WRITE_FAULTS = ("before_data", "mid_data", "after_data")
#: how often save cases ask for a tensor table: never, sometimes (hypothesis draws), always.
TABLE_MODES = ("never", "sometimes", "always")
COMMIT_FAULTS = ("before_publish", "temp_written")


class HarnessFailure(AssertionError):
    """The writer under test broke a rule; the message says which."""


@dataclass
class TensorSpec:
    """A logical tensor, its full data and how it is split among writers."""

    key: str
    dtype: str
    shape: list[int]
    seed: int
    boxes: list[tuple[list[int], list[int], int]]  # (offsets, lengths, writer)
    declared_by: int = 0  # writer that declares a zero-size tensor

    def data(self) -> np.ndarray:
        """Full tensor as uint8 array of shape ``shape + [itemsize]`` (C order, little endian)."""
        isz = DTYPES[self.dtype][1]
        n = math.prod(self.shape) * isz
        raw = np.random.default_rng(self.seed).integers(0, 256, size=n, dtype=np.uint8)
        if self.dtype == "bool":
            raw &= 1
        return raw.reshape(*self.shape, isz)


@dataclass
class EntrySpec:
    """A non-tensor entry: global (``value``) or per_rank (``values[rank]``)."""

    name: str
    schema: dict[str, Any]
    scope: str
    encoding: str
    value: Any = None
    values: list[Any] = field(default_factory=list)
    policy: str | None = None
    writer: int = 0  # writer that stores a global entry


@dataclass
class SaveCase:
    """One logical state to save."""

    step: int
    num_writers: int
    codec: str
    tensors: list[TensorSpec]
    entries: list[EntrySpec]
    tensor_table: bool = False  # ask the writer for a tensor table (format 1.1, §8.5)
    table_codec: str = "none"  # codec of that table

    def summary(self) -> str:
        """Short description for failure messages."""
        ts = ", ".join(f"{t.key!r}:{t.dtype}{t.shape}/{len(t.boxes)}box" for t in self.tensors)
        es = ", ".join(f"{e.name}:{e.scope}/{e.encoding}" for e in self.entries)
        tt = f" tensor_table={self.table_codec}" if self.tensor_table else ""
        return (f"step={self.step} writers={self.num_writers} codec={self.codec}{tt} "
                f"tensors=[{ts}] entries=[{es}]")


@dataclass
class CrashCase:
    """A committed state A, then an attempt at B broken by ``fault``."""

    first: SaveCase
    second: SaveCase
    fault: str  # write:<point>, commit:<point>, kill-writer, kill-commit
    victim: int
    delay: float


_counter = 0


def new_attempt_id(step: int) -> str:
    """A fresh attempt id per the spec's pattern."""
    global _counter
    _counter += 1
    t = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(t)) + f"{int(t % 1 * 1e6):06d}Z"
    return f"s{step:012d}-{stamp}-{random.getrandbits(64):016x}"


# --------------------------------------------------------------------------------- strategies
def _partition(draw: Any, shape: list[int]) -> list[tuple[list[int], list[int]]]:
    if 0 in shape:
        return []
    boxes = [([0] * len(shape), list(shape))]
    for _ in range(draw(st.integers(0, 5))):
        splittable = [i for i, b in enumerate(boxes) if any(n >= 2 for n in b[1])]
        if not splittable:
            break
        i = draw(st.sampled_from(splittable))
        offs, lens = boxes.pop(i)
        d = draw(st.sampled_from([d for d, n in enumerate(lens) if n >= 2]))
        cut = draw(st.integers(1, lens[d] - 1))
        a_l, b_l, b_o = list(lens), list(lens), list(offs)
        a_l[d], b_l[d], b_o[d] = cut, lens[d] - cut, offs[d] + cut
        boxes += [(list(offs), a_l), (b_o, b_l)]
    return boxes


def _json_values() -> Any:
    leaf = (st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1)
            | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8))
    return st.recursive(leaf, lambda c: st.lists(c, max_size=3)
                        | st.dictionaries(st.text(max_size=5), c, max_size=3), max_leaves=6)


def save_cases(max_writers: int = 4, codecs: tuple[str, ...] = ("none", "zstd"),
               max_tensors: int = 4, max_entries: int = 3, min_step: int = 0,
               tables: str = "sometimes") -> Any:
    """Hypothesis strategy of :class:`SaveCase`: uneven 0–4-D shardings of every dtype.

    ``tables`` (one of :data:`TABLE_MODES`) says whether cases ask for a tensor table.
    """
    if tables not in TABLE_MODES:
        raise ValueError(f"tables must be one of {TABLE_MODES}, got {tables!r}")

    @st.composite
    def build(draw: Any) -> SaveCase:
        nw = draw(st.integers(1, max_writers))
        codec = draw(st.sampled_from(list(codecs)))
        keys = draw(st.lists(st.text(st.characters(exclude_categories=["Cs"], exclude_characters=_CONTROL),
                                     min_size=1, max_size=12),
                             max_size=max_tensors, unique=True))
        tensors = []
        for key in keys:
            dtype = draw(st.sampled_from(list(DTYPES)))
            ndim = draw(st.integers(0, 4))
            shape = draw(st.lists(st.integers(0 if draw(st.booleans()) and ndim else 1,
                                              max(1, 6 - ndim)),
                                  min_size=ndim, max_size=ndim))
            replicated = draw(st.booleans())  # every writer holds it, exactly one writes it
            parts = [([0] * ndim, list(shape))] if replicated and 0 not in shape else \
                _partition(draw, shape)
            boxes = [(o, n, draw(st.integers(0, nw - 1))) for o, n in parts]
            tensors.append(TensorSpec(key, dtype, shape, draw(st.integers(0, 2**32 - 1)),
                                      boxes, draw(st.integers(0, nw - 1))))
        names = draw(st.lists(st.from_regex(r"[a-z][a-z0-9_.-]{0,8}(/[a-z][a-z0-9_-]{0,4})?",
                                            fullmatch=True)
                              | st.sampled_from(["n" * 256, "a/b/c/d/e/f/g/h", "x." * 100]),
                              max_size=max_entries, unique=True))
        entries = []
        for name in names:
            schema = draw(st.sampled_from([{"id": "pck:json/1"}, {"json_schema": {}},
                                           {"json_schema": {"not": {"type": "null"}}}]))
            vals = _json_values().filter(lambda v: v is not None) \
                if "not" in schema.get("json_schema", {}) else _json_values()
            enc = draw(st.sampled_from(["json", "json+zstd"]))
            if draw(st.booleans()):
                entries.append(EntrySpec(name, schema, "global", enc, value=draw(vals),
                                         writer=draw(st.integers(0, nw - 1))))
            else:
                entries.append(EntrySpec(
                    name, schema, "per_rank", enc, values=[draw(vals) for _ in range(nw)],
                    policy=draw(st.sampled_from(["require_same", "modulo", "rank0", "drop"]))))
        step = draw(st.integers(min_step, min_step + 10**6))
        want_table = tables == "always" or (tables == "sometimes" and draw(st.booleans()))
        table_codec = draw(st.sampled_from(["none", "zstd"])) if want_table else "none"
        return SaveCase(step, nw, codec, tensors, entries, want_table, table_codec)

    return build()


def crash_cases(max_writers: int = 3, codecs: tuple[str, ...] = ("none", "zstd"),
                tables: str = "sometimes") -> Any:
    """Hypothesis strategy of :class:`CrashCase`."""

    @st.composite
    def build(draw: Any) -> CrashCase:
        a = draw(save_cases(max_writers, codecs, max_tensors=2, max_entries=1, tables=tables))
        b = draw(save_cases(max_writers, codecs, max_tensors=2, max_entries=1,
                            min_step=a.step + 1, tables=tables))
        if not any(t.boxes for t in b.tensors):  # give the writers something to write
            b.tensors.append(TensorSpec("crash.filler", "float32", [64, 8], 1,
                                        [([0, 0], [64, 8], 0)]))
        fault = draw(st.sampled_from([f"write:{p}" for p in WRITE_FAULTS]
                                     + [f"commit:{p}" for p in COMMIT_FAULTS]
                                     + ["kill-writer", "kill-commit"]))
        return CrashCase(a, b, fault, draw(st.integers(0, b.num_writers - 1)),
                         draw(st.floats(0.0, 0.6)))

    return build()


# -------------------------------------------------------------------------------------- jobs
def write_jobs(case: SaveCase, jobdir: Path, root: Path, attempt_id: str,
               fail_at: dict[int, str] | None = None) -> list[Path]:
    """Write one job file (and its raw chunk files) per writer; return their paths."""
    jobdir.mkdir(parents=True, exist_ok=True)
    per: list[dict[str, Any]] = [{"tensors": [], "entries": []} for _ in range(case.num_writers)]
    for ti, t in enumerate(case.tensors):
        full = t.data()
        chunks: dict[int, list[dict[str, Any]]] = {}
        for bi, (offs, lens, w) in enumerate(t.boxes):
            sl = tuple(slice(o, o + n) for o, n in zip(offs, lens, strict=True))
            rel = f"chunks/w{w}-t{ti}-b{bi}.bin"
            (jobdir / rel).parent.mkdir(exist_ok=True)
            (jobdir / rel).write_bytes(np.ascontiguousarray(full[sl]).tobytes())
            chunks.setdefault(w, []).append({"offsets": offs, "lengths": lens, "data": rel})
        if not t.boxes:
            chunks[t.declared_by] = []
        for w, ch in chunks.items():
            per[w]["tensors"].append({"key": t.key, "dtype": t.dtype, "shape": t.shape,
                                      "chunks": ch})
    for e in case.entries:
        base = {"name": e.name, "schema": e.schema, "scope": e.scope, "encoding": e.encoding}
        if e.scope == "global":
            per[e.writer]["entries"].append({**base, "value": e.value})
        else:
            for r, v in enumerate(e.values):
                per[r]["entries"].append({**base, "rank": r, "world_size_policy": e.policy,
                                          "value": v})
    paths = []
    for w in range(case.num_writers):
        job = {"protocol": PROTOCOL, "phase": "write", "root": str(root), "attempt_id": attempt_id,
               "step": case.step, "writer": w, "num_writers": case.num_writers,
               "world_size": case.num_writers, "codec": case.codec, "block_size": 4096,
               "tensor_table": case.tensor_table, "table_codec": case.table_codec,
               **per[w], "fail_at": (fail_at or {}).get(w)}
        p = jobdir / f"write-w{w}.json"
        p.write_text(json.dumps(job, indent=1))
        paths.append(p)
    return paths


def commit_job(case: SaveCase, jobdir: Path, root: Path, attempt_id: str,
               fail_at: str | None = None) -> Path:
    """Write the commit job file."""
    job = {"protocol": PROTOCOL, "phase": "commit", "root": str(root), "attempt_id": attempt_id,
           "step": case.step, "writers": list(range(case.num_writers)),
           "continuation": {"contract": "exact", "world_size": case.num_writers, "mesh": None},
           "tensor_table": case.tensor_table, "table_codec": case.table_codec,
           "fail_at": fail_at}
    p = jobdir / "commit.json"
    p.write_text(json.dumps(job, indent=1))
    return p


@dataclass
class _Proc:
    popen: subprocess.Popen[bytes]
    job: Path
    log: Path


def _start(cmd: list[str], job: Path) -> _Proc:
    log = job.with_suffix(".log")
    f = open(log, "wb")
    p = subprocess.Popen([*cmd, str(job)], stdout=f, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL)
    f.close()
    return _Proc(p, job, log)


def _wait(proc: _Proc, timeout: float) -> int:
    try:
        return proc.popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.popen.kill()
        proc.popen.wait()
        raise HarnessFailure(f"adapter timed out after {timeout}s on {proc.job}: "
                             f"{_tail(proc.log)}") from None


def _tail(log: Path, n: int = 1500) -> str:
    try:
        return log.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _run_writers(cmd: list[str], jobs: list[Path], timeout: float,
                 kill: tuple[int, float] | None = None) -> list[int]:
    procs = [_start(cmd, j) for j in jobs]
    if kill is not None:
        victim, delay = kill
        time.sleep(delay)
        if procs[victim].popen.poll() is None:
            os.kill(procs[victim].popen.pid, signal.SIGKILL)
    return [_wait(p, timeout) for p in procs]


def _save(cmd: list[str], case: SaveCase, root: Path, jobdir: Path, timeout: float) -> str:
    aid = new_attempt_id(case.step)
    rcs = _run_writers(cmd, write_jobs(case, jobdir, root, aid), timeout)
    for w, rc in enumerate(rcs):
        if rc != 0:
            raise HarnessFailure(f"writer {w} failed (exit {rc}) on {case.summary()}: "
                                 f"{_tail(jobdir / f'write-w{w}.log')}")
    cp = _start(cmd, commit_job(case, jobdir, root, aid))
    rc = _wait(cp, timeout)
    if rc != 0:
        raise HarnessFailure(f"commit failed (exit {rc}) on {case.summary()}: {_tail(cp.log)}")
    return aid


def verify_saved(root: Path, attempt_id: str, case: SaveCase) -> None:
    """Check a committed version deeply and compare it element by element with ``case``."""
    vdir = root / attempt_id
    if not (vdir / "manifest.json").is_file():
        raise HarnessFailure(f"{attempt_id} has no manifest.json after a successful commit")
    rep = check_version(vdir, deep=True)
    if not rep.ok:
        errs = "; ".join(f"{e.code}: {e.message}" for e in rep.errors[:5])
        raise HarnessFailure(f"saved checkpoint does not conform ({case.summary()}): {errs}")
    got = load_version(vdir)
    if got.step != case.step:
        raise HarnessFailure(f"manifest step {got.step} != {case.step}")
    ws = got.manifest["continuation"]["world_size"]
    if ws != case.num_writers:
        raise HarnessFailure(f"continuation.world_size {ws} != {case.num_writers}")
    want_keys = {t.key for t in case.tensors}
    if set(got.tensors) != want_keys:
        raise HarnessFailure(f"tensor keys {sorted(got.tensors)!r} != {sorted(want_keys)!r}")
    for t in case.tensors:
        dtype, shape, data = got.tensors[t.key]
        if dtype != t.dtype or list(shape) != t.shape:
            raise HarnessFailure(f"tensor {t.key!r}: saved as {dtype}{list(shape)}, expected "
                                 f"{t.dtype}{t.shape}")
        want = t.data().tobytes()
        if data != want:
            isz = DTYPES[t.dtype][1]
            first = next(i for i in range(len(want)) if want[i] != data[i]) // isz
            idx = np.unravel_index(first, t.shape) if t.shape else ()
            raise HarnessFailure(f"tensor {t.key!r} ({t.dtype}{t.shape}): element "
                                 f"{[int(i) for i in idx]} differs ({case.summary()})")
    if set(got.entries) != {e.name for e in case.entries}:
        raise HarnessFailure(f"entries {sorted(got.entries)} != {[e.name for e in case.entries]}")
    for e in case.entries:
        want_v: Any = e.value if e.scope == "global" else dict(enumerate(e.values))
        if got.entries[e.name] != want_v or json.dumps(got.entries[e.name], sort_keys=True) != \
                json.dumps(want_v, sort_keys=True):
            raise HarnessFailure(f"entry {e.name!r}: got {got.entries[e.name]!r}, expected "
                                 f"{want_v!r}")
        decl = got.manifest["entries"][e.name]
        if decl["scope"] != e.scope or decl["encoding"] != e.encoding or \
                decl["schema"] != e.schema or decl.get("world_size_policy") != e.policy:
            raise HarnessFailure(f"entry {e.name!r}: declaration {decl} does not match the job")


def run_save_case(cmd: list[str], case: SaveCase, workdir: Path, timeout: float = 60.0) -> None:
    """Save ``case`` through the adapter and verify it."""
    root = workdir / "root"
    aid = _save(cmd, case, root, workdir / "jobs", timeout)
    verify_saved(root, aid, case)
    rep = check(root, deep=False)
    if not rep.ok:
        raise HarnessFailure(f"root does not conform: {[e.to_json() for e in rep.errors[:3]]}")


def _invariants(root: Path, allowed: dict[str, SaveCase], expect_latest: str) -> None:
    """No partial attempt visible; every committed version conforms; latest is right."""
    for v in committed_versions(root):
        if v.name not in allowed:
            raise HarnessFailure(f"unexpected committed version {v.name}")
        verify_saved(root, v.name, allowed[v.name])
    latest = latest_committed(root)
    if latest is None or latest.name != expect_latest:
        raise HarnessFailure(f"latest committed version is {latest and latest.name}, expected "
                             f"{expect_latest}")


def run_crash_case(cmd: list[str], cc: CrashCase, workdir: Path, timeout: float = 60.0) -> None:
    """Commit A, break an attempt at B with the fault, then check the publish invariants."""
    root = workdir / "root"
    aid_a = _save(cmd, cc.first, root, workdir / "jobs-a", timeout)
    verify_saved(root, aid_a, cc.first)
    b, jobdir = cc.second, workdir / "jobs-b"
    aid_b = new_attempt_id(b.step)
    kind, _, point = cc.fault.partition(":")
    fail_w = {cc.victim: point} if kind == "write" else None
    kill = (cc.victim, cc.delay) if kind == "kill-writer" else None
    rcs = _run_writers(cmd, write_jobs(b, jobdir, root, aid_b, fail_w), timeout, kill)
    if kind == "write" and rcs[cc.victim] == 0:
        raise HarnessFailure(f"writer {cc.victim} exited 0 although asked to fail at {point}")
    for w, rc in enumerate(rcs):
        if rc != 0 and w != cc.victim:
            raise HarnessFailure(f"writer {w} failed (exit {rc}): "
                                 f"{_tail(jobdir / f'write-w{w}.log')}")
    cp = _start(cmd, commit_job(b, jobdir, root, aid_b, point if kind == "commit" else None))
    if kind == "kill-commit":
        time.sleep(cc.delay)
        if cp.popen.poll() is None:
            os.kill(cp.popen.pid, signal.SIGKILL)
    crc = _wait(cp, timeout)
    committed_b = (root / aid_b / "manifest.json").exists()
    if kind in ("write", "commit") and crc == 0:
        raise HarnessFailure(f"commit exited 0 after fault {cc.fault} (writers exit {rcs})")
    if committed_b and kind in ("write", "commit"):
        raise HarnessFailure(f"attempt {aid_b} became visible as committed after fault "
                             f"{cc.fault} (writers exit {rcs}, commit exit {crc})")
    # A writer SIGKILLed after its index was durable leaves a complete attempt; publishing it is
    # then correct, and _invariants checks that B is complete and equal to its state.
    if crc == 0 and not committed_b:
        raise HarnessFailure("commit exited 0 but published no manifest.json")
    allowed = {aid_a: cc.first}
    if committed_b:
        allowed[aid_b] = b
    _invariants(root, allowed, aid_b if committed_b else aid_a)


# ------------------------------------------------------------------------------------ driver
def check_writer(cmd: list[str], *, examples: int = 10, crash_examples: int = 4,
                 codecs: tuple[str, ...] = ("none", "zstd"), seed: int | None = None,
                 workdir: str | None = None, max_writers: int = 4, timeout: float = 60.0,
                 shrink: bool = True, tables: str = "sometimes") -> None:
    """Run the save and crash properties against ``cmd``; raise on the first failure.

    With ``shrink=False`` the first failing example is reported as generated (faster).
    ``tables`` says whether jobs ask for tensor tables (:data:`TABLE_MODES`).
    """
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="pck-writer-"))
    base.mkdir(parents=True, exist_ok=True)
    counter = [0]

    def fresh() -> Path:
        counter[0] += 1
        d = base / f"case-{counter[0]:04d}"
        d.mkdir()
        return d

    phases = list(Phase) if shrink else [p for p in Phase if p != Phase.shrink]
    common = settings(deadline=None, database=None, derandomize=False, print_blob=True,
                      suppress_health_check=list(HealthCheck), phases=phases)

    @settings(common, max_examples=max(1, examples))
    @given(case=save_cases(max_writers, codecs, tables=tables))
    def save_property(case: SaveCase) -> None:
        run_save_case(cmd, case, fresh(), timeout)

    @settings(common, max_examples=max(1, crash_examples))
    @given(cc=crash_cases(min(max_writers, 3), codecs, tables))
    def crash_property(cc: CrashCase) -> None:
        run_crash_case(cmd, cc, fresh(), timeout)

    for prop, n in ((save_property, examples), (crash_property, crash_examples)):
        if n <= 0:
            continue
        (hseed(seed)(prop) if seed is not None else prop)()


def run_writer_suite(cmd: list[str], *, examples: int = 10, crash_examples: int = 4,
                     codecs: list[str] | None = None, seed: int | None = None,
                     workdir: str | None = None, max_writers: int = 4, timeout: float = 60.0,
                     verbose: bool = False, shrink: bool = True,
                     tables: str = "sometimes") -> int:
    """CLI driver: returns 0 when the writer passes, 1 otherwise (with the failure printed)."""
    t0 = time.monotonic()
    try:
        check_writer(cmd, examples=examples, crash_examples=crash_examples,
                     codecs=tuple(codecs or ("none", "zstd")), seed=seed, workdir=workdir,
                     max_writers=max_writers, timeout=timeout, shrink=shrink, tables=tables)
    except Exception as exc:  # report any failure, including the shrunk example
        if verbose:
            traceback.print_exc()
        print(f"FAIL: {exc}", file=sys.stderr)
        return 1
    print(f"writer passed: {examples} save case(s), {crash_examples} atomic-publish case(s) in "
          f"{time.monotonic() - t0:.1f}s")
    return 0
