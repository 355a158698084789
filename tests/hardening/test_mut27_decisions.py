"""Mutation audit 27, a manager's save decisions (``manager/decisions.py``, docs/torch.md):
the boundaries the randomised tests reach only by chance.

A wall-clock interval saves once S seconds have passed (not only after); the next step a rule
saves is after the step asked about, also when that step is itself a listed step (the manager
skips the ranks' agreements up to it: one that answered the step itself asked every rank again
at once, and one after the next listed step skipped its save).
"""

from __future__ import annotations

import pytest

from portable_ckpt.manager import SavePolicy, decide
from portable_ckpt.manager.decisions import next_rule_step


def test_a_wall_clock_interval_saves_once_exactly_s_seconds_have_passed() -> None:
    """SavePolicy: "Durable save once S seconds passed since the last save started". Mutant
    D05 (``>=`` made ``>``): a step exactly S seconds after the last save was not saved."""
    policy = SavePolicy.build(save_every_seconds=30.0)
    at = decide(policy, 7, now=130.0, last_save_time=100.0, last_save_step=6, has_fast=False)
    assert (at.tier, at.reason) == ("durable", "save_every_seconds")
    before = decide(policy, 7, now=129.5, last_save_time=100.0, last_save_step=6,
                    has_fast=False)
    assert before.tier == "none"


@pytest.mark.parametrize("has_fast", [False, True])
def test_the_next_rule_step_after_a_listed_step_is_the_following_one(has_fast: bool) -> None:
    """next_rule_step: "the first step *after* step that a step rule saves". Asked at a step
    that ``save_steps`` lists, it answers the next listed step (or the next interval), never
    the step itself. Mutant D09 (``bisect_left``): it answered the step itself; the hypothesis
    test only meets a listed step by chance (it survived a run)."""
    policy = SavePolicy.build(save_steps=[5, 9, 40], save_every=25, fast_every=7)
    assert next_rule_step(policy, 5, has_fast=has_fast) == (7 if has_fast else 9)
    assert next_rule_step(policy, 9, has_fast=has_fast) == (14 if has_fast else 25)
    assert next_rule_step(policy, 40, has_fast=has_fast) == (42 if has_fast else 50)
    only_listed = SavePolicy.build(save_steps=[5])
    assert next_rule_step(only_listed, 5, has_fast=has_fast) is None
    assert next_rule_step(only_listed, 4, has_fast=has_fast) == 5
