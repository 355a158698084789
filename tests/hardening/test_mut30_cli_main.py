"""Mutation audit 30, the CLI's entry point (``cli/main.py``): exit statuses a script reads.

Each test runs the real CLI (in process through ``main``, or as its own process where a signal
must reach it) and pins one documented status: 2 for a usage error, 143 for SIGTERM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.cli.main import main as cli_main


def test_no_subcommand_prints_the_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """Mutant m01: ``portable-ckpt`` alone printed the help and exited 0, which a script reads as
    a command that ran; it is a usage error (exit 2), the help on stdout."""
    assert cli_main([]) == 2
    out = capsys.readouterr().out
    assert "usage: portable-ckpt" in out and "COMMAND" in out


#: The CLI on a backend that is stopped (SIGTERM, as systemd stops a unit) while it lists.
_STOPPED_WHILE_LISTING = textwrap.dedent("""
    import os, signal, sys
    from portable_ckpt.cli.main import entry
    from portable_ckpt.storage import LocalStorage, register_scheme

    class Stopped(LocalStorage):
        def list(self, prefix="", *, recursive=True):
            os.kill(os.getpid(), signal.SIGTERM)
            return super().list(prefix, recursive=recursive)

    register_scheme("stopped", lambda url: Stopped(url.split("://", 1)[1]))
    sys.argv[0] = "portable-ckpt"
    sys.exit(entry())
""")


#: The CLI on a backend, defined in the script the process runs, whose listing raises ``{raise_}``.
_FAILING_LISTING = textwrap.dedent("""
    import sys
    from portable_ckpt.cli.main import entry
    from portable_ckpt.errors import StorageError
    from portable_ckpt.storage import LocalStorage, register_scheme

    class Failing(LocalStorage):
        def list(self, prefix="", *, recursive=True):
            raise {raise_}

    register_scheme("failing", lambda url: Failing(url.split("://", 1)[1]))
    sys.argv[0] = "portable-ckpt"
    sys.exit(entry())
""")


def _failing_cli(root: Path, raise_: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _FAILING_LISTING.format(raise_=raise_),
                           *[a.format(root=f"failing://{root}") for a in args]],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("retryable", "status"), [(True, 75), (False, 1)])
def test_a_storage_error_of_any_command_is_75_when_it_may_pass(
    tmp_path: Path, retryable: bool, status: int
) -> None:
    """Mutant m09: a CheckpointError that may pass (a store that did not answer) is 75, retry,
    for every command, not only ``ls --latest``; one that needs a person is 1."""
    portable_ckpt.save_arrays(tmp_path, {"w": np.arange(4.0)}, step=1)
    p = _failing_cli(tmp_path, f"StorageError('store did not answer', retryable={retryable})",
                     "ls", "{root}", "--json")
    assert p.returncode == status, (p.returncode, p.stderr)
    doc = json.loads(p.stdout)
    assert doc["error"]["code"] == "PCK-STORAGE" and doc["error"]["retryable"] is retryable


def test_an_unexpected_error_under_ls_latest_is_69_never_1(tmp_path: Path) -> None:
    """Mutants m11, m28: an exception that is no CheckpointError under ``ls --latest`` is 69
    (a person must act), never 1 ("no version: start afresh"); raised by code of the script
    the process runs (``__main__``), it is an internal error, not a package to report to."""
    portable_ckpt.save_arrays(tmp_path, {"w": np.arange(4.0)}, step=1)
    p = _failing_cli(tmp_path, "RuntimeError('boom')", "ls", "{root}", "--latest")
    assert p.returncode == 69, (p.returncode, p.stderr)
    assert "internal error (RuntimeError: boom)" in p.stderr, p.stderr
    assert "error in __main__" not in p.stderr and "Traceback" not in p.stderr
    p = _failing_cli(tmp_path, "RuntimeError('boom')", "ls", "{root}")
    assert p.returncode == 1, (p.returncode, p.stderr)


def test_sigterm_while_a_command_runs_is_143_with_its_document(tmp_path: Path) -> None:
    """Mutants m16, m23, m24: SIGTERM during a command exits 143 (128 + SIGTERM), not 130
    (Ctrl-C) nor killed outright, and ``--json`` still gets its one document saying so."""
    portable_ckpt.save_arrays(tmp_path, {"w": np.arange(4.0)}, step=1)
    p = subprocess.run([sys.executable, "-c", _STOPPED_WHILE_LISTING, "ls", f"stopped://{tmp_path}",
                        "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 143, (p.returncode, p.stderr)
    doc = json.loads(p.stdout)
    assert doc["ok"] is False and doc["error"]["code"] == "PCK-INTERRUPTED"
    assert doc["error"]["retryable"] is True
    assert "ls was terminated (SIGTERM) before it finished" in doc["error"]["message"]
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("argv", [["ls", "{root}"], ["ls", "{root}", "--json"],
                                  ["inspect", "{root}"]])
def test_a_full_output_is_74_also_when_stdout_is_buffered(tmp_path: Path, argv: list[str]) -> None:
    """Mutant m19: the flush of stdout before main() returns was dropped and nothing saw it,
    because the suite runs with PYTHONUNBUFFERED=1 (every print reached /dev/full at once).
    A user's shell has it unset: the report then sits in the buffer, and only that flush
    turns a full disk into exit 74 and its message; at exit it was Python's own "Exception
    ignored" and status 120."""
    portable_ckpt.save_arrays(tmp_path, {"w": np.arange(4.0)}, step=1)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "portable_ckpt",
                            *[a.format(root=tmp_path) for a in argv]],
                           stdout=full, stderr=subprocess.PIPE, text=True, timeout=120, env=env)
    assert p.returncode == 74, (p.returncode, p.stderr)
    assert "cannot write the output: [Errno 28] No space left on device" in p.stderr, p.stderr
    assert "Exception ignored" not in p.stderr and "Traceback" not in p.stderr


