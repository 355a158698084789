"""What a load gives back, and what a save refuses: the fidelity review's findings.

Each test saves and loads in one process (no group), as a user checking a state would, and
compares bytes, types and values exactly.
"""

from __future__ import annotations

import collections
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402

import portable_ckpt  # noqa: E402
import portable_ckpt.torch as pckt  # noqa: E402
from portable_ckpt.errors import UnsupportedValueError, UsageError  # noqa: E402

Point = collections.namedtuple("Point", "a b")


def test_a_meta_target_is_refused_not_counted_as_loaded(tmp_path: Path) -> None:
    """F1: copy_ into a meta tensor does nothing; the load reported it as loaded."""
    pckt.save({"w": torch.arange(4.0)}, tmp_path, step=1)
    with pytest.raises(UsageError, match=r"'w': the target is on the meta device.*to_empty"):
        pckt.load({"w": torch.empty(4, device="meta")}, tmp_path)


def test_a_negative_view_target_gets_the_values(tmp_path: Path) -> None:
    """F2: a target with torch's negative bit was filled through a temporary copy."""
    pckt.save({"w": torch.tensor([1.0, 2.0, 3.0])}, tmp_path, step=1)
    base = torch.full((3,), -9.0)
    target = base._neg_view()
    pckt.load({"w": target}, tmp_path)
    assert target.tolist() == [1.0, 2.0, 3.0] and base.tolist() == [-1.0, -2.0, -3.0]


def test_an_expanded_target_is_refused(tmp_path: Path) -> None:
    """F4: elements sharing memory keep only the last value written to them."""
    pckt.save({"w": torch.arange(12.0).reshape(3, 4)}, tmp_path, step=1)
    with pytest.raises(UsageError, match=r"'w': the target's elements share memory"):
        pckt.load({"w": torch.zeros(3, 1).expand(3, 4)}, tmp_path)


@pytest.mark.parametrize(
    "make, what",
    [
        (lambda: torch.empty(3, device="meta"), "a meta tensor holds no data"),
        (lambda: torch.eye(3).to_sparse_csr(), "layout torch.sparse_csr is not supported"),
        (lambda: torch.eye(3).to_sparse(), "layout torch.sparse_coo is not supported"),
        (lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), "a nested tensor"),
        (lambda: _two_tensor(), "a TwoTensor \\(a tensor subclass"),  # odd-states O6
    ],
)
def test_tensors_without_a_dense_box_are_refused_naming_the_key(tmp_path: Path, make, what) -> None:
    """F3: these failed deep in torch, as PCK-DISTRIBUTED, naming neither key nor cause."""
    with warnings.catch_warnings():  # torch: "sparse CSR / nested tensors are in beta"
        warnings.simplefilter("ignore")
        t = make()
    with pytest.raises(UnsupportedValueError, match=rf"tensor 'model/t': {what}"):
        pckt.save({"model": {"t": t, "ok": torch.ones(2)}}, tmp_path, step=1)
    assert not list(tmp_path.iterdir()) or all(not (p / "manifest.json").exists()
                                               for p in tmp_path.iterdir())


@pytest.mark.parametrize(
    "make, what",
    [
        (lambda: torch.empty(3, device="meta"), "a meta tensor holds no data"),
        (lambda: torch.eye(3)[0].to_sparse(), "layout torch.sparse_coo is not supported"),
        (lambda: torch.nested.nested_tensor([torch.ones(1), torch.ones(2)]), "a nested tensor"),
        (lambda: _two_tensor(), "a TwoTensor \\(a tensor subclass"),
    ],
)
@pytest.mark.parametrize("how", ["save", "thread"])
def test_tensors_without_a_dense_box_are_refused_after_a_plan_was_cached(
    tmp_path: Path, make, what, how: str
) -> None:
    """The plan cache is looked up before the checks: a key whose plan is cached (a dense tensor
    of the same shape and dtype) and now holds such a tensor is still refused, by name."""
    def save(state: dict[str, object], step: int) -> None:
        if how == "save":
            pckt.save(state, tmp_path, step=step)
        else:
            pckt.async_save(state, tmp_path, step=step).result(timeout=120)

    state = {"model": {"t": torch.ones(3), "ok": torch.ones(2)}}
    save(state, 1)
    save(state, 2)  # the plan is cached now
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state["model"]["t"] = make()
    with pytest.raises(UnsupportedValueError, match=rf"tensor 'model/t': {what}"):
        save(state, 3)
    assert [v.step for v in portable_ckpt.list_versions(tmp_path)] == [1, 2]  # nothing of step 3


