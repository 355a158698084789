"""S3 retries in the job log: real boto3 (writes) and obstore (reads) requests through the fault
proxy in front of moto."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest

from portable_ckpt.errors import FileMissingError, StorageError
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


def _check_retry_record(rec: logging.LogRecord, env: S3Env, attempts: int = 5) -> dict[str, object]:
    doc: dict[str, object] = getattr(rec, EVENT_ATTR)
    assert rec.name == "portable_ckpt.storage.s3" and rec.levelno == logging.WARNING
    assert set(doc) >= {"method", "url", "attempt", "max_attempts", "cause"}  # as for writes
    assert doc["max_attempts"] == attempts
    url = str(doc["url"])
    assert url.startswith(f"{env.proxy.url}/{env.bucket}") and "?" not in url
    assert rec.getMessage() == (
        f"retrying {doc['method']} {url} after {doc['cause']} "
        f"(attempt {doc['attempt']} of {attempts})"
    )
    return doc


def test_each_retried_read_is_logged_with_its_cause(s3_proxied: S3Env, log: EventLog) -> None:
    """obstore's own retries are off: every retried GET, HEAD, LIST and DELETE is logged."""
    proxy = s3_proxied.proxy
    st = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01)
    data = os.urandom(3000)
    st.put("att/data/a", data)
    assert _retries(log) == []
    proxy.fail_status = (503, "SlowDown")
    proxy.fail_every = 2  # every 2nd request answered 503; its retry is the next request
    assert st.read_range("att/data/a", 100, 10) == data[100:110]
    assert st.read_all("att/data/a", max_size=len(data)) == data
    assert st.size("att/data/a") == len(data) and st.exists("att/data/a")
    assert st.list_dirs("att") == ["data"] and [i.path for i in st.list("att")] == ["att/data/a"]
    st.delete("att/data/a")
    assert not st.exists("att/data/a")
    injected = proxy.log.injected_by_status.get(503, 0)
    assert injected >= 4 and len(_retries(log)) == injected  # one line per retried request
    methods = set()
    for rec in _retries(log):
        doc = _check_retry_record(rec, s3_proxied)
        assert doc["attempt"] == 2  # the retry of a 503 was not answered 503 again
        methods.add(doc["method"])
        # HEAD answers have no body, hence no S3 error code
        assert doc["cause"] == ("HTTP 503" if doc["method"] == "HEAD" else "HTTP 503 SlowDown")
    assert methods >= {"GET", "HEAD"}


def test_a_timed_out_read_is_logged_and_retried(s3_proxied: S3Env, log: EventLog) -> None:
    proxy = s3_proxied.proxy
    st = S3Storage.from_url(s3_proxied.root(), read_timeout=1.0, backoff_initial=0.01)
    st.put("att/x", b"0123456789")
    proxy.match_method, proxy.delay_every, proxy.delay_s = "GET", 2, 3.0  # every 2nd GET hangs
    assert st.read_range("att/x", 0, 10) == b"0123456789"
    assert st.read_range("att/x", 2, 3) == b"234"
    assert proxy.log.injected_delays >= 1
    docs = [_check_retry_record(rec, s3_proxied) for rec in _retries(log)]
    # (a loaded machine may time out one more GET than the proxy delayed: at least one)
    timeouts = [d for d in docs if str(d["cause"]).startswith("Timeout error: ")]
    assert timeouts and all(d["method"] == "GET" and d["attempt"] >= 2 for d in timeouts)


def test_an_exhausted_read_logs_each_retry_and_fails(s3_proxied: S3Env, log: EventLog) -> None:
    proxy = s3_proxied.proxy
    st = S3Storage.from_url(s3_proxied.root(), max_attempts=3, backoff_initial=0.01)
    st.put("att/x", b"1")
    proxy.fail_every = 1
    with pytest.raises(StorageError, match=r"InternalError.*after up to 3 tries"):
        st.read_range("att/x", 0, 1)
    assert [_check_retry_record(r, s3_proxied, 3)["attempt"] for r in _retries(log)] == [2, 3]
    assert proxy.log.injected_500 == 3


def test_a_missing_object_read_is_not_a_retry(s3_proxied: S3Env, log: EventLog) -> None:
    st = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01)
    with pytest.raises(FileMissingError):
        st.read_range("att/none", 0, 1)
    assert not st.exists("att/none")
    assert _retries(log) == []


@pytest.mark.parametrize(("status", "code", "retried"), [
    (429, "SlowDown", True), (502, "BadGateway", True), (403, "AccessDenied", False),
    (400, "InvalidRequest", False),
])
def test_which_read_answers_are_retried(
    s3_proxied: S3Env, log: EventLog, status: int, code: str, retried: bool
) -> None:
    proxy = s3_proxied.proxy
    st = S3Storage.from_url(s3_proxied.root(), max_attempts=2, backoff_initial=0.01)
    st.put("att/x", b"1")
    proxy.fail_status, proxy.fail_every, proxy.match_method = (status, code), 1, "GET"
    with pytest.raises(StorageError):
        st.read_range("att/x", 0, 1)
    causes = [_check_retry_record(r, s3_proxied, 2)["cause"] for r in _retries(log)]
    assert causes == ([f"HTTP {status} {code}"] if retried else [])
    assert proxy.log.injected_by_status == {status: 2 if retried else 1}


def test_retries_in_the_writer_process_reach_the_job_log(s3_proxied: S3Env, log: EventLog) -> None:
    """Commit-child review F6: a process-mode save's uploads (and rank 0's commit) run in the
    writer process, where nothing listens: its retried requests were missing from the job log.
    They come back with the job's answer and are logged in the training process."""
    torch = pytest.importorskip("torch")
    import portable_ckpt.torch as pckt
    from portable_ckpt.torch import _process_write

    # A writer process of an earlier test keeps the environment it started with (its S3 retry
    # settings): this test's saves start their own.
    _process_write._close_at_exit()
    proxy = s3_proxied.proxy
    state = {"w": torch.arange(1000.0), "n": 3}
    # First a save without faults: each process's once-per-process requests (the store's
    # checksum probe) are made, so the faults below meet the writer process's requests only.
    pckt.async_save(state, s3_proxied.root("proc"), step=1, mode="process",
                    continuation="statistical").result(timeout=120)
    log.records.clear()
    proxy.fail_every, proxy.match_method = 2, "PUT"  # every 2nd PUT answered 500, then retried
    h = pckt.async_save(state, s3_proxied.root("proc"), step=2, mode="process",
                        continuation="statistical")
    h.result(timeout=120)
    assert proxy.log.injected_500 >= 2
    retries = _retries(log)
    assert len(retries) == proxy.log.injected_500  # every one, none twice
    for rec in retries:
        assert rec.name == "portable_ckpt.storage.s3" and rec.levelno == logging.WARNING
        assert getattr(rec, EVENT_ATTR)["cause"] == "HTTP 500 InternalError"
        assert "writer process" in rec.getMessage()
    commits = [r for r in log.records if getattr(r, EVENT_ATTR)["event"].startswith("commit.")]
    assert [getattr(r, EVENT_ATTR)["event"] for r in commits] == [
        "commit.started", "commit.finished"]  # the training process's own, not the writer's
