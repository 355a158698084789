"""Layout (§2) and attempt identity (§3) requirements."""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.format.naming import ATTEMPT_ID_RE, new_attempt_id
from portable_ckpt.format.paths import check_relative_path
from portable_ckpt.io.commit import commit
from portable_ckpt.io.writer import ShardWriter
from portable_ckpt.storage import open_storage

from ._util import (
    build_version,
    edit_manifest,
    expect_code,
    open_and_read_all,
    open_recorded,
    read_manifest,
)


def test_attempt_stored_directly_under_root_named_by_its_id(tmp_path: Path) -> None:
    """R-LAYOUT-1: each attempt is a direct child of the root named by its attempt id."""
    vdir, m = build_version(tmp_path)
    assert vdir.parent == tmp_path
    assert vdir.name == m.attempt_id and ATTEMPT_ID_RE.match(vdir.name)
    assert read_manifest(vdir)["attempt_id"] == vdir.name
    assert [c.name for c in tmp_path.iterdir()] == [m.attempt_id]
    [info] = portable_ckpt.list_versions(tmp_path)
    assert info.path.rstrip("/").endswith("/" + m.attempt_id)


def test_writer_never_overwrites_an_existing_file(tmp_path: Path) -> None:
    """R-LAYOUT-2: files are created exclusively; an existing file is never replaced."""
    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(1)
    w0 = ShardWriter(storage, attempt, 0)
    w0.add_tensor("x", np.arange(4, dtype=np.float32))
    w0.finish()
    before = {p: p.read_bytes() for p in (tmp_path / attempt).rglob("*") if p.is_file()}
    # A second writer claiming the same writer number must fail rather than replace anything.
    w0b = ShardWriter(storage, attempt, 0)
    w0b.add_tensor("x", np.zeros(4, dtype=np.float32))
    expect_code("PCK-STORAGE", w0b.finish)
    after = {p: p.read_bytes() for p in (tmp_path / attempt).rglob("*") if p.is_file()}
    assert after == before


def test_reader_locates_files_only_through_recorded_paths(tmp_path: Path) -> None:
    """R-LAYOUT-3: a version whose files have unusual names is read through the manifest paths."""
    vdir, _ = build_version(tmp_path)
    doc = read_manifest(vdir)
    renames = {}
    for i, old in enumerate(sorted(doc["files"])):
        new = f"blobs/{i}/x{i}.bin"
        (vdir / new).parent.mkdir(parents=True, exist_ok=True)
        os.rename(vdir / old, vdir / new)
        renames[old] = new

    def fix(d: dict) -> None:  # type: ignore[type-arg]
        d["files"] = {renames[p]: r for p, r in d["files"].items()}
        for t in d["tensors"].values():
            for r in t["ranges"]:
                r["file"] = renames[r["file"]]
        for e in d["entries"].values():
            for v in e["values"]:
                v["file"] = renames[v["file"]]

    edit_manifest(vdir, fix)
    ck = open_and_read_all(vdir)
    np.testing.assert_array_equal(ck.read("a"), np.arange(64, dtype=np.float32).reshape(8, 8))
    assert ck.entry("cfg") == {"x": 1}


def test_unrelated_root_children_and_unreferenced_files_are_ignored(tmp_path: Path) -> None:
    """R-LAYOUT-4: non-attempt children of the root and unreferenced files are ignored."""
    vdir, m = build_version(tmp_path)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "manifest.json").write_text("{garbage")
    (tmp_path / "s999999999999-garbage").mkdir()
    (tmp_path / "s999999999999-garbage" / "manifest.json").write_text("{")
    (tmp_path / "README.txt").write_text("hello")
    (vdir / "data" / "w99999-0000.safetensors").write_bytes(b"\xff" * 100)
    (vdir / "extra.bin").write_bytes(b"junk")
    (vdir / "index" / "w00077.json").write_text("{not json")
    assert portable_ckpt.open(tmp_path).id == m.attempt_id
    assert [v.id for v in portable_ckpt.list_versions(tmp_path)] == [m.attempt_id]
    open_and_read_all(vdir)
    # The unreferenced files were never even opened.
    st, ck = open_recorded(tmp_path, m.attempt_id)
    for k in ck.tensors:
        ck.read(k)
    ck.entry("cfg")
    assert not [p for p, *_ in st.reads() if "w99999" in p or "extra" in p or "w00077" in p]


