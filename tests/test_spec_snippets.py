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

SPEC = Path(__file__).resolve().parents[1] / "spec" / "README.md"
_SNIPPET = re.compile(r"<!-- snippet: (\w+) -->\n```python\n(.*?)\n```", re.S)


def _snippet(name: str) -> Any:
    found = {m.group(1): m.group(2) for m in _SNIPPET.finditer(SPEC.read_text(encoding="utf-8"))}
    scope: dict[str, Any] = {}
    exec(compile(found[name], f"spec/README.md snippet {name}", "exec"), scope)
    return scope[name]


def _values(doc: Any) -> int:
    """R-SEC-15's count on the parsed value: every object, array and scalar, names not."""
    if isinstance(doc, dict):
        return 1 + sum(_values(v) for v in doc.values())
    if isinstance(doc, list):
        return 1 + sum(_values(v) for v in doc)
    return 1


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.sampled_from('a,[]{}"\\\\ :\n\u00e9'), max_size=6),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(st.sampled_from('k,[]{}"\\\\'), max_size=4), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(JSON, st.sampled_from([None, 0, 2]), st.sampled_from([(",", ":"), (" , ", " : ")]))
def test_the_value_count_snippet_counts_r_sec_15_values(doc: Any, indent: Any, seps: Any) -> None:
    """§18.3's count_values: 1 + c + k - e on the text equals the values of the parsed value
    (and the reference reader's numpy count), whatever the blanks and the strings hold."""
    count_values = _snippet("count_values")
    text = json.dumps(doc, indent=indent, separators=seps, ensure_ascii=False).encode()
    assert count_values(text) == _values(doc) == jsonio.count_values(text)
    assert count_values(b' [ { } , [ \n ] , "\\\\" ] ') == 4  # {}, [], a string, the array
