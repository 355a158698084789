"""A real HTTP proxy on 127.0.0.1 in front of the moto server, used to inject S3 faults.

It forwards every request to the upstream server unchanged and can, per request:
* answer ``500 InternalError`` (or ``fail_status``, e.g. ``(503, "SlowDown")``) without
  forwarding every ``fail_every``-th request,
* forward, then answer ``500`` anyway every ``fail_after_every``-th request (the server did the
  work, the client believes it failed: the hardest case for a retried conditional PUT),
* sleep ``delay_s`` before answering every ``delay_every``-th request (slow responses / timeouts),
* answer ``403 InvalidAccessKeyId`` for access key ids in ``deny_keys`` (moto does not check
  credentials),
* leave the first key of a bulk delete in place and answer it with a per-key ``<Error>`` in the
  200 answer (``delete_key_errors`` times, code ``delete_key_code``),
* answer ``400 BadDigest`` to a PUT whose ``x-amz-checksum-crc32c`` is not its body's CRC32C
  (``check_crc32c``: a store that checks uploads, which moto does not),
* forward a matching request without the request headers named in ``drop_request_headers``
  (``{"If-None-Match"}``: a store that accepts a conditional PUT and ignores its condition;
  moto does not check signatures, so the signed header may go),
and, for matching requests, alter what the server answered (a hostile endpoint):
* ``list_forever``: answer every ListObjectsV2 as truncated, with a new continuation token each
  time (``"new"``), the same one (``"same"``), or a new one and no entries (``"empty"``);
  ``list_extra`` more entries on each such page; the server is always asked for its first page,
* ``list_page_size``: ask the server for pages of this many keys (real pagination, real tokens),
* ``trickle_s``: send the answer's headers, then its body one byte every ``trickle_s`` seconds
  (for at most ``trickle_max_s``, then the connection is closed),
* ``set_headers``: set (a value) or drop (``None``) answer headers; ``body_subs``: regex
  substitutions on the answer's body; ``cut_body``: that many bytes fewer, with an honest
  Content-Length (a short 206 whose Content-Range still names the whole range),
and counts requests and response bytes per method, plus every GET's Range header.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import crc32c

_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
        "upgrade"}


@dataclass
class ProxyLog:
    requests: int = 0
    by_method: dict[str, int] = field(default_factory=dict)
    response_bytes: dict[str, int] = field(default_factory=dict)
    get_log: list[tuple[str, str | None, int]] = field(default_factory=list)  # path, Range, bytes
    injected_500: int = 0
    injected_by_status: dict[int, int] = field(default_factory=dict)  # fail_every's answers
    injected_delays: int = 0
    denied: int = 0
    dropped_headers: int = 0  # requests forwarded without a header of drop_request_headers
    refused_keys: list[str] = field(default_factory=list)  # delete_key_errors' keys


def _b64(digest: Any) -> str:
    return base64.b64encode(digest.digest()).decode()


def _key_error(key: str, code: str) -> str:
    return f"<Error><Key>{key}</Key><Code>{code}</Code><Message>Injected.</Message></Error>"


def _drop_first_key(body: bytes) -> tuple[bytes, str | None]:
    """A DeleteObjects body without its first ``<Object>``, and that object's key."""
    m = re.search(rb"<Object><Key>(.*?)</Key>.*?</Object>", body, re.S)
    if m is None:
        return body, None
    return body[: m.start()] + body[m.end() :], m.group(1).decode()


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.fail_every = 0
        self.fail_status = (500, "InternalError")  # what fail_every answers
        self.fail_limit: int | None = None  # at most this many injected failures, when set
        self.fail_until = 0.0  # time.monotonic() before which every matching request fails
        self.fail_window = 0.0  # seconds of failures from the next matching request on
        self.flip_bodies = 0  # flip one bit in the body of this many matching requests
        # Bulk deletes (POST ?delete) whose first key is not deleted but answered with a
        # per-key <Error> of this code inside the 200 answer, as S3 does under load.
        self.delete_key_errors = 0
        self.delete_key_code = "SlowDown"
        self.delete_key_skip = 0  # bulk deletes passed untouched before delete_key_errors
        self.fail_after_every = 0
        self.delay_every = 0
        self.delay_s = 0.0
        self.match_method: str | None = None  # only count/inject on this method when set
        self.match_path: str | None = None  # regex on the request path
        self.deny_keys: set[str] = set()
        self.drop_request_headers: set[str] = set()  # case-insensitive; matching requests only
        self.check_crc32c = False  # refuse PUTs whose CRC32C header differs from the body's
        self.list_forever: str | None = None  # "new", "same" or "empty"
        self.list_extra = 0
        self.list_page_size = 0
        self.trickle_s = 0.0
        self.trickle_max_s = 20.0
        self.set_headers: dict[str, str | None] = {}
        self.body_subs: list[tuple[bytes, bytes]] = []
        self.cut_body = 0
        # Called with the request's path after the server answered a matching request and
        # before the client hears it: another writer acting in between.
        self.after_upstream: Callable[[str], None] | None = None
        self._tokens = 0
        self.log = ProxyLog()
        self._lock = threading.Lock()
        self._counter = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = bytearray()
                    while True:
                        line = self.rfile.readline().strip()
                        size = int(line.split(b";")[0], 16)
                        if size == 0:
                            while self.rfile.readline().strip():
                                pass
                            break
                        out += self.rfile.read(size)
                        self.rfile.readline()
                    return bytes(out)
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None
                       ) -> None:
                self.send_response(status)
                for k, v in (headers or {"Content-Type": "application/xml"}).items():
                    self.send_header(k, v)
                if self.command != "HEAD" or "Content-Length" not in (headers or {}):
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _error(self, status: int, code: str, message: str) -> None:
                body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                        f"<Message>{message}</Message><RequestId>FAULTPROXY</RequestId></Error>"
                        ).encode()
                self._reply(status, body)

            def _handle(self) -> None:
                body = self._body()
                auth = self.headers.get("Authorization", "")
                m = re.search(r"Credential=([^/]+)/", auth)
                if m and m.group(1) in proxy.deny_keys:
                    with proxy._lock:
                        proxy.log.denied += 1
                    self._error(403, "InvalidAccessKeyId",
                                "The AWS Access Key Id you provided does not exist in our records.")
                    return
                matches = (proxy.match_method in (None, self.command)) and (
                    proxy.match_path is None or re.search(proxy.match_path, self.path) is not None
                )
                fail = fail_after = delay = False
                with proxy._lock:
                    proxy.log.requests += 1
                    proxy.log.by_method[self.command] = proxy.log.by_method.get(self.command, 0) + 1
                    if matches:
                        proxy._counter += 1
                        n = proxy._counter
                        fail = bool(proxy.fail_every) and n % proxy.fail_every == 0
                        if proxy.fail_window > 0:  # the window opens now
                            proxy.fail_until = time.monotonic() + proxy.fail_window
                            proxy.fail_window = 0.0
                        fail = fail or time.monotonic() < proxy.fail_until
                        if fail and proxy.fail_limit is not None:
                            fail = proxy.fail_limit > 0
                            proxy.fail_limit -= fail
                        fail_after = (not fail and bool(proxy.fail_after_every)
                                      and n % proxy.fail_after_every == 0)
                        delay = bool(proxy.delay_every) and n % proxy.delay_every == 0
                        if proxy.flip_bodies > 0 and body and not fail:
                            proxy.flip_bodies -= 1
                            body = body[:-1] + bytes([body[-1] ^ 1])  # corrupted in transit
                refused: str | None = None
                refused_key: str | None = None
                if self.command == "POST" and "?delete" in self.path:
                    with proxy._lock:
                        if proxy.delete_key_skip > 0:
                            proxy.delete_key_skip -= 1
                        elif proxy.delete_key_errors > 0:
                            proxy.delete_key_errors -= 1
                            refused = proxy.delete_key_code
                    if refused is not None:
                        body, refused_key = _drop_first_key(body)
                        for name in ("Content-MD5", "x-amz-checksum-sha256",
                                     "x-amz-content-sha256"):
                            del self.headers[name]
                        self.headers["Content-MD5"] = _b64(hashlib.md5(body))
                        self.headers["x-amz-content-sha256"] = hashlib.sha256(body).hexdigest()
                if refused_key is not None and b"<Object>" not in body:
                    # Nothing else to delete (S3 refuses an empty list): only the per-key error.
                    with proxy._lock:
                        proxy.log.refused_keys.append(refused_key)
                    self._reply(200, (
                        '<?xml version="1.0" encoding="UTF-8"?>\n<DeleteResult xmlns='
                        '"http://s3.amazonaws.com/doc/2006-03-01/">'
                        f"{_key_error(refused_key, str(refused))}</DeleteResult>").encode())
                    return
                if delay:
                    with proxy._lock:
                        proxy.log.injected_delays += 1
                    time.sleep(proxy.delay_s)
                if fail and proxy.fail_status[0] == 0:  # a reset: the connection closes unanswered
                    with proxy._lock:
                        by = proxy.log.injected_by_status
                        by[0] = by.get(0, 0) + 1
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                sent_crc = self.headers.get("x-amz-checksum-crc32c")
                if proxy.check_crc32c and self.command == "PUT" and sent_crc is not None:
                    real = base64.b64encode(crc32c.crc32c(body).to_bytes(4, "big")).decode()
                    if sent_crc != real:
                        self._error(400, "BadDigest", "The CRC32C you specified did not match.")
                        return
                if fail:
                    status, code = proxy.fail_status
                    with proxy._lock:
                        proxy.log.injected_500 += status == 500
                        by = proxy.log.injected_by_status
                        by[status] = by.get(status, 0) + 1
                    self._error(status, code, "Injected error.")
                    return
                path = self.path
                listing = matches and self.command == "GET" and "list-type=2" in path
                if listing and proxy.list_forever:  # always the first page
                    path = re.sub(r"&?continuation-token=[^&]*", "", path)
                if listing and proxy.list_page_size:
                    path += f"&max-keys={proxy.list_page_size}"
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=120)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                    drop = {h.lower() for h in proxy.drop_request_headers} if matches else set()
                    if drop & {k.lower() for k in headers}:
                        headers = {k: v for k, v in headers.items() if k.lower() not in drop}
                        with proxy._lock:
                            proxy.log.dropped_headers += 1
                    if body or self.command in ("PUT", "POST"):
                        headers["Content-Length"] = str(len(body))
                    conn.request(self.command, path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    out_headers = {k: v for k, v in resp.getheaders()
                                   if k.lower() not in _HOP and k.lower() != "content-length"}
                    if self.command == "HEAD" and resp.getheader("Content-Length"):
                        out_headers["Content-Length"] = str(resp.getheader("Content-Length"))
                finally:
                    conn.close()
                with proxy._lock:
                    proxy.log.response_bytes[self.command] = (
                        proxy.log.response_bytes.get(self.command, 0) + len(data))
                    if self.command == "GET":
                        proxy.log.get_log.append((self.path, self.headers.get("Range"), len(data)))
                if matches and proxy.after_upstream is not None:
                    proxy.after_upstream(self.path)
                if fail_after:
                    with proxy._lock:
                        proxy.log.injected_500 += 1
                    self._error(500, "InternalError", "Injected after the server acted.")
                    return
                if refused is not None and refused_key is not None:
                    error = _key_error(refused_key, refused).encode()
                    data = data.replace(b"</DeleteResult>", error + b"</DeleteResult>")
                    with proxy._lock:
                        proxy.log.refused_keys.append(refused_key)
                if listing and proxy.list_forever:
                    data = proxy._endless_page(data)
                if matches and not fail_after:
                    for pat, repl in proxy.body_subs:
                        data = re.sub(pat, repl, data)
                    if proxy.cut_body:
                        data = data[: max(0, len(data) - proxy.cut_body)]
                    for name, value in proxy.set_headers.items():
                        for k in [k for k in out_headers if k.lower() == name.lower()]:
                            del out_headers[k]
                        if value is not None:
                            out_headers[name] = value
                    if proxy.trickle_s > 0 and self.command != "HEAD":
                        self._trickle(resp.status, data, out_headers)
                        return
                self._reply(resp.status, data, out_headers)

            def _trickle(self, status: int, data: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                deadline = time.monotonic() + proxy.trickle_max_s
                try:
                    for i in range(len(data)):
                        if time.monotonic() > deadline:
                            break
                        self.wfile.write(data[i : i + 1])
                        self.wfile.flush()
                        time.sleep(proxy.trickle_s)
                except OSError:
                    pass  # the client gave up
                self.close_connection = True

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _endless_page(self, data: bytes) -> bytes:
        """A ListObjectsV2 answer made to say "more to come" for ever (see ``list_forever``)."""
        with self._lock:
            self._tokens += 1
            n = self._tokens
        token = b"SAME" if self.list_forever == "same" else b"tok%d" % n
        if self.list_forever == "empty":
            data = re.sub(rb"<Contents>.*?</Contents>|<CommonPrefixes>.*?</CommonPrefixes>", b"",
                          data, flags=re.S)
            data = re.sub(rb"<KeyCount>\d+</KeyCount>", b"<KeyCount>0</KeyCount>", data)
        data = re.sub(rb"<NextContinuationToken>.*?</NextContinuationToken>", b"", data)
        data = data.replace(b"<IsTruncated>false</IsTruncated>", b"<IsTruncated>true</IsTruncated>")
        data = data.replace(b"</IsTruncated>", b"</IsTruncated><NextContinuationToken>" + token
                            + b"</NextContinuationToken>", 1)
        if self.list_extra:
            pfx = re.search(rb"<Prefix>([^<]*)</Prefix>", data)
            base = pfx.group(1) if pfx else b""
            extra = b"".join(
                b"<Contents><Key>%sjunk-%d-%d</Key><LastModified>2026-01-01T00:00:00.000Z"
                b"</LastModified><ETag>&quot;x&quot;</ETag><Size>1</Size><StorageClass>STANDARD"
                b"</StorageClass></Contents>" % (base, n, i) for i in range(self.list_extra))
            data = data.replace(b"<IsTruncated>", extra + b"<IsTruncated>", 1)
        return data

    def reset(self) -> None:
        with self._lock:
            self.fail_every = self.fail_after_every = self.delay_every = 0
            self.fail_status = (500, "InternalError")
            self.fail_limit = None
            self.fail_until = 0.0
            self.fail_window = 0.0
            self.flip_bodies = 0
            self.delete_key_errors = 0
            self.delete_key_code = "SlowDown"
            self.delete_key_skip = 0
            self.delay_s = 0.0
            self.match_method = self.match_path = None
            self.deny_keys = set()
            self.drop_request_headers = set()
            self.check_crc32c = False
            self.list_forever = None
            self.list_extra = self.list_page_size = self.cut_body = 0
            self.trickle_s = 0.0
            self.trickle_max_s = 20.0
            self.set_headers = {}
            self.body_subs = []
            self.after_upstream = None
            self._tokens = 0
            self.log = ProxyLog()
            self._counter = 0

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
