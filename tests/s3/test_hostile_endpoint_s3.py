"""An endpoint that answers well-formed HTTP with hostile or broken S3 (S3 attack 25).

H1: a listing that never ends (``IsTruncated`` for ever, with new tokens, the same token or
empty pages) hung every command and grew its memory without limit; it now fails within
``PCK_S3_LIST_MAX_PAGES`` / ``_KEYS`` / ``_EMPTY_PAGES`` with ``PCK-STORAGE`` naming the setting.
M1: an answer that trickles in (a byte at a time, each under the read timeout) is bounded by
``PCK_S3_REQUEST_TIMEOUT``, for obstore's reads and botocore's requests alike.
L1: answers missing a field, or with an invalid one, are ``PCK-STORAGE`` naming the object, not
an internal error. L4: a 206 shorter than its own Content-Range is a transport fault (retried,
``PCK-STORAGE``), not a truncated object.

All against moto through the fault proxy (``faultproxy.py``), real boto3 and obstore.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.cli.main import main as cli_main
from portable_ckpt.errors import FileSizeError, StorageError, UsageError
from portable_ckpt.storage.s3 import S3Options, S3Storage

from .conftest import S3Env

pytestmark = pytest.mark.s3

MIB = 1 << 20


def _storage(env: S3Env, **options: object) -> S3Storage:
    return S3Storage.from_url(env.root(), backoff_initial=0.01, **options)


def _seed(st: S3Storage, n: int = 3) -> None:
    for i in range(n):
        st.put(f"v{i}/data/a", b"x" * 10)


# -- H1: listings are bounded ----------------------------------------------------------------

_LISTINGS = {
    "list": lambda st: list(st.list("")),
    "list_flat": lambda st: list(st.list("", recursive=False)),
    "list_dirs": lambda st: st.list_dirs(""),
    "root_exists": lambda st: st.root_exists(),
}


@pytest.mark.parametrize("op", sorted(_LISTINGS))
def test_an_endless_listing_fails_at_the_page_bound(s3_proxied: S3Env, op: str) -> None:
    proxy = s3_proxied.proxy
    st = _storage(s3_proxied, list_max_pages=25)
    if op != "root_exists":  # (which stops at the first entry: its root is empty here)
        _seed(st)
    proxy.list_forever = "new"
    with pytest.raises(StorageError, match="PCK_S3_LIST_MAX_PAGES") as info:
        _LISTINGS[op](st)
    err = info.value
    assert err.code == "PCK-STORAGE" and not err.retryable  # the same listing fails again
    assert s3_proxied.root() in err.message and "did not end after 25 pages" in err.message
    assert proxy.log.by_method["GET"] == 25


def test_a_repeated_continuation_token_fails_at_once(s3_proxied: S3Env) -> None:
    proxy = s3_proxied.proxy
    st = _storage(s3_proxied)
    _seed(st)
    proxy.list_forever = "same"
    with pytest.raises(StorageError, match="token it had given before") as info:
        list(st.list(""))
    assert "'SAME'" in info.value.message and s3_proxied.root() in info.value.message
    assert info.value.retryable  # a faulty endpoint (or proxy) may mend
    assert proxy.log.by_method["GET"] == 2  # the first page, then its token once more


def test_an_endless_listing_stops_at_the_key_bound_memory_stays_bounded(
    s3_proxied: S3Env,
) -> None:
    proxy = s3_proxied.proxy
    st = _storage(s3_proxied, list_max_keys=2000)
    _seed(st)
    proxy.list_forever, proxy.list_extra = "new", 500  # fresh junk keys on every page
    with pytest.raises(StorageError, match="PCK_S3_LIST_MAX_KEYS") as info:
        list(st.list(""))
    assert not info.value.retryable and "more than 2000 entries" in info.value.message
    assert proxy.log.by_method["GET"] == 4  # 503 entries a page: the 4th passes 2000


def test_a_run_of_empty_truncated_pages_fails_early(s3_proxied: S3Env) -> None:
    proxy = s3_proxied.proxy
    st = _storage(s3_proxied, list_max_empty_pages=5)
    _seed(st)
    proxy.list_forever = "empty"
    with pytest.raises(StorageError, match="PCK_S3_LIST_MAX_EMPTY_PAGES") as info:
        st.list_dirs("")
    assert not info.value.retryable and "5 pages in a row held no entry" in info.value.message
    assert proxy.log.by_method["GET"] == 5


def test_a_real_paginated_listing_is_complete_and_the_bound_is_exact(s3_proxied: S3Env) -> None:
    """Real pages with real tokens (the server is asked for 2 keys a page): 7 keys take 4."""
    proxy = s3_proxied.proxy
    st = _storage(s3_proxied)
    for i in range(7):
        st.put(f"v/data/{i}", b"x")
    proxy.reset()
    proxy.list_page_size = 2
    assert [i.path for i in st.list("v")] == [f"v/data/{i}" for i in range(7)]
    assert proxy.log.by_method["GET"] == 4
    with pytest.raises(StorageError, match="did not end after 3 pages"):
        list(_storage(s3_proxied, list_max_pages=3).list("v"))
    assert len(list(_storage(s3_proxied, list_max_pages=4).list("v"))) == 7


def test_the_cli_and_open_fail_on_an_endless_listing_instead_of_hanging(
    s3_proxied: S3Env, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = s3_proxied.root("run")
    portable_ckpt.save_arrays(root, {"w": np.arange(4.0)}, step=1)
    monkeypatch.setenv("PCK_S3_LIST_MAX_PAGES", "40")
    s3_proxied.proxy.list_forever = "new"
    start = time.monotonic()
    assert cli_main(["ls", root]) == 1  # not retryable: raise the setting or fix the endpoint
    err = capsys.readouterr().err
    assert "PCK-STORAGE" in err and "PCK_S3_LIST_MAX_PAGES" in err and "Traceback" not in err
    with pytest.raises(StorageError, match="PCK_S3_LIST_MAX_PAGES"):
        portable_ckpt.open(root)
    assert time.monotonic() - start < 60


def test_listing_bounds_come_from_the_environment(
    s3: S3Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PCK_S3_LIST_MAX_KEYS", "7")
    monkeypatch.setenv("PCK_S3_LIST_MAX_PAGES", "8")
    monkeypatch.setenv("PCK_S3_LIST_MAX_EMPTY_PAGES", "9")
    monkeypatch.setenv("PCK_S3_REQUEST_TIMEOUT", "12.5")
    opts = S3Options.from_env()
    assert (opts.list_max_keys, opts.list_max_pages, opts.list_max_empty_pages,
            opts.request_timeout) == (7, 8, 9, 12.5)
    for name, bad in (("PCK_S3_LIST_MAX_PAGES", "0"), ("PCK_S3_REQUEST_TIMEOUT", "inf")):
        monkeypatch.setenv(name, bad)
        with pytest.raises(UsageError, match=name):
            S3Options.from_env()
        monkeypatch.delenv(name)


# -- M1: a trickling answer is bounded by the whole-request timeout --------------------------


def test_a_trickling_listing_answer_is_bounded_by_the_request_timeout(s3_proxied: S3Env) -> None:
    """botocore's read timeout is per socket read: a byte every 0.3 s never trips it."""
    proxy = s3_proxied.proxy
    st = _storage(s3_proxied, read_timeout=5.0, request_timeout=1.5, max_attempts=2)
    _seed(st, 1)
    proxy.match_path, proxy.trickle_s = r"list-type=2", 0.3
    start = time.monotonic()
    with pytest.raises(StorageError, match=r"did not answer in time.*PCK_S3_REQUEST_TIMEOUT"):
        st.list_dirs("")
    assert time.monotonic() - start < 10  # 2 tries of 1.5 s, not the 20 s the trickle lasts
    assert proxy.log.by_method["GET"] == 2


