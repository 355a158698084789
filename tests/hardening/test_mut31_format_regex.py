"""Mutation audit 31, schema regular expressions (spec §18.7): what the earlier tests left
unchecked in :mod:`portable_ckpt.format.regex`."""

from __future__ import annotations

import pytest

from portable_ckpt.format.regex import PatternError, compile_pattern


@pytest.mark.parametrize("pattern", [r"\uD800", r"\uDBFF", r"\uDC00", r"\uDFFF", r"a\uDC00b"])
def test_every_lone_surrogate_escape_is_outside_the_subset(pattern: str) -> None:
    # §18.7 excludes "a lone surrogate escape", a low one as much as a high one: RE2 compiles
    # \x{dc00} without complaint, so only the subset check stands between it and a validator.
    with pytest.raises(PatternError, match="lone surrogate"):
        compile_pattern(pattern)


def test_a_surrogate_pair_escape_is_one_code_point() -> None:
    assert compile_pattern(r"^\uD83D\uDE00$").search("\U0001f600")
    assert not compile_pattern(r"^\uD83D\uDE00$").search("x")
