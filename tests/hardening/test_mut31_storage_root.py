"""Mutation audit 31, the local root: the ``storage.root_not_private`` warning (docs/logs.md:
"a local root opened to write ... writable by every user (no sticky bit) ... Said once per
root and process"), and the root's own spelling.

Real directories and modes under ``tmp_path``; each test names the mutants it kills
(``/work/tmp/mut31s/mutants.md`` of the audit).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from portable_ckpt.storage.local import LocalStorage

_SAID = "portable_ckpt: WARNING: checkpoint root"


def test_a_world_writable_root_is_warned_of_once_and_only_when_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Opened to read: no warning (mutant L27 warned on every open). Opened to write twice:
    one warning (mutant L23 warned each time)."""
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o777)
    LocalStorage(root)
    assert _SAID not in capsys.readouterr().err
    LocalStorage(root, create=True)
    LocalStorage(root, create=True)
    assert capsys.readouterr().err.count(_SAID) == 1


def test_a_sticky_world_writable_root_is_not_warned_of(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A directory like /tmp (mode 1777): nobody may rename another user's entries, so it is
    no one else's to control. Mutant L25 (the sticky bit ignored) warned of it."""
    root = tmp_path / "sticky"
    root.mkdir()
    root.chmod(0o1777)
    LocalStorage(root, create=True)
    assert _SAID not in capsys.readouterr().err


def test_a_relative_root_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The root is kept absolute: its ``url``, ``process_spec`` (another process, another
    working directory) and the confinement checks compare full paths. Mutant L28 (kept as
    given) sent a writer process a relative root."""
    monkeypatch.chdir(tmp_path)
    st = LocalStorage("rel/root", create=True)
    want = os.path.join(str(tmp_path), "rel", "root")
    assert st.url == st.root == want
    assert st.process_spec() == {"kind": "local", "root": want}


def test_a_root_below_a_file_does_not_exist(tmp_path: Path) -> None:
    """``root_exists`` of ``file/sub`` (ENOTDIR): no root there, as for a missing path; not a
    PCK-STORAGE that ``ls --latest`` reports as an unreadable root. Mutant L67."""
    (tmp_path / "file").write_bytes(b"")
    assert LocalStorage(tmp_path / "file" / "sub").root_exists() is False
    assert LocalStorage(tmp_path / "file").root_exists() is False  # a file is no root either
    assert LocalStorage(tmp_path).root_exists() is True
