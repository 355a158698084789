"""A load's "missing" errors say what the checkpoint holds instead (review 3, B4).

A key stored as the other kind (a tensor where the target now has an int) or under a renamed
prefix used to be reported as absent with the advice ``strict=False``, which then loaded nothing
for it and reported success.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from portable_ckpt.errors import EntryMissingError, TensorMissingError

torch = pytest.importorskip("torch")
pckt = pytest.importorskip("portable_ckpt.torch")


def test_a_key_stored_as_the_other_kind_is_named_so(tmp_path: Path) -> None:
    pckt.save({"epoch": 3, "bias": torch.ones(2)}, tmp_path, step=1)
    with pytest.raises(TensorMissingError, match=r"holds 'epoch' as a plain value, the target a "
                       r"tensor") as e1:
        pckt.load({"epoch": torch.zeros(1), "bias": torch.zeros(2)}, tmp_path)
    assert "strict=False" not in str(e1.value)
    with pytest.raises(EntryMissingError, match=r"holds 'bias' as a tensor, the target a plain"):
        pckt.load({"epoch": 0, "bias": 0}, tmp_path)


def test_a_renamed_prefix_names_the_stored_keys(tmp_path: Path) -> None:
    pckt.save({"model": {"weight": torch.ones(3), "bias": torch.ones(3)}}, tmp_path, step=1)
    with pytest.raises(TensorMissingError, match=r"look alike: \['model/(weight|bias)'") as e:
        pckt.load({"module": {"weight": torch.zeros(3), "bias": torch.zeros(3)}}, tmp_path)
    assert "renamed prefix" in str(e.value)


def test_a_container_stored_where_the_target_holds_one_value_is_named_so(tmp_path: Path) -> None:
    """A module's extra state saved as a dict, loaded into a fresh module whose extra state is
    None: it was "a renamed prefix? map the target's keys" (zoo review, low)."""

    class Extra(torch.nn.Module):
        def __init__(self, v: object) -> None:
            super().__init__()
            self.v = v

        def get_extra_state(self) -> object:
            return self.v

        def set_extra_state(self, s: object) -> None:
            self.v = s

    pckt.save({"m": Extra({"k": 2, "seen": [1, 2]})}, tmp_path, step=1)
    with pytest.raises(EntryMissingError, match=r"holds a dict or list there \(\['m/_extra_state/"
                       r"k', 'm/_extra_state/seen/0', 'm/_extra_state/seen/1'\]\), the target "
                       r"a single plain value") as e:
        pckt.load({"m": Extra(None)}, tmp_path)
    assert "renamed prefix" not in str(e.value)
    pckt.save({"w": {"a": torch.ones(2)}}, tmp_path / "t", step=1)
    with pytest.raises(TensorMissingError, match=r"\['w/a'\]\), the target a single tensor"):
        pckt.load({"w": torch.zeros(2)}, tmp_path / "t")
    back = Extra({})  # the advice works: an empty dict takes what is stored below it
    pckt.load({"m": back}, tmp_path)
    assert back.v == {"k": 2, "seen": [1, 2]}


def test_a_key_with_nothing_near_keeps_the_strict_advice(tmp_path: Path) -> None:
    pckt.save({"w": torch.ones(3)}, tmp_path, step=1)
    with pytest.raises(TensorMissingError, match="pass strict=False"):
        pckt.load({"w": torch.zeros(3), "completely_different": torch.zeros(1)}, tmp_path)


_INF = "1 value\\(s\\) out of the target type's range would become infinite"
_INT = "integer value\\(s\\) cannot be represented and would change"


@pytest.mark.parametrize(("stored", "target", "values", "why"), [
    (torch.float32, torch.float16, [1e5, 1.0], _INF),
    (torch.float32, torch.float16, [1e-13, 3e-12], "2 of its 2 non-zero values would become 0"),
    # one survivor does not save the rest (attack review 3 F4)
    (torch.float32, torch.float16, [1e-13, 1.0, 3e-12], "2 of its 3 non-zero values would become 0"),
    (torch.int64, torch.int32, [2**40, 1], f"1 {_INT}"),
    (torch.float32, torch.int64, [1.5, 2.0], "1 value\\(s\\) are not integers the target type"),
    # attack review 3 F1: integers into floats, and wraps between signed and unsigned
    (torch.int32, torch.float16, [70000, 1], _INF),
    (torch.int64, torch.float32, [2**40 + 1, 1], f"1 {_INT}"),
    (torch.int64, torch.float64, [2**53 + 1, 1], f"1 {_INT}"),
    (torch.int64, torch.bfloat16, [257, 1000001], f"2 {_INT}"),
    (torch.uint8, torch.int8, [200, 1], f"1 {_INT}"),
    (torch.int8, torch.uint8, [-1, 1], f"1 {_INT}"),
    # float8 (torch cannot promote it, and e4m3fn saturates instead of overflowing: F12;
    # 470 is past what rounds to 448, inf saturates too: review of the change D1)
    (torch.float32, torch.float8_e4m3fn, [1000.0, 1.0], _INF),
    (torch.float32, torch.float8_e4m3fn, [470.0, 1.0], _INF),
    (torch.float32, torch.float8_e4m3fn, [float("inf"), 1.0], _INF),
    (torch.uint64, torch.float32, [2**40 + 1, 1], f"1 {_INT}"),
])
def test_a_cast_that_destroys_values_is_refused(
    tmp_path: Path, stored: torch.dtype, target: torch.dtype, values: list[float], why: str
) -> None:
    """Multi-job review F5: a job restarted in float16 got ``inf`` for 1e5 and all-zero AdamW
    moments, silently. Such a cast is refused; a cast that keeps the values is listed."""
    from portable_ckpt.errors import UsageError

    pckt.save({"x": torch.tensor(values, dtype=stored), "ok": torch.tensor([0.5, 2.0, 1e-9])},
              tmp_path, step=1)
    with pytest.raises(UsageError, match=f"'x': casting the stored .*: {why}.*; build the target"):
        pckt.load({"x": torch.zeros(len(values), dtype=target)}, tmp_path, strict=False)
    before = torch.full((3,), 7.0)
    with pytest.raises(UsageError):  # a refused cast leaves in-place targets untouched (F5)
        pckt.load({"x": torch.zeros(len(values), dtype=target), "ok": before}, tmp_path)
    assert before.tolist() == [7.0] * 3
    target_ok = {"ok": torch.zeros(3, dtype=torch.float16)}
    info = pckt.load(target_ok, tmp_path, strict=False)
    assert info.casts == [{"key": "ok", "stored": "float32", "target": "float16",
                           "flushed": 1, "elements": 3}]
    assert target_ok["ok"].tolist()[:2] == [0.5, 2.0]


def test_the_manager_says_casts_and_takes_strict_dtype(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Multi-job review F5: the cast was said only on the library's logger (a NullHandler), and
    ``CheckpointManager.restore`` had no ``strict_dtype``."""
    from portable_ckpt.errors import UsageError

    with pckt.CheckpointManager(tmp_path, save_every=1, async_save=False) as mgr:
        mgr.maybe_save(1, {"w": torch.tensor([1.0, 2.0]), "rng": pckt.RNGState()})
    capsys.readouterr()
    half = {"w": torch.zeros(2, dtype=torch.bfloat16), "rng": pckt.RNGState()}
    with pckt.CheckpointManager(tmp_path, save_every=100, async_save=False) as mgr:
        with pytest.raises(UsageError, match="strict_dtype=True refuses to cast"):
            mgr.restore(half, strict_dtype=True)
        info = mgr.restore(half)
    assert info is not None and info.casts[0]["target"] == "bfloat16"
    assert half["w"].tolist() == [1.0, 2.0]
    err = capsys.readouterr().err
    assert "into 1 tensor(s) of another dtype than stored ('w' float32 → bfloat16)" in err


