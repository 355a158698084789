"""S3 retries in the job log: real boto3 requests through the fault proxy in front of moto."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest

from portable_ckpt.logs import EVENT_ATTR, LOGGER_NAME
from portable_ckpt.storage.s3 import S3Storage

from .conftest import S3Env

MIB = 1 << 20


class Retries(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, EVENT_ATTR, {}).get("event") == "storage.retry":
            self.records.append(record)


@pytest.fixture
def retries() -> Iterator[Retries]:
    log = logging.getLogger(LOGGER_NAME)
    handler, level = Retries(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def test_each_retried_write_is_logged_with_its_cause(s3_proxied: S3Env, retries: Retries) -> None:
    proxy = s3_proxied.proxy
    st = S3Storage.from_url(s3_proxied.root(), part_size=5 * MIB, backoff_initial=0.01)
    st.put("att/data/a", b"x" * 100)
    assert proxy.log.injected_500 == 0 and retries.records == []  # no fault, no retry line
    proxy.fail_every = 2
    proxy.match_method = "PUT"
    st.put("att/data/b", os.urandom(11 * MIB))  # multipart: every 2nd PUT answered 500
    st.put("att/index/w00000.json", b"{}")
    assert proxy.log.injected_500 >= 2
    assert len(retries.records) == proxy.log.injected_500  # one line per retried request
    for rec in retries.records:
        doc = getattr(rec, EVENT_ATTR)
        assert rec.name == "portable_ckpt.storage.s3" and rec.levelno == logging.WARNING
        # a retry answered 500 again is retried once more (concurrent parts share the counter)
        assert doc["method"] == "PUT" and 2 <= doc["attempt"] <= 5 and doc["max_attempts"] == 5
        assert doc["cause"] == "HTTP 500 InternalError"
        assert f"/{s3_proxied.bucket}/ckpts/att/" in doc["url"] and "?" not in doc["url"]
        assert rec.getMessage().startswith("retrying PUT http://127.0.0.1:")
        assert f"after HTTP 500 InternalError (attempt {doc['attempt']} of 5)" in rec.getMessage()


def test_a_missing_object_is_not_a_retry(s3_proxied: S3Env, retries: Retries) -> None:
    st = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01)
    assert st.create_if_absent("b/manifest.json", b"1")
    assert not st.create_if_absent("b/manifest.json", b"2")  # 412: answered, not retried
    assert retries.records == []
