"""Mutation audit 32 of ``io/versions.py`` on the moto server: attempts known by their
unfinished uploads. Each test names the mutant it kills."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.io.versions import list_versions
from portable_ckpt.io.writer import new_attempt_id
from portable_ckpt.storage import open_storage

from .conftest import S3Env

pytestmark = pytest.mark.s3


def test_an_attempt_with_objects_and_unfinished_uploads_is_listed_once(
    s3: S3Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``list_versions(uploads=True)`` adds the attempts known only by unfinished uploads: a
    version that also has an upload under way (a record being written into it) is listed once,
    as what its commit record says. Mutant V42 (every attempt with an upload added): it was
    listed twice, the second time ``incomplete``, which gc would count as abandoned."""
    monkeypatch.setenv("PCK_S3_PART_SIZE", str(5 << 20))
    root = s3.root("run")
    keep = portable_ckpt.save_arrays(root, {"w": np.zeros(16, np.float32)}, step=1).attempt_id
    storage = open_storage(root)
    dead = new_attempt_id(2)
    for attempt in (keep, dead):
        w = storage.open_writer(f"{attempt}/data/upload.bin")
        w.write(b"\x01" * (5 << 20))  # one full part: a multipart upload is under way
    listed = [(v.id, v.status) for v in list_versions(root, uploads=True)]
    assert listed == [(keep, "committed"), (dead, "incomplete")]


@pytest.mark.parametrize("collect", [False, True], ids=["raised", "collected"])
def test_unfinished_uploads_that_cannot_be_listed_are_never_taken_for_none(
    s3_proxied: S3Env, collect: bool
) -> None:
    """``list_versions(uploads=True)`` whose ListMultipartUploads is refused: without an
    ``errors`` list the storage error is raised (a listing that left out the attempts known only
    by their uploads would let gc call a root clean); with one, it is appended there and the
    versions that could be listed are returned. Mutant V50 (the error swallowed when ``errors``
    is ``None``) survived every test."""
    from portable_ckpt.errors import StorageError

    root = s3_proxied.root("run")
    keep = portable_ckpt.save_arrays(root, {"w": np.zeros(4, np.float32)}, step=1).attempt_id
    proxy = s3_proxied.proxy
    proxy.match_method, proxy.match_path = "GET", r"[?&]uploads"
    proxy.fail_status, proxy.fail_every = (403, "AccessDenied"), 1
    if not collect:
        with pytest.raises(StorageError) as info:
            list_versions(root, uploads=True)
        assert "AccessDenied" in str(info.value) or "403" in str(info.value), info.value
        return
    errors: list[Any] = []
    listed = [(v.id, v.status) for v in list_versions(root, uploads=True, errors=errors)]
    assert listed == [(keep, "committed")]
    assert len(errors) == 1 and isinstance(errors[0], StorageError), errors
