"""The one-expression fast path of check_relative_path accepts exactly what the rules accept."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from portable_ckpt.errors import PathUnsafeError
from portable_ckpt.format.paths import _SAFE_PATH, MAX_COMPONENTS, check_relative_path

_COMPONENT = re.compile(r"[A-Za-z0-9._-]{1,255}")


def _rules(path: str) -> bool:
    """Spec §2.2 written out step by step (the reference the fast path must agree with)."""
    if not path or len(path) > 4096 or path.startswith("/") or "\\" in path:
        return False
    parts = path.split("/")
    return len(parts) <= MAX_COMPONENTS and all(
        p not in (".", "..") and _COMPONENT.fullmatch(p) for p in parts
    )


paths = st.one_of(
    st.text(alphabet="ab./\\-_é ", max_size=24),
    st.lists(st.sampled_from(["a", ".", "..", "..a", ".b", "c.", "", "x" * 255, "x" * 256, "é"]),
             min_size=1, max_size=10).map("/".join),
)


@settings(max_examples=400, deadline=None)
@given(paths)
def test_fast_path_agrees_with_the_rules(path: str) -> None:
    """R-LAYOUT-6 / R-SEC-1: the path rules, whichever way they are checked."""
    expected = _rules(path)
    assert bool(_SAFE_PATH.fullmatch(path)) == expected
    try:
        check_relative_path(path)
        accepted = True
    except PathUnsafeError:
        accepted = False
    assert accepted == expected
