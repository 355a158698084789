"""S3Storage against a real moto server (and the fault proxy in front of it)."""

from __future__ import annotations

import base64
import itertools
import os
import threading
from collections.abc import Callable
from typing import Any

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from portable_ckpt.errors import FileMissingError, FileSizeError, PathUnsafeError, StorageError
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.s3 import S3Storage

from .conftest import S3Env

pytestmark = pytest.mark.s3

MIB = 1 << 20


def _payload(n: int, seed: int = 1) -> bytes:
    return (bytes(range(256)) * (n // 256 + 1))[seed : seed + n]


def test_from_url_and_capabilities(s3: S3Env) -> None:
    st = open_storage(s3.root("a/b/"))
    assert isinstance(st, S3Storage)
    assert (st.bucket, st.prefix, st.url) == (s3.bucket, "a/b", f"s3://{s3.bucket}/a/b")
    assert st.capabilities.atomic_create and st.capabilities.ranged_read
    assert st.capabilities.native_crc32c and not st.capabilities.local_path
    with pytest.raises(PathUnsafeError):
        st.size("../x")


def test_put_read_list_delete(s3: S3Env) -> None:
    st = S3Storage.from_url(s3.root())
    data = _payload(1000)
    st.put("att1/data/w00000-0000.safetensors", data)
    st.put("att1/index/w00000.json", b"{}")
    st.put("att2/manifest.json", b"{}")
    assert st.read_all("att1/data/w00000-0000.safetensors", max_size=10_000) == data
    assert st.read_range("att1/data/w00000-0000.safetensors", 10, 20) == data[10:30]
    assert st.size("att1/data/w00000-0000.safetensors") == 1000
    assert st.exists("att1/index/w00000.json") and not st.exists("att1/nope")
    assert st.list_dirs("") == ["att1", "att2"]
    assert st.list_dirs("att1") == ["data", "index"]
    assert sorted(i.path for i in st.list("att1")) == [
        "att1/data/w00000-0000.safetensors", "att1/index/w00000.json"]
    assert [i.path for i in st.list("att1", recursive=False)] == []
    st.delete("att2/manifest.json")
    st.delete("att2/manifest.json")  # missing is fine
    assert st.list_dirs("") == ["att1"]
    st.delete_prefix("att1")
    assert list(st.list("")) == []
    # The prefix isolates roots in one bucket.
    other = S3Storage.from_url(s3.root("other"))
    other.put("x/y", b"1")
    assert st.list_dirs("") == []


def test_missing_and_truncated(s3: S3Env) -> None:
    st = S3Storage.from_url(s3.root())
    with pytest.raises(FileMissingError):
        st.read_range("nope/x", 0, 4)
    with pytest.raises(FileMissingError):
        st.size("nope/x")
    st.put("a/b", b"12345")
    with pytest.raises(FileSizeError):
        st.read_range("a/b", 2, 10)
    with pytest.raises(FileSizeError):
        st.read_range("a/b", 7, 1)


def test_multipart_streaming_writer(s3: S3Env) -> None:
    st = S3Storage.from_url(s3.root(), part_size=5 * MIB, max_concurrency=2)
    data = os.urandom(13 * MIB + 123)
    w = st.open_writer("att/data/big.safetensors")
    step = 3 * MIB + 7
    for i in range(0, len(data), step):
        w.write(memoryview(data)[i : i + step])
        assert not st.exists("att/data/big.safetensors")  # invisible until close
    w.close()
    assert st.size("att/data/big.safetensors") == len(data)
    got = st.read_range("att/data/big.safetensors", 6 * MIB - 5, 10)
    assert got == data[6 * MIB - 5 : 6 * MIB + 5]
    # The server holds the whole-object CRC32C we sent (FULL_OBJECT multipart checksum).
    assert st.checksum_crc32c("att/data/big.safetensors") == crc32c.crc32c(data)
    head = s3.boto().head_object(Bucket=s3.bucket, Key="ckpts/att/data/big.safetensors",
                                 ChecksumMode="ENABLED")
    assert base64.b64decode(head["ChecksumCRC32C"]) == crc32c.crc32c(data).to_bytes(4, "big")
    # Large reads are split into concurrent ranged GETs.
    st2 = S3Storage.from_url(s3.root(), read_chunk=4 * MIB)
    buf = bytearray(len(data))
    st2.read_into("att/data/big.safetensors", 0, memoryview(buf))
    assert bytes(buf) == data
    assert st2.stats.get_requests == 4 and st2.stats.get_bytes == len(data)


def test_writer_abort_leaves_nothing(s3: S3Env) -> None:
    st = S3Storage.from_url(s3.root(), part_size=5 * MIB)
    w = st.open_writer("att/data/x")
    w.write(os.urandom(11 * MIB))
    w.abort()
    assert not st.exists("att/data/x")
    uploads = s3.boto().list_multipart_uploads(Bucket=s3.bucket).get("Uploads", [])
    assert uploads == []
    # A writer used as a context manager aborts on exceptions.
    with pytest.raises(RuntimeError), st.open_writer("att/data/y") as w2:
        w2.write(b"abc")
        raise RuntimeError("boom")
    assert not st.exists("att/data/y")


def test_abort_uploads_cleans_killed_writers(s3: S3Env) -> None:
    st = S3Storage.from_url(s3.root(), part_size=5 * MIB)
    w = st.open_writer("att/data/x")
    w.write(os.urandom(6 * MIB))  # starts a multipart upload, never completed
    w._parts[0].result()  # type: ignore[attr-defined]
    assert len(s3.boto().list_multipart_uploads(Bucket=s3.bucket).get("Uploads", [])) == 1
    assert st.abort_uploads("att") == 1
    assert s3.boto().list_multipart_uploads(Bucket=s3.bucket).get("Uploads", []) == []


def test_create_if_absent_is_exclusive(s3: S3Env) -> None:
    st = S3Storage.from_url(s3.root())
    assert st.create_if_absent("att/manifest.json", b'{"a": 1}')
    assert not st.create_if_absent("att/manifest.json", b'{"a": 2}')
    assert st.read_all("att/manifest.json", max_size=100) == b'{"a": 1}'
    results: list[bool] = []
    lock = threading.Lock()

    def racer(i: int) -> None:
        ok = S3Storage.from_url(s3.root()).create_if_absent("race/manifest.json", b"%d" % i)
        with lock:
            results.append(ok)

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]


def test_partial_read_fetches_only_the_range(s3_proxied: S3Env) -> None:
    st = S3Storage.from_url(s3_proxied.root())
    data = os.urandom(8 * MIB)
    st.put("att/data/w.safetensors", data)
    s3_proxied.proxy.reset()
    assert st.read_range("att/data/w.safetensors", 5 * MIB + 3, 4096) == data[5 * MIB + 3 :][:4096]
    log = s3_proxied.proxy.log
    assert log.get_log == [
        (f"/{s3_proxied.bucket}/ckpts/att/data/w.safetensors",
         f"bytes={5 * MIB + 3}-{5 * MIB + 3 + 4095}", 4096)
    ]


def test_retries_survive_500s(s3_proxied: S3Env) -> None:
    proxy = s3_proxied.proxy
    proxy.fail_every = 3
    st = S3Storage.from_url(s3_proxied.root(), part_size=5 * MIB, backoff_initial=0.01)
    data = os.urandom(12 * MIB)
    st.put("att/data/a", data)
    st.put("att/index/w00000.json", b"{}")
    assert st.create_if_absent("att/manifest.json", b"{1}")
    assert st.read_all("att/data/a", max_size=len(data)) == data
    assert st.read_range("att/data/a", 100, 10) == data[100:110]
    assert sorted(st.list_dirs("att")) == ["data", "index"]
    assert proxy.log.injected_500 >= 3


def test_conditional_put_retried_after_server_side_success(s3_proxied: S3Env) -> None:
    """The PUT reaches the server, the client sees a 500, retries, gets 412: still ours."""
    proxy = s3_proxied.proxy
    st = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01)
    st.validates_checksums()  # the probe PUT, before the PUTs counted below
    assert st.honours_conditional_put()  # the If-None-Match probe's two PUTs, the same
    proxy.reset()  # (the probes' requests counted)
    proxy.fail_after_every = 2  # every 2nd PUT: forwarded to the server, then answered 500
    proxy.match_method = "PUT"
    assert st.create_if_absent("a/manifest.json", b"first")  # request 1: plain success
    assert st.create_if_absent("b/manifest.json", b"mine")  # request 2: done, 500; retry 412
    assert proxy.log.injected_500 == 1
    assert not st.create_if_absent("b/manifest.json", b"other")


