"""The storage contract (portable_ckpt.testing.storage.StorageTests) on S3: a real moto server."""

from __future__ import annotations

import pytest

from portable_ckpt.storage.s3 import S3Storage
from portable_ckpt.testing.storage import StorageTests

from .conftest import S3Env

pytestmark = pytest.mark.s3


class TestS3Storage(StorageTests):
    @pytest.fixture
    def store(self, s3: S3Env) -> S3Storage:
        return S3Storage.from_url(s3.root("contract"))


class _Multipart(StorageTests):
    object_size = 5 * 1024 * 1024 + 1  # past one 5 MiB part: the writer starts an upload


def test_an_unfinished_multipart_upload_is_found_and_aborted(s3: S3Env) -> None:
    """The contract's rule on unfinished uploads, on the store where writers leave them (the
    class above skips it: its small objects are sent in one request): a writer killed past its
    first part is listed by path, keeps a root that holds nothing else alive for gc, and is
    aborted alone by ``abort_uploads(only=...)`` (backend review 27, M2)."""
    store = S3Storage.from_url(s3.root("uploads"), part_size=5 * 1024 * 1024)
    _Multipart().test_an_unfinished_writer_is_an_upload_gc_can_find(store)
    assert store.list_uploads("") == []


def test_options_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every PCK_S3_* variable is parsed by one helper: unset/empty keeps the default, a bad
    value is a usage error naming the variable."""
    from portable_ckpt.errors import UsageError
    from portable_ckpt.storage.s3 import S3Options

    for k, v in {
        "PCK_S3_PART_SIZE": str(8 << 20),
        "PCK_S3_READ_TIMEOUT": "2.5",
        "PCK_S3_CONDITIONAL_PUT": "Off",
        "PCK_S3_CONNECT_TIMEOUT": "",
        "AWS_ALLOW_HTTP": "true",
    }.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("PCK_S3_CONCURRENCY", raising=False)
    o = S3Options.from_env()
    assert (o.part_size, o.read_timeout, o.conditional_put) == (8 << 20, 2.5, False)
    assert (o.connect_timeout, o.max_concurrency, o.allow_http) == (10.0, 4, True)
    monkeypatch.setenv("PCK_S3_CONCURRENCY", "four")
    with pytest.raises(UsageError, match=r"PCK_S3_CONCURRENCY='four' is not an integer"):
        S3Options.from_env()
    monkeypatch.setenv("PCK_S3_CONCURRENCY", "4")
    monkeypatch.setenv("PCK_S3_READ_TIMEOUT", "soon")
    with pytest.raises(UsageError, match="is not a number"):
        S3Options.from_env()


def test_abort_after_close_removes_the_object(s3: S3Env) -> None:
    """mutation audit 22 A-110: like the local backend, ``abort()`` after a completed ``close()``
    removes what was written (one PUT and multipart alike)."""
    st = S3Storage.from_url(s3.root("contract"), part_size=5 << 20)
    for path, size in (("a/small", 10), ("a/big", 6 << 20)):
        w = st.open_writer(path)
        w.write(b"x" * size)
        w.close()
        assert st.exists(path)
        w.abort()
        assert not st.exists(path), path
