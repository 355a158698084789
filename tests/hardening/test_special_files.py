"""FIFOs, symlinked directories and truncation under a reader (issue 12, items 17-20).

Every local file a reader opens (checkpoint shards, conversion sources) goes through one helper,
``portable_ckpt.storage._posix.open_regular``: ``O_NONBLOCK`` + ``fstat`` on the descriptor (a FIFO
never blocks an open, on the first read or any later one), and ``O_NOFOLLOW`` component by
component below the directory a source names (a symlinked parent is refused like a symlinked
file). Deep verification reads with ``pread`` (no mapping): a file truncated meanwhile is an
error, not SIGBUS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.convert import convert
from portable_ckpt.errors import CheckpointError
from portable_ckpt.storage import open_storage
from tests.hardening._util import time_bound

ROOT = Path(__file__).resolve().parents[2]


def _fifo_in_place_of(path: Path) -> None:
    tmp = path.with_name(path.name + ".fifo")
    os.mkfifo(tmp)
    os.replace(tmp, path)


def _code(fn: Any, *args: Any, seconds: float = 10.0, **kwargs: Any) -> str:
    """Run ``fn`` under a time bound; return the code of the CheckpointError it must raise."""
    with time_bound(seconds), pytest.raises(CheckpointError) as ei:
        fn(*args, **kwargs)
    return str(ei.value.code)


def test_shard_swapped_for_a_fifo_after_the_first_read(tmp_path: Path) -> None:
    """Item 18 (R-SEC-16): the file type is checked on every open, not once: no read blocks."""
    m = portable_ckpt.save_arrays(tmp_path, {"w": np.arange(1024, dtype=np.float32)}, step=1)
    ck = portable_ckpt.open(tmp_path)
    np.testing.assert_array_equal(ck.read("w"), np.arange(1024, dtype=np.float32))
    [shard] = [f for f in m.files if f.startswith("data/")]
    _fifo_in_place_of(tmp_path / m.attempt_id / shard)
    with time_bound(5):
        try:  # the open reader may serve this from what it already read; it must not block
            ck.read("w")
        except CheckpointError as exc:
            assert exc.code == "PCK-FILE-MISSING", exc
        errors = ck.verify(deep=True)  # opens the shard again
    assert [e.code for e in errors][:1] == ["PCK-FILE-MISSING"], errors
    assert _code(lambda: portable_ckpt.open(tmp_path).read("w"), seconds=5) == "PCK-FILE-MISSING"


def test_shard_swapped_for_a_symlink_after_the_first_read(tmp_path: Path) -> None:
    """R-SEC-1: the leaf is opened with O_NOFOLLOW. A shard replaced by a symlink after the
    reader checked it (open, one read: its size is known, no lstat comes again) is refused by
    the open itself, even when the link's target holds the very same bytes. Test audit 21,
    finding 8: without O_NOFOLLOW on the leaf, this read went through the link."""
    root = tmp_path / "root"
    m = portable_ckpt.save_arrays(root, {"w": np.arange(1024, dtype=np.float32)}, step=1)
    ck = portable_ckpt.open(root)
    np.testing.assert_array_equal(ck.read("w"), np.arange(1024, dtype=np.float32))
    [shard] = [f for f in m.files if f.startswith("data/")]
    path = root / m.attempt_id / shard
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes(path.read_bytes())  # a faithful copy: only the link is wrong
    link = path.with_name(path.name + ".lnk")
    link.symlink_to(outside)
    os.replace(link, path)
    assert _code(ck.read, "w", seconds=5) == "PCK-PATH-UNSAFE"
    storage = open_storage(root)
    buf = memoryview(bytearray(8))
    assert _code(storage.read_into, f"{m.attempt_id}/{shard}", 0, buf) == "PCK-PATH-UNSAFE"
    assert bytes(buf) == bytes(8)


_TRUNCATE_CHILD = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, sys.argv[4])
    from portable_ckpt.io.reader import Checkpoint
    from portable_ckpt.io.versions import load_manifest
    from portable_ckpt.storage import LocalStorage

    root, attempt, victim = sys.argv[1:4]

    class Truncating(LocalStorage):
        # Another process truncates the shard when verification starts on its data (the first
        # access covering half the file or more; header reads come first and are small).
        cut = False

        def _cut(self, path, length):
            full = os.path.join(self.root, path)
            if path.endswith(victim) and not Truncating.cut and length >= os.path.getsize(full) // 2:
                Truncating.cut = True
                os.truncate(full, 4096)

        def map_readonly(self, path, offset, length):
            view = super().map_readonly(path, offset, length)
            self._cut(path, length)
            return view

        def read_into(self, path, offset, buf):
            self._cut(path, len(buf))
            super().read_into(path, offset, buf)

        def read_into_many(self, path, offset, bufs):
            self._cut(path, sum(len(b) for b in bufs))
            super().read_into_many(path, offset, bufs)

    st = Truncating(root)
    ck = Checkpoint(st, attempt, load_manifest(st, attempt))
    codes = sorted({e.code for e in ck.verify(deep=True)})
    print(json.dumps({"codes": codes, "cut": Truncating.cut}))
    """
)