def _two_tensor() -> torch.Tensor:
    from torch.testing._internal.two_tensor import TwoTensor  # a wrapper subclass, as torchao's

    return TwoTensor(torch.ones(3), torch.zeros(3))


@pytest.mark.parametrize("value", [np.longdouble(0.1), np.clongdouble(1 + 2j), np.complex64(1j)])
def test_scalars_without_a_json_form_are_refused_naming_the_key(tmp_path: Path, value) -> None:
    """Odd-states O7: np.longdouble's item() is itself: the save recursed without end and failed
    as PCK-DISTRIBUTED naming no key."""
    with pytest.raises(UnsupportedValueError, match=r"'opt/x': a \w+ scalar has no JSON form"):
        pckt.save({"opt": {"x": value}, "w": torch.ones(1)}, tmp_path, step=1)
    with pytest.raises(UsageError, match=r"entry 'e' cannot be stored as JSON"):  # O8
        portable_ckpt.save_arrays(tmp_path / "a", {"w": np.ones(1)}, step=1,
                                  entries={"e": {"x": value}})


@pytest.mark.parametrize(("value", "fix"), [
    (np.datetime64("2026-01-01"), r"store str\(x\) \(ISO 8601\)"),
    (np.timedelta64(5, "s"), r"np.timedelta64\(1, 's'\)"),
    (np.bytes_(b"ab"), r"x.tobytes\(\) as a uint8 tensor"),
    (np.complex64(1j), r"x.real and x.imag"),
])
def test_a_scalar_without_a_json_form_is_told_a_conversion_that_works(
    tmp_path: Path, value, fix
) -> None:
    """Zoo review Z4: every such scalar was told to use float(x), which raises for these."""
    with pytest.raises(UnsupportedValueError, match=rf"'x': a \w+ scalar has no JSON form; .*{fix}"):
        pckt.save({"x": value, "w": torch.ones(1)}, tmp_path, step=1)
    from portable_ckpt.format.keys import encode_json

    with pytest.raises(UnsupportedValueError, match=rf"'e': a \w+ scalar has no JSON form; .*{fix}"):
        encode_json(value, key="e")


@pytest.mark.parametrize(("state", "named"), [
    ({"a\ud800b": torch.ones(2)}, r"flat key 'a\\ud800b' holds a lone surrogate"),
    ({"x": {"k\udcff": 1}}, r"flat key 'x/k\\udcff' holds a lone surrogate"),
    ({"x": {"k": "v\ud800"}}, r"value at 'x/k': the string 'v\\ud800' holds a lone surrogate"),
    ({"x": {"k": [{"n\udc80": 1}]}}, r"flat key 'x/k/0/n\\udc80' holds a lone surrogate"),
])
def test_lone_surrogates_are_refused_naming_the_key(tmp_path: Path, state, named) -> None:
    """Odd-states O8: a lone surrogate (a file name decoded with surrogateescape) in a key or a
    string failed in the writer's JSON encoder, naming no key ("position 125")."""
    with pytest.raises(UnsupportedValueError, match=named):
        pckt.save({**state, "w": torch.ones(1)}, tmp_path, step=1, continuation="statistical")
    assert not list(tmp_path.glob("*/manifest.json"))
    from portable_ckpt.format.keys import encode_json  # an entry's value: a dict key

    with pytest.raises(UnsupportedValueError, match=r"value at 'e': the dict key 'n\\udc80'"):
        encode_json({"n\udc80": 1}, key="e")


