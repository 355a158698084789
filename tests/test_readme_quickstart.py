"""The README's quick start runs as written and prints what its comments say (docs review 21)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _quick_start() -> str:
    text = README.read_text(encoding="utf-8").split("## Quick start", 1)[1]
    block = re.search(r"```python\n(.*?)\n```", text, re.S)
    assert block is not None, "README's quick start has no python block"
    return block.group(1)


def test_the_quick_start_prints_what_its_comments_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = _quick_start()
    monkeypatch.chdir(tmp_path)  # its root is relative: a directory of the user's own
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md quick start", "exec"), {})
    printed = out.getvalue()
    for line in code.splitlines():  # print(...)  # 10 (3, 4): the comment is the output
        said = re.match(r"print\(.*\)\s+# (.*)$", line)
        if said and not said.group(1).startswith(("reads", "latest")):
            assert said.group(1) in printed, (said.group(1), printed)
    assert re.search(r"\[\[ *5\. +6\.\]\n \[ *9\. +10\.\]\]", printed), printed  # the 2x2 box
    assert (tmp_path / "ckpts").is_dir()
