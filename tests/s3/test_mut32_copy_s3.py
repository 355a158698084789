"""Mutation audit 32 of ``io/copy.py`` on the moto server: leftovers at an object-store
destination. Each test names the mutant it kills."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.io.copy import copy_version
from portable_ckpt.storage import open_storage

from .conftest import S3Env

pytestmark = pytest.mark.s3


def test_a_copy_to_s3_right_after_a_killed_one_replaces_its_objects(
    s3: S3Env, tmp_path: Path
) -> None:
    """On an object store a copy's upload of a key replaces whatever is there, and nothing of
    a killed copy can be told from a copy in progress: a retry writes every object again, then
    the commit record, at once (no grace period, no --force). Mutant C43 (leftovers cleared
    as at a local destination): the retry was refused as a copy in progress for 5 minutes."""
    src = tmp_path / "src"
    aid = portable_ckpt.save_arrays(src, {"w": np.arange(512.0)}, step=1).attempt_id
    dst = s3.root("dst")
    name = next(iter(portable_ckpt.open(src / aid).manifest.files))
    open_storage(dst, create=True).put(f"{aid}/{name}", b"a killed copy's object")
    res = copy_version(str(src / aid), dst)
    assert not res.already_present and res.files >= 1
    assert portable_ckpt.open(f"{dst}/{aid}").verify(deep=True) == []
