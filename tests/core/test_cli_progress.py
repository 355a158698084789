"""Progress bars of the CLI: drawn on a real pseudo-terminal, absent on a pipe and with ``--json``.

Each case runs ``portable-ckpt`` as a subprocess whose stderr is the slave side of a pty
(``pty.openpty``, 80 columns) while stdout stays a pipe, as in ``portable-ckpt ... --json | jq``.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
from dataclasses import dataclass

import numpy as np
import pytest

import portable_ckpt

#: What tqdm draws: ``verify --deep:  42%|████      | 13.0k/31.5k [00:00<00:00, 9.1MB/s]``.
BAR = b"%|"


@dataclass
class Run:
    rc: int
    stdout: str
    stderr: bytes  # everything written to the terminal (or the pipe)


def run_cli(*args: str, tty: bool) -> Run:
    """Run the CLI with stderr on a pseudo-terminal (``tty``) or on a pipe."""
    cmd = [sys.executable, "-m", "portable_ckpt.cli.main", *args]
    env = {**os.environ, "COLUMNS": "80"}
    if not tty:
        p = subprocess.run(cmd, capture_output=True, timeout=120, env=env)
        return Run(p.returncode, p.stdout.decode(), p.stderr)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    seen = bytearray()
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal's last slave
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    out = proc.stdout.read().decode() if proc.stdout else ""
    rc = proc.wait(timeout=120)
    return Run(rc, out, bytes(seen))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("progress") / "ck")
    rng = np.random.default_rng(0)
    for step in (1, 2, 3):
        portable_ckpt.save_arrays(path, {"w": rng.standard_normal(60_000).astype(np.float32)},
                                  step=step)
    return path


def test_verify_deep_draws_a_bar_on_a_terminal(root: str) -> None:
    r = run_cli("verify", "--deep", root, tty=True)
    assert r.rc == 0 and r.stdout.startswith("OK ")
    assert b"verify --deep:" in r.stderr and BAR in r.stderr and b"100%" in r.stderr
    assert "\r" not in r.stdout


def test_no_bar_on_a_pipe(root: str) -> None:
    r = run_cli("verify", "--deep", root, tty=False)
    assert r.rc == 0 and r.stdout.startswith("OK ")
    assert BAR not in r.stderr and r.stderr.startswith(b"portable-ckpt: recorded ")  # one line
    assert r.stderr.count(b"\n") == 1


def test_no_bar_with_json_and_the_json_parses(root: str) -> None:
    r = run_cli("verify", "--deep", root, "--json", tty=True)
    assert r.rc == 0 and json.loads(r.stdout)["ok"] is True
    assert BAR not in r.stderr and b"verify" not in r.stderr


def test_quiet_draws_no_bar(root: str) -> None:
    r = run_cli("verify", "--deep", root, "-q", tty=True)
    assert r.rc == 0 and BAR not in r.stderr and r.stderr.strip() == b""


def test_copy_and_gc_draw_bars(root: str, tmp_path) -> None:
    dst = str(tmp_path / "dst")
    r = run_cli("copy", root, dst, tty=True)
    assert r.rc == 0 and "copied to" in r.stdout
    assert b"copy:" in r.stderr and BAR in r.stderr and b"100%" in r.stderr
    r = run_cli("gc", dst, "--keep", "1", tty=True)  # one version there: nothing to delete
    assert r.rc == 0 and b"gc: deleting" in r.stderr
    portable_ckpt.save_arrays(dst, {"w": np.zeros(4, np.float32)}, step=9)
    r = run_cli("gc", dst, "--keep", "1", tty=True)
    assert r.rc == 0 and r.stdout.startswith("deleted")
    assert b"gc: deleting" in r.stderr and b"1/1" in r.stderr


@pytest.mark.parametrize("quiet", [False, True])
def test_python_warnings_are_one_line_and_quiet_hides_them(quiet: bool, capsys) -> None:
    """A library's ``UserWarning`` reaches a CLI user as one line, without its source line."""
    import argparse
    import warnings

    from portable_ckpt.cli._output import log_to_stderr

    with log_to_stderr(argparse.Namespace(verbose=0, quiet=quiet)):
        warnings.warn("Detected pickle protocol 4 in the checkpoint", UserWarning, stacklevel=1)
    err = capsys.readouterr().err
    if quiet:
        assert err == ""
    else:
        assert err == "portable-ckpt: WARNING UserWarning: Detected pickle protocol 4 in the checkpoint\n"
