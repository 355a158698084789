"""Start moto's S3 server (``python tests/s3/run_moto.py -H 127.0.0.1 -p PORT``), CRC32C checked.

moto computes a multipart upload's FULL_OBJECT CRC32C with ``crc32c``, imported lazily inside a
request thread, and silently falls back to zlib's CRC32 when that import fails (a bare
``except``). Once in a CI run every multipart checksum of one server came back wrong while the
stored bytes were right. Importing ``crc32c`` here, before the server takes a request, and
checking moto's checksum of the standard test vector makes such a server fail at start, not
look like a data-integrity bug of the code under test.
"""

from __future__ import annotations

import base64
import sys

import crc32c  # noqa: F401 - imported before any request thread exists
from moto.s3.utils import compute_checksum
from moto.server import main

# CRC32C("123456789") = 0xE3069283 (RFC 3720, B.4).
_VECTOR = base64.b64encode((0xE3069283).to_bytes(4, "big"))

if __name__ == "__main__":
    got = compute_checksum(b"123456789", "CRC32C")
    if got != _VECTOR:
        sys.exit(f"moto computes CRC32C('123456789') as {got!r}, not {_VECTOR!r}; refusing to start")
    main(sys.argv[1:])
