"""Mutation audit 29 (S3 backend): ``create_if_absent``, the commit's conditional PUT.

Each test kills a mutant the rest of the S3 suite let live (see the audit's ``mutants.md``);
real moto server behind the fault proxy.
"""

from __future__ import annotations

import pytest

from portable_ckpt.errors import CommitOutcomeUnknownError, StorageError
from portable_ckpt.storage.s3 import S3Storage

from .conftest import S3Env

pytestmark = pytest.mark.s3


def test_a_400_to_the_conditional_put_is_final_and_reads_nothing_back(s3_proxied: S3Env) -> None:
    """400 is the first status of the 4xx answers that say nothing was stored: refused at once,
    never read back, and never taken for "another committer created it" (mutant W07 read the
    record back and returned False when another record was there)."""
    st = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01)
    st.put("v/manifest.json", b"theirs")
    assert st.honours_conditional_put()  # the probe's own PUTs, before the fault
    proxy = s3_proxied.proxy
    proxy.match_method, proxy.match_path = "PUT", r"manifest\.json"
    proxy.fail_every, proxy.fail_status = 1, (400, "InvalidRequest")
    with pytest.raises(StorageError, match="InvalidRequest") as info:
        st.create_if_absent("v/manifest.json", b"ours")
    assert not isinstance(info.value, CommitOutcomeUnknownError)
    assert not info.value.retryable
    assert proxy.log.by_method.get("GET", 0) == 0


def test_a_corrupted_create_not_found_on_read_back_is_an_unknown_outcome(
    s3_proxied: S3Env,
) -> None:
    """The store answered the conditional PUT with another CRC32C than the bytes sent (it kept
    something), and the read-back finds nothing yet (a 404 of the store's lag): the record may
    be published, so the outcome is unknown, not a plain failure the caller may clean up after
    (mutant W12 raised the checksum error, R-COMMIT-19)."""
    st = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01)
    assert st.honours_conditional_put()
    proxy = s3_proxied.proxy
    proxy.reset()  # count the matching requests from here: the PUT is the 1st, the GET the 2nd
    proxy.match_path = r"manifest\.json"
    proxy.set_headers = {"x-amz-checksum-crc32c": "AAAAAA=="}  # the PUT's answer lies
    proxy.fail_every, proxy.fail_status = 2, (404, "NoSuchKey")  # the read-back: not found
    with pytest.raises(CommitOutcomeUnknownError, match="may be published"):
        st.create_if_absent("v/manifest.json", b"ours")
    assert proxy.log.injected_by_status == {404: 1}


def test_a_409_on_the_first_probe_put_leaves_the_answer_unknown(s3_proxied: S3Env) -> None:
    """Only the second probe PUT's 409 is asked again: a 409 on the first one says nothing of
    the condition, so the answer is unknown (True: create as before). Mutant Q02 asked again,
    the retry created the probe, the check that must be refused was never made, and the
    store was judged to ignore the condition: every commit refused."""
    st = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01)
    proxy = s3_proxied.proxy
    proxy.match_method, proxy.match_path = "PUT", r"\.pck-probe-"
    proxy.fail_status, proxy.fail_every, proxy.fail_limit = (
        (409, "ConditionalRequestConflict"), 1, 1)
    assert st.honours_conditional_put() is True
    assert proxy.log.by_method["PUT"] == 1  # the first PUT, answered 409; no second
    proxy.reset()
    assert st.create_if_absent("v/manifest.json", b"{}")


def test_a_create_without_an_answer_and_nothing_there_is_an_unknown_outcome(
    s3_proxied: S3Env,
) -> None:
    """Every try of the conditional PUT lost its connection (no answer) and the read-back
    finds nothing: the store may still apply the PUT, so the outcome is unknown (mutant W08
    took the lost answer for a refusal: a plain failure)."""
    st = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01, max_attempts=2)
    assert st.honours_conditional_put()
    proxy = s3_proxied.proxy
    proxy.match_method, proxy.match_path = "PUT", r"manifest\.json"
    proxy.fail_status, proxy.fail_every = (0, "reset"), 1
    with pytest.raises(CommitOutcomeUnknownError, match="may be published"):
        st.create_if_absent("v/manifest.json", b"ours")


def test_a_much_larger_record_found_after_a_5xx_is_another_committers(s3_proxied: S3Env) -> None:
    """The PUT failed with 5xx and the record there is larger than ours could be: not ours,
    so the create lost (False), as for a 412 (mutant W11 failed the commit instead)."""
    st = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01, max_attempts=2)
    st.put("v/manifest.json", b"x" * 5000)  # another committer's, > 2 * len(ours) + 1024
    assert st.honours_conditional_put()
    proxy = s3_proxied.proxy
    proxy.match_method, proxy.match_path = "PUT", r"manifest\.json"
    proxy.fail_every = 1  # 500, not forwarded
    assert st.create_if_absent("v/manifest.json", b"ours") is False


def test_a_corrupted_create_read_back_with_other_bytes_is_an_unknown_outcome(
    s3_proxied: S3Env,
) -> None:
    """The body was damaged on its way (the store kept other bytes, and said so with another
    CRC32C): the bytes read back are not ours, yet they are this PUT's, not another
    committer's record. Unknown, never "lost to another committer" (mutant W13 returned
    False, and the caller took its own corrupted record for a competitor's)."""
    st = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01)
    assert st.honours_conditional_put()
    proxy = s3_proxied.proxy
    proxy.reset()
    proxy.match_method, proxy.match_path = "PUT", r"manifest\.json"
    proxy.flip_bodies = 1
    proxy.set_headers = {"x-amz-checksum-crc32c": "AAAAAA=="}
    with pytest.raises(CommitOutcomeUnknownError, match="may be published"):
        st.create_if_absent("v/manifest.json", b"ours")