def test_quiet_hides_the_librarys_warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Mutant o06: ``-q`` is "errors only" (docs/cli.md); with it the library's WARNING (a
    reader passing over a newer version whose record is damaged) showed all the same."""
    portable_ckpt.save_arrays(tmp_path, {"w": np.arange(4.0)}, step=1)
    newer = portable_ckpt.save_arrays(tmp_path, {"w": np.arange(4.0)}, step=2).attempt_id
    (tmp_path / newer / "manifest.json").write_text("{}")  # damaged after its commit
    assert cli_main(["inspect", str(tmp_path)]) == 0
    assert "have a commit record that is not valid" in capsys.readouterr().err  # by default
    assert cli_main(["inspect", str(tmp_path), "-q"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "step        1" in out


def test_verify_all_with_damage_and_a_storage_error_is_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mutant v04: ``verify --all`` that found a damaged version (1) and a record the store
    did not answer for (75) exited 75, "retry": damage needs a person whatever else passed."""
    from portable_ckpt.storage.faults import Fault
    from tests.core.test_exit_classes import _scheme

    damaged = portable_ckpt.save_arrays(tmp_path, {"w": np.arange(64.0)}, step=1).attempt_id
    unread = portable_ckpt.save_arrays(tmp_path, {"w": np.arange(64.0)}, step=2).attempt_id
    [data] = (tmp_path / damaged / "data").iterdir()
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF
    data.write_bytes(bytes(raw))
    scheme = _scheme([Fault(op="list", path=f"{unread}/verifications/*", error="EIO")])
    code = cli_main(["verify", f"{scheme}://{tmp_path}", "--all", "--deep", "--no-record", "-q"])
    out, err = capsys.readouterr()
    assert code == 1, (code, out, err)
    assert "PCK-CHECKSUM" in out + err


def test_verify_all_whose_only_problem_may_pass_is_75(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mutant v05: ``verify --all`` whose only problem is a store that did not answer (a
    version's records unread) is 75, retry; it was 1, which pages for damage."""
    from portable_ckpt.storage.faults import Fault
    from tests.core.test_exit_classes import _scheme

    portable_ckpt.save_arrays(tmp_path, {"w": np.arange(64.0)}, step=1)
    unread = portable_ckpt.save_arrays(tmp_path, {"w": np.arange(64.0)}, step=2).attempt_id
    scheme = _scheme([Fault(op="list", path=f"{unread}/verifications/*", error="EIO")])
    code = cli_main(["verify", f"{scheme}://{tmp_path}", "--all", "--deep", "--no-record", "-q"])
    out, err = capsys.readouterr()
    assert code == 75, (code, out, err)


def test_verify_all_of_a_version_directory_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mutant v03: ``--all`` verifies every version of a root; given one version it is exit 2."""
    aid = portable_ckpt.save_arrays(tmp_path, {"w": np.arange(4.0)}, step=1).attempt_id
    assert cli_main(["verify", str(tmp_path / aid), "--all"]) == 2
    assert "--all verifies every committed version of a root" in capsys.readouterr().err


def test_pin_records_who_pinned_as_given(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Mutant p01: ``pin --by`` was ignored and user@host recorded instead."""
    aid = portable_ckpt.save_arrays(tmp_path, {"w": np.arange(4.0)}, step=1).attempt_id
    assert cli_main(["pin", str(tmp_path / aid), "--by", "oncall-bot", "--reason", "incident 7",
                     "--json"]) == 0
    rel = json.loads(capsys.readouterr().out)["pin"]
    rec = json.loads((tmp_path / rel).read_text())
    assert (rec["by"], rec["reason"], rec["attempt_id"]) == ("oncall-bot", "incident 7", aid)
