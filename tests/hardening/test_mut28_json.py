"""Mutation audit 28, strict JSON (spec §18.3, R-SEC-7 … R-SEC-11, R-SEC-15, R-SEC-19): what
the earlier tests left unchecked in :mod:`portable_ckpt.format.jsonio`.

Every input is JSON text built by hand; the scans that count values and depth on the text
(used for large documents, in windows) are checked against the parsed document at every window
size, so a state that must carry from one window to the next is exercised at each boundary.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from portable_ckpt.errors import CheckpointError
from portable_ckpt.format import jsonio
from tests.hardening._util import json_depth, json_values


def _invalid(text: bytes | str, **kw: Any) -> CheckpointError:
    with pytest.raises(CheckpointError) as ei:
        jsonio.loads(text, what="doc", **kw)
    assert ei.value.code == "PCK-JSON-INVALID", ei.value
    return ei.value


# ------------------------------------------------------------------------------ R-SEC-7


@pytest.mark.parametrize(
    "text",
    [
        '"\\ud800"', '"\\udbff"', '"\\udc00"', '"\\uDFFF"', '"\\uDC00x"', '"a\\uD800"',
        '"\\udc00\\ud800"',  # a low then a high surrogate: two unpaired halves
        '{"\\ud800": 1}', '{"k": {"\\udfff": 1}}',  # in member names
        '[["\\ud800"]]', '{"a": ["x", ["\\udc00"]]}', '[{"a": [1, "\\ud9ff"]}]',  # nested
    ],
)
def test_every_unpaired_surrogate_escape_is_refused(text: str) -> None:
    """R-SEC-7: an escaped unpaired surrogate is refused wherever it is: high (D800–DBFF) or low
    (DC00–DFFF), either case of hex digits, in a value or a member name, at any depth (mutants:
    the scan missed low surrogates, member names, or strings nested in arrays)."""
    for data in (text, text.encode()):
        assert "surrogate" in _invalid(data).message


@pytest.mark.parametrize("text", ['"\\ud800\\udc00"', '"\\uDBFF\\uDFFF"', '{"\\ud83d\\ude00": ["\\uD83D\\uDE00"]}',
                                  '"\\\\ud800"', '"\\ucfff\\ue000"'])
def test_paired_surrogates_and_lookalikes_are_accepted(text: str) -> None:
    """A pair is one character; ``\\\\ud800`` is a backslash and text; D7FF/E000 are not
    surrogates."""
    assert jsonio.loads(text, what="doc") == json.loads(text)


# ------------------------------------------------------------------------------ R-SEC-9


def test_integer_tokens_overflow_exactly_where_a_double_does() -> None:
    """R-SEC-9: an integer token overflows when its value rounded to the nearest double is
    infinite: from 2^1024 − 2^970 on (309 digits); the largest integers below it, other
    309-digit integers and negative ones are valid JSON and read exactly (mutants: 309-digit
    tokens refused; their overflow not checked; the minus sign counted as a digit)."""
    edge = 2**1024 - 2**970
    assert len(str(edge)) == 309
    for ok in (edge - 1, 10**308, -(10**308), -(edge - 1), 10**308 + 12345):
        assert jsonio.loads(str(ok), what="doc") == ok
        assert jsonio.loads(f'{{"n": [{ok}]}}', what="doc") == {"n": [ok]}
    for bad in (edge, -edge, 2**1024, 10**309 - 1, 10**309, -(10**309)):
        assert "overflows" in _invalid(str(bad)).message


def test_float_tokens_overflow_like_integers() -> None:
    assert jsonio.loads("1.7976931348623157e308", what="doc") == 1.7976931348623157e308
    for bad in ("1e400", "-1e400", "1.8e308", "[0.5, 2e308]"):
        _invalid(bad)


# ------------------------------------------------------------------------------ the text scans


def _texts() -> list[bytes]:
    """Valid JSON texts whose strings hold backslash runs, escaped quotes and brackets."""
    docs: list[Any] = [
        ["a\\", "b\\\\", "\\\"", '"', "[[{", "}]", "\\", "\\\\\\"],
        {"k\\": ["\\\\", {"\\\"": []}], "x": [[], {}, [[]]], "\"[": "]\\"},
        [{"a": "\\" * n + '"' + "\\" * m} for n in range(5) for m in range(3)],
        [[[[["\\]", "[\\"]]]], {}, [], "x" * 7],
    ]
    out = [json.dumps(d).encode() for d in docs]
    out.append(b'[ [ ] , { } , [\n\t] , "\\\\" , "\\"]" ]')
    out.append(b'[ 12 , [ 2 ] , [   true   ] , {"a" : [ null ] } , [ ] , [ "" ] ]')  # blanks, not empty
    return out


@pytest.mark.parametrize("i", range(6))
def test_text_scans_agree_with_the_document_at_every_window_size(i: int) -> None:
    """``count_values`` (R-SEC-15), ``text_depth`` (R-SEC-10) and ``tally`` count on the raw
    text in windows; a window may end inside a string, inside a backslash run or between the
    brackets of an empty container. At every window size they equal the parsed document's
    counts (mutants: the backslash run, the in-string state or an open bracket not carried
    across windows; an even backslash run taken as escaping the quote)."""
    text = _texts()[i]
    doc = json.loads(text)
    values, depth = json_values(doc), json_depth(doc)
    for chunk in range(1, len(text) + 2):
        assert jsonio.count_values(text, chunk=chunk) == values, chunk
        assert jsonio.text_depth(text, chunk=chunk) == depth, chunk
        t = jsonio.tally(text, chunk=chunk)
        assert (t.values, t.depth) == (values, depth), chunk


def test_unescaped_quotes_counts_backslash_runs() -> None:
    import numpy as np

    def quotes(s: bytes, run: int = 0) -> list[int]:
        return [int(x) for x in jsonio.unescaped_quotes(np.frombuffer(s, np.uint8), run)]

    assert quotes(b'a"b') == [1]
    assert quotes(b'\\"') == []
    assert quotes(b'\\\\"') == [2]
    assert quotes(b'\\\\\\"x"') == [5]
    assert quotes(b'"x', run=1) == [] and quotes(b'"x', run=2) == [0]
    assert quotes(b'\\"', run=1) == [1]


# ------------------------------------------------------------------------------ R-SEC-10


def test_depth_limit_is_64_for_small_and_large_documents() -> None:
    """R-SEC-10: the top-level value counts 1; 64 levels are fine, 65 are not, in a small text
    (depth measured by ``text_depth``) and in one large enough to be tallied first."""
    pad = " " * (1 << 20)
    for filler in ("", pad):
        ok = "[" * 64 + filler + "]" * 64
        assert jsonio.loads(ok, what="doc") is not None
        assert "deeper" in _invalid("[" * 65 + filler + "]" * 65).message
        assert "deeper" in _invalid('{"a":' * 65 + filler + "1" + "}" * 65).message


def test_tally_bounds_the_long_scalars_from_above() -> None:
    """``Tally.long_scalars`` is an upper bound of the numbers and literals of three characters
    or more (each costs an object: R-SEC-19's estimate); three-character ones count too
    (mutant: only four or more were counted)."""
    text = b'[123,-12,1.5,true,null,false,{"a":100,"b":[999]},12,7]'
    doc = json.loads(text)
    n = sum(1 for tok in text.replace(b"[", b",").replace(b"]", b",").replace(b"}", b",").replace(b":", b",").split(b",")
            if len(tok) >= 3 and not tok.startswith((b'"', b"{")))
    assert n == 8 and doc
    for chunk in (1, 2, 3, 5, 64):
        assert jsonio.tally(text, chunk=chunk).long_scalars >= n


# ------------------------------------------------------------------------------ R-SEC-19


def test_a_costly_document_of_one_mib_is_refused_before_it_is_built() -> None:
    """R-SEC-19: the cost estimate runs on every format document that could exceed its budget
    (20 bytes of objects per byte plus 16 MiB): from ``16 MiB / 44`` (about 381 KB) on. A 1 MiB
    text of arrays nested 60 deep estimates at about 47 bytes per byte (48 MiB, above its 37 MiB
    budget) and is refused; the same text is valid JSON where no cost bound applies (mutant:
    only texts above four times that size were estimated)."""
    unit = "[" * 60 + "]" * 60
    text = ("[" + ",".join([unit] * 8500) + "]").encode()
    assert jsonio.COST_FLOOR // 44 < len(text) < 1 << 20  # estimated; not 4 times that
    t = jsonio.tally(text)
    assert t.cost() > jsonio.MAX_COST_PER_BYTE * len(text) + jsonio.COST_FLOOR
    assert "memory" in _invalid(text).message
    assert len(jsonio.loads(text, what="value", max_cost_per_byte=None)) == 8500
    # a document of the same size that writers could make is read
    plain = json.dumps([{"k": i, "v": [i, i + 1]} for i in range(40000)]).encode()
    assert len(plain) > 1 << 20
    assert len(jsonio.loads(plain, what="doc")) == 40000


# ------------------------------------------------------------------------------ writing


def _deep(n: int) -> Any:
    v: Any = 1
    for _ in range(n - 1):
        v = [v]
    return {"v": v}


@pytest.mark.parametrize(
    "value",
    [_deep(65), {"n": 10**400}, {"n": -(2**1024)}, [1, {"a": [_deep(64)]}]],
    ids=["depth-65", "int-10^400", "int-minus-2^1024", "nested-depth-66"],
)
def test_a_value_readers_would_refuse_is_refused_when_it_is_stored(tmp_path: Any, value: Any) -> None:
    """R-SEC-9/R-SEC-10: ``json.dumps`` writes a value nested 65 deep or an integer that
    overflows a double, which every reader then refuses (the whole entry, after the commit).
    ``encode_value`` parses what it wrote as readers do and refuses it with
    PCK-VALUE-NOT-JSON when it is stored (mutant: it returned the payload unchecked)."""
    from portable_ckpt.errors import ValueNotJsonError
    from portable_ckpt.io.writer import ShardWriter, new_attempt_id
    from portable_ckpt.storage import open_storage

    with pytest.raises(ValueNotJsonError):
        jsonio.encode_value(value, what="v")
    w = ShardWriter(open_storage(tmp_path, create=True), new_attempt_id(1), 0)
    with pytest.raises(ValueNotJsonError) as ei:
        w.add_entry("meta", value)
    assert "readers would refuse" in ei.value.message
    ok = _deep(64)
    assert jsonio.loads(jsonio.encode_value(ok), what="v") == ok
    w.add_entry("fine", ok)


def test_the_size_limit_admits_exactly_max_bytes() -> None:
    """R-SEC-11: a document of ``max_bytes`` bytes is read, one byte more is refused before it
    is parsed (mutant: one byte more was admitted)."""
    text = b"[" + b" " * 98 + b"]"
    assert jsonio.loads(text, what="doc", max_bytes=100) == []
    assert "exceeds the limit" in _invalid(text + b" ", max_bytes=100).message
    assert "exceeds the limit" in _invalid((text + b" ").decode(), max_bytes=100).message
