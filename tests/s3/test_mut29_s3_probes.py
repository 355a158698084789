"""Mutation audit 29 (S3 backend): the checksum probe against a store that checks uploads.

moto accepts any CRC32C, so the suite only ever met the "does not check" answer; here the
fault proxy refuses a PUT whose ``x-amz-checksum-crc32c`` is not its body's (``check_crc32c``),
as S3 does, in front of the real moto server.
"""

from __future__ import annotations

import pytest

from portable_ckpt.storage.s3 import S3Storage

from .conftest import S3Env

pytestmark = pytest.mark.s3


def test_a_store_that_checks_uploads_is_found_to_check_them(s3_proxied: S3Env) -> None:
    """The probe sends a wrong CRC32C on purpose; the refusal is the answer "checks" (mutant
    V02 sent the right one, was accepted, and took every checking store for one that does
    not: each commit record read back, a WARNING at every process start)."""
    proxy = s3_proxied.proxy
    proxy.check_crc32c = True
    st = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01)
    st.put("v/data/a", b"abc")  # the right CRC32C passes the checking store
    assert st.validates_checksums() is True
    assert proxy.log.by_method["PUT"] == 2  # the put and the probe, refused once: no retry
    assert [i.path for i in st.list("")] == ["v/data/a"]  # the refused probe stored nothing
    assert st.create_if_absent("v/manifest.json", b"{}")
    # A checking store's answer is trusted: the record is not read back after its PUT.
    assert proxy.log.by_method.get("GET", 0) == 1  # the listing above, no GET of the record
