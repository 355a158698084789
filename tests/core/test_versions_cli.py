"""Versions, latest, retention, and the CLI (run as a real subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.io.annotations import write_drill_record
from portable_ckpt.io.gc import gc
from portable_ckpt.io.versions import list_versions
from portable_ckpt.io.writer import ShardWriter, new_attempt_id
from portable_ckpt.storage import open_storage
from tests._cli import unprivileged_cli

from .helpers import save_sharded


def save_step(root, step: int, value: float = 0.0) -> str:
    m = save_sharded(root, {"w": (np.full((4, 4), value, np.float32), (2, 1))}, step=step)
    return m.attempt_id


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "portable_ckpt.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _unprivileged(*args: str) -> subprocess.CompletedProcess[str]:
    return unprivileged_cli(*args)


def test_latest_is_highest_step_then_commit_time(tmp_path) -> None:
    save_step(tmp_path, 5, 5.0)
    save_step(tmp_path, 9, 9.0)
    late = save_step(tmp_path, 9, 9.5)  # same step, committed later
    save_step(tmp_path, 7, 7.0)
    ck = portable_ckpt.open(tmp_path)
    assert ck.id == late and ck.read("w")[0, 0] == 9.5
    assert portable_ckpt.open(tmp_path, step=5).read("w")[0, 0] == 5.0
    with pytest.raises(portable_ckpt.CheckpointError) as ei:
        portable_ckpt.open(tmp_path, step=6)
    assert ei.value.code == "PCK-NOT-FOUND"


def test_incomplete_attempts_are_listed_but_never_latest(tmp_path) -> None:
    good = save_step(tmp_path, 1)
    storage = open_storage(tmp_path)
    aid = new_attempt_id(2)
    w = ShardWriter(storage, aid, 0)
    w.add_tensor("w", np.zeros((4, 4), np.float32))
    w.finish()  # every file written, never committed
    vs = {v.id: v.status for v in list_versions(tmp_path)}
    assert vs == {good: "committed", aid: "incomplete"}
    assert portable_ckpt.open(tmp_path).id == good


def test_gc_keeps_newest_and_newest_drilled(tmp_path) -> None:
    ids = [save_step(tmp_path, s) for s in (1, 2, 3, 4)]
    write_drill_record(
        open_storage(tmp_path),
        ids[1],
        {
            "ok": True,
            "started_at": "2026-11-29T00:00:00Z",
            "finished_at": "2026-11-29T00:00:01Z",
            "world_size": 2,
            "saved_world_size": 2,
            "contract": "exact",
            "measurements": {
                "restore_seconds": 1.0,
                "restore_bytes": 10,
                "restore_mib_per_s": 1.0,
                "slowest_rank_seconds": 1.0,
                "peak_temp_bytes_per_rank": [1, 1],
                "first_step_seconds": 0.1,
            },
            "error": None,
        },
    )
    rep = gc(tmp_path, keep=1, dry_run=True)
    assert set(rep.deleted) == {ids[0], ids[2]} and rep.protected == ids[1]
    assert len(list_versions(tmp_path)) == 4
    rep = gc(tmp_path, keep=1)
    assert [v.id for v in list_versions(tmp_path)] == [ids[1], ids[3]]
    assert not (tmp_path / ids[0]).exists()


def test_gc_removes_abandoned_attempts_only_after_grace(tmp_path) -> None:
    save_step(tmp_path, 1)
    storage = open_storage(tmp_path)
    aid = new_attempt_id(2)
    w = ShardWriter(storage, aid, 0)
    w.add_tensor("w", np.zeros(3, np.float32))
    w.finish()
    assert gc(tmp_path, keep=5, grace_seconds=3600).abandoned == []
    assert gc(tmp_path, keep=5, grace_seconds=3600, now=lambda: time.time() + 7200).abandoned == [
        aid
    ]
    assert not (tmp_path / aid).exists()


def test_cli_ls_inspect_verify_gc(tmp_path) -> None:
    ids = [save_step(tmp_path, s) for s in (1, 2)]
    r = cli("ls", str(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    vs = json.loads(r.stdout)["versions"]
    assert [(v["id"], v["step"], v["status"]) for v in vs] == [
        (ids[0], 1, "committed"),
        (ids[1], 2, "committed"),
    ]
    assert all(v["path"].endswith(v["id"]) for v in vs)
    r = cli("ls", str(tmp_path))
    assert ids[0] in r.stdout and "committed" in r.stdout
    r = cli("inspect", str(tmp_path), "--json")
    assert json.loads(r.stdout)["step"] == 2
    r = cli("inspect", str(tmp_path / ids[0]))
    assert r.returncode == 0 and "float32" in r.stdout
    for args in (["--deep"], ["--sample", "0.5"], []):
        r = cli("verify", str(tmp_path), "--json", *args)
        assert r.returncode == 0 and json.loads(r.stdout)["ok"] is True
    # Corrupt the newest version: verify --deep reports the checksum code and exits 1.
    f = sorted((tmp_path / ids[1] / "data").iterdir())[0]
    raw = bytearray(f.read_bytes())
    raw[-1] ^= 1
    f.write_bytes(bytes(raw))
    r = cli("verify", str(tmp_path), "--deep", "--json")
    assert r.returncode == 1
    out = json.loads(r.stdout)
    assert out["ok"] is False and out["errors"][0]["code"] == "PCK-CHECKSUM"
    r = cli("verify", str(tmp_path), "--sample", "7")
    assert r.returncode == 2
    r = cli("verify", str(tmp_path / "nope"), "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["errors"][0]["code"] == "PCK-NOT-FOUND"
    # verify --deep recorded the newest as failed: gc keeps step 1 too, the newest version
    # that can be restored (R-GC-9); it deleted it before, leaving only the damaged one.
    r = cli("gc", str(tmp_path), "--keep", "1", "--dry-run", "--json")
    assert json.loads(r.stdout)["deleted"] == [] and set(json.loads(r.stdout)["kept"]) >= {ids[0]}
    r = cli("verify", str(tmp_path / ids[0]), "--deep", "--no-record")
    assert r.returncode == 0
    assert os.path.exists(tmp_path / ids[0] / "manifest.json")


def test_newer_invalid_record_is_skipped_with_a_warning(tmp_path, caplog) -> None:
    """R-READ-1: the reader skips a newer attempt whose record is not valid, and says so."""
    save_step(tmp_path, 1, 1.0)
    bad = save_step(tmp_path, 2, 2.0)
    path = tmp_path / bad / "manifest.json"
    doc = json.loads(path.read_text())
    doc["step"] = 999  # valid JSON, not a valid record of attempt 2
    path.write_text(json.dumps(doc))
    with caplog.at_level("WARNING", logger="portable_ckpt"):
        assert portable_ckpt.open(str(tmp_path)).step == 1
    assert any(bad in r.getMessage() and "not valid" in r.getMessage() for r in caplog.records)
    proc = cli("verify", str(tmp_path))
    assert proc.returncode == 1, proc.stderr  # a problem of the root (ops review F17)
    assert bad in proc.stderr and "a commit record that is not valid" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("commit record that is not valid") == 1  # logged, not warned too


def test_a_newer_version_that_lost_its_record_is_warned_of_without_logging(tmp_path) -> None:
    """S3 review 24, M1: the newest version's manifest.json lost (it holds a verification
    record): `open(root)` returned the step before with nothing on stderr (the package logger
    has a NullHandler), and the logged advice was `gc --delete-invalid`, which deletes what
    `recommit` brings back. A job with no logging set up gets a PassedOverWarning naming the
    recommit; a script can make it an error."""
    import subprocess
    import sys
    import warnings

    from portable_ckpt.errors import PassedOverWarning
    from portable_ckpt.io.annotations import write_verification_record
    from portable_ckpt.storage import open_storage

    save_step(tmp_path, 1, 1.0)
    lost = save_step(tmp_path, 2, 2.0)
    write_verification_record(open_storage(tmp_path), lost, ok=True, mode="deep",
                              fraction=None, chunks=1)
    os.remove(tmp_path / lost / "manifest.json")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert portable_ckpt.open(str(tmp_path)).step == 1
    (w,) = [w for w in seen if issubclass(w.category, PassedOverWarning)]
    text = str(w.message)
    assert lost in text and f"recommit {tmp_path}/{lost}" in text and "delete-invalid" not in text
    assert w.filename == __file__  # names the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error", PassedOverWarning)
        with pytest.raises(PassedOverWarning):
            portable_ckpt.open(str(tmp_path))
    # a plain script, no logging configured: said on stderr
    code = f"import portable_ckpt; print(portable_ckpt.open({str(tmp_path)!r}).step)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.strip() == "1" and "PassedOverWarning" in proc.stderr, proc.stderr
    assert f"recommit {tmp_path}/{lost}" in proc.stderr


def test_refused_copy_prints_its_error_once(tmp_path) -> None:
    """The library's ``copy.refused`` log line repeated the CLI's error; ``-v`` still shows it."""
    attempt = save_step(tmp_path / "root", 1, 1.0)
    shard = next((tmp_path / "root" / attempt / "data").glob("*.safetensors"))
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0xFF
    shard.write_bytes(bytes(raw))
    proc = cli("copy", str(tmp_path / "root" / attempt), str(tmp_path / "dst"))
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("the source is corrupt") == 1, proc.stderr
    proc = cli("-v", "copy", str(tmp_path / "root" / attempt), str(tmp_path / "dst2"))
    assert proc.stderr.count("the source is corrupt") == 2 and "copy.refused" not in proc.stdout


@pytest.mark.parametrize(
    "argv",
    [("ls", "{m}"), ("inspect", "{m}"), ("gc", "{m}", "--keep", "1"), ("copy", "{m}", "{d}"),
     ("convert", "{m}", "{d}"), ("verify", "{m}"), ("copy", "{r}", "{d}")],
)
def test_json_output_is_one_document_whatever_happens(tmp_path, argv) -> None:
    """``--json`` gave a failure as JSON for copy and convert only; ls, inspect and gc printed
    nothing on stdout (maintainer review 14): one document, ``ok: false`` and the error."""
    root = tmp_path / "r"
    save_step(root, 1)
    data = next((root / os.listdir(root)[0] / "data").iterdir())
    with open(data, "r+b") as f:  # a damaged version: copy fails on its checksum
        f.seek(150)
        byte = f.read(1)
        f.seek(150)
        f.write(bytes([byte[0] ^ 1]))
    names = {"m": str(tmp_path / "missing"), "d": str(tmp_path / "dst"), "r": str(root)}
    res = cli(*[a.format(**names) for a in argv], "--json")
    assert res.returncode == 1, res.stderr
    doc = json.loads(res.stdout)  # exactly one document
    assert doc["ok"] is False, doc
    code = doc["error"]["code"] if "error" in doc else doc["errors"][0]["code"]
    assert code == ("PCK-CHECKSUM" if argv[1] == "{r}" else "PCK-NOT-FOUND"), doc
    if argv[0] != "verify":  # verify's result is its report, not an error
        assert code in res.stderr  # and said on stderr, as without --json


def test_verify_root_names_a_newer_damaged_record_it_skipped(tmp_path) -> None:
    """Ops review F17: ``verify ROOT`` verified the version before a damaged newest record and
    said OK (a restore resumes a save earlier); the skipped record is now a problem, exit 1.
    F18: a metadata verification that finds damage says that it records nothing."""
    root = tmp_path / "r"
    save_step(root, 1)
    good = save_step(root, 2)
    bad = save_step(root, 3)
    record = root / bad / "manifest.json"
    doc = json.loads(record.read_text())
    doc["step"] = 4
    record.write_text(json.dumps(doc))
    res = cli("verify", str(root), "--json")
    assert res.returncode == 1, res.stderr
    out = json.loads(res.stdout)
    assert out["path"].endswith(good) and [e["code"] for e in out["errors"]] == ["PCK-ATTEMPT-ID"]
    assert bad in out["errors"][0]["message"] and "--delete-invalid" in out["errors"][0]["message"]
    assert "gc keeps them" in res.stderr  # the resolution's warning no longer says gc removes it
    assert cli("verify", str(root / good)).returncode == 0  # the version itself is fine
    for f in (root / good / "data").iterdir():
        f.unlink()
    res = cli("verify", str(root / good))
    assert res.returncode == 1 and "PCK-FILE-MISSING" in res.stdout
    assert "a metadata verification records nothing" in res.stderr


def test_gc_after_a_rollback_keeps_the_new_branch_and_retires_the_abandoned_one(tmp_path) -> None:
    """Ops review F21: a job resumed from step 4 saved 5, 6, 7 again; gc --keep 3 kept the first
    run's 9, 8, 7 and deleted the new 5 and 6, and nothing could retire the abandoned steps."""
    root = tmp_path / "r"
    first = {s: save_step(root, s, float(s)) for s in range(10)}
    second = {s: save_step(root, s, -1.0) for s in (5, 6, 7)}
    rep = gc(root, keep=3, dry_run=True)
    assert set(second.values()) <= set(rep.kept) and set(rep.newer_branch) == set(second.values())
    assert not set(second.values()) & set(rep.deleted)
    res = cli("gc", str(root), "--keep", "3", "--retire-abandoned")
    assert res.returncode == 0, res.stderr
    assert portable_ckpt.open(str(root)).manifest.attempt_id == second[7]  # the new latest
    left = {v.id for v in list_versions(root)}
    assert left == set(second.values()), left
    assert not {first[s] for s in range(5, 10)} & left
    # A run that never went back abandons nothing.
    plain = tmp_path / "p"
    for s in range(4):
        save_step(plain, s)
    assert gc(plain, keep=1, retire_abandoned=True, dry_run=True).retired == []


