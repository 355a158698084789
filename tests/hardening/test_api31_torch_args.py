"""torch save/load options and CheckpointManager arguments are checked at the call.

Found by the API review 31: ``save``/``async_save`` took ``if_busy="skip"`` (and waited),
``tensor_table="no"`` (and wrote a table), ``max_file_bytes`` of 0, -5 or 1.5, and a timeout
of -1, 0 or NaN, and raised a bare ``ValueError`` for ``timeout="30"`` from the first
collective. ``load(step="10")`` and ``restore(step="10")`` answered "no committed version of
step 10" where one was. The manager took ``codec="gzip"`` (every save failed later, on every
rank), ``grace_seconds=-5``, ``verify_sample="0.5"``, ``ranks_per_node=0``, named
``fast_keep=0`` "keep_last", and ``maybe_save(step, [tensors])`` raised an ``AttributeError``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

import portable_ckpt
import portable_ckpt.torch as pckt
from portable_ckpt.errors import UsageError

pytestmark = pytest.mark.torch


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"if_busy": "skip"}, r"if_busy must be one of \('wait', 'raise'\), got 'skip'"),
        ({"tensor_table": "no"}, "tensor_table must be True, False or None, got 'no'"),
        ({"max_file_bytes": 0}, "max_file_bytes must be >= 1, got 0"),
        ({"max_file_bytes": 1.5}, "max_file_bytes must be an integer, got float 1.5"),
        ({"timeout": "30"}, "timeout must be a finite number of seconds > 0 or None, got str"),
        ({"timeout": -1}, "timeout must be a finite number of seconds > 0 or None, got int -1"),
        ({"timeout": 0.0}, "timeout must be a finite number of seconds > 0"),
        ({"timeout": float("nan")}, "timeout must be a finite number of seconds > 0"),
    ],
)
def test_save_options_are_refused_before_anything_is_written(
    tmp_path: Path, option: dict[str, Any], message: str
) -> None:
    state = {"w": torch.ones(3)}
    for save in (pckt.save, pckt.async_save):
        with pytest.raises(UsageError, match=message):
            save(state, tmp_path, step=1, continuation="statistical", **option)
    assert list(tmp_path.iterdir()) == []
    info = pckt.save(state, tmp_path, step=1, continuation="statistical", timeout=30,
                     max_file_bytes=1, if_busy="raise", tensor_table=False)
    assert info.step == 1


def test_a_misspelt_save_keyword_names_the_call(tmp_path: Path) -> None:
    """``save(..., stpe=3)`` said "SaveOptions.__init__() got an unexpected keyword argument":
    a class the caller never named. It is the call's TypeError now, before anything is done."""
    state = {"w": torch.ones(3)}
    for save, name in ((pckt.save, "save"), (pckt.async_save, "async_save")):
        with pytest.raises(TypeError, match=rf"^{name}\(\) got an unexpected keyword argument 'stpe'$"):
            save(state, tmp_path, step=1, stpe=3)  # type: ignore[call-arg]
    assert list(tmp_path.iterdir()) == []


