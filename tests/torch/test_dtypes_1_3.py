"""Format 1.3's dtypes (spec §7): complex64, float8_e8m0fnu, float8_e4m3fnuz, float8_e5m2fnuz.

A torchtitan-style Llama keeps its rotary table ``freqs_cis`` as a persistent complex64 buffer
(its seed checkpoints need it): its state dict could not be saved at all (``PCK-UNSUPPORTED-
VALUE``), and HF, DCP and torch.save sources with these dtypes were refused by conversion.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import portable_ckpt  # noqa: E402
import portable_ckpt.torch as pckt  # noqa: E402
from portable_ckpt.convert import convert  # noqa: E402
from portable_ckpt.errors import CheckpointError, UsageError  # noqa: E402
from portable_ckpt.torch._tensors import as_bits  # noqa: E402

ROWS_1_3 = {
    torch.complex64: "dtype-complex64",
    torch.float8_e8m0fnu: "dtype-float8-e8m0fnu",
    torch.float8_e4m3fnuz: "dtype-float8-e4m3fnuz",
    torch.float8_e5m2fnuz: "dtype-float8-e5m2fnuz",
}


def _same(a: Any, b: Any) -> bool:
    """Bitwise equality of two tensors (NaN payloads, -0.0), of any dtype."""
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(as_bits(a),
                                                                            as_bits(b)))


def _manifest(root: Path) -> dict[str, Any]:
    (version,) = [p for p in root.iterdir() if p.name.startswith("s")]
    doc: dict[str, Any] = json.loads((version / "manifest.json").read_bytes())
    return doc


class _Llama(torch.nn.Module):
    """The parts of a torchtitan Llama that matter here: a persistent complex64 rope table."""

    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = torch.nn.Embedding(32, 8)
        freqs = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
        angles = torch.outer(torch.arange(16).float(), freqs)
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles),
                             persistent=True)
        self.output = torch.nn.Linear(8, 32)

    def forward(self, x: Any) -> Any:
        h = self.tok_embeddings(x)
        rot = torch.view_as_real(torch.view_as_complex(h.reshape(*h.shape[:-1], 4, 2))
                                 * self.freqs_cis[: x.shape[-1]]).flatten(-2)
        return self.output(rot)


def test_a_torchtitan_llama_with_its_complex_rope_table_saves_and_resumes(tmp_path: Path) -> None:
    """The complex64 buffer is saved as format 1.3 (its extension listed), restored bit for bit
    with the weights and AdamW's moments, and the version verifies deep."""
    torch.manual_seed(0)
    model = _Llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randint(0, 32, (2, 16))).sum().backward()
    opt.step()
    pckt.save({"model": model, "optim": opt}, tmp_path, step=7, continuation="statistical")
    doc = _manifest(tmp_path)
    assert doc["format_version"] == "1.3" and doc["must_understand"] == ["dtype-complex64"]
    assert doc["tensors"]["model/freqs_cis"]["dtype"] == "complex64"

    fresh = _Llama()
    with torch.no_grad():
        fresh.freqs_cis.zero_()
        for p in fresh.parameters():
            p.zero_()
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    info = pckt.load({"model": fresh, "optim": fresh_opt}, tmp_path)
    assert info.step == 7
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert _same(a, b), name
    for p, q in zip(model.parameters(), fresh.parameters(), strict=True):
        for k in ("exp_avg", "exp_avg_sq"):
            assert _same(opt.state[p][k], fresh_opt.state[q][k]), k
    ck = portable_ckpt.open(tmp_path)
    assert ck.verify(deep=True) == []


