"""Model-based test of the publish protocol against the reference implementation.

A hypothesis RuleBasedStateMachine interleaves successful saves, crashed saves (real adapter
processes asked to die at each phase, processes killed with SIGKILL at random moments, and
simulated crashes that leave partial files), concurrent attempts, commit conflicts, gc and
reads. Invariant after every step: the latest version is complete, verifiable, and equal to
the greatest successful save in the spec's order, and no crashed attempt is ever committed.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from conformance.checker import check
from conformance.harness import (
    EntrySpec,
    SaveCase,
    TensorSpec,
    commit_job,
    new_attempt_id,
    write_jobs,
)
from conformance.procs import Adapter, KillPlan, progress_mode
from conformance.reader import latest_committed
from conformance.spec import DTYPES as SPEC_DTYPES
from conformance.trace import tracing_status

from .conftest import REFERENCE_ADAPTER

portable_ckpt = pytest.importorskip("portable_ckpt")
ADAPTER = Adapter(REFERENCE_ADAPTER, timeout=120, trace=tracing_status().available)
from portable_ckpt.errors import CheckpointError, CommitConflictError  # noqa: E402
from portable_ckpt.format.dtypes import numpy_dtype  # noqa: E402
from portable_ckpt.io.commit import commit  # noqa: E402
from portable_ckpt.io.writer import ShardWriter  # noqa: E402
from portable_ckpt.storage import open_storage  # noqa: E402

DTYPES = list(SPEC_DTYPES)  # every row of the suite's table (contributor review D7)


def make_case(step: int, seed: int, writers: int) -> SaveCase:
    rng = np.random.default_rng(seed)
    rows = int(rng.integers(writers, 9))
    dtype = DTYPES[seed % len(DTYPES)]
    cuts = sorted({0, rows, *(int(c) for c in rng.integers(1, rows, size=writers - 1))})
    boxes = [([a, 0], [b - a, 3], i % writers) for i, (a, b) in enumerate(itertools.pairwise(cuts))]
    t = TensorSpec("model.w", dtype, [rows, 3], seed, boxes)
    s = TensorSpec("scalar", "float64", [], seed + 1, [([], [], 0)])
    progress = EntrySpec("progress", {"id": "pck:step/1"}, "global", "json",
                         value={"step": step}, writer=writers - 1)
    return SaveCase(step, writers, "none", [t, s], [progress])


def save_in_process(root: Path, case: SaveCase, *, commit_now: bool = True) -> str:
    storage = open_storage(str(root), create=True)
    aid = new_attempt_id(case.step)
    indexes = []
    for w in range(case.num_writers):
        sw = ShardWriter(storage, aid, writer=w, block_size=4096)
        for t in case.tensors:
            full = t.data()
            dt = numpy_dtype(t.dtype)
            for offs, lens, owner in t.boxes:
                if owner != w:
                    continue
                sl = tuple(slice(o, o + n) for o, n in zip(offs, lens, strict=True))
                arr = np.ascontiguousarray(full[sl]).view(dt).reshape(lens)
                sw.add_tensor(t.key, arr, offsets=offs, global_shape=t.shape)
        for e in case.entries:
            if e.writer == w:
                sw.add_entry(e.name, e.value, schema=e.schema, scope=e.scope)
        indexes.append(sw.finish())
    if commit_now:
        do_commit(storage, aid, case)
    return aid


def do_commit(storage: Any, aid: str, case: SaveCase) -> None:
    from portable_ckpt.format.manifest import Continuation

    commit(storage, aid, step=case.step, indexes=None,
           expected_writers=list(range(case.num_writers)),
           continuation=Continuation(contract="exact", world_size=case.num_writers, mesh=None))


class PublishMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None  # fsync is free on tmpfs
        self.dir = Path(tempfile.mkdtemp(prefix="pck-sm-", dir=shm))
        self.root = self.dir / "root"
        self.root.mkdir()
        self.step = 0
        self.seed = 0
        self.saved: dict[str, SaveCase] = {}   # committed attempt id -> case
        self.order: list[str] = []             # commit order of saved
        self.crashed: set[str] = set()         # attempt ids that must never be committed
        self.pending: dict[str, SaveCase] = {}  # written, not yet committed (concurrent)

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def _next(self, same_step: bool = False) -> SaveCase:
        if not same_step or self.step == 0:
            self.step += 1
        self.seed += 1
        return make_case(self.step, self.seed, 1 + self.seed % 3)

    # -- rules -----------------------------------------------------------------------------
    @rule(same_step=st.booleans())
    def save(self, same_step: bool) -> None:
        case = self._next(same_step)
        aid = save_in_process(self.root, case)
        self.saved[aid] = case
        self.order.append(aid)

    @rule(how=st.sampled_from([
        "simulated:partial-data", "simulated:index-only", "simulated:temp-manifest",
        "simulated:empty-dir", "fail_at:before_data", "fail_at:mid_data", "fail_at:after_data",
        "fail_at:before_publish", "fail_at:temp_written", "sigkill:writer", "sigkill:commit"]),
        progress=st.integers(1, 40))
    def crash(self, how: str, progress: int) -> None:
        kind, _, point = how.partition(":")
        if kind == "simulated":
            self.simulated_crash(point)
        elif kind == "fail_at":
            self.crash_adapter(point)
        else:
            self.sigkill(progress, point == "commit")

    def crash_adapter(self, phase: str) -> None:
        """A real adapter process asked to die at ``phase`` (os._exit, no cleanup)."""
        case = self._next()
        aid = new_attempt_id(case.step)
        jobdir = self.dir / f"jobs-{aid}"
        commit_phase = phase in ("before_publish", "temp_written")
        jobs = write_jobs(case, jobdir, self.root, aid,
                          None if commit_phase else {0: phase})
        rcs = [o.rc for o in ADAPTER.run_all(jobs)]
        assert (rcs[0] != 0) == (not commit_phase), rcs
        c = ADAPTER.run(commit_job(case, jobdir, self.root, aid, phase if commit_phase else None))
        assert c.rc != 0
        self.crashed.add(aid)

    def sigkill(self, progress: int, target_commit: bool) -> None:
        """SIGKILL a writer or the committer after ``progress`` units of its own progress
        (file-system calls below the root under tracing, else 512-byte units written)."""
        case = self._next()
        aid = new_attempt_id(case.step)
        jobdir = self.dir / f"jobs-{aid}"
        jobs = write_jobs(case, jobdir, self.root.resolve(), aid)
        mode = progress_mode(ADAPTER.trace)
        plan = KillPlan(0, progress if mode == "trace" else 512 * progress, mode,
                        str(self.root.resolve()))
        ADAPTER.run_all(jobs, None if target_commit else plan)
        crc = ADAPTER.run(commit_job(case, jobdir, self.root.resolve(), aid),
                          plan if target_commit else None).rc
        committed = (self.root / aid / "manifest.json").exists()
        if committed:
            # A writer killed after its index was durable (e.g. during interpreter exit) leaves
            # a complete attempt: publishing it is correct. The invariants then check that the
            # version is complete and equal to the case.
            self.saved[aid] = case
            self.order.append(aid)
        else:
            assert crc != 0, "commit exited 0 without publishing"
            self.crashed.add(aid)

    def simulated_crash(self, kind: str) -> None:
        """Leave what a crash at some phase leaves, by writing the partial files directly."""
        case = self._next()
        aid = save_in_process(self.root, case, commit_now=False)
        adir = self.root / aid
        if kind == "partial-data":
            f = next((adir / "data").iterdir())
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
            shutil.rmtree(adir / "index")
        elif kind == "temp-manifest":
            (adir / "manifest.json.0123456789abcdef.tmp").write_text('{"format": "portable-ckpt"')
        elif kind == "empty-dir":
            shutil.rmtree(adir)
            adir.mkdir()
        self.crashed.add(aid)

    @rule(data=st.data())
    def concurrent_attempts(self, data: Any) -> None:
        """Two attempts written side by side, committed in either order."""
        a = self._next()
        b = self._next()
        aid_a = save_in_process(self.root, a, commit_now=False)
        aid_b = save_in_process(self.root, b, commit_now=False)
        storage = open_storage(str(self.root))
        first = data.draw(st.booleans())
        for aid, case in ((aid_a, a), (aid_b, b)) if first else ((aid_b, b), (aid_a, a)):
            do_commit(storage, aid, case)
            self.saved[aid] = case
            self.order.append(aid)

    @precondition(lambda self: bool(self.saved))
    @rule()
    def commit_conflict(self) -> None:
        """Committing an already committed attempt fails and changes nothing."""
        aid = self.order[-1]
        before = (self.root / aid / "manifest.json").read_bytes()
        with pytest.raises(CommitConflictError):
            do_commit(open_storage(str(self.root)), aid, self.saved[aid])
        assert (self.root / aid / "manifest.json").read_bytes() == before

    @precondition(lambda self: len(self.saved) > 1)
    @rule(keep=st.integers(1, 3))
    def gc(self, keep: int) -> None:
        report = portable_ckpt.gc(str(self.root), keep=keep, grace_seconds=0.0)
        want = self._expected_order()[-keep:]
        for aid in want:
            assert aid not in report.deleted, f"gc deleted {aid}, one of the {keep} newest"
        for aid in report.deleted:
            assert aid in self.saved
            del self.saved[aid]
            self.order.remove(aid)
            assert not (self.root / aid).exists()
        for aid in report.abandoned:
            assert aid not in self.saved

    @rule()
    def read_latest(self) -> None:
        if not self.saved:
            with pytest.raises(CheckpointError) as ei:
                portable_ckpt.open(str(self.root))
            assert ei.value.code == "PCK-NOT-FOUND"
            return
        ck = portable_ckpt.open(str(self.root))
        want = self._expected_order()[-1]
        assert ck.id == want
        case = self.saved[want]
        for t in case.tensors:
            got = np.ascontiguousarray(ck.read(t.key)).tobytes()
            assert got == t.data().tobytes(), f"{t.key} differs in {want}"
        assert ck.entry("progress") == {"step": case.step}
        assert ck.verify(deep=True) == []

    # -- invariants ------------------------------------------------------------------------
    def _expected_order(self) -> list[str]:
        """Successful saves in the spec's order: (step, commit order)."""
        return sorted(self.saved, key=lambda a: (self.saved[a].step, self.order.index(a)))

    @invariant()
    def no_crashed_attempt_committed(self) -> None:
        versions = portable_ckpt.list_versions(str(self.root))
        committed = {v.id for v in versions if v.status == "committed"}
        assert not committed & self.crashed, f"crashed attempts committed: {committed & self.crashed}"
        assert committed == set(self.saved)

    @invariant()
    def latest_is_last_successful(self) -> None:
        latest = latest_committed(self.root)
        if not self.saved:
            assert latest is None
            return
        assert latest is not None and latest.name == self._expected_order()[-1]
        rep = check(latest, deep=True)
        assert rep.ok, [e.to_json() for e in rep.errors]


PublishMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("PCK_SM_EXAMPLES", "6")),
    stateful_step_count=int(os.environ.get("PCK_SM_STEPS", "10")),
    deadline=None, database=None, suppress_health_check=list(HealthCheck),
)
TestPublishMachine = PublishMachine.TestCase
