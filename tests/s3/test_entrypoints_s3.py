"""The torch adapter (save, async_save, load resharded), drill and convert with ``s3://`` roots."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import portable_ckpt

from .conftest import S3Env

pytestmark = [pytest.mark.s3, pytest.mark.torch]


def _aws_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "PCK_S3_"))}


def test_torch_save_load_resharded_and_drill_on_s3(s3: S3Env) -> None:
    pytest.importorskip("torch")
    from portable_ckpt.torch.launch import run_group

    root = s3.root("torch")
    env = _aws_env()
    saved = run_group("tests.s3._torch_workers:save_sharded", 2, (root, env), timeout=180)
    ck = portable_ckpt.open(root)
    assert ck.id == saved.results[0]["id"] and ck.step == 7
    assert [v.step for v in portable_ckpt.list_versions(root)] == [6, 7]
    assert len(ck.tensors["w"].ranges) == 2 and ck.verify(deep=True) == []
    loaded = run_group("tests.s3._torch_workers:load_resharded", 3, (root, env), timeout=180)
    assert all(r["ok"] and r["step"] == 7 for r in loaded.results)
    # A restore drill of the S3 version in a fresh process group, recorded beside its manifest.
    r = subprocess.run(
        [sys.executable, "-m", "portable_ckpt.cli.main", "drill", root, "--world-size", "2", "--json"],
        capture_output=True, text=True, timeout=300, env={**os.environ, **env},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["ok"] is True
    assert portable_ckpt.list_versions(root)[-1].drilled


def test_a_large_commit_record_is_read_in_ranged_gets_one_per_rank(s3: S3Env) -> None:
    """A 3-rank load from S3 reads the record as three disjoint ranged GETs, one per rank, and
    never the whole object (the ranks exchange the slices)."""
    pytest.importorskip("torch")
    from portable_ckpt.torch._load_resolve import MIN_SLICE
    from portable_ckpt.torch.launch import run_group

    root = s3.root("sliced")
    env = _aws_env()
    run_group("tests.s3._torch_workers:save_many", 3, (root, env), timeout=180).raise_for_errors()
    ck = portable_ckpt.open(root)
    size = len(ck.storage.read_all(f"{ck.id}/manifest.json", max_size=1 << 30))
    assert size > 2 * MIN_SLICE
    loaded = run_group("tests.s3._torch_workers:load_many", 3, (root, env), timeout=180)
    loaded.raise_for_errors()
    assert all(r["ok"] and r["step"] == 3 for r in loaded.results)
    part = max(MIN_SLICE, -(-size // 3))
    assert [r["reads"] for r in loaded.results] == [
        [["range", 0, part]], [["range", part, part]], [["range", 2 * part, size - 2 * part]]
    ]


def test_convert_hf_to_s3_and_back(s3: S3Env, tmp_path) -> None:
    from safetensors.numpy import load_file, save_file

    from portable_ckpt.convert import convert

    src = tmp_path / "model.safetensors"
    tensors = {"a": np.arange(24, dtype=np.float32).reshape(4, 6), "b": np.ones(5, np.int64)}
    save_file(tensors, str(src))
    root = s3.root("converted")
    convert(str(src), root)
    ck = portable_ckpt.open(root)
    for k, v in tensors.items():
        np.testing.assert_array_equal(ck.read(k), v)
    out = tmp_path / "back"
    convert(root, str(out), dst_format="hf")
    back = load_file(str(next(out.glob("*.safetensors"))))
    for k, v in tensors.items():
        np.testing.assert_array_equal(back[k], v)