def test_keys_found_good_are_remembered_within_a_bound_and_bad_ones_never() -> None:
    """Flattening remembers the keys it checked (they repeat at every save), up to a bound in
    characters however many distinct keys states hold; a bad key is refused every time."""
    from portable_ckpt.torch import flatten as fl

    long = "k" * 1000
    for batch in range(3):  # ~1.5 times the bound, in states of 2,000 keys of 1,000 characters
        fl.flatten_state({f"{batch}-{i}-{long}": 1 for i in range(2000)})
        assert sum(len(k) for k in fl._GOOD_KEYS) <= fl._GOOD_KEYS_CHARS
        assert fl._good_chars == sum(len(k) for k in fl._GOOD_KEYS)
    for _ in range(2):
        with pytest.raises(UnsupportedValueError, match=r"flat key 'a\\x01b' must be"):
            fl.flatten_state({"ok": 2, "a\x01b": 1})
    assert "a\x01b" not in fl._GOOD_KEYS and "ok" in fl._GOOD_KEYS


def test_tuple_subclasses_and_dict_subclasses_come_back_as_themselves(tmp_path: Path) -> None:
    """F5: a torch.Size or namedtuple of plain values kept the target's values, silently."""
    saved = {
        "shape": torch.Size([2, 3]),
        "pt": Point(1, 2),
        "plain": (1, 2),
        "od": collections.OrderedDict(b=1, a=2),
    }
    pckt.save(saved, tmp_path, step=1)
    target = {
        "shape": torch.Size([0, 0]),
        "pt": Point(0, 0),
        "plain": (0, 0),
        "od": collections.OrderedDict(b=0, a=0),
    }
    info = pckt.load(target, tmp_path)
    assert target["shape"] == torch.Size([2, 3]) and type(target["shape"]) is torch.Size
    assert target["pt"] == Point(1, 2) and type(target["pt"]) is Point
    assert target["plain"] == (1, 2) and type(target["plain"]) is tuple
    assert target["od"] == {"b": 1, "a": 2} and type(target["od"]) is collections.OrderedDict
    assert info.missing_keys == [] and info.unexpected_keys == []


def test_staged_raises_when_nothing_was_staged(tmp_path: Path) -> None:
    """Async review F11: ``staged`` resolved with an "error" key that a caller waiting on it
    alone never read; now it raises this rank's error, and ``committed`` the save's."""
    from portable_ckpt.errors import CheckpointError

    handle = pckt.async_save({"c": torch.zeros(2, dtype=torch.complex128)}, tmp_path, step=1)
    with pytest.raises(UnsupportedValueError, match="'c'"):
        handle.staged.result(timeout=60)
    with pytest.raises(CheckpointError):
        handle.committed.result(timeout=60)
    ok = pckt.async_save({"w": torch.ones(2)}, tmp_path, step=2)
    assert set(ok.staged.result(timeout=60)) == {"seconds", "staging_bytes"}
    assert ok.committed.result(timeout=60).step == 2


