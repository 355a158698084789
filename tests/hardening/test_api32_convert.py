"""A DCP export under mapped keys refuses an entry a tensor displaces, as verbatim keys do.

Found by the API review 31 (R5, left open): a version of the core API holding tensor ``a`` and
entry ``a`` exported by ``convert ROOT out --to dcp`` (default keys) without the entry, exit
0 ("2 entries" in its summary); so did entry ``b.c`` beside tensor ``b/c`` (one DCP name) and
entry ``b`` holding ``{"c": 1}`` (its item ``b.c``). A DCP checkpoint holds one item of each
name: the export refuses before anything is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")

import torch

import portable_ckpt
from tests._cli import unprivileged_cli

pytestmark = pytest.mark.torch


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ({"a": {"x": 1}}, "key 'a' is both a tensor and an entry of the version, and a DCP "
                          "checkpoint has one item of each name; nothing was written"),
        ({"b.c": 3}, "entry 'b.c': its DCP item 'b.c' has no place beside the tensor 'b/c'"),
        ({"b": {"c": 1}}, "entry 'b': its DCP item 'b.c' has no place beside the tensor 'b/c'"),
        ({"a/x": [1, 2]}, "entry 'a/x': its DCP item 'a.x' has no place beside the tensor 'a'"),
    ],
)
def test_an_entry_a_tensor_displaces_is_refused(
    tmp_path: Path, entries: dict[str, Any], message: str
) -> None:
    root = tmp_path / "root"
    portable_ckpt.save_arrays(root, {"a": np.arange(3.0), "b/c": np.ones(2)}, step=1,
                              entries={"keep": [1, 2], **entries})
    run = unprivileged_cli("convert", str(root), str(tmp_path / "out"), "--to", "dcp")
    assert run.returncode == 1, (run.stdout, run.stderr)
    assert "[PCK-UNSUPPORTED-VALUE]" in run.stderr and message in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root"]


def test_entries_beside_the_tensors_arrive(tmp_path: Path) -> None:
    """Entries no tensor displaces (and an empty dict, no DCP item) export as before."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    root = tmp_path / "root"
    portable_ckpt.save_arrays(root, {"a": np.arange(3.0), "b/c": np.ones(2)}, step=1,
                              entries={"keep": [1, 2], "e": {"f": {"g": 1}}, "empty": {}})
    run = unprivileged_cli("convert", str(root), str(tmp_path / "out"), "--to", "dcp")
    assert run.returncode == 0, run.stderr
    dcp_to_torch_save(tmp_path / "out", tmp_path / "t.pt")
    got = torch.load(tmp_path / "t.pt", weights_only=True)
    assert got["a"].tolist() == [0.0, 1.0, 2.0] and got["b"]["c"].tolist() == [1.0, 1.0]
    assert got["keep"] == [1, 2] and got["e"] == {"f": {"g": 1}}
