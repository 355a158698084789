"""Hostile and damaged checkpoints: every problem is a CheckpointError with its code."""

from __future__ import annotations

import json
import os
import struct
import time

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.errors import CheckpointError
from tests._corrupt import flip_byte

from .helpers import save_sharded


@pytest.fixture
def ck_dir(tmp_path):
    a = np.arange(64, dtype=np.float32).reshape(8, 8)
    m = save_sharded(
        tmp_path,
        {"a": (a, (2, 1)), "b": (np.arange(5, dtype=np.int32), (1,))},
        entries={"cfg": {"x": 1}},
    )
    return tmp_path, tmp_path / m.attempt_id


def edit_manifest(vdir, fn) -> None:
    p = vdir / "manifest.json"
    doc = json.loads(p.read_text())
    fn(doc)
    p.write_text(json.dumps(doc))


def open_and_read_all(path) -> None:
    ck = portable_ckpt.open(path)
    for k in ck.tensors:
        ck.read(k)
    for n in ck.entries:
        ck.entry(n)
    errs = ck.verify(deep=True)
    if errs:
        raise errs[0]


def expect(code: str, path) -> CheckpointError:
    t0 = time.perf_counter()
    with pytest.raises(CheckpointError) as ei:
        open_and_read_all(path)
    assert ei.value.code == code, str(ei.value)
    assert time.perf_counter() - t0 < 1.0
    return ei.value


def test_valid_checkpoint_reads(ck_dir) -> None:
    open_and_read_all(ck_dir[1])


@pytest.mark.parametrize(
    "raw, code",
    [
        (b"{not json", "PCK-JSON-INVALID"),
        (b'{"a": 1, "a": 2}', "PCK-JSON-INVALID"),
        (b"\xff\xfe", "PCK-JSON-INVALID"),
        (b"[" * 5000 + b"]" * 5000, "PCK-JSON-INVALID"),
        (b"[]", "PCK-SCHEMA"),
    ],
)
def test_malformed_manifest(ck_dir, raw: bytes, code: str) -> None:
    (ck_dir[1] / "manifest.json").write_bytes(raw)
    expect(code, ck_dir[1])


def test_nan_in_manifest(ck_dir) -> None:
    p = ck_dir[1] / "manifest.json"
    p.write_text(p.read_text().replace('"step":1', '"step":NaN'))
    expect("PCK-JSON-INVALID", ck_dir[1])


@pytest.mark.parametrize(
    "mutate, code",
    [
        (lambda d: d.__setitem__("format_version", "2.0"), "PCK-VERSION-UNSUPPORTED"),
        (lambda d: d.__setitem__("must_understand", ["fancy-ext"]), "PCK-FEATURE-UNSUPPORTED"),
        (lambda d: d.__setitem__("step", -1), "PCK-SCHEMA"),
        (lambda d: d.pop("tensors"), "PCK-SCHEMA"),
        (
            lambda d: d.__setitem__(
                "attempt_id", "s000000000001-20200101T000000000000Z-0000000000000000"
            ),
            "PCK-ATTEMPT-ID",
        ),
        (lambda d: d["tensors"]["a"].__setitem__("dtype", "complex64"), "PCK-DTYPE-UNSUPPORTED"),
        (lambda d: d["tensors"]["a"].__setitem__("shape", [1 << 40, 1 << 40]), "PCK-LIMIT"),
        (lambda d: d["tensors"]["a"].__setitem__("shape", [1 << 40]), "PCK-RANGE-BOUNDS"),
        (lambda d: d["tensors"]["a"]["ranges"].pop(), "PCK-COVERAGE-GAP"),
        (
            lambda d: d["tensors"]["a"]["ranges"].append(d["tensors"]["a"]["ranges"][0]),
            "PCK-COVERAGE-OVERLAP",
        ),
        (
            lambda d: d["tensors"]["a"]["ranges"][0].__setitem__("lengths", [9, 8]),
            "PCK-RANGE-BOUNDS",
        ),
        (
            lambda d: d["tensors"]["a"]["ranges"][0].__setitem__("file", "../../etc/passwd"),
            "PCK-PATH-UNSAFE",
        ),
        (
            lambda d: d["tensors"]["a"]["ranges"][0].__setitem__("file", "/etc/passwd"),
            "PCK-PATH-UNSAFE",
        ),
        (lambda d: d["tensors"]["a"]["ranges"][0].__setitem__("codec", "lz4"), "PCK-CODEC"),
        (
            lambda d: d["tensors"]["a"]["ranges"][0].__setitem__("name", "nope"),
            "PCK-SHARD-MISMATCH",
        ),
        # Size and block count disagree inside the record itself.
        (lambda d: d["files"][next(iter(d["files"]))].__setitem__("size", 10**9), "PCK-SCHEMA"),
        (lambda d: d["files"][next(iter(d["files"]))].__setitem__("size", 1 << 60), "PCK-LIMIT"),
        (
            lambda d: d["files"][next(iter(d["files"]))]["checksum"].__setitem__(
                "block_size", 3000
            ),
            "PCK-SCHEMA",
        ),
        (
            lambda d: d["entries"]["cfg"].__setitem__("schema", {"id": "pck:nope/1"}),
            "PCK-ENTRY-SCHEMA",
        ),
        (
            lambda d: d["entries"]["cfg"].__setitem__(
                "schema", {"json_schema": {"type": "string"}}
            ),
            "PCK-ENTRY-SCHEMA",
        ),
        (lambda d: d["entries"]["cfg"].__setitem__("values", []), "PCK-ENTRY-MISSING"),
    ],
)
def test_manifest_rule_violations(ck_dir, mutate, code: str) -> None:
    edit_manifest(ck_dir[1], mutate)
    expect(code, ck_dir[1])


