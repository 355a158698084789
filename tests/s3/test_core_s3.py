"""Core entry points with ``s3://`` roots against the moto server: save, read, ls, gc, verify."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.cli.main import main as cli_main
from portable_ckpt.errors import NotFoundError, StorageError
from portable_ckpt.format.manifest import Continuation
from portable_ckpt.io.commit import commit
from portable_ckpt.io.reader import ReadRequest
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.storage import open_storage
from portable_ckpt.storage.s3 import S3Storage

from .conftest import S3Env

pytestmark = pytest.mark.s3


def _save_two_writers(root: str, step: int, a: np.ndarray) -> str:
    storage = open_storage(root, create=True)
    attempt = new_attempt_id(step)
    half = a.shape[0] // 2
    indexes = []
    for rank in range(2):
        w = ShardWriter(storage, attempt, rank, block_size=64 * 1024)
        w.add_tensor("model.w", a[rank * half : (rank + 1) * half], offsets=(rank * half, 0),
                     global_shape=a.shape)
        if rank == 0:
            w.add_entry("sched", {"epoch": step})
        indexes.append(w.finish())
    commit(storage, attempt, step=step, indexes=None, expected_writers=[0, 1],
           continuation=Continuation(contract="exact", world_size=2, mesh=None))
    return attempt


def test_save_read_partial_ls_verify_gc(s3_proxied: S3Env) -> None:
    root = s3_proxied.root("run")
    a = np.arange(2048 * 256, dtype=np.float32).reshape(2048, 256)  # 2 MiB, 1 MiB per writer
    first = _save_two_writers(root, 10, a)
    second = _save_two_writers(root, 20, a + 1)

    versions = portable_ckpt.list_versions(root)
    assert [(v.id, v.status) for v in versions] == [(first, "committed"), (second, "committed")]

    ck = portable_ckpt.open(root)
    assert ck.id == second and ck.step == 20 and ck.entry("sched") == {"epoch": 20}
    np.testing.assert_array_equal(ck.read("model.w"), a + 1)
    # Resharded read: a box straddling both writers' shards.
    np.testing.assert_array_equal(ck.read("model.w", [1020, 10], [12, 7]),
                                  (a + 1)[1020:1032, 10:17])

    # A partial read fetches only ranges, never a whole data object.
    proxy = s3_proxied.proxy
    ck2 = portable_ckpt.open(f"{root}/{first}")
    proxy.reset()
    out = ck2.read("model.w", [3, 4], [2, 5])
    np.testing.assert_array_equal(out, a[3:5, 4:9])
    data_gets = [g for g in proxy.log.get_log if "/data/" in g[0]]
    assert data_gets, proxy.log.get_log
    assert all(rng is not None and rng.startswith("bytes=") for _p, rng, _n in data_gets)
    fetched = sum(n for _p, _r, n in data_gets)
    shard_size = ck2.storage.size(f"{first}/{next(iter(ck2.manifest.files))}")
    # The blocks touched (64 KiB each) and the header: far less than the 1 MiB shard.
    assert fetched <= 3 * 64 * 1024 + 4096 and fetched < shard_size / 4, (fetched, shard_size)

    assert ck.verify(deep=True) == []

    # An incomplete attempt (data written, never committed) is listed as such and gc'ed.
    storage = open_storage(root)
    w = ShardWriter(storage, new_attempt_id(30), 0)
    w.add_tensor("model.w", a)
    w.finish()
    statuses = [v.status for v in portable_ckpt.list_versions(root)]
    assert statuses == ["committed", "committed", "incomplete"]
    with pytest.raises(NotFoundError):
        portable_ckpt.open(root, step=30)
    rep = portable_ckpt.gc(root, keep=1, grace_seconds=0.0)
    assert rep.deleted == [first] and len(rep.abandoned) == 1
    assert [v.id for v in portable_ckpt.list_versions(root)] == [second]
    assert not any(i.path.startswith(first) for i in storage.list(""))


def test_cli_entry_points_on_s3(s3: S3Env, capsys: pytest.CaptureFixture[str]) -> None:
    root = s3.root("cli")
    a = np.ones((64, 64), dtype=np.float32)
    portable_ckpt.save_arrays(root, {"w": a}, step=1)
    attempt = _save_two_writers(root, 2, np.zeros((8, 8), dtype=np.float32))
    assert cli_main(["ls", root, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [v["status"] for v in doc["versions"]] == ["committed", "committed"]
    assert cli_main(["inspect", root, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["attempt_id"] == attempt
    assert cli_main(["verify", f"{root}/{attempt}", "--deep", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    assert cli_main(["gc", root, "--keep", "1", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["deleted"]) == 1
    assert cli_main(["ls", "s3://no-such-bucket-cli/x"]) == 1
    err = capsys.readouterr().err
    assert "PCK-STORAGE" in err and "no-such-bucket-cli" in err


def test_faults_survived_end_to_end(s3_proxied: S3Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PCK_S3_READ_TIMEOUT", "0.5")
    proxy = s3_proxied.proxy
    proxy.fail_every = 4
    proxy.delay_every = 7
    proxy.delay_s = 1.0
    root = s3_proxied.root("faulty")
    a = np.random.default_rng(0).standard_normal((256, 128)).astype(np.float32)
    attempt = _save_two_writers(root, 5, a)
    ck = portable_ckpt.open(root)
    assert ck.id == attempt
    np.testing.assert_array_equal(ck.read("model.w"), a)
    assert ck.verify(deep=True) == []
    assert proxy.log.injected_500 >= 3 and proxy.log.injected_delays >= 1


def test_missing_bucket_and_wrong_credentials(s3_proxied: S3Env,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(StorageError, match="bucket 'pck-missing-bucket' does not exist"):
        portable_ckpt.open("s3://pck-missing-bucket/run")
    with pytest.raises(StorageError, match="does not exist"):
        portable_ckpt.save_arrays("s3://pck-missing-bucket/run", {"w": np.ones(3)}, step=1)
    s3_proxied.proxy.deny_keys = {"AKIDBADBADBADBAD0000"}
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDBADBADBADBAD0000")
    with pytest.raises(StorageError, match=r"InvalidAccessKeyId.*AWS_ACCESS_KEY_ID"):
        portable_ckpt.save_arrays(s3_proxied.root(), {"w": np.ones(3)}, step=1)
    with pytest.raises(StorageError, match="InvalidAccessKeyId"):
        portable_ckpt.list_versions(s3_proxied.root())


_KILLED_WRITER = r"""
import os, sys, numpy as np
from portable_ckpt.storage import open_storage
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.io.commit import commit
root, mode = sys.argv[1], sys.argv[2]
st = open_storage(root)
aid = new_attempt_id(7)
print(aid, flush=True)
w = ShardWriter(st, aid, 0, max_file_bytes=6 << 20)
w.add_tensor("big", np.ones((4, 4 << 20), dtype=np.uint8))  # 16 MiB -> several files, parts
idx = w.finish()
print("FINISHED", flush=True)
if mode == "before-commit":
    import time; time.sleep(60)