def test_slow_responses_time_out_and_retry(s3_proxied: S3Env) -> None:
    proxy = s3_proxied.proxy
    st = S3Storage.from_url(s3_proxied.root(), read_timeout=0.5, backoff_initial=0.01)
    st.put("att/x", b"0123456789")
    proxy.delay_every = 2
    proxy.delay_s = 1.5
    proxy.match_method = "GET"
    assert st.read_range("att/x", 2, 3) == b"234"
    assert st.read_range("att/x", 0, 10) == b"0123456789"
    assert proxy.log.injected_delays >= 1


def test_persistent_failure_is_a_storage_error(s3_proxied: S3Env) -> None:
    s3_proxied.proxy.fail_every = 1
    st = S3Storage.from_url(s3_proxied.root(), max_attempts=2, backoff_initial=0.01)
    with pytest.raises(StorageError, match=r"InternalError|500"):
        st.put("att/x", b"1")
    with pytest.raises(StorageError, match=r"500|InternalError"):
        st.read_range("att/x", 0, 1)


def test_missing_bucket_error_names_bucket(s3: S3Env) -> None:
    st = S3Storage.from_url("s3://no-such-bucket-pck/root")
    for op in (lambda: st.list_dirs(""), lambda: st.put("a/b", b"1"),
               lambda: st.read_range("a/b", 0, 1)):
        with pytest.raises(StorageError) as ei:
            op()
        msg = str(ei.value)
        assert "PCK-STORAGE" in msg and "no-such-bucket-pck" in msg and "does not exist" in msg
        assert "create it" in msg


