"""Mutation audit 25, gc's storage clock (spec §15.2 clock probe, R-GC-4): what the probes
leave at the root, and which clock dates an attempt when the storage cannot be asked."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from portable_ckpt.errors import StorageError
from portable_ckpt.io.gc import gc, storage_clock
from portable_ckpt.io.writer import ShardWriter
from portable_ckpt.storage import ObjectInfo, open_storage
from portable_ckpt.storage.faults import Fault, FaultyStorage
from tests.hardening._util import check_restores, make_version


def _probes(root: Path) -> set[str]:
    return {p for p in os.listdir(root) if p.startswith(".pck-clock-")}


def _age(path: Path, seconds: float) -> None:
    """Date ``path`` (and everything under it) ``seconds`` back on this host's disk."""
    t = time.time() - seconds
    for dirpath, _, files in os.walk(path):
        for f in [*files, "."]:
            os.utime(os.path.join(dirpath, f), (t, t))
    os.utime(path, (t, t))


def test_a_probe_of_the_general_name_is_tidied_as_a_clock_probe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Attack review L3, spec §15.2: every probe a tool writes at a root is ``.pck-clock-<16
    hex>`` or ``.pck-probe-<16 hex>`` (the S3 backend's checksum and If-None-Match probes). A
    ``.pck-probe-`` left behind is no foreign entry of ``ls``, and gc deletes it once an hour
    old, a younger one not; a name off the pattern is foreign and stays."""
    from portable_ckpt.cli.main import main as cli_main

    make_version(str(tmp_path), 1)
    young = tmp_path / ".pck-probe-00112233445566aa"
    old = tmp_path / ".pck-probe-00112233445566bb"
    odd = tmp_path / ".pck-probe-0011223344556677-x"  # not a probe: foreign
    for p, age in ((young, 3000.0), (old, 3700.0), (odd, 7200.0)):
        p.write_bytes(b"portable_ckpt checksum probe")
        os.utime(p, (time.time() - age, time.time() - age))
    assert cli_main(["ls", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["foreign_keys"] == [odd.name]
    assert storage_clock(open_storage(tmp_path)) is not None
    left = {p for p in os.listdir(tmp_path) if p.startswith(".pck-")}
    assert left == {young.name, odd.name}


def _abandoned_attempt(root: Path, age: float) -> str:
    """An attempt without a commit record, quiet for ``age`` seconds (its id as old)."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() - age))
    attempt = f"s000000000005-{stamp}000000Z-00000000000000cc"
    w = ShardWriter(open_storage(root), attempt, 0)
    w.add_tensor("w", np.zeros((4, 4), np.float32))
    w.finish()
    _age(root / attempt, age)
    return attempt


def test_a_probe_younger_than_an_hour_is_not_tidied(tmp_path: Path) -> None:
    """§15.2: a probe left behind may be deleted "once its modification time is older than one
    hour": a younger one may be another gc's or a copy's (``same_root``) that is being read
    right now. The hour is on the storage's clock, so the boundary is checked on both sides."""
    make_version(str(tmp_path), 1)
    young = tmp_path / ".pck-clock-00112233445566aa"
    old = tmp_path / ".pck-clock-00112233445566bb"
    for p, age in ((young, 3000.0), (old, 3700.0)):
        p.write_bytes(b"")
        os.utime(p, (time.time() - age, time.time() - age))
    there = storage_clock(open_storage(tmp_path))
    assert there is not None and abs(there - time.time()) < 60
    assert _probes(tmp_path) == {young.name}
    gc(tmp_path, keep=1, grace_seconds=0.0)
    assert _probes(tmp_path) == {young.name}


class _RootUnlistable(FaultyStorage):
    """A store whose listing of the root fails while this process's clock probe is there."""

    probe: str | None = None

    def put(self, path: str, data: bytes | memoryview) -> None:
        if path.startswith(".pck-clock-"):
            self.probe = path
        super().put(path, data)

    def delete(self, path: str) -> bool | None:
        if path == self.probe:
            self.probe = None
        return super().delete(path)

    def list(self, prefix: str = "", *, recursive: bool = True) -> Iterator[ObjectInfo]:
        if prefix == "" and self.probe is not None:
            raise StorageError("LIST /: 503 Slow Down", path="")
        return super().list(prefix, recursive=recursive)


def test_a_root_listing_that_fails_leaves_no_probe_and_dates_on_this_hosts_clock(
    tmp_path: Path,
) -> None:
    """The probe was written but the listing that dates it failed: the storage's time is
    unknown (``None``), the probe is deleted all the same, and gc dates attempts on this
    host's clock (it does not skip them as unknown, nor leave a probe per run)."""
    keep = make_version(str(tmp_path), 1)
    gone = _abandoned_attempt(tmp_path, 7200.0)
    st = _RootUnlistable(open_storage(tmp_path), [])
    assert storage_clock(st) is None
    assert _probes(tmp_path) == set()
    rep = gc(st, keep=1, grace_seconds=3600.0)
    assert rep.complete and rep.abandoned == [gone], rep.to_json()
    assert not (tmp_path / gone).exists() and _probes(tmp_path) == set()
    check_restores(open_storage(tmp_path), keep)


def test_a_root_that_refuses_the_probe_dates_on_this_hosts_clock(tmp_path: Path) -> None:
    """A root gc cannot write a probe into (a read-only prefix, a policy on ``.pck-*``) has no
    clock to ask: ``storage_clock`` is ``None`` and gc takes this host's, so an attempt quiet
    for two hours goes with a grace of one, and one quiet for a minute stays; no skew is
    claimed (the storage's clock was never read)."""
    make_version(str(tmp_path), 1)
    old = _abandoned_attempt(tmp_path, 7200.0)
    young = _abandoned_attempt(tmp_path, 60.0)
    refusing = FaultyStorage(open_storage(tmp_path), [Fault(op="open", path=".pck-clock-*",
                                                            error="EROFS")])
    assert storage_clock(refusing) is None
    rep = gc(refusing, keep=1, grace_seconds=3600.0)
    assert rep.abandoned == [old] and rep.clock_skew is None, rep.to_json()
    assert [g["id"] for g in rep.in_grace] == [young]
    assert 0 <= rep.in_grace[0]["age_seconds"] < 600
