"""Mutation audit 29, filling a target (:mod:`portable_ckpt.torch.loading`).

Each test saves and loads as a user would (in one process, or in a group of two started by
``run_group`` where only a group shows it), and checks what the earlier tests left open: which
stored keys an optimizer's grown state turns into ints, which targets are ties, which casts
load, which entries are restored (RNG last), and what ``LoadInfo`` reports.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import portable_ckpt  # noqa: E402
import portable_ckpt.torch as pckt  # noqa: E402
from portable_ckpt.errors import EntryMissingError, TensorMissingError, UsageError  # noqa: E402
from portable_ckpt.torch._load_casts import CONVERT_BATCH_BYTES  # noqa: E402
from portable_ckpt.torch.launch import run_group  # noqa: E402

ROOT = str(Path(__file__).resolve().parents[2])


def test_a_version_directory_and_another_attempt_id_are_refused(tmp_path: Path) -> None:
    """Mutant D5 loaded the directory's version and ignored the id."""
    first = pckt.save({"w": torch.ones(2)}, tmp_path, step=1, continuation="statistical")
    second = pckt.save({"w": torch.ones(2) * 2}, tmp_path, step=2, continuation="statistical")
    target = {"w": torch.zeros(2)}
    with pytest.raises(UsageError, match=f"is version {first.checkpoint_id}, but checkpoint_id="):
        pckt.load(target, tmp_path / first.checkpoint_id, checkpoint_id=second.checkpoint_id)
    assert target["w"].tolist() == [0.0, 0.0]
    assert pckt.load(target, tmp_path / first.checkpoint_id,
                     checkpoint_id=first.checkpoint_id).step == 1


def test_only_canonical_decimal_keys_of_a_grown_optimizer_state_become_ints(
    tmp_path: Path,
) -> None:
    """An optimizer's ``state`` (beside ``param_groups``) grows keyed by int; ``"01"`` is no
    int's spelling and stays a string (mutant D10 made it 1, beside the stored 1)."""
    groups = [{"params": [0, 1], "lr": 0.1}]
    saved = {"o": {"state": {"1": {"m": torch.ones(2)}, "01": {"m": torch.zeros(2)}},
                   "param_groups": groups}}
    pckt.save(saved, tmp_path, step=1, continuation="statistical")
    target: dict[str, Any] = {"o": {"state": {}, "param_groups": [{"params": [0, 1], "lr": 0.5}]}}
    pckt.load(target, tmp_path)
    state = target["o"]["state"]
    assert set(state) == {1, "01"}
    assert state[1]["m"].tolist() == [1.0, 1.0] and state["01"]["m"].tolist() == [0.0, 0.0]


def test_an_empty_dict_beside_an_optimizers_state_keeps_string_keys(tmp_path: Path) -> None:
    """Only the ``state`` member itself is keyed by parameter index; ``state_extra`` (its name
    merely starts so) keeps the stored keys (mutant D11 turned them into ints)."""
    groups = [{"params": [0], "lr": 0.1}]
    saved = {"o": {"state": {"0": {"m": torch.ones(1)}}, "param_groups": groups,
                   "state_extra": {"7": torch.ones(1)}}}
    pckt.save(saved, tmp_path, step=1, continuation="statistical")
    target: dict[str, Any] = {"o": {"state": {}, "param_groups": [{"params": [0], "lr": 0.5}],
                                    "state_extra": {}}}
    pckt.load(target, tmp_path)
    assert list(target["o"]["state"]) == [0] and list(target["o"]["state_extra"]) == ["7"]


