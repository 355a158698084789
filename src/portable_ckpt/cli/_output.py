"""What the CLI writes to stderr besides errors: progress bars (tqdm) and the library's log.

* Progress bars only when stderr is a terminal, never with ``--json`` or ``--quiet``: a pipe,
  a CI log or a JSON consumer sees none of their control characters.
* The library's log (the ``portable_ckpt`` loggers, :mod:`portable_ckpt.logs`): warnings by
  default, ``-v`` INFO (save/load/commit/copy events with bytes and MiB/s, storage retries),
  ``-vv`` DEBUG, ``--quiet`` errors only. Lines go through ``tqdm.write`` so that they do not
  tear a bar that is being drawn.
* A refusal is printed once, as the command's error: the library's ``<op>.refused`` log events
  show only with ``-v``.
* Python warnings (e.g. torch's, while a ``.pt`` is read) as one line each at the same
  level, never the source line of a library's internals; ``--quiet`` hides them.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from portable_ckpt.cli._text import safe
from portable_ckpt.logs import EVENT_ATTR, LOGGER_NAME, Progress

__all__ = [
    "EXIT_RETRY", "EXIT_UNAVAILABLE", "add_output_options", "failed_status", "log_to_stderr",
    "progress_bar", "say_failed",
]

#: Exit status of a command that failed for a reason that may pass: a storage error, a copy
#: still being written (:attr:`CheckpointError.retryable`; sysexits' EX_TEMPFAIL).
EXIT_RETRY = 75
#: Exit status of ``ls --latest`` when it cannot answer and waiting does not mend it (a
#: permission, a missing bucket, every committed version failed verification): never 1,
#: which says "no version: start afresh" (sysexits' EX_UNAVAILABLE; SRE review S2, S9).
EXIT_UNAVAILABLE = 69


def say_failed(args: argparse.Namespace | None, error: dict[str, Any], text: str) -> None:
    """Say a failure: its line on stderr, and with ``--json`` its document on stdout."""
    if getattr(args, "json", False):
        print(json.dumps({"ok": False, "error": error}, indent=2))
    print(f"portable-ckpt: {text}", file=sys.stderr)


def failed_status(retryable: Sequence[bool]) -> int:
    """The exit status of a command whose problems are ``retryable`` (one flag per problem).

    0 without any; :data:`EXIT_RETRY` when every one may pass by itself
    (:attr:`CheckpointError.retryable`: a storage error, a record the storage did not take);
    1 when any says something about the checkpoint.
    """
    if not retryable:
        return 0
    return EXIT_RETRY if all(retryable) else 1


def add_output_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """Add ``-v/--verbose`` and ``-q/--quiet`` (before or after the subcommand).

    On a subcommand the defaults are suppressed, so that ``portable-ckpt -v ls ROOT`` keeps the
    top-level value.
    """
    default: Any = {} if top else {"default": argparse.SUPPRESS}
    parser.add_argument(
        "-v", "--verbose", action="count", help="show the library's log: -v INFO, -vv DEBUG",
        **({"default": 0} if top else default),
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="no progress bars; only errors on stderr",
        **({"default": False} if top else default),
    )


def _wants_bars(args: argparse.Namespace) -> bool:
    return not (args.quiet or getattr(args, "json", False)) and sys.stderr.isatty()


def _write_line(text: str) -> None:
    """Write to stderr above any progress bar being drawn."""
    from tqdm import tqdm

    # A line may quote names from the root: escaped like every other CLI text.
    tqdm.write(safe(text), file=sys.stderr)


class _TqdmHandler(logging.Handler):
    """Write records to stderr above any progress bar being drawn."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            _write_line(self.format(record))
        except Exception:
            self.handleError(record)


#: Events the CLI says in its own words: shown only with ``-v``.
_SAID_BY_THE_CLI = ("gc.damaged",)


def _not_refusals(record: logging.LogRecord) -> bool:
    """Drop events the CLI says in its own words; with ``-v`` both show.

    ``<op>.refused`` (the CLI prints the error) and :data:`_SAID_BY_THE_CLI`.
    """
    doc = getattr(record, EVENT_ATTR, None)
    event = str(doc.get("event", "")) if isinstance(doc, dict) else ""
    return not (event.endswith(".refused") or event in _SAID_BY_THE_CLI)


@contextmanager
def log_to_stderr(args: argparse.Namespace) -> Iterator[None]:
    """Show the ``portable_ckpt`` log on stderr at the level the options ask, while it runs."""
    verbose = int(getattr(args, "verbose", 0) or 0)
    if getattr(args, "quiet", False):
        level = logging.ERROR
    else:
        level = (logging.WARNING, logging.INFO)[verbose] if verbose < 2 else logging.DEBUG
    log = logging.getLogger(LOGGER_NAME)
    handler = _TqdmHandler(level)
    if verbose == 0:
        handler.addFilter(_not_refusals)
    handler.setFormatter(logging.Formatter("portable-ckpt: %(levelname)s %(name)s: %(message)s"))
    saved = log.level
    log.addHandler(handler)
    log.setLevel(min(level, saved) if saved else level)

    def show(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
        from portable_ckpt.errors import PassedOverWarning

        # (logged as well, and the log is shown: said once)
        if level <= logging.WARNING and not issubclass(category, PassedOverWarning):
            text = f"portable-ckpt: WARNING {category.__name__}: {message}"
            _write_line(text)

    try:
        with warnings.catch_warnings():
            warnings.showwarning = show
            yield
    finally:
        log.removeHandler(handler)
        log.setLevel(saved)


class _Bar:
    """A tqdm bar fed with ``progress(done, total)`` from any thread."""

    def __init__(self, desc: str, unit: str) -> None:
        from tqdm import tqdm

        is_bytes = unit == "B"
        self._bar = tqdm(
            desc=desc, unit=unit, unit_scale=is_bytes, unit_divisor=1024 if is_bytes else 1000,
            file=sys.stderr, leave=False, dynamic_ncols=True, total=None,
        )
        self._lock = threading.Lock()

    def __call__(self, done: int, total: int) -> None:
        with self._lock:
            if self._bar.total != total:
                self._bar.total = total
                self._bar.refresh()
            if done > self._bar.n:
                self._bar.update(done - self._bar.n)  # redraws at most every 0.1 s
            if done >= total:
                self._bar.refresh()  # the finished bar is drawn even when it was quick

    def close(self) -> None:
        with self._lock:
            self._bar.close()


@contextmanager
def progress_bar(args: argparse.Namespace, desc: str, unit: str = "B") -> Iterator[Progress | None]:
    """A progress callback drawing a bar on the terminal, or ``None`` where no bar belongs."""
    if not _wants_bars(args):
        yield None
        return
    bar = _Bar(desc, unit)
    try:
        yield bar
    finally:
        bar.close()
