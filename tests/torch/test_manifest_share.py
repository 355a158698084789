"""A load's rank 0 sends the bytes of manifest.json it read; the others check them as read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.errors import CheckpointError
from portable_ckpt.io.versions import classify_attempt, latest, load_manifest
from portable_ckpt.storage import open_storage
from portable_ckpt.torch._load_resolve import received as _received
from portable_ckpt.torch._load_resolve import record_bytes as _record_bytes


def _saved(tmp_path: Path) -> tuple[str, bytes]:
    portable_ckpt.save_arrays(tmp_path, {"w": np.arange(12.0).reshape(3, 4)}, step=3)
    ck = portable_ckpt.open(tmp_path)
    return ck.id, (tmp_path / ck.id / "manifest.json").read_bytes()


def test_manifests_read_from_storage_keep_their_bytes(tmp_path: Path) -> None:
    attempt, raw = _saved(tmp_path)
    storage = open_storage(str(tmp_path), create=False)
    assert load_manifest(storage, attempt).source == raw
    c = classify_attempt(storage, attempt)
    assert c.manifest is not None and c.manifest.source == raw
    found, man = latest(storage)
    assert found == attempt and _record_bytes(man) == raw  # sent as read, not re-encoded
    # A record built in memory has no bytes: it is encoded, and parses back to itself.
    man.source = None
    assert _received(_record_bytes(man), attempt) == load_manifest(storage, attempt)


def test_received_bytes_are_checked_like_a_record_from_storage(tmp_path: Path) -> None:
    attempt, raw = _saved(tmp_path)
    assert _received(raw, attempt) == load_manifest(open_storage(str(tmp_path)), attempt)
    for bad, code in [
        (raw[: len(raw) // 2], "PCK-JSON-INVALID"),  # cut short
        (raw.replace(b'"step":3', b'"step":3,"step":4'), "PCK-JSON-INVALID"),  # duplicate key
        (raw.replace(attempt.encode(), b"2026-01-01T00-00-00.000000000Z-deadbeef"), None),
    ]:
        with pytest.raises(CheckpointError) as err:
            _received(bad, attempt)
        assert "(from rank 0)" in str(err.value)
        if code is not None:
            assert err.value.code == code