@pytest.mark.parametrize(
    "entry_name",
    ["opt/state.v1", "a" * 256, "x-y_z.0/1/2/3/4/5/6/7/8/9", "..a/b..", "-/_/."[:3] + "x"],
)
def test_writer_records_only_safe_paths(tmp_path: Path, entry_name: str) -> None:
    """R-LAYOUT-5: every path a writer records satisfies §2.2."""
    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(3)
    w = ShardWriter(storage, attempt, 123456)
    w.add_tensor("weird key/with spaces\u00e9\u4e2d", np.ones(3, dtype=np.float32))
    w.add_entry(entry_name, {"v": 1})
    w.add_entry("pr/" + entry_name[:200], [1, 2], scope="per_rank", rank=0, world_size_policy="drop",
                compress=True)
    idx = w.finish()
    commit(storage, attempt, step=3, indexes=[idx], expected_writers=[123456])
    doc = read_manifest(tmp_path / attempt)
    paths = list(doc["files"])
    paths += [r["file"] for t in doc["tensors"].values() for r in t["ranges"]]
    paths += [v["file"] for e in doc["entries"].values() for v in e["values"]]
    for p in paths:
        assert check_relative_path(p) == p
        parts = p.split("/")
        assert 1 <= len(parts) <= 8
        assert all(re.fullmatch(r"[A-Za-z0-9._-]{1,255}", c) and c not in (".", "..") for c in parts)


#: §12.1's table (errata 2): suffix of the recommended entry file name -> longest last part.
ENTRY_NAME_LIMITS = {".g.json": 248, ".g.json.zst": 244, ".r00000.json": 243,
                     ".r00000.json.zst": 239}


def test_entry_file_name_limits_are_the_path_rule() -> None:
    """§12.1 (errata 2): the recommended entry file name is a path (§2.2, R-LAYOUT-5) exactly
    while the name's last part fits the spec table's limit and the name has at most 7 parts."""
    text = (Path(__file__).resolve().parents[2] / "spec" / "README.md").read_text()
    rows = {sfx: (int(n), int(limit)) for sfx, n, limit in
            re.findall(r"\| `(\.[gr][^`]*)` \((\d+)[^|]*\| (\d+) \|", text)}
    for suffix, limit in ENTRY_NAME_LIMITS.items():
        assert limit == 255 - len(suffix)
        spelled = suffix.replace("00000", "<rank:05d>")
        assert rows.get(spelled) == (len(suffix), limit), (spelled, rows)
        ok = f"entries/{'n' * limit}{suffix}"
        assert check_relative_path(ok) == ok
        expect_code("PCK-PATH-UNSAFE", check_relative_path, f"entries/{'n' * (limit + 1)}{suffix}")
    assert check_relative_path("entries/a/b/c/d/e/f/g.g.json")
    expect_code("PCK-PATH-UNSAFE", check_relative_path, "entries/a/b/c/d/e/f/g/h.g.json")


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("scope", ["global", "per_rank"])
def test_writer_names_every_entry_value_safely_at_the_limits(tmp_path: Path, scope: str,
                                                              compress: bool) -> None:
    """§12.1, R-LAYOUT-5: names of 239 … 256 characters and 8 parts, in every scope and
    encoding, are stored under safe paths and read back."""
    storage = open_storage(tmp_path, create=True)
    attempt = new_attempt_id(4)
    w = ShardWriter(storage, attempt, 0)
    w.add_tensor("t", np.ones(2, dtype=np.float32))
    names = ["e" * n for n in (239, 240, 243, 244, 248, 249, 256)] + ["a/b/c/d/e/f/g/h"]
    kw = {"scope": "per_rank", "rank": 0, "world_size_policy": "modulo"} \
        if scope == "per_rank" else {}
    for i, name in enumerate(names):
        w.add_entry(name, {"i": i}, compress=compress, **kw)  # type: ignore[arg-type]
    commit(storage, attempt, step=4, indexes=[w.finish()], expected_writers=[0])
    doc = read_manifest(tmp_path / attempt)
    for e in doc["entries"].values():
        assert all(check_relative_path(v["file"]) == v["file"] for v in e["values"])
    ck = portable_ckpt.open(tmp_path / attempt)
    for i, name in enumerate(names):
        got = ck.entry(name, rank=0, world_size=1) if scope == "per_rank" else ck.entry(name)
        assert got == {"i": i}


BAD_PATHS = [
    "../escape.bin",
    "data/../../x",
    "./data/x",
    "/etc/passwd",
    "data//x",
    "data/",
    "C:\\x",
    "data\\x",
    "a/b/c/d/e/f/g/h/i",
    "data/" + "x" * 256,
    "data/sp ace",
    "data/\u00e9",
    "",
    "..",
]


@pytest.mark.parametrize("bad", BAD_PATHS)
@pytest.mark.parametrize("where", ["files", "range", "entry"])
def test_reader_rejects_unsafe_paths_before_any_storage_operation(
    tmp_path: Path, bad: str, where: str
) -> None:
    """R-LAYOUT-6: an unsafe path is PCK-PATH-UNSAFE before it reaches storage."""
    vdir, m = build_version(tmp_path)
    (tmp_path / "escape.bin").write_bytes(b"x" * 10)

    def mutate(d: dict) -> None:  # type: ignore[type-arg]
        if where == "files":
            d["files"][bad] = next(iter(d["files"].values()))
        elif where == "range":
            d["tensors"]["a"]["ranges"][0]["file"] = bad
            d["files"][bad] = d["files"][d["tensors"]["b"]["ranges"][0]["file"]]
        else:
            d["entries"]["cfg"]["values"][0]["file"] = bad

    edit_manifest(vdir, mutate)
    expect_code("PCK-PATH-UNSAFE", portable_ckpt.open, vdir)