def test_ls_exits_1_naming_an_attempt_it_could_not_read_and_verify_json_dates_the_version(
    tmp_path,
) -> None:
    """Ops review F7: ``ls`` exited 0 with an ``unreadable`` row and no reason while the newest
    version could not be read (restores fail). F6: ``verify --json`` names the version and the
    age of its commit, what an alerting probe needs."""

    root = tmp_path / "r"
    save_step(root, 1)
    good = save_step(root, 2)
    doc = json.loads(cli("verify", str(root), "--json").stdout)
    assert (doc["attempt_id"], doc["step"]) == (good, 2) and 0 <= doc["age_seconds"] < 300
    assert doc["committed_at"].endswith("Z")
    newest = save_step(root, 3)
    os.chmod(root / newest / "manifest.json", 0)
    res = _unprivileged("ls", str(root))
    assert res.returncode == 1, (res.stdout, res.stderr)  # a permission: not 75 (F6)
    assert f"{newest} could not be read" in res.stderr and "ermission denied" in res.stderr
    assert "unreadable" in res.stdout


def test_exit_75_says_retry_and_1_says_the_checkpoint(tmp_path, capsys) -> None:
    """Scripting review F6: a storage error that may pass (EIO, a store that did not answer)
    and a copy still being written exited 1, as damage does: a cron could not tell "page
    someone" from "retry later". They exit 75 (EX_TEMPFAIL). A permission, damage, and a
    transient error together with damage still exit 1."""
    from portable_ckpt.cli.main import main as cli_main
    from portable_ckpt.storage import LocalStorage, register_scheme
    from portable_ckpt.storage.faults import Fault, FaultyStorage

    root = tmp_path / "r"
    first = save_step(root, 1)
    mid = save_step(root, 2)
    newest = save_step(root, 3)
    faults = [Fault(op="read", path=f"{newest}/data/*", error="EIO"),
              Fault(op="read", path=f"{mid}/manifest.json", error="EIO")]
    scheme = f"eio{os.getpid()}"
    register_scheme(scheme, lambda url: FaultyStorage(LocalStorage(url.split("://", 1)[1]),
                                                      faults))
    url = f"{scheme}://{root}"
    assert cli_main(["verify", f"{url}/{newest}", "--deep", "--no-record"]) == 75
    assert "PCK-STORAGE" in capsys.readouterr().out
    assert cli_main(["gc", url, "--keep", "1", "--dry-run", "--json"]) == 75
    doc = json.loads(capsys.readouterr().out)
    assert [(u["id"], u["retryable"]) for u in doc["unknown"]] == [(mid, True)]
    assert cli_main(["ls", url]) == 75
    # With a damaged commit record beside the unreadable attempt: about a version, 1.
    (root / first / "manifest.json").write_text("{")
    assert cli_main(["gc", url, "--keep", "1", "--dry-run"]) == 1
    assert "commit record is invalid" in capsys.readouterr().err
    # A permission does not pass by waiting: a person must act (1).
    data = next(p for p in (root / newest / "data").iterdir())
    os.chmod(data, 0)
    try:
        denied = _unprivileged("verify", str(root / newest), "--deep", "--no-record")
    finally:
        os.chmod(data, 0o644)
    assert denied.returncode == 1 and "PCK-STORAGE" in denied.stdout, denied.stdout
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF
    data.write_bytes(raw)
    damaged = cli("verify", str(root / newest), "--deep", "--no-record")
    assert damaged.returncode == 1 and "PCK-CHECKSUM" in damaged.stdout, damaged.stdout