def test_truncation_during_deep_verify_is_an_error_not_sigbus(tmp_path: Path) -> None:
    """Item 19 (R-SEC-17): a shard truncated during ``verify --deep``: PCK-FILE-SIZE, no SIGBUS."""
    arr = np.arange(1 << 18, dtype=np.float32)  # a 1 MiB shard
    m = portable_ckpt.save_arrays(tmp_path, {"w": arr}, step=1)
    [shard] = [f for f in m.files if f.startswith("data/")]
    p = subprocess.run(
        [sys.executable, "-c", _TRUNCATE_CHILD, str(tmp_path), m.attempt_id, shard,
         str(ROOT / "src")],
        capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 0, f"verify died (rc {p.returncode}): {p.stderr[-2000:]}"
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["cut"], "the shard was never truncated: the test did not test anything"
    assert out["codes"] and set(out["codes"]) <= {"PCK-FILE-SIZE", "PCK-STORAGE"}, out


def _hf_file(path: Path) -> None:
    from portable_ckpt.io.safetensors_io import build_header

    data = np.arange(6, dtype=np.float32).tobytes()
    path.write_bytes(build_header([("w", "F32", [6], len(data))], {"format": "pt"}) + data)


@pytest.mark.parametrize(
    ("layout", "fifo", "src_format"),
    [
        ("hf-file", "model.safetensors", "hf"),
        ("hf-file", "model.safetensors", None),
        ("hf-dir", "model.safetensors", "hf"),
        ("hf-index", "model.safetensors.index.json", "hf"),
        ("hf-index", "model-00001-of-00001.safetensors", "hf"),
        ("torch", "model.pt", "torch"),
        ("torch", "model.pt", None),
        ("dcp", ".metadata", "dcp"),
        ("dcp", "__0_0.distcp", "dcp"),
    ],
)
def test_a_fifo_source_never_blocks_convert(
    tmp_path: Path, layout: str, fifo: str, src_format: str | None
) -> None:
    """Item 17: a FIFO among the conversion source files fails at once (PCK-FILE-MISSING)."""
    src = tmp_path / "src"
    src.mkdir()
    if layout == "hf-index":
        _hf_file(src / "model-00001-of-00001.safetensors")
        (src / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": {"w": "model-00001-of-00001.safetensors"}}))
    elif layout == "dcp":
        _dcp_metadata(src, "__0_0.distcp")
        (src / "__0_0.distcp").write_bytes(b"\0" * 64)
    _fifo_in_place_of(src / fifo) if (src / fifo).exists() else os.mkfifo(src / fifo)
    target = src / fifo if layout in ("hf-file", "torch") else src
    code = _code(convert, str(target), str(tmp_path / "dst"), src_format=src_format,
                 trust_pickle=True)
    assert code in {"PCK-FILE-MISSING", "PCK-USAGE"}, code
    assert not (tmp_path / "dst").exists() or not any((tmp_path / "dst").iterdir())


def _dcp_metadata(src: Path, rel: str, length: int = 64) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "convert"))
    import _dcp_pickles as dp

    md = dp.metadata({"w": ("float32", (4,), [((0,), (4,), rel, 0, length)])})
    (src / ".metadata").write_bytes(dp.dumps(md))


