"""A tensor and a non-tensor value under one key are refused, never half converted (reatk31).

A sharded ``torch.save`` set whose shards give one key a tensor (in one file) and a value (in
another), or one file whose dotted verbatim names meet (``{"a": {"b": t}, "a.b": 1}``),
converted to a tensor and an entry of the same name: the torch export then wrote the value
alone (the tensor silently gone, exit 0) and the DCP export failed on an assertion inside
DCP. A version made so by other means (the core API) is refused by those exports.
"""

# ruff: noqa: E402
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from test_torch_shards import INDEX

import portable_ckpt
from portable_ckpt.convert import convert
from portable_ckpt.errors import UnsupportedValueError

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("keys", ["mapped", "verbatim"])
@pytest.mark.parametrize("value", [5, {"k": 5}], ids=["value", "value-below"])
def test_a_tensor_of_one_shard_and_a_value_of_another_are_refused(
    tmp_path: Path, keys: str, value: object
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    torch.save({"a": torch.ones(2)}, repo / "p-1.bin")
    torch.save({"b": torch.zeros(3), "a": value}, repo / "p-2.bin")
    (repo / INDEX).write_text(json.dumps({"weight_map": {"a": "p-1.bin", "b": "p-2.bin"}}))
    with pytest.raises(UnsupportedValueError) as ei:
        convert(repo, tmp_path / "root", keys=keys)  # type: ignore[arg-type]
    msg = str(ei.value)
    assert "p-1.bin holds tensor 'a'" in msg and "p-2.bin a non-tensor value" in msg, msg
    assert not (tmp_path / "root").exists()


def test_a_value_and_a_tensor_whose_dotted_names_meet_are_refused_verbatim(tmp_path: Path) -> None:
    for n, state in enumerate([{"a": {"b": torch.ones(2)}, "a.b": 1},
                               {"a.b": 1, "a": {"b": torch.ones(2)}}]):
        torch.save(state, tmp_path / f"{n}.pt")
        with pytest.raises(UnsupportedValueError, match=r"both become the key 'a\.b'.*--keys mapped"):
            convert(tmp_path / f"{n}.pt", tmp_path / f"root{n}", keys="verbatim")
        assert not (tmp_path / f"root{n}").exists()
        # mapped keys keep them apart: the same state comes back
        convert(tmp_path / f"{n}.pt", tmp_path / f"m{n}")
        convert(tmp_path / f"m{n}", tmp_path / f"m{n}.pt", dst_format="torch")
        back = torch.load(tmp_path / f"m{n}.pt", weights_only=True)
        assert back["a.b"] == 1 and torch.equal(back["a"]["b"], torch.ones(2))


@pytest.mark.parametrize("target", ["torch", "dcp"])
def test_a_verbatim_export_of_a_tensor_and_an_entry_of_one_name_is_refused(
    tmp_path: Path, target: str
) -> None:
    portable_ckpt.save_arrays(tmp_path / "root", {"a": np.ones(2, np.float32)}, step=1,
                              entries={"a": 5})
    with pytest.raises(UnsupportedValueError, match="'a' is both a tensor and an entry"):
        convert(tmp_path / "root", tmp_path / "out", dst_format=target, keys="verbatim")
    assert not (tmp_path / "out").exists()