def test_unsafe_path_never_reaches_storage(tmp_path: Path) -> None:
    """R-LAYOUT-6: the recording backend sees no operation on the unsafe path."""
    from portable_ckpt.io.versions import load_manifest

    from ._util import RecordingStorage

    vdir, m = build_version(tmp_path)
    edit_manifest(vdir, lambda d: d["tensors"]["a"]["ranges"][0].__setitem__("file", "../x"))
    st = RecordingStorage(tmp_path)
    expect_code("PCK-PATH-UNSAFE", load_manifest, st, m.attempt_id)
    assert all(p == f"{m.attempt_id}/manifest.json" for op, p, *_ in st.ops if op != "list")


def test_every_save_gets_a_new_attempt_id(tmp_path: Path) -> None:
    """R-ID-1: a retry of the same step gets a new attempt id; an id is never reused."""
    ids = {portable_ckpt.save_arrays(tmp_path, {"x": np.zeros(2)}, step=5).attempt_id
           for _ in range(3)}
    assert len(ids) == 3
    assert len({new_attempt_id(5) for _ in range(2000)}) == 2000
    # Reusing an attempt id for a second commit is refused.
    attempt = sorted(ids)[0]
    storage = open_storage(tmp_path)
    expect_code("PCK-COMMIT-CONFLICT", commit, storage, attempt, step=5, indexes=[],
                expected_writers=[])


def test_attempt_suffix_is_not_from_a_seedable_prng() -> None:
    """R-ID-2: the 64-bit suffix comes from a collision-resistant source (not `random`/numpy)."""
    import datetime as dt

    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    random.seed(1234)
    np.random.seed(1234)
    a = new_attempt_id(1, now=now)
    random.seed(1234)
    np.random.seed(1234)
    b = new_attempt_id(1, now=now)
    assert a != b
    suffixes = [new_attempt_id(1, now=now).rsplit("-", 1)[1] for _ in range(4000)]
    assert len(set(suffixes)) == len(suffixes)
    assert all(re.fullmatch(r"[0-9a-f]{16}", s) for s in suffixes)
    # Every bit position varies (64 random bits, not a counter or a clock).
    bits = [int(s, 16) for s in suffixes]
    for i in range(64):
        ones = sum((x >> i) & 1 for x in bits)
        assert 1600 < ones < 2400, f"bit {i} is set in {ones} of 4000 suffixes"


def test_manifest_attempt_id_must_match_directory_and_step(tmp_path: Path) -> None:
    """R-ID-3: attempt_id differing from the directory, or step differing from it: PCK-ATTEMPT-ID."""
    vdir, m = build_version(tmp_path, step=7)
    other = tmp_path / new_attempt_id(7)
    shutil.copytree(vdir, other)
    expect_code("PCK-ATTEMPT-ID", portable_ckpt.open, other)
    shutil.rmtree(other)
    edit_manifest(vdir, lambda d: d.__setitem__("step", 8))
    expect_code("PCK-ATTEMPT-ID", portable_ckpt.open, vdir)


def test_latest_orders_by_step_then_commit_time_then_id(tmp_path: Path) -> None:
    """R-ID-4: latest is the greatest (step, committed_at, attempt_id)."""
    vs = [build_version(tmp_path, step=s)[1] for s in (3, 9, 9, 2)]
    assert portable_ckpt.open(tmp_path).id == vs[2].attempt_id
    # Make the earlier step-9 version the later committed one: it becomes the latest.
    edit_manifest(tmp_path / vs[1].attempt_id,
                  lambda d: d.__setitem__("committed_at", "2999-01-01T00:00:00.000000Z"))
    assert portable_ckpt.open(tmp_path).id == vs[1].attempt_id
    # Equal step and committed_at: the greater attempt id wins.
    for v in vs[1:3]:
        edit_manifest(tmp_path / v.attempt_id,
                      lambda d: d.__setitem__("committed_at", "2999-01-01T00:00:00.000000Z"))
    assert portable_ckpt.open(tmp_path).id == max(vs[1].attempt_id, vs[2].attempt_id)


def test_latest_compares_committed_at_as_timestamps(tmp_path: Path) -> None:
    """R-ID-4: timestamps with and without a fraction compare by time, not by text."""
    v1 = build_version(tmp_path, step=4)[1]
    v2 = build_version(tmp_path, step=4)[1]
    edit_manifest(tmp_path / v1.attempt_id,
                  lambda d: d.__setitem__("committed_at", "2030-01-01T00:00:00Z"))
    edit_manifest(tmp_path / v2.attempt_id,
                  lambda d: d.__setitem__("committed_at", "2030-01-01T00:00:00.5Z"))
    assert portable_ckpt.open(tmp_path).id == v2.attempt_id
