"""S3 retries in the job log: real boto3 requests through the fault proxy in front of moto."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest

from portable_ckpt.logs import EVENT_ATTR
from portable_ckpt.storage.s3 import S3Storage
from portable_ckpt.testing.logs import EventLog, job_log

from .conftest import S3Env

MIB = 1 << 20


@pytest.fixture
def log() -> Iterator[EventLog]:
    with job_log() as events:
        yield events


def _retries(log: EventLog) -> list[logging.LogRecord]:
    return [r for r in log.records if getattr(r, EVENT_ATTR)["event"] == "storage.retry"]


def test_each_retried_write_is_logged_with_its_cause(s3_proxied: S3Env, log: EventLog) -> None:
    proxy = s3_proxied.proxy
    st = S3Storage.from_url(s3_proxied.root(), part_size=5 * MIB, backoff_initial=0.01)
    st.put("att/data/a", b"x" * 100)
    assert proxy.log.injected_500 == 0 and _retries(log) == []  # no fault, no retry line
    proxy.fail_every = 2
    proxy.match_method = "PUT"
    st.put("att/data/b", os.urandom(11 * MIB))  # multipart: every 2nd PUT answered 500
    st.put("att/index/w00000.json", b"{}")
    assert proxy.log.injected_500 >= 2
    assert len(_retries(log)) == proxy.log.injected_500  # one line per retried request
    for rec in _retries(log):
        doc = getattr(rec, EVENT_ATTR)
        assert rec.name == "portable_ckpt.storage.s3" and rec.levelno == logging.WARNING
        # a retry answered 500 again is retried once more (concurrent parts share the counter)
        assert doc["method"] == "PUT" and 2 <= doc["attempt"] <= 5 and doc["max_attempts"] == 5
        assert doc["cause"] == "HTTP 500 InternalError"
        assert f"/{s3_proxied.bucket}/ckpts/att/" in doc["url"] and "?" not in doc["url"]
        assert rec.getMessage().startswith("retrying PUT http://127.0.0.1:")
        assert f"after HTTP 500 InternalError (attempt {doc['attempt']} of 5)" in rec.getMessage()


def test_a_missing_object_is_not_a_retry(s3_proxied: S3Env, log: EventLog) -> None:
    st = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01)
    assert st.create_if_absent("b/manifest.json", b"1")
    assert not st.create_if_absent("b/manifest.json", b"2")  # 412: answered, not retried
    assert _retries(log) == []
