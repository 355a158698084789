"""What the S3 backend learnt by probing a store, kept per process.

Two questions are asked of a store once, with a probe object at the root: whether it refuses an
upload with a wrong CRC32C, and whether it honours ``If-None-Match: *``. The answers are kept by
``(endpoint, bucket)``; an unknown answer for :data:`PROBE_UNKNOWN_SECONDS`.
"""

from __future__ import annotations

import base64
import os
import threading
import time
from collections.abc import Callable

from portable_ckpt.format.naming import PROBE_PREFIX

__all__ = ["PROBE_UNKNOWN_SECONDS"]

def _probe_name() -> str:
    """A fresh name for a probe at the root (spec §15.2, ``.pck-probe-<16 lowercase hex>``)."""
    return f"{PROBE_PREFIX}{os.urandom(8).hex()}"


def _b64_crc(value: int) -> str:
    return base64.b64encode(value.to_bytes(4, "big")).decode("ascii")


#: Seconds for which a probe that got no answer (the store refused the probe's PUT, e.g. 403
#: from a bucket policy on dot-keys, or a failure the retries did not mend) is remembered per
#: ``(endpoint, bucket)``: meanwhile the unknown answer's safe way is taken without a request
#: and without another warning, then the store is asked again (re-attack 26: a store that
#: refused the probes was probed, and warned about, at every commit, pin and deletion mark).
PROBE_UNKNOWN_SECONDS = 600.0

_Key = tuple[str | None, str]


class _Probed:
    """What a probe of a store learnt, kept for the process by ``(endpoint, bucket)``.

    A definite answer is kept for good; an unknown one (``None``: no answer said) for
    :data:`PROBE_UNKNOWN_SECONDS`, during which :meth:`get` gives ``unknown`` (the safe way)
    without a request. One probe runs at a time: threads that create at once send one probe,
    not one each (re-attack 26).
    """

    def __init__(self, unknown: bool) -> None:
        self.unknown = unknown
        self.answers: dict[_Key, bool] = {}
        self.unknown_since: dict[_Key, float] = {}  # time.monotonic() of the last unknown
        self.after_fork()

    def after_fork(self) -> None:
        self._lock = threading.Lock()
        self._probing = threading.Lock()

    def _known(self, key: _Key) -> bool | None:
        with self._lock:
            known = self.answers.get(key)
            if known is None and _unknown_kept(self.unknown_since.get(key)):
                return self.unknown  # unknown, and remembered: the safe way, without asking
            return known

    def get(self, key: _Key, probe: Callable[[], bool | None]) -> bool:
        """The kept answer for ``key``, or ``probe()``'s, kept."""
        known = self._known(key)
        if known is not None:
            return known
        with self._probing:
            known = self._known(key)  # another thread's probe may have answered
            if known is not None:
                return known
            answer = probe()
            with self._lock:
                if answer is None:
                    self.unknown_since[key] = time.monotonic()
                    return self.unknown  # asked again once the period is over
                self.unknown_since.pop(key, None)
                return self.answers.setdefault(key, answer)


#: Whether a store rejects an upload whose CRC32C is wrong: probed once per process (S3
#: latency review F8: moto, and other S3-compatible stores, accept any checksum header and
#: echo it back, so "verified by the store" verified nothing). Unknown: False (read back).
_VALIDATES = _Probed(unknown=False)
#: Whether a store honours ``If-None-Match: *`` on PUT: probed once per process before its
#: first conditional create (attack review L2: a store that accepts the header and overwrites
#: anyway let two committers both "win"). Unknown: True (creates as before the probe).
_HONOURS = _Probed(unknown=True)


def _unknown_kept(since: float | None) -> bool:
    """Whether an unknown answer got at ``since`` (``time.monotonic()``) is still remembered."""
    return since is not None and time.monotonic() - since < PROBE_UNKNOWN_SECONDS


def _period() -> str:
    """``PROBE_UNKNOWN_SECONDS`` in words, for the warnings."""
    seconds = PROBE_UNKNOWN_SECONDS
    return f"{seconds / 60:g} minutes" if seconds >= 120 else f"{seconds:g} seconds"