@pytest.mark.parametrize("tensor_table", [False, True], ids=["json", "table"])
def test_mx_scales_and_fnuz_float8_round_trip(tmp_path: Path, tensor_table: bool) -> None:
    """Every row of 1.3, with a NaN and the extremes of each float8 type, in JSON tensors and in
    a tensor table: the bits come back; the manifest lists exactly the extensions it uses."""
    e8m0 = torch.tensor([0, 1, 127, 128, 254, 255], dtype=torch.uint8).view(torch.float8_e8m0fnu)
    bits = torch.tensor([0x00, 0x01, 0x7F, 0x80, 0xFF, 0x3C], dtype=torch.uint8)
    state = {
        "scales": e8m0,
        "w_e4": bits.view(torch.float8_e4m3fnuz),
        "w_e5": bits.view(torch.float8_e5m2fnuz),
        "z": torch.complex(torch.tensor([1.0, -0.0, float("nan")]), torch.tensor([0.5, 2.0, -1.0])),
        "plain": torch.arange(3.0),
    }
    pckt.save(state, tmp_path, step=1, continuation="statistical", tensor_table=tensor_table)
    doc = _manifest(tmp_path)
    assert doc["format_version"] == "1.3"
    assert doc["must_understand"] == sorted(
        [*ROWS_1_3.values()] + (["tensor-table"] if tensor_table else []))
    out = {k: torch.zeros_like(v) if not v.dtype.is_floating_point or v.element_size() > 1
           else torch.empty_like(v) for k, v in state.items()}
    pckt.load(out, tmp_path)
    for k, v in state.items():
        assert _same(v, out[k]), k


def test_a_state_without_them_stays_format_1_0(tmp_path: Path) -> None:
    """R-VERSION-2: only a version that holds a dtype of 1.3 is 1.3; older readers keep
    reading every other version."""
    pckt.save({"w": torch.ones(2)}, tmp_path, step=1, continuation="statistical")
    doc = _manifest(tmp_path)
    assert (doc["format_version"], doc["must_understand"]) == ("1.0", [])


@pytest.mark.parametrize(("stored", "target"), [(torch.complex64, torch.float32),
                                                (torch.float32, torch.complex64)])
def test_complex_and_real_do_not_cast_into_each_other(tmp_path: Path, stored: Any,
                                                      target: Any) -> None:
    """torch drops the imaginary part with a warning: a load that would do it is refused,
    naming the tensor and the fix, before any target is written."""
    pckt.save({"a": torch.ones(2), "z": torch.ones(3, dtype=stored)}, tmp_path, step=1,
              continuation="statistical")
    out = {"a": torch.zeros(2), "z": torch.zeros(3, dtype=target)}
    with pytest.raises(UsageError, match=r"tensor 'z'.*complex and real dtypes do not cast"):
        pckt.load(out, tmp_path)
    assert not out["a"].any() and not out["z"].any()


@pytest.mark.parametrize("stored", [torch.complex64, torch.float32])
@pytest.mark.parametrize("through", ["load", "dcp"])
def test_a_target_of_a_dtype_outside_the_table_is_refused_as_a_load(
    tmp_path: Path, stored: Any, through: str
) -> None:
    """A ``complex128`` target (no row of the table) was refused with the save's words
    ("convert it ... before saving", ``PCK-UNSUPPORTED-VALUE``): now a usage error of the load
    naming the tensor, the stored dtype and the fix, before any target is written."""
    import torch.distributed.checkpoint as dcp

    from portable_ckpt.torch.dcp import PortableStorageReader

    pckt.save({"a": torch.ones(2), "z": torch.ones(3, dtype=stored)}, tmp_path, step=1,
              continuation="statistical")
    out = {"a": torch.zeros(2), "z": torch.zeros(3, dtype=torch.complex128)}
    name = str(stored).removeprefix("torch.")
    try:
        if through == "load":
            pckt.load(out, tmp_path)
        else:
            dcp.load(out, storage_reader=PortableStorageReader(str(tmp_path)))
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        failures = getattr(e, "failures", None)  # the rank's own exception inside it
        raised = next(iter(failures.values()))[0] if failures else e
    else:
        raise AssertionError("loaded into a complex128 target")
    assert isinstance(raised, UsageError) and raised.code == "PCK-USAGE", raised
    assert (f"tensor 'z': the target's dtype torch.complex128 has no dtype in the format's "
            f"table, so no stored tensor loads into it; this one is stored as {name}: build the "
            "target with that dtype") in str(raised), raised
    assert not out["z"].any()
    if through == "load":
        assert not out["a"].any()


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_manager_on_two_ranks_saves_and_restores_them(tmp_path: Path, mode: str) -> None:
    """Left open by stop 32: the manager with a ``complex64`` DTensor and an ``e8m0`` scale on
    two gloo ranks, async in thread and in process mode (the writer process stages them in
    shared memory), restored bit for bit into zeros by a second manager."""
    from portable_ckpt.torch.launch import run_group

    res = run_group("tests.torch._group_workers:manager_complex64_dtensor", 2,
                    (str(tmp_path / "r"), mode), sys_path=[str(Path(__file__).parents[2])],
                    timeout=240)
    res.raise_for_errors()
    assert res.results == [{"step": 2, "freqs": True, "scale": True}] * 2
    assert json.loads(next((tmp_path / "r").glob("s*2-*/manifest.json")).read_bytes())[
        "format_version"] == "1.3"


