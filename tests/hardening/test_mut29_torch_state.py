"""Mutation audit 29, continuation state beyond tensors (:mod:`portable_ckpt.torch.state`).

The entries' own restore rules, called as a load calls them: what a stored value must look
like before a generator takes it (lengths, positions, strict base64), how a NumPy
SeedSequence is advanced, which members of a data position are its ``extra``, the default
policies, and the Python RNG's cached Gaussian.
"""

from __future__ import annotations

import random
import warnings
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import portable_ckpt.torch as pckt  # noqa: E402
from portable_ckpt.errors import EntrySchemaError, UsageError  # noqa: E402
from portable_ckpt.torch.state import GradScalerState, capture_rng, restore_rng  # noqa: E402


def _mt(seed: int = 1) -> np.random.Generator:
    return np.random.Generator(np.random.MT19937(seed))


def test_an_rng_entry_restored_from_no_value_is_not_restored() -> None:
    """``None`` keeps the current generators and says so (mutant St1 said restored)."""
    rng = pckt.RNGState()
    rng.restore(None)
    assert rng.restored is False


@pytest.mark.parametrize("change", ["short key", "pos 625"])
def test_an_mt19937_state_of_another_length_or_past_its_buffer_is_refused(change: str) -> None:
    """NumPy indexes its key buffer with ``pos`` (at most 624) and takes a key of any length:
    mutants St4 (no length check) and St6 (pos 625 taken) let such a state through."""
    g = pckt.GeneratorState(_mt())
    value = g.capture()
    if change == "short key":
        value["state"]["state"]["key"] = value["state"]["state"]["key"][:-1]
    else:
        value["state"]["state"]["pos"] = 625
    before = g.generator.bit_generator.state["state"]["pos"]
    with pytest.raises(EntrySchemaError):
        g.restore(value)
    assert g.generator.bit_generator.state["state"]["pos"] == before


def test_a_generator_seeded_alike_continues_the_saved_runs_children() -> None:
    """Same seed: no warning when it spawned as many children as the saved run (mutant St9),
    and it spawns only the missing ones when it spawned fewer (mutant St10 spawned all)."""
    saved = np.random.default_rng(5)
    saved.spawn(3)
    value = pckt.GeneratorState(saved).capture()
    same = np.random.default_rng(5)
    same.spawn(3)
    fewer = np.random.default_rng(5)
    fewer.spawn(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pckt.GeneratorState(same).restore(value)
        pckt.GeneratorState(fewer).restore(value)
    spawned = [g.bit_generator.seed_seq.n_children_spawned  # type: ignore[attr-defined]
               for g in (same, fewer)]
    assert spawned == [3, 3]


def test_a_torch_generator_state_in_loose_base64_is_refused() -> None:
    """Characters outside base64 are an error, not skipped (mutant St15 decoded past them)."""
    g = pckt.GeneratorState(torch.Generator().manual_seed(3))
    value = g.capture()
    value["state"] = value["state"][:8] + "!" + value["state"][8:]
    with pytest.raises(EntrySchemaError, match="generator state cannot be applied"):
        g.restore(value)
    assert g.restored is False


def test_a_data_positions_extra_holds_only_its_further_members() -> None:
    """Mutant St11 kept ``global_sample_index`` in ``extra`` too."""
    pos = pckt.DataPosition()
    pos.restore({"epoch": 2, "global_sample_index": 40, "seed": 7})
    assert (pos.epoch, pos.global_sample_index, pos.extra) == (2, 40, {"seed": 7})


def test_default_policies_and_a_bad_policy() -> None:
    """A data position's cursor is global: ``rank0`` by default (mutant St14: ``modulo``); a
    policy outside the vocabulary is refused (mutant St22 took it)."""
    assert pckt.DataPosition().world_size_policy == "rank0"
    assert pckt.RNGState().world_size_policy == "modulo"
    with pytest.raises(UsageError, match="world_size_policy must be one of"):
        pckt.DataPosition(world_size_policy="bogus")


def test_the_python_rngs_cached_gaussian_is_restored() -> None:
    """``random.gauss`` draws in pairs and caches the second (mutant St19 stored none)."""
    random.seed(11)
    random.gauss(0.0, 1.0)  # leaves the pair's second value cached
    value = capture_rng(cuda=False)
    expected = random.gauss(0.0, 1.0)
    random.seed(99)
    restore_rng(value)
    assert random.gauss(0.0, 1.0) == expected


class _Windowed(torch.optim.lr_scheduler.StepLR):
    """A scheduler with a tuple member in its state."""

    def __init__(self, opt: torch.optim.Optimizer) -> None:
        self.window: tuple[int, int] = (0, 0)
        super().__init__(opt, step_size=2)


def test_a_schedulers_tuple_members_come_back_as_tuples() -> None:
    """JSON stores a tuple as a list: restored as the scheduler's own type (mutant St12)."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
    sched = _Windowed(opt)
    sched.window = (3, 4)
    value = pckt.LRSchedulerState(sched).capture()
    fresh = _Windowed(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1))
    pckt.LRSchedulerState(fresh).restore(value)
    assert fresh.window == (3, 4) and type(fresh.window) is tuple


def test_a_disabled_grad_scaler_is_stored_as_an_empty_state() -> None:
    """Its ``state_dict()`` is ``{}`` (mutant St21 read members it does not have)."""
    value: Any = GradScalerState(torch.amp.GradScaler("cpu", enabled=False)).capture()
    assert value == {}
