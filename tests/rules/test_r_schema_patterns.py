"""Schema regular expressions on real checkpoints (R-ENTRY-15, R-SEC-14, §18.7).

Before errata 1 the conformance checker evaluated embedded-schema patterns with Python's
backtracking ``re`` (``^(a+)+$`` took 0.6 s at 24 characters, 3.6 s at 27) and accepted a
lookahead; the reference reader refused the lookahead only when a value reached it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from conformance.checker import check
from portable_ckpt.errors import EntrySchemaError
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.storage import open_storage

from ._util import edit_manifest, expect_code, read_manifest, rewrite_file


def _with_embedded_schema(root: Path, schema: dict[str, Any], value: Any) -> Path:
    """A version whose entry ``cfg`` declares ``schema`` and stores ``value`` (unchecked)."""
    portable_ckpt.save_arrays(root, {"w": np.zeros(2, np.float32)}, step=1,
                              entries={"cfg": "placeholder"})
    vdir = next(p for p in root.iterdir() if p.is_dir())
    rel = read_manifest(vdir)["entries"]["cfg"]["values"][0]["file"]
    edit_manifest(vdir, lambda d: d["entries"]["cfg"].__setitem__("schema",
                                                                  {"json_schema": schema}))
    rewrite_file(vdir, rel, json.dumps(value).encode())
    return vdir


@pytest.mark.timeout(60)
def test_a_catastrophic_pattern_is_evaluated_in_linear_time(tmp_path: Path) -> None:
    """R-ENTRY-15: 40 a's and a '!' against ^(a+)+$ (hours for a backtracking engine)."""
    vdir = _with_embedded_schema(tmp_path, {"type": "string", "pattern": "^(a+)+$"},
                                 "a" * 40 + "!")
    t0 = time.process_time()  # (CPU: other processes do not count)
    rep = check(vdir, deep=True)
    assert rep.codes == {"PCK-ENTRY-SCHEMA"}, rep.to_json()
    expect_code("PCK-ENTRY-SCHEMA", portable_ckpt.open(vdir).entry, "cfg")
    assert [e.code for e in portable_ckpt.open(vdir).verify()] == ["PCK-ENTRY-SCHEMA"]
    assert time.process_time() - t0 < 10


@pytest.mark.parametrize("pattern", ["(?=a)", "^(a)\\1$", "\\Aa", "[[:alpha:]]", "(?i)a"])
def test_a_pattern_outside_the_subset_is_refused_even_when_no_value_reaches_it(
        tmp_path: Path, pattern: str) -> None:
    """R-ENTRY-15: every pattern of the schema counts, not only the ones a value meets."""
    schema = {"type": "object", "properties": {"x": {"type": "string", "pattern": pattern}}}
    vdir = _with_embedded_schema(tmp_path, schema, {})
    assert check(vdir).codes == {"PCK-ENTRY-SCHEMA"}
    expect_code("PCK-ENTRY-SCHEMA", portable_ckpt.open(vdir).entry, "cfg")
    assert [e.code for e in portable_ckpt.open(vdir).verify()] == ["PCK-ENTRY-SCHEMA"]
    st = open_storage(tmp_path / "w", create=True)
    w = ShardWriter(st, new_attempt_id(1), 0)
    with pytest.raises(EntrySchemaError):
        w.add_entry("cfg", {}, {"json_schema": schema})
    w.abort()


def test_a_pattern_key_of_pattern_properties_is_checked_too(tmp_path: Path) -> None:
    vdir = _with_embedded_schema(tmp_path, {"patternProperties": {"(?<=k)": {}}}, {"a": 1})
    assert check(vdir).codes == {"PCK-ENTRY-SCHEMA"}
    expect_code("PCK-ENTRY-SCHEMA", portable_ckpt.open(vdir).entry, "cfg")


@pytest.mark.parametrize(("pattern", "good", "bad"), [
    ("^[a-z]+$", "abc", "abc\n"),         # $: the end of the input
    ("^\\w+$", "abc", "abç"),              # \w: ASCII
    ("^.+$", "a b", "a\rb"),              # .: no line terminator
    ("^\\s+$", "\u00a0\v", "\u200b"),     # \s: ECMA-262 white space
])
def test_embedded_patterns_have_their_ecma262_meaning(tmp_path: Path, pattern: str, good: str,
                                                     bad: str) -> None:
    """§18.7 on both tools: the same value is accepted or refused by the reader and the checker."""
    for i, (value, ok) in enumerate(((good, True), (bad, False))):
        vdir = _with_embedded_schema(tmp_path / str(i), {"pattern": pattern}, value)
        assert check(vdir).ok is ok, (value, check(vdir).to_json())
        ck = portable_ckpt.open(vdir)
        if ok:
            assert ck.entry("cfg") == value
        else:
            expect_code("PCK-ENTRY-SCHEMA", ck.entry, "cfg")


@pytest.mark.timeout(60)
def test_unique_items_is_checked_without_quadratic_cost(tmp_path: Path) -> None:
    """R-ENTRY-15: 50,000 distinct objects under uniqueItems (pairwise: 1.25e9 comparisons)."""
    value = [{"i": i} for i in range(50_000)] + [{"i": 7.0}]
    vdir = _with_embedded_schema(tmp_path, {"type": "array", "uniqueItems": True}, value)
    t0 = time.process_time()  # this process's CPU: a loaded machine does not inflate it
    assert check(vdir).codes == {"PCK-ENTRY-SCHEMA"}  # {"i": 7.0} equals {"i": 7}
    expect_code("PCK-ENTRY-SCHEMA", portable_ckpt.open(vdir).entry, "cfg")
    assert time.process_time() - t0 < 20  # pairwise would take many minutes