def test_listings_parse_each_commit_record_once_and_see_a_changed_one(tmp_path, monkeypatch) -> None:
    """Ops review F11, F20: ls, gc and a manager's retention after every save parsed every
    version's commit record again (a tenth of a second for thousands of tensors). A record is
    now parsed once per process by its bytes; a record that changed is parsed again."""
    import portable_ckpt.io.versions as versions

    root = tmp_path / "r"
    ids = [save_step(root, s) for s in (1, 2, 3)]
    parsed: list[str] = []
    real = versions.classify_record

    def counting(attempt_id: str, data: bytes) -> Any:
        parsed.append(attempt_id)
        return real(attempt_id, data)

    monkeypatch.setattr(versions, "classify_record", counting)
    for _ in range(3):
        assert [v.status for v in list_versions(root)] == ["committed"] * 3
        gc(root, keep=3, dry_run=True)
    assert sorted(parsed) == sorted(ids)  # once each, over six listings
    record = root / ids[1] / "manifest.json"
    doc = json.loads(record.read_text())
    doc["step"] = 7
    record.write_text(json.dumps(doc))
    assert [v.status for v in list_versions(root)] == ["committed", "invalid", "committed"]
    assert parsed.count(ids[1]) == 2


def test_ls_latest_prints_the_version_a_restore_takes(tmp_path) -> None:
    """``ls --latest``: the newest committed version no verification failed, its path alone.

    Newer attempts passed over are named on stderr; none at all, or a newer one that could not
    be read, is exit 1 (R-ID-5: it may be the latest).
    """

    root = tmp_path / "r"
    root.mkdir()
    res = cli("ls", str(root), "--latest")
    assert res.returncode == 1 and res.stdout == "" and "no committed version" in res.stderr
    save_step(root, 1)
    good = save_step(root, 2)
    bad = save_step(root, 3)
    data = next((root / bad / "data").iterdir())
    blob = bytearray(data.read_bytes())
    blob[-1] ^= 1
    data.write_bytes(bytes(blob))
    assert cli("verify", str(root), "--step", "3", "--deep").returncode == 1  # recorded: failed
    w = ShardWriter(open_storage(root), new_attempt_id(4), 0)
    w.add_tensor("w", np.zeros((4, 4), np.float32))
    w.finish()  # a save in progress: no commit record

    res = cli("ls", str(root), "--latest")
    assert res.returncode == 0, res.stderr
    assert res.stdout == f"{root / good}\n"
    assert "it is incomplete" in res.stderr and f"{bad} passed over: a verification" in res.stderr
    doc = json.loads(cli("ls", str(root), "--latest", "--json").stdout)
    assert (doc["id"], doc["step"], doc["status"]) == (good, 2, "committed")
    assert portable_ckpt.open(res.stdout.strip()).id == good

    newest = save_step(root, 5)
    os.chmod(root / newest / "manifest.json", 0)
    res = _unprivileged("ls", str(root), "--latest")
    # Not 1: `ckpt=$(ls --latest) || start_fresh` must not start afresh because of a storage
    # error (scripting review F3); a permission is 69, not 75 "retry" (SRE review S2)
    assert res.returncode == 69 and res.stdout == ""
    assert f"cannot tell the latest version: {newest} could not be read" in res.stderr
    # Docs review F13: under --json the failure is a document too ("retry" is not "none").
    doc = json.loads(_unprivileged("ls", str(root), "--latest", "--json").stdout)
    assert doc["ok"] is False and doc["error"]["code"] == "PCK-STORAGE"
    empty = tmp_path / "empty"
    empty.mkdir()
    res = cli("ls", str(empty), "--latest", "--json")
    assert res.returncode == 1 and json.loads(res.stdout)["error"]["code"] == "PCK-NOT-FOUND"


