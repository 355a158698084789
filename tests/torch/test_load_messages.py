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


def test_a_key_with_nothing_near_keeps_the_strict_advice(tmp_path: Path) -> None:
    pckt.save({"w": torch.ones(3)}, tmp_path, step=1)
    with pytest.raises(TensorMissingError, match="pass strict=False"):
        pckt.load({"w": torch.zeros(3), "completely_different": torch.zeros(1)}, tmp_path)


@pytest.mark.parametrize(("stored", "target", "values", "why"), [
    (torch.float32, torch.float16, [1e5, 1.0], "1 finite value\\(s\\) would become infinite"),
    (torch.float32, torch.float16, [1e-13, 3e-12], "every non-zero value \\(2\\) would become 0"),
    (torch.int64, torch.int32, [2**40, 1], "1 value\\(s\\) do not fit and would change"),
    (torch.float32, torch.int64, [1.5, 2.0], "1 value\\(s\\) do not fit and would change"),
])
def test_a_cast_that_destroys_values_is_refused(
    tmp_path: Path, stored: torch.dtype, target: torch.dtype, values: list[float], why: str
) -> None:
    """Multi-job review F5: a job restarted in float16 got ``inf`` for 1e5 and all-zero AdamW
    moments, silently. Such a cast is refused; a cast that keeps the values is listed."""
    from portable_ckpt.errors import UsageError

    pckt.save({"x": torch.tensor(values, dtype=stored), "ok": torch.tensor([0.5, 2.0, 1e-9])},
              tmp_path, step=1)
    with pytest.raises(UsageError, match=f"'x': casting the stored .*: {why}; build the target"):
        pckt.load({"x": torch.zeros(2, dtype=target)}, tmp_path, strict=False)
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
