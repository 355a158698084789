"""Mutation audit 31, ``storage/__init__.py``: a root's text to a backend (paths, ``file://``,
registered schemes, a process-mode writer's description).

Real directories under ``tmp_path``; each test names the mutants it kills
(``/work/tmp/mut31s/mutants.md`` of the audit).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from portable_ckpt.errors import StorageError, UsageError
from portable_ckpt.storage import (
    LocalStorage,
    open_process_spec,
    open_storage,
    register_scheme,
    root_text,
)


@pytest.mark.parametrize("text", ["", "file://"])
def test_a_root_that_names_no_directory_is_refused(
    text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutants I02 and I05: ``""`` and ``file://`` opened the working directory as a root
    (``abspath("")``), and a save would have written its attempts there."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError):
        open_storage(text, create=True)
    assert list(tmp_path.iterdir()) == []


def test_a_file_url_opens_the_local_root(tmp_path: Path) -> None:
    """``file:///abs`` names the local directory ``/abs`` (the CLI, copy records). Mutant I15
    (``file`` checked as an unknown scheme): every ``file://`` root was a usage error."""
    st = open_storage(f"file://{tmp_path / 'r'}", create=True)
    assert isinstance(st, LocalStorage) and st.root == str(tmp_path / "r")


def test_the_built_in_schemes_cannot_be_registered() -> None:
    """Mutant I01: ``register_scheme("file", ...)`` was accepted, and every ``file://`` root of
    the process would have gone to the registered opener."""
    for scheme in ("s3", "file"):
        with pytest.raises(UsageError, match="built-in"):
            register_scheme(scheme, lambda url: LocalStorage(url))


def test_a_root_text_with_a_nul_or_of_bytes_is_refused() -> None:
    """Mutants I08 (a NUL reached ``os`` calls: a bare ValueError) and I10 (``bytes`` taken for
    a root's text)."""
    with pytest.raises(UsageError, match="NUL"):
        root_text("ckpt\x00s")
    with pytest.raises(UsageError, match="bytes"):
        root_text(os.fsencode("ckpts"))


def test_a_url_description_never_opens_a_local_path(tmp_path: Path) -> None:
    """``{"kind": "url"}`` names a registered scheme's root; a path there opened the local
    directory, where the backend never looks (backend review B1). Mutant I13."""
    with pytest.raises(UsageError, match="not a path"):
        open_process_spec({"kind": "url", "url": str(tmp_path)})
    assert isinstance(open_process_spec({"kind": "local", "root": str(tmp_path)}), LocalStorage)


def test_open_storage_creates_a_local_root_when_asked(tmp_path: Path) -> None:
    """``create=True`` reaches the local backend: the root exists before anything is written
    (``root_exists``), and a root that cannot be created fails there, with its advice, not at
    the first file. Mutant I14 (``create`` dropped for local roots)."""
    st = open_storage(tmp_path / "new" / "root", create=True)
    assert st.root_exists() and (tmp_path / "new" / "root").is_dir()
    assert not open_storage(tmp_path / "other").root_exists()
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(StorageError, match="cannot create the checkpoint root"):
        open_storage(tmp_path / "file" / "root", create=True)


def test_a_backend_object_where_a_root_text_belongs_gets_the_fix(tmp_path: Path) -> None:
    """The manager and convert take roots as text: a backend object is refused with the way
    to name it by URL (backend review B5). Mutant I17 (it fell to "a root is a path or URL
    string, got LocalStorage", which names no fix)."""
    with pytest.raises(UsageError, match="register the backend's URL scheme"):
        root_text(LocalStorage(tmp_path))
