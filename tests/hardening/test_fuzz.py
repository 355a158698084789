"""Fuzzing of every parser of untrusted bytes (short CI run; bench/fuzz_long.py is the long run).

Invariant for every input: only ``CheckpointError`` subclasses escape, each input finishes within
``PER_INPUT_SECONDS``, and the traced heap peak stays under ``PEAK_BYTES`` (or the target's bound
in ``_fuzz_targets.PEAK_BYTES_OF``); readers of zstd ranges return what a reference decoder makes
of the frame, or refuse it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from portable_ckpt.errors import CheckpointError
from portable_ckpt.format import jsonio
from portable_ckpt.format.manifest import parse_manifest, parse_writer_index
from tests.hardening import _mutate
from tests.hardening._fuzz_targets import PEAK_BYTES_OF, TARGETS, Corpus, reference_decode
from tests.hardening._util import (
    PEAK_BYTES,
    cpu_bound,
    exercise_version,
    load_header_file,
    make_version,
    memory_bound,
    only_checkpoint_errors,
    time_bound,
)

FUZZ = settings(
    max_examples=int(os.environ.get("PCK_FUZZ_EXAMPLES", "250")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=os.environ.get("PCK_FUZZ_RANDOM") is None,
)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("pristine")
    a1 = make_version(str(root), 1, codec="none")
    a2 = make_version(str(root), 2, codec="zstd")
    docs = {}
    for a in (a1, a2):
        docs[a] = {
            "manifest": json.loads((root / a / "manifest.json").read_bytes()),
            "index": json.loads((root / a / "index" / "w00000.json").read_bytes()),
            "shard": (root / a / "data" / "w00000-0000.safetensors").read_bytes(),
        }
    return {"root": str(root), "attempts": [a1, a2], "docs": docs}


def _check(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    with time_bound(), memory_bound():
        return only_checkpoint_errors(fn, *args, **kwargs)


@FUZZ
@given(data=st.one_of(st.binary(max_size=2000), st.text(max_size=500).map(lambda s: s.encode("utf-8", "surrogatepass"))))
def test_fuzz_jsonio_random_bytes(data: bytes) -> None:
    _check(jsonio.loads, data, what="fuzz")


@FUZZ
@given(rnd=st.randoms(use_true_random=False))
def test_fuzz_jsonio_mutated_documents(pristine: dict, rnd: random.Random) -> None:  # type: ignore[type-arg]
    a = rnd.choice(pristine["attempts"])
    doc = pristine["docs"][a][rnd.choice(["manifest", "index"])]
    _check(jsonio.loads, _mutate.mutate_text_doc(doc, rnd), what="fuzz")


def _parse_manifest_bytes(data: bytes, directory: str) -> None:
    parse_manifest(jsonio.loads(data, what="m", max_bytes=jsonio.MAX_MANIFEST_BYTES), directory_name=directory)


@FUZZ
@given(rnd=st.randoms(use_true_random=False))
def test_fuzz_parse_manifest(pristine: dict, rnd: random.Random) -> None:  # type: ignore[type-arg]
    a = rnd.choice(pristine["attempts"])
    doc = pristine["docs"][a]["manifest"]
    _check(_parse_manifest_bytes, _mutate.mutate_text_doc(doc, rnd), a)
    _check(parse_manifest, _mutate.mutate_json(doc, rnd, n=rnd.randint(1, 6)), directory_name=a)


@FUZZ
@given(rnd=st.randoms(use_true_random=False))
def test_fuzz_parse_writer_index(pristine: dict, rnd: random.Random) -> None:  # type: ignore[type-arg]
    a = rnd.choice(pristine["attempts"])
    doc = pristine["docs"][a]["index"]
    _check(lambda d: parse_writer_index(jsonio.loads(d, what="i")), _mutate.mutate_text_doc(doc, rnd))
    _check(parse_writer_index, _mutate.mutate_json(doc, rnd, n=rnd.randint(1, 6)))


@FUZZ
@given(rnd=st.randoms(use_true_random=False))
def test_fuzz_safetensors_header(pristine: dict, rnd: random.Random, tmp_path_factory: pytest.TempPathFactory) -> None:  # type: ignore[type-arg]
    a = rnd.choice(pristine["attempts"])
    data = _mutate.mutate_safetensors(pristine["docs"][a]["shard"], rnd)
    d = tmp_path_factory.mktemp("st")
    (d / "x.safetensors").write_bytes(data)
    # The recorded size is what the reader trusts (already checked against storage): use the real
    # one, and sometimes a lying one (the check against storage happens before in the reader).
    size = len(data) if rnd.random() < 0.8 else rnd.choice([0, 7, 8, len(data) + 1, 2**62])
    err = _check(load_header_file, str(d / "x.safetensors"), size)
    if err is not None:
        assert err.code in {"PCK-SHARD-HEADER", "PCK-FILE-SIZE"}, err


@FUZZ
@given(rnd=st.randoms(use_true_random=False))
def test_fuzz_open_read_verify_mutated_checkpoint(pristine: dict, rnd: random.Random, tmp_path_factory: pytest.TempPathFactory) -> None:  # type: ignore[type-arg]
    base = tmp_path_factory.mktemp("mut")
    root = base / "root"
    outside = base / "outside"
    outside.mkdir()
    (outside / "secret.bin").write_bytes(b"SECRET" * 100)
    a = rnd.choice(pristine["attempts"])
    shutil.copytree(os.path.join(pristine["root"], a), root / a, symlinks=True)
    _mutate.mutate_version(str(root / a), rnd, str(outside))
    with time_bound(), memory_bound():
        try:
            exercise_version(str(root), a)
        except CheckpointError:  # pragma: no cover - exercise_version collects them
            raise AssertionError("unreachable") from None
    shutil.rmtree(base, ignore_errors=True)


def test_header_length_field_values(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The length prefix is checked before anything is read or allocated."""
    hdr = b'{"t":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}'
    body = hdr + b"    " + b"\x00" * 4
    for n in _mutate.HEADER_LENGTHS:
        (tmp_path / "f").write_bytes(struct.pack("<Q", n) + body)
        err = _check(load_header_file, str(tmp_path / "f"), 8 + len(body))
        if n in (0, 1, 7):
            assert err is not None and err.code == "PCK-SHARD-HEADER"
        else:
            assert err is not None and err.code == "PCK-SHARD-HEADER" and str(n) in err.message


