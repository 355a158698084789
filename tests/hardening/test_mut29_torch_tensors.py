"""Mutation audit 29, the tensor ↔ numpy views a save writes from (:mod:`portable_ckpt.torch._tensors`).

A synchronous save of CPU tensors writes straight from numpy views of the live tensors: a
tensor that needs grad, or one with torch's negative bit, has no plain numpy view, and a
tensor on another device has none at all.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import portable_ckpt  # noqa: E402
import portable_ckpt.torch as pckt  # noqa: E402
from portable_ckpt.errors import UnsupportedValueError  # noqa: E402
from portable_ckpt.torch._tensors import numpy_view  # noqa: E402


def test_a_tensor_that_requires_grad_is_saved_from_a_detached_view(tmp_path: Path) -> None:
    """``numpy()`` refuses a tensor that requires grad (mutant T7 dropped the detach)."""
    w = torch.nn.Parameter(torch.arange(6.0).reshape(2, 3))
    pckt.save({"w": w}, tmp_path, step=1, continuation="statistical")
    assert portable_ckpt.open(tmp_path).read("w").tolist() == w.detach().tolist()


def test_a_negative_view_is_saved_with_the_values_it_shows(tmp_path: Path) -> None:
    """A conjugate's ``imag`` carries the negative bit: its memory holds the other sign (T3)."""
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    shown = z.conj().imag
    assert shown.is_neg()
    pckt.save({"im": shown}, tmp_path, step=1, continuation="statistical")
    assert portable_ckpt.open(tmp_path).read("im").tolist() == [-2.0, 4.0]


def test_numpy_view_refuses_a_tensor_off_the_cpu_naming_its_key() -> None:
    """A meta tensor has no memory to view (mutant T2 left torch's own error)."""
    with pytest.raises(UnsupportedValueError, match=r"tensor 'w': numpy_view needs a CPU tensor"):
        numpy_view(torch.empty(3, device="meta"), key="w")
