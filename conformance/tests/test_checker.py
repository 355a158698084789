"""``python -m conformance check`` on reference-written checkpoints and on bad inputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conformance.checker import check
from conformance.spec import NEWEST_MINOR
from conformance.store import crc32c

from .conftest import REPO


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "conformance", *args], cwd=REPO, env=env,
                          capture_output=True, text=True)


@pytest.fixture
def ref_root(tmp_path: Path) -> Path:
    pc = pytest.importorskip("portable_ckpt")
    root = tmp_path / "root"
    pc.save_arrays(str(root), {"w": np.arange(12, dtype=np.float32).reshape(4, 3),
                               "b": np.arange(5, dtype=np.int64)},
                   step=3, entries={"meta": {"epoch": 1}})
    return root


def test_crc32c_check_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283
    d = bytes(i % 251 for i in range(10000))  # spec §6.3 worked example
    assert [f"{crc32c(d[i:i + 4096]):08x}" for i in range(0, len(d), 4096)] == \
        ["719077fc", "cf9bb204", "c59156a2"]


def test_reference_checkpoint_conforms(ref_root: Path) -> None:
    rep = check(ref_root, deep=True)
    assert rep.ok, [e.to_json() for e in rep.errors]
    (version,) = [p for p in ref_root.iterdir() if p.is_dir()]
    assert check(version, deep=True).ok


def test_cli_json_and_exit_codes(ref_root: Path, tmp_path: Path) -> None:
    ok = _cli("check", str(ref_root), "--deep", "--json")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    doc = json.loads(ok.stdout)
    assert doc["ok"] is True and doc["errors"] == []
    (version,) = [p for p in ref_root.iterdir() if p.is_dir()]
    data = next((version / "data").iterdir())
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF
    data.write_bytes(bytes(raw))
    shallow = _cli("check", str(ref_root), "--json")
    deep = _cli("check", str(ref_root), "--deep", "--json")
    assert deep.returncode == 1
    assert {e["code"] for e in json.loads(deep.stdout)["errors"]} == {"PCK-CHECKSUM"}
    assert shallow.returncode in (0, 1)  # only header blocks are read without --deep
    text = _cli("check", str(ref_root), "--deep")
    assert text.returncode == 1 and "PCK-CHECKSUM" in text.stdout


@pytest.mark.parametrize(("setup", "code"), [
    ("missing", "PCK-NOT-FOUND"),
    ("empty-root", "PCK-NOT-FOUND"),
    ("file", "PCK-USAGE"),
    ("garbage-manifest", "PCK-JSON-INVALID"),
    ("manifest-array", "PCK-SCHEMA"),
    ("manifest-symlink", "PCK-PATH-UNSAFE"),
    ("huge-nesting", "PCK-JSON-INVALID"),
])
def test_bad_inputs(setup: str, code: str, tmp_path: Path) -> None:
    aid = "s000000000001-20260101T000000000000Z-0123456789abcdef"
    target = tmp_path / "x"
    if setup == "empty-root":
        target.mkdir()
    elif setup == "file":
        target.write_text("hello")
    elif setup != "missing":
        v = target / aid
        v.mkdir(parents=True)
        m = v / "manifest.json"
        if setup == "garbage-manifest":
            m.write_bytes(b"\x00\xff{")
        elif setup == "manifest-array":
            m.write_text("[]")
        elif setup == "manifest-symlink":
            (tmp_path / "elsewhere.json").write_text("{}")
            m.symlink_to(tmp_path / "elsewhere.json")
        elif setup == "huge-nesting":
            m.write_text("[" * 100000 + "]" * 100000)
        target = v
    rep = check(target)
    assert not rep.ok
    assert rep.codes == {code}, [e.to_json() for e in rep.errors]


def test_never_crashes_on_mutated_manifests(ref_root: Path) -> None:
    """Random structural damage yields findings with spec codes, never an exception."""
    import random

    (version,) = [p for p in ref_root.iterdir() if p.is_dir()]
    original = json.loads((version / "manifest.json").read_text())
    rnd = random.Random(0)
    junk = [None, 0, -1, 2**64, "x", "", [], {}, [1, 2], {"a": 1}, True, 1.5, "../x"]

    def paths(node: object, prefix: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        out = [prefix]
        if isinstance(node, dict):
            for k, v in node.items():
                out += paths(v, (*prefix, k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                out += paths(v, (*prefix, i))
        return out

    all_paths = [p for p in paths(original) if p]
    for _ in range(150):
        doc = json.loads(json.dumps(original))
        path = rnd.choice(all_paths)
        node = doc
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = rnd.choice(junk)
        (version / "manifest.json").write_text(json.dumps(doc))
        rep = check(version, deep=True)
        for e in rep.errors:
            assert e.code.startswith("PCK-"), e


def test_coverage_is_box_arithmetic_and_fast(tmp_path: Path) -> None:
    """2^34-element tensor with 4096 ranges: box arithmetic, fast, no per-element memory."""
    from conformance.coverage import check_coverage
    from conformance.store import Problem

    n = 64
    shape = [n * 1024, n * 256]  # 2^34 elements
    boxes = [((i * 1024, j * 256), (1024, 256)) for i in range(n) for j in range(n)]
    t0 = time.monotonic()
    check_coverage(shape, boxes)
    assert time.monotonic() - t0 < 2.0
    with pytest.raises(Problem) as ei:
        check_coverage(shape, boxes[:-1])
    assert ei.value.code == "PCK-COVERAGE-GAP"
    with pytest.raises(Problem) as ei:
        check_coverage(shape, [*boxes, ((5, 5), (1, 1))])
    assert ei.value.code == "PCK-COVERAGE-OVERLAP"


def test_checker_does_not_import_portable_ckpt() -> None:
    code = ("import sys; import conformance.checker, conformance.reader, conformance.harness; "
            "print(any(m == 'portable_ckpt' or m.startswith('portable_ckpt.') "
            "for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.stdout.strip() == "False", out.stderr


def test_unlisted_and_temp_files_are_warnings(ref_root: Path) -> None:
    (version,) = [p for p in ref_root.iterdir() if p.is_dir()]
    (version / "manifest.json.0123456789abcdef.tmp").write_text("{")
    (version / "stray.bin").write_bytes(b"x")
    rep = check(version)
    assert rep.ok
    assert any("stray.bin" in w.message for w in rep.warnings)


def test_a_nul_padded_header_is_named_as_such() -> None:
    """A C writer padding with NUL bytes got "not valid JSON: Extra data" (adopter review F11)."""
    from conformance.store import Problem, parse_safetensors_bytes

    body = b'{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    for pad in (b"\x00", b" "):
        header = body + pad * (-len(body) % 8 or 8)
        data = len(header).to_bytes(8, "little") + header + b"\x00" * 4
        if pad == b" ":
            assert parse_safetensors_bytes(data, "t")  # the spec's padding parses
            continue
        with pytest.raises(Problem, match="padded with NUL bytes") as ei:
            parse_safetensors_bytes(data, "t")
        assert ei.value.code == "PCK-SHARD-HEADER"


@pytest.mark.parametrize("odd", ["symlink", "file"])
def test_a_pins_that_is_no_directory_is_reported(ref_root: Path, tmp_path: Path, odd: str) -> None:
    """§15.3, R-GC-11: a root's `pins` that is a symbolic link or a file is a pin that cannot
    be read; the checker called such a root conformant (attack review 5 F1)."""
    if odd == "symlink":
        (tmp_path / "shared").mkdir()
        (ref_root / "pins").symlink_to(tmp_path / "shared")
    else:
        (ref_root / "pins").write_text("not a directory")
    rep = check(ref_root)
    assert not rep.ok and any(e.code == "PCK-PATH-UNSAFE" and "pins" in e.message
                              for e in rep.errors)



def test_a_pin_record_that_is_no_file_is_reported_as_the_library_does(
    ref_root: Path, tmp_path: Path
) -> None:
    """Diff review 3 F8: the checker called a symlinked pin record PCK-FILE-MISSING, the
    library a pin that cannot be read (PCK-PATH-UNSAFE)."""
    (ref_root / "pins").mkdir()
    target = tmp_path / "p.json"
    target.write_text("{}")
    (ref_root / "pins" / "p20261204T120000000000Z-0a1b2c3d.json").symlink_to(target)
    rep = check(ref_root)
    assert [e.code for e in rep.errors] == ["PCK-PATH-UNSAFE"], rep.errors


def _edit(root: Path, change: object) -> Path:
    (version,) = [p for p in root.iterdir() if p.is_dir()]
    path = version / "manifest.json"
    doc = json.loads(path.read_text())
    change(doc)  # type: ignore[operator]
    path.write_text(json.dumps(doc))
    return version


def test_a_newer_minor_is_warned_as_a_writer_rule_and_foreign_when_it_fails(
    ref_root: Path,
) -> None:
    """Review C2: a writer that stamps format_version '1.2' passed check and the writer harness
    without a word (R-VERSION-2 asks for '1.0' or '1.1'); the warning names R-VERSION-2, which
    the harness fails. C3: such a record that fails a 1.1 check with a specific code (a dtype,
    a codec) is foreign: PCK-VERSION-UNSUPPORTED, as for any other failed check."""
    from conformance.verify import _WRITER_RULES

    newer = f"1.{NEWEST_MINOR + 1}"  # not a literal (contributor review D5)
    _edit(ref_root, lambda d: d.update(format_version=newer))
    rep = check(ref_root, deep=True)
    assert rep.ok, [e.to_json() for e in rep.errors]
    (warning,) = [w.message for w in rep.warnings if "newer" in w.message]
    assert "(R-VERSION-2)" in warning and _WRITER_RULES.search(warning)
    _edit(ref_root, lambda d: d["tensors"]["w"].update(dtype="fp32"))
    assert [e.code for e in check(ref_root).errors] == ["PCK-VERSION-UNSUPPORTED"]
    pc = pytest.importorskip("portable_ckpt")
    with pytest.raises(pc.CheckpointError) as err:  # the reference reader agrees
        pc.open(str(ref_root))
    assert err.value.code in ("PCK-VERSION-UNSUPPORTED", "PCK-NOT-FOUND"), err.value


def _data_file(version: Path) -> Path:
    doc = json.loads((version / "manifest.json").read_text())
    [rel] = [str(p) for p in doc["files"] if str(p).startswith("data/")]
    return version / rel


def test_an_extended_file_is_a_size_error(ref_root: Path) -> None:
    """R-FILES-3: a file longer than its record is as wrong as a shorter one (a writer that
    appended after it recorded the size). Test audit 21b, K01: every size vector truncates, so
    a checker that flagged only short files (``size < fr.size``) passed the whole suite."""
    (version,) = [p for p in ref_root.iterdir() if p.is_dir()]
    data = _data_file(version)
    with open(data, "ab") as f:
        f.write(b"\0" * 10)
    rep = check(version)
    assert rep.codes == {"PCK-FILE-SIZE"}, [e.to_json() for e in rep.errors]
    assert any(data.name in e.message and "extended" in e.message for e in rep.errors)


def test_deep_check_verifies_every_block_of_each_read(tmp_path: Path) -> None:
    """§6.2, R-CKSUM-3, R-CKSUM-4: ``--deep`` verifies the CRC32C of every block. The checker
    reads up to 16 MiB at once; one flipped byte in a block that is not the first of its read
    (here the second, a middle and the last of a 40-block file read whole) is PCK-CHECKSUM
    naming that block. Test audit 21b, K02: a checker that checked only the first block of
    each read passed every vector and checker test (no vector damages a later block)."""
    pc = pytest.importorskip("portable_ckpt")
    root = tmp_path / "root"
    pc.save_arrays(str(root), {"w": np.arange(40000, dtype=np.float32)}, step=3)
    (version,) = [p for p in root.iterdir() if p.is_dir()]
    assert check(version, deep=True).ok
    data = _data_file(version)
    good = data.read_bytes()
    bs = 4096
    assert json.loads((version / "manifest.json").read_text())["files"][
        data.relative_to(version).as_posix()]["checksum"]["block_size"] == bs
    last = (len(good) - 1) // bs
    assert last >= 30
    for block in (1, last // 2, last):
        raw = bytearray(good)
        raw[block * bs + 7] ^= 0xFF
        data.write_bytes(bytes(raw))
        rep = check(version, deep=True)
        assert rep.codes == {"PCK-CHECKSUM"}, (block, [e.to_json() for e in rep.errors])
        assert any(f"block {block} " in e.message for e in rep.errors), (block, rep.errors)
    data.write_bytes(good)
    assert check(version, deep=True).ok


def test_a_gap_of_one_element_is_found(ref_root: Path) -> None:
    """§9, R-COVER-3: ranges that leave a single element uncovered are a gap. Test audit
    21b, K07: every gap vector leaves more than one element out, so ``covered < total - 1``
    passed the suite. Here ``b`` (5 elements, one range) is declared with 6."""
    version = _edit(ref_root, lambda d: d["tensors"]["b"].update(shape=[6]))
    rep = check(version)
    assert "PCK-COVERAGE-GAP" in rep.codes, [e.to_json() for e in rep.errors]
    assert any("cover 5 of 6 elements" in e.message for e in rep.errors), rep.errors


@pytest.mark.parametrize("defect", [None, "schema", "name", "attempt", "json", "not-a-mark"])
def test_a_deletion_mark_in_a_committed_version(ref_root: Path, defect: str | None) -> None:
    """R-GC-13 (errata 18): a gc's deletion mark beside a commit record (a gc stopped before the
    record went) is no file of the version: a warning, the version conforms. A mark is read as
    drill, copy and verification records are: one that does not validate, is not stored under
    its own ``deletion_id`` or names another attempt is an error of the gc that wrote it."""
    (version,) = [p for p in ref_root.iterdir() if p.is_dir()]
    ident = "g20261205T120000000000Z-0badf00d"
    doc = {"format": "portable-ckpt-deletion", "format_version": "1.0", "deletion_id": ident,
           "attempt_id": version.name, "started_at": "2026-12-05T12:00:00.000000Z",
           "reason": "retention"}
    name = f"{ident}.json"
    if defect == "schema":
        del doc["started_at"]
    elif defect == "name":
        name = "g20261205T120000000000Z-00000000.json"
    elif defect == "attempt":
        doc["attempt_id"] = version.name[:-1] + ("0" if version.name[-1] != "0" else "1")
    elif defect == "not-a-mark":  # not named like one: a file like any other (mark review F8)
        name, doc = "README.json", {}
    (version / "deleting").mkdir()
    (version / "deleting" / name).write_text("{" if defect == "json" else json.dumps(doc))
    rep = check(ref_root)
    codes = sorted(e.code for e in rep.errors)
    want = {None: [], "schema": ["PCK-SCHEMA"], "name": ["PCK-SCHEMA"],
            "attempt": ["PCK-ATTEMPT-ID"], "json": ["PCK-JSON-INVALID"], "not-a-mark": []}[defect]
    assert codes == want, [e.to_json() for e in rep.errors]
    if defect is None:
        assert rep.ok and any("R-GC-13" in w.message for w in rep.warnings)
    assert not any("is not listed in files" in w.message for w in rep.warnings)
