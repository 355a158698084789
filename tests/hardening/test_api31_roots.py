"""A URL that lost a slash (``s3:/bucket/run``) is refused, not taken as a local folder.

Found by the API review 31: ``s3:/bucket/run`` and ``file:/abs/path`` read as relative paths,
so ``save_arrays``, ``CheckpointManager`` and ``convert`` wrote a folder ``s3:`` (``file:``)
in the working directory and reported success: the job's checkpoints sat on the node's disk.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.cli.main import main
from portable_ckpt.errors import UsageError

TYPOS = ["s3:/bucket/run", "S3:/bucket/run", "s3:bucket/run", "file:/tmp/run", "file:run"]


@pytest.mark.parametrize("root", TYPOS)
def test_a_url_missing_a_slash_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], root: str
) -> None:
    monkeypatch.chdir(tmp_path)
    calls: list[Callable[[], Any]] = [
        lambda: portable_ckpt.save_arrays(root, {"w": np.zeros(2)}, step=1),
        lambda: portable_ckpt.open(root),
        lambda: portable_ckpt.list_versions(root),
        lambda: portable_ckpt.gc(root, keep=1),
    ]
    for call in calls:
        with pytest.raises(UsageError, match="looks like a URL with a slash missing") as e:
            call()
        assert "://..." in str(e.value) and f"./{root}" in str(e.value)  # names both fixes
    with pytest.raises(SystemExit) as exit_:
        main(["ls", root])
    assert exit_.value.code == 2
    assert "slash missing" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_local_folder_named_like_a_scheme_is_written_through_dot_slash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    portable_ckpt.save_arrays("./s3:/b", {"w": np.ones(2)}, step=1)
    assert portable_ckpt.open(tmp_path / "s3:" / "b").read("w").tolist() == [1.0, 1.0]
    # A prefix that is no scheme of ours stays a path, as before.
    portable_ckpt.save_arrays("run:1/b", {"w": np.ones(2)}, step=1)
    assert portable_ckpt.open("run:1/b").step == 1


def test_manager_and_convert_refuse_it_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    import torch

    import portable_ckpt.torch as pckt
    from portable_ckpt.convert import convert

    monkeypatch.chdir(tmp_path)
    torch.save({"w": torch.ones(2)}, tmp_path / "m.pt")
    with pytest.raises(UsageError, match="slash missing"):
        pckt.CheckpointManager("s3:/bucket/run", save_every=1, handle_sigterm=False)
    with pytest.raises(UsageError, match="slash missing"):
        pckt.CheckpointManager(tmp_path / "r", fast_root="file:/tmp/fast", handle_sigterm=False)
    with pytest.raises(UsageError, match="slash missing"):
        pckt.save({"w": torch.ones(2)}, "s3:/bucket/run", step=1)
    with pytest.raises(UsageError, match="slash missing"):
        convert(tmp_path / "m.pt", "s3:/bucket/run")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt", "r"]
