"""Mutation audit 23: tensor-table column lengths (R-TABLE-5) the rule tests left unpinned."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

import portable_ckpt

from ._util import expect_code, save_sharded
from .test_r_table import TENSORS, columns, install_columns, load_table


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("mut23-table")
    tensors: dict[str, tuple[np.ndarray, Sequence[int]]] = dict(TENSORS)
    m = save_sharded(root, tensors, writer_tables=[0])
    assert m.tensor_table is not None
    return root, m.attempt_id


@pytest.fixture
def vdir(base: tuple[Path, str], tmp_path: Path) -> Path:
    shutil.copytree(base[0], tmp_path / "root")
    return tmp_path / "root" / base[1]


def test_coordinate_columns_longer_than_the_records_need_are_refused(vdir: Path) -> None:
    # One value more in both 'range.offsets' and 'range.lengths' (so the two agree with each
    # other): Σ ranges·ndim no longer matches their length, PCK-SCHEMA (R-TABLE-5).
    cols = columns(load_table(vdir))
    for name in ("range.offsets", "range.lengths"):
        cols[name] = np.append(cols[name], np.array([1], cols[name].dtype))
    install_columns(vdir, cols)
    expect_code("PCK-SCHEMA", portable_ckpt.open, vdir)


def test_unchanged_columns_reinstalled_still_open(vdir: Path) -> None:
    install_columns(vdir, columns(load_table(vdir)))
    ck = portable_ckpt.open(vdir)
    np.testing.assert_array_equal(ck.read("a"), TENSORS["a"][0])
