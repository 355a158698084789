"""Mutation audit 30 (conversion layer), the safetensors header checks of an HF source.

Files are written byte by byte (an 8-byte header length, the JSON header, the data), so that
each test holds exactly one fault; unedited, each converts.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.convert import convert
from portable_ckpt.errors import CheckpointError


def _st(path: Path, header: dict[str, Any], data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


_W = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
_DATA = np.array([1.5, -2.0], np.float32).tobytes()


def test_the_hand_made_file_converts(tmp_path: Path) -> None:
    src = _st(tmp_path / "model.safetensors", {"w": _W, "__metadata__": {"format": "pt"}}, _DATA)
    convert(str(src), str(tmp_path / "root"))
    assert portable_ckpt.open(str(tmp_path / "root")).read("w").tolist() == [1.5, -2.0]


@pytest.mark.parametrize(
    ("header", "data", "code", "says"),
    [
        # __metadata__ maps strings to strings (mutant S02 took an int value)
        ({"w": _W, "__metadata__": {"format": 1}}, _DATA, "PCK-SHARD-HEADER", "__metadata__"),
        # two data offsets, not three (mutant S03 read the first two)
        ({"w": {**_W, "data_offsets": [0, 8, 8]}}, _DATA, "PCK-SHARD-HEADER", "malformed"),
        # the last byte missing: a truncated file (mutant S05 converted up to the read error)
        ({"w": _W}, _DATA[:-1], "PCK-FILE-SIZE", "truncated"),
        # 65 dimensions, one over the format's limit (mutant S06 passed it on)
        (
            {"w": {"dtype": "F32", "shape": [1] * 65, "data_offsets": [0, 4]}},
            _DATA[:4],
            "PCK-LIMIT",
            "65 dimensions",
        ),
        # dimensions are counts, and a bool is none (mutant S09 read true as 1)
        (
            {"w": {"dtype": "F32", "shape": [True, 2], "data_offsets": [0, 8]}},
            _DATA,
            "PCK-SHARD-HEADER",
            "malformed",
        ),
    ],
    ids=["metadata-value-int", "three-offsets", "one-byte-short", "rank-65", "bool-dim"],
)
def test_a_header_fault_is_refused_naming_it(
    tmp_path: Path, header: dict[str, Any], data: bytes, code: str, says: str
) -> None:
    src = _st(tmp_path / "model.safetensors", header, data)
    with pytest.raises(CheckpointError) as ei:
        convert(str(src), str(tmp_path / "root"))
    assert ei.value.code == code and says in str(ei.value), str(ei.value)
    assert not (tmp_path / "root").exists()


def test_a_file_cut_inside_its_header_is_truncated_not_garbled(tmp_path: Path) -> None:
    """A header length the file's bytes after the 8-byte prefix cannot hold is a truncated
    file (PCK-FILE-SIZE), not a header of bad JSON (mutant S01 compared it with the whole
    file's size and read a short header)."""
    full = _st(tmp_path / "full.safetensors", {"w": _W}, _DATA).read_bytes()
    n = struct.unpack("<Q", full[:8])[0]
    src = tmp_path / "model.safetensors"
    src.write_bytes(full[: 8 + n - 4])  # four header bytes missing; size - 8 < n <= size
    with pytest.raises(CheckpointError) as ei:
        convert(str(src), str(tmp_path / "root"))
    assert ei.value.code == "PCK-FILE-SIZE" and "truncated" in str(ei.value)


def test_a_weight_map_naming_a_shard_by_a_number_is_invalid(tmp_path: Path) -> None:
    """An index's ``weight_map`` maps tensor names to file names; a number there is an invalid
    index (PCK-JSON-INVALID naming it), not an internal error (mutant H11)."""
    src = tmp_path / "src"
    src.mkdir()
    _st(src / "model.safetensors", {"w": _W}, _DATA)
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": 1}}))
    with pytest.raises(CheckpointError) as ei:
        convert(str(src), str(tmp_path / "root"))
    assert ei.value.code == "PCK-JSON-INVALID" and "weight_map" in str(ei.value)


def test_an_export_lays_tensors_out_aligned_after_a_padded_header(tmp_path: Path) -> None:
    """As the safetensors library writes: the header padded to a multiple of 8, tensors of the
    largest alignment first, so every tensor starts at a multiple of its item size (mutant S07
    left the header unpadded, S08 put the 3-byte int8 tensor first)."""
    data = np.arange(3, dtype=np.int8).tobytes() + _DATA
    src = _st(
        tmp_path / "model.safetensors",
        {
            "a": {"dtype": "I8", "shape": [3], "data_offsets": [0, 3]},
            "w": {"dtype": "F32", "shape": [2], "data_offsets": [3, 11]},
        },
        data,
    )
    convert(str(src), str(tmp_path / "root"))
    convert(str(tmp_path / "root"), str(tmp_path / "hf"), dst_format="hf")
    raw = (tmp_path / "hf" / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    assert n % 8 == 0
    header = json.loads(raw[8 : 8 + n])
    assert header["w"]["data_offsets"][0] % 4 == 0
    assert [k for k in header if k != "__metadata__"] == ["w", "a"]


def test_an_empty_tensor_converts_with_its_shape(tmp_path: Path) -> None:
    """A tensor of no elements converts with its shape and dtype and no chunk to read."""
    src = _st(
        tmp_path / "model.safetensors",
        {
            "e": {"dtype": "BF16", "shape": [0, 3], "data_offsets": [0, 0]},
            "w": {**_W, "data_offsets": [0, 8]},
        },
        _DATA,
    )
    convert(str(src), str(tmp_path / "root"))
    ck = portable_ckpt.open(str(tmp_path / "root"))
    assert ck.tensors["e"].shape == (0, 3) and ck.tensors["e"].dtype == "bfloat16"
    assert ck.read("e").shape == (0, 3) and ck.read("w").tolist() == [1.5, -2.0]


def _portable(tmp_path: Path, arrays: dict[str, Any]) -> Path:
    root = tmp_path / "root"
    portable_ckpt.save_arrays(str(root), arrays, step=1)
    return root


def test_an_export_cast_changes_float_tensors_only(tmp_path: Path) -> None:
    """``dtype=`` casts the floating tensors of an export; integer tensors keep their dtype
    (mutant V02 cast the int64 tensor to bfloat16 too)."""
    root = _portable(tmp_path, {"w": np.ones(2, np.float32), "n": np.arange(3, dtype=np.int64)})
    convert(str(root), str(tmp_path / "hf"), dst_format="hf", dtype="bfloat16")
    raw = (tmp_path / "hf" / "model.safetensors").read_bytes()
    header = json.loads(raw[8 : 8 + struct.unpack("<Q", raw[:8])[0]])
    assert header["w"]["dtype"] == "BF16" and header["n"]["dtype"] == "I64"


def test_two_keys_that_strip_to_one_name_are_a_usage_error(tmp_path: Path) -> None:
    """``strip_prefix`` that makes two keys one name is refused naming both (mutant V04 let the
    second overwrite the first)."""
    root = _portable(tmp_path, {"model.w": np.ones(2, np.float32), "w": np.zeros(2, np.float32)})
    with pytest.raises(CheckpointError) as ei:
        convert(str(root), str(tmp_path / "hf"), dst_format="hf", strip_prefix="model.")
    assert ei.value.code == "PCK-USAGE" and "model.w" in str(ei.value)
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize(
    ("fmt", "patterns"),
    [("torch", ["nope*"]), ("hf", ["W"])],
    ids=["torch-target-nothing-selected", "patterns-are-case-sensitive"],
)
def test_a_select_that_matches_no_key_is_a_usage_error(
    tmp_path: Path, fmt: str, patterns: list[str]
) -> None:
    """``select`` patterns match keys case-sensitively, and patterns that match no key are a
    usage error before anything is written, whatever the target (mutant V05 wrote an empty
    torch.save file; V06 matched ``W`` to ``w``)."""
    if fmt == "torch":
        pytest.importorskip("torch")
    root = _portable(tmp_path, {"w": np.ones(2, np.float32)})
    dst = tmp_path / ("out.pt" if fmt == "torch" else "hf")
    with pytest.raises(CheckpointError) as ei:
        convert(str(root), str(dst), dst_format=fmt, select=patterns)
    assert ei.value.code == "PCK-USAGE" and patterns[0] in str(ei.value)
    assert not dst.exists()


def test_a_torch_export_of_an_hf_source_holds_its_tensors_only(tmp_path: Path) -> None:
    """The safetensors ``__metadata__`` an HF source leaves describes its files: a mapped torch
    export does not write it into the state, which ``load_state_dict`` would refuse as an
    unexpected key (mutant E03 wrote it)."""
    torch = pytest.importorskip("torch")
    src = _st(tmp_path / "model.safetensors", {"w": _W, "__metadata__": {"format": "pt"}}, _DATA)
    convert(str(src), str(tmp_path / "root"))
    convert(str(tmp_path / "root"), str(tmp_path / "out.pt"), dst_format="torch")
    state = torch.load(tmp_path / "out.pt", weights_only=True)
    assert list(state) == ["w"] and state["w"].tolist() == [1.5, -2.0]


def test_a_dcp_export_lists_a_tensor_of_no_elements(tmp_path: Path) -> None:
    """A tensor of no elements is written to DCP as one empty chunk, so that ``.metadata``
    gives its shape (mutant E01 wrote no chunk, and the tensor was missing from it)."""
    pytest.importorskip("torch")
    from portable_ckpt.convert._dcp_meta import DcpTensor, read_dcp_metadata

    root = _portable(tmp_path, {"e": np.zeros((0, 3), np.float32), "w": np.ones(2, np.float32)})
    convert(str(root), str(tmp_path / "dcp"), dst_format="dcp", keys="verbatim")
    md = read_dcp_metadata(str(tmp_path / "dcp" / ".metadata"))
    e = md.state_dict_metadata["e"]
    assert isinstance(e, DcpTensor) and e.size == (0, 3) and e.dtype == "float32"
