"""gc and listings on S3 (moto on loopback): 5xx while classifying, unfinished uploads, odd keys.

Issue 12 items 1, 3 and 4: a 5xx answer is not "no manifest"; gc aborts only the uploads of the
attempts it deletes (R-GC-8); keys the format did not write are foreign (R-LAYOUT-7).
"""

from __future__ import annotations

import datetime
import json
import time

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.cli.main import main as cli_main
from portable_ckpt.errors import StorageError
from portable_ckpt.io.gc import gc
from portable_ckpt.io.versions import list_versions
from portable_ckpt.io.writer import new_attempt_id
from portable_ckpt.storage import open_storage

from .conftest import S3Env

pytestmark = pytest.mark.s3


def _save(root: str, step: int) -> str:
    m = portable_ckpt.save_arrays(root, {"w": np.full(16, step, np.float32)}, step=step)
    return m.attempt_id


def _committed(root: str) -> list[str]:
    # (missing_ok: a save that published nothing may leave no object under the prefix)
    return [v.id for v in list_versions(root, missing_ok=True) if v.status == "committed"]


def test_5xx_on_the_newest_manifest_deletes_nothing(
    s3_proxied: S3Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 1 (R-GC-6, R-ID-5): an S3 500 on every try is unknown, not incomplete."""
    monkeypatch.setenv("PCK_S3_MAX_ATTEMPTS", "2")
    root = s3_proxied.root("run")
    ids = [_save(root, s) for s in (1, 2, 3)]
    proxy = s3_proxied.proxy
    proxy.match_path = rf"{ids[2]}/manifest\.json"
    proxy.fail_every = 1
    rep = gc(root, keep=1, grace_seconds=0.0)
    assert [u["id"] for u in rep.unknown] == [ids[2]] and ids[2] not in rep.abandoned
    with pytest.raises(StorageError, match=ids[2]):
        portable_ckpt.open(root)
    proxy.reset()
    assert _committed(root) == ids[1:] and portable_ckpt.open(root).id == ids[2]


def _start_upload(storage: object, attempt: str, name: str) -> object:
    w = storage.open_writer(f"{attempt}/data/{name}")  # type: ignore[attr-defined]
    w.write(b"\x01" * (5 << 20))  # one full part: a multipart upload with a part is under way
    return w


def test_gc_keeps_the_uploads_of_a_save_in_progress(
    s3: S3Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 3 (R-GC-8): the in-progress attempt's multipart upload survives gc; close() works."""
    monkeypatch.setenv("PCK_S3_PART_SIZE", str(5 << 20))
    root = s3.root("run")
    old = [_save(root, s) for s in (1, 2)]
    storage = open_storage(root)
    attempt = new_attempt_id(3)
    w = _start_upload(storage, attempt, "w00000-0000.safetensors")
    storage.put(f"{attempt}/entries/x.g.json", b"{}")  # the save is active right now
    rep = gc(root, keep=1, grace_seconds=600.0)
    assert rep.deleted == [old[0]] and rep.abandoned == [] and rep.aborted_uploads == 0
    w.write(b"tail")  # type: ignore[attr-defined]
    w.close()  # type: ignore[attr-defined]
    assert storage.size(f"{attempt}/data/w00000-0000.safetensors") == (5 << 20) + 4


def test_grace_counts_an_old_attempts_upload_activity(
    s3: S3Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-GC-4: an attempt's last activity includes its unfinished uploads' newest activity.

    Test audit 21, finding 1: the attempt id here is 5 h old and the attempt's only object is
    an unfinished multipart upload whose part was sent just now (a slow save of one big file),
    so the upload's activity alone decides. gc with a 1 h grace must neither abandon the
    attempt nor abort its upload; the writer then finishes. Dated 2 h on, it is abandoned."""
    monkeypatch.setenv("PCK_S3_PART_SIZE", str(5 << 20))
    root = s3.root("run")
    keep = _save(root, 1)
    storage = open_storage(root)
    started = time.time() - 5 * 3600
    attempt = new_attempt_id(2, now=datetime.datetime.fromtimestamp(started, datetime.UTC))
    w = _start_upload(storage, attempt, "w00000-0000.safetensors")
    assert list(storage.list(f"{attempt}/")) == []  # nothing but the upload: no file dates it
    rep = gc(root, keep=1, grace_seconds=3600.0)
    assert rep.abandoned == [] and rep.aborted_uploads == 0, rep.to_json()
    assert [g["id"] for g in rep.in_grace] == [attempt], rep.to_json()
    later = gc(root, keep=1, grace_seconds=3600.0, dry_run=True, now=lambda: time.time() + 7200)
    assert later.abandoned == [attempt], later.to_json()  # quiet for 2 h: it would go
    w.write(b"tail")  # type: ignore[attr-defined]
    w.close()  # type: ignore[attr-defined]
    assert storage.size(f"{attempt}/data/w00000-0000.safetensors") == (5 << 20) + 4
    assert _committed(root) == [keep]


def test_gc_aborts_uploads_only_of_attempts_it_deletes(
    s3: S3Env, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Item 3 (R-GC-8, R-GC-5): a dead writer's upload goes with its attempt; others stay."""
    monkeypatch.setenv("PCK_S3_PART_SIZE", str(5 << 20))
    root = s3.root("run")
    keep = _save(root, 1)
    storage = open_storage(root)
    dead = new_attempt_id(2)  # a killed writer: nothing but an unfinished upload
    _start_upload(storage, dead, "w00000-0000.safetensors")
    client = s3.boto()
    client.create_multipart_upload(Bucket=s3.bucket, Key="run/notes/upload.bin")
    assert [v.id for v in list_versions(root)] == [keep]  # invisible to listings
    rep = gc(root, keep=1, grace_seconds=0.0, now=lambda: time.time() + 60, dry_run=True)
    assert rep.abandoned == [dead] and rep.aborted_uploads == 0
    # the command line: what it aborted is said in its text too (S3 review 24, L2: only --json)
    time.sleep(1.1)  # (S3 dates to the second: the upload, begun just now, is then in the past)
    assert cli_main(["gc", root, "--keep", "1", "--grace", "0"]) == 0
    assert "aborted 1 unfinished upload(s)" in capsys.readouterr().out
    left = [u["Key"] for u in client.list_multipart_uploads(Bucket=s3.bucket).get("Uploads", [])]
    assert left == ["run/notes/upload.bin"]
    assert _committed(root) == [keep]


_ODD = ["../x", "/x", "./x", "a//b", "{a}//x", "{a}/data/../../x", "{a}/./y", "x\\y"]


def test_odd_keys_are_foreign_and_harmless(s3: S3Env, capsys: pytest.CaptureFixture[str]) -> None:
    """Item 4 (R-LAYOUT-7): open/ls/inspect/verify/gc work; odd keys are reported, never deleted."""
    root = s3.root("run")
    ids = [_save(root, s) for s in (1, 2)]
    client = s3.boto()
    odd = [k.format(a=ids[0]) for k in _ODD]
    for key in odd:
        client.put_object(Bucket=s3.bucket, Key=f"run/{key}", Body=b"odd")
    assert portable_ckpt.open(root).id == ids[1]
    assert portable_ckpt.open(root).verify(deep=True) == []
    assert cli_main(["ls", root, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [v["id"] for v in doc["versions"]] == ids
    assert doc["foreign_key_count"] >= 3 and "../" in doc["foreign_keys"], doc["foreign_keys"]
    for argv in (["inspect", root], ["verify", root, "--deep"], ["verify", f"{root}/{ids[0]}"]):
        assert cli_main(argv) == 0, argv
    capsys.readouterr()
    rep = gc(root, keep=1, grace_seconds=0.0)
    assert rep.deleted == [ids[0]] and rep.complete
    inside = {k for k in odd if k.startswith(ids[0])}
    assert set(rep.foreign_keys) == inside
    keys = {o["Key"][4:] for o in client.list_objects_v2(Bucket=s3.bucket)["Contents"]}
    assert set(odd) <= keys, "gc deleted a foreign key"
    assert not [k for k in keys if k.startswith(ids[0]) and k not in inside]
    # The attempt left with only foreign keys is not reported as abandoned again and again.
    rep2 = gc(root, keep=1, grace_seconds=0.0)
    assert rep2.abandoned == [] and rep2.deleted == [] and set(rep2.foreign_keys) == inside
    # The command line names them as URLs a person can look up and remove (S3 review 24, L3:
    # `ls` said "/, a/" for `run//x` and `run/a//b`).
    assert cli_main(["ls", root]) == 0
    err = capsys.readouterr().err
    assert f"{root}//" in err and f"{root}/a/" in err, err
    assert cli_main(["gc", root, "--keep", "1", "--grace", "0"]) == 0
    out = capsys.readouterr().out
    assert f"{root}/{ids[0]}//x" in out and "remove them by hand" in out, out
    # `ls --latest` passed over a newer attempt holding only such a key as "a save in
    # progress", at every poll
    newer = new_attempt_id(99)
    client.put_object(Bucket=s3.bucket, Key=f"run/{newer}//x", Body=b"odd")
    assert cli_main(["ls", root, "--latest"]) == 0
    err = capsys.readouterr().err
    assert f"{newer} passed over: it holds no file of this format" in err, err


def test_folder_markers_and_control_keys_are_foreign_and_kept(s3: S3Env) -> None:
    """Outside review, round 2: obstore lists a folder marker ``<id>/`` as ``<id>``, another key
    above the attempt; gc deleted that key (and never the marker). A key with a tab blocked
    every gc run. Both are foreign now: reported, never deleted (R-LAYOUT-7)."""
    root = s3.root("run")
    ids = [_save(root, s) for s in (1, 2, 3)]
    client = s3.boto()
    beside = f"run/{ids[0]}"  # a user's object named like the attempt, beside it
    odd = [f"run/{ids[0]}/", f"run/{ids[0]}/data/", f"run/{ids[1]}/data/x\ty"]
    for key in [beside, *odd]:
        client.put_object(Bucket=s3.bucket, Key=key, Body=b"")
    rep = gc(root, keep=1, grace_seconds=0.0)
    assert sorted(rep.deleted) == ids[:2] and rep.complete, rep.to_json()
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=s3.bucket)["Contents"]}
    assert beside in keys, "gc deleted an object outside the attempt"
    assert set(odd) <= keys, "gc deleted a foreign key"
    assert not [k for k in keys if k.startswith(f"run/{ids[0]}/") and k not in odd]
    assert {f"{ids[0]}/", f"{ids[0]}/data/", f"{ids[1]}/data/x\ty"} <= set(rep.foreign_keys)
    # Nothing but foreign keys left: not deleted again and again on every run.
    rep2 = gc(root, keep=1, grace_seconds=0.0)
    assert rep2.deleted == [] and rep2.abandoned == [], rep2.to_json()
    assert portable_ckpt.open(root).id == ids[2]


def test_ls_shows_an_attempt_that_is_only_unfinished_uploads(
    s3: S3Env, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A save killed while its only object was uploading: its parts are stored (and billed),
    but ``ls`` said the root held one version (SRE review F4); gc already found it."""
    from portable_ckpt.cli.main import main

    monkeypatch.setenv("PCK_S3_PART_SIZE", str(5 << 20))
    root = s3.root("run")
    keep = _save(root, 1)
    dead = new_attempt_id(2)
    _start_upload(open_storage(root), dead, "w00000-0000.safetensors")
    assert main(["ls", root, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(v["id"], v["status"]) for v in doc["versions"]] == [(keep, "committed"),
                                                                 (dead, "incomplete")]
    assert [v.id for v in list_versions(root)] == [keep]  # readers still list versions only
    # An upload keyed <root>/<attempt id> (no directory) is no attempt's: gc reported it deleted
    # on every run and never aborted it (attack review F2).
    phantom = new_attempt_id(3)
    w = open_storage(root).open_writer(phantom)
    w.write(b"\x01" * (5 << 20))
    assert main(["ls", root, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert phantom not in [v["id"] for v in doc["versions"]]
    w.abort()


def test_a_listing_of_many_versions_asks_for_them_at_once_in_order(s3: S3Env) -> None:
    """Ops review F4: each version of an S3 root costs several round trips, and they were
    made one version after another; several versions are now classified at once. The listing
    is the same: every status, in the order of §3."""
    from portable_ckpt.io.versions import LISTING_CONCURRENCY

    root = s3.root()
    ids = [portable_ckpt.save_arrays(root, {"w": np.arange(4.0)}, step=s).attempt_id
           for s in range(LISTING_CONCURRENCY + 4)]
    storage = open_storage(root)
    broken = ids[5]
    storage.put(f"{broken}/manifest.json", b"{}")  # an invalid record among them
    pending = new_attempt_id(7)
    storage.put(f"{pending}/data/x", b"x")  # an attempt without a record
    got = list_versions(root)
    assert [v.id for v in got if v.id != pending] == ids
    status = {v.id: v.status for v in got}
    assert status[broken] == "invalid" and status[pending] == "incomplete"
    assert sum(s == "committed" for s in status.values()) == len(ids) - 1


def test_gc_aborts_orphan_uploads_of_listed_files_in_kept_versions(
    s3: S3Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ops review F9 (R-GC-8): a retried CreateMultipartUpload left uploads under a committed
    version, billed for as long as it was kept. gc aborts those of files the commit record lists,
    once older than the grace period, by exact key; other uploads of the version stay."""
    monkeypatch.setenv("PCK_S3_PART_SIZE", str(5 << 20))
    root = s3.root("run")
    keep = _save(root, 1)
    storage = open_storage(root)
    (listed,) = portable_ckpt.open(root).manifest.files
    client = s3.boto()
    orphan = _start_upload(storage, keep, listed.rsplit("/", 1)[1])  # one part: dated now
    assert orphan is not None
    client.create_multipart_upload(Bucket=s3.bucket, Key=f"run/{keep}/notes.bin")  # not listed

    def left() -> list[str]:
        ups = client.list_multipart_uploads(Bucket=s3.bucket).get("Uploads", [])
        return sorted(u["Key"].removeprefix("run/") for u in ups)

    rep = gc(root, keep=1, grace_seconds=600.0)  # within the grace period: kept
    assert rep.aborted_uploads == 0 and len(left()) == 2 and rep.complete
    later = lambda: time.time() + 3600  # noqa: E731
    rep = gc(root, keep=1, grace_seconds=600.0, now=later, dry_run=True)
    assert rep.aborted_uploads == 1 and len(left()) == 2
    rep = gc(root, keep=1, grace_seconds=600.0, now=later)
    assert rep.aborted_uploads == 1 and rep.deleted == [] and rep.complete
    assert left() == [f"{keep}/notes.bin"]
    assert portable_ckpt.open(root).id == keep and portable_ckpt.open(root).verify(deep=True) == []


def test_one_spurious_404_on_a_commit_record_deletes_nothing_and_skips_nothing(
    s3_proxied: S3Env, capsys: pytest.CaptureFixture[str]
) -> None:
    """S3 latency review F1, F2: one 404 on the read of the newest commit record (a store's
    replication lag, a caching gateway) made gc delete that committed version, and readers
    restore the one before without a word. The record is listed: it is asked again."""
    root = s3_proxied.root("run")
    ids = [_save(root, s) for s in (1, 2, 3)]
    proxy = s3_proxied.proxy

    def one_404(method: str | None = "GET", limit: int | None = 1) -> None:
        proxy.reset()
        proxy.match_method, proxy.match_path = method, rf"{ids[2]}/manifest\.json"
        proxy.fail_status, proxy.fail_every, proxy.fail_limit = (404, "NoSuchKey"), 1, limit

    one_404()
    rep = gc(root, keep=10, grace_seconds=0.0)
    assert proxy.log.injected_by_status == {404: 1}
    assert rep.deleted == rep.abandoned == [] and rep.complete and ids[2] in rep.kept
    one_404()
    assert portable_ckpt.open(root).id == ids[2]
    one_404()
    assert _committed(root) == ids
    # A store that keeps answering "absent" for a record it lists: nothing is decided.
    one_404(method=None, limit=None)
    with pytest.raises(StorageError, match="yet lists it"):
        portable_ckpt.open(root)
    rep = gc(root, keep=1, grace_seconds=0.0)
    assert [u["id"] for u in rep.unknown] == [ids[2]] and not rep.abandoned
    assert cli_main(["ls", root]) == 75  # an inconsistent store: it may pass (SRE review)
    assert "yet lists it" in capsys.readouterr().err
    proxy.reset()
    assert _committed(root) == ids[1:]  # the unknown newest stays; keep=1 kept the one before
    assert portable_ckpt.open(root).id == ids[2]


def test_a_store_that_does_not_check_uploads_is_found_out_and_a_corrupt_commit_not_published(
    s3_proxied: S3Env, caplog: pytest.LogCaptureFixture
) -> None:
    """S3 latency review F8: moto (and other S3-compatible stores) store an upload whose
    x-amz-checksum-crc32c is wrong and echo the header back: a bit flipped in transit in the
    commit record was published, and save reported success. The store is probed once; where it
    does not check, commit records are read back, and no CRC32C is taken from it."""
    from portable_ckpt.io.copy import copy_version
    from portable_ckpt.storage.s3 import S3Storage

    root = s3_proxied.root("run")
    with caplog.at_level("WARNING", logger="portable_ckpt"):
        st = open_storage(root)
        assert isinstance(st, S3Storage) and st.validates_checksums() is False
    assert any("does not check uploads" in r.getMessage() for r in caplog.records)
    assert not [k for k in (s3_proxied.boto().list_objects_v2(Bucket=s3_proxied.bucket)
                            .get("Contents", [])) if "probe" in k["Key"]]  # deleted again
    proxy = s3_proxied.proxy
    proxy.match_method, proxy.match_path, proxy.flip_bodies = "PUT", r"manifest\.json", 1
    with pytest.raises(StorageError, match="kept other bytes than were sent"):
        _save(root, 1)
    proxy.reset()
    assert _committed(root) == []  # nothing published; the next save commits
    good = _save(root, 2)
    assert _committed(root) == [good] and portable_ckpt.open(root).verify(deep=True) == []
    res = copy_version(f"{root}/{good}", s3_proxied.root("copy"))
    assert res.server_checksums == 0  # an echo proves nothing: the copy's own reads verified


def _keys(s3: S3Env, prefix: str) -> list[str]:
    pages = s3.boto().get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def test_per_key_errors_of_a_bulk_delete_are_retried(s3_proxied: S3Env) -> None:
    """S3 review F9: a bulk delete answered 200 with a per-key SlowDown or InternalError.

    Such an answer is retried like a 503 (deletes are idempotent), so gc deletes the version
    whole and exits 0; a per-key code that is not transient (AccessDenied) is final, and the
    version is reported as not deleted and stays whole.
    """
    root = s3_proxied.root("run")
    ids = [_save(root, s) for s in (1, 2, 3)]
    proxy = s3_proxied.proxy
    proxy.delete_key_errors, proxy.delete_key_code = 1, "SlowDown"
    rep = gc(root, keep=2, grace_seconds=0.0)
    assert rep.deleted == [ids[0]] and rep.complete
    assert len(proxy.log.refused_keys) == 1 and proxy.log.refused_keys[0].startswith(
        f"run/{ids[0]}/")
    assert _keys(s3_proxied, f"run/{ids[0]}/") == []

    proxy.reset()
    # The commit record's delete passes; the data file's bulk delete is refused twice.
    proxy.delete_key_skip, proxy.delete_key_errors, proxy.delete_key_code = 1, 2, "InternalError"
    assert cli_main(["gc", root, "--keep", "1", "--grace", "0"]) == 0
    refused = proxy.log.refused_keys
    assert len(refused) == 2 and refused[0] == refused[1] and "/data/" in refused[0]
    assert _keys(s3_proxied, f"run/{ids[1]}/") == []
    assert _committed(root) == [ids[2]]

    ids.append(_save(root, 4))
    proxy.reset()
    proxy.delete_key_errors, proxy.delete_key_code = 1, "AccessDenied"
    rep = gc(root, keep=1, grace_seconds=0.0)
    assert rep.deleted == [] and [u["id"] for u in rep.unknown] == [ids[2]]
    assert rep.unknown[0]["status"] == "delete failed" and "AccessDenied" in rep.unknown[0]["message"]
    # The commit record goes first (R-GC-3): refused, the version stays whole and committed.
    assert proxy.log.refused_keys == [f"run/{ids[2]}/manifest.json"]
    assert _committed(root) == ids[2:]


def test_a_listed_record_answered_absent_is_read_again(s3_proxied: S3Env) -> None:
    """Attack review 2 F13: a failed verification record answered 404 once was "no record":
    the version that failed was listed as passing, and a manager restored it (R-DRILL-8). A
    listed record answered absent is read again; absent twice while listed is a storage error."""
    from portable_ckpt.io import annotations
    from portable_ckpt.io.annotations import record_verification

    root = s3_proxied.root("run")
    ids = [_save(root, s) for s in (1, 2)]
    storage = open_storage(root)
    record_verification(storage, ids[1], [{"code": "PCK-CHECKSUM", "message": "bad block"}],
                        chunks=1, mode="deep")
    annotations._RECORDS.clear()  # as in a fresh process (a cron gc): the records are read
    proxy = s3_proxied.proxy
    proxy.match_method, proxy.match_path = "GET", rf"{ids[1]}/verifications/"
    proxy.fail_status, proxy.fail_every, proxy.fail_limit = (404, "NoSuchKey"), 1, 1
    by_id = {v.id: v for v in list_versions(root)}
    assert proxy.log.injected_by_status == {404: 1}
    assert by_id[ids[1]].verification_failed and by_id[ids[1]].known
    proxy.reset()
    annotations._RECORDS.clear()
    proxy.match_method, proxy.match_path = "GET", rf"{ids[1]}/verifications/"
    proxy.fail_status, proxy.fail_every = (404, "NoSuchKey"), 1
    v = {v.id: v for v in list_versions(root)}[ids[1]]
    assert not v.known and "yet lists it" in str(v.error)
    proxy.reset()


def test_the_storage_clock_is_asked_with_a_probe_it_deletes(s3: S3Env) -> None:
    """Multi-job review F2: gc dates attempts on the storage's clock (its time for a probe)."""
    from portable_ckpt.io.gc import storage_clock

    root = s3.root("run")
    _save(root, 1)
    there = storage_clock(open_storage(root))
    assert there is not None and abs(there - time.time()) < 5  # moto runs on this host
    assert not [k for k in (s3.boto().list_objects_v2(Bucket=s3.bucket).get("Contents", []))
                if "pck-clock" in k["Key"]]


def test_pins_on_s3_keep_versions_and_a_5xx_on_them_deletes_nothing(
    s3_proxied: S3Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-PIN-1, R-GC-11 on an object store: a pinned version survives gc --keep 1; while the
    pins cannot be listed (HTTP 500 on every try) gc deletes no version."""
    from portable_ckpt.io.pins import pin, read_pins, unpin

    monkeypatch.setenv("PCK_S3_MAX_ATTEMPTS", "2")
    root = s3_proxied.root("pinned")
    ids = [_save(root, s) for s in (1, 2, 3, 4)]
    rel = pin(root, ids[0], reason="paper")
    assert rel.startswith("pins/p") and set(read_pins(root)) == {ids[0]}
    proxy = s3_proxied.proxy
    proxy.match_path = r"prefix=.*pins"
    proxy.fail_every = 1
    rep = gc(root, keep=1, grace_seconds=0.0)
    assert rep.deleted == [] and not rep.complete
    proxy.reset()
    assert _committed(root) == ids
    rep = gc(root, keep=1, grace_seconds=0.0)
    assert rep.pinned == [ids[0]] and sorted(rep.deleted) == sorted(ids[1:3])
    assert _committed(root) == [ids[0], ids[3]]
    assert unpin(root, ids[0]) == [rel] and read_pins(root) == {}


@pytest.mark.parametrize("key", ["pins//{}", "pins/{}/"])
def test_a_pin_key_that_only_looks_like_a_record_holds_every_version(s3: S3Env, key: str) -> None:
    """Attack review 5 F1 on an object store: the record moved to a key that is no plain
    path (a doubled or a trailing slash) was passed over, and gc deleted the pinned version."""
    from portable_ckpt.io.pins import pin

    root = s3.root("oddpin")
    ids = [_save(root, s) for s in (1, 2, 3)]
    rel = pin(root, ids[0])
    prefix = root.removeprefix(f"s3://{s3.bucket}/").rstrip("/")
    c = s3.boto()
    body = c.get_object(Bucket=s3.bucket, Key=f"{prefix}/{rel}")["Body"].read()
    c.delete_object(Bucket=s3.bucket, Key=f"{prefix}/{rel}")
    c.put_object(Bucket=s3.bucket, Key=f"{prefix}/" + key.format(rel.split("/")[-1]), Body=body)
    rep = gc(root, keep=1, grace_seconds=0.0)
    assert rep.deleted == [] and not rep.complete
    assert _committed(root) == ids


def test_abort_uploads_leaves_uploads_younger_than_older_than_s(
    s3: S3Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mutation audit 22 A-104: ``abort_uploads(prefix, older_than_s=...)`` aborts only uploads
    started longer ago than that: a live save's multipart upload, started a moment ago, is left
    alone and completes; one started two hours ago is aborted.

    moto lists every upload as initiated on 2010-11-10: the real listing is wrapped to report
    the time each upload was really started (as S3 does), the start of ``old`` moved back."""
    from portable_ckpt.storage.s3 import S3Storage

    mib = 1 << 20
    st = S3Storage.from_url(s3.root(), part_size=5 * mib)
    started: dict[str, datetime.datetime] = {}
    real_uploads = st._uploads

    def uploads(prefix: str) -> list[dict[str, object]]:
        return [dict(up, Initiated=started[up["Key"]]) for up in real_uploads(prefix)]

    monkeypatch.setattr(st, "_uploads", uploads)
    data = bytes(range(256)) * (6 * mib // 256)
    now = datetime.datetime.now(datetime.UTC)
    started["ckpts/att/data/live"] = now
    started["ckpts/att/data/old"] = now - datetime.timedelta(hours=2)
    live, old = st.open_writer("att/data/live"), st.open_writer("att/data/old")
    for w in (live, old):
        w.write(data)  # starts a multipart upload, in flight
        w._parts[0].result()  # type: ignore[attr-defined]
    assert st.abort_uploads("att", older_than_s=3600) == 1  # the old one only
    [left] = s3.boto().list_multipart_uploads(Bucket=s3.bucket).get("Uploads", [])
    assert left["Key"] == "ckpts/att/data/live"
    live.close()  # the upload was not aborted under the writer
    assert st.read_all("att/data/live", max_size=len(data)) == data
    old.abort()


def test_a_gc_stopped_after_the_record_went_leaves_a_version_being_deleted_on_s3(
    s3: S3Env,
) -> None:
    """R-GC-13 on an object store: the mark is an object under ``<attempt>/deleting/``, which
    the delimiter listing shows as a "directory"; a gc stopped after the commit record went
    leaves a version being deleted (not a lost record), which a later gc removes."""
    from portable_ckpt.io.annotations import write_drill_record
    from portable_ckpt.io.deletion import DELETION_DIR, mark_deletion
    from portable_ckpt.io.recommit import every_writer_indexed

    root = s3.root("marks")
    old, new = _save(root, 1), _save(root, 2)
    storage = open_storage(root)
    drill = {"ok": True, "started_at": "2030-01-01T00:00:00Z",
             "finished_at": "2030-01-01T00:00:01Z", "world_size": 1, "saved_world_size": 1,
             "contract": "exact", "measurements": {}, "error": None}
    write_drill_record(storage, old, drill)
    # what gc does up to the commit record's deletion, and no further (the process killed)
    rel = mark_deletion(storage, old, reason="retention")
    assert rel.startswith(f"{old}/{DELETION_DIR}/")
    storage.delete(f"{old}/manifest.json")  # S3 cannot tell whether it removed anything
    (v,) = [v for v in list_versions(root) if v.id == old]
    assert (v.status, v.being_deleted) == ("incomplete", True)
    assert not every_writer_indexed(storage, old)
    # (a minute on: S3 dates objects to the second, and the mark was written just now)
    rep = gc(root, keep=1, grace_seconds=0.0, now=lambda: time.time() + 60)
    assert rep.complete and rep.abandoned == [old] and not rep.damaged
    assert not list(storage.list(f"{old}/")) and _committed(root) == [new]


def test_a_stale_mark_cleared_on_s3_is_reported(s3: S3Env) -> None:
    """Mark review 24, F6: on S3 a DELETE cannot tell whether it removed anything, and the
    stale mark gc removed from a kept version was never listed in ``marks_cleared``."""
    from portable_ckpt.io.deletion import mark_deletion

    root = s3.root("stale")
    old, _ = _save(root, 1), _save(root, 2)
    storage = open_storage(root)
    rel = mark_deletion(storage, old, reason="retention")
    rep = gc(root, keep=2, grace_seconds=0.0, now=lambda: time.time() + 7200)
    assert rep.marks_cleared == [rel] and not storage.exists(rel)
    assert [v.being_deleted for v in list_versions(root)] == [False, False]
