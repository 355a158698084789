"""Mutation audit 29 (S3 backend): what a GET's answer must say before its bytes are taken.

A broken transfer (an answer shorter than it says, or shorter than asked while the object goes
on) is a transport fault: retried, then ``PCK-STORAGE``, never ``FileSizeError``, which says the
object itself is truncated and makes ``verify`` report an intact version as damaged (S3 attack
25, L4). Real moto server; the fault proxy rewrites the answer's headers and body.
"""

from __future__ import annotations

import os

import pytest

from portable_ckpt.errors import FileMissingError, FileSizeError, StorageError
from portable_ckpt.storage.s3 import S3Storage

from .conftest import S3Env

pytestmark = pytest.mark.s3


def test_an_answer_shorter_than_its_range_is_a_transport_fault(s3_proxied: S3Env) -> None:
    """Content-Range says the object ends with the range asked for (4096 bytes), and 4086
    bytes come: not a truncated object (mutant G03 took the object's own size for the
    truth). (An answer for another range than asked obstore refuses itself.)"""
    st = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01, max_attempts=2)
    data = os.urandom(66600)
    st.put("v/data/a", data)
    proxy = s3_proxied.proxy
    proxy.match_method, proxy.match_path = "GET", r"/v/data/a$"
    proxy.cut_body = 10
    proxy.set_headers = {"Content-Range": "bytes 0-4095/4096"}
    with pytest.raises(StorageError, match=r"asked for bytes 0-4095") as info:
        st.read_range("v/data/a", 0, 4096)
    assert not isinstance(info.value, FileSizeError) and info.value.retryable
    assert proxy.log.by_method["GET"] == 2  # retried
    proxy.reset()
    assert st.read_range("v/data/a", 0, 4096) == data[:4096]


def test_a_composite_checksum_is_no_whole_object_crc32c(s3_proxied: S3Env) -> None:
    """A per-part checksum (``<base64>-<parts>``, or of type COMPOSITE) is not the object's
    CRC32C: None, not a malformed answer or a wrong CRC32C (mutants X02, X01)."""
    st = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01)
    st.put("v/data/a", b"abc")
    proxy = s3_proxied.proxy
    proxy.match_method = "HEAD"
    proxy.set_headers = {"x-amz-checksum-crc32c": "AAAAAA==-2", "x-amz-checksum-type": None}
    assert st.checksum_crc32c("v/data/a") is None
    # The type says so where the value does not (mutant X01)
    proxy.set_headers = {"x-amz-checksum-crc32c": "AAAAAA==", "x-amz-checksum-type": "COMPOSITE"}
    assert st.checksum_crc32c("v/data/a") is None


def test_a_checksum_header_of_more_than_4_bytes_is_malformed(s3_proxied: S3Env) -> None:
    """An 8-byte value is no CRC32C (mutant X03 took any value of at least 4 bytes)."""
    st = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01)
    st.put("v/data/a", b"abc")
    proxy = s3_proxied.proxy
    proxy.match_method = "HEAD"
    proxy.set_headers = {"x-amz-checksum-crc32c": "AAAAAAAAAAA=",
                         "x-amz-checksum-type": "FULL_OBJECT"}
    with pytest.raises(StorageError, match=r"malformed.*not the base64 of 4 bytes"):
        st.checksum_crc32c("v/data/a")


def test_the_crc32c_of_a_missing_object_is_file_missing(s3: S3Env) -> None:
    """boto3's HEAD of a missing key answers the code ``404`` (no body, no S3 code): it is
    the object that does not exist, as for every other read (mutant F01)."""
    st = S3Storage.from_url(s3.root())
    with pytest.raises(FileMissingError):
        st.checksum_crc32c("v/none")
