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


@pytest.mark.parametrize(("errno_name", "rc"), [("ENOSPC", 75), ("EROFS", 1)])
def test_a_drill_whose_record_cannot_be_stored_says_its_result_and_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    errno_name: str, rc: int,
) -> None:
    """Fault review 27, F4: on a full or read-only root a drill ran its restore and printed
    only the record's error: neither the text nor ``--json`` said whether it passed. Now the
    result, then that the record was not stored, why, and ``--no-record``; exit 75 where the
    cause may pass (a full disk), 1 where a person must act (read-only)."""
    import errno
    import json

    from portable_ckpt.cli.main import main
    from portable_ckpt.errors import StorageError, transient_errno
    from portable_ckpt.io import annotations

    root, infos = _root(tmp_path)
    code = getattr(errno, errno_name)

    def refused(storage: Any, attempt_id: str, rec: Any) -> str:
        raise StorageError(f"create {attempt_id}/drills/x.json: {errno_name} (errno {code})",
                           retryable=transient_errno(code))

    monkeypatch.setattr(annotations, "write_drill_record", refused)
    assert main(["drill", str(root), "--world-size", "1"]) == rc
    out = capsys.readouterr().out
    assert f"drill PASSED: {infos[1].attempt_id}" in out, out
    assert "the drill record was NOT stored" in out and errno_name in out
    assert "--no-record" in out
    assert main(["drill", str(root), "--world-size", "1", "--json"]) == rc
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["record_error"]["code"] == "PCK-STORAGE"
    assert "path" not in doc and not list(root.glob("*/drills/*.json"))
