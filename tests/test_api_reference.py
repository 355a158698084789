"""docs/api/README.md is what docs/api/generate.py builds from today's code (issue 16, guess 9)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _generator():  # type: ignore[no-untyped-def]
    path = ROOT / "docs" / "api" / "generate.py"
    spec = importlib.util.spec_from_file_location("pck_api_reference", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_api_reference_is_up_to_date() -> None:
    gen = _generator()
    assert gen.OUT.read_text(encoding="utf-8") == gen.render(), (
        "docs/api/README.md is out of date: run ./dev python docs/api/generate.py")


def test_the_reference_covers_what_a_third_party_writer_needs() -> None:
    text = (ROOT / "docs" / "api" / "README.md").read_text(encoding="utf-8")
    for needle in ("class ShardWriter(", "def add_tensor(", "def finish(", "def commit(",
                   "def open_storage(", "def entry(self, name: str, rank: int | None = None, "
                   "world_size: int | None = None)", "portable_ckpt.io.reader.NO_VALUE",
                   "`PCK-WRITER-MISSING`", "`PCK-DTYPE-VALUE`", "def new_attempt_id("):
        assert needle in text, needle
    assert "docs/api/README.md" in (ROOT / "README.md").read_text(encoding="utf-8")
