"""Mutation audit 30 (conversion layer), how a ``torch.save`` file's structure becomes keys.

``data.pkl`` is read symbolically (nothing is imported or called); what it holds converts as
``torch.load(weights_only=True)`` reads it, or is refused: never a version with less in it.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import portable_ckpt  # noqa: E402
from portable_ckpt.convert import convert  # noqa: E402
from tests.convert.test_convert_attack2 import _torch_zip  # noqa: E402
from tests.convert.test_source_integrity import _refused  # noqa: E402

pytestmark = pytest.mark.torch


class _Pairs(collections.OrderedDict):  # type: ignore[type-arg]
    """Pickled as ``OrderedDict(list of pairs)``: its items are the constructor's argument."""

    def __reduce__(self) -> Any:
        return (collections.OrderedDict, (list(self.items()),))


def test_a_dict_built_from_constructor_arguments_is_refused_not_emptied(tmp_path: Path) -> None:
    """A state whose items are ``OrderedDict``'s constructor argument (a custom ``__reduce__``;
    picklers write items with ``SETITEMS``) loads whole with ``torch.load``; it converted to an
    empty version, exit 0 and no warning (the walk read the missing ``SETITEMS`` as no items).
    Now it is refused as not convertible, naming it, and nothing is written."""
    src = tmp_path / "pairs.pt"
    torch.save(_Pairs(w=torch.arange(4.0), lr=0.5), src)
    assert torch.load(src, weights_only=True)["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    err = _refused(src, tmp_path / "root", "PCK-UNSUPPORTED-VALUE")
    assert "OrderedDict built from constructor arguments" in err.message


def test_a_dict_with_a_bool_key_is_not_converted(tmp_path: Path) -> None:
    """JSON keys are strings: a ``True`` key would come back as ``"True"``, so the dict is
    named as not convertible and nothing is written (mutant M27 stored it as "True")."""
    src = tmp_path / "s.pt"
    torch.save({"w": torch.ones(2), "v": {True: 1}}, src)
    err = _refused(src, tmp_path / "root", "PCK-UNSUPPORTED-VALUE")
    assert "a dict key of type bool" in err.message and "v:" in err.message


def test_a_tensor_and_a_value_whose_keys_become_one_are_refused(tmp_path: Path) -> None:
    """``1`` and ``"1"`` of one dict both become the key ``1``: a tensor under one and a value
    under the other are refused as a collision, naming both (mutant T05 let them through, one
    as a tensor and one as a value of the same key)."""
    src = tmp_path / "s.pt"
    torch.save({1: torch.ones(2), "1": 5}, src)
    err = _refused(src, tmp_path / "root", "PCK-UNSUPPORTED-VALUE")
    assert "[1] and ['1'] both become the key '1'" in err.message


def test_a_parameter_with_python_state_converts_as_its_tensor(tmp_path: Path) -> None:
    """``torch.save`` writes a parameter carrying Python attributes with
    ``_rebuild_parameter_with_state``; it converts as its tensor, like a plain parameter
    (mutant T07 left it a record: skipped as not convertible)."""
    p = torch.nn.Parameter(torch.arange(3.0))
    p.tag = "head"  # type: ignore[attr-defined]
    src = tmp_path / "p.pt"
    torch.save({"p": p, "q": torch.nn.Parameter(torch.ones(2))}, src)
    assert b"_rebuild_parameter_with_state" in _data_pkl(src)
    convert(str(src), str(tmp_path / "root"))
    ck = portable_ckpt.open(str(tmp_path / "root"))
    assert ck.read("p").tolist() == [0.0, 1.0, 2.0] and ck.read("q").tolist() == [1.0, 1.0]


def _data_pkl(path: Path) -> bytes:
    import zipfile

    with zipfile.ZipFile(path) as z:
        return z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))


def test_a_data_pkl_whose_shared_references_expand_past_its_budget_is_a_limit_error(
    tmp_path: Path,
) -> None:
    """``x = [x, x]`` forty times is a few hundred bytes of ``data.pkl`` describing 2^40
    values: the walk stops at its budget with PCK-LIMIT (mutant T10: PCK-SHARD-HEADER, as if
    the file were damaged)."""
    import pickle

    x: Any = []
    for _ in range(40):
        x = [x, x]
    pkl = pickle.dumps({"step": 1, "v": x}, protocol=2)
    assert len(pkl) < 1000
    src = _torch_zip(tmp_path / "bomb.pt", pkl)
    err = _refused(src, tmp_path / "root", "PCK-LIMIT")
    assert "expand to more than" in err.message
