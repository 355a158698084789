"""Mutation audit 29 (S3 backend): what the backend declares and how it bounds requests.

Each test kills a mutant of ``storage/s3.py`` the rest of the S3 suite let live (see the
audit's ``mutants.md``); all against the real moto server, through the fault proxy where a
fault is needed.
"""

from __future__ import annotations

import threading
import time

import pytest

from portable_ckpt.errors import StorageError
from portable_ckpt.storage.base import Capabilities
from portable_ckpt.storage.s3 import S3Storage

from .conftest import S3Env

pytestmark = pytest.mark.s3


def test_capabilities_are_exactly_what_the_options_allow(s3: S3Env) -> None:
    """Every field, not only the ones a planner consults today: ``durable_fsync`` and
    ``ranged_read`` are descriptive, so no behaviour notices a backend that stops claiming
    them (mutants I01, I04), and ``native_crc32c`` follows ``checksum`` (I03)."""
    st = S3Storage.from_url(s3.root())
    assert st.capabilities == Capabilities(atomic_create=True, ranged_read=True,
                                           durable_fsync=True, local_path=False,
                                           native_crc32c=True)
    off = S3Storage.from_url(s3.root(), checksum="off", conditional_put=False)
    assert off.capabilities == Capabilities(atomic_create=False, ranged_read=True,
                                            durable_fsync=True, local_path=False,
                                            native_crc32c=False)


def _hanging() -> int:
    return sum(t.name == "pck-s3-request" for t in threading.enumerate())


def test_requests_are_sent_again_once_the_abandoned_ones_end(
    s3_proxied: S3Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bound on requests given up on counts the ones that still hang: when the endpoint
    lets go of them, requests are sent again (mutant A03: the count never went down, and the
    process refused every request for good after the bound was reached once)."""
    from portable_ckpt.storage import _s3_requests

    monkeypatch.setattr(_s3_requests, "MAX_ABANDONED_REQUESTS", 2)
    proxy = s3_proxied.proxy
    seed = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01)
    seed.put("v/data/a", b"x")
    st = S3Storage.from_url(s3_proxied.root(), read_timeout=5.0, request_timeout=0.5,
                            max_attempts=1)
    before = _hanging()
    # Each listing answer trickles for 2 s, then the proxy closes the connection.
    proxy.match_path, proxy.trickle_s, proxy.trickle_max_s = r"list-type=2", 0.3, 2.0
    for _ in range(2):
        with pytest.raises(StorageError, match="did not answer in time"):
            st.list_dirs("")
    with pytest.raises(StorageError, match="still hang"):
        st.list_dirs("")
    deadline = time.monotonic() + 30
    while _hanging() > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _hanging() == before  # the endpoint closed them: nothing of ours hangs now
    proxy.trickle_s = 0.0
    # The bound is per process: another storage object, with the default limit (a loaded
    # machine's listing may take longer than 0.5 s), is refused while the count is stuck.
    assert S3Storage.from_url(s3_proxied.root()).list_dirs("") == ["v"]


def test_a_write_answered_429_is_retried(s3_proxied: S3Env) -> None:
    """A 429 with a code outside the throttling list is still retried by its status, for
    boto3's writes as for obstore's reads (mutant T12 retried 5xx only: one 429 failed a
    save)."""
    proxy = s3_proxied.proxy
    st = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01, max_attempts=2)
    proxy.match_method = "PUT"
    proxy.fail_status, proxy.fail_every, proxy.fail_limit = (429, "TooManyRequests"), 1, 1
    st.put("v/data/a", b"abc")
    assert proxy.log.injected_by_status == {429: 1}
    assert proxy.log.by_method["PUT"] == 2
    assert st.read_all("v/data/a", max_size=10) == b"abc"


def test_a_write_answered_a_throttling_code_under_500_is_retried(s3_proxied: S3Env) -> None:
    """``400 RequestTimeout`` is retried by its code (botocore's standard mode does so too):
    mutant T13 looked at the status only and failed the save."""
    proxy = s3_proxied.proxy
    st = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01, max_attempts=2)
    proxy.match_method = "PUT"
    proxy.fail_status, proxy.fail_every, proxy.fail_limit = (400, "RequestTimeout"), 1, 1
    st.put("v/data/a", b"abc")
    assert proxy.log.injected_by_status == {400: 1} and proxy.log.by_method["PUT"] == 2


@pytest.mark.parametrize(("status", "code", "retryable"), [
    (429, "TooManyRequests", True),  # throttled for longer than the retries: later (F06)
    (400, "ExpiredToken", True),  # a refreshed token may follow (F04)
    (400, "InvalidArgument", False),
], ids=["429", "expired-token", "invalid-argument"])
def test_whether_a_final_read_error_may_pass_later(
    s3_proxied: S3Env, status: int, code: str, retryable: bool
) -> None:
    """``retryable`` of the error the retries gave up on: what waiting may mend."""
    proxy = s3_proxied.proxy
    st = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01, max_attempts=2)
    st.put("v/data/a", b"abc")
    proxy.match_method, proxy.fail_status, proxy.fail_every = "GET", (status, code), 1
    with pytest.raises(StorageError, match=code) as info:
        st.read_all("v/data/a", max_size=10)
    assert info.value.retryable is retryable


def test_a_per_key_delete_error_that_waiting_does_not_mend_is_final(s3_proxied: S3Env) -> None:
    """A bulk delete answered 200 with a per-key ``InvalidArgument`` (no status of its own):
    not retried, and not retryable (mutant F08 said it may pass later)."""
    proxy = s3_proxied.proxy
    st = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01, max_attempts=2)
    st.put("v/data/a", b"abc")
    proxy.delete_key_errors, proxy.delete_key_code = 1, "InvalidArgument"
    with pytest.raises(StorageError, match="InvalidArgument") as info:
        st.delete_many(["v/data/a"])
    assert not info.value.retryable
    assert proxy.log.refused_keys == ["ckpts/v/data/a"]  # one try: not retried


def test_a_plain_http_endpoint_off_loopback_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials and data in clear text to another host: refused before any request unless
    ``AWS_ALLOW_HTTP`` (mutant E02 allowed every plain-HTTP endpoint)."""
    for name in ("AWS_ALLOW_HTTP", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://s3.example.invalid:9000")
    st = S3Storage.from_url("s3://bucket/root")
    with pytest.raises(StorageError, match="uses plain HTTP") as info:
        st.read_all("v/a", max_size=10)
    assert not info.value.retryable
    st = S3Storage.from_url("s3://bucket/root", allow_http=True)
    assert st._endpoint() == "http://s3.example.invalid:9000"


def test_the_whole_request_limit_grows_with_the_bytes_sent(s3: S3Env) -> None:
    """Each 64 MiB sent gets one ``request_timeout`` (mutant R06 gave a 5 GiB part the limit
    of a small one: on a slow link every try of a large part was given up)."""
    st = S3Storage.from_url(s3.root(), request_timeout=10.0)
    assert st._deadline() == st._deadline(64 << 20) == 10.0
    assert st._deadline(128 << 20) == 20.0 and st._deadline(5 << 30) == 800.0

