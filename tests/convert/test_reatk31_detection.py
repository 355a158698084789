"""A ``.bin`` repository beside a stray safetensors file is the torch source transformers loads.

``transformers`` looks for ``model.safetensors``, then its index, then ``pytorch_model.bin``,
then ``pytorch_model.bin.index.json``: an ``adapter_model.safetensors`` beside ``.bin`` weights
is no model weights to it. Detection took any ``.safetensors`` file for an HF source, and the
adapter alone was converted, exit 0 (reatk31 R4).
"""

# ruff: noqa: E402
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import save_file
from test_hf_torch import _check, _tensors
from test_torch_shards import _save_bin_shards

import portable_ckpt
from portable_ckpt.convert import convert, detect_format

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("sharded", [True, False], ids=["index", "one-file"])
def test_bin_weights_beside_an_adapter_file_are_the_source(tmp_path: Path, sharded: bool) -> None:
    t = _tensors()
    repo = tmp_path / "repo"
    if sharded:
        keys = sorted(t)
        _save_bin_shards(repo, t, [keys[:3], keys[3:]])
    else:
        repo.mkdir()
        torch.save(t, repo / "pytorch_model.bin")
    save_file({"lora_A": torch.ones(2)}, repo / "adapter_model.safetensors")
    assert detect_format(repo) == "torch"
    convert(repo, tmp_path / "root")
    _check(portable_ckpt.open(tmp_path / "root"), t)  # every weight, and no adapter tensor
    # model.safetensors is what transformers loads first: that directory stays an HF source
    save_file({"w": torch.ones(2)}, repo / "model.safetensors")
    assert detect_format(repo) == "hf"