def _data_file(vdir) -> str:
    return str(sorted((vdir / "data").iterdir())[0])


def test_missing_truncated_and_extended_files(ck_dir) -> None:
    f = _data_file(ck_dir[1])
    with open(f, "ab") as fh:
        fh.write(b"x")
    expect("PCK-FILE-SIZE", ck_dir[1])
    with open(f, "r+b") as fh:
        fh.truncate(os.path.getsize(f) - 1)
    open_and_read_all(ck_dir[1])
    with open(f, "r+b") as fh:
        fh.truncate(os.path.getsize(f) - 1)
    expect("PCK-FILE-SIZE", ck_dir[1])
    os.unlink(f)
    expect("PCK-FILE-MISSING", ck_dir[1])


def test_verify_file_alone_refuses_an_extended_file(ck_dir) -> None:
    """verify_file checks the size itself: a file longer than recorded is PCK-FILE-SIZE
    ("extended"), before any block is read. Test audit 21, finding 6: the read paths check
    sizes separately, which hid a verify_file that took a longer file for a good one; the
    manager's check of the files a restore did not read calls verify_file alone, as here."""
    from portable_ckpt.errors import FileSizeError
    from portable_ckpt.io.checksum import verify_file
    from portable_ckpt.io.versions import load_manifest
    from portable_ckpt.storage import open_storage

    root, vdir = ck_dir
    storage = open_storage(root)
    files = load_manifest(storage, vdir.name).files
    rest = sorted(p for p in files if not p.startswith("data/"))
    assert rest, sorted(files)  # the writer index (and entry files): what the manager checks
    for rel in rest:
        full = f"{vdir.name}/{rel}"
        assert verify_file(storage, full, files[rel]).bytes_read == files[rel].size
        with open(vdir / rel, "ab") as fh:
            fh.write(b"\0")  # a byte more: every recorded block is still intact
        with pytest.raises(FileSizeError, match="extended") as err:
            verify_file(storage, full, files[rel])
        assert err.value.code == "PCK-FILE-SIZE" and err.value.path == full


def test_flipped_byte_fails_checksum(ck_dir) -> None:
    f = _data_file(ck_dir[1])
    flip_byte(f, -2, 0x40)
    err = expect("PCK-CHECKSUM", ck_dir[1])
    assert "w0000" in str(err)


def rechecksum(vdir, path: str) -> None:
    """Make the manifest's block checksums match the (tampered) file again."""
    from portable_ckpt.io.checksum import BlockHasher

    rel = os.path.relpath(path, vdir)

    def fix(doc) -> None:
        ck = doc["files"][rel]["checksum"]
        h = BlockHasher(ck["block_size"])
        h.update(open(path, "rb").read())
        ck["blocks"] = h.blocks()

    edit_manifest(vdir, fix)


@pytest.mark.parametrize("length", [1 << 62, 1 << 40, 10**8 + 1])
def test_absurd_header_length(ck_dir, length: int) -> None:
    f = _data_file(ck_dir[1])
    with open(f, "r+b") as fh:
        fh.write(struct.pack("<Q", length))
    # A header is verified before it is interpreted: first the checksum catches it...
    expect("PCK-CHECKSUM", ck_dir[1])
    # ...and with consistent checksums the length bound does, before any allocation.
    rechecksum(ck_dir[1], f)
    expect("PCK-SHARD-HEADER", ck_dir[1])


