"""The torch adapter's arguments the API review 31 left open, checked at the call.

``process_group="x"`` was ignored where torch.distributed is not initialised (and failed in
torch's lookup where it is); ``ModelOptimizerState(5)`` was taken until the first save or
restore; ``CheckpointManager.restore(checkpoint=<missing path>)`` read the path twice and ended
as ``PCK-DISTRIBUTED`` ("no version could be restored") wrapping the ``PCK-NOT-FOUND``.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

import portable_ckpt
import portable_ckpt.torch as pckt
from portable_ckpt.errors import CheckpointError, NotFoundError, UsageError
from portable_ckpt.torch.launch import run_group

pytestmark = pytest.mark.torch



@pytest.mark.parametrize("group", ["x", 0, [0, 1]])
def test_a_process_group_that_is_no_group_is_refused_everywhere(
    tmp_path: Path, group: Any
) -> None:
    state = {"w": torch.ones(3)}
    what = f"got {type(group).__name__}"
    with pytest.raises(UsageError, match=f"process_group must be a torch.distributed "
                       f"ProcessGroup .*{what}"):
        pckt.save(state, tmp_path / "r", step=1, process_group=group)
    with pytest.raises(UsageError, match=what):
        pckt.async_save(state, tmp_path / "r", step=1, process_group=group)
    with pytest.raises(UsageError, match=what):
        pckt.CheckpointManager(tmp_path / "m", save_every=1, process_group=group,
                               handle_sigterm=False)
    assert not (tmp_path / "r").exists() and not (tmp_path / "m").exists()
    pckt.save(state, tmp_path / "ok", step=1, continuation="statistical")
    with pytest.raises(UsageError, match=f"load: process_group .*{what}"):
        pckt.load({"w": torch.zeros(3)}, tmp_path / "ok", process_group=group)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((5,), {}, "model must be a torch.nn.Module .* got int 5"),
        (("model",), {}, "model must be a torch.nn.Module .* got str 'model'"),
        ((None,), {}, "model must be a torch.nn.Module .* got NoneType"),
        ((), {"optimizer": 5}, "optimizer must be a torch.optim.Optimizer or a list"),
        ((), {"options": {"full_state_dict": True}},
         "options must be a torch.distributed.checkpoint.state_dict.StateDictOptions or None, "
         "got dict"),
    ],
)
def test_model_optimizer_state_checks_its_arguments_when_made(
    args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    model = torch.nn.Linear(2, 2)
    with pytest.raises(UsageError, match=f"ModelOptimizerState: {message}"):
        pckt.ModelOptimizerState(*(args or (model,)), **kwargs)


def test_model_optimizer_state_with_good_arguments_saves(tmp_path: Path) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mos = pckt.ModelOptimizerState(model, [opt], options=StateDictOptions())
    pckt.save({"app": mos}, tmp_path, step=1, continuation="statistical")
    assert portable_ckpt.open(tmp_path).tensors.keys() >= {"app/model/weight"}


def _restore_missing(rank: int, world: int, root: str) -> dict[str, Any]:
    import torch.distributed as dist

    out: dict[str, Any] = {}
    state = {"w": torch.zeros(3)}
    # A real group is a group: taken (the default group, named).
    pckt.save({"w": torch.ones(3)}, f"{root}/seed", step=4, continuation="statistical",
              process_group=dist.group.WORLD)
    mgr = pckt.CheckpointManager(f"{root}/job", save_every=1, handle_sigterm=False,
                                 continuation="statistical")
    try:
        for name, path, step in (("missing", f"{root}/typo", None),
                                 ("no-such-version", f"{root}/seed/s000000000004-"
                                  "20260101T000000000000Z-0123456789abcdef", None),
                                 ("no-such-step", f"{root}/seed", 9)):
            err = io.StringIO()
            try:
                with contextlib.redirect_stderr(err):
                    mgr.restore(state, checkpoint=path, step=step)
                out[name] = ["restored"]
            except CheckpointError as e:
                out[name] = [e.code, type(e).__name__, e.message, e.path, err.getvalue()]
        info = mgr.restore(state, checkpoint=f"{root}/seed")
        out["seed"] = [info.step if info else None, state["w"].tolist()]
        out["fresh"] = pckt.CheckpointManager(
            f"{root}/fresh", save_every=1, handle_sigterm=False).restore(state)
    finally:
        mgr.close()
    return out


def test_a_missing_explicit_checkpoint_is_not_found_on_every_rank(tmp_path: Path) -> None:
    res = run_group(_restore_missing, 2, (str(tmp_path),), timeout=240, pg_timeout=60)
    res.raise_for_errors()
    for out in res.results:
        for name, path, which in (
            ("missing", tmp_path / "typo", "no committed version"),
            ("no-such-version", None, "no committed version"),
            ("no-such-step", tmp_path / "seed", "no version of step 9"),
        ):
            code, cls, message, where, stderr = out[name]
            assert (code, cls) == ("PCK-NOT-FOUND", "NotFoundError"), out[name]
            assert f"restore: checkpoint='{where}' holds {which}" in message
            if path is not None:
                assert where == str(path)
            assert "reading it once more" not in stderr and "trying the next" not in stderr
        assert out["seed"] == [4, [1.0, 1.0, 1.0]]
        assert out["fresh"] is None  # a fresh job's root: from scratch, as before


def test_a_missing_explicit_checkpoint_in_one_process(tmp_path: Path) -> None:
    with pckt.CheckpointManager(tmp_path / "job", save_every=1, handle_sigterm=False) as mgr:
        with pytest.raises(NotFoundError, match=r"restore: checkpoint=.* holds no committed "
                           r"version .*does not exist") as ei:
            mgr.restore({"w": torch.zeros(3)}, checkpoint=tmp_path / "typo")
    assert ei.value.path == str(tmp_path / "typo")


class _Keys(pckt.StateEntry):
    def __init__(self, value: Any) -> None:
        self.value = value

    def capture(self) -> Any:
        return self.value

    def restore(self, value: Any) -> None:
        self.value = value


def test_a_state_entry_keeps_the_key_rule_for_its_dict_keys(tmp_path: Path) -> None:
    """A StateEntry's int keys are stored as decimal strings, as state dict keys are (and
    were: attack review 2 F5); a float, bool or None key is refused as the core API refuses
    it (it read back as a string), and an int key beside its own string is refused (one of
    them was lost)."""
    w = torch.ones(2)
    pckt.save({"w": w, "e": _Keys({1: {2: "a"}, "b": [{3: 4}]})}, tmp_path / "ok", step=1,
              continuation="statistical")
    back = _Keys(None)
    pckt.load({"w": torch.zeros(2), "e": back}, tmp_path / "ok")
    assert back.value == {"1": {"2": "a"}, "b": [{"3": 4}]}
    for bad, message in (({1.5: 0}, "dict key 1.5 .float. at the top would read back"),
                         ({"x": {True: 0}}, r"dict key True .bool. at \['x'\] would read back"),
                         ({1: 0, "1": 1}, "holds the dict keys 1 and '1', which are stored as "
                                          "one")):
        with pytest.raises(CheckpointError, match=message):
            pckt.save({"w": w, "e": _Keys(bad)}, tmp_path / "bad", step=1,
                      continuation="statistical")
    assert not list((tmp_path / "bad").glob("*/manifest.json"))
