"""Entry point of ``portable-ckpt``: finds every ``cmd_*`` module and lets it add subcommands.

Exit codes: 0 success, 1 a checkpoint problem (the error's code is printed, e.g. PCK-NOT-FOUND for
a root that does not exist), 2 usage errors (a bad argument before anything is touched; a request
the root's state refuses without ``--force``, nothing written), 75 a failure that may pass: every
problem was a storage error that waiting can mend (PCK-STORAGE of EIO, a store that did not
answer; not a permission) or a copy still being written (PCK-COMMIT-CONFLICT): retry, 69 ``ls
--latest`` cannot answer and a person must act (it exits 1 for "no committed version" only),
130 interrupted (Ctrl-C), 143 terminated (SIGTERM: systemd's stop, ``timeout``), 141 output into
a closed pipe.

Every subcommand takes ``-v``/``-vv`` (the library's log at INFO/DEBUG on stderr) and ``-q``
(no progress bars, errors only); long work draws progress bars on stderr when it is a terminal
and ``--json`` is not given (``cli/_output.py``).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import pkgutil
import resource
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any, cast

from portable_ckpt import __version__
from portable_ckpt.cli._output import (
    EXIT_RETRY,
    EXIT_UNAVAILABLE,
    add_output_options,
    log_to_stderr,
    say_failed,
)
from portable_ckpt.cli._text import safe
from portable_ckpt.errors import CheckpointError, NotFoundError, UsageError, may_pass

__all__ = ["build_parser", "entry", "main"]


def formats_line() -> str:
    """The format versions this build reads and writes (``--help``, ``--version``)."""
    from portable_ckpt.format.manifest import (
        CLEARS_FORMAT_VERSION,
        DTYPES_FORMAT_VERSION,
        FORMAT_VERSIONS,
        TABLE_FORMAT_VERSION,
    )

    return (
        f"reads and writes format versions {', '.join(FORMAT_VERSIONS)} "
        f"({TABLE_FORMAT_VERSION} when a version's ranges are described in a tensor table, "
        f"{CLEARS_FORMAT_VERSION} in a verification record that clears failed ones, "
        f"{DTYPES_FORMAT_VERSION} when a version holds complex64 or float8 e8m0fnu, e4m3fnuz "
        "or e5m2fnuz tensors)"
    )


def build_parser() -> argparse.ArgumentParser:
    """Build the parser with every subcommand module found in this package."""
    parser = argparse.ArgumentParser(
        prog="portable-ckpt",
        description=f"Versioned, sharded, portable training checkpoints; {formats_line()}.",
    )
    parser.add_argument(
        "--version", action="version", version=f"portable-ckpt {__version__}; {formats_line()}"
    )
    add_output_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    import portable_ckpt.cli as pkg

    for mod in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if mod.name.startswith("cmd_"):
            module = importlib.import_module(f"portable_ckpt.cli.{mod.name}")
            module.register(sub)
    for command in sub.choices.values():
        add_output_options(command, top=False)
    return parser


def main(argv: Sequence[str] | None = None, *, restore_signals: bool = True) -> int:
    """Run the CLI; returns the exit code.

    Every argument is checked while parsing (``cli/_args.py``) and by the subcommand's
    ``check`` before anything is touched: a bad value exits 2. Output into a closed pipe
    (``inspect ... | head``) exits 141 (128 + SIGPIPE) without a traceback; output that cannot
    be written (a full disk, ``> /dev/full``) exits 74 (``EX_IOERR``) and says so.

    The caller's SIGINT and SIGTERM handlers are put back on return (``restore_signals``);
    the ``portable-ckpt`` command (:func:`entry`) leaves them ignored on its way out.
    """
    try:
        # Start-up imports numpy and every command (a few tenths of a second): a Ctrl-C there
        # is an interruption like any other, not a traceback (ops review F15). Only this
        # module and the package's light top are imported before this point.
        parser = build_parser()
    except KeyboardInterrupt:
        return _interrupted(None)
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        check = getattr(args, "check", None)
        problem = check(args) if check is not None else None
    except (SystemExit, KeyboardInterrupt):
        raise
    except Exception as exc:  # a checker's own failure: nothing was touched, no traceback
        if os.environ.get("PCK_DEBUG"):
            raise
        print(f"portable-ckpt: error: cannot read the arguments ({_unexpected(exc)[1]})",
              file=sys.stderr)
        return 2
    if problem:  # with the subcommand's usage, not the top level's (maintainer review M8)
        _subparser(parser, args.command).error(problem)
    if sys.stdout is None:
        # Closed (`>&-`, some cron and systemd setups): the report could not be written, and
        # a command that deletes would have run first (scripting review F1). Nothing is done.
        print("portable-ckpt: standard output is closed, so the command's report could not "
              "be written; nothing was done. Redirect it to /dev/null to discard the report",
              file=sys.stderr)
        return EXIT_OUTPUT
    real = sys.stdout
    sys.stdout = _Output(real)
    saved = _handlers()
    _terminate_as_interrupt()
    try:
        with log_to_stderr(args):
            code = _run(args)
            _ignore_interrupts()  # the work is done: a signal during shutdown changes nothing
            sys.stdout.flush()  # now, not at exit: a failing write is reported here
            return code
    except _OutputError as exc:
        print(f"portable-ckpt: cannot write the output: {exc.__cause__}; the command itself "
              f"ran (its result is not shown)", file=sys.stderr)
        _silence(real)
        return EXIT_OUTPUT
    except KeyboardInterrupt as exc:  # a second Ctrl-C, while the log handler is being removed
        return _interrupted(args, exc)
    except BrokenPipeError:
        # The reader of our output went away: point stdout at /dev/null so that the flush at
        # exit cannot raise again, and end like a process killed by SIGPIPE (cat, grep).
        _silence(real)
        return 128 + signal.SIGPIPE
    finally:
        sys.stdout = real
        # The caller's handlers come back: main() called in a process that goes on (a test,
        # a tool) kept Ctrl-C ignored, and its later process groups started with SIGINT
        # ignored (diff review D1). entry() ignores them again on the way out.
        for signum, handler in saved.items() if restore_signals else ():
            signal.signal(signum, handler)


def entry() -> int:
    """The ``portable-ckpt`` command: :func:`main`, then signals ignored until the exit.

    ``timeout -s INT`` signals the command and then its process group: the second signal
    landed in the interpreter's exit handlers (torch's), whose traceback reached the user.
    """
    code = main(restore_signals=False)  # (put back, they reopened that window: last review L2)
    _ignore_interrupts()
    return code


def _handlers() -> dict[int, Any]:
    """The current SIGINT and SIGTERM handlers (none off the main thread: nothing is changed)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of subcommand ``name``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return cast(argparse.ArgumentParser, action.choices[name])
    return parser


