"""The multipart writer of :class:`~portable_ckpt.storage.s3.S3Storage` (``open_writer``).

Buffers one part, uploads full parts concurrently (a bounded number in flight), completes the
upload on ``close`` with the whole object's CRC32C, and checks what the store answered; an
upload the store refused for its checksum is deleted again (only this upload's object).
"""

from __future__ import annotations

import functools
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, NoReturn

import crc32c as _crc32c

from portable_ckpt.errors import CheckpointError, StorageError
from portable_ckpt.storage._s3_options import _MAX_PART, _MAX_PARTS
from portable_ckpt.storage._s3_probes import _b64_crc
from portable_ckpt.storage._s3_requests import _BadAnswerError, _within
from portable_ckpt.storage.base import StreamWriter

if TYPE_CHECKING:
    from portable_ckpt.storage.s3 import S3Storage

__all__: list[str] = []


class _S3Writer(StreamWriter):
    """Buffers one part, uploads full parts concurrently (bounded), completes on close."""

    def __init__(self, storage: S3Storage, path: str, key: str) -> None:
        self._s = storage
        self._path = path
        self._key = key
        self._opts = storage.options
        self._part_size = self._opts.part_size
        self._buf = bytearray()
        self._crc = 0
        self._size = 0
        self._upload_id: str | None = None
        self._parts: list[Future[dict[str, Any]]] = []
        self._slots = threading.BoundedSemaphore(self._opts.max_concurrency)
        self._closed = False
        self._completed = False
        self._failed: BaseException | None = None
        #: What the server answered for the completed object (its ETag, VersionId): a delete
        #: of it removes this upload's object only.
        self._stored: dict[str, Any] = {}

    def _fail(self, op: str, exc: BaseException) -> NoReturn:
        self._failed = exc
        self._abort_quietly()
        self._s._fail(op, self._path, exc)

    def write(self, data: memoryview | bytes) -> None:
        if self._closed:
            raise StorageError(
                f"write {self._s._where(self._path)}: writer is closed", path=self._path
            )
        mv = memoryview(data).cast("B")
        self._crc = _crc32c.crc32c(mv, self._crc)
        self._size += len(mv)
        while len(mv):
            room = self._part_size - len(self._buf)
            take = mv[:room]
            self._buf += take
            mv = mv[len(take) :]
            if len(self._buf) >= self._part_size:
                self._flush_part()

    def _start(self) -> None:
        kwargs: dict[str, Any] = {"Bucket": self._s.bucket, "Key": self._key}
        if self._opts.checksum == "crc32c":
            kwargs["ChecksumAlgorithm"] = "CRC32C"
            kwargs["ChecksumType"] = "FULL_OBJECT"
        resp = self._post("create_multipart_upload", kwargs, "upload")
        upload_id = resp.get("UploadId")
        if not isinstance(upload_id, str) or not upload_id:
            # Nothing to abort by (an id is what an abort names); retrying the save may pass.
            self._fail("upload", _BadAnswerError(
                "the answer to CreateMultipartUpload has no UploadId"))
        self._upload_id = upload_id

    def _post(self, operation: str, kwargs: dict[str, Any], what: str) -> dict[str, Any]:
        """One POST of the multipart protocol (``operation`` of the boto3 client), counted."""
        try:
            resp: dict[str, Any] = self._s._boto_call(
                lambda: getattr(self._s._client(), operation)(**kwargs), "POST", self._key)
        except Exception as exc:
            self._fail(what, exc)
        self._s.stats.add(other_requests=1)
        return resp

    def _flush_part(self) -> None:
        if self._upload_id is None:
            self._start()
        self._raise_failed_part()
        body, self._buf = self._buf, bytearray()
        number = len(self._parts) + 1
        if number > _MAX_PARTS:
            raise StorageError(
                f"upload {self._s._where(self._path)}: more than {_MAX_PARTS} parts; raise "
                "PCK_S3_PART_SIZE",
                path=self._path, retryable=False,
            )
        # Keep the part count within S3's limit for very large objects: double the part size
        # every 1000 parts (2 TiB+ at the default size).
        if number % 1000 == 0:
            self._part_size = min(self._part_size * 2, _MAX_PART)
        self._slots.acquire()  # bounded memory: at most max_concurrency parts in flight
        try:
            fut = self._s._executor().submit(self._upload_part, number, body)
        except BaseException:
            self._slots.release()
            raise
        fut.add_done_callback(lambda _f: self._slots.release())
        self._parts.append(fut)

    def _upload_part(self, number: int, body: bytearray) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "Bucket": self._s.bucket,
            "Key": self._key,
            "UploadId": self._upload_id,
            "PartNumber": number,
            "Body": body,
        }
        part: dict[str, Any] = {"PartNumber": number}
        if self._opts.checksum == "crc32c":
            value = _b64_crc(_crc32c.crc32c(body))
            kwargs["ChecksumCRC32C"] = value
            part["ChecksumCRC32C"] = value

        def put_part() -> dict[str, Any]:
            resp: dict[str, Any] = self._s._client().upload_part(**kwargs)
            if not isinstance(resp.get("ETag"), str) or not resp["ETag"]:
                # The completion names each part's ETag: without it the upload cannot finish.
                # A part may be sent again (the same number replaces it): retried.
                raise _BadAnswerError(f"the answer to UploadPart {number} has no ETag")
            return resp

        resp = self._s._boto_call(put_part, "PUT", self._key, sent=len(body))
        self._s.stats.add(put_requests=1, put_bytes=len(body))
        part["ETag"] = resp["ETag"]
        returned = resp.get("ChecksumCRC32C")
        if "ChecksumCRC32C" in part and returned and returned != part["ChecksumCRC32C"]:
            raise StorageError(
                f"upload part {number} of {self._s._where(self._path)}: server CRC32C "
                f"{returned} differs from the data's {part['ChecksumCRC32C']}",
                path=self._path,
            )
        return part

    def _raise_failed_part(self) -> None:
        for fut in self._parts:
            exc = fut.exception() if fut.done() else None
            if exc is not None:
                self._fail("upload", exc)

    def close(self) -> None:
        if self._closed:
            if self._failed is not None:
                raise StorageError(
                    f"upload {self._s._where(self._path)} failed earlier: {self._failed}",
                    path=self._path,
                )
            return
        self._closed = True
        if self._upload_id is None:
            body = self._buf
            self._buf = bytearray()
            try:
                resp = self._s._put_object(self._path, self._key, body, self._crc, check=False)
            except CheckpointError as exc:
                self._failed = exc
                raise
            except Exception as exc:
                self._failed = exc
                self._s._fail("upload", self._path, exc)
            self._completed = True
            self._check_or_undo(resp)
            return
        if self._buf:
            self._flush_part()
        parts: list[dict[str, Any]] = []
        for fut in self._parts:
            try:
                parts.append(fut.result())
            except BaseException as exc:
                self._fail("upload", exc)
        kwargs: dict[str, Any] = {
            "Bucket": self._s.bucket,
            "Key": self._key,
            "UploadId": self._upload_id,
            "MultipartUpload": {"Parts": parts},
        }
        if self._opts.checksum == "crc32c":
            kwargs["ChecksumCRC32C"] = _b64_crc(self._crc)
            kwargs["ChecksumType"] = "FULL_OBJECT"
        resp = self._post("complete_multipart_upload", kwargs, "complete upload")
        self._upload_id = None
        self._completed = True
        self._check_or_undo(resp)

    def _check_or_undo(self, resp: dict[str, Any]) -> None:
        """Refuse an upload the server stored with another CRC32C, and remove the object.

        The object is in place once the upload completed; left there, it is a file of this
        attempt with bytes nobody wrote (gc would remove it only with the attempt).
        """
        self._stored = {k: resp[k] for k in ("ETag", "VersionId") if isinstance(resp.get(k), str)}
        try:
            self._s._check_returned_crc(self._path, resp, self._crc)
        except StorageError as exc:
            self._failed = exc
            try:
                self._delete_own()
                self._completed = False
            except CheckpointError:
                pass  # abort() tries again; the attempt's gc removes it otherwise
            raise

    def _delete_own(self) -> None:
        """Delete the object this upload stored, and never another upload's of the same key.

        Two copies of one version to one root upload the same keys: a plain delete of the
        object stored with the wrong CRC32C could remove the other copy's good one, which
        replaced it meanwhile (its commit record then names a file that is gone).
        """
        self._s._delete_stored(self._path, self._stored)

    def _abort_quietly(self) -> None:
        for fut in self._parts:
            fut.cancel()
        for fut in self._parts:
            if not fut.cancelled():
                try:
                    fut.exception()
                except BaseException:
                    pass
        if self._upload_id is not None:
            upload_id, self._upload_id = self._upload_id, None
            try:
                _within(functools.partial(
                    self._s._client().abort_multipart_upload,
                    Bucket=self._s.bucket, Key=self._key, UploadId=upload_id,
                ), self._s._deadline(), "DELETE", self._s._request_url(self._key))
                self._s.stats.add(other_requests=1)
            except Exception:
                pass
        self._buf = bytearray()

    def abort(self) -> None:
        self._closed = True
        if self._failed is None:
            self._failed = StorageError(f"upload {self._path!r} aborted", path=self._path)
        self._abort_quietly()
        if self._completed:  # like the local backend: abort removes what was written
            self._delete_own()
            self._completed = False
