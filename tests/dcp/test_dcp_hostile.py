"""Odd and hostile versions through the DCP storage layer (review 7): ``read_metadata`` costs a
bounded multiple of the bytes of the keys, however many components they have; what DCP's own
storage gives back for a list, the portable reader gives back too (a sparse list, a stored list
under a target of another shape); and a template-free load gets the state or a checkpoint error,
never a crash inside DCP's ``set_element``."""

from __future__ import annotations

import copy
import json
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.distributed.checkpoint as dcp  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter  # noqa: E402
from torch.distributed.checkpoint.default_planner import (  # noqa: E402
    DefaultLoadPlanner,
    DefaultSavePlanner,
    _EmptyStateDictLoadPlanner,
)
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict  # noqa: E402

import portable_ckpt  # noqa: E402
from portable_ckpt.errors import CheckpointError, UnsupportedValueError  # noqa: E402
from portable_ckpt.format.keys import LIST_ROOM, KeyTrie  # noqa: E402
from portable_ckpt.torch.dcp import PortableStorageReader, PortableStorageWriter  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning")]


def _free(reader: Any) -> dict[str, Any]:
    """DCP's template-free load (``dcp_to_torch_save``'s planner): the state from the metadata."""
    sd: dict[str, Any] = {}
    _load_state_dict(sd, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    return sd


def _failure(e: BaseException) -> BaseException:
    """The first rank's exception inside DCP's CheckpointException (a BaseException)."""
    failures = getattr(e, "failures", None)
    return next(iter(failures.values()))[0] if failures else e


def _plain(v: Any) -> Any:
    """Values with their container and scalar types, tensors as lists."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return (type(v).__name__, [_plain(x) for x in v])
    if isinstance(v, torch.Tensor):
        return ("tensor", v.tolist())
    return (type(v).__name__, v)


def _both(root: Path, state: dict[str, Any], **save: Any) -> tuple[str, str]:
    """``state`` saved through DCP's FileSystemWriter and through PortableStorageWriter."""
    fs, pc = str(root / "fs"), str(root / "pc")
    dcp.save(copy.deepcopy(state), storage_writer=FileSystemWriter(fs), no_dist=True, **save)
    dcp.save(copy.deepcopy(state), storage_writer=PortableStorageWriter(pc, step=1), no_dist=True,
             **save)
    return fs, pc


def _version(root: Path, tensors: dict[str, Any], entries: dict[str, Any]) -> str:
    arrays = {k: np.full(2, i, np.float32) for i, k in enumerate(tensors)}
    portable_ckpt.save_arrays(root, arrays, step=1, entries=entries)
    return str(root)


# -- F1: the cost of read_metadata is linear in the bytes of the keys -------------------------------


def _leaves(shape: str, n: int) -> dict[str, Any]:
    """``n`` keys of about 1,024 characters (the key rule's limit) made of many components."""
    if shape == "empty":  # the review's: ~1,020 empty components each
        return {f"X{i}/" + "/" * (1024 - len(f"X{i}/")): 0 for i in range(n)}
    if shape == "pairs":  # ~340 two-character components (a str object each)
        return {(f"X{i}/" + "ab/" * 400)[:1023]: 0 for i in range(n)}
    if shape == "chain":  # every key a prefix of the next: a deep trie, no branching
        return {"/".join(["a"] * m): 0 for m in range(1, 512)}
    return {f"q{i}/" + "/".join(["0"] * 500): 1 for i in range(n)}  # "positions": 500 deep


@pytest.mark.parametrize("shape", ["empty", "pairs", "chain", "positions", "recorded"])
def test_metadata_of_long_keys_costs_a_bounded_multiple_of_their_bytes(
    tmp_path: Path, shape: str
) -> None:
    """Review 7, F1: ``read_metadata`` kept every prefix of every key as a string: about 2,000
    times the bytes of 1 KB keys of many components (2 MB and 33 ms per key; a 64 MiB entry:
    ~130 GB). Prefixes now live in tries with a node per key and branch point, so the peak
    traced memory is a small multiple of the entries' bytes, whatever the components: the rest
    is the object paths DCP's ``planner_data`` holds (one tuple slot per component)."""
    n = 100
    leaves = _leaves("positions" if shape == "recorded" else shape, n)
    entries: dict[str, Any] = {"torch.values": leaves}
    if shape == "recorded":  # a record whose paths are positions all the way down
        entries["torch.dcp_items"] = [[f"q{i}"] + [0] * 499 for i in range(n)]
    root = _version(tmp_path, {"w": None}, entries)
    size = sum(len(json.dumps(v, separators=(",", ":"))) for v in entries.values())
    reader = PortableStorageReader(root)
    tracemalloc.start()
    try:
        md = reader.read_metadata()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert reader._error is None and len(md.state_dict_metadata) >= 2
    assert peak < 32 * size, (shape, peak, size)  # before: ~2,000 times (200 MB for "empty")


_KEYS = st.lists(
    st.lists(st.sampled_from(["", "a", "b", "ab", "0", "1", "~1", "x.y"]), min_size=1,
             max_size=6).map("/".join),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(_KEYS, st.lists(st.sampled_from(["", "a", "b", "ab", "0", "1", "~1", "x.y"]), min_size=1,
                       max_size=7).map("/".join))
def test_key_trie_answers_what_the_prefix_strings_did(keys: list[str], query: str) -> None:
    """The trie's answers equal those of the prefix strings it replaces, with at most two nodes
    per key (the keys and the prefixes where they part), not one per component."""
    flags = {k: 1 << (i % 3) for i, k in enumerate(keys)}
    trie = KeyTrie()
    for k, f in flags.items():
        trie.add(k, f)

    def prefixes(k: str) -> list[str]:
        parts = k.split("/")
        return ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]

    places = {p for k in flags for p in prefixes(k)}
    for q in [query, *places]:
        assert (trie.find(q) is not None) == (q in places)
        assert trie.below(q) == _or(f for k, f in flags.items() if k.startswith(q + "/"))
        assert trie.on_path(q) == _or(f for k, f in flags.items() if k in prefixes(q))
        shared = max((n for n, p in enumerate(prefixes(q), 1) if p in places), default=0)
        top = "/".join(q.split("/")[:shared])
        more = shared > 0 and any(k.startswith(top + "/") for k in flags)
        assert trie.reach(q) == (shared, more)
        want = [k[len(q) + 1 :].split("/")[0] for k in flags if k.startswith(q + "/")]
        assert [c for c, _ in trie.kids(trie.find(q))] == list(dict.fromkeys(want))
    nodes = list(trie.nodes())
    assert len(nodes) <= 2 * len(flags)
    assert all(node.depth == node.key.count("/") + 1 for node, _ in nodes)


def _or(flags: Any) -> int:
    out = 0
    for f in flags:
        out |= f
    return out


# -- F4: a sparse list reads as DCP's own storage reads it -----------------------------------------


@pytest.mark.parametrize("holes", [9, 16, 40, 1000])
def test_a_list_of_mostly_empty_dicts_reads_as_with_dcps_own_storage(
    tmp_path: Path, holes: int
) -> None:
    """Review 7, F4: ``[{}] * 40 + [{"a": 1}]`` was recorded as the list item ``l.40.a`` but the
    record was set aside (one stored position, 40 > 2 + 16) and the guess made ``l`` a dict:
    a template-free load "succeeded" with ``{"l": {"40": {"a": 1}}}``. The record is followed
    now (DCP allocates the positions as it does for its own storage): the same object paths, so
    loads with and without a target end as with FileSystemReader (DCP's own "Missing key": its
    load planner makes items of the empty dicts)."""
    state = {"l": [{}] * holes + [{"a": 1}], "w": torch.ones(2)}
    fs, pc = _both(tmp_path, state)
    assert (
        PortableStorageReader(pc).read_metadata().planner_data
        == FileSystemReader(fs).read_metadata().planner_data
    )
    for reader in (FileSystemReader(fs), PortableStorageReader(pc)):
        with pytest.raises(BaseException, match=r"Missing key in checkpoint state_dict: l\.0\."):
            _free(reader)
    outcomes = []
    for reader in (FileSystemReader(fs), PortableStorageReader(pc)):
        target = {"l": [{} for _ in range(holes)] + [{"a": 0}], "w": torch.zeros(2)}
        try:  # DCP's own load says "Missing key" for the target's empty dicts too
            dcp.load(target, storage_reader=reader, no_dist=True)
            outcomes.append(_plain(target))
        except BaseException as e:  # DCP's CheckpointException
            outcomes.append(str(_failure(e)))
    assert outcomes[1] == outcomes[0]


def test_a_record_asking_for_more_list_positions_than_the_room_is_refused(tmp_path: Path) -> None:
    """A record whose lists want far more positions than are stored (DCP's template-free load
    allocates them all) is refused with a checkpoint error, not read as dicts by the keys."""
    for last in (LIST_ROOM + 100, 10**12):
        root = _version(tmp_path / str(last), {"w": None}, {
            "torch.values": {f"l/{last}/a": 1},
            "torch.dcp_items": [["l", last, "a"]],
        })
        reader = PortableStorageReader(root)
        assert reader.read_metadata().state_dict_metadata == {}
        assert reader._error is not None and reader._error.code == "PCK-UNSUPPORTED-VALUE"
        assert f"position {last:,}" in str(reader._error)
        for load in (
            lambda r: _free(r),
            lambda r: dcp.load({"w": torch.zeros(2)}, storage_reader=r, no_dist=True),
        ):
            with pytest.raises(BaseException) as info:
                load(PortableStorageReader(root))
            assert isinstance(_failure(info.value), UnsupportedValueError)
    # within the room: DCP's own behaviour (the positions are allocated, then "Missing key")
    root = _version(tmp_path / "room", {"w": None}, {
        "torch.values": {"l/5000/a": 1}, "torch.dcp_items": [["l", 5000, "a"]]})
    assert PortableStorageReader(root).read_metadata().planner_data["l.5000.a"] == ("l", 5000, "a")


# -- F5: the stored list wins where the target's shape does not explain it -------------------------


@pytest.mark.parametrize(
    ("saved", "template"),
    [
        ([[1, 2], [3, 4]], [0.0, 0.0]),  # nested list into a flat list
        ([1, 2], 0),  # a list into a scalar
        ([5, 6], {0: 0, 1: 0}),  # a list into an int-keyed dict
        ([[1, 2]], None),
        ([1, 2, 3], [0, 0]),
        ((1, 2), (0, 0)),  # the target's tuple still gives the tuple back
        ([[1, 2], 3], [0, 0]),  # a list where the target holds a scalar, one level down
        ([[1, [2]], 3], [[0, 0], 0]),
    ],
)
def test_a_stored_list_comes_back_as_dcps_own_storage_gives_it(
    tmp_path: Path, saved: Any, template: Any
) -> None:
    """Review 7, F5: under a target whose value is a scalar or a flat list (code changed between
    save and load), stored positions came back as dicts keyed '0', '1'. FileSystemReader puts
    the stored object in place; so does the portable reader now (the record's item is a list:
    DCP's planner never keeps a dict as one item)."""
    fs, pc = _both(tmp_path, {"a": saved, "w": torch.ones(2)})
    out = []
    for reader in (FileSystemReader(fs), PortableStorageReader(pc)):
        target = {"a": copy.deepcopy(template), "w": torch.zeros(2)}
        dcp.load(target, storage_reader=reader, no_dist=True)
        out.append(_plain(target))
    assert out[1] == out[0]


def test_a_targets_int_keys_still_shape_a_dict_inside_an_item(tmp_path: Path) -> None:
    """Where a dict is stored (inside a tuple item; any item of a non-flattening planner) the
    target's int keys are kept, as FileSystemReader's unpickled dict has them."""
    cases: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = [
        ({"t": ({0: "x", 1: "y"},)}, {"t": ({0: "", 1: ""},)}, {}),
        ({"k": {0: 5, 1: 6}}, {"k": {0: 0, 1: 0}}, {"flatten_state_dict": False}),
        ({"k": {3: 5, "b": [1, 2]}}, {"k": {3: 0, "b": 0}}, {"flatten_state_dict": False}),
    ]
    for i, (state, template, flat) in enumerate(cases):
        fs, pc = _both(tmp_path / str(i), {**state, "w": torch.ones(2)},
                       planner=DefaultSavePlanner(**flat))
        out = []
        for reader in (FileSystemReader(fs), PortableStorageReader(pc)):
            target = {**copy.deepcopy(template), "w": torch.zeros(2)}
            dcp.load(target, storage_reader=reader, planner=DefaultLoadPlanner(**flat),
                     no_dist=True)
            out.append(_plain(target))
        assert out[1] == out[0], state


# -- F7: template-free loads never crash inside DCP ------------------------------------------------


def test_a_record_path_that_starts_with_a_position_is_set_aside(tmp_path: Path) -> None:
    """Review 7, F7 (A): ``torch.dcp_items = [[5]]`` made the root a list in ``planner_data``
    and DCP's ``set_element`` failed with AttributeError ('dict' has no 'append'). The state
    is a dict: such a record is set aside and the key rule names the item."""
    for tensors, values, want in [
        ({"w": None}, {"5": 1}, {"5": ("int", 1), "w": ("tensor", [0.0, 0.0])}),
        ({"5": None}, {}, {"5": ("tensor", [0.0, 0.0])}),
    ]:
        root = tmp_path / str(len(list(tmp_path.iterdir())))
        entries: dict[str, Any] = {"torch.dcp_items": [[5]]}
        if values:
            entries["torch.values"] = values
        _version(root, tensors, entries)
        assert PortableStorageReader(str(root)).read_metadata().planner_data["5"] == ("5",)
        assert _plain(_free(PortableStorageReader(str(root)))) == want


def test_a_tensor_below_a_tensor_is_a_checkpoint_error(tmp_path: Path) -> None:
    """Review 7, F7 (B): tensors ``a`` and ``a/b`` went to DCP as the paths ('a',) and ('a',
    'b'); its template-free load descended into the tensor (TypeError). No state dict holds
    both: every DCP load of such a version is refused with a checkpoint error naming them."""
    root = _version(tmp_path, {"a": None, "a/b": None, "c": None}, {})
    for load in (
        lambda r: _free(r),
        lambda r: dcp.load({"a": torch.zeros(2)}, storage_reader=r, no_dist=True),
    ):
        with pytest.raises(BaseException) as info:
            load(PortableStorageReader(root))
        err = _failure(info.value)
        assert isinstance(err, UnsupportedValueError), err
        assert "'a/b' lies below the tensor 'a'" in str(err)
    assert sorted(portable_ckpt.open(root).tensors) == ["a", "a/b", "c"]  # other readers: fine


_COMPS = ["0", "1", "2", "10", "01", "a", "b", "", "~", "~1", "x.y"]
_key = st.lists(st.sampled_from(_COMPS), min_size=1, max_size=4).map("/".join)
_component = st.sampled_from(_COMPS) | st.integers(0, 12)


@settings(max_examples=80, deadline=None)
@given(
    tensors=st.lists(_key, max_size=3, unique=True),
    values=st.dictionaries(_key, st.sampled_from([1, "s", None, 2.5, [], {}, [1, 2], {"q": 1}]),
                           max_size=6),
    record=st.none() | st.lists(st.lists(_component, min_size=1, max_size=4), max_size=5),
)
def test_a_template_free_load_gets_the_state_or_a_checkpoint_error(
    tmp_path_factory: pytest.TempPathFactory,
    tensors: list[str],
    values: dict[str, Any],
    record: list[list[Any]] | None,
) -> None:
    """Whatever the keys and the record (the review's fuzzer as a property): the template-free
    load rebuilds a state, or fails with a checkpoint error or DCP's own "Missing key" (a list
    DCP wants whole, as with its own storage); never with another error from DCP's insides."""
    root = tmp_path_factory.mktemp("v")
    entries: dict[str, Any] = {"torch.values": values}
    if record is not None:
        entries["torch.dcp_items"] = record + [
            [int(c) if c.isdecimal() and str(int(c)) == c else c for c in k.split("/")]
            for k in [*values, *tensors][:2]
        ]
    try:
        _version(root, {k: None for k in tensors or ["zz"]}, entries)
    except CheckpointError:
        return  # the writer refused the version
    try:
        _free(PortableStorageReader(str(root)))
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        err = _failure(e)
        assert isinstance(err, CheckpointError) or "Missing key in checkpoint" in str(err), err