def test_a_reader_that_does_not_know_the_extension_refuses_and_keeps_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """R-VERSION-5, R-VERSION-10: a reader of 1.2 (the extensions of 1.3 unknown to it) refuses
    a 1.3 version with PCK-FEATURE-UNSUPPORTED and lists it as foreign, never reading its bytes
    as another dtype; gc keeps it."""
    from portable_ckpt.format import manifest
    from portable_ckpt.io.gc import gc
    from portable_ckpt.io.versions import list_versions

    pckt.save({"z": torch.ones(2, dtype=torch.complex64)}, tmp_path, step=1,
              continuation="statistical")
    pckt.save({"w": torch.ones(2)}, tmp_path, step=2, continuation="statistical")
    monkeypatch.setattr(manifest, "KNOWN_EXTENSIONS", frozenset({"tensor-table"}))
    (v1,) = [p for p in tmp_path.iterdir() if p.name.startswith("s000000000001")]
    with pytest.raises(CheckpointError) as ei:
        portable_ckpt.open(v1)
    assert ei.value.code == "PCK-FEATURE-UNSUPPORTED", ei.value
    assert "dtype-complex64" in str(ei.value)
    assert {v.step: v.status for v in list_versions(tmp_path)} == {1: "foreign", 2: "committed"}
    gc(tmp_path, keep=1, grace_seconds=0)
    assert v1.is_dir() and (v1 / "manifest.json").is_file()


def test_hf_files_with_c64_and_e8m0_convert_and_back(tmp_path: Path) -> None:
    """A Hugging Face file holding ``C64`` and ``F8_E8M0`` tensors (MX scales) converts to a 1.3
    version and back to safetensors with the same bytes (it was PCK-DTYPE-UNSUPPORTED)."""
    from safetensors.torch import load_file, save_file

    tensors = {
        "model.freqs_cis": torch.polar(torch.ones(4, 2), torch.arange(8.0).reshape(4, 2)),
        "model.mlp.scale": torch.tensor([120, 127, 130, 255], dtype=torch.uint8).view(
            torch.float8_e8m0fnu),
        "model.mlp.w": torch.arange(6.0).reshape(2, 3),
    }
    save_file(tensors, tmp_path / "model.safetensors")
    report = convert(tmp_path / "model.safetensors", tmp_path / "root")
    assert report.tensors == 3
    assert _manifest(tmp_path / "root")["must_understand"] == ["dtype-complex64",
                                                               "dtype-float8-e8m0fnu"]
    convert(tmp_path / "root", tmp_path / "hf", dst_format="hf")
    (shard,) = (tmp_path / "hf").glob("*.safetensors")
    back = load_file(shard)
    for k, v in tensors.items():
        assert _same(v, back[k]), k