def test_ls_latest_takes_the_later_of_two_versions_of_the_top_step(tmp_path) -> None:
    """mutation audit 22 A-74: newest_first() yields each step's versions newest first, so
    `ls --latest` (and drill ROOT, verify ROOT --all) take the later-committed of two committed
    versions of the top step, as a restore does."""
    from portable_ckpt.io.versions import newest_first

    save_step(tmp_path, 3, 3.0)
    older = save_step(tmp_path, 5, 5.0)
    later = save_step(tmp_path, 5, 5.5)
    assert [v.id for v in newest_first(tmp_path)] == [later, older, *[
        v.id for v in list_versions(tmp_path) if v.step == 3]]
    res = cli("ls", str(tmp_path), "--latest")
    assert res.returncode == 0, res.stderr
    assert res.stdout == f"{tmp_path / later}\n"


@pytest.mark.parametrize("skewed", ["ahead", "behind"])
def test_retire_abandoned_needs_the_stores_clock_to_agree(tmp_path, skewed: str) -> None:
    """Multi-job review F1: one version committed by a host whose clock was 2 h ahead made
    ``gc --retire-abandoned`` delete every later version, the latest included (exit 0); one
    committed by a host 10 min behind was retired as the newest. ``committed_at`` is the
    writer's clock; the storage's times of the records must agree before anything is retired."""
    import datetime as dt

    root = tmp_path / "r"
    ids = {s: save_step(root, s, float(s)) for s in (100, 110, 120, 130)}
    odd = ids[100] if skewed == "ahead" else ids[130]
    shift = dt.timedelta(hours=2) if skewed == "ahead" else -dt.timedelta(minutes=10)
    record = root / odd / "manifest.json"
    st = record.stat()
    doc = json.loads(record.read_text())
    when = dt.datetime.strptime(doc["committed_at"], "%Y-%m-%dT%H:%M:%S.%fZ") + shift
    doc["committed_at"] = when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    record.write_text(json.dumps(doc))  # as that host's clock would have written it
    os.utime(record, ns=(st.st_atime_ns, st.st_mtime_ns))  # the store's own time is right
    res = cli("gc", str(root), "--keep", "3", "--retire-abandoned")
    assert res.returncode == 1, (res.stdout, res.stderr)
    doubted = [ids[s] for s in (110, 120, 130)] if skewed == "ahead" else [ids[130]]
    for v in doubted:
        assert f"kept    {v}  (--retire-abandoned: its committed_at" in res.stdout
    assert "writer's clock was off" in res.stdout and "(--retire-abandoned)\n" not in res.stdout
    assert portable_ckpt.open(str(root)).step == 130
    assert {v.step for v in list_versions(root)} >= {110, 120, 130}


def test_the_listing_cache_keeps_nothing_of_an_invalid_record(tmp_path) -> None:
    """Attack review 2 F11: the cached classification of an invalid record kept its error's
    traceback, whose frames held the record's bytes and parsed document: every listing of a
    rewritten 8 MiB record pinned about 40 MiB for the life of the process."""
    import gc as pygc
    import tracemalloc

    from portable_ckpt.io import versions

    root = tmp_path / "r"
    aid = save_step(root, 1)
    record = root / aid / "manifest.json"
    tracemalloc.start()
    try:
        base = None
        for i in range(5):
            record.write_text(json.dumps([i] + [0] * 500_000))  # 2 MB, invalid, new bytes
            assert [v.status for v in list_versions(root)] == ["invalid"]
            pygc.collect()
            now = tracemalloc.get_traced_memory()[0]
            base = now if base is None else base
        grown = now - base
    finally:
        tracemalloc.stop()
        versions._SUMMARIES.clear()
    assert grown < 1 << 20, f"{grown} bytes kept by 4 more listings"


def test_the_records_cache_keeps_small_records_only(tmp_path) -> None:
    """Attack review 3 F9: a 8 MiB record (valid: records may carry members of their own) cost
    ~360 MiB of parsed objects held for the life of the process, deep-copied at every hit."""
    from portable_ckpt.io import annotations
    from portable_ckpt.io.annotations import write_verification_record

    root = tmp_path / "r"
    aid = save_step(root, 1)
    storage = open_storage(root)
    small = write_verification_record(storage, aid, ok=True, mode="deep", fraction=None, chunks=1)
    doc = json.loads((root / small).read_text())
    doc["verification_id"] = doc["verification_id"][:-1] + ("0" if doc["verification_id"][-1] != "0" else "1")
    doc["pad"] = [{}] * 100_000  # 400 KB of members the schema allows
    big = f"{aid}/verifications/{doc['verification_id']}.json"
    (root / big).write_text(json.dumps(doc))
    annotations._RECORDS.clear()
    [v] = list_versions(root)
    assert v.verified
    cached = {k[1] for k in annotations._RECORDS}
    assert small in cached and big not in cached
    assert annotations._records_bytes <= annotations._RECORDS_BYTES_MAX


