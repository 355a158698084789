"""Publishing on object stores (§4.4), against a real moto S3 server on 127.0.0.1."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.format.naming import new_attempt_id
from portable_ckpt.io.commit import commit
from portable_ckpt.io.writer import ShardWriter

from ._util import expect_code

pytestmark = pytest.mark.s3
pytest.importorskip("moto")
pytest.importorskip("boto3")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RecordingProxy:
    """Forwards every request to the S3 server and records (method, path, headers)."""

    def __init__(self, upstream_port: int) -> None:
        self.log: list[tuple[str, str, dict[str, str]]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _forward(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                headers = {k: v for k, v in self.headers.items()}
                proxy.log.append((self.command, self.path, {k.lower(): v for k, v in
                                                            headers.items()}))
                conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=30)
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                length = resp.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def moto_port() -> Iterator[int]:
    port = _free_port()
    run_moto = os.path.join(os.path.dirname(__file__), "..", "s3", "run_moto.py")
    proc = subprocess.Popen([sys.executable, run_moto, "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def s3_root(moto_port: int, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, RecordingProxy]]:
    import boto3

    for k in list(os.environ):
        if k.startswith(("AWS_", "PCK_S3_")):
            monkeypatch.delenv(k)
    proxy = RecordingProxy(moto_port)
    env = {"AWS_ENDPOINT_URL": proxy.url, "AWS_REGION": "us-east-1",
           "AWS_ACCESS_KEY_ID": "AKIDRULES", "AWS_SECRET_ACCESS_KEY": "secret",
           "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
           "PCK_S3_MAX_ATTEMPTS": "2", "PCK_S3_RETRY_SECONDS": "0"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    bucket = f"rules-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=f"http://127.0.0.1:{moto_port}", region_name="us-east-1",
                 aws_access_key_id="AKIDRULES",
                 aws_secret_access_key="secret").create_bucket(Bucket=bucket)
    yield f"s3://{bucket}/ckpts", proxy
    proxy.close()


def _write(root: str, step: int = 1) -> tuple[Any, str, Any]:
    from portable_ckpt.storage import open_storage

    storage = open_storage(root)
    attempt = new_attempt_id(step)
    w = ShardWriter(storage, attempt, 0)
    w.add_tensor("x", np.arange(6, dtype=np.float32))
    return storage, attempt, w.finish()


def test_commit_is_one_conditional_put(s3_root: tuple[str, RecordingProxy]) -> None:
    """R-COMMIT-11: the commit record is created by a single PUT with If-None-Match: *."""
    root, proxy = s3_root
    storage, attempt, idx = _write(root)
    proxy.log.clear()
    commit(storage, attempt, step=1, indexes=[idx], expected_writers=[0])
    touching = [(m, p, h) for m, p, h in proxy.log if "manifest.json" in p]
    writes = [(m, p, h) for m, p, h in touching if m in ("PUT", "POST")]
    assert len(writes) == 1, [(m, p) for m, p, _ in touching]
    method, path, headers = writes[0]
    assert method == "PUT" and "uploadId" not in path and "uploads" not in path
    assert headers.get("if-none-match") == "*"
    assert portable_ckpt.open(root).id == attempt


def test_precondition_failure_is_commit_conflict(s3_root: tuple[str, RecordingProxy]) -> None:
    """R-COMMIT-12: an existing commit record (HTTP 412) is PCK-COMMIT-CONFLICT; it is unchanged."""
    import boto3

    root, proxy = s3_root
    storage, attempt, idx = _write(root)
    commit(storage, attempt, step=1, indexes=[idx], expected_writers=[0])
    bucket = root.split("/")[2]
    s3 = boto3.client("s3", endpoint_url=proxy.url, region_name="us-east-1")
    key = f"ckpts/{attempt}/manifest.json"
    before = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    proxy.log.clear()
    expect_code("PCK-COMMIT-CONFLICT", commit, storage, attempt, step=1, indexes=[idx],
                expected_writers=[0],
                continuation=portable_ckpt.Continuation("statistical", 1, None))
    assert any(m == "PUT" and h.get("if-none-match") == "*" for m, p, h in proxy.log
               if "manifest.json" in p)
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == before


def test_store_without_conditional_put_refuses_to_commit(
        s3_root: tuple[str, RecordingProxy], monkeypatch: pytest.MonkeyPatch) -> None:
    """R-COMMIT-13: a backend that cannot create conditionally refuses to commit (PCK-STORAGE)."""
    root, proxy = s3_root
    _, attempt, idx = _write(root)  # written where the store may commit
    monkeypatch.setenv("PCK_S3_CONDITIONAL_PUT", "0")
    from portable_ckpt.storage import open_storage

    storage = open_storage(root)
    assert storage.capabilities.atomic_create is False
    proxy.log.clear()
    expect_code("PCK-STORAGE", commit, storage, attempt, step=1, indexes=[idx],
                expected_writers=[0])
    # A writer asks before its first byte (backend review 27, L12: refused at the commit,
    # after every file was written and deleted again).
    expect_code("PCK-STORAGE", ShardWriter, storage, new_attempt_id(2), 0)
    assert proxy.log == []  # refused without a request