def test_header_offsets_outside_file(ck_dir) -> None:
    f = _data_file(ck_dir[1])
    raw = open(f, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    name = next(k for k in header if k != "__metadata__")
    end = header[name]["data_offsets"][1]
    # The largest end with as many digits (the header keeps its length), past the file's end.
    header[name]["data_offsets"][1] = 10 ** len(str(end)) - 1
    assert header[name]["data_offsets"][1] > len(raw)
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (n - len(body))
    assert len(body) == n
    open(f, "wb").write(raw[:8] + body + raw[8 + n :])
    rechecksum(ck_dir[1], f)
    expect("PCK-SHARD-HEADER", ck_dir[1])


def test_symlinks_are_never_followed(ck_dir, tmp_path_factory) -> None:
    outside = tmp_path_factory.mktemp("outside")
    f = _data_file(ck_dir[1])
    target = outside / "secret"
    os.rename(f, target)
    os.symlink(target, f)
    expect("PCK-PATH-UNSAFE", ck_dir[1])
    # A symlinked directory is refused too.
    os.unlink(f)
    os.rename(target, f)
    data = ck_dir[1] / "data"
    moved = outside / "data"
    os.rename(data, moved)
    os.symlink(moved, data)
    expect("PCK-PATH-UNSAFE", ck_dir[1])


def test_uncommitted_attempt_is_not_a_version(ck_dir) -> None:
    os.unlink(ck_dir[1] / "manifest.json")
    with pytest.raises(CheckpointError) as ei:
        portable_ckpt.open(ck_dir[1])
    assert ei.value.code == "PCK-MANIFEST-MISSING"
    with pytest.raises(CheckpointError) as ei:
        portable_ckpt.open(ck_dir[0])
    assert ei.value.code == "PCK-NOT-FOUND"


def test_a_root_spelt_with_a_tilde_is_the_home_directory(tmp_path, monkeypatch) -> None:
    """Integrator review F12: "~/ckpts/run1" from a config file (no shell) made a directory
    named "~" in the working directory; "~" and "~/..." now name the home directory."""
    import numpy as np

    import portable_ckpt
    from portable_ckpt.storage import root_text

    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    portable_ckpt.save_arrays("~/ckpts/run1", {"w": np.arange(3)}, step=1)
    assert (home / "ckpts" / "run1").is_dir() and not (cwd / "~").exists()
    assert portable_ckpt.open("~/ckpts/run1").step == 1
    assert root_text("~") == str(home) and root_text("a~/b") == "a~/b"


def test_local_path_is_the_one_reading_of_a_roots_text() -> None:
    """Maintainer review M6: ``file://`` stripping and ``"://"`` tests in 11 places now ask
    ``storage.local_path``: a path or ``file://PATH`` is local; any other scheme is not."""
    from portable_ckpt.storage import local_path

    assert local_path("/a/b") == "/a/b" and local_path("rel/x") == "rel/x"
    assert local_path("file:///a") == "/a" and local_path("file://rel") == "rel"
    assert local_path("s3://bucket/p") is None and local_path("mem://x") is None
    assert local_path("file://s3://b") is None  # as open_storage reads it: not a path


def test_a_key_of_1025_characters_is_refused_and_1024_saves(tmp_path) -> None:
    """mutation audit 22 A-68: tensor keys are 1 to 1,024 characters (spec §8.1): save refuses
    a 1,025-character key with PCK-USAGE, writing no version; one of 1,024 saves and reads."""
    from portable_ckpt.format.keys import MAX_KEY, is_key

    assert MAX_KEY == 1024 and is_key("k" * 1024) and not is_key("k" * 1025)
    arr = np.arange(3, dtype=np.float32)
    with pytest.raises(CheckpointError) as ei:
        portable_ckpt.save_arrays(tmp_path / "long", {"k" * 1025: arr}, step=1)
    assert ei.value.code == "PCK-USAGE"
    assert not (tmp_path / "long").exists() or portable_ckpt.list_versions(tmp_path / "long") == []
    portable_ckpt.save_arrays(tmp_path / "ok", {"k" * 1024: arr}, step=1)
    assert np.array_equal(portable_ckpt.open(tmp_path / "ok").read("k" * 1024), arr)