class _Tracker:
    """A Stateful whose dict grows during training (per-shard counters)."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def state_dict(self) -> dict[str, object]:
        return {"seen": dict(self.seen)}

    def load_state_dict(self, sd: dict[str, object]) -> None:
        self.seen = dict(sd["seen"])  # type: ignore[call-overload]


def test_an_empty_dict_of_the_target_gets_what_is_stored_below_it(tmp_path: Path) -> None:
    """F7: a fresh Stateful's empty dict came back empty (the version held the counters), and
    stored values the target lacks were dropped without a word; they are unexpected keys now."""
    a = _Tracker()
    a.seen.update({"shard-00": 3, "shard-01": 1})
    pckt.save({"tracker": a, "cfg": {"x": 1, "y": 2}}, tmp_path, step=1)
    b = _Tracker()
    info = pckt.load({"tracker": b, "cfg": {"x": 0}}, tmp_path)
    assert b.seen == {"shard-00": 3, "shard-01": 1}
    assert info.unexpected_keys == ["cfg/y"] and info.missing_keys == []


class _Grows:
    """A Stateful whose whole state_dict() is ``{}`` when fresh (a metrics tracker, an EMA
    filled at the first update)."""

    def __init__(self) -> None:
        self.d: dict[str, object] = {}

    def state_dict(self) -> dict[str, object]:
        return self.d

    def load_state_dict(self, sd: dict[str, object]) -> None:
        self.d = dict(sd)


def test_a_stateful_whose_fresh_state_is_empty_gets_its_values_and_tensors(tmp_path: Path) -> None:
    """Odd-states review O13: such an object got ``{}`` back, through load and the manager,
    and nothing said so (its template took the object's key, and the rule for an empty dict
    skipped it). O14: the tensors stored below an empty dict were listed as unexpected only:
    EMA weights keyed by parameter name restarted from nothing."""
    a = _Grows()
    a.d = {"step": 5, "seen": {"a": 1}, "ema": {"l.w": torch.arange(6.0).reshape(2, 3)},
           "bits": torch.tensor([True, False])}
    pckt.save({"g": a, "extra": {"n": 3, "w": torch.full((2,), 7, dtype=torch.int16)}},
              tmp_path, step=1, continuation="statistical")
    b = _Grows()
    target: dict[str, object] = {"g": b, "extra": {}}
    info = pckt.load(target, tmp_path)
    assert b.d["step"] == 5 and b.d["seen"] == {"a": 1}, b.d
    ema = b.d["ema"]
    assert isinstance(ema, dict) and torch.equal(ema["l.w"], torch.arange(6.0).reshape(2, 3))
    assert torch.equal(b.d["bits"], torch.tensor([True, False]))  # type: ignore[arg-type]
    extra = target["extra"]
    assert isinstance(extra, dict) and extra["n"] == 3
    assert extra["w"].dtype == torch.int16 and extra["w"].tolist() == [7, 7]
    assert info.unexpected_keys == [] and info.missing_keys == []
    with pckt.CheckpointManager(tmp_path / "m", save_every=1, async_save=False) as mgr:
        mgr.save(1, {"g": a})
    c = _Grows()
    with pckt.CheckpointManager(tmp_path / "m", save_every=1) as mgr:
        mgr.restore({"g": c})
    assert c.d["step"] == 5 and torch.equal(c.d["ema"]["l.w"], a.d["ema"]["l.w"])  # type: ignore[index]


class _LM(torch.nn.Module):
    def __init__(self, tie: bool) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        if tie:
            self.head.weight = self.emb.weight


def test_tied_targets_are_filled_once_and_must_agree(tmp_path: Path) -> None:
    """Odd-states review O2: keys sharing memory were written twice and the last won: an untied
    version loaded into a tied model gave the embedding the head's values, silently. A tie (or
    a view inside another target) is filled once and compared; disagreeing values and targets
    that overlap in part are refused, naming both keys."""
    tied = _LM(tie=True)
    pckt.save({"m": tied.state_dict()}, tmp_path / "tied", step=1, continuation="statistical")
    again = _LM(tie=True)
    info = pckt.load({"m": again.state_dict()}, tmp_path / "tied")
    assert again.head.weight is again.emb.weight and torch.equal(again.emb.weight, tied.emb.weight)
    assert info.tensors_loaded == 2
    apart = _LM(tie=False)
    with torch.no_grad():
        apart.emb.weight.fill_(2.0)
        apart.head.weight.fill_(1.0)
    pckt.save({"m": apart.state_dict()}, tmp_path / "apart", step=1, continuation="statistical")
    with pytest.raises(UsageError, match=r"'m/emb\.weight' and 'm/head\.weight' of the target share"):
        pckt.load({"m": _LM(tie=True).state_dict()}, tmp_path / "apart")
    untied = _LM(tie=False)  # an untied target takes both
    pckt.load({"m": untied.state_dict()}, tmp_path / "apart")
    assert float(untied.emb.weight[0, 0]) == 2.0 and float(untied.head.weight[0, 0]) == 1.0
    # a view inside another target: compared; a -0.0 against 0.0 is a difference
    big = torch.arange(20.0)
    pckt.save({"big": big, "part": big[5:10]}, tmp_path / "view", step=1)
    b = torch.zeros(20)
    pckt.load({"big": b, "part": b[5:10]}, tmp_path / "view")
    assert torch.equal(b, big)
    odd = torch.arange(20.0)
    odd[7] = -0.0
    part = odd[5:10].clone()
    part[2] = 0.0  # equal as numbers, not as bits
    pckt.save({"big": odd, "part": part}, tmp_path / "neg", step=1)
    with pytest.raises(UsageError, match="holds different values"):
        c = torch.zeros(20)
        pckt.load({"big": c, "part": c[5:10]}, tmp_path / "neg")
    # overlapping in part: refused before anything is read
    pckt.save({"a": torch.ones(10), "b": torch.ones(10)}, tmp_path / "part", step=1)
    d = torch.zeros(15)
    with pytest.raises(UsageError, match="share part of their memory"):
        pckt.load({"a": d[:10], "b": d[5:]}, tmp_path / "part")
    assert not d.any()


def test_numpy_scalars_and_int_enums_come_back_in_the_targets_type(tmp_path: Path) -> None:
    """F8: they were stored by value and came back as Python int/float."""
    import enum

    import numpy as np

    class Phase(enum.IntEnum):
        WARMUP = 1
        MAIN = 2

    class Split(enum.StrEnum):
        TRAIN = "train"
        EVAL = "eval"

    saved = {"f": np.float32(1.1), "u": np.uint64(2**64 - 1), "a": np.array(2.5, np.float16),
             "p": Phase.MAIN, "b": np.bool_(True), "s": np.str_("shard-3"), "e": Split.EVAL}
    pckt.save(saved, tmp_path, step=1)
    target = {"f": np.float32(0), "u": np.uint64(0), "a": np.array(0, np.float16),
              "p": Phase.WARMUP, "b": np.bool_(False), "s": np.str_(""), "e": Split.TRAIN}
    pckt.load(target, tmp_path)
    for k, v in saved.items():
        assert type(target[k]) is type(v) and target[k] == v, (k, target[k])
    assert target["f"].tobytes() == saved["f"].tobytes()
    assert target["a"].dtype == np.float16


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.AdamW(p, lr=0.01),
    lambda p: torch.optim.NAdam(p, lr=0.01),
    lambda p: torch.optim.ASGD(p, lr=0.01),
    lambda p: torch.optim.Rprop(p, lr=0.01),
], ids=["adamw", "nadam", "asgd", "rprop"])
def test_a_parameter_without_optimizer_state_continues_as_if_never_saved(
    tmp_path: Path, make: object
) -> None:
    """Odd-states review O1: the state kept for a parameter the version had none of came from a
    step at learning rate 0: NAdam and ASGD drifted, Rprop's parameters all but stopped. Saved
    before the first step, and saved while one layer had no gradient yet, a resumed job takes
    the steps of one that never saved, bit for bit."""
    def model() -> torch.nn.Sequential:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))

    def step(m: torch.nn.Module, opt: torch.optim.Optimizer, i: int, head_only: bool) -> None:
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(i))
        y = (m[0](x).sum() if head_only else m(x).pow(2).sum())
        opt.zero_grad()
        y.backward()
        opt.step()

    for before, root in ((0, tmp_path / "before"), (2, tmp_path / "half")):
        a = model()
        opt_a = make(a.parameters())  # type: ignore[operator]
        for i in range(before):
            step(a, opt_a, i, head_only=True)  # the second layer gets no gradient
        pckt.save({"t": pckt.ModelOptimizerState(a, opt_a)}, root, step=before,
                  continuation="statistical")
        b = model()
        opt_b = make(b.parameters())  # type: ignore[operator]
        info = pckt.load({"t": pckt.ModelOptimizerState(b, opt_b)}, root)
        assert bool(info.fresh_optimizer_state) == (before > 0)
        for i in range(3):
            step(a, opt_a, 10 + i, head_only=False)
            step(b, opt_b, 10 + i, head_only=False)
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            assert torch.equal(p, q), (before, p, q)


def test_a_fresh_optimizers_plain_state_dict_gets_its_state_keyed_by_int(tmp_path: Path) -> None:
    """Diff review D2: the state growing into an empty dict gave a fresh optimizer's plain
    state_dict() string keys: load_state_dict restored nothing and the next save failed."""
    m = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(m.parameters())
    m(torch.ones(1, 2)).sum().backward()
    opt.step()
    pckt.save({"m": m.state_dict(), "o": opt.state_dict()}, tmp_path, step=1,
              continuation="statistical")
    m2 = torch.nn.Linear(2, 2)
    opt2 = torch.optim.AdamW(m2.parameters())
    sd = {"m": m2.state_dict(), "o": opt2.state_dict()}
    info = pckt.load(sd, tmp_path)
    assert sorted(sd["o"]["state"]) == [0, 1] and info.unexpected_keys == []
    opt2.load_state_dict(sd["o"])
    assert torch.equal(opt2.state[m2.weight]["exp_avg"], opt.state[m.weight]["exp_avg"])
    pckt.save({"m": m2.state_dict(), "o": opt2.state_dict()}, tmp_path, step=2,
              continuation="statistical")


def test_a_group_makes_only_tensors_stored_whole_below_an_empty_dict(tmp_path: Path) -> None:
    """Diff review D6: a sharded tensor below an empty dict (an FSDP2 EMA) was made whole on
    every rank of a group; there only tensors stored as one range are made."""
    from portable_ckpt.torch._load_values import tensors_into_empty
    from portable_ckpt.torch.flatten import FlatState

    portable_ckpt.save_arrays(tmp_path, {"e/tiled": np.ones((4, 4), np.float32),
                                         "e/whole": np.ones(3, np.float32)},
                              step=1, tiles={"e/tiled": (2, 2)})
    ck = portable_ckpt.open(tmp_path)
    for whole, made in ((True, ["tiled", "whole"]), (False, ["whole"])):
        flat = FlatState(values={"e": {}})
        grown = tensors_into_empty(ck, flat, whole=whole)
        assert sorted(grown["e"]) == made, (whole, grown)


def test_interleaved_views_of_one_tensor_are_separate_targets(tmp_path: Path) -> None:
    """Diff review D4: the overlap check made a mask of the whole span for each pair of
    strided views. Column views of one weight share no byte: each loads its own values."""
    stored = {f"c{i}": torch.arange(4.0) + 10 * i for i in range(8)}
    pckt.save(stored, tmp_path, step=1)
    w = torch.zeros(4, 8)
    pckt.load({f"c{i}": w[:, i] for i in range(8)}, tmp_path)
    assert torch.equal(w, torch.stack([stored[f"c{i}"] for i in range(8)], dim=1))


def test_a_tie_among_the_views_of_one_flat_buffer(tmp_path: Path) -> None:
    """Last review L3: parameters that are views of one flat buffer (a contiguous parameter
    buffer, FSDP1's use_orig_params) plus one tie made the whole buffer one case (a mask of
    its size, quadratic time). Only the overlapping views are looked at together."""
    from portable_ckpt.torch._load_ties import tied_targets

    buf = torch.arange(4000.0)
    views = {f"p{i}": buf[i * 100:(i + 1) * 100] for i in range(40)}
    assert tied_targets([*views.items(), ("head", buf[0:100])]) == {"head": "p0"}
    pckt.save({**views, "head": buf[0:100]}, tmp_path, step=1)
    out = torch.zeros(4000)
    pckt.load({**{k: out[i * 100:(i + 1) * 100] for i, k in enumerate(views)},
               "head": out[0:100]}, tmp_path)
    assert torch.equal(out, buf)


def test_a_stateful_that_grows_gets_its_lists_and_int_keyed_dicts_back_as_saved(
    tmp_path: Path,
) -> None:
    """Zoo review Z2: below an empty dict of the target, a list of tensors came back as a dict
    keyed "0", "1" and a dict keyed 0..n-1 as a list: the key rule writes both alike, and the
    version's record of list positions (``torch.dcp_items``) was not asked."""
    a = _Grows()
    a.d = {"shadow": [torch.ones(2), torch.zeros(3, dtype=torch.int8)],
           "per_class": {0: 0.5, 1: 0.75}, "by_name": {"0": "a", "1": "b"},
           "by_id": {0: torch.ones(1), 1: torch.full((2,), 2.0)},
           "evals": [{"loss": 1.5, "w": torch.ones(1)}, {"loss": 0.5, "w": torch.zeros(1)}],
           "nested": [[torch.ones(1)], [torch.zeros(1), torch.ones(2)]], "nums": [3, 4]}
    pckt.save({"g": a}, tmp_path, step=1, continuation="statistical")
    b = _Grows()
    info = pckt.load({"g": b}, tmp_path)
    shadow = b.d["shadow"]
    assert isinstance(shadow, list) and [t.tolist() for t in shadow] == [[1.0, 1.0], [0, 0, 0]]
    assert shadow[1].dtype == torch.int8
    assert b.d["per_class"] == {"0": 0.5, "1": 0.75}  # int keys come back as str (documented)
    assert b.d["by_name"] == {"0": "a", "1": "b"}
    by_id = b.d["by_id"]
    assert isinstance(by_id, dict) and sorted(by_id) == ["0", "1"]
    assert by_id["1"].tolist() == [2.0, 2.0]
    evals = b.d["evals"]
    assert isinstance(evals, list) and [e["loss"] for e in evals] == [1.5, 0.5]
    assert [e["w"].tolist() for e in evals] == [[1.0], [0.0]]
    nested = b.d["nested"]
    assert isinstance(nested, list) and all(isinstance(n, list) for n in nested)
    assert [[t.tolist() for t in n] for n in nested] == [[[1.0]], [[0.0], [1.0, 1.0]]]
    assert b.d["nums"] == [3, 4] and info.unexpected_keys == []