#: Exit status when the command's own output cannot be written (sysexits' EX_IOERR).
EXIT_OUTPUT = 74


class _OutputError(Exception):
    """Standard output refused a write (its cause: the OSError)."""


class _Output:
    """Standard output whose write errors are the output's, not a bug of a command."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _OutputError from exc

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _OutputError from exc

    @property
    def buffer(self) -> _Output:
        """The binary stream under it, its write errors mapped as the text's.

        ``ls --latest`` writes a path's bytes there (scripting review F2).
        """
        return _Output(self._stream.buffer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _silence(stream: Any) -> None:
    """Point ``stream`` at /dev/null so that the flush at exit cannot raise again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, stream.fileno())
    os.close(devnull)


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args))
    # Messages may quote names and strings from the root: escaped for the terminal. With
    # --json, stdout gets one document whatever happens: a failure is {"ok": false, "error"}.
    except CheckpointError as exc:
        say_failed(args, {**exc.to_json(), "retryable": exc.retryable}, safe(exc))
        if isinstance(exc, UsageError):
            return 2
        # A storage that did not answer, a copy still being written: "retry later" is not
        # "the checkpoint is damaged" for a cron that pages someone (scripting review F6),
        # sysexits' EX_TEMPFAIL. `ckpt=$(portable-ckpt ls ROOT --latest) || start_fresh` must
        # read nothing but "no version" as 1 (F3, SRE review S2).
        if getattr(args, "latest", False) and not isinstance(exc, NotFoundError):
            return EXIT_RETRY if exc.retryable else EXIT_UNAVAILABLE
        return EXIT_RETRY if exc.retryable else 1
    except KeyboardInterrupt as exc:
        return _interrupted(args, exc)
    except (BrokenPipeError, SystemExit, GeneratorExit, _OutputError):
        raise
    except BaseException as exc:  # no traceback ever reaches a user; PCK_DEBUG=1 shows it
        # BaseException: a native library's panic (pyo3's PanicException) is not an Exception.
        if os.environ.get("PCK_DEBUG"):
            raise
        code, message = _unexpected(exc)  # with its document too (resource review R1)
        # As a StorageError (review L1): 75 when it may pass (a full disk, EIO), not EACCES.
        transient = code == "PCK-STORAGE" and may_pass(exc)
        say_failed(args, {"code": code, "message": message, "retryable": transient}, message)
        if getattr(args, "latest", False):  # never 1, "no version" (L1, SRE review S2)
            return EXIT_RETRY if transient else EXIT_UNAVAILABLE
        return EXIT_RETRY if transient else 1