@pytest.mark.parametrize(("stored", "target", "values"), [
    (torch.float8_e4m3fn, torch.float32, [1.5, -448.0]),
    (torch.float8_e5m2, torch.bfloat16, [1.5, 57344.0]),
    (torch.bfloat16, torch.float32, [1.0, 3e38]),
    (torch.int8, torch.bfloat16, [-128, 127]),
    (torch.int64, torch.float32, [2**24, -3]),
    (torch.float32, torch.int16, [2.0, -7.0]),
    (torch.bool, torch.float16, [True, False]),
    (torch.uint32, torch.float32, [0, 3]),  # uint abs is not implemented in torch (D2)
    (torch.uint64, torch.float64, [0, 2**40]),
])
def test_a_cast_that_keeps_every_value_loads(
    tmp_path: Path, stored: torch.dtype, target: torch.dtype, values: list[float]
) -> None:
    """Widening casts (float8 to float32 in fp8 recipes) load exactly: the check of a float8
    pair used to raise from torch.promote_types (attack review 3 F12)."""
    from portable_ckpt.torch._load_casts import exact_cast

    saved = torch.tensor(values, dtype=stored)
    pckt.save({"x": saved}, tmp_path, step=1)
    out = {"x": torch.zeros(len(values), dtype=target)}
    info = pckt.load(out, tmp_path)
    assert out["x"].tolist() == saved.to(target).tolist() == saved.double().tolist()
    assert info.casts[0]["flushed"] == 0
    # exact by type (no scan) except the narrowings, whose values are checked
    narrowing = (torch.int64, torch.float32, torch.uint32, torch.uint64)
    assert exact_cast(stored, target) == (stored not in narrowing)


