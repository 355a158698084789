"""A directory target (DCP, HF) is durable before it is published under ``DST``.

Watched with strace on the real CLI: every file of the export and the staged directory itself
are fsynced before the one rename that publishes it, and the parent directory after it. The
DCP export fsyncs its files together once written (DCP fsynced each as it closed it, one disk
flush after another: two thirds of an export's time); the staged directory's own fsync was
missing for every directory target (the files' names are its entries).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
import portable_ckpt
from tests._strace import strace_or_skip

pytestmark = pytest.mark.torch


def _traced_export(tmp_path: Path, target: str) -> tuple[list[str], Path]:
    strace = strace_or_skip()
    rng = np.random.default_rng(0)
    portable_ckpt.save_arrays(tmp_path / "root", {f"layer{i}/w": rng.standard_normal((64, 8), dtype=np.float32)
                                                  for i in range(6)}, step=3)
    trace = tmp_path / "trace"
    dst = tmp_path / "out"
    res = subprocess.run(
        [strace, "-f", "-qq", "-y", "-e", "trace=fsync,fdatasync,rename,renameat,renameat2",
         "-o", str(trace), sys.executable, "-m", "portable_ckpt.cli.main", "convert",
         str(tmp_path / "root"), str(dst), "--to", target, "-q"],
        capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 0, res.stderr
    return trace.read_text().splitlines(), dst


def _synced(lines: list[str]) -> set[str]:
    """The paths of the fsyncs that returned 0 (a thread's call may be split in two lines)."""
    done, pending = set(), {}
    for ln in lines:
        pid = ln.split(" ", 1)[0]
        if m := re.search(r"f(?:data)?sync\(\d+<([^>]*)>(\)\s+= 0| <unfinished)", ln):
            if m.group(2).startswith(")"):
                done.add(m.group(1))
            else:
                pending[pid] = m.group(1)
        elif re.search(r"<\.\.\. f(?:data)?sync resumed>\)\s+= 0", ln) and pid in pending:
            done.add(pending.pop(pid))
    return done


@pytest.mark.parametrize("target", ["dcp", "hf"])
def test_a_directory_target_is_durable_before_it_is_published(tmp_path: Path, target: str) -> None:
    lines, dst = _traced_export(tmp_path, target)
    published = [i for i, ln in enumerate(lines)
                 if re.search(r"rename(at2?)?\(.*\"[^\"]*/out\"", ln) and re.search(r"\s= 0$", ln)]
    assert len(published) == 1, lines
    before, after = lines[: published[0]], lines[published[0] + 1 :]
    synced = _synced(before)
    staged = [p for p in synced if p.endswith("/out")]
    assert len(staged) == 1, synced  # the staged directory itself, before the rename
    files = sorted(p.name for p in dst.iterdir())
    assert files and all(f"{staged[0]}/{name}" in synced for name in files), (files, synced)
    parent = str(tmp_path)
    assert parent in _synced(after), after
    if target == "dcp":
        assert len([f for f in files if f.endswith(".distcp")]) == 6  # a file per chunk, as before
