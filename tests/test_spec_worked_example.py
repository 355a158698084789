"""The worked example of spec §21: the bytes in the text are the committed files, and they read.

``spec/worked-example/generate.py`` writes the version; spec §21 prints every file (hex dumps
for the shards, JSON text for the rest), each after a ``<!-- file: <path> (<n> bytes) -->``
marker. This test holds the three together and reads the version with the reference reader,
``verify`` and the conformance checker.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import numpy as np

import portable_ckpt
from conformance.checker import check

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "spec" / "README.md"
HERE = ROOT / "spec" / "worked-example"
GENERATOR = HERE / "generate.py"
_BLOCK = re.compile(r"<!-- file: (\S+) \((\d+) bytes\) -->\n```(\w+)\n(.*?)\n```", re.S)


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("pck_worked_example", GENERATOR)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _version() -> Path:
    return HERE / _generator().ATTEMPT


def _shown() -> dict[str, tuple[int, str, str]]:
    text = SPEC.read_text(encoding="utf-8")
    section = text.split("## 21. Worked example", 1)[1].split("\n## 22.", 1)[0]
    shown: dict[str, tuple[int, str, str]] = {}
    for rel, n, kind, body in _BLOCK.findall(section):
        assert rel not in shown, f"{rel} shown twice"
        shown[rel] = (int(n), kind, body)
    return shown


def _unhex(dump: str) -> bytes:
    out = bytearray()
    for line in dump.splitlines():
        offset, rest = line.split(": ", 1)
        assert int(offset, 16) == len(out), line
        out += bytes.fromhex(rest[:39].replace(" ", ""))
    return bytes(out)


def test_the_text_shows_every_file_byte_for_byte() -> None:
    vdir = _version()
    files = {p.relative_to(vdir).as_posix(): p.read_bytes()
             for p in vdir.rglob("*") if p.is_file()}
    shown = _shown()
    assert set(shown) == set(files)
    for rel, (n, kind, body) in shown.items():
        data = files[rel]
        assert len(data) == n, rel
        if kind == "text":
            assert _unhex(body) == data, rel
        else:
            assert data.decode("utf-8") in (body, body + "\n"), rel


def test_the_generator_writes_the_committed_files(tmp_path: Path) -> None:
    gen = _generator()
    assert gen.main(["--out", str(tmp_path)]) == 0
    made = tmp_path / gen.ATTEMPT
    for p in made.rglob("*"):
        if p.is_file():
            assert p.read_bytes() == (_version() / p.relative_to(made)).read_bytes(), p


def test_the_reference_tools_read_the_worked_example() -> None:
    vdir = _version()
    ck = portable_ckpt.open(vdir)
    assert ck.step == 7 and ck.continuation.world_size == 2
    assert ck.read("w").tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert ck.read("w", [1, 1], [1, 1]).tolist() == [[4.0]]
    assert ck.read("w").dtype == np.float32
    assert ck.entry("progress") == {"step": 7}
    assert [ck.entry("seed", rank=r) for r in (0, 1)] == [{"seed": 100}, {"seed": 101}]
    assert ck.entry("seed", rank=2, world_size=3) == {"seed": 100}
    assert ck.verify(deep=True) == []
    rep = check(vdir, deep=True)
    assert rep.ok and not rep.warnings, rep.to_json()