def test_dcp_and_torch_save_sources_with_them_convert_and_back(tmp_path: Path) -> None:
    """DCP (its typed ``ComplexFloatStorage``) and torch.save sources with complex64 and fnuz
    float8 convert; the version exports back to DCP and stock ``dcp.load`` reads the bits."""
    import torch.distributed.checkpoint as dcp

    state = {"z": torch.polar(torch.ones(3), torch.arange(3.0)),
             "f": torch.tensor([0x01, 0x7F, 0x80], dtype=torch.uint8).view(torch.float8_e4m3fnuz),
             "w": torch.ones(2)}
    dcp.save(state, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    convert(tmp_path / "dcp", tmp_path / "from_dcp", trust_pickle=True)
    torch.save(state, tmp_path / "state.pt")
    convert(tmp_path / "state.pt", tmp_path / "from_pt")
    for root in ("from_dcp", "from_pt"):
        ck = portable_ckpt.open(tmp_path / root)
        for k, v in state.items():
            assert _same(v, pckt.as_tensor(ck.read(k))), (root, k)
    convert(tmp_path / "from_dcp", tmp_path / "back", dst_format="dcp")
    out = {k: torch.zeros_like(v) for k, v in state.items()}
    dcp.load(out, checkpoint_id=str(tmp_path / "back"), no_dist=True)
    for k, v in state.items():
        assert _same(v, out[k]), k


@pytest.mark.parametrize("target", [torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
                                    torch.float8_e8m0fnu])
@pytest.mark.parametrize("inf", [float("inf"), float("-inf")], ids=["inf", "-inf"])
def test_an_infinity_is_not_loaded_as_nan_into_a_type_without_one(
        tmp_path: Path, target: Any, inf: float) -> None:
    """The fnuz float8 types and e8m0 have no infinity: torch casts one to NaN, and the load's
    overflow check counted only an infinity made finite, so an ``inf`` (a loss scale, a mask
    bias) arrived as NaN without a word. It is refused as out of range, like a finite value
    made infinite, before any target is written."""
    pckt.save({"a": torch.ones(2), "t": torch.tensor([inf, 1.0])}, tmp_path, step=1,
              continuation="statistical")
    out = {"a": torch.zeros(2), "t": torch.ones(2).to(target)}
    with pytest.raises(UsageError, match=r"tensor 't'.*1 value\(s\) out of the target type's "
                                         r"range would become infinite, its largest value, or NaN"):
        pckt.load(out, tmp_path)
    assert not out["a"].any()
    assert out["t"].float().tolist() == [1.0, 1.0]


def test_values_far_below_e8m0s_smallest_are_not_raised_to_it_unnoticed(tmp_path: Path) -> None:
    """e8m0 has no zero: a cast takes 1e-45 (a float32 subnormal) up to 2^-127, as a type with
    a zero flushes it to 0. That passed the load's scan, which counted only values that became
    0; a box where most of them are so raised is refused like a box flushed to zeros, and one
    such value among others is counted in ``flushed`` and passes, as a flush does."""
    tiny = [1e-45, 1e-42, 2.0 ** -129]
    pckt.save({"most": torch.tensor([*tiny, 1.0]), "one": torch.tensor([1e-45, 1.0, 2.0, 4.0])},
              tmp_path, step=1, continuation="statistical")
    out = {"most": torch.ones(4).to(torch.float8_e8m0fnu),
           "one": torch.ones(4).to(torch.float8_e8m0fnu)}
    with pytest.raises(UsageError, match=r"tensor 'most'.*3 of its 4 non-zero values would "
                                         r"become the target type's smallest value"):
        pckt.load({"most": out["most"]}, tmp_path, strict=False)
    assert out["most"].float().tolist() == [1.0] * 4
    info = pckt.load({"one": out["one"]}, tmp_path, strict=False)
    assert out["one"].float().tolist() == [2.0 ** -127, 1.0, 2.0, 4.0]
    assert [(c["key"], c["flushed"]) for c in info.casts] == [("one", 1)]