class _Closure(torch.optim.Optimizer):
    """An optimizer whose step needs its closure, as LBFGS's (and SAM-like ones) does."""

    def __init__(self, params: object) -> None:
        super().__init__(params, {"lr": 0.5})  # type: ignore[arg-type]

    def step(self, closure: object = None) -> None:  # type: ignore[override]
        loss = closure()  # type: ignore[operator]
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["prev"] = p.detach().clone()
                p.data.add_(p.grad, alpha=-group["lr"])
        return loss


@pytest.mark.parametrize("make", [
    lambda m: torch.optim.LBFGS(m.parameters(), lr=0.5, history_size=3),
    lambda m: _Closure(m.parameters()),
], ids=["lbfgs", "closure"])
def test_an_optimizer_whose_state_cannot_be_made_loads_and_is_left_intact(
    tmp_path: Path, make
) -> None:
    """Zoo review Z1: the state of a fresh optimizer is made by a step of zero gradients at
    learning rate 0; where that step raised (LBFGS without a closure) the load failed as
    PCK-DISTRIBUTED naming a TypeError, and the optimizer was left at learning rate 0 with zero
    gradients, so a job that went on after it (or after a failed initial save) trained at lr 0.
    Given by itself, such an optimizer now loads its stored state (lists of tensors included)
    and continues bit for bit; through ModelOptimizerState the refusal says what to do and
    leaves it as it was."""
    from portable_ckpt.errors import UnsupportedValueError

    def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 2)
        return m, make(m)

    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))

    def steps(m: torch.nn.Module, opt: torch.optim.Optimizer, n: int) -> list[float]:
        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = m(x).pow(2).mean()
            loss.backward()
            return loss
        return [float(opt.step(closure).detach()) for _ in range(n)]  # type: ignore[union-attr]

    a, opt_a = build()
    steps(a, opt_a, 4)
    pckt.save({"m": a, "o": opt_a}, tmp_path, step=1, continuation="statistical")
    expected = steps(a, opt_a, 3)
    b, opt_b = build()
    info = pckt.load({"m": b, "o": opt_b}, tmp_path)
    assert info.unexpected_keys == [] and steps(b, opt_b, 3) == expected
    c, opt_c = build()
    with pytest.raises(UnsupportedValueError, match=r"cannot make the state of \w+ .*optimizer "
                       r"was left as it was.*\"optim\": optimizer"):
        pckt.save({"t": pckt.ModelOptimizerState(c, opt_c)}, tmp_path / "x", step=1,
                  continuation="statistical")
    assert opt_c.param_groups[0]["lr"] == 0.5 and not opt_c.state
    assert all(p.grad is None for p in c.parameters())
    with pytest.raises(UnsupportedValueError, match=r"cannot make the state of"):
        pckt.load({"t": pckt.ModelOptimizerState(c, opt_c)}, tmp_path, strict=False)
    assert opt_c.param_groups[0]["lr"] == 0.5 and not opt_c.state
    assert all(p.grad is None for p in c.parameters())


