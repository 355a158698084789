"""Conversion review 30: the message of a user's slip names the fix.

``convert state.pt root --from hf`` (a torch.save file said to be safetensors) read the zip's
first 8 bytes as a header length: "header length 578712552184433488 is absurd", as for a
damaged download.
"""

# ruff: noqa: E402
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from test_dcp import _cli

pytestmark = pytest.mark.torch


def test_a_torch_save_file_given_as_hf_names_from_torch(tmp_path: Path) -> None:
    torch.save({"w": torch.ones(2)}, tmp_path / "state.pt")
    proc = _cli("convert", str(tmp_path / "state.pt"), str(tmp_path / "root"), "--from", "hf")
    assert proc.returncode == 1 and "[PCK-SHARD-HEADER]" in proc.stderr
    assert "not a safetensors file (it starts as a zip, as a torch.save file does: pass --from torch (Python: src_format='torch'))" in proc.stderr
    assert not (tmp_path / "root").exists()


def test_a_destination_named_as_a_file_needs_to_say_its_target(tmp_path: Path) -> None:
    """``convert step-40.pt back.pt`` without ``--to torch`` made a directory ``back.pt`` holding
    a portable root and exited 0: a pipeline's ``torch.load("back.pt")`` failed later."""
    torch.save({"w": torch.ones(2)}, tmp_path / "step-40.pt")
    for name in ("back.pt", "model.safetensors"):
        proc = _cli("convert", str(tmp_path / "step-40.pt"), str(tmp_path / name))
        assert proc.returncode == 2, proc.stderr
        assert f"{tmp_path / name} is named as a file, but the target is a portable root" in proc.stderr
        assert "pass --to torch" in proc.stderr and not (tmp_path / name).exists()
    # said explicitly, a root of that name is made
    proc = _cli("convert", str(tmp_path / "step-40.pt"), str(tmp_path / "back.pt"), "--to", "portable")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "back.pt").is_dir()


def test_a_wrong_from_names_the_format_the_source_is(tmp_path: Path) -> None:
    """``--from dcp`` given a portable root said only that its ``.metadata`` is missing and "the
    DCP checkpoint is incomplete", as for a damaged checkpoint."""
    from portable_ckpt.convert import convert

    torch.save({"w": torch.ones(2)}, tmp_path / "state.pt")
    convert(tmp_path / "state.pt", tmp_path / "root")
    root = str(tmp_path / "root")
    proc = _cli("convert", root, str(tmp_path / "out"), "--from", "dcp", "--trust-pickle")
    assert proc.returncode == 1 and "[PCK-FILE-MISSING]" in proc.stderr
    assert (f"({root} is a portable source: pass --from portable (Python: src_format='portable'), "
            "or leave it out)") in proc.stderr
    proc = _cli("convert", root, str(tmp_path / "out"), "--from", "hf")
    assert proc.returncode == 1
    assert f"holds no .safetensors file ({root} is a portable source: pass --from portable" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_reworded_error_keeps_its_class_and_says_the_same_in_another_process(
    tmp_path: Path,
) -> None:
    """``CheckpointError.reword`` (the hint of a wrong ``--from``): the class, code and path
    stay, and the error pickled to another process (a writer process, a spawned rank) carries
    the new message, not the first one (``args`` follows it)."""
    import pickle

    from portable_ckpt.convert import convert
    from portable_ckpt.errors import FileMissingError

    torch.save({"w": torch.ones(2)}, tmp_path / "state.pt")
    convert(tmp_path / "state.pt", tmp_path / "root")
    with pytest.raises(FileMissingError) as ei:
        convert(tmp_path / "root", tmp_path / "out", src_format="dcp", trust_pickle=True)
    back = pickle.loads(pickle.dumps(ei.value))
    assert type(back) is FileMissingError and back.code == "PCK-FILE-MISSING"
    assert back.message == ei.value.message and "is a portable source" in str(back)
    # a Python caller is told the argument it passed, not only the CLI's flag (re-attack R6)
    assert "src_format='portable'" in back.message
    assert back.path == ei.value.path
    assert back.args == (back.message,) == ei.value.args  # repr and re-raise say the same
