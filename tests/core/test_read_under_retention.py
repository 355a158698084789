"""A reader whose version retention deletes under it (serving review F1, F2)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.errors import FileMissingError, VersionDeletedError
from portable_ckpt.io.gc import gc

from .helpers import save_sharded


def _versions(root: object) -> list[str]:
    ids = []
    for step in (1, 2):
        arrays = {f"t{i}": (np.full((64, 64), step * 10 + i, np.float32), (2, 1)) for i in range(4)}
        ids.append(save_sharded(root, arrays, step=step).attempt_id)
    return ids


def test_a_version_deleted_while_read_says_so_and_is_not_damage(tmp_path) -> None:
    """Reads of a version gc deleted were a plain PCK-FILE-MISSING, the error of a damaged
    version; verify() even passed it, from the sizes it had seen before (F2)."""
    first, _ = _versions(tmp_path)
    ck = portable_ckpt.open(os.path.join(tmp_path, first))
    assert float(ck.read("t0")[0, 0]) == 10.0
    assert ck.verify() == []
    gc(tmp_path, keep=1, grace_seconds=0)
    assert not (tmp_path / first).exists()
    with pytest.raises(VersionDeletedError) as err:
        ck.read("t3")
    assert err.value.code == "PCK-FILE-MISSING" and isinstance(err.value, FileMissingError)
    assert f"version {first} was deleted while it was read" in str(err.value)
    assert "not damage" in str(err.value) and "Open the root again" in str(err.value)
    problems = ck.verify()
    assert [type(p) for p in problems] == [VersionDeletedError]
    # The newest version is what a reader opens next.
    assert float(portable_ckpt.open(tmp_path).read("t3")[0, 0]) == 23.0


def test_a_file_missing_from_a_version_still_committed_is_damage(tmp_path) -> None:
    _, second = _versions(tmp_path)
    ck = portable_ckpt.open(os.path.join(tmp_path, second))
    for name in os.listdir(tmp_path / second / "data"):
        os.unlink(tmp_path / second / "data" / name)
    with pytest.raises(FileMissingError) as err:
        ck.read("t1")
    assert type(err.value) is FileMissingError
    assert any(type(p) is FileMissingError for p in ck.verify())


def test_opening_a_version_retention_deleted_does_not_call_it_uncommitted(tmp_path) -> None:
    """Serving review F7: a path `ls --latest` printed, deleted by gc before it was opened, was
    "never committed (or was interrupted)"."""
    from portable_ckpt.errors import ManifestMissingError

    first, _ = _versions(tmp_path)
    gc(tmp_path, keep=1, grace_seconds=0)
    with pytest.raises(ManifestMissingError) as err:
        portable_ckpt.open(os.path.join(tmp_path, first))
    assert "does not exist (any more" in str(err.value) and "never committed" not in str(err.value)
    (tmp_path / first).mkdir()
    (tmp_path / first / "data").mkdir()
    (tmp_path / first / "data" / "w00000-0000.safetensors").write_bytes(b"x")
    with pytest.raises(ManifestMissingError, match="never committed"):
        portable_ckpt.open(os.path.join(tmp_path, first))


def test_zstd_ranges_read_in_turn_are_decoded_once(tmp_path) -> None:
    """Serving review F8: one decoded zstd range was kept; readers taking turns between ranges
    (threads sharing a Checkpoint) decoded each again at every turn."""
    arrays = {f"t{i}": (np.arange(4096, dtype=np.float32).reshape(64, 64) + i, (1, 1))
              for i in range(3)}
    save_sharded(tmp_path, arrays, step=1, writers=1, codec="zstd")
    ck = portable_ckpt.open(tmp_path)
    for _ in range(10):
        for i in range(3):
            got = ck.read(f"t{i}", (5, 0), (1, 64))
            assert float(got[0, 1]) == 5 * 64 + 1 + i
    stored = sum(f.size for f in ck.manifest.files.values())  # every file of the version
    assert ck.stats.bytes_read < 2 * stored, (ck.stats.bytes_read, stored)


def test_a_torch_load_of_a_root_whose_version_retention_deletes_loads_the_latest(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Serving review F3: a load from a root failed half way when retention deleted its
    version, the target left holding two versions. One process loads the root's latest again
    (said on stderr); a load of one version, or of a group, still fails."""
    torch = pytest.importorskip("torch")
    import portable_ckpt.torch as pckt
    from portable_ckpt.io.reader import Checkpoint

    def state(v: float) -> dict[str, object]:
        return {f"l{i}": torch.full((64,), v + i) for i in range(6)}

    pckt.save(state(10.0), tmp_path, step=1, continuation="statistical")
    real = Checkpoint.read_many
    done = [False]

    def pruned_under_it(self: Checkpoint, requests):  # type: ignore[no-untyped-def]
        if not done[0]:
            done[0] = True
            pckt.save(state(20.0), tmp_path, step=2, continuation="statistical")
            gc(tmp_path, keep=1, grace_seconds=0)  # the version being read goes
        return real(self, requests)

    monkeypatch.setattr(Checkpoint, "read_many", pruned_under_it)
    target = state(0.0)
    info = pckt.load(target, tmp_path)
    assert info.step == 2
    assert all(float(t[0]) == 20.0 + i for i, t in enumerate(target.values()))
    assert "was deleted while it was read" in capsys.readouterr().err
    done[0] = False
    with pytest.raises(VersionDeletedError):
        pckt.load(state(0.0), os.path.join(tmp_path, info.checkpoint_id))


@pytest.mark.parametrize("how", ["world-writable", "another owner"])
def test_a_root_others_control_is_reported(
    tmp_path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Tenant review F3: a root another user made first under /tmp (or linked to a directory
    of theirs) was adopted without a word: they read every tensor and renamed versions away."""
    import logging

    root = tmp_path / "ckpts"
    root.mkdir()
    if how == "world-writable":
        root.chmod(0o777)
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root to give the directory away")
        os.chown(root, 12345, 12345)
    with caplog.at_level(logging.WARNING, logger="portable_ckpt"):
        portable_ckpt.save_arrays(root, {"w": np.zeros(2, np.float32)}, step=1)
    said = [r for r in caplog.records if "another user can read, replace or remove" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]
    mine = tmp_path / "mine"
    mine.mkdir()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="portable_ckpt"):
        portable_ckpt.save_arrays(mine, {"w": np.zeros(2, np.float32)}, step=1)
    assert not [r for r in caplog.records if "another user" in r.getMessage()]