def test_load_info_counts_target_bytes_and_the_tensors_with_elements(tmp_path: Path) -> None:
    """A zero-size target holds no box: not counted as loaded (mutant D15); the target
    bytes are elements times their size, a cast one's in the target's dtype (mutant D16)."""
    pckt.save({"w": torch.ones(3), "h": torch.ones(2, dtype=torch.float64), "z": torch.zeros(0, 2)},
              tmp_path, step=1, continuation="statistical")
    info = pckt.load({"w": torch.zeros(3), "h": torch.zeros(2, dtype=torch.float32),
                      "z": torch.zeros(0, 2)}, tmp_path)
    assert info.tensors_loaded == 2 and info.elements_covered == 5
    assert info.target_bytes == 3 * 4 + 2 * 4


def _strided_load(rank: int, world: int, root: str) -> dict[str, Any]:
    """Rank ``rank`` of 2: load ``w`` into a ``_StridedShard(0, split_factor=3)`` DTensor."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import _StridedShard

    mesh = init_device_mesh("cpu", (world,))
    local = torch.full((3, 2), -1.0)
    dt = DTensor.from_local(local, mesh, [_StridedShard(0, split_factor=3)],
                            shape=torch.Size((6, 2)), stride=(2, 1), run_check=False)
    info = pckt.load({"w": dt}, root, allow_statistical=True, timeout=30)
    return {"local": local.tolist(), "covered": info.elements_covered}


def test_a_strided_shard_of_several_boxes_gets_each_boxs_rows(tmp_path: Path) -> None:
    """Three chunks of two rows over two ranks: rank 0 holds rows 0, 2 and 4, three boxes of
    one local tensor, each read into its own slice of it (mutant D14 read every box into the
    whole local tensor)."""
    w = torch.arange(12.0).reshape(6, 2)
    pckt.save({"w": w}, tmp_path, step=1, continuation="statistical")
    res = run_group(f"{__name__}:_strided_load", 2, (str(tmp_path),), timeout=120,
                    pg_timeout=45, sys_path=[ROOT])
    res.raise_for_errors()
    got = list(res.results)
    assert got[0] == {"local": w[[0, 2, 4]].tolist(), "covered": 6}
    assert got[1] == {"local": w[[1, 3, 5]].tolist(), "covered": 6}


def test_a_base_and_a_view_at_its_start_are_a_tie_not_a_partial_overlap(tmp_path: Path) -> None:
    """The base sorts before the views that start with it and fills them (mutant D19 put the
    short view first: the base then overlapped it in part and the load was refused)."""
    pckt.save({"head": torch.arange(2.0), "w": torch.arange(4.0)}, tmp_path, step=1,
              continuation="statistical")
    base = torch.zeros(4)
    info = pckt.load({"head": base[:2], "w": base}, tmp_path)
    assert base.tolist() == [0.0, 1.0, 2.0, 3.0] and info.tensors_loaded == 2


def test_a_target_read_through_a_copy_in_its_own_dtype_lists_no_cast(tmp_path: Path) -> None:
    """A negative view is filled through ``copy_``: no dtype changes, so ``LoadInfo.casts``
    stays empty (mutant D24 listed a float32 → float32 cast)."""
    pckt.save({"w": torch.tensor([1.0, 2.0])}, tmp_path, step=1, continuation="statistical")
    target = torch.zeros(2)._neg_view()
    info = pckt.load({"w": target}, tmp_path)
    assert target.tolist() == [1.0, 2.0] and info.casts == []


def test_half_a_step_above_the_largest_float8_rounds_to_it_and_loads(tmp_path: Path) -> None:
    """464 is 448 plus half of float8_e4m3fn's last step: it rounds (to even) to 448 and
    loads; anything above is out of range (mutant D32 refused 464 too)."""
    pckt.save({"w": torch.tensor([464.0, 1.0])}, tmp_path, step=1, continuation="statistical")
    target = {"w": torch.zeros(2, dtype=torch.float8_e4m3fn)}
    pckt.load(target, tmp_path)
    assert target["w"].float().tolist() == [448.0, 1.0]
    pckt.save({"w": torch.tensor([465.0, 1.0])}, tmp_path, step=2, continuation="statistical")
    with pytest.raises(UsageError, match="1 value\\(s\\) out of the target type's range"):
        pckt.load({"w": torch.zeros(2, dtype=torch.float8_e4m3fn)}, tmp_path)


def test_a_converted_target_of_the_batch_size_is_read_alone(tmp_path: Path) -> None:
    """Converted targets are read in batches of CONVERT_BATCH_BYTES: a target of that size
    goes alone, so the temporary peak is its size (mutant D23 read both in one batch)."""
    big = torch.zeros(CONVERT_BATCH_BYTES // 8, dtype=torch.float64)
    small = torch.ones(1024, dtype=torch.float64)
    pckt.save({"big": big, "small": small}, tmp_path, step=1, continuation="statistical")
    info = pckt.load({"big": torch.ones(big.numel()), "small": torch.zeros(1024)}, tmp_path)
    assert info.peak_temp_bytes == CONVERT_BATCH_BYTES


def test_a_state_shaped_dict_of_no_optimizer_is_no_fresh_optimizer_state(tmp_path: Path) -> None:
    """``m/state/<x>/<y>`` without ``param_groups`` beside it is no optimizer: a key the
    version lacks there fails a strict load (mutant D36 kept it as fresh optimizer state)."""
    pckt.save({"m": {"state": {"a": {"b": torch.ones(1)}}}}, tmp_path, step=1,
              continuation="statistical")
    target = {"m": {"state": {"a": {"b": torch.zeros(1)}, "c": {"b": torch.zeros(1)}}}}
    with pytest.raises(TensorMissingError, match="'m/state/c/b' is in the target state"):
        pckt.load(target, tmp_path)


def test_a_tensor_directly_under_an_optimizers_state_is_no_fresh_state(tmp_path: Path) -> None:
    """Fresh state is ``<optimizer>/state/<param>/<member>``; ``o/state/5`` itself is not
    (mutant D37 took any depth below ``state``, and a strict load passed)."""
    groups = [{"params": [0, 5], "lr": 0.1}]
    pckt.save({"o": {"state": {"0": {"m": torch.ones(1)}}, "param_groups": groups}}, tmp_path,
              step=1, continuation="statistical")
    target = {"o": {"state": {"0": {"m": torch.zeros(1)}, "5": torch.zeros(1)},
                    "param_groups": [{"params": [0, 5], "lr": 0.1}]}}
    with pytest.raises(TensorMissingError, match="'o/state/5' is in the target state"):
        pckt.load(target, tmp_path)


class _Draws:
    """A Stateful whose ``load_state_dict`` draws from torch's global generator."""

    def state_dict(self) -> dict[str, Any]:
        return {"n": 1}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        torch.rand(4)


