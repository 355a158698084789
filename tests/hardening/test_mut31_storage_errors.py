"""Mutation audit 31, the local backend's errors: class, code and ``retryable`` per cause.

The failures are real system-call errors of a real process: ``strace`` injects the errno into
the calls that touch one path (``-P``), the child prints what the backend raised. Each test
names the mutants it kills (``/work/tmp/mut31s/mutants.md`` of the audit).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from portable_ckpt.errors import StorageError
from portable_ckpt.storage.local import LocalStorage
from tests._strace import strace_or_skip

SRC = str(Path(__file__).resolve().parents[2] / "src")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="strace injection")

#: The child: one backend call on ROOT (argv[1]), its outcome as JSON on stdout.
_CALL = r"""
import json, sys
from portable_ckpt.errors import CheckpointError
from portable_ckpt.storage.local import LocalStorage
st = LocalStorage(sys.argv[1])
try:
    out = {"ok": repr(eval(sys.argv[2], {"st": st}))}
except CheckpointError as e:
    out = {"cls": type(e).__name__, "code": e.code, "retryable": e.retryable, "msg": str(e)}
print(json.dumps(out))
"""


def _call(root: Path, call: str, *, inject: dict[str, str], path: Path) -> dict[str, Any]:
    """Run ``call`` (an expression on ``st``) with each ``{syscalls: errno}`` of ``inject``
    failing every such call on ``path``; the outcome the child printed."""
    strace = strace_or_skip()
    cmd = [strace, "-f", "-qq", "-o", os.devnull, "-P", str(path),
           "-e", "trace=" + ",".join(inject)]
    for syscalls, errno_name in inject.items():
        cmd += ["-e", f"inject={syscalls}:error={errno_name}"]
    proc = subprocess.run(
        [*cmd, sys.executable, "-c", _CALL, str(root), call],
        env={**os.environ, "PYTHONPATH": SRC}, capture_output=True, text=True, timeout=120,
    )
    if proc.returncode != 0 and "ptrace" in proc.stderr:
        pytest.skip(f"ptrace is not permitted here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return out


@pytest.fixture
def root(tmp_path: Path) -> Path:
    st = LocalStorage(tmp_path / "root", create=True)
    st.put("v/data/f", b"0123456789")
    return tmp_path / "root"


def test_a_full_disk_under_a_writer_is_retryable_and_names_the_file(root: Path) -> None:
    """ENOSPC may pass (another job's files are deleted): ``retryable``. Mutant L02 (every
    OS error of a writer, a delete or a stat made lasting) told a manager's retry not to."""
    got = _call(root, "st.put('v/data/g', b'x' * 100)", inject={"write": "ENOSPC"}, path=root / "v" / "data" / "g")
    assert got["cls"] == "StorageError" and got["retryable"] is True, got
    assert "write" in got["msg"] and "v/data/g" in got["msg"] and "errno 28" in got["msg"]
    assert not (root / "v" / "data" / "g").exists()  # the aborted writer left nothing


def test_an_unreadable_directory_is_no_empty_listing(root: Path) -> None:
    """A directory the process may not open (EACCES) is not an empty one: ``list`` and
    ``list_dirs`` raise a lasting PCK-STORAGE naming it. Mutants L87 and L90 (the error read
    as no entries): gc took an unreadable attempt for one without files."""
    for call in ("list(st.list('v'))", "st.list_foreign('v')", "st.list_dirs('v')"):
        got = _call(root, call, inject={"openat": "EACCES"}, path=root / "v")
        assert got.get("cls") == "StorageError" and got["retryable"] is False, (call, got)
        assert "/v" in got["msg"] and "Permission denied" in got["msg"], (call, got)


def test_a_file_where_a_directory_belongs_is_a_lasting_error(root: Path) -> None:
    """A parent of the path that is a file: PCK-STORAGE, not retryable (no retry makes the
    file a directory), naming that file, whether it is the parent or a grandparent. Mutants
    L06 (retryable) and L07 (the grandparent's ENOTDIR reported as a bare "Not a
    directory")."""
    st = LocalStorage(root)
    for path in ("v/data/f/x", "v/data/f/x/y"):
        with pytest.raises(StorageError) as info:
            st.put(path, b"y")
        assert info.value.retryable is False, path
        assert f"{root / 'v' / 'data' / 'f'}' exists and is not a directory" in str(info.value)


def test_a_parent_that_cannot_be_stated_is_no_answer(root: Path) -> None:
    """The symlink check of every parent below the root: an ``lstat`` that fails otherwise
    than "absent" raises (nobody can say the parent is no link). Mutant L37 (the error
    ignored): ``exists`` answered True through a parent it could not check."""
    got = _call(root, "st.exists('v/data/f')", inject={"newfstatat,lstat,statx": "EACCES"}, path=root / "v")
    assert got.get("cls") == "StorageError" and got["retryable"] is False, got
    assert f"{root / 'v'}" in got["msg"], got


def test_a_failed_renameat2_says_its_own_error(root: Path) -> None:
    """No hard links here (``link`` EPERM), and ``renameat2`` itself fails (ENOSPC): the error
    is the rename's, retryable, not "supports neither hard links nor renameat2", which sends
    the user to another file system, and the temporary record is removed. Mutants L105
    (every renameat2 error read as "not supported") and L79 (the temporary left behind)."""
    got = _call(root, "st.create_if_absent('v/manifest.json', b'{}')",
                inject={"link": "EPERM", "renameat2": "ENOSPC"},
                path=root / "v" / "manifest.json")
    assert got.get("cls") == "StorageError" and got["retryable"] is True, got
    assert "No space left" in got["msg"] and "neither" not in got["msg"], got
    assert sorted(os.listdir(root / "v")) == ["data"]  # no temporary record left


def test_a_directory_fsync_that_fails_fails_sync(root: Path) -> None:
    """``sync`` makes the names of the files closed so far durable: EIO on the fsync of their
    directory is a PCK-STORAGE naming it (a commit never follows it, R-COMMIT-6). Mutant L47
    (the error swallowed): the save went on to publish over names that may be lost."""
    got = _call(root, "(st.put('v/data/g', b'x'), st.sync())", inject={"fsync": "EIO"},
                path=root / "v" / "data")
    assert got.get("cls") == "StorageError" and got["retryable"] is True, got
    assert f"fsync directory '{root / 'v' / 'data'}'" in got["msg"], got
