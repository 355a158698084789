"""A load's "missing" errors say what the checkpoint holds instead (review 3, B4).

A key stored as the other kind (a tensor where the target now has an int) or under a renamed
prefix used to be reported as absent with the advice ``strict=False``, which then loaded nothing
for it and reported success.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from portable_ckpt.errors import EntryMissingError, TensorMissingError

torch = pytest.importorskip("torch")
pckt = pytest.importorskip("portable_ckpt.torch")


def test_a_key_stored_as_the_other_kind_is_named_so(tmp_path: Path) -> None:
    pckt.save({"epoch": 3, "bias": torch.ones(2)}, tmp_path, step=1)
    with pytest.raises(TensorMissingError, match=r"holds 'epoch' as a plain value, the target a "
                       r"tensor") as e1:
        pckt.load({"epoch": torch.zeros(1), "bias": torch.zeros(2)}, tmp_path)
    assert "strict=False" not in str(e1.value)
    with pytest.raises(EntryMissingError, match=r"holds 'bias' as a tensor, the target a plain"):
        pckt.load({"epoch": 0, "bias": 0}, tmp_path)


def test_a_renamed_prefix_names_the_stored_keys(tmp_path: Path) -> None:
    pckt.save({"model": {"weight": torch.ones(3), "bias": torch.ones(3)}}, tmp_path, step=1)
    with pytest.raises(TensorMissingError, match=r"look alike: \['model/(weight|bias)'") as e:
        pckt.load({"module": {"weight": torch.zeros(3), "bias": torch.zeros(3)}}, tmp_path)
    assert "renamed prefix" in str(e.value)


def test_a_key_with_nothing_near_keeps_the_strict_advice(tmp_path: Path) -> None:
    pckt.save({"w": torch.ones(3)}, tmp_path, step=1)
    with pytest.raises(TensorMissingError, match="pass strict=False"):
        pckt.load({"w": torch.zeros(3), "completely_different": torch.zeros(1)}, tmp_path)
