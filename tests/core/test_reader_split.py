"""What callers of ``portable_ckpt.io.reader`` keep after its split (stop 32).

The planning, the entries and the verification left the module for private ones; its public
names, the pickles of ``NO_VALUE`` and the knobs a verification follows stay where they were.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.io import reader

#: ``pickle.dumps(NO_VALUE, protocol=p)`` as the reader wrote them before the split (p = 2, 5).
OLD_PICKLES = [
    b"\x80\x02cportable_ckpt.io.reader\n_NoValue\nq\x00)\x81q\x01.",
    b"\x80\x05\x95+\x00\x00\x00\x00\x00\x00\x00\x8c\x17portable_ckpt.io.reader\x94\x8c\x08_NoValue"
    b"\x94\x93\x94)\x81\x94.",
]


def test_the_public_names_are_imported_from_the_reader() -> None:
    from portable_ckpt.io.reader import (  # noqa: F401
        NO_VALUE,
        PREFIX_BUDGET,
        WINDOW_BYTES,
        Checkpoint,
        ReadRequest,
        ReadStats,
        TensorInfo,
    )

    assert sorted(reader.__all__) == sorted(
        ["NO_VALUE", "PREFIX_BUDGET", "WINDOW_BYTES", "Checkpoint", "ReadRequest", "ReadStats",
         "TensorInfo"]
    )
    assert NO_VALUE is portable_ckpt.NO_VALUE and callable(Checkpoint.verify)


@pytest.mark.parametrize("data", OLD_PICKLES)
def test_a_pickle_of_no_value_made_before_the_split_is_no_value(data: bytes) -> None:
    assert pickle.loads(data) is portable_ckpt.NO_VALUE
    assert pickle.loads(pickle.dumps(portable_ckpt.NO_VALUE)) is portable_ckpt.NO_VALUE


def test_verify_reads_bool_ranges_through_the_readers_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-DTYPE-4 in a verification: a ``bool`` range is read in windows of the reader's
    ``WINDOW_BYTES``, set on ``portable_ckpt.io.reader`` as before the split."""
    flags = np.random.default_rng(5).integers(0, 2, 1 << 20).astype(bool)  # 1 MiB, one range
    portable_ckpt.save_arrays(tmp_path, {"f": flags}, step=1, block_size=1 << 12)
    assert portable_ckpt.open(tmp_path).verify(sample=1.0) == []
    monkeypatch.setattr(reader, "WINDOW_BYTES", 1 << 14)
    ck = portable_ckpt.open(tmp_path)
    assert ck.verify(sample=1.0) == []
    assert 1 << 12 <= ck.stats.peak_scratch_bytes <= 1 << 15  # a window, not the whole MiB
