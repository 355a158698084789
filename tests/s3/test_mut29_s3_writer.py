"""Mutation audit 29 (S3 backend): the multipart writer (``storage/_s3_writer.py``).

Each test kills a mutant the rest of the S3 suite let live (see the audit's ``mutants.md``);
real moto server, with the fault proxy in front of it where a slow or failing store is needed.
"""

from __future__ import annotations

import os

import crc32c
import pytest

from portable_ckpt.errors import StorageError
from portable_ckpt.storage.s3 import S3Storage

from .conftest import S3Env

pytestmark = pytest.mark.s3

MIB = 1 << 20


def test_parts_in_flight_are_bounded_by_max_concurrency(s3_proxied: S3Env) -> None:
    """A writer holds at most ``max_concurrency`` parts in flight: ``write`` waits for a slot
    while the store is slow (mutant S08 sent every part at once, so a fast producer and a slow
    store held the whole object in memory)."""
    proxy = s3_proxied.proxy
    st = S3Storage.from_url(s3_proxied.root(), part_size=5 * MIB, max_concurrency=1)
    proxy.match_method, proxy.match_path = "PUT", r"uploadId="
    proxy.delay_every, proxy.delay_s = 1, 0.5  # every part answers after 0.5 s
    w = st.open_writer("v/data/big")
    data = os.urandom(5 * MIB)
    for _ in range(3):
        w.write(data)
        in_flight = sum(not f.done() for f in w._parts)  # type: ignore[attr-defined]
        assert in_flight <= 1
    w.close()
    assert st.size("v/data/big") == 15 * MIB
    assert proxy.log.injected_delays == 3


def test_a_single_put_sends_the_crc32c_the_store_keeps(s3: S3Env) -> None:
    """An object smaller than a part (one PUT) and a conditional create carry the CRC32C of
    their bytes, which the store keeps (mutant W01 sent none: the store could neither check
    the upload nor give ``checksum_crc32c`` back)."""
    st = S3Storage.from_url(s3.root())
    st.put("v/data/a", b"abc")
    assert st.checksum_crc32c("v/data/a") == crc32c.crc32c(b"abc")
    assert st.create_if_absent("v/manifest.json", b"{}")
    assert st.checksum_crc32c("v/manifest.json") == crc32c.crc32c(b"{}")
    off = S3Storage.from_url(s3.root(), checksum="off")
    off.put("v/data/b", b"abc")
    assert off.checksum_crc32c("v/data/b") is None  # nothing sent, nothing kept


def test_a_part_answer_without_an_etag_is_sent_again(s3_proxied: S3Env) -> None:
    """The same part is sent again after an answer without an ETag, up to ``max_attempts``
    (mutant T15 gave up at once; the suite's test of it counted both parts' PUTs)."""
    st = S3Storage.from_url(s3_proxied.root(), part_size=5 * MIB, max_attempts=3,
                            backoff_initial=0.01)
    proxy = s3_proxied.proxy
    proxy.match_method, proxy.match_path = "PUT", r"partNumber=1(&|$)"
    proxy.set_headers = {"ETag": None}
    with pytest.raises(StorageError, match="UploadPart 1 has no ETag"):
        st.put("v/data/big", os.urandom(6 * MIB))
    assert proxy._counter == 3  # part 1, three times


def test_a_failed_part_fails_the_next_write_not_only_close(s3_proxied: S3Env) -> None:
    """A part the store refused fails the writer at the next part it would send, and the
    upload is aborted then: no more parts go out for an upload that cannot complete (mutant
    S09 went on uploading every later part and failed only at ``close``)."""
    st = S3Storage.from_url(s3_proxied.root(), part_size=5 * MIB, backoff_initial=0.01)
    proxy = s3_proxied.proxy
    proxy.match_method, proxy.match_path = "PUT", r"partNumber=1(&|$)"
    proxy.fail_status, proxy.fail_every = (403, "AccessDenied"), 1
    w = st.open_writer("v/data/big")
    w.write(os.urandom(5 * MIB))
    assert w._parts[0].exception() is not None  # type: ignore[attr-defined]
    with pytest.raises(StorageError, match="AccessDenied"):
        w.write(os.urandom(5 * MIB))
    assert proxy.log.by_method["PUT"] == 1  # part 2 was never sent
    assert s3_proxied.boto().list_multipart_uploads(Bucket=s3_proxied.bucket).get(
        "Uploads", []) == []  # aborted at once


def test_a_closed_or_failed_writer_refuses_more(s3_proxied: S3Env) -> None:
    """``write`` after ``close`` is an error, not bytes silently dropped (mutant S01), and a
    writer that failed says so again at a second ``close`` instead of passing for a finished
    upload (mutant S12)."""
    st = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01)
    w = st.open_writer("v/data/a")
    w.write(b"abc")
    w.close()
    with pytest.raises(StorageError, match="writer is closed"):
        w.write(b"more")
    assert st.read_all("v/data/a", max_size=10) == b"abc"
    proxy = s3_proxied.proxy
    proxy.match_method, proxy.fail_status, proxy.fail_every = "PUT", (403, "AccessDenied"), 1
    w = st.open_writer("v/data/b")
    w.write(b"abc")
    with pytest.raises(StorageError, match="AccessDenied"):
        w.close()
    with pytest.raises(StorageError, match="failed earlier"):
        w.close()
