"""One S3 request's limits and the classification of its failures.

A request has a whole-request deadline (:func:`_within`: botocore has only per-socket
timeouts); a failure is classified as worth another try or final (:func:`_obstore_transient`,
:func:`_boto_transient`, :func:`classify_error`), and each retry is logged
(:func:`_log_retry`). The retry loop itself is :meth:`S3Storage._with_budget
<portable_ckpt.storage.s3.S3Storage>`.
"""

from __future__ import annotations

import contextvars
import ipaddress
import logging
import random
import re
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from portable_ckpt.logs import get_logger, log_event
from portable_ckpt.storage._s3_options import _MIB

__all__ = ["MAX_ABANDONED_REQUESTS", "classify_error"]

_T = TypeVar("_T")
_log = get_logger("storage.s3")  # the backend's logger: its records keep their name


def classify_error(exc: BaseException) -> tuple[str | None, int | None, str]:
    """Return (S3 error code, HTTP status, text) for a boto3 or obstore exception."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        err = response.get("Error", {})
        meta = response.get("ResponseMetadata", {})
        code = err.get("Code")
        status = meta.get("HTTPStatusCode")
        if code is not None and str(code).isdigit() and status is None:
            status = int(code)
        return (str(code) if code else None, status, str(exc))
    text = str(exc)
    code = None
    marker = text.find("<Code>")
    if marker >= 0:
        end = text.find("</Code>", marker)
        code = text[marker + 6 : end] if end > marker else None
    if code is None:  # a bulk delete's per-key error: "... failed for key K: ... (code: X)"
        per_key = re.search(r"\(code: ([A-Za-z]+)\)", text)
        code = per_key.group(1) if per_key else None
    status = None
    m = re.search(r"status code: (\d{3})", text)
    if m:
        status = int(m.group(1))
    elif "Received redirect" in text:  # obstore: a bucket in another region than configured
        status = 301
    if code is None and isinstance(exc, FileNotFoundError):
        code = "NoSuchKey"
    if code is None and type(exc).__name__ in ("PermissionDeniedError", "UnauthenticatedError"):
        status = status or 403
    return (code, status, text)


def _is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _mask_key(key: str | None) -> str:
    if not key:
        return "<none>"
    return key if len(key) <= 8 else f"{key[:4]}…{key[-4:]}"


_AUTH_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "InvalidToken",
    "ExpiredToken",
    "TokenRefreshRequired",
    "AllAccessDisabled",
}


def _wait_all(futures: Sequence[Future[Any]]) -> None:
    """Wait for every future (none is left running), then raise the first failure."""
    first: BaseException | None = None
    for fut in futures:
        try:
            fut.result()
        except BaseException as exc:
            first = first or exc
    if first is not None:
        raise first

#: The transfer size one :attr:`S3Options.request_timeout` allows for (see :meth:`_deadline`).
_TIMEOUT_BYTES = 64 * _MIB


class _RequestDeadlineError(Exception):
    """A boto3 request did not complete within its whole-request limit (a transient failure).

    botocore has only connect and read timeouts, each per socket operation: an answer that
    trickles in (a byte every few seconds) never trips them (S3 attack 25, M1).
    """


class _BadAnswerError(Exception):
    """The endpoint answered something malformed or inconsistent.

    A missing field, a body shorter than its own headers say. ``transient``: a retry of the
    request may mend it. Raised where the answer is checked and turned into a ``StorageError`` naming the object by
    :meth:`S3Storage._fail`: the malformed answer is the endpoint's fault, not a bug here, and
    never evidence about the checkpoint's own bytes (S3 attack 25, L1 and L4).
    """

    def __init__(self, detail: str, *, transient: bool = True) -> None:
        super().__init__(detail)
        self.detail = detail
        self.transient = transient


def _no_region_redirect(request_dict: dict[str, Any], **_: Any) -> None:
    """Mark every boto3 request as redirected already, so botocore never follows a 301.

    botocore answers a 301 without a region by asking HeadBucket, whose own 301 asks again:
    an endpoint that answers 301 to everything took 160 requests and a ``RecursionError``
    (found when every listing moved to boto3, S3 attack 25). The region is configured
    (``AWS_REGION``); a bucket in another one fails with its 301, as obstore's reads do.
    """
    redirect = request_dict.get("context", {}).get("s3_redirect")
    if isinstance(redirect, dict):
        redirect["redirected"] = True


#: Requests given up on (:func:`_within`) that may still hang, in this process, before no more
#: are sent: each holds a thread, a socket and, for an upload, its part's bytes.
MAX_ABANDONED_REQUESTS = 32
_ABANDONED = [0]
_ABANDONED_LOCK = threading.Lock()


def _within(call: Callable[[], _T], seconds: float, method: str, url: str) -> _T:
    """``call()``, or ``_RequestDeadlineError`` when it has not returned after ``seconds``.

    botocore cannot be told a whole-request limit, and a blocked socket read cannot be
    interrupted from another thread; so the request runs in a daemon thread of its own and is
    abandoned when late: that thread ends when the endpoint answers or its read timeout
    passes, and never holds up the interpreter's exit (a ``ThreadPoolExecutor``'s would). An
    abandoned write may still complete: every retried write here is one a lost answer may
    have completed already (see :meth:`S3Storage._boto_call`).
    """
    with _ABANDONED_LOCK:
        hanging = _ABANDONED[0]
    if hanging >= MAX_ABANDONED_REQUESTS:
        # Each request given up on keeps its thread and socket until the endpoint lets go: an
        # endpoint trickling every answer grew one of each per call without end (re-attack 25,
        # M2). No more are sent while that many hang; the caller's retries wait for them.
        raise _RequestDeadlineError(
            f"{method} {url} not sent: {hanging} earlier requests to the endpoint were given up "
            "after PCK_S3_REQUEST_TIMEOUT and still hang (the endpoint trickles or stalls its "
            "answers)")
    box: dict[str, Any] = {}
    done = threading.Event()
    ctx = contextvars.copy_context()
    given_up = [False]

    def run() -> None:
        try:
            box["value"] = ctx.run(call)
        except BaseException as exc:
            box["error"] = exc
        finally:
            with _ABANDONED_LOCK:
                done.set()
                if given_up[0]:
                    _ABANDONED[0] -= 1

    threading.Thread(target=run, name="pck-s3-request", daemon=True).start()
    if not done.wait(seconds):
        with _ABANDONED_LOCK:
            late = not done.is_set()
            if late:
                given_up[0] = True
                _ABANDONED[0] += 1
        if late:
            raise _RequestDeadlineError(
                f"{method} {url} did not complete within {seconds:g}s (PCK_S3_REQUEST_TIMEOUT)"
            )
    if "error" in box:
        raise box["error"]
    value: _T = box["value"]
    return value


def _log_retry(
    method: str, url: str, cause: str, attempt: int, max_attempts: int, budget: float = 0.0
) -> None:
    """One ``storage.retry`` record (WARNING): ``attempt`` is the try about to be made.

    Past ``max_attempts`` the tries go on within ``budget`` seconds (:attr:`S3Options.retry_seconds`).
    """
    fields = {"method": method, "url": url, "attempt": attempt, "max_attempts": max_attempts,
              "cause": cause}
    if attempt <= max_attempts:
        log_event(_log, "storage.retry", fields, "retrying %s %s after %s (attempt %d of %d)",
                  method, url, cause, attempt, max_attempts, level=logging.WARNING)
    else:
        log_event(_log, "storage.retry", fields,
                  "retrying %s %s after %s (attempt %d; retried for up to %gs)",
                  method, url, cause, attempt, budget, level=logging.WARNING)


#: Transport failures of obstore's HTTP client (``HttpError { kind: ... }``) worth another try.
_TRANSIENT_KINDS = frozenset({"Connect", "Request", "Timeout", "Interrupted", "Decode"})
_PERFORMING = re.compile(r"Error performing ([A-Z]+) (\S+)")
_HTTP_KIND = re.compile(r"HttpError \{\s*kind: (\w+)")


def _obstore_transient(exc: BaseException) -> tuple[str, str, str] | None:
    """``(method, url, cause)`` when an obstore failure is worth a retry, else ``None``.

    Retried as botocore's standard mode and object_store's own policy do: 5xx answers, 429
    (throttling) and transport failures (connect, timeout, reset or truncated body), and a bulk
    delete's per-key ``SlowDown``/``InternalError`` inside its 200 answer. Any other answer
    (404, 403, 412, 416) and anything not raised by obstore is final.
    """
    if not type(exc).__module__.startswith("obstore") or isinstance(exc, FileNotFoundError):
        return None
    code, status, text = classify_error(exc)
    m = _PERFORMING.search(text)
    method, url = (m.group(1), m.group(2).split("?", 1)[0]) if m else ("request", "?")
    if code in _AUTH_CODES:  # a per-key AccessDenied of a bulk delete (SRE review S4)
        return None
    if status is not None:
        if status < 500 and status != 429:
            return None
        return method, url, f"HTTP {status}" + (f" {code}" if code else "")
    if code in _RETRY_CODES or code in _KEY_RETRY_CODES:
        # A per-key error inside a 200 answer (a bulk delete): the request is idempotent, and
        # the keys that were deleted are answered "Deleted" again (S3 review F9).
        return method, url, f"{code} in the answer"
    kind = _HTTP_KIND.search(text)
    if kind is None or kind.group(1) not in _TRANSIENT_KINDS:
        return None
    detail = text.split(" - ", 1)[-1].split("\n", 1)[0].strip()
    return method, url, f"{kind.group(1)} error: {detail}"


#: The retries' jitter: never the module-global ``random``, which the training loop draws from
#: and :class:`~portable_ckpt.torch.RNGState` saves; a retried request during a save advanced it,
#: and the resumed job's stream differed from the one that lived through the retries
#: (continuation review F6).
_JITTER = random.SystemRandom()

#: Error codes of S3 answers below 500 that are worth another try (botocore's standard mode).
_RETRY_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
    "TooManyRequestsException", "RequestThrottled", "RequestTimeout", "RequestTimeoutException",
    "PriorRequestNotComplete", "BandwidthLimitExceeded", "ProvisionedThroughputExceededException",
})


#: S3 error codes of an upload refused for its checksum.
_CHECKSUM_REFUSALS = frozenset({"BadDigest", "InvalidDigest", "XAmzContentChecksumMismatch"})

#: Per-key codes of a bulk delete's 200 answer that mean "try again" (5xx-like). Any other
#: per-key code (AccessDenied, ...) is final.
_KEY_RETRY_CODES = frozenset({"InternalError", "ServiceUnavailable"})
#: Per-key codes (no HTTP status of their own) that waiting does not mend.
_KEY_FINAL_CODES = frozenset({"NoSuchBucket", "InvalidBucketName", "MethodNotAllowed",
                              "InvalidRequest", "InvalidArgument", "NotImplemented"})


def _boto_transient(exc: BaseException, method: str, url: str) -> tuple[str, str, str] | None:
    """``(method, url, cause)`` when a boto3 failure is worth another try.

    5xx answers, 429 and throttling codes, and transport failures (a reset, a timeout, a
    connection that could not be made); any other answer is final.
    """
    from botocore.exceptions import ClientError, HTTPClientError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    if isinstance(exc, _RequestDeadlineError):
        return method, url, f"Timeout error: {exc}"
    if isinstance(exc, _BadAnswerError):
        return (method, url, f"malformed answer: {exc.detail}") if exc.transient else None
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = str(err.get("Code") or "")
        if (isinstance(status, int) and (status >= 500 or status == 429)) or code in _RETRY_CODES:
            return method, url, f"HTTP {status}" + (f" {code}" if code else "")
        return None
    if isinstance(exc, (HTTPClientError, BotoConnectionError)):
        return method, url, f"{type(exc).__name__}: {exc}"
    return None
