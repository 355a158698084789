"""The writer harness against the reference adapter, the minimal writer and broken writers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.harness import (
    CrashCase,
    EntrySpec,
    HarnessFailure,
    SaveCase,
    TensorSpec,
    check_writer,
    run_crash_case,
    run_save_case,
)

from .conftest import MINIMAL_WRITER, REFERENCE_ADAPTER, REPO

BAD_WRITER = [sys.executable, str(Path(__file__).with_name("bad_writer.py"))]


def test_reference_adapter(fast_tmp: Path) -> None:
    pytest.importorskip("portable_ckpt")
    check_writer(REFERENCE_ADAPTER, examples=3, crash_examples=2, seed=11, max_writers=3,
                 workdir=str(fast_tmp))


def test_minimal_writer(fast_tmp: Path) -> None:
    check_writer(MINIMAL_WRITER, examples=12, crash_examples=8, seed=12, workdir=str(fast_tmp))


@pytest.mark.parametrize("tables", ["always", "never"])
def test_minimal_writer_table_modes(tables: str, fast_tmp: Path) -> None:
    """Jobs that always / never ask for a tensor table (format 1.1, §8.5) both pass."""
    check_writer(MINIMAL_WRITER, examples=5, crash_examples=2, seed=13, workdir=str(fast_tmp),
                 tables=tables)
    manifests = [json.loads(m.read_text()) for m in fast_tmp.rglob("manifest.json")]
    assert manifests
    with_table = [m for m in manifests if "tensor_table" in m]
    assert len(with_table) == (len(manifests) if tables == "always" else 0)
    for m in with_table:  # R-TABLE-2, R-VERSION-2
        assert m["format_version"] == "1.1" and "tensor-table" in m["must_understand"]
    for m in manifests:
        if "tensor_table" not in m:
            assert m["format_version"] == "1.0"


@pytest.mark.parametrize("table_codec", ["none", "zstd"])
def test_minimal_writer_explicit_tables(table_codec: str, fast_tmp: Path) -> None:
    case = _explicit_case()
    case.tensor_table, case.table_codec = True, table_codec
    run_save_case(MINIMAL_WRITER, case, fast_tmp)
    (m,) = [json.loads(p.read_text()) for p in fast_tmp.rglob("manifest.json")]
    assert m["tensor_table"]["codec"] == table_codec and m["tensors"] == {}


def test_minimal_writer_uses_a_table_above_its_threshold(fast_tmp: Path) -> None:
    """Not asked for a table, the minimal writer still uses one for many range records."""
    boxes = [([i], [1], i % 2) for i in range(40)]
    case = SaveCase(step=3, num_writers=2, codec="zstd",
                    tensors=[TensorSpec("many", "int16", [40], 5, boxes)], entries=[])
    run_save_case(MINIMAL_WRITER, case, fast_tmp)
    (m,) = [json.loads(p.read_text()) for p in fast_tmp.rglob("manifest.json")]
    assert "tensor_table" in m


def test_broken_table_names_are_caught(fast_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """R-TABLE-7: ranges not stored under their implied names fail the harness."""
    monkeypatch.setenv("PCK_BAD_MODE", "table-names")
    case = _explicit_case()
    case.tensor_table = True
    with pytest.raises(HarnessFailure) as ei:
        run_save_case(BAD_WRITER, case, fast_tmp)
    assert "PCK-SHARD-MISMATCH" in str(ei.value)


def test_minimal_writer_imports_only_stdlib_numpy_safetensors() -> None:
    src = (REPO / "conformance" / "examples" / "minimal_writer.py").read_text()
    imports = {line.split()[1].split(".")[0] for line in src.splitlines()
               if line.startswith(("import ", "from "))}
    assert imports <= {"__future__", "json", "math", "os", "struct", "sys", "time", "pathlib",
                       "typing", "numpy", "safetensors"}, imports


def _explicit_case() -> SaveCase:
    return SaveCase(
        step=7, num_writers=2, codec="none",
        tensors=[TensorSpec("w", "float32", [4, 3], 1, [([0, 0], [2, 3], 0), ([2, 0], [2, 3], 1)]),
                 TensorSpec("s", "int64", [], 2, [([], [], 1)])],
        entries=[EntrySpec("meta", {"id": "pck:json/1"}, "global", "json", value={"a": 1})])


@pytest.mark.parametrize(("mode", "message"), [("flip", "PCK-CHECKSUM"), ("swap", "differs")])
def test_broken_data_is_caught(mode: str, message: str, fast_tmp: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PCK_BAD_MODE", mode)
    with pytest.raises(HarnessFailure) as ei:
        run_save_case(BAD_WRITER, _explicit_case(), fast_tmp)
    assert message in str(ei.value)


@pytest.mark.parametrize(("mode", "fault", "message"), [
    ("no-writer-check", "write:after_data", "commit exited 0"),
    ("ignore-fail", "write:mid_data", "exited 0 although asked to fail"),
    ("ignore-fail", "commit:before_publish", "commit exited 0"),
])
def test_broken_publish_is_caught(mode: str, fault: str, message: str, fast_tmp: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PCK_BAD_MODE", mode)
    a = _explicit_case()
    b = _explicit_case()
    b.step = 8
    with pytest.raises(HarnessFailure) as ei:
        run_crash_case(BAD_WRITER, CrashCase(a, b, fault, 1, 0.0), fast_tmp)
    assert message in str(ei.value)


def test_minimal_writer_explicit_crashes(fast_tmp: Path) -> None:
    for i, fault in enumerate(["write:before_data", "write:mid_data", "write:after_data",
                               "commit:before_publish", "commit:temp_written", "kill-writer",
                               "kill-commit"]):
        a = _explicit_case()
        b = _explicit_case()
        b.step = 8
        run_crash_case(MINIMAL_WRITER, CrashCase(a, b, fault, 0, 0.05), fast_tmp / str(i))


def test_cli_writer_exit_codes(fast_tmp: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    ok = subprocess.run([sys.executable, "-m", "conformance", "writer", "--examples", "2",
                         "--crash-examples", "1", "--seed", "1", "--workdir",
                         str(fast_tmp / "a"), "--", *MINIMAL_WRITER],
                        cwd=REPO, env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "writer passed" in ok.stdout
    env["PCK_BAD_MODE"] = "flip"
    bad = subprocess.run([sys.executable, "-m", "conformance", "writer", "--examples", "2",
                          "--crash-examples", "0", "--seed", "1", "--no-shrink",
                          "--workdir", str(fast_tmp / "b"), "--", *BAD_WRITER],
                         cwd=REPO, env=env, capture_output=True, text=True)
    assert bad.returncode == 1
    assert "FAIL" in bad.stderr