def test_load_and_restore_check_step_and_timeout(tmp_path: Path) -> None:
    state = {"w": torch.arange(3.0)}
    pckt.save(state, tmp_path, step=10, continuation="statistical")
    target = {"w": torch.zeros(3)}
    bad_steps: list[tuple[Any, str]] = [
        ("10", "load: step must be an integer, got str '10'"),
        (-1, "load: step must be >= 0, got -1"),
        (10.0, "got float 10.0"),
    ]
    for bad, message in bad_steps:
        with pytest.raises(UsageError, match=message):
            pckt.load(target, tmp_path, step=bad)
    with pytest.raises(UsageError, match="load: timeout must be a finite number"):
        pckt.load(target, tmp_path, timeout="60")  # type: ignore[arg-type]
    assert target["w"].tolist() == [0.0, 0.0, 0.0]  # refused before anything was read
    assert pckt.load(target, tmp_path, step=10, timeout=60).step == 10
    with pckt.CheckpointManager(tmp_path, handle_sigterm=False) as mgr:
        with pytest.raises(UsageError, match="restore: step must be an integer, got str '10'"):
            mgr.restore(target, step="10")  # type: ignore[arg-type]
        info = mgr.restore(target, step=10)
        assert info is not None and info.step == 10


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"codec": "gzip"}, r"codec must be one of \('none', 'zstd'\), got 'gzip'"),
        ({"timeout": "30"}, "timeout must be a finite number of seconds > 0 or None, got str"),
        ({"timeout": 0}, "timeout must be a finite number of seconds > 0"),
        ({"grace_seconds": -5}, "grace_seconds must be a number of seconds >= 0, got -5"),
        ({"grace_seconds": "x"}, "grace_seconds must be a number of seconds >= 0, got 'x'"),
        ({"verify_sample": "0.5"}, r"verify_sample must be a fraction in \[0, 1\], got '0.5'"),
        ({"verify_sample": True}, r"verify_sample must be a fraction in \[0, 1\], got True"),
        ({"ranks_per_node": 0}, "ranks_per_node must be >= 1, got 0"),
        ({"fast_root": "FAST", "fast_keep": 0}, "fast_keep must be >= 1, got 0"),
    ],
)
def test_manager_arguments_are_refused_at_construction(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    if kwargs.get("fast_root") == "FAST":
        kwargs["fast_root"] = tmp_path / "fast"
    with pytest.raises(UsageError, match=message):
        pckt.CheckpointManager(tmp_path / "root", save_every=1, handle_sigterm=False, **kwargs)
    assert not (tmp_path / "root").exists() or list((tmp_path / "root").iterdir()) == []


def test_a_state_or_metrics_of_the_wrong_kind_is_named(tmp_path: Path) -> None:
    with pckt.CheckpointManager(tmp_path, save_every=1, handle_sigterm=False) as mgr:
        for call in (mgr.maybe_save, mgr.save):
            with pytest.raises(UsageError, match=r"save: state must be a dict .*got list"):
                call(1, [torch.ones(2)])  # type: ignore[arg-type]
            with pytest.raises(UsageError, match=r"save: metrics must be a dict .* or None"):
                call(1, {"w": torch.ones(2)}, metrics=[0.5])  # type: ignore[arg-type]
        assert mgr.maybe_save(1, {"w": torch.ones(2)}, metrics={"loss": 0.5})
    assert [v.step for v in portable_ckpt.list_versions(tmp_path)] == [1]


def test_restore_rng_of_no_object_is_an_entry_schema_error() -> None:
    from portable_ckpt.errors import EntrySchemaError

    for bad in (None, [1, 2], "state"):
        with pytest.raises(EntrySchemaError, match=r"expected an object .*got "):
            pckt.restore_rng(bad)  # type: ignore[arg-type]
    saved = pckt.capture_rng()
    first = torch.rand(2)
    pckt.restore_rng(saved)
    assert torch.equal(torch.rand(2), first)


def test_portable_storage_writer_checks_file_size_and_table_at_construction(
    tmp_path: Path,
) -> None:
    from portable_ckpt.torch.dcp_saving import PortableStorageWriter

    for bad, message in ((0, "max_file_bytes must be >= 1, got 0"),
                         (1.5, "max_file_bytes must be an integer, got float 1.5")):
        with pytest.raises(UsageError, match=message):
            PortableStorageWriter(tmp_path, step=1, max_file_bytes=bad)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="tensor_table must be True, False or None, got 'no'"):
        PortableStorageWriter(tmp_path, step=1, tensor_table="no")  # type: ignore[arg-type]
    assert PortableStorageWriter(tmp_path, step=1, max_file_bytes=1).max_file_bytes == 1
    assert list(tmp_path.iterdir()) == []


