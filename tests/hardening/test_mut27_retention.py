"""Mutation audit 27, a manager's retention plan (spec §15.2, docs/torch.md "What it keeps"):
what ``plan_retention`` keeps where the earlier tests did not look.

Each test names the mutant of ``manager/retention.py`` it kills: a metric that cannot be
ranked (not finite, a bool) is kept, never ranked; a policy of 0 is refused; the newest drilled
version is kept even when it failed verification (R-GC-2); a rollback's new branch keeps its own
``keep_last`` newest by commit time, never a failed one, whatever the first run left below it.
"""

from __future__ import annotations

import math

import pytest

from portable_ckpt.errors import UsageError
from portable_ckpt.manager import Candidate, RetentionPolicy, plan_retention
from portable_ckpt.manager.retention import KeepBest


def _at(second: int) -> str:
    return f"2026-01-01T00:00:{second:02d}.000000Z"


def _deleted(decisions: list) -> list[int]:  # type: ignore[type-arg]
    return [d.step for d in decisions if d.delete]


def _by_step(decisions: list) -> dict:  # type: ignore[type-arg]
    return {d.step: d for d in decisions}


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, True, False])
@pytest.mark.parametrize("mode", ["min", "max"])
def test_a_metric_that_cannot_be_ranked_is_kept_whatever_keep_best_says(
    value: float, mode: str
) -> None:
    """docs/torch.md: a version saved without a finite value of the metric cannot be ranked and
    is never deleted. A bool is no value of a metric (JSON ``true`` is not 1.0), and neither is
    an infinity or NaN. Mutants R02 (``score`` ranked every float: -inf became the best loss
    and pushed the real best out, +inf the worst and was deleted, NaN made the sort
    arbitrary) and R03 (a bool ranked as 0.0/1.0)."""
    losses = {1: 2.0, 2: value, 3: 1.0, 4: 3.0, 5: 5.0, 6: 4.0}
    cands = [Candidate(f"v{s}", s, metrics={"loss": v}) for s, v in losses.items()]
    ds = _by_step(plan_retention(cands, RetentionPolicy.build(keep_best=("loss", 1, mode))))
    assert not ds[2].delete, ds[2]
    assert ds[2].reasons == ["no 'loss' metric stored (unclassified for keep_best)"], ds[2]
    best = 3 if mode == "min" else 5
    assert f"keep_best=1 by {mode} loss" in ds[best].reasons, ds[best]
    # 6 is the newest committed; every other ranked version is outside keep_best
    assert _deleted(list(ds.values())) == sorted({1, 3, 4, 5} - {best})
    assert KeepBest("loss", 1).score({"loss": value}) is None


@pytest.mark.parametrize("kw", [{"keep_last": 0}, {"keep_every": 0}, {"keep_last": -1},
                                {"keep_every": True}, {"keep_last": 1.5}])
def test_a_policy_that_keeps_nothing_is_refused(kw: dict[str, object]) -> None:
    """A keep_last of 0 is no policy to run: it passed as "active" and kept nothing by
    keep_last, so every version but the newest went at the first pass. Mutant R04 (the bound
    ``v < 1`` weakened to ``v < 0``): ``keep_last=0`` was accepted."""
    with pytest.raises(UsageError):
        RetentionPolicy.build(**kw)  # type: ignore[arg-type]


def test_the_newest_drilled_version_is_kept_when_it_failed_verification() -> None:
    """R-GC-2: gc MUST NOT delete the newest drilled version until a newer version is drilled;
    R-GC-9's keeping of versions that did not fail comes on top ("R-GC-1 and R-GC-2 still keep
    a failed version where they keep it"); the core gc's newest drilled is that one too.
    Mutant R13 (newest drilled chosen among the versions that did not fail): the failed
    newest drilled version was deleted and an older drilled one kept in its place."""
    cands = [
        Candidate("v1", 1, drilled=True),
        Candidate("v2", 2, drilled=True, verification_failed=True),
        Candidate("v3", 3),
        Candidate("v4", 4),
    ]
    ds = _by_step(plan_retention(cands, RetentionPolicy.build(keep_last=1)))
    assert not ds[2].delete and "newest drilled" in ds[2].reasons, ds[2]
    assert _deleted(list(ds.values())) == [1, 3]


def _rolled_back(failed: int | None = None) -> list[Candidate]:
    """A first run's steps 10, 20, 30, then a rollback's branch 5, 6, 7 committed after."""
    times = {10: 1, 20: 2, 30: 3, 5: 4, 6: 5, 7: 6}
    return [Candidate(f"v{s:02d}", s, committed_at=_at(t), verification_failed=s == failed)
            for s, t in times.items()]


def test_a_rollbacks_branch_keeps_its_newest_n_by_commit_time() -> None:
    """docs/torch.md "One job per root" (docs review F12): the branch committed after the
    greatest version, at lower steps, keeps its own keep_last newest, counted by commit time.
    Mutants R19 (the branch's oldest N kept: its newest save deleted) and R21 (the branch
    not kept at all)."""
    ds = _by_step(plan_retention(_rolled_back(), RetentionPolicy.build(keep_last=2)))
    assert _deleted(list(ds.values())) == [5, 10]
    for s in (6, 7):
        assert "keep_last=2 (a rollback's new branch)" in ds[s].reasons, ds[s]


def test_a_rollbacks_branch_counts_no_failed_version() -> None:
    """R-GC-9 inside the branch: a branch version that failed verification takes no place of
    the keep_last the branch keeps, and is deleted. Mutant R18 (the branch drawn from every
    committed version): the failed step 7 took a place and step 5 was deleted for it."""
    ds = _by_step(plan_retention(_rolled_back(failed=7), RetentionPolicy.build(keep_last=2)))
    assert ds[7].delete and ds[7].reasons == ["failed sampled verification"], ds[7]
    assert not ds[5].delete and not ds[6].delete
    assert _deleted(list(ds.values())) == [7, 10]


def test_a_branch_below_every_step_of_the_first_run_is_kept_whole() -> None:
    """The branch is what was committed after the *greatest* version (step 20 here), not after
    the lowest step: a rollback whose steps are all below the first run's keeps its
    keep_last newest. Mutant R20 (the branch measured from the lowest step's commit, which is
    the branch's own first save): step 5 was deleted."""
    cands = [Candidate(f"v{s:02d}", s, committed_at=_at(t))
             for s, t in {10: 1, 20: 2, 5: 3, 6: 4}.items()]
    ds = _by_step(plan_retention(cands, RetentionPolicy.build(keep_last=2)))
    assert _deleted(list(ds.values())) == []
    assert "keep_last=2 (a rollback's new branch)" in ds[5].reasons, ds[5]


def test_a_version_whose_records_could_not_be_read_takes_no_keep_last_place() -> None:
    """R-GC-6 / R-GC-12: an attempt that could not be classified is kept and takes no place
    of the N newest: leaving it out only raises the rank of the others. Mutant R06 (the
    unclassified version counted among the good ones): it took one of keep_last=2's places
    and step 3, which the policy keeps with full knowledge, was deleted."""
    cands = [Candidate(f"v{s}", s, classified=s != 4) for s in (1, 2, 3, 4, 5)]
    ds = _by_step(plan_retention(cands, RetentionPolicy.build(keep_last=2)))
    assert "keep_last=2" in ds[3].reasons, ds[3]
    assert ds[4].reasons == ["unclassified (its records could not be read)"], ds[4]
    assert _deleted(list(ds.values())) == [1, 2]