def test_gc_dates_attempts_on_the_storages_clock(tmp_path, monkeypatch) -> None:
    """Multi-job review F2: a cron gc on a host whose clock was 2 h ahead deleted a save in
    progress (its files looked 2 h old). F8: an attempt id stamped 3 years ahead by a writer
    whose clock was ahead kept the abandoned attempt for years ("written to 0 s ago")."""
    root = tmp_path / "r"
    save_step(root, 1)
    storage = open_storage(root)
    running = new_attempt_id(2)
    w = ShardWriter(storage, running, 0)
    w.add_tensor("w", np.zeros((4, 4), np.float32))
    w.finish()  # being written right now, not committed
    from portable_ckpt.io.gc import storage_clock

    there = storage_clock(storage)
    assert there is not None and abs(there - time.time()) < 5  # this host's disk
    assert not [p for p in os.listdir(root) if p.startswith(".pck-clock")]  # probe deleted
    real = time.time
    # This host's clock 2 h ahead of the storage's: files written now look 2 h old to it.
    monkeypatch.setattr(time, "time", lambda: real() + 7200)
    ahead = gc(root, keep=1, grace_seconds=3600)
    monkeypatch.setattr(time, "time", real)
    assert running in [g["id"] for g in ahead.in_grace] and not ahead.abandoned
    assert ahead.clock_skew is not None and 7100 < ahead.clock_skew < 7300

    future = "s000000000007-20291203T000000000000Z-00000000000000aa"  # a clock 3 years ahead
    w = ShardWriter(storage, future, 0)
    w.add_tensor("w", np.zeros((4, 4), np.float32))
    w.finish()
    two_days = time.time() - 2 * 86400
    for dirpath, _, files in os.walk(root / future):
        for f in files:
            os.utime(os.path.join(dirpath, f), (two_days, two_days))
    rep = gc(root, keep=1, grace_seconds=86400)
    assert future in rep.abandoned and running not in rep.abandoned
    assert rep.clock_skew is None

    # Attack review 3 F6: a dry run dated attempts on this host's clock and predicted other
    # deletions than the run made. F15: a probe left behind is deleted once an hour old.
    monkeypatch.setattr(time, "time", lambda: real() - 7200)  # this host 2 h behind
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(real() - 7200))
    old = root / f"s000000000003-{stamp}000000Z-00000000000000bb"  # this host's id
    w = ShardWriter(storage, old.name, 0)
    w.add_tensor("w", np.zeros((4, 4), np.float32))
    w.finish()
    ninety = real() - 5400
    for dirpath, _, files in os.walk(old):
        for f in [*files, "."]:
            os.utime(os.path.join(dirpath, f), (ninety, ninety))
    leftover = root / ".pck-clock-00112233445566ff"
    leftover.write_bytes(b"")
    os.utime(leftover, (ninety, ninety))
    dry = gc(root, keep=1, grace_seconds=3600, dry_run=True)
    assert leftover.exists()  # a dry run deletes nothing
    real_run = gc(root, keep=1, grace_seconds=3600)
    monkeypatch.setattr(time, "time", real)
    assert old.name in dry.abandoned and dry.abandoned == real_run.abandoned
    assert not old.exists() and not leftover.exists()
    assert not [p for p in os.listdir(root) if p.startswith(".pck-clock")]


def test_probes_left_behind_go_when_gc_has_nothing_to_date(tmp_path) -> None:
    """Spec §15.2 (backend review 27, L9): a probe an hour old goes at the next gc, also one
    with nothing to date (it asked the storage's clock only to date attempts, so such probes
    stayed for ever); a younger probe and a dry run leave them."""
    from portable_ckpt.io.versions import gc

    root = tmp_path / "r"
    for step in (1, 2):
        portable_ckpt.save_arrays(root, {"w": np.arange(4.0)}, step=step)
    old, young = root / ".pck-probe-00112233445566ff", root / ".pck-clock-0011223344556677"
    for probe, age in ((old, 7200), (young, 600)):
        probe.write_bytes(b"")
        os.utime(probe, (time.time() - age, time.time() - age))
    gc(root, keep=2, grace_seconds=3600, dry_run=True)
    assert old.exists() and young.exists()
    report = gc(root, keep=2, grace_seconds=3600)
    assert report.deleted == [] and not old.exists() and young.exists()
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(".pck-")) == [young.name]


def test_a_version_whose_files_cannot_all_be_deleted_is_reported_as_deleted_with_leftovers(
    tmp_path, monkeypatch
) -> None:
    """Multi-job review F3: the commit record went (the version stopped existing), the data
    could not be deleted, and gc said the version was "skipped ... could not delete it"."""
    from portable_ckpt.errors import StorageError
    from portable_ckpt.storage.local import LocalStorage

    root = tmp_path / "r"
    old = save_step(root, 1)
    save_step(root, 2)

    def refuse(self, prefix):  # type: ignore[no-untyped-def]
        raise StorageError(f"delete {prefix!r}: Permission denied (errno 13)", path=prefix)

    monkeypatch.setattr(LocalStorage, "delete_prefix", refuse)
    rep = gc(root, keep=1, grace_seconds=0)
    assert rep.deleted == [old] and rep.complete
    assert [d["id"] for d in rep.left_behind] == [old]
    assert "Permission denied" in rep.left_behind[0]["message"]
    monkeypatch.undo()
    assert gc(root, keep=1, grace_seconds=0).abandoned == [old]  # the next gc removes them


