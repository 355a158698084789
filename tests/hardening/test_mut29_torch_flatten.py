"""Mutation audit 29, taking a state apart (:mod:`portable_ckpt.torch.flatten`).

What the earlier tests left unchecked: the exact nesting bound (``MAX_DEPTH``) for dicts and
for lists DCP keeps as one item, the refusal of ``bool`` dict keys, and which flattening marks
a module's parameters (a save's, whose replica check refuses parameters that differ between
ranks; never a load's).
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import portable_ckpt.torch as pckt  # noqa: E402
from portable_ckpt.errors import UnsupportedValueError  # noqa: E402
from portable_ckpt.torch.flatten import MAX_DEPTH, flatten_state  # noqa: E402


def _nested(kind: str, levels: int) -> Any:
    node: Any = 1
    for _ in range(levels):
        node = {"a": node} if kind == "dict" else [node]
    return node


@pytest.mark.parametrize("kind", ["dict", "list"])
def test_nesting_up_to_max_depth_saves_and_one_more_level_is_refused(
    tmp_path: Path, kind: str
) -> None:
    """``x`` sits at depth 1: ``MAX_DEPTH - 1`` containers below it reach depth MAX_DEPTH - 1.

    Mutants F5 (the walk's ``>=`` made ``>``) and F7 (a list's one-item test ``<`` made
    ``<=``): one level past the bound was taken, as a dict walked or a list kept whole.
    """
    deepest = {"x": _nested(kind, MAX_DEPTH - 1)}
    pckt.save(deepest, tmp_path, step=1, continuation="statistical")
    target = {"x": _nested(kind, MAX_DEPTH - 1)}
    pckt.load(target, tmp_path)
    assert target == deepest
    with pytest.raises(UnsupportedValueError, match=f"nested more than {MAX_DEPTH} levels"):
        flatten_state({"x": _nested(kind, MAX_DEPTH)})


@pytest.mark.parametrize("key", [True, False])
def test_a_bool_dict_key_is_refused_not_written_as_a_word(key: bool) -> None:
    """``True`` is an ``int`` to ``isinstance``: it would be stored as ``"True"`` (mutant F1)."""
    with pytest.raises(UnsupportedValueError, match=f"dict key {key!r} of type bool") as ei:
        flatten_state({"m": {key: torch.ones(1)}})
    assert ei.value.code == "PCK-UNSUPPORTED-VALUE"


def test_a_saves_flattening_marks_module_parameters_and_a_loads_does_not() -> None:
    """The marks feed the save's check that parameters agree between ranks (mutant F11)."""
    model = torch.nn.Linear(2, 2)
    model.register_buffer("counter", torch.zeros(1))
    state = {"model": model, "plain": torch.ones(2)}
    assert flatten_state(state).params == {"model/weight", "model/bias"}
    assert flatten_state(state, for_load=True).params == set()


def _round_trip(tmp_path: Path, saved: dict[str, Any], target: dict[str, Any]) -> dict[str, Any]:
    """Save ``saved`` and load it into ``target`` (both get a tensor: a load needs one)."""
    pckt.save({**saved, "w": torch.ones(1)}, tmp_path, step=1, continuation="statistical")
    target["w"] = torch.zeros(1)
    pckt.load(target, tmp_path)
    return target


def test_an_empty_dict_inside_a_list_item_is_saved_with_the_item(tmp_path: Path) -> None:
    """DCP keeps ``[(1, {})]`` as one item, its ``{}`` included (mutant F14 dropped it)."""
    target: dict[str, Any] = {"h": []}
    _round_trip(tmp_path, {"h": [(1, {})]}, target)
    assert target["h"] == [[1, {}]]


def test_a_stored_bool_stays_a_bool_in_a_float_target(tmp_path: Path) -> None:
    """Only an int becomes the float target's type; ``True`` is no ``1.0`` (mutant F24)."""
    target: dict[str, Any] = {"x": 0.5, "n": 0.5}
    _round_trip(tmp_path, {"x": True, "n": 3}, target)
    assert target["x"] is True
    assert target["n"] == 3.0 and type(target["n"]) is float


