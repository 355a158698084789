"""Review round 3, findings 3, 4, 6 and 8.

3: format documents (manifests, records, writer indexes, shard headers) are refused before they
   are built when their objects would cost more than ``jsonio.MAX_COST_PER_BYTE`` bytes per byte
   of text (the tree of ``[[[...]]]`` costs 44, of ``{},{},...`` 24; real documents 3-8);
4: an S3 bucket name outside S3's rules is a usage error before any request (obstore panicked
   on ``s3://b kt/x``), and a panic that still gets out of obstore is a ``StorageError``;
8: an S3 prefix that is not a relative path (``a//b``, ``..``, control characters) is a usage
   error before any request (a save used to upload an object no tool would list again);
6: odd public API arguments are ``PCK-USAGE``, never a TypeError, ValueError or AttributeError.
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import portable_ckpt
from portable_ckpt.errors import CheckpointError, JsonInvalidError, StorageError, UsageError
from portable_ckpt.format import jsonio, usage
from portable_ckpt.io.reader import ReadRequest
from portable_ckpt.io.versions import list_versions
from portable_ckpt.storage import open_storage

from ._util import expect_code, memory_bound, rechecksum

#: ``[[[...]]]`` 62 deep (64 in a manifest's list): the costliest text per byte there is (44
#: bytes of lists per byte of text).
NEST = b"[" * 62 + b"]" * 62
BOMB_ID = "s000000000009-20261203T000000000000Z-00000000000000bb"


def _nested(size: int, head: bytes = b'{"format":"portable-ckpt","x":[', tail: bytes = b"]}") -> bytes:
    unit = NEST + b","
    n = max(1, (size - len(head) - len(tail)) // len(unit))
    return head + unit * (n - 1) + NEST + tail


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "portable_ckpt.cli.main", *args],
        capture_output=True, text=True, timeout=120, env=env,
    )


# -- finding 3: a cost budget for format documents ------------------------------------------------


_JSON = st.recursive(
    st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.booleans(),
              st.none(), st.text(alphabet='ab,[]{}:"\\ \n\u00e9', max_size=6)),
    lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(
        st.text(alphabet='k,[]{}"\\:', max_size=3), c, max_size=4)), max_leaves=40)


def _walk(v: Any, level: int = 0) -> tuple[int, ...]:
    """(values, objects, empty objects, arrays, empty arrays, members, strings, depth)."""
    if isinstance(v, dict):
        parts = [_walk(x, level + 1) for x in v.values()]
        own = (1, 1, int(not v), 0, 0, len(v), len(v), level + 1)
    elif isinstance(v, list):
        parts = [_walk(x, level + 1) for x in v]
        own = (1, 0, 0, 1, int(not v), 0, 0, level + 1)
    else:
        return (1, 0, 0, 0, 0, 0, int(isinstance(v, str)), level)
    sums = tuple(sum(p[i] for p in parts) for i in range(7))
    return (*(a + b for a, b in zip(own[:7], sums, strict=True)),
            max([own[7]] + [p[7] for p in parts]))


@settings(max_examples=200, deadline=None)
@given(_JSON, st.sampled_from([None, 1, 2]), st.sampled_from([1, 2, 3, 7, 64, 1 << 20]),
       st.booleans())
def test_the_tally_counts_what_the_parse_builds(
    value: Any, indent: int | None, chunk: int, blanks: bool
) -> None:
    """Values, containers, members, strings and depth on the text equal the parsed document's,
    in any windows, with blanks inside empty containers too."""
    text = json.dumps(value, indent=indent, ensure_ascii=False)
    if blanks:
        padded = text.replace("[]", "[ \n ]").replace("{}", "{\t}")
        try:
            if json.loads(padded) == value:  # no bracket pair inside a string was touched
                text = padded
        except ValueError:  # a raw control character inside a string
            pass
    data = text.encode()
    t = jsonio.tally(data, chunk=chunk)
    got = (t.values, t.objects, t.empty_objects, t.arrays, t.empty_arrays, t.members,
           t.strings, t.depth)
    assert got == _walk(json.loads(data))
    assert t.values == jsonio.count_values(data, chunk=chunk)
    assert t.depth == jsonio.text_depth(data, chunk=chunk)


@pytest.mark.parametrize("unit", [b"{}", b"[]", b'{"a":0}', b'{"a":{}}', b"[[]]", NEST,
                                  b'"ab"', b"1000", b"1.5", b'{"a":"bc"}', b"[1,2]"])
def test_the_cost_estimate_follows_the_objects_built(unit: bytes) -> None:
    """Tally.cost is within [0.8, 1.6] of what json.loads allocates for the dense patterns."""
    data = b"[" + b",".join([unit] * 4000) + b"]"
    tracemalloc.start()
    doc = json.loads(data)
    built = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del doc
    cost = jsonio.tally(data).cost()
    assert 0.8 <= cost / built <= 1.6, (unit, built)
    assert cost <= jsonio._MOST_COST_PER_BYTE * len(data)  # what lets small texts go uncounted


def test_a_costly_document_is_refused_before_it_is_built() -> None:
    """R-SEC-19: a 4 MiB text of nested lists (about 180 MB of lists) is refused from its text."""
    doc = _nested(4 << 20)
    with memory_bound(12 * len(doc)) as peak, pytest.raises(JsonInvalidError) as ei:
        jsonio.loads(doc, what="x/manifest.json", max_bytes=jsonio.MAX_MANIFEST_BYTES)
    assert peak[0] < 12 * len(doc)
    msg = ei.value.message
    assert msg.startswith("x/manifest.json: ") and "a format document may cost" in msg
    assert "delete it" in msg and ei.value.code == "PCK-JSON-INVALID"
    # Below the floor a document is not counted at all; user values opt out (R-SEC-15 binds them).
    small = _nested(256 << 10)
    assert len(jsonio.loads(small, what="s")["x"]) > 1000
    assert jsonio.loads(doc, what="v", max_cost_per_byte=None)["format"] == "portable-ckpt"


def test_a_costly_manifest_is_an_invalid_attempt(tmp_path: Path) -> None:
    """One such manifest.json in the newest step: ls lists it invalid, open(root) restores the
    committed version (the record was refused before its objects were built)."""
    root = tmp_path / "root"
    m = portable_ckpt.save_arrays(root, {"w": np.arange(8, dtype=np.float32)}, step=3)
    (root / BOMB_ID).mkdir()
    (root / BOMB_ID / "manifest.json").write_bytes(_nested(4 << 20))
    p = _cli("ls", str(root))
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    line = next(x for x in p.stdout.splitlines() if x.startswith(BOMB_ID))
    assert "invalid" in line, p.stdout
    with memory_bound(64 << 20):
        ck = portable_ckpt.open(root)
    assert ck.path.endswith(m.attempt_id) and ck.read("w").tolist() == list(range(8))
    bomb = next(v for v in list_versions(root) if v.id == BOMB_ID)
    assert bomb.status == "invalid"


def test_a_costly_shard_header_is_refused(tmp_path: Path) -> None:
    """A shard header padded with nested lists (the 100 MB header limit allowed ~3 GB of
    objects): verify reports PCK-SHARD-HEADER, and reading does not build it."""
    root = tmp_path / "root"
    m = portable_ckpt.save_arrays(root, {"w": np.arange(4, dtype=np.float32)}, step=1)
    vdir = root / m.attempt_id
    rel = next(f for f in m.files if f.endswith(".safetensors"))
    raw = (vdir / rel).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    body = raw[8 + n :]
    head = json.dumps(header)[:-1].encode() + b',"junk":['
    new = _nested(4 << 20, head=head, tail=b"]}")
    new += b" " * (-(len(new) + 8) % 8)
    (vdir / rel).write_bytes(struct.pack("<Q", len(new)) + new + body)
    rechecksum(str(vdir), rel)
    ck = portable_ckpt.open(root)
    with memory_bound(64 << 20):
        errors = ck.verify()
    assert [e.code for e in errors] == ["PCK-SHARD-HEADER"], errors
    assert "a format document may cost" in errors[0].message
    with memory_bound(64 << 20):
        expect_code("PCK-SHARD-HEADER", ck.read, "w")


def test_documents_this_library_writes_are_far_below_the_budget(tmp_path: Path) -> None:
    """The densest documents a writer of this library produces (a shard of thousands of scalar
    tensors, its manifest) cost at most about half the budget, and read back."""
    root = tmp_path / "root"
    arrays = {f"s{i}": np.float32(i) for i in range(7000)}
    m = portable_ckpt.save_arrays(root, arrays, step=1)
    vdir = root / m.attempt_id
    docs = [(vdir / "manifest.json").read_bytes()]
    for rel in m.files:
        if rel.endswith(".safetensors"):
            raw = (vdir / rel).read_bytes()
            docs.append(raw[8 : 8 + struct.unpack("<Q", raw[:8])[0]])
    for doc in docs:
        assert len(doc) * 40 > jsonio.COST_FLOOR  # large enough to be counted
        assert jsonio.tally(doc).cost() <= 0.6 * jsonio.MAX_COST_PER_BYTE * len(doc)
    ck = portable_ckpt.open(root)
    assert ck.read("s6999").item() == 6999.0 and ck.verify() == []


def test_a_dense_entry_value_is_bound_by_its_value_count_only(tmp_path: Path) -> None:
    """A list of small objects is denser than any format document (30 bytes per byte): as an
    entry value it is bound by R-SEC-15's value count, not by the documents' cost budget."""
    value = [{"a": i % 10} for i in range(400_000)]  # 3.2 MB, 800,001 values
    root = tmp_path / "root"
    portable_ckpt.save_arrays(root, {"w": np.zeros(1, np.float32)}, step=1, entries={"e": value})
    assert portable_ckpt.open(root).entry("e") == value


# -- findings 4 and 8: S3 roots checked before any request -----------------------------------------


def _offline_env() -> dict[str, str]:
    """An S3 environment whose endpoint refuses connections: a request would be PCK-STORAGE."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PCK_S3_"))}
    env.update(AWS_ENDPOINT_URL="http://127.0.0.1:9", AWS_REGION="us-east-1",
               AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="y", PCK_S3_MAX_ATTEMPTS="1",
               AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
               RUST_BACKTRACE="0")
    return env


