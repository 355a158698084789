"""convert() checks its numbers and callback before the destination exists.

Found by the API review 31: ``step=-3`` was refused only after an empty destination directory
was made (and left), ``batch_bytes`` of 0 or -1 and ``max_shard_size=-1`` (one shard per
tensor) were taken, ``max_shard_size=True`` raised ``AttributeError`` and a ``progress`` that
is no callable a ``TypeError`` mid-conversion.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

import portable_ckpt
from portable_ckpt.convert import convert
from portable_ckpt.errors import UsageError

pytestmark = pytest.mark.torch


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"step": -3}, "step must be >= 0, got -3"),
        ({"step": "3"}, "step must be an integer, got str '3'"),
        ({"step": 10**12}, "step must be at most 999999999999"),
        ({"batch_bytes": 0}, "batch_bytes must be >= 1, got 0"),
        ({"batch_bytes": -1}, "batch_bytes must be >= 1, got -1"),
        ({"max_output_bytes": -1}, "max_output_bytes must be >= 0, got -1"),
        ({"progress": 5}, "progress must be a callable or None, got int"),
        ({"dst_format": "hf", "max_shard_size": -1}, r"a size must be a number of bytes in \[1"),
        ({"dst_format": "hf", "max_shard_size": 0}, r"a size must be a number of bytes in \[1"),
        ({"dst_format": "hf", "max_shard_size": True}, "cannot parse size True"),
    ],
)
def test_bad_numbers_are_refused_before_the_destination_exists(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    torch.save({"w": torch.ones(2, 3), "b": torch.zeros(3)}, tmp_path / "m.pt")
    with pytest.raises(UsageError, match=message):
        convert(tmp_path / "m.pt", tmp_path / "out", **kwargs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt"]


def test_good_numbers_convert(tmp_path: Path) -> None:
    torch.save({"w": torch.ones(2, 3), "b": torch.zeros(3)}, tmp_path / "m.pt")
    seen: list[tuple[int, int]] = []
    report = convert(tmp_path / "m.pt", tmp_path / "out", step=3, batch_bytes=1,
                     progress=lambda done, total: seen.append((done, total)))
    assert report.tensors == 2 and seen[-1] == (36, 36)
    assert portable_ckpt.open(tmp_path / "out").step == 3
    hf = convert(tmp_path / "out", tmp_path / "hf", dst_format="hf", max_shard_size=24)
    assert hf.tensors == 2


def test_an_export_option_to_a_portable_target_names_the_python_arguments(tmp_path: Path) -> None:
    """A Python caller passing ``dtype=`` to a portable target was told of ``--select`` and
    ``--dtype`` only (api review 31, left by the reviewer)."""
    torch.save({"w": torch.ones(2)}, tmp_path / "s.pt")
    with pytest.raises(UsageError) as ei:
        convert(tmp_path / "s.pt", tmp_path / "root", dtype="bf16")
    assert "(Python: select, strip_prefix and dtype)" in ei.value.message
    assert "--to hf, dcp or torch (dst_format)" in ei.value.message
    assert not (tmp_path / "root").exists()