#: errno values that say the machine ran out of something, not that portable-ckpt has a bug.
_RESOURCE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EMFILE,
                    errno.ENFILE, errno.ENOMEM, errno.EAGAIN, errno.EACCES, errno.EPERM, errno.EIO}


#: errno values that are the file system's only when they name a file (EPERM from a
#: setrlimit, EAGAIN from a lock or a fork limit are not).
_NEED_A_FILE = {errno.EPERM, errno.EAGAIN}


def _unexpected(exc: BaseException) -> tuple[str, str]:
    """The code and message of an exception that is no CheckpointError.

    A full disk, a file-size or memory limit reached inside a library (torch.save's writer,
    safetensors) was "internal error ... a bug of portable-ckpt" with no file named (resource
    review R1, R9): those say what ran out, where, and which limit.
    """
    if isinstance(exc, MemoryError):
        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        where = ("" if limit == resource.RLIM_INFINITY
                 else f"; the address-space limit is {limit:,} bytes (ulimit -v)")
        return ("PCK-OUT-OF-MEMORY", "out of memory (MemoryError)" + where + "; give the "
                "command more memory, or work on less at once")
    package = _raised_in(exc)
    if isinstance(exc, OSError) and exc.errno in _RESOURCE_ERRNOS and (
        exc.filename or exc.errno not in _NEED_A_FILE
    ):
        what = f" at {safe(exc.filename)!r}" if exc.filename else ""
        # Not "nothing was published" alone: gc deletes (backend review 27, L6).
        by = f", raised in {package} (a storage backend raises StorageError)" if package else ""
        return ("PCK-STORAGE", f"{exc.strerror or exc}{what} (errno {exc.errno}) while reading "
                f"or writing{by}: the command stopped where it was (a save or copy stopped "
                "so publishes nothing); run it again once the cause is mended")
    if package is not None:  # a storage backend's raw client error is not ours (backend B6)
        return ("PCK-INTERNAL", f"error in {package} ({type(exc).__name__}: {safe(exc)}), "
                f"called by portable-ckpt: report it to the authors of {package} (a storage "
                "backend raises StorageError for a failure of its store: "
                "docs/storage-backends.md), or to portable-ckpt's if its call was wrong "
                "(PCK_DEBUG=1 prints the traceback)")
    return ("PCK-INTERNAL", f"internal error ({type(exc).__name__}: {safe(exc)}); this is a bug "
            "of portable-ckpt: please report it (PCK_DEBUG=1 prints the traceback)")


def _raised_in(exc: BaseException) -> str | None:
    """The package that raised ``exc`` when it is neither portable_ckpt nor the standard library.

    The innermost frame of such a package wins: a backend's client error raised inside
    botocore names botocore, one raised by the backend's own code names the backend.
    """
    tb, found = exc.__traceback__, None
    while tb is not None:
        name = str(tb.tb_frame.f_globals.get("__name__", ""))
        top = name.partition(".")[0]
        if top and top != "portable_ckpt" and top not in sys.stdlib_module_names and top != "__main__":
            found = top
        tb = tb.tb_next
    return found


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is, so that its cleanup runs as for a Ctrl-C."""


def _terminate_as_interrupt() -> None:
    """Turn SIGTERM into :class:`_Terminated` while a command runs (main() restores it).

    Killed outright, an interrupted ``copy`` or ``gc`` said nothing, and a ``--json`` caller got
    no document (scripting review F4). Only the main thread can set handlers; elsewhere (the
    CLI called from a library's thread) nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        return

    def raise_terminated(signum: int, frame: Any) -> None:
        raise _Terminated

    signal.signal(signal.SIGTERM, raise_terminated)


def _ignore_interrupts() -> None:
    """Ignore further SIGINT/SIGTERM: the process is on its way out.

    ``timeout -s INT`` signals the command and then its whole process group, so the CLI gets
    the signal twice; the second landed in the interpreter's exit handlers (torch's), whose
    traceback reached the user (scripting review F5).
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _interrupted(args: argparse.Namespace | None, exc: BaseException | None = None) -> int:
    """Report an interruption (stderr, and the ``--json`` document) and return its exit code."""
    _ignore_interrupts()
    terminated = isinstance(exc, _Terminated)
    what = "terminated (SIGTERM)" if terminated else "interrupted"
    command = getattr(args, "command", None)
    message = (
        f"{command} was {what} before it finished; run it again to finish it"
        if command else what
    )
    try:
        # running it again finishes the work: retryable
        say_failed(args, {"code": "PCK-INTERRUPTED", "message": message, "retryable": True},
                   message)
    except (OSError, ValueError):
        pass  # the output is gone too: the exit status says it
    return 128 + (signal.SIGTERM if terminated else signal.SIGINT)


if __name__ == "__main__":
    sys.exit(entry())