# -- the surfaces of issue 12 (targets shared with bench/fuzz_long.py) ---------------------------
NEW_SURFACES = settings(FUZZ, max_examples=max(1, FUZZ.max_examples // 6))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return Corpus(str(tmp_path_factory.mktemp("corpus")))


@pytest.mark.parametrize("name", list(TARGETS))
@NEW_SURFACES
@given(rnd=st.randoms(use_true_random=False))
def test_fuzz_issue12_surfaces(corpus: Corpus, name: str, rnd: random.Random) -> None:
    """Commit of fuzzed indexes and tables, tables, zstd entries and ranges (reader against a
    reference decoder: never other bytes), embedded schemas, conversion sources: only
    CheckpointError, <= 5 s of CPU (60 s wall), heap within the target's bound (64 MiB; zstd
    entries 2^27 + 16 MiB)."""
    with time_bound(60), cpu_bound(), memory_bound(PEAK_BYTES_OF.get(name, PEAK_BYTES)):
        only_checkpoint_errors(TARGETS[name], rnd, corpus)


@pytest.mark.parametrize(
    ("frame", "ok"),
    [
        (b"good", True),
        (b"two", False),
        (b"skip", False),
        (b"trail", False),
        (b"short", False),
        (b"size", False),
    ],
)
def test_reference_decoder_follows_r_tensor_7(frame: bytes, ok: bool) -> None:
    """The fuzz oracle itself: one frame, no skippable frame, no trailing bytes, exact size."""
    import zstandard

    raw = bytes(range(200)) * 3
    c = zstandard.ZstdCompressor(write_content_size=True)
    data = {
        b"good": c.compress(raw),
        b"two": c.compress(raw[:100]) + c.compress(raw[100:]),
        b"skip": struct.pack("<II", 0x184D2A50, 3) + b"abc" + c.compress(raw),
        b"trail": c.compress(raw) + b"\0",
        b"short": zstandard.ZstdCompressor(write_content_size=False).compress(raw[:-1]),
        b"size": c.compress(raw + b"x"),
    }[frame]
    assert (reference_decode(data, len(raw)) == raw) is ok
