"""The code snippets of the spec (``<!-- snippet: NAME -->`` before a python block) run as
the spec says: an implementer who copies one gets what the normative text defines."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from portable_ckpt.format import jsonio
from tests.hardening.test_bounds import _JSON_TEXT

SPEC = Path(__file__).resolve().parents[1] / "spec" / "README.md"
_SNIPPET = re.compile(r"<!-- snippet: (\w+) -->\n```python\n(.*?)\n```", re.S)


def _snippet(name: str) -> Any:
    found = {m.group(1): m.group(2) for m in _SNIPPET.finditer(SPEC.read_text(encoding="utf-8"))}
    scope: dict[str, Any] = {}
    exec(compile(found[name], f"spec/README.md snippet {name}", "exec"), scope)
    return scope[name]


@settings(max_examples=400, deadline=None)
@given(_JSON_TEXT, st.sampled_from([None, 0, 2]), st.sampled_from([(",", ":"), (" , ", " : ")]))
def test_the_value_count_snippet_counts_r_sec_15_values(doc: Any, indent: Any, seps: Any) -> None:
    """§18.3's count_values equals the reference reader's count (which
    tests/hardening/test_bounds.py holds equal to the values of the parsed document), whatever
    the blanks and the strings hold."""
    count_values = _snippet("count_values")
    text = json.dumps(doc, indent=indent, separators=seps, ensure_ascii=False).encode()
    assert count_values(text) == jsonio.count_values(text)
    assert count_values(b' [ { } , [ \n ] , "\\\\" ] ') == 4  # {}, [], a string, the array
