"""Mutation audit 31, the local backend's confinement: listings, deletions and directory
removal never reach outside the root, through ``..`` or a symbolic link.

Real directories and links under ``tmp_path``; each test names the mutants it kills
(``/work/tmp/mut31s/mutants.md`` of the audit).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from portable_ckpt.errors import PathUnsafeError
from portable_ckpt.storage.local import LocalStorage


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the root with a file and an empty directory: nothing may touch it."""
    out = tmp_path / "outside"
    (out / "keep" / "empty").mkdir(parents=True)
    (out / "keep" / "secret.bin").write_bytes(b"precious")
    return out


def test_a_symlinked_prefix_lists_nothing_of_its_target(tmp_path: Path, outside: Path) -> None:
    """``list``/``list_foreign`` of a prefix that is itself a link list nothing behind it, and
    a prefix below the link is refused. Mutant L81 (the link followed): the target's files
    were listed as the attempt's."""
    st = LocalStorage(tmp_path / "root", create=True)
    (tmp_path / "root" / "v").symlink_to(outside)
    for prefix in ("v", "v/"):
        assert list(st.list(prefix)) == [] and st.list_foreign(prefix) == []
    with pytest.raises(PathUnsafeError):
        list(st.list("v/keep/"))


def test_the_root_itself_is_never_removed_or_emptied(tmp_path: Path) -> None:
    """``remove_empty_dirs`` and ``delete_prefix`` name a directory below the root: ``""``
    (and ``.``) is refused before anything is touched. Mutants L96 (the empty root removed)
    and B11 (``delete_prefix("")`` deleted every file of the root)."""
    root = tmp_path / "root"
    st = LocalStorage(root, create=True)
    for prefix in ("", "/", "."):
        with pytest.raises(PathUnsafeError):
            st.remove_empty_dirs(prefix)
    assert root.is_dir()
    st.put("v/data/f", b"x")
    for prefix in ("", "/"):
        with pytest.raises(PathUnsafeError):
            st.delete_prefix(prefix)
    assert (root / "v" / "data" / "f").read_bytes() == b"x"


#: Paths no listing of this backend lists (``well_formed``: foreign), yet inside the root.
FOREIGN_NAMES = ("v/a\nb", "v/a\x00b", "v/a\x7fb", "v//b", "./v/b", "v/./b", "v/b/", "v/a\\b")


@pytest.mark.parametrize("path", FOREIGN_NAMES)
def test_a_path_the_listing_calls_foreign_is_refused_by_every_call(
    tmp_path: Path, path: str
) -> None:
    """Bug (audit 31): the local backend refused only ``..``, a leading ``/`` and a backslash;
    S3 and its own reads refuse every path that is not well formed. ``put("v/a\\nb")`` wrote
    a file its listing then called foreign (so gc never deleted it), and a NUL raised a bare
    ``ValueError`` from ``exists``, ``size``, ``delete`` and ``create_if_absent``."""
    root = tmp_path / "root"
    st = LocalStorage(root, create=True)
    calls = (
        lambda: st.put(path, b"x"), lambda: st.open_writer(path),
        lambda: st.create_if_absent(path, b"x"), lambda: st.exists(path),
        lambda: st.size(path), lambda: st.delete(path), lambda: st.read_all(path, max_size=9),
    )
    for call in calls:
        with pytest.raises(PathUnsafeError):
            call()
    assert list(root.iterdir()) == []  # nothing was created, not even a directory


def test_list_dirs_of_a_symlinked_prefix_lists_nothing(tmp_path: Path, outside: Path) -> None:
    """Bug (audit 31): ``list_dirs`` of a prefix that is a link listed the directories of its
    target, where ``list`` of the same prefix lists nothing (a listing never follows a link:
    R-SEC-2): a symlinked ``pins/`` had its target's directories read as odd pin records."""
    st = LocalStorage(tmp_path / "root", create=True)
    (tmp_path / "root" / "v").symlink_to(outside)
    assert st.list_dirs("v") == [] and st.list_dirs("v/") == []


def test_delete_by_name_never_removes_a_foreign_entry(tmp_path: Path, outside: Path) -> None:
    """gc deletes records by name (``manifest.json``, writer indexes, marks): a symlink, FIFO
    or directory under such a name is foreign and stays (R-LAYOUT-7), with PCK-PATH-UNSAFE.
    Mutant L92 (the type check dropped): the link and the FIFO were unlinked."""
    root = tmp_path / "root"
    st = LocalStorage(root, create=True)
    (root / "v").mkdir()
    (root / "v" / "manifest.json").symlink_to(outside / "keep" / "secret.bin")
    os.mkfifo(root / "v" / "w00000.json")
    (root / "v" / "index").mkdir()
    for name in ("v/manifest.json", "v/w00000.json", "v/index"):
        with pytest.raises(PathUnsafeError, match="not a regular file"):
            st.delete(name)
        with pytest.raises(PathUnsafeError):
            st.delete_many([name])
    assert sorted(os.listdir(root / "v")) == ["index", "manifest.json", "w00000.json"]
    assert (outside / "keep" / "secret.bin").read_bytes() == b"precious"


def test_a_root_that_is_a_link_lists_its_top_level(tmp_path: Path) -> None:
    """Bug (audit 31): a root given as a link to a directory (``/ckpt`` -> another disk) is
    the user's choice and is followed everywhere else, but ``list("")`` and
    ``list_foreign("")`` listed nothing at its top: the storage clock's probe was never seen
    (``storage_clock`` None), and foreign entries and a ``pins`` that is no directory went
    unreported."""
    from portable_ckpt.io.clock import storage_clock

    real = tmp_path / "disk" / "ckpt"
    real.mkdir(parents=True)
    (tmp_path / "root").symlink_to(real)
    st = LocalStorage(tmp_path / "root")
    st.put("top.bin", b"x")
    st.put("v/f", b"y")
    os.mkfifo(real / "fifo")
    assert [i.path for i in st.list("", recursive=False)] == ["top.bin"]
    assert sorted(i.path for i in st.list("")) == ["top.bin", "v/f"]
    assert st.list_foreign("") == ["fifo"]
    assert storage_clock(st) is not None


def test_a_flat_foreign_listing_stays_at_its_level(tmp_path: Path) -> None:
    """``list_foreign(prefix, recursive=False)`` names the foreign entries of that directory
    only: ``ls --json``'s top-level ``foreign_keys`` and the check for odd records read it.
    Mutant G02 (``recursive`` ignored): a FIFO inside an attempt was a foreign key of the
    root."""
    root = tmp_path / "root"
    st = LocalStorage(root, create=True)
    st.put("v/data/f", b"x")
    os.mkfifo(root / "top-fifo")
    os.mkfifo(root / "v" / "data" / "fifo")
    assert st.list_foreign("", recursive=False) == ["top-fifo"]
    assert sorted(st.list_foreign("")) == ["top-fifo", "v/data/fifo"]
    assert st.list_foreign("v/", recursive=False) == []
