"""Names that moved out of ``portable_ckpt.io.versions`` stay importable from it (docs/upgrading.md)."""

from __future__ import annotations

import importlib

import pytest

import portable_ckpt
from portable_ckpt.io import versions


@pytest.mark.parametrize("name", sorted(versions._MOVED))
def test_a_moved_name_is_the_same_object_from_its_old_module(name: str) -> None:
    new = importlib.import_module(versions._MOVED[name])
    assert getattr(versions, name) is getattr(new, name)
    assert name in new.__all__


def test_the_package_names_resolve_to_their_modules() -> None:
    from portable_ckpt.io.gc import gc
    from portable_ckpt.io.versions import list_versions

    assert portable_ckpt.gc is gc and portable_ckpt.list_versions is list_versions
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = versions.nothing  # type: ignore[attr-defined]