def test_an_empty_dict_loaded_whole_is_filled_in_place(tmp_path: Path) -> None:
    """A holder of the target's dict (a Stateful's own attribute) sees the loaded members.

    Mutant F29 put a new dict in the parent: the object the caller holds stayed empty.
    """
    held: dict[str, Any] = {}
    target: dict[str, Any] = {"ema": held}
    _round_trip(tmp_path, {"ema": {"a": 1, "b": "x"}}, target)
    assert target["ema"] is held and held == {"a": 1, "b": "x"}


class _DictWithStateDict(dict):  # type: ignore[type-arg]
    def state_dict(self) -> dict[str, Any]:
        return {"other": 1}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        raise AssertionError("a mapping is walked, not loaded as a Stateful")


def test_a_mapping_with_state_dict_methods_is_walked_as_a_mapping() -> None:
    """Its items are the state, not its ``state_dict()`` (mutant F10)."""
    assert flatten_state({"d": _DictWithStateDict(a=1)}).values == {"d/a": 1}


def test_a_fresh_optimizer_target_gets_state_for_every_parameter(tmp_path: Path) -> None:
    """A load target's empty optimizer is initialised first (as DCP's ``get_state_dict``).

    Its template then holds every parameter's state: the one the version has none of keeps its
    fresh value and is listed in ``LoadInfo.fresh_optimizer_state``. Mutant F4 (initialise only
    an optimizer that has state) grew the stored state alone and listed nothing.
    """
    def model() -> torch.nn.Sequential:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))

    a = model()
    opt_a = torch.optim.AdamW(a.parameters(), lr=0.01)
    a[0](torch.ones(2, 3)).sum().backward()  # the second layer gets no gradient
    opt_a.step()
    pckt.save({"model": a, "optim": opt_a}, tmp_path, step=1, continuation="statistical")
    b = model()
    opt_b = torch.optim.AdamW(b.parameters(), lr=0.01)
    info = pckt.load({"model": b, "optim": opt_b}, tmp_path)
    assert sorted(info.fresh_optimizer_state) == [
        f"optim/state/{i}/{m}" for i in (2, 3) for m in ("exp_avg", "exp_avg_sq", "step")
    ]
    assert len(opt_b.state) == 4
    assert torch.equal(opt_b.state[b[0].weight]["exp_avg"], opt_a.state[a[0].weight]["exp_avg"])


_Pair = collections.namedtuple("_Pair", "t n")


def test_a_namedtuple_holding_a_tensor_comes_back_as_itself(tmp_path: Path) -> None:
    """Rebuilt with ``_make``: its constructor takes the fields one by one (mutant F28)."""
    target: dict[str, Any] = {"p": _Pair(torch.zeros(2), 0)}
    _round_trip(tmp_path, {"p": _Pair(torch.arange(2.0), 7)}, target)
    assert type(target["p"]) is _Pair and target["p"].n == 7
    assert target["p"].t.tolist() == [0.0, 1.0]


def test_a_deep_tuple_holding_a_tensor_is_no_single_item() -> None:
    """Past ``_json_like``'s depth bound a tuple is not plain values (mutant F30 said it was)."""
    node: Any = torch.ones(1)
    for _ in range(70):
        node = (node,)
    flat = flatten_state({"t": node})
    assert flat.lists == {} and len(flat.tensors) == 1


def test_a_list_kept_as_one_item_records_no_items_below_it() -> None:
    """DCP keeps ``[1, [2, 3]]`` as one item: neither the inner list (mutant F15) nor a value
    inside it (mutant F19) gets a DCP path or a whole load of its own."""
    flat = flatten_state({"h": [1, [2, 3]], "t": (4, 5)})
    assert flat.dcp_paths == {"h": ("h",), "t": ("t",)}
    assert flat.lists == {"h": [1, [2, 3]], "t": (4, 5)}
    assert flat.values == {"h/0": 1, "h/1/0": 2, "h/1/1": 3, "t/0": 4, "t/1": 5}