commit(st, aid, step=7, indexes=[idx], expected_writers=[0])
print("COMMITTED", flush=True)
"""


@pytest.mark.parametrize("mode", ["mid-upload", "before-commit"])
def test_killed_writer_leaves_nothing_committed(s3_proxied: S3Env, mode: str) -> None:
    root = s3_proxied.root("killed")
    proxy = s3_proxied.proxy
    env = dict(os.environ, PCK_S3_PART_SIZE=str(5 << 20))
    if mode == "mid-upload":
        proxy.match_method = "PUT"
        proxy.delay_every = 1
        proxy.delay_s = 0.3
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, root, mode],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        attempt = proc.stdout.readline().strip()
        if mode == "mid-upload":
            deadline = time.monotonic() + 30
            while proxy.log.by_method.get("PUT", 0) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
        else:
            assert proc.stdout.readline().strip() == "FINISHED"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    proxy.reset()
    assert attempt
    assert not any(v.status == "committed" for v in portable_ckpt.list_versions(root))
    with pytest.raises(NotFoundError):
        portable_ckpt.open(root)
    storage = open_storage(root)
    assert isinstance(storage, S3Storage)
    assert not storage.exists(f"{attempt}/manifest.json")
    # gc removes the abandoned attempt; orphaned multipart uploads are aborted.
    portable_ckpt.gc(root, keep=1, grace_seconds=0.0)
    storage.abort_uploads("")
    assert list(storage.list("")) == []
    assert s3_proxied.boto().list_multipart_uploads(Bucket=s3_proxied.bucket).get("Uploads",
                                                                                   []) == []


def test_tensor_tables_on_s3(s3: S3Env) -> None:
    """Format 1.1 on an object store: writer tables uploaded with their indexes, read back by the
    committer on its thread pool (R-TABLE-1), the merged zstd table published before the manifest,
    and a resharded partial read through it (R-TABLE-8)."""
    root = s3.root("tables")
    storage = open_storage(root, create=True)
    attempt = new_attempt_id(5)
    a = np.arange(64 * 48, dtype=np.float32).reshape(64, 48)
    for rank in range(4):
        w = ShardWriter(storage, attempt, rank, tensor_table=True)
        w.add_tensor("w", a[rank * 16:(rank + 1) * 16], offsets=(rank * 16, 0), global_shape=a.shape)
        w.finish()
    m = commit(storage, attempt, step=5, expected_writers=[0, 1, 2, 3],
               continuation=Continuation(contract="exact", world_size=4, mesh=None))
    assert m.format_version == "1.1" and m.tensor_table is not None
    keys = {o.path for o in storage.list(f"{attempt}/")}
    assert f"{attempt}/{m.tensor_table.file}" in keys
    assert {f"{attempt}/index/w{r:05d}.tensors.safetensors" for r in range(4)} <= keys
    ck = portable_ckpt.open(root)
    assert ck.id == attempt and ck.tensors["w"].range_count == 4
    np.testing.assert_array_equal(ck.read("w", [10, 5], [20, 30]), a[10:30, 5:35])
    assert ck.verify(deep=True) == []


def test_read_many_on_s3_fetches_each_block_once_concurrently(s3_proxied: S3Env) -> None:
    """A planned read on S3: one ranged GET per extent, each byte fetched once, bounded windows."""
    root = s3_proxied.root("many")
    storage = open_storage(root, create=True)
    attempt = new_attempt_id(1)
    w = ShardWriter(storage, attempt, 0, block_size=4096)
    rng = np.random.default_rng(3)
    tensors = {f"t{i}": rng.standard_normal(50 + 31 * i).astype(np.float32) for i in range(60)}
    for k, v in tensors.items():
        w.add_tensor(k, v)
    big = rng.standard_normal((3000, 700)).astype(np.float32)  # 8 MiB: several windows
    w.add_tensor("big", big)
    commit(storage, attempt, step=1, indexes=[w.finish()])
    ck = portable_ckpt.open(root)
    proxy = s3_proxied.proxy
    ck.read("t0")  # the shard header: read once, then every tensor is planned together
    proxy.reset()
    reqs = [ReadRequest(k) for k in tensors]
    reqs.append(ReadRequest("big", (100, 0), (2500, 700)))
    got = ck.read_many(reqs)
    for (k, v), arr in zip(tensors.items(), got):
        np.testing.assert_array_equal(arr, v, err_msg=k)
    np.testing.assert_array_equal(got[-1], big[100:2600])
    gets = [(r, n) for p, r, n in proxy.log.get_log if "/data/" in p]
    spans = sorted(tuple(int(x) for x in r.removeprefix("bytes=").split("-")) for r, _ in gets)
    # No byte fetched twice, and far fewer GETs than tensors (the small ones share extents).
    assert all(a[1] < b[0] for a, b in itertools.pairwise(spans)), spans
    assert len(gets) < 20, gets
    need = sum(v.nbytes for v in tensors.values()) + 2500 * 700 * 4
    # Only the partial blocks at the extents' edges are extra; no GET exceeds a pipeline window.
    assert need <= sum(n for _, n in gets) <= need + 2 * 4096 * len(gets)
    assert max(n for _, n in gets) <= 8 << 20


def test_exit_classes_on_s3(s3_proxied: S3Env, capsys: pytest.CaptureFixture[str],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    """SRE review S3, S4: answers that waiting does not mend exit 1, not 75 ("retry"): a
    bucket in another region (a redirect), an invalid bucket name, a per-key AccessDenied of
    a bulk delete (gc without s3:DeleteObject, which was even retried); a 5xx the retries
    gave up on is 75. `ls --latest` says 69, never 1 ("none")."""
    monkeypatch.setenv("PCK_S3_MAX_ATTEMPTS", "2")
    monkeypatch.setenv("PCK_S3_RETRY_SECONDS", "0")
    proxy = s3_proxied.proxy
    root = s3_proxied.root("classes")
    for step in (1, 2, 3):
        portable_ckpt.save_arrays(root, {"w": np.arange(8.0)}, step=step)
    for status, code, want in ((301, "PermanentRedirect", 1), (400, "InvalidBucketName", 1),
                               (503, "ServiceUnavailable", 75)):
        proxy.reset()
        proxy.fail_status, proxy.fail_every = (status, code), 1
        assert cli_main(["ls", root, "--json"]) == want, (status, code)
        doc = json.loads(capsys.readouterr().out)
        assert doc["error"]["retryable"] is (want == 75), doc
        assert cli_main(["ls", root, "--latest"]) == (75 if want == 75 else 69), (status, code)
        capsys.readouterr()
    proxy.reset()
    proxy.delete_key_errors, proxy.delete_key_code = 50, "AccessDenied"
    assert cli_main(["gc", root, "--keep", "1", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["deleted"] == [] and {u["retryable"] for u in doc["unknown"]} == {False}, doc
    assert "AccessDenied" in doc["unknown"][0]["message"]
    # per version, the commit record's delete and that of the deletion mark stored before it
    # (R-GC-13: removed again, as the record stays), each refused once: not retried
    refused = proxy.log.refused_keys
    assert len(refused) == 4 and len(set(refused)) == 4, refused
    assert sum(k.endswith("/manifest.json") for k in refused) == 2
    assert sum("/deleting/g" in k for k in refused) == 2
