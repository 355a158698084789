"""Mutation audit 29 (S3 backend): unfinished multipart uploads (listing, activity, aborts).

Each test kills a mutant the rest of the S3 suite let live (see the audit's ``mutants.md``);
real moto server, with the fault proxy in front of it for the store's answers that race.
"""

from __future__ import annotations

import os

import pytest

from portable_ckpt.storage.s3 import S3Storage

from .conftest import S3Env

pytestmark = pytest.mark.s3

MIB = 1 << 20


def test_an_upload_that_ends_while_its_parts_are_listed_keeps_its_start_time(
    s3_proxied: S3Env,
) -> None:
    """An upload listed, then completed or aborted before its ListParts (404 NoSuchUpload):
    its activity is its start time, and the listing goes on (mutant F02 mapped that 404 to
    "object does not exist", which escaped ``list_uploads(activity=True)`` and failed gc's
    listing of the attempt)."""
    st = S3Storage.from_url(s3_proxied.root(), part_size=5 * MIB, backoff_initial=0.01)
    w = st.open_writer("att/data/x")
    w.write(os.urandom(6 * MIB))
    w._parts[0].result()  # type: ignore[attr-defined]
    started = st.list_uploads("att")
    assert [u.path for u in started] == ["att/data/x"]
    proxy = s3_proxied.proxy
    proxy.match_method, proxy.match_path = "GET", r"uploadId="
    proxy.fail_status, proxy.fail_every = (404, "NoSuchUpload"), 1
    got = st.list_uploads("att", activity=True)
    assert [(u.path, u.mtime) for u in got] == [(u.path, u.mtime) for u in started]
    assert proxy.log.injected_by_status == {404: 1}
    proxy.reset()
    w.abort()


def test_an_upload_of_a_foreign_key_is_not_listed(s3: S3Env) -> None:
    """An unfinished upload whose key is not a well-formed path below the root (``v//x``) is
    foreign, like such an object: never listed for gc to abort (mutant U06 listed it)."""
    st = S3Storage.from_url(s3.root())
    client = s3.boto()
    for key in ("ckpts/v//x", "ckpts/v/y"):
        client.create_multipart_upload(Bucket=s3.bucket, Key=key)
    assert [u.path for u in st.list_uploads("v")] == ["v/y"]


def test_delete_prefix_aborts_the_uploads_below_it(s3: S3Env) -> None:
    """``delete_prefix`` leaves no unfinished upload below the prefix (billed, invisible to
    listings) and none beside it is touched (mutant D04 aborted none)."""
    st = S3Storage.from_url(s3.root(), part_size=5 * MIB)
    for path in ("att1/data/x", "att2/data/x"):
        w = st.open_writer(path)
        w.write(os.urandom(6 * MIB))
        w._parts[0].result()  # type: ignore[attr-defined]
    st.put("att1/index/w.json", b"{}")
    st.delete_prefix("att1")
    assert list(st.list("att1")) == []
    assert [u.path for u in st.list_uploads("")] == ["att2/data/x"]
    st.abort_uploads("att2")
