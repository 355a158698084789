"""Mutation audit 30 (conversion layer), the symbolic pickle reader's refusals.

``.metadata`` and ``data.pkl`` are read by :mod:`portable_ckpt.convert._pickle_scan`, which never
imports nor calls: a global outside the caller's allow-list is refused where the pickle names it,
whatever opcode names it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from portable_ckpt.convert._dcp_meta import METADATA_GLOBALS, parse_dcp_metadata
from portable_ckpt.convert._pickle_scan import (
    Call,
    Global,
    PickleGlobalError,
    PickleScanError,
    scan_pickle,
)
from portable_ckpt.errors import CheckpointError

#: ``posix.system('touch x')`` spelled with the protocol 0 ``INST`` opcode (``MARK``, the
#: arguments, ``INST module\nname\n``), which no Python 3 pickler writes: a hand-made file.
_INST = b"(S'touch x'\niposix\nsystem\n."


def test_a_global_named_by_inst_is_held_to_the_allow_list(tmp_path: Path) -> None:
    """``INST`` names its class as ``GLOBAL`` does; the allow-list applies to it (mutant P04
    built the record unchecked, and a .metadata of it was a damaged file, PCK-SHARD-HEADER,
    not the refused global, PCK-UNSUPPORTED-VALUE naming it)."""
    out = scan_pickle(_INST)  # without an allow-list: a record, never a call
    assert isinstance(out, Call) and out.func == Global("posix", "system")
    assert out.args == ("touch x",)
    with pytest.raises(PickleGlobalError) as ei:
        scan_pickle(_INST, allowed_globals=METADATA_GLOBALS)
    assert ei.value.qualname == "posix.system"
    meta = str(tmp_path / ".metadata")
    with pytest.raises(CheckpointError) as ce:
        parse_dcp_metadata(_INST, path=meta)
    assert ce.value.code == "PCK-UNSUPPORTED-VALUE"
    assert "posix.system" in str(ce.value) and meta in str(ce.value)


def test_the_op_limit_counts_every_opcode_once() -> None:
    """``max_ops`` bounds the opcodes interpreted, ``PROTO`` and ``STOP`` included: a pickle of
    exactly that many scans, one more is refused (mutant P12 allowed one opcode more)."""
    data = b"\x80\x02K\x01."  # PROTO, BININT1, STOP: three opcodes
    assert scan_pickle(data, max_ops=3) == 1
    with pytest.raises(PickleScanError, match="too long"):
        scan_pickle(data, max_ops=2)


def test_a_memoized_mark_is_refused_where_it_is_memoized() -> None:
    """``MEMOIZE`` of a ``MARK`` (no pickler writes one) is refused: fetched back with ``BINGET``
    the sentinel would stand on the stack without its position recorded, and ``APPENDS`` put
    it into the value (mutant P13 returned a list holding the scanner's own MARK object)."""
    data = b"\x80\x04(\x940](h\x00e."  # MARK MEMOIZE POP EMPTY_LIST MARK BINGET 0 APPENDS STOP
    with pytest.raises(PickleScanError, match="MEMOIZE of a MARK"):
        scan_pickle(data)


def test_reduce_needs_a_tuple_of_arguments() -> None:
    """``REDUCE`` calls ``func(*args)`` only with a tuple (the real unpickler raises
    otherwise): a list there is refused, not a call record that consumers read as one
    (mutant P14 built it)."""
    assert isinstance(scan_pickle(b"\x80\x02cbuiltins\nlen\n)R."), Call)
    with pytest.raises(PickleScanError, match="not a tuple"):
        scan_pickle(b"\x80\x02cbuiltins\nlen\n]R.")


def test_only_a_one_argument_call_stands_for_its_argument() -> None:
    """``unwrap_calls`` replaces ``torch.Size(t)`` by ``t``; a call with more arguments stays a
    record, which the metadata reader refuses by name (mutant P15 kept the first argument and
    dropped the rest)."""
    one = b"\x80\x02ctorch\nSize\nK\x02K\x03\x86\x85R."  # torch.Size((2, 3))
    two = b"\x80\x02ctorch\nSize\nK\x02K\x03\x86K\x07\x86R."  # torch.Size((2, 3), 7)
    assert scan_pickle(one, unwrap_calls=("torch.Size",)) == (2, 3)
    out = scan_pickle(two, unwrap_calls=("torch.Size",))
    assert isinstance(out, Call) and out.func == Global("torch", "Size")
    assert out.args == ((2, 3), 7)


def _nested_tuple_key(depth: int) -> bytes:
    """``{(((),),...): 1}`` with the empty tuple ``depth`` levels down, protocol 2."""
    return b"\x80\x02})" + b"\x85" * depth + b"K\x01s."


def test_a_dict_key_nests_at_most_the_key_depth_limit() -> None:
    """Hashing a tuple key recurses once per level: a key nested ``_MAX_KEY_DEPTH`` levels is
    scanned, one level more is refused (mutant P21 allowed twice as deep)."""
    from portable_ckpt.convert._pickle_scan import _MAX_KEY_DEPTH, OpaqueKey

    out = scan_pickle(_nested_tuple_key(_MAX_KEY_DEPTH))
    (key,) = out
    assert isinstance(key, OpaqueKey) and out[key] == 1
    with pytest.raises(PickleScanError, match="nested too deeply"):
        scan_pickle(_nested_tuple_key(_MAX_KEY_DEPTH + 1))


def test_an_int_dict_key_is_bounded_by_its_bits() -> None:
    """Hashing an int key reads every digit: a key of up to ``_MAX_KEY_NODES`` 64-bit nodes is
    scanned, one bit more is refused (mutant P20 allowed twice as many)."""
    import pickle

    from portable_ckpt.convert._pickle_scan import _MAX_KEY_NODES

    most = (1 << (_MAX_KEY_NODES * 64 - 1)) - 1  # 1 + bits // 64 == _MAX_KEY_NODES
    assert len(scan_pickle(pickle.dumps({most: 1}, protocol=2))) == 1
    with pytest.raises(PickleScanError, match="integer dict key"):
        scan_pickle(pickle.dumps({most + 1: 1}, protocol=2))


def test_protocol_0_bools_scan_as_bools() -> None:
    """Protocols 0 and 1 write ``True``/``False`` as ``INT`` with the arguments ``01``/``00``;
    they scan as bools, not as the ints 1 and 0 (equal to them, so a value comparison misses
    it: mutant P33 turned a JSON ``true`` into ``1``)."""
    import pickle

    for protocol in (0, 1):
        out = scan_pickle(pickle.dumps([True, False, 1], protocol=protocol))
        assert [type(v) for v in out] == [bool, bool, int]


@pytest.mark.parametrize(
    ("data", "says"),
    [
        # NEWOBJ_EX of a list and a dict (mutant P38 built the record)
        (b"\x80\x04\x8c\x08builtins\x8c\x06object\x93]}\x92.", "NEWOBJ_EX arguments"),
        # BUILD on a list (mutant P39 dropped the state and went on)
        (b"\x80\x02]}b.", "BUILD on a non-object"),
    ],
    ids=["newobj-ex-of-a-list", "build-on-a-list"],
)
def test_object_opcodes_on_the_wrong_operands_are_refused(data: bytes, says: str) -> None:
    with pytest.raises(PickleScanError, match=says):
        scan_pickle(data)