@pytest.fixture
def offline_s3(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith(("AWS_", "PCK_S3_")):
            monkeypatch.delenv(k)
    for k, v in _offline_env().items():
        if k.startswith(("AWS_", "PCK_S3_")):
            monkeypatch.setenv(k, v)


BAD_BUCKETS = ["s3://b kt/x", "s3://bk<t/x", "s3://bk`t/x", "s3://bk%20t/x", "s3://ab/x",
               "s3://a..b/x", "s3://-bkt/x", "s3://bkt-/x", "s3://.bkt/x", "s3://bk:t/x",
               "s3://u@bkt/x", "s3://[bkt/x", "s3://" + "b" * 256 + "/x"]
BAD_PREFIXES = ["s3://bkt1/../x", "s3://bkt1/a//b", "s3://bkt1/a/./b", "s3://bkt1/a/..",
                "s3://bkt1/.", "s3://bkt1/a\x01b", "s3://bkt1/a\tb", "s3://bkt1/a\x7fb",
                "s3://bkt1/a\\b"]


@pytest.mark.parametrize("url", BAD_BUCKETS + BAD_PREFIXES)
def test_a_malformed_s3_root_is_a_usage_error_before_any_request(
    url: str, offline_s3: None, tmp_path: Path
) -> None:
    """open_storage, open, list_versions, save_arrays and copy_version refuse it as PCK-USAGE
    (a request would have been PCK-STORAGE: the endpoint refuses connections)."""
    from portable_ckpt.io.copy import copy_version

    expect_code("PCK-USAGE", open_storage, url)
    expect_code("PCK-USAGE", portable_ckpt.open, url)
    expect_code("PCK-USAGE", list_versions, url)
    expect_code("PCK-USAGE", portable_ckpt.save_arrays, url, {"w": np.zeros(2)}, step=1)
    src = tmp_path / "src"
    portable_ckpt.save_arrays(src, {"w": np.zeros(2)}, step=1)
    expect_code("PCK-USAGE", copy_version, str(src), url)


@pytest.mark.parametrize("url", ["s3://b kt/x", "s3://bk<t/x", "s3://bkt1/a//b", "s3://bkt1/../x"])
def test_the_cli_refuses_a_malformed_s3_root_with_exit_2(url: str, tmp_path: Path) -> None:
    """Every subcommand exits 2 with one usage line: no Rust panic, no traceback."""
    env = _offline_env()
    src = tmp_path / "src"
    portable_ckpt.save_arrays(src, {"w": np.zeros(2)}, step=1)
    for argv in (["ls", url], ["inspect", url], ["verify", url], ["gc", url, "--keep", "1"],
                 ["copy", str(src), url]):
        p = _cli(*argv, env=env)
        assert p.returncode == 2, (argv, p.returncode, p.stderr)
        assert "Traceback" not in p.stderr and "panicked" not in p.stderr, p.stderr


@pytest.mark.parametrize("bucket", ["pck-0123456789ab", "rules-0123456789", "bucket", "b.k-1",
                                    "a" * 63, "My_Legacy.Bucket", "x" * 255])
def test_valid_and_legacy_bucket_names_are_accepted(bucket: str, offline_s3: None) -> None:
    """S3's rules (3-63 of a-z 0-9 . -) and its legacy us-east-1 names (A-Z and _ too, up to
    255 characters) still open; the prefix loses its outer slashes as before."""
    from portable_ckpt.storage.s3 import S3Storage

    store = open_storage(f"s3://{bucket}//runs/a/")
    assert isinstance(store, S3Storage) and store.bucket == bucket and store.prefix == "runs/a"
    expect_code("PCK-USAGE", S3Storage, bucket, "runs//a")


def test_an_obstore_panic_is_a_storage_error(offline_s3: None) -> None:
    """pyo3's PanicException is a BaseException: it becomes PCK-STORAGE naming the root;
    KeyboardInterrupt still passes."""
    from portable_ckpt.storage.s3 import S3Storage

    class PanicException(BaseException):  # pyo3_runtime.PanicException is matched by name
        pass

    store = S3Storage("bkt1", "x")

    def panic() -> None:
        raise PanicException("request valid: InvalidUri(InvalidUri(InvalidUriChar))")

    with pytest.raises(StorageError) as ei:
        store._retrying(panic)
    assert "s3://bkt1/x" in ei.value.message and "InvalidUri" in ei.value.message

    def interrupt() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store._retrying(interrupt)


def test_a_real_obstore_panic_does_not_escape(offline_s3: None) -> None:
    """A bucket name obstore cannot sign (set behind the checks' back) panics inside obstore;
    the public call raises a CheckpointError, never a BaseException."""
    pytest.importorskip("obstore")
    from portable_ckpt.storage.s3 import S3Storage

    store = S3Storage("bkt1", "x")
    store.bucket = "b kt"
    with pytest.raises(CheckpointError) as ei:
        store.root_exists()
    assert ei.value.code == "PCK-STORAGE"


# -- finding 6: public API arguments ----------------------------------------------------------------


@pytest.fixture
def ck(tmp_path: Path) -> Any:
    from portable_ckpt.io.commit import commit
    from portable_ckpt.io.writer import ShardWriter, new_attempt_id

    store = open_storage(tmp_path / "root", create=True)
    aid = new_attempt_id(1)
    idx = []
    for r in range(2):
        w = ShardWriter(store, aid, r, write_index=False)
        if r == 0:
            w.add_tensor("w", np.arange(12.0).reshape(3, 4))
        w.add_entry("e", {"r": r}, scope="per_rank", rank=r, world_size_policy="modulo")
        idx.append(w.finish())
    commit(store, aid, step=1, indexes=idx, expected_writers=[0, 1],
           continuation=portable_ckpt.Continuation("exact", 2, None))
    return portable_ckpt.open(tmp_path / "root")


@pytest.mark.parametrize("sample", [float("nan"), -1, 0, 2, 1.0000001, True, "0.5", [0.5],
                                    float("inf")])
def test_verify_refuses_a_sample_that_is_no_fraction(ck: Any, sample: object) -> None:
    expect_code("PCK-USAGE", ck.verify, sample=sample)


def test_verify_takes_fractions_and_integer_seeds(ck: Any) -> None:
    assert ck.verify(sample=0.5, seed=3) == [] and ck.verify(sample=1, seed=np.int64(3)) == []
    assert ck.verify(sample=np.float32(0.25)) == []
    for seed in (1.5, "3", True):
        expect_code("PCK-USAGE", ck.verify, sample=0.5, seed=seed)


def test_read_refuses_an_out_that_is_no_array(ck: Any) -> None:
    for out in ("x", [[0.0] * 4] * 3, 5):
        expect_code("PCK-USAGE", ck.read, "w", out=out)
    out = np.empty((3, 4))
    assert ck.read("w", out=out) is out


def test_read_many_takes_read_requests_only(ck: Any) -> None:
    expect_code("PCK-USAGE", ck.read_many, [("w", None, None)])
    expect_code("PCK-USAGE", ck.read_many, [{"key": "w"}])
    expect_code("PCK-USAGE", ck.read_many, ReadRequest("w"))
    expect_code("PCK-USAGE", ck.read_many, "w")
    expect_code("PCK-USAGE", ck.read_many, 5)
    # An iterator is read once (it used to be consumed by planning: nothing came back).
    got = ck.read_many(iter([ReadRequest("w", [1, 0], [1, 4])]))
    assert len(got) == 1 and got[0].tolist() == [[4.0, 5.0, 6.0, 7.0]]


@pytest.mark.parametrize("kw", [{"rank": "1"}, {"rank": True}, {"rank": 1.5}, {"rank": -1},
                                {"rank": 1, "world_size": 0}, {"rank": 1, "world_size": True},
                                {"rank": 1, "world_size": "2"}, {"rank": None, "world_size": 2}])
def test_entry_takes_integer_ranks_only(ck: Any, kw: dict[str, Any]) -> None:
    expect_code("PCK-USAGE", ck.entry, "e", **kw)


def test_entry_with_integer_ranks(ck: Any) -> None:
    assert ck.entry("e", rank=1, world_size=2) == {"r": 1}
    assert ck.entry("e", rank=np.int64(1)) == {"r": 1}
    assert ck.entry("e", rank=3, world_size=4) == {"r": 1}  # modulo


def test_argument_checks_for_other_entry_points() -> None:
    """The checks other modules use (gc keep_ids, save_arrays continuation and arrays)."""
    assert usage.strict_int(np.int64(3), "n", minimum=1) == 3
    for bad in (True, 1.5, "3", None):
        with pytest.raises(UsageError, match="must be an integer"):
            usage.strict_int(bad, "n")
    with pytest.raises(UsageError, match=">= 1"):
        usage.strict_int(0, "n", minimum=1)
    assert usage.fraction(1, "f") == 1.0
    assert math.isclose(usage.fraction(np.float64(0.3), "f"), 0.3)
    assert usage.name_collection(["a", "b"], "keep_ids") == frozenset({"a", "b"})
    assert usage.name_collection((), "keep_ids") == frozenset()
    for bad in (5, "abc", b"ab", [1], None):
        with pytest.raises(UsageError, match="keep_ids"):
            usage.name_collection(bad, "keep_ids")
    assert usage.continuation_or_none(None, "c") is None
    cont = portable_ckpt.Continuation("exact", 1, None)
    assert usage.continuation_or_none(cont, "c") is cont
    for bad in (5, {"contract": "exact"}):
        with pytest.raises(UsageError, match="Continuation"):
            usage.continuation_or_none(bad, "c")
    usage.plain_array(np.zeros(2), "w")
    with pytest.raises(UsageError, match="masked array"):
        usage.plain_array(np.ma.masked_array([1.0, 2.0], mask=[0, 1]), "save_arrays: 'w'")


def test_a_masked_array_is_refused_where_arrays_enter_the_writer(tmp_path: Path) -> None:
    """save_arrays, a tiled save and the writer itself: PCK-USAGE naming the tensor, no version
    (before, the writer's byte view failed with a bare ValueError)."""
    masked = np.ma.masked_array(np.arange(16.0).reshape(4, 4), mask=np.eye(4))
    with pytest.raises(UsageError, match=r"tensor 'w'.*masked array"):
        portable_ckpt.save_arrays(tmp_path / "a", {"w": masked}, step=1)
    with pytest.raises(UsageError, match=r"tensor 'w'.*masked array"):
        portable_ckpt.save_arrays(tmp_path / "b", {"w": masked}, step=1, tiles={"w": [2, 2]})
    assert not portable_ckpt.list_versions(tmp_path / "a")