def test_a_value_that_rounds_to_the_largest_float8_loads() -> None:
    """What rounds to float8_e4m3fn's 448 (up to 464) is rounding, not overflow (D1)."""
    from portable_ckpt.torch._load_casts import Casts

    casts = Casts(strict=False)
    src = torch.tensor([460.0, -448.0, 1.0])
    casts.convert("x", src, src.to(torch.float8_e4m3fn))  # no refusal


def _pairs() -> list[tuple[str, str]]:
    from portable_ckpt.format.dtypes import DTYPES
    from portable_ckpt.torch._tensors import torch_dtype

    names = []
    for n in DTYPES:
        try:
            torch_dtype(n)
        except Exception:  # a format dtype this torch lacks
            continue
        names.append(n)
    return [(a, b) for a in names for b in names if a != b]


@pytest.mark.parametrize(("stored", "target"), _pairs())
def test_every_cast_between_the_formats_dtypes_keeps_values_or_is_refused(
    tmp_path: Path, stored: str, target: str
) -> None:
    """Maintainer review M1: the cast check knew the current dtypes' families only; a float type
    without a sign or a zero (e8m0) loaded [-2, 0, 3, -0.5] as [2, 5.9e-39, 4, 0.5]. Every pair
    of the format's dtypes: the values come back within the target's rounding, with their sign
    and their zeros, or the load is refused (PCK-USAGE)."""
    from portable_ckpt.errors import UsageError
    from portable_ckpt.torch._tensors import as_bits, torch_dtype

    src, dst = torch_dtype(stored), torch_dtype(target)
    values = [-2.0, -0.5, 0.0, 1.0, 3.0]
    if src == torch.bool:
        x = torch.tensor([True, False, True])
    elif src.is_floating_point and torch.finfo(src).min > 0:
        x = torch.tensor([0.5, 1.0, 2.0, 4.0]).to(src)  # e8m0: no sign, no zero
    elif src.is_floating_point or src.is_complex:
        x = torch.tensor(values).to(src)
    else:
        lo = torch.iinfo(src).min
        x = torch.tensor([v for v in (-2, 0, 1, 3) if v >= lo], dtype=torch.int64).to(src)
    pckt.save({"w": x}, tmp_path, step=1)
    out = {"w": torch.zeros(x.shape, dtype=dst)}
    before = as_bits(out["w"]).clone()
    try:
        pckt.load(out, tmp_path)
    except UsageError:
        assert torch.equal(as_bits(out["w"]), before), out["w"]  # nothing was written
        return  # refused: nothing silently changed
    # Complex and real types do not cast into each other (format 1.3's complex64): refused.
    assert not (src.is_complex or dst.is_complex), (stored, target, out["w"])
    a, b = x.double(), out["w"].double()
    assert torch.equal(torch.sign(a), torch.sign(b)), (a, b)
    if dst.is_floating_point and dst != torch.bool:
        eps = torch.finfo(dst).eps
        assert bool(((a - b).abs() <= a.abs() * eps).all()), (a, b)
    else:
        assert torch.equal(a, b), (a, b)


def test_another_optimizer_class_is_named_not_taken_for_a_renamed_prefix(tmp_path: Path) -> None:
    """Manager review 25, L2: an AdamW's state restored into an SGD said "stored keys that look
    alike ... a renamed prefix? map the target's keys"; it names the optimizer's class."""
    import torch

    import portable_ckpt.torch as pckt

    def trained(opt_cls: type, **kw: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        m = torch.nn.Linear(3, 2)
        o = opt_cls(m.parameters(), lr=0.1, **kw)
        m(torch.ones(1, 3)).sum().backward()
        o.step()
        return m, o

    m, o = trained(torch.optim.AdamW)
    pckt.save({"model": m, "optim": o}, tmp_path, step=1, continuation="statistical")
    m2, o2 = trained(torch.optim.SGD, momentum=0.9)
    with pytest.raises(TensorMissingError) as ei:
        pckt.load({"model": m2, "optim": o2}, tmp_path, allow_statistical=True)
    msg = str(ei.value)
    assert "momentum_buffer" in msg and "another optimizer class" in msg, msg
    assert "['exp_avg', 'exp_avg_sq', 'step']" in msg and "renamed prefix" not in msg
