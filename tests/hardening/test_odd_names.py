"""Entries the format never writes, on a local root (issue 12, item 4; S3: tests/s3/test_gc_s3.py).

FIFOs, sockets, symlinks, names with a backslash and non-UTF-8 names inside an attempt or at the
top of a root are foreign (R-LAYOUT-7): listings skip them, ``ls --json`` reports them, gc never
fails on them and never deletes them, reads never touch them.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

import portable_ckpt
from portable_ckpt.cli.main import main as cli_main
from portable_ckpt.io.gc import gc
from portable_ckpt.io.versions import list_versions
from portable_ckpt.io.writer import new_attempt_id
from portable_ckpt.storage import open_storage
from tests.hardening._util import check_restores, make_version


def _plant(d: Path, outside: Path) -> list[str]:
    """Create every kind of foreign entry in ``d``; return their names."""
    os.mkfifo(d / "fifo")
    here = os.getcwd()
    os.chdir(d)  # AF_UNIX paths are limited to 108 bytes: bind a relative name
    try:
        s = socket.socket(socket.AF_UNIX)
        s.bind("sock")
        s.close()
    finally:
        os.chdir(here)
    (d / "link").symlink_to(outside)
    (d / "back\\slash").write_bytes(b"x")
    os.close(os.open(os.fsencode(d) + b"/\xff.bin", os.O_CREAT | os.O_WRONLY, 0o644))
    return ["fifo", "sock", "link", "back\\slash", os.fsdecode(b"\xff.bin")]


def test_foreign_entries_never_break_or_vanish(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """R-LAYOUT-7: ls/open/verify/gc work, foreign entries are reported and left in place."""
    root = tmp_path / "root"
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"precious")
    ids = [make_version(str(root), s) for s in (1, 2)]
    dead = new_attempt_id(3)
    (root / dead / "data").mkdir(parents=True)
    (root / dead / "data" / "w00000-0000.safetensors").write_bytes(b"partial")
    inside = [f"{dead}/{n}" for n in _plant(root / dead, outside)]
    top = _plant(root, outside)
    os.mkfifo(root / ids[0] / "data" / "fifo")  # inside a committed version too
    storage = open_storage(root)
    assert sorted(storage.list_foreign(f"{dead}/")) == sorted(inside)
    assert [i.path for i in storage.list(f"{dead}/")] == [f"{dead}/data/w00000-0000.safetensors"]
    assert [v.id for v in list_versions(root)] == [*ids, dead]
    assert cli_main(["ls", str(root), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(top) <= set(doc["foreign_keys"]) and doc["foreign_key_count"] >= len(top)
    assert cli_main(["verify", str(root), "--deep"]) == 0
    capsys.readouterr()
    check_restores(storage, ids[1])
    rep = gc(str(root), keep=1, grace_seconds=0.0)
    assert rep.complete and rep.deleted == [ids[0]] and rep.abandoned == [dead]
    assert set(rep.foreign_keys) == {*inside, f"{ids[0]}/data/fifo"}
    assert not (root / dead / "data").exists()  # the format's files went, ...
    assert all(os.path.lexists(root / p) for p in inside)  # ... foreign entries stayed
    assert outside.read_bytes() == b"precious"
    assert all(os.path.lexists(root / n) for n in top)
    rep2 = gc(str(root), keep=1, grace_seconds=0.0)
    assert rep2.complete and rep2.abandoned == [] and rep2.deleted == []
    assert portable_ckpt.open(root).id == ids[1]


def test_an_attempt_id_followed_by_a_newline_is_no_attempt_id(tmp_path: Path) -> None:
    """mutation audit 22 A-60: an attempt id ends at its last hex digit: the same id with a
    newline after it is refused by check_attempt_id, has no step, and a directory of that name
    in a root is a foreign entry, not an attempt (not listed, not collected by gc)."""
    from portable_ckpt.errors import AttemptIdError
    from portable_ckpt.format.naming import check_attempt_id, parse_attempt_step

    root = tmp_path / "root"
    good = make_version(str(root), 1)
    odd = new_attempt_id(2) + "\n"
    with pytest.raises(AttemptIdError):
        check_attempt_id(odd)
    assert parse_attempt_step(odd) is None and parse_attempt_step(odd[:-1]) == 2
    (root / odd / "data").mkdir(parents=True)
    (root / odd / "data" / "w00000-0000.safetensors").write_bytes(b"partial")
    assert [v.id for v in list_versions(root)] == [good]
    rep = gc(str(root), keep=1, grace_seconds=0.0)
    assert rep.abandoned == [] and (root / odd / "data" / "w00000-0000.safetensors").exists()