def test_retire_abandoned_doubts_a_copied_root(tmp_path) -> None:
    """Attack review 3 F13: in a root copied newest first (a backup, a migration) the store's
    times are the copy's: a version from a host 1 h ahead came "later by both clocks" than the
    two newest, and ``gc --retire-abandoned`` deleted them (exit 0). The store's time between
    two records must also match the writers' (within a minute) before anything is retired."""
    import datetime as dt

    root = tmp_path / "r"
    ids = {s: save_step(root, s, float(s)) for s in (1, 2, 3, 4)}
    record = root / ids[2] / "manifest.json"
    doc = json.loads(record.read_text())
    when = dt.datetime.strptime(doc["committed_at"], "%Y-%m-%dT%H:%M:%S.%fZ")
    doc["committed_at"] = (when + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    record.write_text(json.dumps(doc))
    now = time.time()
    for i, s in enumerate((4, 3, 2, 1)):  # copied newest first, a second apart
        os.utime(root / ids[s] / "manifest.json", (now + i, now + i))
    res = cli("gc", str(root), "--keep", "1", "--retire-abandoned")
    assert res.returncode == 1, (res.stdout, res.stderr)
    for s in (3, 4):
        assert f"kept    {ids[s]}  (--retire-abandoned: its committed_at" in res.stdout
    assert "the root was copied" in res.stdout and "(--retire-abandoned)\n" not in res.stdout
    assert portable_ckpt.open(str(root)).step == 4


def test_ls_latest_stops_at_unreadable_verification_records_and_prints_the_raw_path(
    tmp_path,
) -> None:
    """Attack review 3 F3: a version whose verification records could not be read (one may
    have failed) was printed, exit 0, where a restore stops (R-DRILL-12: PCK-STORAGE). F14: the path printed for scripts
    was escaped as in a table, so a root with a tab in its name printed a path that does not
    exist."""
    from portable_ckpt.io.annotations import write_verification_record

    root = tmp_path / "w\ttab"
    save_step(root, 1)
    newest = save_step(root, 2)
    res = cli("ls", str(root), "--latest")
    assert res.returncode == 0 and res.stdout == f"{root / newest}\n", res.stdout
    assert os.path.isdir(res.stdout[:-1])
    write_verification_record(open_storage(root), newest, ok=False, mode="deep", fraction=None,
                              chunks=1, errors=[{"code": "PCK-CHECKSUM", "message": "x"}])
    os.chmod(root / newest / "verifications", 0)
    try:
        res = _unprivileged("ls", str(root), "--latest")
    finally:
        os.chmod(root / newest / "verifications", 0o755)
    assert res.returncode == 69 and res.stdout == "", res.stdout  # a permission (S2)
    assert f"the verification records of {newest} could not be read" in res.stderr


def test_verify_record_unreadable_takes_a_persistently_unreadable_version_out(tmp_path) -> None:
    """Attack review 3 F18: a data file that stays unreadable (a bad sector, a lost ACL) made
    every restart stop on PCK-STORAGE (rightly: a storage error is not damage), and no tool
    could record the version as failed. ``verify --deep --record-unreadable`` does, once the
    file failed two reads; a plain ``--deep`` records nothing."""
    root = tmp_path / "r"
    save_step(root, 1)
    newest = save_step(root, 2)
    data = next(p for p in (root / newest / "data").iterdir())
    assert cli("verify", str(root), "--record-unreadable").returncode == 2  # needs --deep
    os.chmod(data, 0)
    try:
        plain = _unprivileged("verify", str(root), "--deep")
        assert plain.returncode == 1 and "PCK-STORAGE" in plain.stdout
        assert not any(v.verification_failed for v in list_versions(root))
        res = _unprivileged("verify", str(root), "--deep", "--record-unreadable")
    finally:
        os.chmod(data, 0o644)
    assert res.returncode == 1 and "recorded" in res.stderr, (res.stdout, res.stderr)
    failed = [v for v in list_versions(root) if v.verification_failed]
    assert [v.id for v in failed] == [newest]
    assert cli("ls", str(root), "--latest").stdout.strip().endswith(
        list_versions(root)[0].id)


def test_a_record_of_a_newer_major_version_is_unknown_not_absent(tmp_path) -> None:
    """Compatibility review F3: a verification record of format 2.0 (a failure, perhaps) was
    dropped as "no record": the version counted as good, and gc --keep 1 deleted the others."""
    from portable_ckpt.io.annotations import write_verification_record

    root = tmp_path / "r"
    first = save_step(root, 1)
    newest = save_step(root, 2)
    rel = write_verification_record(open_storage(root), newest, ok=False, mode="deep",
                                    fraction=None, chunks=1,
                                    errors=[{"code": "PCK-CHECKSUM", "message": "x"}])
    doc = json.loads((root / rel).read_text())
    doc["format_version"] = "2.0"
    (root / rel).write_text(json.dumps(doc))
    from portable_ckpt.io import annotations

    annotations._RECORDS.clear()
    v = {x.id: x for x in list_versions(root)}[newest]
    assert v.annotations_unreadable and "2.0" in (v.error or "")
    rep = gc(root, keep=1, grace_seconds=0.0)
    assert first in rep.kept and not rep.deleted and not rep.complete
    # "cannot tell", never "none"; a newer format is mended by an upgrade, not by waiting (S2)
    assert cli("ls", str(root), "--latest").returncode == 69


def test_ls_latest_reads_the_newest_levels_only(tmp_path) -> None:
    """Serving review F4: a poll (`ls --latest`) read every record of the root (and every
    verification, drill and copy record): ~1,000 requests on S3 for 300 versions. It reads the
    newest step levels now, down to the first version it can answer with. Abandoned attempts
    above it are named on stderr five at a time, not one line each."""
    from tests._strace import strace_or_skip

    strace = strace_or_skip()
    ids = [save_step(tmp_path, s, float(s)) for s in range(1, 13)]
    storage = open_storage(tmp_path)
    for s in range(13, 21):  # abandoned attempts above the latest: data, no record
        w = ShardWriter(storage, new_attempt_id(s), 0)
        w.add_tensor("w", np.zeros((2, 2), np.float32))
        w.finish()
    trace = tmp_path.parent / f"{tmp_path.name}.trace"
    res = subprocess.run(
        [strace, "-f", "-qq", "-e", "trace=openat", "-o", str(trace), sys.executable, "-m",
         "portable_ckpt.cli.main", "ls", str(tmp_path), "--latest"],
        capture_output=True, text=True, timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(tmp_path / ids[-1])
    opened = trace.read_text()  # the local backend opens an attempt's directory, then its files
    assert f"{ids[-1]}\"" in opened
    assert not any(i in opened for i in ids[:-1])  # the older levels were not read
    passed = [ln for ln in res.stderr.splitlines() if "passed over" in ln]
    assert len(passed) == 6 and "more attempts passed over" in passed[-1], res.stderr


def test_the_cli_with_stdout_closed_does_nothing_and_says_so(tmp_path) -> None:
    """Scripting review F1, F2: with stdout closed (`>&-`) the CLI printed an internal error
    and a traceback, exit 1, after `gc` had deleted versions; `ls --latest > /dev/full` was an
    internal error too. Now: exit 74 before anything is touched; 74 for a full output."""
    ids = [save_step(tmp_path, s) for s in (1, 2, 3)]
    res = subprocess.run(
        [sys.executable, "-m", "portable_ckpt.cli.main", "gc", str(tmp_path), "--keep", "1",
         "--grace", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120,
        preexec_fn=lambda: os.close(1),
    )
    assert res.returncode == 74 and "Traceback" not in res.stderr, res.stderr
    assert "nothing was done" in res.stderr
    assert sorted(v.id for v in list_versions(tmp_path)) == sorted(ids)
    with open("/dev/full", "w") as full:
        res = subprocess.run([sys.executable, "-m", "portable_ckpt.cli.main", "ls",
                              str(tmp_path), "--latest"], stdout=full,
                             stderr=subprocess.PIPE, text=True, timeout=120)
    assert res.returncode == 74 and "internal error" not in res.stderr, res.stderr


def test_a_deep_verification_that_could_not_be_recorded_fails(tmp_path) -> None:
    """Scripting review F9: the record asked for could not be written, gc and managers did not
    learn the outcome, and `verify --deep` exited 0 (`copy` fails in the same case). A
    permission does not pass by waiting: 1, not 75 (F6)."""
    aid = save_step(tmp_path, 1)
    os.chmod(tmp_path / aid, 0o555)  # no verifications/ can be made in it
    try:
        res = _unprivileged("verify", "--deep", str(tmp_path / aid))
    finally:
        os.chmod(tmp_path / aid, 0o755)
    assert res.returncode == 1, (res.stdout, res.stderr)
    # A problem of the run, in ok and on stdout with the verdict (SRE review 2, W3: stderr only,
    # after "OK").
    [problem, verdict] = res.stdout.splitlines()
    assert problem.startswith("PCK-STORAGE  the verification was not recorded"), res.stdout
    assert verdict.startswith("FAIL (1 problem)"), res.stdout


def test_ls_notes_go_to_stderr_and_stdout_is_the_table(tmp_path) -> None:
    """Scripting review F10: the note on foreign entries was printed on stdout around the
    table, breaking `tail`/`awk` on it."""
    save_step(tmp_path, 1)
    (tmp_path / "notes.txt").write_text("not a version")
    res = cli("ls", str(tmp_path))
    assert res.returncode == 0
    assert "not this format's" in res.stderr and "not this format's" not in res.stdout
    assert res.stdout.splitlines()[0].startswith("ID")


def test_ls_of_a_sweep_names_the_roots_below(tmp_path) -> None:
    """Fine-tuning review F8: `ls sweep` said "No attempts" and called the runs' roots "not
    this format's"; it names each subdirectory that is a root, with the command to list it."""
    for run in ("lr1e-3", "lr3e-4"):
        save_step(tmp_path / run, 1)
    (tmp_path / "notes").mkdir()
    r = cli("ls", str(tmp_path))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"no attempts under {tmp_path}"
    assert lines[1:] == [f"{run}/ is a checkpoint root: portable-ckpt ls {tmp_path}/{run}/"
                         for run in ("lr1e-3", "lr3e-4")]


def test_gc_of_a_folder_of_roots_names_each_root(tmp_path) -> None:
    """Framework review 26, F2: torchtitan's ``<folder>/step-N`` roots: `gc <folder> --keep 1`
    said ``kept 0: -`` and exit 0, nothing more; it names each root with the gc to run (on
    stderr: stdout is the report) and deletes nothing."""
    for run in ("step-2", "step-4"):
        save_step(tmp_path / run, int(run[-1]))
    r = cli("gc", str(tmp_path), "--keep", "1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1].startswith("kept 0: -")
    assert r.stderr.splitlines() == [
        f"{run}/ is a checkpoint root: portable-ckpt gc --keep 1 {tmp_path}/{run}/"
        for run in ("step-2", "step-4")]
    assert all(len(list_versions(tmp_path / run)) == 1 for run in ("step-2", "step-4"))
    one = cli("gc", str(tmp_path / "step-2"), "--keep", "1")
    assert one.returncode == 0 and "checkpoint root" not in one.stderr


def test_open_of_a_path_inside_a_version_names_the_version(tmp_path) -> None:
    """Maintainer review M9: `open("<root>/<attempt>/data")` said "no committed version for any
    step under .../data" while `ls` of the same path named the version; one rule for both."""
    attempt = save_step(tmp_path, 1)
    err = None
    try:
        portable_ckpt.open(tmp_path / attempt / "data")
    except portable_ckpt.CheckpointError as e:
        err = e
    assert err is not None and err.code == "PCK-NOT-FOUND"
    assert f"lies inside the version {tmp_path / attempt}, not a root" in err.message
    assert f"its root '{tmp_path}'" in err.message
    assert portable_ckpt.open(tmp_path / attempt).step == 1
    r = cli("ls", str(tmp_path / attempt / "data"))
    assert r.returncode == 2 and str(tmp_path / attempt) in r.stderr


def test_ls_names_the_code_of_each_invalid_attempt_and_verify_tells_an_empty_attempt(
    tmp_path,
) -> None:
    """Docs review 21, F6 and F9: the runbook tells a lost commit record (PCK-MANIFEST-MISSING)
    from a damaged one by its code, which ``ls`` did not show (the row was dashes); and verify
    of an empty attempt directory said it "does not exist (any more...)"."""
    lost, damaged = save_step(tmp_path, 1), save_step(tmp_path, 2)
    write_drill_record(open_storage(tmp_path), lost, {
        "ok": True, "started_at": "2026-11-29T00:00:00Z", "finished_at": "2026-11-29T00:00:01Z",
        "world_size": 2, "saved_world_size": 2, "contract": "exact", "error": None,
        "measurements": {"restore_seconds": 1.0, "restore_bytes": 10, "restore_mib_per_s": 1.0,
                         "slowest_rank_seconds": 1.0, "peak_temp_bytes_per_rank": [1, 1],
                         "first_step_seconds": 0.1}})
    os.remove(tmp_path / lost / "manifest.json")
    (tmp_path / damaged / "manifest.json").write_text("{not json")
    empty = new_attempt_id(3)
    (tmp_path / empty).mkdir()
    r = cli("ls", str(tmp_path))
    assert r.returncode == 0, r.stderr
    said = {line.split(":", 2)[1].strip(): line for line in r.stderr.splitlines()
            if line.startswith("portable-ckpt: s")}
    assert "[PCK-MANIFEST-MISSING]" in said[lost] and "recommit" in said[lost]
    assert "[PCK-JSON-INVALID]" in said[damaged]
    assert f"portable-ckpt verify {tmp_path}/{damaged}" in said[damaged]
    assert empty not in said  # incomplete, not invalid
    assert "[PCK-" not in r.stdout  # the table a script parses is unchanged
    v = cli("verify", str(tmp_path / empty))
    assert v.returncode == 1
    assert "holds no file and no manifest.json" in v.stdout + v.stderr
    assert "any more" not in v.stdout + v.stderr


def test_ls_drill_column_shows_the_newest_drill(tmp_path, capsys) -> None:
    """On-call review 23, F8: DRILL said `passed` whenever any drill had passed, so a weekly
    drill that failed afterwards left the column green. The newest drill decides (by
    ``finished_at``), and an earlier pass is said."""
    from portable_ckpt.cli.main import main as cli_main

    (vid,) = [save_step(tmp_path, 1)]

    def drill(ok: bool, at: str) -> None:
        write_drill_record(open_storage(tmp_path), vid, {
            "ok": ok, "started_at": at, "finished_at": at, "world_size": 1, "saved_world_size": 1,
            "contract": "exact", "measurements": {},
            "error": None if ok else {"code": "PCK-DRILL", "message": "loss differs"}})

    def cell() -> str:
        assert cli_main(["ls", str(tmp_path)]) == 0
        (row,) = [line for line in capsys.readouterr().out.splitlines() if vid in line]
        return row

    drill(False, "2026-11-28T00:00:00Z")
    assert "failed" in cell() and "passed" not in cell()
    drill(True, "2026-11-29T00:00:00Z")
    assert " passed " in cell() + " " and "failed" not in cell()
    drill(False, "2026-11-30T00:00:00Z")  # the newest failed: no longer green
    assert "failed (passed before)" in cell()


def test_ls_names_a_newer_attempt_that_lost_its_record(tmp_path, capsys) -> None:
    """On-call review 23, N5: a newest version whose `manifest.json` was lost is `incomplete`
    in `ls`, and only a restore named it: `ls` says that every writer's index is there, with
    the recommit; an older such attempt, or one missing an index, is not named."""
    from portable_ckpt.cli.main import main as cli_main

    save_step(tmp_path, 1)
    lost = save_step(tmp_path, 2)
    os.remove(tmp_path / lost / "manifest.json")
    assert cli_main(["ls", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert f"{lost}: no commit record, but every writer's index" in err
    assert f"portable-ckpt recommit {tmp_path / lost} --was-committed" in err
    for index in (tmp_path / lost / "index").iterdir():  # a save cut short earlier: nothing
        index.unlink()
        break
    assert cli_main(["ls", str(tmp_path)]) == 0
    assert "no commit record, but every writer's index" not in capsys.readouterr().err


def test_verify_all_names_a_newer_attempt_that_lost_its_record(tmp_path, capsys) -> None:
    """On-call review 23 (left open): `ls` and a restore named a newer attempt without commit
    record that holds every writer's index, and the nightly `verify ROOT --all` said nothing of
    it. It names it on stderr and in `--json` (`uncommitted`), with no change to the exit
    status; one that a gc was deleting (a deletion mark, R-GC-13) is not named."""
    import json

    from portable_ckpt.cli.main import main as cli_main
    from portable_ckpt.io.deletion import mark_deletion
    from portable_ckpt.storage import open_storage

    save_step(tmp_path, 1)
    lost = save_step(tmp_path, 2)
    os.remove(tmp_path / lost / "manifest.json")
    assert cli_main(["verify", str(tmp_path), "--all"]) == 0
    err = capsys.readouterr().err
    assert f"{lost}: no commit record, but every writer's index" in err, err
    assert cli_main(["verify", str(tmp_path), "--all", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["uncommitted"] == [lost]
    mark_deletion(open_storage(tmp_path), lost, reason="retention")
    assert cli_main(["verify", str(tmp_path), "--all", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["uncommitted"] == [] and "no commit record" not in err


def test_gc_text_for_a_lost_record_names_recommit_and_no_save(tmp_path, capsys) -> None:
    """S3 review 24, L5: `gc --delete-invalid --dry-run` called a version whose record was lost
    "a save may be in progress", and the summary of kept damaged versions said to replace the
    record "by hand" without naming `recommit`."""
    from portable_ckpt.cli.main import main as cli_main
    from portable_ckpt.io.annotations import write_verification_record
    from portable_ckpt.storage import open_storage

    lost = save_step(tmp_path, 1, 1.0)
    save_step(tmp_path, 2, 2.0)
    write_verification_record(open_storage(tmp_path), lost, ok=True, mode="deep",
                              fraction=None, chunks=1)
    os.remove(tmp_path / lost / "manifest.json")
    assert cli_main(["gc", str(tmp_path), "--keep", "1"]) == 1
    out, err = capsys.readouterr()
    assert "recommit ROOT/ID" in err and "aws s3 cp" in err, err
    assert cli_main(["gc", str(tmp_path), "--keep", "1", "--delete-invalid", "--dry-run"]) == 0
    out, err = capsys.readouterr()
    line = next(x for x in out.splitlines() if lost in x)
    assert "deleted as asked once it has passed" in line and "save" not in line, line


def test_ls_sizes_attempts_without_a_valid_record_by_what_they_store(tmp_path) -> None:
    """A killed save takes space until gc removes it: ``ls`` gives the bytes stored under an
    incomplete or invalid attempt (it showed ``-`` and ``bytes: 0``), marked ``stored``."""
    save_step(tmp_path, 10)
    dead = save_step(tmp_path, 20)
    os.remove(tmp_path / dead / "manifest.json")  # a save killed before its commit
    damaged = save_step(tmp_path, 30)
    (tmp_path / damaged / "manifest.json").write_text("{")
    stored = {a: sum(p.stat().st_size for p in (tmp_path / a).rglob("*") if p.is_file())
              for a in (dead, damaged)}
    assert all(n > 100 for n in stored.values())
    r = cli("ls", "--json", str(tmp_path))
    rows = {v["id"]: v for v in json.loads(r.stdout)["versions"]}
    for a in (dead, damaged):
        assert (rows[a]["bytes"], rows[a]["bytes_stored"]) == (stored[a], True)
    committed = next(v for v in rows.values() if v["step"] == 10)
    assert "bytes_stored" not in committed and committed["bytes"] > 0
    table = cli("ls", str(tmp_path)).stdout
    line = next(x for x in table.splitlines() if x.startswith(dead))
    assert " stored " in line and " - " not in line.split("incomplete")[1].split("stored")[0]


@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_verify_all_counts_an_older_version_whose_records_cannot_be_read(
    tmp_path, capsys, kind: str
) -> None:
    """Left open by stop 27: an older version whose ``verifications`` is no directory (its
    records cannot be read; `ls` calls it unreadable, a restore stops at it) was "OK" in
    `verify ROOT --all`, exit 0, and a plain `verify` of it said nothing. It is a problem of
    the root now: named with its code, not counted OK, exit 1, listed in ``--json``."""
    import json

    from portable_ckpt.cli.main import main as cli_main

    older = save_step(tmp_path, 1)
    save_step(tmp_path, 2)
    records = tmp_path / older / "verifications"
    if kind == "file":
        records.write_text("x")
    else:
        (tmp_path / "elsewhere").mkdir()
        os.symlink(tmp_path / "elsewhere", records)
    capsys.readouterr()
    assert cli_main(["verify", str(tmp_path / older)]) == 0  # its bytes: fine, and said
    assert "verifications is no directory" in capsys.readouterr().err
    assert cli_main(["verify", str(tmp_path), "--all"]) == 1
    out = capsys.readouterr().out
    assert f"PCK-STORAGE  {older}: its verification records cannot be read" in out, out
    assert "1 of 2 committed versions OK (1 more without a problem in this check, but its " \
        "verification records cannot be read); the newest a manager restores" in out, out
    assert cli_main(["verify", str(tmp_path), "--all", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [e["attempt_id"] for e in doc["records_unreadable"]] == [older]
    assert doc["ok"] is False and doc["records_unreadable"][0]["retryable"] is False


def test_verify_root_fails_when_the_newest_versions_records_cannot_be_read(
    tmp_path, capsys
) -> None:
    """Re-attack 28, 2: `verify ROOT` said OK, exit 0, of a root whose newest version's
    verification records cannot be read (`ls --latest` exit 69: a restore stops there); and
    `verify ROOT --all` counted one version in two groups of its summary ("1 of 2 OK (1 more
    ...) (1 more ...)"). A problem of the root; each version counted once."""
    from portable_ckpt.cli.main import main as cli_main

    older = save_step(tmp_path, 1)
    newest = save_step(tmp_path, 2)
    (tmp_path / newest / "verifications").write_text("x")
    capsys.readouterr()
    assert cli_main(["verify", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"PCK-STORAGE  {newest}: its verification records could not be read" in out, out
    assert cli_main(["verify", str(tmp_path / newest)]) == 0  # the version's own bytes: fine
    (tmp_path / newest / "verifications").unlink()
    (tmp_path / older / "verifications").write_text("x")
    capsys.readouterr()
    # --deep: its record cannot be written either (where records go is no directory)
    assert cli_main(["verify", str(tmp_path), "--all", "--deep"]) == 1
    out = capsys.readouterr().out
    assert "the verification was not recorded" in out  # the version's own line says so
    assert "1 of 2 committed versions OK (1 more without a problem in this check, but its " \
        "verification records cannot be read); the newest" in out, out