def test_restore_of_an_explicit_checkpoint_honours_step(tmp_path: Path) -> None:
    """``restore(checkpoint=v, step=99)`` loaded ``v`` (step 1) and dropped ``step``; a
    ``checkpoint`` of 5 was a ``TypeError`` from deep in the restore."""
    state = {"w": torch.arange(3.0)}
    pckt.save(state, tmp_path / "seed", step=1, continuation="statistical")
    pckt.save(state, tmp_path / "seed", step=2, continuation="statistical")
    (v1, _) = portable_ckpt.list_versions(tmp_path / "seed")
    target = {"w": torch.zeros(3)}
    with pckt.CheckpointManager(tmp_path / "job", handle_sigterm=False) as mgr:
        with pytest.raises(UsageError, match=f"version {v1.id} holds step 1, not 99"):
            mgr.restore(target, checkpoint=v1.path, step=99)
        with pytest.raises(UsageError, match="a root is a path or URL string, got int 5"):
            mgr.restore(target, checkpoint=5)  # type: ignore[arg-type]
        assert target["w"].tolist() == [0.0, 0.0, 0.0]
        got = mgr.restore(target, checkpoint=v1.path, step=1)
        assert got is not None and got.checkpoint_id == v1.id
        # A root as checkpoint: its version of step 1, not its newest (step 2).
        got = mgr.restore(target, checkpoint=tmp_path / "seed", step=1)
        assert got is not None and got.checkpoint_id == v1.id


def test_a_manager_on_a_version_directory_is_refused_at_construction(tmp_path: Path) -> None:
    """It was constructed; every save then failed in the background (a save into a version
    directory is refused) until ``max_failed_saves`` stopped the job."""
    info = pckt.save({"w": torch.ones(2)}, tmp_path / "root", step=1, continuation="statistical")
    for kwargs in ({"root": info.path}, {"root": tmp_path / "job", "fast_root": info.path}):
        with pytest.raises(UsageError, match="is a version directory: a save there would nest"):
            pckt.CheckpointManager(**kwargs, save_every=1, handle_sigterm=False)
    assert sorted(p.name for p in Path(info.path).iterdir()) == ["data", "index", "manifest.json"]
    assert [v.step for v in portable_ckpt.list_versions(tmp_path / "root")] == [1]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"save_every": "5"}, "save_every must be a positive number or None, got '5'"),
        ({"save_every_seconds": "60"}, "save_every_seconds must be a positive number or None"),
        ({"save_steps": 5}, "save_steps must be a collection of steps, got int 5"),
        ({"save_steps": "12"}, "save_steps must be a collection of steps, got str '12'"),
        ({"events": 5}, "events must be a file path or None, got int 5"),
        ({"events": "DIR"}, "is a directory: name a file in it"),
    ],
)
def test_policy_and_events_of_the_wrong_kind_are_named(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    """``save_every="5"`` and ``save_steps=5`` raised ``TypeError`` from the policy, ``events=5``
    one from ``os.fspath``; a directory as ``events`` was taken and no event was ever written."""
    if kwargs.get("events") == "DIR":
        kwargs["events"] = tmp_path
    with pytest.raises(UsageError, match=message):
        pckt.CheckpointManager(tmp_path / "root", handle_sigterm=False, **kwargs)
    assert not (tmp_path / "root").exists()


def test_a_data_position_is_counts() -> None:
    """``DataPosition(epoch=-1)`` was taken and ``epoch="1"`` became 1 (``int()``): a position
    the loader then resumed from (api review 31, left by the reviewer). numpy integers stay
    welcome (a loader's counters often are)."""
    import numpy as np

    for kw, says in (({"epoch": -1}, "epoch must be >= 0"), ({"epoch": "1"}, "epoch must be an integer"),
                     ({"global_sample_index": 2.5}, "global_sample_index must be an integer"),
                     ({"epoch": True}, "epoch must be an integer")):
        with pytest.raises(UsageError, match=f"DataPosition: {says}"):
            pckt.DataPosition(**kw)
    pos = pckt.DataPosition(np.int64(3), np.int32(40))
    assert (pos.epoch, pos.global_sample_index) == (3, 40) and type(pos.epoch) is int
