"""The S3 backend's options (from the environment) and its request counters.

:class:`S3Options` is everything :class:`~portable_ckpt.storage.s3.S3Storage` can be tuned by,
read from the standard AWS variables and ``PCK_S3_*``; :class:`S3IoStats` counts the requests it
sends. Kept apart from the backend so that a process can be told its options (``process_spec``)
without importing either client.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from portable_ckpt.errors import UsageError

__all__ = ["S3IoStats", "S3Options"]

_T = TypeVar("_T")

_MIB = 1 << 20
_MIN_PART = 5 * _MIB  # S3's minimum part size (all parts but the last)
_MAX_PART = 5 << 30
_MAX_PARTS = 10_000


def _env(name: str, default: _T, parse: Callable[[str], _T], kind: str) -> _T:
    """The environment variable ``name`` parsed, or ``default`` when unset or empty."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return parse(raw)
    except ValueError as exc:
        raise UsageError(f"environment variable {name}={raw!r} is not {kind}") from exc


def _flag(raw: str) -> bool:
    return raw.strip().lower() not in ("0", "false", "no", "off", "none")


@dataclass(frozen=True)
class S3Options:
    """Tuning of the S3 backend. Every field has an environment variable (read by ``from_env``).

    Attributes:
        part_size: Multipart part size in bytes (``PCK_S3_PART_SIZE``, default 16 MiB, at least
            5 MiB). Objects smaller than one part are uploaded with a single PUT.
        max_concurrency: Part uploads in flight per writer (``PCK_S3_CONCURRENCY``, default 4).
            A writer holds at most ``(max_concurrency + 1) * part_size`` bytes.
        read_chunk: Reads larger than this are split into concurrent ranged GETs of this size.
        max_attempts: Tries per request, first included (``PCK_S3_MAX_ATTEMPTS``, default 5).
        retry_seconds: A transient failure (5xx, throttling, a reset, a timeout) is retried
            until ``max_attempts`` tries were made *and* this many seconds have passed since
            the first (``PCK_S3_RETRY_SECONDS``, default 30): S3 answers 503 SlowDown for
            seconds while it scales a prefix that many ranks read at once, and five quick tries
            gave up after 1.5 s of sleep (S3 latency review F5). ``0``: tries only.
        backoff_initial: First retry delay in seconds (doubles each retry, with jitter).
        backoff_max: Largest retry delay in seconds.
        connect_timeout: Seconds to establish a connection (``PCK_S3_CONNECT_TIMEOUT``).
        read_timeout: Seconds without progress on a response (``PCK_S3_READ_TIMEOUT``, default
            20: S3 answers in well under a second; a black-holed endpoint took five times 60 s
            to fail, review F7).
        request_timeout: Seconds one request may take as a whole: connecting, sending, and
            receiving the whole answer (``PCK_S3_REQUEST_TIMEOUT``, default 600). The read
            timeout alone does not bound a body that trickles in (one byte every few seconds
            is progress); this does, for every client. 600 s lets a 64 MiB range or part move
            at about 110 KB/s (under 1 Mbit/s); an upload larger than 64 MiB (a
            ``part_size`` raised above it) gets the same allowance per 64 MiB.
        list_max_keys: Entries (keys, common prefixes, uploads, parts) one listing may return
            before it fails (``PCK_S3_LIST_MAX_KEYS``, default 2,000,000). A listing is kept in
            memory (a few hundred bytes an entry): a store that keeps answering "more to come"
            must not grow it without end. The largest real listing, a root's recursive scan
            by gc, is its versions times their files: two million covers 1,000 versions of
            2,000 files each.
        list_max_pages: Answers one listing may take (``PCK_S3_LIST_MAX_PAGES``, default
            10,000): S3 pages hold up to 1,000 entries, so two million entries take 2,000
            full pages; the rest is room for stores that answer shorter pages.
        list_max_empty_pages: Answers in a row with no entry that say "more to come"
            (``PCK_S3_LIST_MAX_EMPTY_PAGES``, default 100). S3 may answer a page that is empty
            but truncated (a run of delete markers or expired keys it skipped); an endless
            run of them fails early instead of taking ``list_max_pages`` requests.
        checksum: ``"crc32c"`` sends S3 native CRC32C checksums with every upload and compares
            the server's; ``"off"`` for stores without flexible checksums (``PCK_S3_CHECKSUM``).
        conditional_put: Commit with ``If-None-Match: *`` (``PCK_S3_CONDITIONAL_PUT``). Turn off
            only for stores that reject the header; ``atomic_create`` is then False, and every
            create is refused. A store that accepts the header but ignores it is found by a
            probe before the first create (:meth:`S3Storage.honours_conditional_put`) and
            refused the same way.
        endpoint_url: S3 endpoint (``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``); None = AWS.
        region: Region (``AWS_REGION`` / ``AWS_DEFAULT_REGION``, default ``us-east-1``).
        allow_http: Allow a plain-HTTP endpoint; None = only for loopback hosts or when
            ``AWS_ALLOW_HTTP=true``.

    """

    part_size: int = 16 * _MIB
    max_concurrency: int = 4
    read_chunk: int = 32 * _MIB
    max_attempts: int = 5
    retry_seconds: float = 30.0
    backoff_initial: float = 0.1
    backoff_max: float = 5.0
    connect_timeout: float = 10.0
    read_timeout: float = 20.0
    request_timeout: float = 600.0
    list_max_keys: int = 2_000_000
    list_max_pages: int = 10_000
    list_max_empty_pages: int = 100
    checksum: str = "crc32c"
    conditional_put: bool = True
    endpoint_url: str | None = None
    region: str | None = None
    allow_http: bool | None = None

    @classmethod
    def from_env(cls, **overrides: Any) -> S3Options:
        """Return options from the environment, with keyword ``overrides`` taking precedence."""
        opts = cls(
            part_size=_env("PCK_S3_PART_SIZE", cls.part_size, int, "an integer"),
            max_concurrency=_env("PCK_S3_CONCURRENCY", cls.max_concurrency, int, "an integer"),
            max_attempts=_env("PCK_S3_MAX_ATTEMPTS", cls.max_attempts, int, "an integer"),
            retry_seconds=_env("PCK_S3_RETRY_SECONDS", cls.retry_seconds, float, "a number"),
            connect_timeout=_env("PCK_S3_CONNECT_TIMEOUT", cls.connect_timeout, float, "a number"),
            read_timeout=_env("PCK_S3_READ_TIMEOUT", cls.read_timeout, float, "a number"),
            request_timeout=_env(
                "PCK_S3_REQUEST_TIMEOUT", cls.request_timeout, float, "a number"),
            list_max_keys=_env("PCK_S3_LIST_MAX_KEYS", cls.list_max_keys, int, "an integer"),
            list_max_pages=_env("PCK_S3_LIST_MAX_PAGES", cls.list_max_pages, int, "an integer"),
            list_max_empty_pages=_env(
                "PCK_S3_LIST_MAX_EMPTY_PAGES", cls.list_max_empty_pages, int, "an integer"),
            checksum=os.environ.get("PCK_S3_CHECKSUM", cls.checksum).strip().lower() or "crc32c",
            conditional_put=_env("PCK_S3_CONDITIONAL_PUT", cls.conditional_put, _flag, "a flag"),
            endpoint_url=os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
            or None,
            region=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None,
            allow_http=_env("AWS_ALLOW_HTTP", False, _flag, "a flag") or None,
        )
        opts = replace(opts, **overrides)
        opts.validate()
        return opts

    def validate(self) -> None:
        """Raise ``UsageError`` for out-of-range values."""
        if not _MIN_PART <= self.part_size <= _MAX_PART:
            raise UsageError(
                f"S3 part_size {self.part_size} must be between 5 MiB and 5 GiB (PCK_S3_PART_SIZE)"
            )
        if self.max_concurrency < 1 or self.max_attempts < 1 or self.read_chunk < _MIB:
            raise UsageError(
                "S3 max_concurrency and max_attempts must be >= 1 and read_chunk >= 1 MiB"
            )
        if self.checksum not in ("crc32c", "off"):
            raise UsageError(f"PCK_S3_CHECKSUM must be 'crc32c' or 'off', got {self.checksum!r}")
        for name, env in (("connect_timeout", "PCK_S3_CONNECT_TIMEOUT"),
                          ("read_timeout", "PCK_S3_READ_TIMEOUT"),
                          ("request_timeout", "PCK_S3_REQUEST_TIMEOUT")):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 < value <= 86400):
                raise UsageError(
                    f"S3 {name} must be more than 0 and at most 86400 seconds, got {value!r} "
                    f"({env})"
                )
        for name, env in (("list_max_keys", "PCK_S3_LIST_MAX_KEYS"),
                          ("list_max_pages", "PCK_S3_LIST_MAX_PAGES"),
                          ("list_max_empty_pages", "PCK_S3_LIST_MAX_EMPTY_PAGES")):
            if getattr(self, name) < 1:
                raise UsageError(f"S3 {name} must be >= 1, got {getattr(self, name)!r} ({env})")
        if not (math.isfinite(self.retry_seconds) and 0 <= self.retry_seconds <= 3600):
            raise UsageError(
                f"S3 retry_seconds must be between 0 and 3600, got {self.retry_seconds!r} "
                "(PCK_S3_RETRY_SECONDS)"
            )

    def may_retry(self, tries: int, elapsed: float) -> bool:
        """Whether a transient failure after ``tries`` tries and ``elapsed`` seconds is retried."""
        return tries < self.max_attempts or elapsed < self.retry_seconds


@dataclass
class S3IoStats:
    """Counters of the requests this storage object made (all threads together).

    Attributes:
        get_requests: ranged/whole GETs that succeeded (retried attempts are logged as
            ``storage.retry``, not counted).
        get_bytes: payload bytes received by GETs.
        put_requests: PUTs and UploadParts issued.
        put_bytes: payload bytes sent.
        other_requests: HEAD, LIST, DELETE, multipart create/complete/abort.

    """

    get_requests: int = 0
    get_bytes: int = 0
    put_requests: int = 0
    put_bytes: int = 0
    other_requests: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        """Add ``counts`` (field name -> increment) atomically."""
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    def snapshot(self) -> dict[str, int]:
        """Return the counters as a plain dict."""
        with self._lock:
            return {
                "get_requests": self.get_requests,
                "get_bytes": self.get_bytes,
                "put_requests": self.put_requests,
                "put_bytes": self.put_bytes,
                "other_requests": self.other_requests,
            }
