"""``GeneratorState``: a job's own torch and NumPy generators, per rank (continuation review F3).

A generator the job made itself could not be stored (never pickle), and wrapped as a plain
value it became rank 0's for every rank; the version still said ``exact``. An ``exact`` save
without any RNG state now says so once.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

import torch

import portable_ckpt.torch as pckt
from portable_ckpt.errors import EntrySchemaError, EntryTargetError, UsageError
from portable_ckpt.torch import saving

pytestmark = pytest.mark.torch

_BIT_GENERATORS = ["PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64"]


@pytest.mark.parametrize("bits", _BIT_GENERATORS)
def test_torch_and_numpy_generators_continue_where_they_were_saved(
    tmp_path: Path, bits: str
) -> None:
    g = torch.Generator().manual_seed(11)
    n = np.random.Generator(getattr(np.random, bits)(12))
    torch.rand(5, generator=g), n.random(7)  # somewhere in their streams
    state = {"w": torch.ones(2), "g": pckt.GeneratorState(g), "n": pckt.GeneratorState(n),
             "rng": pckt.RNGState()}
    pckt.save(state, str(tmp_path / "r"), step=3)
    want_t, want_n = torch.rand(9, generator=g), n.random(9)
    g2 = torch.Generator().manual_seed(99)
    n2 = np.random.Generator(getattr(np.random, bits)(98))
    target = {"w": torch.zeros(2), "g": pckt.GeneratorState(g2), "n": pckt.GeneratorState(n2),
              "rng": pckt.RNGState()}
    info = pckt.load(target, str(tmp_path / "r"))
    assert info.contract == "exact" and target["g"].restored and target["n"].restored
    assert torch.equal(torch.rand(9, generator=g2), want_t)
    assert np.array_equal(n2.random(9), want_n)


def test_a_generator_of_another_kind_or_no_generator_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"torch\.Generator or a numpy\.random\.Generator"):
        pckt.GeneratorState(np.random.RandomState(1))
    pckt.save({"g": pckt.GeneratorState(torch.Generator())}, str(tmp_path / "r"), step=1)
    target = {"g": pckt.GeneratorState(np.random.default_rng(1))}
    with pytest.raises(EntryTargetError, match="torch generator's, this is numpy"):
        pckt.load(target, str(tmp_path / "r"))


def test_an_exact_save_without_rng_state_says_so_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(saving, "_WARNED_NO_RNG", [])
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        pckt.save({"w": torch.ones(2)}, str(tmp_path / "a"), step=1)
        pckt.save({"w": torch.ones(2)}, str(tmp_path / "a"), step=2)
    assert err.getvalue().count("holds no RNGState()") == 1, err.getvalue()
    monkeypatch.setattr(saving, "_WARNED_NO_RNG", [])
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        pckt.save({"w": torch.ones(2), "rng": pckt.RNGState()}, str(tmp_path / "b"), step=1)
        pckt.save({"w": torch.ones(2)}, str(tmp_path / "c"), step=1, continuation="statistical")
    assert "RNGState" not in err.getvalue()


@pytest.mark.parametrize("bad", [
    {"kind": "numpy", "state": {"bit_generator": "PCG64", "state": {"state": 10**100, "inc": 1},
                                "has_uint32": 0, "uinteger": 0}},
    {"kind": "numpy", "state": {"bit_generator": "MT19937", "state": {"key": [1], "pos": 1}}},
    {"kind": "numpy", "state": "x"}, {"kind": "numpy"}, 5, [],
])
def test_a_hostile_stored_state_is_an_entry_schema_error(bad: object) -> None:
    """A stored value is input: it fails as PCK-ENTRY-SCHEMA, never as a raw exception."""
    from portable_ckpt.errors import EntrySchemaError

    for entry in (pckt.GeneratorState(np.random.default_rng(1)),
                  pckt.GeneratorState(torch.Generator())):
        with pytest.raises(EntrySchemaError):
            entry.restore(bad)
    with pytest.raises(EntrySchemaError):
        pckt.GeneratorState(torch.Generator()).restore({"kind": "torch", "state": "AAAA"})


def _np_state(bits: str, **change: object) -> dict[str, object]:
    from portable_ckpt.torch.state import _np_plain

    state = _np_plain(getattr(np.random, bits)(3).state)
    for path, v in change.items():
        node = state
        *parents, leaf = path.split("__")
        for p in parents:
            node = node[p]
        node[leaf] = v
    return {"kind": "numpy", "state": state}


@pytest.mark.parametrize(("bits", "change"), [
    ("MT19937", {"state__pos": 100_000_000}),  # a segfault at the first draw
    ("MT19937", {"state__pos": -3}),  # draws from memory before the key
    ("MT19937", {"state__key": [1.5] * 624}),  # floats, truncated silently
    ("MT19937", {"state__key": [True] * 624}),
    ("MT19937", {"state__key": [2**32] * 624}),
    ("Philox", {"buffer_pos": -2}),  # draws of unrelated heap memory
    ("Philox", {"buffer_pos": 100_000_000}),
    ("Philox", {"state__counter": [0, 0, 0]}),
    ("PCG64", {"has_uint32": 2}),
    ("PCG64", {"uinteger": 2**32}),
    ("PCG64", {"extra": 1}),
    ("SFC64", {"bit_generator": "PCG64"}),
])
def test_a_numpy_state_out_of_its_generators_ranges_is_refused(
    bits: str, change: dict[str, object]
) -> None:
    """Attack review 2 F1: NumPy does not range-check positions, and indexes its buffers with
    them; a stored state is checked against the generator's own layout first. F2: a refused
    state leaves ``restored`` False and the generator as it was."""
    from portable_ckpt.errors import EntrySchemaError

    gen = np.random.Generator(getattr(np.random, bits)(5))
    before = gen.bit_generator.state
    entry = pckt.GeneratorState(gen)
    with pytest.raises(EntrySchemaError, match="generator state cannot be applied"):
        entry.restore(_np_state(bits, **change))
    assert not entry.restored
    assert str(gen.bit_generator.state) == str(before)
    entry.restore(_np_state(bits))  # the same state unchanged is applied
    assert entry.restored


@pytest.mark.parametrize("state", [None, 5, ["AAAA"]])
def test_a_torch_state_that_is_no_string_is_an_entry_schema_error(state: object) -> None:
    """Attack review 2 F2: it escaped as AttributeError, reported as PCK-DISTRIBUTED."""
    from portable_ckpt.errors import EntrySchemaError

    entry = pckt.GeneratorState(torch.Generator())
    with pytest.raises(EntrySchemaError):
        entry.restore({"kind": "torch", "state": state})
    assert not entry.restored


def test_spawn_after_a_resume_continues_the_saved_runs_children(tmp_path: Path) -> None:
    """Attack review 2 F8: the SeedSequence stayed the fresh generator's, so the first child
    spawned after a resume was the saved run's first child again (the same stream twice).
    A stored child count past the bound is refused before anything is spawned, in bounded time
    (test audit 21b, S04)."""
    g = np.random.default_rng(1234)
    g.spawn(2)
    g.random(3)
    pckt.save({"n": pckt.GeneratorState(g)}, str(tmp_path / "r"), step=1)
    want_child = g.spawn(1)[0].random(4)

    g2 = np.random.default_rng(1234)  # the job rebuilds its generator from its seed
    pckt.load({"n": pckt.GeneratorState(g2)}, str(tmp_path / "r"))
    assert np.array_equal(g2.spawn(1)[0].random(4), want_child)

    other = np.random.default_rng(99)  # another seed: draws continue, children cannot
    with pytest.warns(UserWarning, match="spawn\\(\\) will not: it was seeded otherwise"):
        pckt.load({"n": pckt.GeneratorState(other)}, str(tmp_path / "r"))
    donor = np.random.default_rng(1234)
    donor.random(5)
    value = pckt.GeneratorState(donor).capture()
    # The bound (2**16 children) is checked before anything is spawned: one past it is refused,
    # the bound itself is spawned. Checked first, so that without the bound this test fails in
    # a second instead of spawning 10**9 children below for minutes (test audit 21b, S04: a
    # hang, a failure only where CI has a per-test timeout).
    value["seed_seq"]["n_children_spawned"] = 2**16 + 1
    with pytest.raises(EntrySchemaError, match="n_children_spawned"):
        pckt.GeneratorState(np.random.default_rng(1234)).restore(value)
    value["seed_seq"]["n_children_spawned"] = 2**16
    at_bound = np.random.default_rng(1234)
    pckt.GeneratorState(at_bound).restore(value)
    assert at_bound.bit_generator.seed_seq.n_children_spawned == 2**16
    value["seed_seq"]["n_children_spawned"] = 10**9
    live = np.random.default_rng(1234)
    before = live.bit_generator.state
    gs = pckt.GeneratorState(live)
    with pytest.raises(EntrySchemaError, match="n_children_spawned") as err:
        gs.restore(value)
    assert not isinstance(err.value, EntryTargetError)  # a bad value, not another kind's state
    # Refused before anything changed (attack review 3 F5): not the donor's state half-applied.
    assert live.bit_generator.state == before and gs.restored is False