def test_wrong_credentials_error(s3_proxied: S3Env, monkeypatch: pytest.MonkeyPatch) -> None:
    s3_proxied.proxy.deny_keys = {"AKIDWRONGKEY00000000"}
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDWRONGKEY00000000")
    st = S3Storage.from_url(s3_proxied.root())
    for op in (lambda: st.list_dirs(""), lambda: st.put("a/b", b"1"),
               lambda: st.read_range("a/b", 0, 1)):
        with pytest.raises(StorageError) as ei:
            op()
        msg = str(ei.value)
        assert "InvalidAccessKeyId" in msg and "AWS_ACCESS_KEY_ID" in msg
        assert "AKID…0000" in msg and s3_proxied.bucket in msg


def test_no_credentials_error(s3: S3Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    st = S3Storage.from_url(s3.root())
    with pytest.raises(StorageError, match="no AWS credentials"):
        st.list_dirs("")


_BIG = os.urandom(12 * MIB)


@pytest.fixture(scope="module")
def hyp_storage(moto_endpoint: str) -> S3Storage:
    from .conftest import base_env

    env = base_env(moto_endpoint)
    mp = pytest.MonkeyPatch()
    for k, v in env.items():
        mp.setenv(k, v)
    bucket = f"pck-hyp-{os.getpid()}"
    import boto3

    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1",
                 aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                 aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"]).create_bucket(Bucket=bucket)
    st = S3Storage.from_url(f"s3://{bucket}/h", part_size=5 * MIB, max_concurrency=2)
    st._client()
    st._store()
    mp.undo()
    return st


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(total=hst.integers(0, 12 * MIB),
       cuts=hst.lists(hst.integers(1, 7 * MIB), min_size=0, max_size=6),
       reads=hst.lists(hst.tuples(hst.integers(0, 12 * MIB), hst.integers(1, MIB)), max_size=3))
def test_writer_any_chunking_round_trips(hyp_storage: S3Storage, total: int, cuts: list[int],
                                         reads: list[tuple[int, int]]) -> None:
    """Invariant: any sequence of write() sizes gives the same object, size and server CRC32C."""
    data = memoryview(_BIG)[:total]
    path = f"obj/{total}-{len(cuts)}"
    w = hyp_storage.open_writer(path)
    pos = 0
    for c in cuts:
        w.write(data[pos : pos + c])
        pos = min(total, pos + c)
    w.write(data[pos:])
    w.close()
    assert hyp_storage.size(path) == total
    assert hyp_storage.checksum_crc32c(path) == crc32c.crc32c(data)
    for off, n in reads:
        if off + n <= total:
            assert hyp_storage.read_range(path, off, n) == bytes(data[off : off + n])
    hyp_storage.delete(path)


def test_read_into_many_is_one_ranged_get(s3_proxied: S3Env) -> None:
    st = S3Storage.from_url(s3_proxied.root(), read_chunk=MIB)
    data = os.urandom(3 * MIB)
    st.put("a/b", data)
    s3_proxied.proxy.reset()
    head, body, tail = bytearray(100), bytearray(5000), bytearray(7)
    st.read_into_many("a/b", 1000, [memoryview(head), memoryview(body), memoryview(tail)])
    assert bytes(head + body + tail) == data[1000 : 1000 + 5107]
    assert [(r, n) for _p, r, n in s3_proxied.proxy.log.get_log] == [("bytes=1000-6106", 5107)]
    # Spans above read_chunk are split into concurrent chunk-sized GETs, scattered correctly.
    bufs = [bytearray(n) for n in (MIB // 2, MIB + 3, 700_000, 1)]
    st.read_into_many("a/b", 5, [memoryview(b) for b in bufs])
    assert b"".join(bufs) == data[5 : 5 + sum(map(len, bufs))]


def test_read_into_many_fetches_a_chunk_inside_a_later_buffer_from_its_offset(
    s3_proxied: S3Env,
) -> None:
    """A chunk-sized GET that lies wholly inside a buffer after the first is fetched straight
    into it from the object's offset of that chunk: the reader's head/body/tail extent with a
    body above read_chunk. Test audit 21, finding 4: fetched from the offset less the
    buffer's position, such a read returned other bytes (a false PCK-CHECKSUM)."""
    st = S3Storage.from_url(s3_proxied.root(), read_chunk=MIB)
    data = os.urandom(4 * MIB)
    st.put("a/b", data)
    s3_proxied.proxy.reset()
    bufs = [bytearray(n) for n in (MIB, 2 * MIB, 7)]  # chunks 2 and 3 lie inside bufs[1]
    st.read_into_many("a/b", 3, [memoryview(b) for b in bufs])
    assert b"".join(bufs) == data[3 : 3 + 3 * MIB + 7]
    spans = sorted(tuple(int(x) for x in r.removeprefix("bytes=").split("-"))
                   for _p, r, _n in s3_proxied.proxy.log.get_log)
    # chunk-sized GETs that tile the span once: nothing fetched twice, nothing around it
    assert spans[0][0] == 3 and spans[-1][1] == 3 + 3 * MIB + 6, spans
    assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(spans)), spans
    assert all(hi - lo + 1 <= MIB for lo, hi in spans), spans


def test_delete_prefix_of_the_whole_root_is_refused(s3: S3Env) -> None:
    """mutation audit 22 A-102: ``S3Storage.delete_prefix('')`` names everything below the
    root: refused with PCK-USAGE, and no object (nor an unfinished upload) is deleted. ``'/'``
    is no path below the root (PCK-PATH-UNSAFE)."""
    from portable_ckpt.errors import CheckpointError, UsageError

    st = S3Storage.from_url(s3.root(), part_size=5 * MIB)
    st.put("att1/manifest.json", b"{}")
    st.put("att2/data/x", b"abc")
    w = st.open_writer("att3/data/y")
    w.write(os.urandom(6 * MIB))  # starts a multipart upload, never completed
    w._parts[0].result()  # type: ignore[attr-defined]
    with pytest.raises(UsageError) as ei:
        st.delete_prefix("")
    assert ei.value.code == "PCK-USAGE"
    with pytest.raises(CheckpointError):
        st.delete_prefix("/")
    assert sorted(i.path for i in st.list("")) == ["att1/manifest.json", "att2/data/x"]
    assert len(s3.boto().list_multipart_uploads(Bucket=s3.bucket).get("Uploads", [])) == 1
    w.abort()


def test_an_empty_folder_marker_is_foreign_not_a_zero_byte_object(s3: S3Env) -> None:
    """mutation audit 22 A-101: a folder marker (an empty key ending in '/', as the AWS console
    makes) comes back from obstore without its slash, as a 0-byte object 'att/data'. The raw
    keys decide: it is foreign (``list_foreign``), never an object of ``list`` (gc and verify
    would see a file the version does not list, and a delete would name another key)."""
    st = S3Storage.from_url(s3.root())
    st.put("att/data/w.safetensors", b"abc")
    s3.boto().put_object(Bucket=s3.bucket, Key="ckpts/att/data/", Body=b"")
    for recursive in (True, False):
        pfx = "att" if recursive else "att/data"
        assert [i.path for i in st.list(pfx, recursive=recursive)] == [
            "att/data/w.safetensors"], recursive
        assert "att/data/" in st.list_foreign("att"), st.list_foreign("att")


def test_a_non_empty_key_ending_in_a_slash_is_foreign_not_the_key_above(s3: S3Env) -> None:
    """mutation audit 22 A-100: a non-empty key '<root>/a/' is listed by obstore as 'a', a key
    above the prefix 'a/' (not sent to boto3 by the empty-object fallback). It is foreign:
    ``list('a/')`` never yields an object 'a', ``list_foreign`` names 'a/'."""
    st = S3Storage.from_url(s3.root())
    st.put("a/b", b"12345")
    s3.boto().put_object(Bucket=s3.bucket, Key="ckpts/a/", Body=b"not empty")
    assert [i.path for i in st.list("a/")] == ["a/b"]
    assert "a/" in st.list_foreign("a/")


def _answer_another_crc(
    monkeypatch: pytest.MonkeyPatch, st: S3Storage, method: str,
    when: Callable[[dict[str, Any]], bool] = lambda kw: True,
) -> None:
    """The real request is sent, and its answer names another CRC32C than the data's where
    ``when(kwargs)`` (moto always agrees: a transfer corrupted in transit, as a store reports it)."""
    client = st._client()
    real = getattr(client, method)

    def answer(**kwargs: Any) -> dict[str, Any]:
        resp = dict(real(**kwargs))
        if when(kwargs):
            resp["ChecksumCRC32C"] = base64.b64encode(
                crc32c.crc32c(b"other").to_bytes(4, "big")).decode()
        return resp

    monkeypatch.setattr(client, method, answer)


def test_a_part_whose_server_crc32c_differs_fails_the_upload(
    s3: S3Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mutation audit 22 A-109: a multipart part answered with another CRC32C than the data's
    (corrupted in transit) fails the upload with PCK-STORAGE; nothing is published. moto always
    agrees, so the real ``upload_part``'s answer is altered for part 2."""
    st = S3Storage.from_url(s3.root(), part_size=5 * MIB, max_concurrency=2)
    _answer_another_crc(monkeypatch, st, "upload_part", lambda kw: kw["PartNumber"] == 2)
    w = st.open_writer("att/data/big")
    with pytest.raises(StorageError, match="server CRC32C") as ei:
        w.write(_payload(11 * MIB))
        w.close()
    assert ei.value.code == "PCK-STORAGE"
    w.abort()
    assert not st.exists("att/data/big")
    assert s3.boto().list_multipart_uploads(Bucket=s3.bucket).get("Uploads", []) == []


def test_a_single_put_whose_server_crc32c_differs_fails(
    s3: S3Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mutation audit 22 A-111: a one-PUT upload answered with another CRC32C than the data's
    (corrupted in transit) raises PCK-STORAGE ("corrupted in transit"), never reports success.
    moto always agrees, so the real ``put_object``'s answer is altered."""
    st = S3Storage.from_url(s3.root())
    _answer_another_crc(monkeypatch, st, "put_object")
    with pytest.raises(StorageError, match="corrupted in transit") as ei:
        st.put("att/data/x", _payload(1000))
    assert ei.value.code == "PCK-STORAGE"
    # The object the server stored is removed: no file of the attempt holds bytes nobody wrote.
    assert not st.exists("att/data/x")
    w = st.open_writer("att/data/y")  # also when the caller closes and aborts by hand
    w.write(_payload(10))
    with pytest.raises(StorageError, match="corrupted in transit"):
        w.close()
    assert not st.exists("att/data/y")
    w.abort()
    assert not st.exists("att/data/y")


def test_a_completed_multipart_upload_whose_crc32c_differs_is_removed(
    s3: S3Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole object's CRC32C is answered by ``complete_multipart_upload``, after the object
    is in place: a wrong one fails the upload (PCK-STORAGE) and the object is deleted again
    (it stayed before). moto always agrees, so the real answer is altered."""
    st = S3Storage.from_url(s3.root(), part_size=5 * MIB, max_concurrency=2)
    _answer_another_crc(monkeypatch, st, "complete_multipart_upload")
    with pytest.raises(StorageError, match="corrupted in transit") as ei:
        with st.open_writer("att/data/big") as w:
            w.write(_payload(11 * MIB))
    assert ei.value.code == "PCK-STORAGE"
    assert not st.exists("att/data/big")
    assert s3.boto().list_multipart_uploads(Bucket=s3.bucket).get("Uploads", []) == []


@pytest.mark.parametrize("versioned", [False, True])
@pytest.mark.parametrize("size", [1000, 11 * MIB])
def test_an_upload_refused_for_its_crc32c_never_deletes_another_uploads_object(
    s3: S3Env, monkeypatch: pytest.MonkeyPatch, versioned: bool, size: int
) -> None:
    """Two copies of one version to one root upload the same keys. When the server answers
    one upload with another CRC32C, its object is deleted again; a plain delete removed the
    other copy's good object that had replaced it meanwhile, and that copy's commit record
    then named a file that was gone (left open at stop 23). The delete is conditional on the
    upload's ETag, or names its version where the bucket keeps versions."""
    bucket = s3.boto()
    if versioned:
        bucket.put_bucket_versioning(Bucket=s3.bucket,
                                     VersioningConfiguration={"Status": "Enabled"})
    st = S3Storage.from_url(s3.root(), part_size=5 * MIB, max_concurrency=2)
    other = b"the other copy's object" * 7
    method = "put_object" if size < 5 * MIB else "complete_multipart_upload"
    client = st._client()
    real = getattr(client, method)

    def answer(**kwargs: Any) -> dict[str, Any]:
        resp = dict(real(**kwargs))
        # the other copy's upload of the same key completes before this answer is read
        bucket.put_object(Bucket=s3.bucket, Key="ckpts/att/data/x", Body=other)
        resp["ChecksumCRC32C"] = base64.b64encode(crc32c.crc32c(b"x").to_bytes(4, "big")).decode()
        return resp

    monkeypatch.setattr(client, method, answer)
    w = st.open_writer("att/data/x")
    with pytest.raises(StorageError, match="corrupted in transit"):
        w.write(_payload(size))
        w.close()
    w.abort()
    assert st.read_all("att/data/x", max_size=1 << 20) == other
    if versioned:  # this upload's version is gone, the other's is the one left
        versions = bucket.list_object_versions(Bucket=s3.bucket, Prefix="ckpts/att/data/x")
        assert [v["Size"] for v in versions.get("Versions", [])] == [len(other)]
        assert not versions.get("DeleteMarkers")


def test_a_role_without_delete_object_version_still_removes_the_refused_upload(
    s3: S3Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Maintainer review 24, 3: on a versioned bucket the refused upload is deleted by its
    VersionId, which takes s3:DeleteObjectVersion; a role without it (AccessDenied, played
    here: moto checks no policy) left the object visible and `abort` raised. The delete then
    falls back to the one conditional on the upload's ETag."""
    from botocore.exceptions import ClientError

    bucket = s3.boto()
    bucket.put_bucket_versioning(Bucket=s3.bucket, VersioningConfiguration={"Status": "Enabled"})
    st = S3Storage.from_url(s3.root())
    _answer_another_crc(monkeypatch, st, "put_object")
    client = st._client()
    real_delete = client.delete_object
    asked: list[str] = []

    def delete_object(**kwargs: Any) -> Any:
        asked.append("VersionId" if "VersionId" in kwargs else "IfMatch" if "IfMatch" in kwargs
                     else "plain")
        if "VersionId" in kwargs:
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "denied"},
                               "ResponseMetadata": {"HTTPStatusCode": 403}}, "DeleteObject")
        return real_delete(**kwargs)

    monkeypatch.setattr(client, "delete_object", delete_object)
    w = st.open_writer("att/data/x")
    w.write(_payload(1000))
    with pytest.raises(StorageError, match="corrupted in transit"):
        w.close()
    w.abort()
    assert not st.exists("att/data/x") and asked == ["VersionId", "IfMatch"]


def test_the_part_size_doubles_every_1000_parts(s3: S3Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """mutation audit 22 A-108: an object of more than 1000 parts doubles its part size every
    1000 parts (S3 allows 10,000): part 1000 is the last of the first size. The multipart upload
    is real; the parts' uploads are recorded, not sent (1000 real parts are 5 GB), with the
    part size lowered to 4 bytes on the writer."""
    from concurrent.futures import Future

    sizes: dict[int, int] = {}

    class Recording:
        def submit(self, fn: object, number: int, body: bytearray) -> Future[dict[str, object]]:
            sizes[number] = len(body)
            fut: Future[dict[str, object]] = Future()
            fut.set_result({"PartNumber": number, "ETag": f'"{number}"'})
            return fut

    st = S3Storage.from_url(s3.root())
    monkeypatch.setattr(st, "_executor", Recording)
    w = st.open_writer("att/data/huge")
    w._part_size = 4  # type: ignore[attr-defined]
    w.write(b"x" * (4 * 1000 + 8 * 2))
    assert [sizes[n] for n in (1, 999, 1000, 1001, 1002)] == [4, 4, 4, 8, 8]
    assert len(sizes) == 1002
    w.abort()
    assert s3.boto().list_multipart_uploads(Bucket=s3.bucket).get("Uploads", []) == []