def test_a_value_a_numpy_target_cannot_hold_stays_as_stored(tmp_path: Path) -> None:
    """Zoo review Z5: a stored float out of a numpy target's range became inf, said only by
    numpy's overflow warning; it stays the stored number now, as an int8 overflow did."""
    pckt.save({"v": {"a": 1e300, "b": 70000.0, "c": 300, "d": 0.1}}, tmp_path, step=1)
    target = {"v": {"a": np.float32(0), "b": np.array(0, dtype=np.float16), "c": np.int8(0),
                    "d": np.float32(0)}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow warning is an error here
        pckt.load(target, tmp_path)
    v = target["v"]
    assert v["a"] == 1e300 and type(v["a"]) is float
    assert v["b"] == 70000.0 and type(v["b"]) is float
    assert v["c"] == 300 and type(v["c"]) is int
    assert v["d"] == np.float32(0.1) and type(v["d"]) is np.float32  # a rounding is a cast


def test_a_stored_int_a_numpy_float_target_cannot_hold_stays_as_stored(tmp_path: Path) -> None:
    """Re-attack 29: the Z5 fix looked at stored floats only; a stored int beyond a float
    target's range (70000 into an np.float16, 10**39 into an np.float32) still became inf,
    and the overflow warning was now silenced too."""
    pckt.save({"v": {"a": 70000, "b": 10**39, "c": -70000, "d": 3}}, tmp_path, step=1)
    target = {"v": {"a": np.float16(0), "b": np.array(0, dtype=np.float32),
                    "c": np.float16(0), "d": np.float16(0)}}
    pckt.load(target, tmp_path)
    v = target["v"]
    assert v["a"] == 70000 and type(v["a"]) is int
    assert v["b"] == 10**39 and type(v["b"]) is int
    assert v["c"] == -70000 and type(v["c"]) is int
    assert v["d"] == np.float16(3) and type(v["d"]) is np.float16  # in range: a cast


def test_a_param_group_added_during_training_is_asked_for_before_the_restore(
    tmp_path: Path,
) -> None:
    """Zoo review Z6: a group added by add_param_group (a layer unfrozen at step N) is stored;
    a restarted job that built its optimizer without it loaded the other groups and trained on
    with that layer frozen, its optimizer state dropped, named only in unexpected_keys."""
    from portable_ckpt.errors import EntryTargetError

    def build() -> tuple[torch.nn.Sequential, torch.optim.Optimizer]:
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        return m, torch.optim.AdamW(m[0].parameters(), lr=1e-3)

    a, opt_a = build()
    for _ in range(2):
        a(torch.ones(2, 4)).sum().backward()
        opt_a.step()
        if len(opt_a.param_groups) == 1:
            opt_a.add_param_group({"params": list(a[1].parameters()), "lr": 5e-4})
    pckt.save({"t": pckt.ModelOptimizerState(a, opt_a)}, tmp_path, step=2,
              continuation="statistical")
    b, opt_b = build()
    with pytest.raises(EntryTargetError, match=r"'t/optim' .* holds 2 param groups, the "
                       r"target's optimizer 1 \(group 1: lr 0.0005, params \['1.weight', "
                       r"'1.bias'\]\): a group added during training \(add_param_group\)"):
        pckt.load({"t": pckt.ModelOptimizerState(b, opt_b)}, tmp_path)
    info = pckt.load({"t": pckt.ModelOptimizerState(b, opt_b)}, tmp_path, strict=False)
    assert "t/optim/param_groups/1/lr" in info.unexpected_keys
    c, opt_c = build()
    opt_c.add_param_group({"params": list(c[1].parameters()), "lr": 1e-3})
    pckt.load({"t": pckt.ModelOptimizerState(c, opt_c)}, tmp_path)
    assert opt_c.param_groups[1]["lr"] == 5e-4
    assert torch.equal(opt_c.state[c[1].weight]["exp_avg"], opt_a.state[a[1].weight]["exp_avg"])
