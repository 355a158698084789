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

from portable_ckpt.convert import convert  # noqa: E402
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
