"""Local writers start the writeback of what they wrote every WRITEBACK_BYTES, then fsync.

Seen in the system calls of a real process (``strace``): ``sync_file_range(...,
SYNC_FILE_RANGE_WRITE)`` over consecutive, non-overlapping ranges of what was written, and the
``fsync`` that makes the file durable after the last of them (the hint never replaces it).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from portable_ckpt.storage import _posix
from portable_ckpt.storage.local import WRITEBACK_BYTES
from tests._strace import strace_or_skip

MIB = 1 << 20

_WRITE = r"""
import sys
from portable_ckpt.storage.local import LocalStorage
st = LocalStorage(sys.argv[1], create=True)
w = st.open_writer("a/data.bin")
chunk = bytes(range(256)) * 4096  # 1 MiB
for _ in range(int(sys.argv[2])):
    w.write(chunk)
w.write(b"tail")
w.close()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_writer_starts_writeback_in_steps_and_fsyncs_after(tmp_path: Path) -> None:
    strace = strace_or_skip()
    out = tmp_path / "trace"
    mib = 3 * WRITEBACK_BYTES // MIB + 2  # three whole steps and a remainder left to fsync
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src}
    proc = subprocess.run(
        [strace, "-f", "-qq", "-e", "trace=sync_file_range,fsync", "-o", str(out),
         sys.executable, "-c", _WRITE, str(tmp_path / "root"), str(mib)],
        env=env, capture_output=True, text=True, timeout=120,
    )
    if proc.returncode != 0 and "ptrace" in proc.stderr:
        pytest.skip(f"ptrace is not permitted here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    lines = out.read_text().splitlines()
    ranges = [
        (int(m[1]), int(m[2]), m[3])
        for line in lines
        if (m := re.search(r"sync_file_range\(\d+, (\d+), (\d+), (\w+)\)", line))
    ]
    assert [(o, n) for o, n, _ in ranges] == [
        (i * WRITEBACK_BYTES, WRITEBACK_BYTES) for i in range(3)
    ]
    assert {f for _, _, f in ranges} == {"SYNC_FILE_RANGE_WRITE"}
    last_hint = max(i for i, line in enumerate(lines) if "sync_file_range(" in line)
    assert any("fsync(" in line for line in lines[last_hint + 1 :])
    data = (tmp_path / "root" / "a" / "data.bin").read_bytes()
    assert len(data) == mib * MIB + 4 and data[:256] == bytes(range(256))


def test_writeback_hint_is_harmless_on_a_real_descriptor(tmp_path: Path) -> None:
    """The hint on a file, on a range past its end, and where it is absent: never an error."""
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"x" * 4096)
        has = _posix.start_writeback(fd, 0, 4096)
        assert has == sys.platform.startswith("linux")
        _posix.start_writeback(fd, 1 << 40, 4096)  # beyond the end: nothing to write back
        os.fsync(fd)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"x" * 4096