def test_a_trickling_object_body_is_bounded_by_the_request_timeout(s3_proxied: S3Env) -> None:
    """obstore's whole-request timeout was 600 s whatever was configured."""
    proxy = s3_proxied.proxy
    st = _storage(s3_proxied, read_timeout=5.0, request_timeout=1.5, max_attempts=2)
    st.put("v/data/a", os.urandom(1000))
    proxy.match_method, proxy.match_path, proxy.trickle_s = "GET", r"/v/data/a$", 0.3
    start = time.monotonic()
    with pytest.raises(StorageError) as info:
        st.read_range("v/data/a", 0, 1000)
    assert time.monotonic() - start < 10
    assert info.value.retryable and "v/data/a" in info.value.message
    assert "PCK_S3_REQUEST_TIMEOUT" in info.value.message


def test_requests_given_up_on_are_bounded(
    s3_proxied: S3Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Re-attack 25, M2: each request given up on kept its thread and socket while the
    endpoint trickled: 60 calls, 61 threads and 66 descriptors. Past the bound no request is
    sent until one of them ends."""
    import threading

    from portable_ckpt.storage import _s3_requests

    monkeypatch.setattr(_s3_requests, "MAX_ABANDONED_REQUESTS", 3)
    proxy = s3_proxied.proxy
    _seed(_storage(s3_proxied), 1)  # with the default timeout: a loaded machine's PUT is slow
    st = _storage(s3_proxied, read_timeout=5.0, request_timeout=0.5, max_attempts=1)
    proxy.match_path, proxy.trickle_s = r"list-type=2", 0.3

    def hanging() -> int:
        return sum(t.name == "pck-s3-request" for t in threading.enumerate())

    before = hanging()
    for _ in range(6):
        with pytest.raises(StorageError):
            st.list_dirs("")
    assert hanging() - before <= 3
    assert proxy.log.by_method["GET"] <= 3
    with pytest.raises(StorageError, match="still hang"):
        st.list_dirs("")


# -- L1: malformed answers are storage errors naming the object ------------------------------


def test_an_invalid_checksum_header_is_a_storage_error(s3_proxied: S3Env) -> None:
    st = _storage(s3_proxied)
    st.put("v/data/a", b"abc")
    s3_proxied.proxy.match_method = "HEAD"
    s3_proxied.proxy.set_headers = {"x-amz-checksum-crc32c": "!!!notbase64",
                                    "x-amz-checksum-type": "FULL_OBJECT"}
    with pytest.raises(StorageError, match=r"malformed.*x-amz-checksum-crc32c") as info:
        st.checksum_crc32c("v/data/a")
    assert f"{s3_proxied.root()}/v/data/a" in info.value.message


def test_an_upload_start_without_an_upload_id_is_a_storage_error(s3_proxied: S3Env) -> None:
    st = _storage(s3_proxied, part_size=5 * MIB)
    s3_proxied.proxy.match_method, s3_proxied.proxy.match_path = "POST", r"\?uploads"
    s3_proxied.proxy.body_subs = [(rb"<UploadId>[^<]*</UploadId>", b"")]
    with pytest.raises(StorageError, match="has no UploadId") as info:
        st.put("v/data/big", os.urandom(6 * MIB))
    assert f"{s3_proxied.root()}/v/data/big" in info.value.message


def test_a_part_answer_without_an_etag_is_retried_then_a_storage_error(s3_proxied: S3Env) -> None:
    st = _storage(s3_proxied, part_size=5 * MIB, max_attempts=2)
    s3_proxied.proxy.match_method, s3_proxied.proxy.match_path = "PUT", r"uploadId="
    s3_proxied.proxy.set_headers = {"ETag": None}
    with pytest.raises(StorageError, match="UploadPart 1 has no ETag") as info:
        st.put("v/data/big", os.urandom(6 * MIB))
    assert f"{s3_proxied.root()}/v/data/big" in info.value.message and info.value.retryable
    assert s3_proxied.proxy.log.by_method["PUT"] >= 2  # part 1 retried (the last may start)


@pytest.mark.parametrize("sub", [
    (rb"<Size>[^<]*</Size>", b""),
    (rb"<LastModified>[^<]*</LastModified>", b""),
    (rb"<Size>[^<]*</Size>", b"<Size>-5</Size>"),
], ids=["no-size", "no-lastmodified", "negative-size"])
def test_a_listing_entry_without_size_or_time_is_a_storage_error(
    s3_proxied: S3Env, sub: tuple[bytes, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    st = _storage(s3_proxied)
    _seed(st, 1)
    st.put("stray", b"x")  # an object in the root's own listing, which ls reads
    s3_proxied.proxy.match_path = r"list-type=2"
    s3_proxied.proxy.body_subs = [sub]
    with pytest.raises(StorageError, match="no valid Key, Size") as info:
        list(st.list(""))
    assert s3_proxied.root() in info.value.message
    assert cli_main(["ls", s3_proxied.root()]) == 75
    err = capsys.readouterr().err
    assert "PCK-STORAGE" in err and "internal error" not in err


# -- L4: a short 206 is a transport fault, not a truncated object ----------------------------


def test_a_short_ranged_answer_is_retried_and_not_truncation(s3_proxied: S3Env) -> None:
    st = _storage(s3_proxied, max_attempts=3)
    data = os.urandom(66600)
    st.put("v/data/a", data)
    s3_proxied.proxy.match_method, s3_proxied.proxy.match_path = "GET", r"/v/data/a$"
    s3_proxied.proxy.cut_body = 10  # Content-Range still "bytes 0-4095/66600"
    with pytest.raises(StorageError) as info:
        st.read_range("v/data/a", 0, 4096)
    assert not isinstance(info.value, FileSizeError) and info.value.retryable
    msg = info.value.message
    assert "v/data/a" in msg and "bytes 0-4095" in msg and "of an object of 66600" in msg
    assert s3_proxied.proxy.log.by_method["GET"] == 3  # retried: a transport fault
    s3_proxied.proxy.cut_body = 0
    assert st.read_range("v/data/a", 0, 4096) == data[:4096]
    # An object that really ends inside the range is still truncated.
    with pytest.raises(FileSizeError, match="ended at byte 66600"):
        st.read_range("v/data/a", 66000, 1000)