@pytest.mark.torch
def test_dcp_relative_path_through_a_symlinked_directory_is_refused(tmp_path: Path) -> None:
    """Item 20: ``sub/__0_0.distcp`` with ``sub`` a symlink out of the source: PCK-PATH-UNSAFE."""
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    outside = tmp_path / "outside"
    dcp.save({"w": torch.arange(4.0)}, checkpoint_id=str(outside), no_dist=True)
    [chunk] = [n for n in os.listdir(outside) if n.endswith(".distcp")]
    src = tmp_path / "src"
    src.mkdir()
    (src / "sub").symlink_to(outside)
    import pickle  # tests only: rewrite DCP's own metadata pickle (src/ never unpickles)

    md = pickle.loads((outside / ".metadata").read_bytes())
    for info in md.storage_data.values():
        info.relative_path = f"sub/{chunk}"
    (src / ".metadata").write_bytes(pickle.dumps(md))
    assert _code(convert, str(src), str(tmp_path / "dst"), trust_pickle=True) == "PCK-PATH-UNSAFE"
    # The same layout with a real directory converts: only the link is refused.
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    (real / "sub" / chunk).write_bytes((outside / chunk).read_bytes())
    (real / ".metadata").write_bytes(pickle.dumps(md))
    convert(str(real), str(tmp_path / "ok"), trust_pickle=True, step=1)
    assert portable_ckpt.open(tmp_path / "ok").read("w").tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_listed_shard_that_is_a_fifo_never_hangs_verify_or_a_restore(tmp_path: Path) -> None:
    """Attack review 4 A2: the second look at damage (confirm_damage) opened the file to drop
    its cached pages without O_NONBLOCK: a FIFO in the newest version hung `verify` and every
    manager restore for ever. Now verify fails (exit 1) and a restore resumes the step before."""
    pytest.importorskip("torch")
    root = tmp_path / "r"
    for step in (1, 2):
        portable_ckpt.save_arrays(root, {"w": np.arange(1000, dtype=np.float32) + step},
                                  step=step)
    [shard] = (root).glob("s000000000002-*/data/*.safetensors")
    _fifo_in_place_of(shard)
    for args in (["verify", str(root)], ["verify", "--deep", str(root)],
                 ["verify", "--deep", "--record-unreadable", str(root)]):
        p = subprocess.run([sys.executable, "-m", "portable_ckpt", *args], capture_output=True,
                           text=True, timeout=60, cwd=ROOT)
        assert p.returncode == 1 and "PCK-FILE-MISSING" in p.stdout + p.stderr, (args, p)
    code = textwrap.dedent(f"""
        import torch
        import portable_ckpt.torch as pckt
        state = {{"w": torch.zeros(1000)}}
        with pckt.CheckpointManager({str(root)!r}, handle_sigterm=False) as m:
            info = m.restore(state)
        print("restored", info.step, float(state["w"][0]))
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=ROOT)
    assert p.returncode == 0 and "restored 1 1.0" in p.stdout, p


@pytest.mark.parametrize("link", ["attempt", "data"])
def test_writes_through_a_symlinked_directory_below_the_root_are_refused(
    tmp_path: Path, link: str
) -> None:
    """mutation audit 22 A-93: LocalStorage refuses a write whose directory below the root is a
    symlink (PCK-PATH-UNSAFE). Reads walk with O_NOFOLLOW, writes do not: without the check an
    attempt directory (or its data/) linked elsewhere took a save's files out of the root."""
    from portable_ckpt.io.writer import new_attempt_id
    from portable_ckpt.storage.local import LocalStorage

    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    att = new_attempt_id(1)
    if link == "attempt":
        (root / att).symlink_to(outside, target_is_directory=True)
    else:
        (root / att).mkdir()
        (root / att / "data").symlink_to(outside, target_is_directory=True)
    st = LocalStorage(str(root))
    assert _code(st.open_writer, f"{att}/data/w00000-0000.safetensors") == "PCK-PATH-UNSAFE"
    assert _code(st.create_if_absent, f"{att}/data/manifest.json", b"{}") == "PCK-PATH-UNSAFE"
    assert _code(st.put, f"{att}/data/x", b"abc") == "PCK-PATH-UNSAFE"
    assert list(outside.iterdir()) == []  # nothing was written outside the root
