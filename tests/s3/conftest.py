"""Fixtures: a real moto S3 server (``python -m moto.server``) on loopback, buckets, a fault proxy.

One server is started per test session (or reused when ``PCK_TEST_S3_ENDPOINT`` names one that
``.ci/start-moto.sh`` started). Every test gets its own bucket and AWS environment.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import pytest

from .faultproxy import FaultProxy

pytestmark = pytest.mark.s3

ACCESS_KEY = "AKIDPORTABLECKPT0001"
SECRET_KEY = "portable-ckpt-test-secret"
#: The server launcher (imports and checks moto's CRC32C before serving; see its docstring).
RUN_MOTO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "run_moto.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(url: str, proc: subprocess.Popen[bytes] | None, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"moto server exited early with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/moto-api/", timeout=1):
                return
        except urllib.error.HTTPError:
            return  # it answered
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"moto server at {url} did not answer within {timeout}s")


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    preset = os.environ.get("PCK_TEST_S3_ENDPOINT")
    if preset:
        _wait_ready(preset, None)
        yield preset
        return
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, RUN_MOTO, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def fault_proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    host, port = moto_endpoint.removeprefix("http://").split(":")
    proxy = FaultProxy(host, int(port))
    yield proxy
    proxy.close()


@dataclass
class S3Env:
    endpoint: str  # the moto server
    proxy: FaultProxy
    bucket: str

    def root(self, name: str = "ckpts") -> str:
        return f"s3://{self.bucket}/{name}"

    def listings(self) -> Counter[tuple[str, bool]]:
        """ListObjectsV2 requests through the proxy by ``(prefix, with delimiter)``.

        Not the one-key probes (``max-keys``).
        """
        out: Counter[tuple[str, bool]] = Counter()
        for path, _, _ in self.proxy.log.get_log:
            q = parse_qs(urlsplit(path).query)
            if q.get("list-type") == ["2"] and "max-keys" not in q:
                out[(q["prefix"][0], "delimiter" in q)] += 1
        return out

    def boto(self, endpoint: str | None = None):  # type: ignore[no-untyped-def]
        import boto3

        return boto3.client(
            "s3", endpoint_url=endpoint or self.endpoint, region_name="us-east-1",
            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
        )


def base_env(endpoint: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "PCK_S3_MAX_ATTEMPTS": "5",
        # Tries only: the tests of persistent failures fail fast; the time budget (30 s by
        # default) has its own tests (test_retry_budget_s3.py).
        "PCK_S3_RETRY_SECONDS": "0",
    }


@pytest.fixture
def s3(moto_endpoint: str, fault_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> S3Env:
    """A fresh bucket; the AWS environment points straight at moto (not the proxy)."""
    for k in list(os.environ):
        if k.startswith(("AWS_", "PCK_S3_")):
            monkeypatch.delenv(k)
    for k, v in base_env(moto_endpoint).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    fault_proxy.reset()
    env = S3Env(moto_endpoint, fault_proxy, f"pck-{uuid.uuid4().hex[:12]}")
    env.boto().create_bucket(Bucket=env.bucket)
    return env


@pytest.fixture
def s3_proxied(s3: S3Env, monkeypatch: pytest.MonkeyPatch) -> S3Env:
    """Like ``s3`` but every client request goes through the fault proxy."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.proxy.url)
    return s3