def test_the_rng_is_restored_after_every_object_has_loaded(tmp_path: Path) -> None:
    """A load has no RNG side effect: the next draw is the one the saved run made next, even
    when an object draws while it loads (mutant D44 restored the RNG in entry order)."""
    torch.manual_seed(7)
    pckt.save({"rng": pckt.RNGState(), "obj": _Draws()}, tmp_path, step=1)
    expected = torch.rand(3)
    torch.manual_seed(123)
    pckt.load({"rng": pckt.RNGState(), "obj": _Draws()}, tmp_path)
    assert torch.equal(torch.rand(3), expected)


def test_a_per_rank_entry_is_not_rebuilt_from_plain_values(tmp_path: Path) -> None:
    """Only a global entry is rebuilt from ``torch.values`` leaves (a DCP save's scheduler);
    a data position is each rank's own, and its plain leaves are no rank's entry (mutant D45
    restored it from them)."""
    pckt.save({"pos": {"epoch": 3, "global_sample_index": 5}, "w": torch.ones(1)}, tmp_path,
              step=1, continuation="statistical")
    pos = pckt.DataPosition()
    with pytest.raises(EntryMissingError, match="entry 'pos' \\(pck:data-position/1\\) is in"):
        pckt.load({"pos": pos, "w": torch.zeros(1)}, tmp_path)
    info = pckt.load({"pos": pos, "w": torch.zeros(1)}, tmp_path, strict=False)
    assert info.missing_keys == ["pos"] and (pos.epoch, pos.restored) == (0, False)


