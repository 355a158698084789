"""Start moto's S3 server (``python tests/s3/run_moto.py -H 127.0.0.1 -p PORT``), CRC32C checked.

moto computes a multipart upload's FULL_OBJECT CRC32C with ``crc32c``, imported lazily inside a
request thread, and silently falls back to zlib's CRC32 when that import fails (a bare
``except``). Once in a CI run every multipart checksum of one server came back wrong while the
stored bytes were right. Importing ``crc32c`` here, before the server takes a request, and
checking moto's checksum of the standard test vector makes such a server fail at start, not
look like a data-integrity bug of the code under test.

moto checks ``If-None-Match: *`` (and ``If-Match``) and then stores, in two steps, in a server
thread per request: two conditional PUTs of one key that arrive together can both succeed
(a CI run saw two winners of eight racing ``create_if_absent``). S3 decides a conditional
write atomically; here the check and the store of a conditional request run under one lock,
so the server tests the client's exclusivity, not moto's race.
"""

from __future__ import annotations

import base64
import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

import crc32c  # noqa: F401 - imported before any request thread exists
from moto.s3.responses import S3Response
from moto.s3.utils import compute_checksum
from moto.server import main

# CRC32C("123456789") = 0xE3069283 (RFC 3720, B.4).
_VECTOR = base64.b64encode((0xE3069283).to_bytes(4, "big"))

_CONDITIONAL = threading.RLock()  # re-entered if a locked handler calls another


def _atomic_if_conditional(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``method`` under one lock when its request carries a write condition."""

    @functools.wraps(method)
    def run(self: S3Response, *args: Any, **kwargs: Any) -> Any:
        if self.headers.get("If-None-Match") is None and self.headers.get("If-Match") is None:
            return method(self, *args, **kwargs)
        with _CONDITIONAL:
            return method(self, *args, **kwargs)

    return run


# A PUT of an object, and CompleteMultipartUpload (a POST), are where moto checks a condition.
S3Response.put_object = _atomic_if_conditional(S3Response.put_object)  # type: ignore[method-assign]
S3Response._key_response_post = _atomic_if_conditional(  # type: ignore[method-assign]
    S3Response._key_response_post
)

if __name__ == "__main__":
    got = compute_checksum(b"123456789", "CRC32C")
    if got != _VECTOR:
        sys.exit(f"moto computes CRC32C('123456789') as {got!r}, not {_VECTOR!r}; refusing to start")
    main(sys.argv[1:])
