"""Mutation audit 30, ``portable-ckpt recommit``: its ``--json`` document and its options.

``test_recommit`` checks the rebuilt record; these pin what the command reports about it, field
by field against the record it published, and that ``--world-size`` reaches the continuation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from portable_ckpt.cli.main import main as cli_main
from tests.core.test_recommit import _version


def test_the_json_document_describes_the_published_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mutants r06, r08, r09, r10: ``--world-size`` was dropped, ``committed_at`` left out,
    the step and the bytes reported wrong; each now compared with the record on disk."""
    v = _version(tmp_path / "root", step=5)
    (v / "manifest.json").unlink()
    # --world-size reaches the continuation: 4 ranks, but the per-rank entry holds 2
    assert cli_main(["recommit", str(v), "--json", "--world-size", "4"]) == 1
    assert "rank(s) [2, 3] (world size 4)" in capsys.readouterr().err
    assert not (v / "manifest.json").exists()
    assert cli_main(["recommit", str(v), "--json", "--world-size", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rebuilt = json.loads((v / "manifest.json").read_text())
    assert doc == {
        "path": str(v), "attempt_id": v.name, "step": 5,
        "committed_at": rebuilt["committed_at"],
        "continuation": {"contract": "statistical", "world_size": 2, "mesh": None},
        "writers": 2, "tensors": 1, "entries": 1, "files": len(rebuilt["files"]),
        "bytes": sum(f["size"] for f in rebuilt["files"].values()),
    }
    assert doc["bytes"] > 0


def test_the_text_report_names_the_version_and_its_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    v = _version(tmp_path / "root", step=5)
    (v / "manifest.json").unlink()
    assert cli_main(["recommit", f"{v}/"]) == 0  # a trailing slash names the same version
    out = capsys.readouterr().out
    assert out.startswith(f"recommitted {v} (step 5) from 2 writer indexes: 1 tensors, 1 entries")
    assert f"`portable-ckpt verify {v} --deep`" in out


def test_a_copy_record_that_names_this_root_is_no_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mutant x38: a copy record naming the version's own root (an older tool's copy "to
    itself") holds no other record to put back: recommit is not refused for it."""
    from portable_ckpt.io.copy import CopyResult, _write_record
    from portable_ckpt.storage import LocalStorage

    root = tmp_path / "root"
    v = _version(root, step=5)
    _write_record(LocalStorage(str(root)), v.name, f"file://{root}", CopyResult(
        attempt_id=v.name, step=5, source=str(v), destination=f"file://{root}",
        destination_version=f"file://{v}"))
    (v / "manifest.json").unlink()
    assert cli_main(["recommit", str(v), "-q"]) == 0, capsys.readouterr().err
    assert (v / "manifest.json").is_file()


def test_a_failed_copy_record_is_no_copy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Mutant x37: a copy record that says the copy failed (``ok: false``) vouches for no copy
    whose record could be put back: recommit is not refused for it."""
    from portable_ckpt.io.copy import CopyResult, _write_record
    from portable_ckpt.storage import LocalStorage

    root, backup = tmp_path / "root", tmp_path / "backup"
    v = _version(root, step=5)
    rel = _write_record(LocalStorage(str(root)), v.name, f"file://{backup}", CopyResult(
        attempt_id=v.name, step=5, source=str(v), destination=f"file://{backup}",
        destination_version=f"file://{backup}/{v.name}"))
    rec = json.loads((root / rel).read_text())
    (root / rel).write_text(json.dumps({**rec, "ok": False,
                                          "error": {"code": "PCK-STORAGE", "message": "disk full"}}))
    (v / "manifest.json").unlink()
    assert cli_main(["recommit", str(v), "-q"]) == 0, capsys.readouterr().err
    assert (v / "manifest.json").is_file()


def test_a_damaged_record_is_no_lost_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Mutant q03: a version whose record is there but invalid was taken for one whose record
    was lost, and rebuilt until the create-if-absent publish met the record: it is refused
    first, with what to do (verify names the defect; a copy's record goes in its place)."""
    v = _version(tmp_path / "root", step=5)
    (v / "manifest.json").write_text("{}")
    assert cli_main(["recommit", str(v), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"]["code"] == "PCK-COMMIT-CONFLICT"
    assert "has a commit record: nothing to recommit (invalid: `portable-ckpt verify" in (
        doc["error"]["message"])
    assert (v / "manifest.json").read_text() == "{}"