def test_stored_tensors_the_target_lacks_are_unexpected_keys(tmp_path: Path) -> None:
    """Mutant D48 reported none of them."""
    pckt.save({"w": torch.ones(1), "extra": torch.ones(2)}, tmp_path, step=1,
              continuation="statistical")
    info = pckt.load({"w": torch.zeros(1)}, tmp_path)
    assert info.unexpected_keys == ["extra"]


def _grow_load(rank: int, world: int, root: str) -> dict[str, Any]:
    """Rank ``rank`` of 2: load into an empty dict (the place of what is stored below it)."""
    target: dict[str, Any] = {"e": {}, "w": torch.zeros(1)}
    info = pckt.load(target, root, allow_statistical=True, timeout=30)
    return {"grown": sorted(target["e"]), "unexpected": info.unexpected_keys}


def test_a_group_grows_only_tensors_stored_whole_below_an_empty_dict(tmp_path: Path) -> None:
    """In a group a tiled tensor below an empty dict stays unexpected (made whole on every
    rank it could exhaust the host); mutant D47 grew it in a group too."""
    portable_ckpt.save_arrays(tmp_path, {"e/tiled": np.ones((4, 4), np.float32),
                                         "e/whole": np.ones(3, np.float32),
                                         "w": np.ones(1, np.float32)},
                              step=1, tiles={"e/tiled": (2, 2)})
    res = run_group(f"{__name__}:_grow_load", 2, (str(tmp_path),), timeout=120, pg_timeout=45,
                    sys_path=[ROOT])
    res.raise_for_errors()
    assert list(res.results) == [{"grown": ["whole"], "unexpected": ["e/tiled"]}] * 2


def _save_dropped(rank: int, world: int, root: str) -> None:
    """Rank ``rank`` of 2 saves a data position whose policy drops it on another world size."""
    pckt.save({"pos": pckt.DataPosition(epoch=rank + 1, world_size_policy="drop"),
               "w": torch.ones(2)}, root, step=1, timeout=30)


def test_a_dropped_entry_leaves_the_fresh_state_on_another_world_size(tmp_path: Path) -> None:
    """Saved by two ranks, loaded by one: policy ``drop`` gives no value and the target's
    position stays as it was (mutant D43 handed the no-value marker to ``restore``)."""
    res = run_group(f"{__name__}:_save_dropped", 2, (str(tmp_path),), timeout=120,
                    pg_timeout=45, sys_path=[ROOT])
    res.raise_for_errors()
    pos = pckt.DataPosition(epoch=9)
    info = pckt.load({"pos": pos, "w": torch.zeros(2)}, tmp_path, allow_statistical=True)
    assert (pos.epoch, pos.restored) == (9, False) and info.contract == "statistical"


def _cast_load(rank: int, world: int, root: str) -> str:
    """Rank ``rank`` of 2 loads a float64 tensor into float32; returns what it said."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        pckt.load({"w": torch.zeros(2, dtype=torch.float32)}, root, allow_statistical=True,
                  timeout=30)
    return err.getvalue()


def test_only_rank_0_says_that_a_load_casts(tmp_path: Path) -> None:
    """One line for the job, not one per rank (mutant D51 let every rank say it)."""
    pckt.save({"w": torch.tensor([0.1, 0.2], dtype=torch.float64)}, tmp_path, step=1,
              continuation="statistical")
    res = run_group(f"{__name__}:_cast_load", 2, (str(tmp_path),), timeout=120, pg_timeout=45,
                    sys_path=[ROOT])
    res.raise_for_errors()
    said = list(res.results)
    assert said[0].count("are cast to the target's float32") == 1 and said[1] == ""
