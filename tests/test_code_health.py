"""bench/code_health.py counts what issue 18 measures: code lines per function."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.code_health import main, measure_file, summary  # noqa: E402

SOURCE = '''
def outer(a,
          b):
    """Docstring lines
    do not count."""
    # a comment line does not count

    x = call(
        a,
        b,
    )
    def inner():
        return 1
    return x


class K:
    @property
    def one(self):
        return 1
'''


def test_counts_code_lines_only(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text(SOURCE)
    sizes = {s.name: s.code_lines for s in measure_file(f, tmp_path)}
    # outer: "x = call(", "a,", "b,", "return x" (not the signature, docstring, comment, blank,
    # the lone ")" nor the nested function); inner and one: one line each.
    assert sizes == {"outer": 4, "inner": 1, "one": 1}
    s = summary(measure_file(f, tmp_path))
    assert (s["functions"], s["median"], s["over_50"]) == (3, 1, 0)


def test_cli_prints_the_summary(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "m.py"
    f.write_text(SOURCE)
    assert main([str(f), "--over", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("functions 3  median 1") and "outer" in out and "inner" not in out
