"""format/vocab.py: the fixed value sets are the schemas' (the authority), defined once in code."""

from __future__ import annotations

import json
import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from portable_ckpt.format import vocab
from portable_ckpt.io.tensor_table import TensorTable

COMMON = json.loads(
    (Path(__file__).resolve().parents[2] / "spec" / "schemas" / "common.schema.json").read_text()
)["$defs"]


def test_value_sets_are_the_schemas() -> None:
    entry = COMMON["entry"]["properties"]
    assert list(vocab.CODECS) == COMMON["range"]["properties"]["codec"]["enum"]
    assert list(vocab.CONTRACTS) == COMMON["contract"]["enum"]
    assert list(vocab.SCOPES) == entry["scope"]["enum"]
    assert list(vocab.POLICIES) == entry["world_size_policy"]["enum"]
    assert list(vocab.ENCODINGS) == entry["encoding"]["enum"]


def test_codec_codes_are_the_table_codes() -> None:
    """A tensor table stores a codec as its position in CODECS (spec §8.5): the order is format."""
    assert vocab.CODEC_CODES == {"none": 0, "zstd": 1}
    from portable_ckpt.format.manifest import RangeRecord, TensorEntry

    ranges = [
        RangeRecord((i,), (1,), f"data/w{i}.safetensors", f"t@{i}", codec)
        for i, codec in enumerate(vocab.CODECS)
    ]
    table = TensorTable.from_entries([TensorEntry("t", "float32", (2,), ranges)])
    assert table.codec.tolist() == [0, 1]
    assert [r.codec for r in dict(table.entries())["t"].ranges] == list(vocab.CODECS)


_SCHEMA_NAME = re.compile(COMMON["entryName"]["pattern"])
names = st.text(alphabet="ab9._/-~ ", min_size=0, max_size=12) | st.text(
    alphabet="a/", min_size=250, max_size=260
)


@given(names)
def test_entry_name_rule_is_the_schemas(name: str) -> None:
    schema_ok = len(name) <= COMMON["entryName"]["maxLength"] and bool(_SCHEMA_NAME.match(name))
    assert vocab.is_entry_name(name) == schema_ok
