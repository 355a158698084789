"""A version deleted while it is drilled (manager review 25, M2).

A weekly ``portable-ckpt drill ROOT`` against a running job whose retention deleted the drilled
version meanwhile exited 1 (``PCK-MANIFEST-MISSING``, "open the root again"), which pages: no
restore failed. A root is resolved again once; a version named explicitly is
``PCK-FILE-MISSING`` marked retryable (exit 75), with no drill record.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")

import portable_ckpt

_FACTORY = '''
import os, shutil
from portable_ckpt.torch.drill import build_state_from_metadata

def make(rank, world, ck):
    """Delete the drilled version once (as a job's retention does), then build the state."""
    root = ck.storage.local_root()
    flag = os.path.join(os.path.dirname(root), "deleted-once")  # (a drill's fork server keeps
    if not os.path.exists(flag):                                # its first environment)
        open(flag, "w").close()
        shutil.rmtree(os.path.join(root, ck.id))
    return build_state_from_metadata(ck, rank, world)
'''


@pytest.fixture
def factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "retention_factory.py").write_text(_FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return "retention_factory:make"


def _root(tmp_path: Path) -> tuple[Path, list[Any]]:
    root = tmp_path / "root"
    infos = [portable_ckpt.save_arrays(root, {"w": np.full(4, s, np.float32)}, step=s)
             for s in (1, 2)]
    return root, infos


def test_a_root_whose_version_was_deleted_mid_drill_is_resolved_again(
    tmp_path: Path, factory: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from portable_ckpt.cli.main import main

    root, infos = _root(tmp_path)
    code = main(["drill", str(root), "--world-size", "1", "--factory", factory])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"drill PASSED: {infos[0].attempt_id} (step 1)" in out
    assert not (root / infos[1].attempt_id).exists()
    assert next(v for v in portable_ckpt.list_versions(root) if v.step == 1).drilled


def test_a_named_version_deleted_mid_drill_is_retryable_not_a_failure(
    tmp_path: Path, factory: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from portable_ckpt.cli.main import main

    root, infos = _root(tmp_path)
    vdir = root / infos[1].attempt_id
    code = main(["drill", str(vdir), "--world-size", "1", "--factory", factory])
    got = capsys.readouterr()
    err = got.err
    assert code == 75, (got.out, err)
    assert "was deleted while it was drilled" in err and "PCK-FILE-MISSING" in err
    assert not vdir.exists()
    shutil.rmtree(root)
