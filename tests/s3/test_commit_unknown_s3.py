"""S3: a conditional PUT whose answers are lost never reads as "not created" (R-COMMIT-19).

The fault proxy forwards the ``PUT`` of a commit record to the server and answers ``500``, the
retry's ``412`` too, so the client never hears that the record was stored. Before, the save
raised PCK-STORAGE and deleted the data of the version that readers then took for the latest.
"""

from __future__ import annotations

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.errors import CommitOutcomeUnknownError
from portable_ckpt.io.versions import list_versions

from .conftest import S3Env

pytestmark = pytest.mark.s3


def test_lost_answers_are_resolved_by_reading_the_record_back(s3_proxied: S3Env) -> None:
    proxy = s3_proxied.proxy
    root = s3_proxied.root()
    for step in (1, 2):
        portable_ckpt.save_arrays(root, {"w": np.full(100, step, np.float32)}, step=step)
    proxy.match_method, proxy.match_path = "PUT", r"s000000000003.*manifest\.json"
    proxy.fail_after_every = 1
    info = portable_ckpt.save_arrays(root, {"w": np.full(100, 3, np.float32)}, step=3)
    assert proxy.log.injected_500 >= 1
    proxy.reset()
    # The bytes read back are the bytes sent: the save is reported as committed, and it is.
    ck = portable_ckpt.open(root)
    assert ck.id == info.attempt_id and ck.step == 3
    assert ck.verify(deep=True) == []
    np.testing.assert_array_equal(ck.read("w"), np.full(100, 3, np.float32))


def test_an_unresolvable_outcome_raises_unknown_and_removes_nothing(s3_proxied: S3Env) -> None:
    proxy = s3_proxied.proxy
    root = s3_proxied.root()
    portable_ckpt.save_arrays(root, {"w": np.full(100, 1, np.float32)}, step=1)
    # Step 2's record: the PUT is stored but answered 500, and every GET of it answers 500
    # too (after reaching the server): nothing can tell whether the version exists.
    proxy.match_method, proxy.match_path = None, r"s000000000002[^/]*/manifest\.json$"
    proxy.fail_after_every = 1
    with pytest.raises(CommitOutcomeUnknownError, match="Nothing was removed") as exc:
        portable_ckpt.save_arrays(root, {"w": np.full(100, 2, np.float32)}, step=2)
    assert exc.value.code == "PCK-STORAGE"
    proxy.reset()
    # The version was published, and every file of it is still there.
    ck = portable_ckpt.open(root)
    assert ck.step == 2 and ck.verify(deep=True) == []
    np.testing.assert_array_equal(ck.read("w"), np.full(100, 2, np.float32))
    assert [v.status for v in list_versions(root)] == ["committed", "committed"]


def test_a_refused_put_is_still_not_created(s3_proxied: S3Env) -> None:
    """A 4xx answer (other than 409/412) means nothing was stored: a plain PCK-STORAGE."""
    proxy = s3_proxied.proxy
    root = s3_proxied.root()
    proxy.match_method, proxy.match_path = "PUT", r"manifest\.json"
    proxy.fail_every, proxy.fail_status = 1, (403, "AccessDenied")
    with pytest.raises(portable_ckpt.CheckpointError) as exc:
        portable_ckpt.save_arrays(root, {"w": np.zeros(4, np.float32)}, step=1)
    assert not isinstance(exc.value, CommitOutcomeUnknownError)
    proxy.reset()
    # (missing_ok: the refused save may leave no object under the prefix: no root there)
    assert [v.status for v in list_versions(root, missing_ok=True)] in ([], ["incomplete"])


@pytest.mark.torch
def test_torch_save_with_unknown_outcome_removes_nothing_on_any_rank(s3_proxied: S3Env) -> None:
    """Rank 0's commit cannot tell; every rank says so and no rank deletes its shard."""
    pytest.importorskip("torch")
    import os

    from portable_ckpt.torch.launch import run_group

    proxy = s3_proxied.proxy
    root = s3_proxied.root("torch-unknown")
    proxy.match_method, proxy.match_path = None, r"s000000000005[^/]*/manifest\.json$"
    proxy.fail_after_every = 1
    env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "PCK_S3_"))}
    res = run_group("tests.s3._torch_workers:save_outcome_unknown", 2, (root, env), timeout=240)
    res.raise_for_errors()
    proxy.reset()
    assert [r["unknown"] for r in res.results] == [True, True]
    assert all(r["code"] == "PCK-STORAGE" for r in res.results)
    assert "nothing was removed" in res.results[1]["message"]
    ck = portable_ckpt.open(root)
    assert ck.step == 5 and ck.verify(deep=True) == []  # both ranks' shards are there
    assert len(ck.tensors["w"].ranges) == 2


def test_a_404_reading_back_a_stored_record_removes_nothing(s3_proxied: S3Env) -> None:
    """Attack review 2 F4: on a store that does not check uploads (moto), the record is read
    back after its PUT. One 404 on that read (read-after-write lag, errata 9) made the save
    delete its data files under the record it had published: the newest version could not be
    read, and ``keep=1`` would have removed the intact one before it. Now the outcome is
    unknown (R-COMMIT-19): nothing is removed, and the version is whole.
    """
    proxy = s3_proxied.proxy
    root = s3_proxied.root()
    portable_ckpt.save_arrays(root, {"w": np.full(100, 1, np.float32)}, step=1)
    proxy.match_method, proxy.match_path = "GET", r"s000000000002[^/]*/manifest\.json"
    proxy.fail_status, proxy.fail_every, proxy.fail_limit = (404, "NoSuchKey"), 1, 1
    with pytest.raises(CommitOutcomeUnknownError, match="reading it back"):
        portable_ckpt.save_arrays(root, {"w": np.full(100, 2, np.float32)}, step=2)
    assert proxy.log.injected_by_status == {404: 1}
    proxy.reset()
    ck = portable_ckpt.open(root)
    assert ck.step == 2 and ck.verify(deep=True) == []
    np.testing.assert_array_equal(ck.read("w"), np.full(100, 2, np.float32))
    assert [v.status for v in list_versions(root)] == ["committed", "committed"]


def test_a_record_stored_with_other_bytes_is_deleted_not_left_published(
    s3_proxied: S3Env,
) -> None:
    """mutation audit 22 A-107: on a store that does not check uploads (moto), a commit record
    corrupted in transit is stored; create_if_absent reads it back, deletes it and raises
    PCK-STORAGE. The corrupted record must not stay published under a save reported failed."""
    from portable_ckpt.errors import StorageError
    from portable_ckpt.storage.s3 import S3Storage

    st = S3Storage.from_url(s3_proxied.root())
    assert st.validates_checksums() is False  # moto keeps a wrong x-amz-checksum-crc32c
    proxy = s3_proxied.proxy
    proxy.match_method, proxy.match_path, proxy.flip_bodies = "PUT", r"manifest\.json", 1
    with pytest.raises(StorageError, match="kept other bytes than were sent") as exc:
        st.create_if_absent("att/manifest.json", b'{"step": 1}')
    assert exc.value.code == "PCK-STORAGE"
    assert not isinstance(exc.value, CommitOutcomeUnknownError)
    assert proxy.flip_bodies == 0  # the corruption was injected
    proxy.reset()
    assert not st.exists("att/manifest.json")
    keys = s3_proxied.boto().list_objects_v2(Bucket=s3_proxied.bucket).get("Contents", [])
    assert [k["Key"] for k in keys if k["Key"].endswith("manifest.json")] == []
    assert st.create_if_absent("att/manifest.json", b'{"step": 1}')  # a retry commits


def test_a_corrupted_record_in_a_versioned_bucket_is_deleted_by_its_version(
    s3_proxied: S3Env,
) -> None:
    """Where the bucket keeps versions, the corrupted record is deleted by the version its PUT
    was answered with: no version of it and no delete marker stay behind."""
    from portable_ckpt.errors import StorageError
    from portable_ckpt.storage.s3 import S3Storage

    bucket = s3_proxied.boto()
    bucket.put_bucket_versioning(Bucket=s3_proxied.bucket,
                                 VersioningConfiguration={"Status": "Enabled"})
    st = S3Storage.from_url(s3_proxied.root())
    assert st.validates_checksums() is False
    proxy = s3_proxied.proxy
    proxy.match_method, proxy.match_path, proxy.flip_bodies = "PUT", r"manifest\.json", 1
    with pytest.raises(StorageError, match="kept other bytes than were sent") as exc:
        st.create_if_absent("att/manifest.json", b'{"step": 1}')
    assert not isinstance(exc.value, CommitOutcomeUnknownError)
    proxy.reset()
    versions = bucket.list_object_versions(Bucket=s3_proxied.bucket, Prefix="ckpts/att/")
    assert versions.get("Versions", []) == [] and versions.get("DeleteMarkers", []) == []
    assert st.create_if_absent("att/manifest.json", b'{"step": 1}')  # a retry commits


def test_a_record_replaced_after_its_create_is_left_to_its_writer(s3_proxied: S3Env) -> None:
    """CI of stop 58: moto let two of eight racing conditional PUTs of one key through, and the
    racer whose read-back found the other's bytes deleted them, taking them for its own upload
    corrupted in transit. Only the object under the ETag this create's PUT was answered with
    is its own: other bytes under another ETag are left, and the outcome is unknown."""
    from portable_ckpt.storage.s3 import S3Storage

    st = S3Storage.from_url(s3_proxied.root())
    assert st.validates_checksums() is False  # so the record is read back after its PUT
    key = "ckpts/att/manifest.json"
    other = b'{"written": "by another"}'
    proxy = s3_proxied.proxy
    proxy.match_method, proxy.match_path = "PUT", r"att/manifest\.json"

    def replace(_path: str) -> None:  # another writer, after our PUT and before our read-back
        s3_proxied.boto().put_object(Bucket=s3_proxied.bucket, Key=key, Body=other)

    proxy.after_upstream = replace
    with pytest.raises(CommitOutcomeUnknownError, match="another writer's object") as exc:
        st.create_if_absent("att/manifest.json", b'{"step": 1}')
    assert "Nothing was removed" in exc.value.message and exc.value.path == "att/manifest.json"
    proxy.reset()
    assert st.read_all("att/manifest.json", max_size=100) == other


def test_a_corrupted_record_without_an_etag_is_deleted_by_its_name(s3_proxied: S3Env) -> None:
    """Where the PUT's answer carries no ETag, nothing tells whose bytes were read back: the
    attempt's own name decides (no other writer creates it), and the corrupted record is
    deleted, not left published under a save reported failed (mutation audit 22 A-107)."""
    from portable_ckpt.errors import StorageError
    from portable_ckpt.storage.s3 import S3Storage

    st = S3Storage.from_url(s3_proxied.root())
    assert st.validates_checksums() is False
    proxy = s3_proxied.proxy
    proxy.match_method, proxy.match_path, proxy.flip_bodies = "PUT", r"manifest\.json", 1
    proxy.set_headers = {"ETag": None}
    with pytest.raises(StorageError, match="kept other bytes than were sent") as exc:
        st.create_if_absent("att/manifest.json", b'{"step": 1}')
    assert not isinstance(exc.value, CommitOutcomeUnknownError)
    assert proxy.flip_bodies == 0
    proxy.reset()
    assert not st.exists("att/manifest.json")


def test_a_409_conditional_request_conflict_is_asked_again(s3_proxied: S3Env) -> None:
    """mutation audit 22 A-105: S3 answers a conditional PUT 409 ConditionalRequestConflict while
    another conditional write of the key is in progress: the PUT is asked again (and creates the
    record), never read as "exists" for a record nobody wrote."""
    from portable_ckpt.storage.s3 import S3Storage

    st = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01)
    st.validates_checksums()  # the probe PUT, before the PUTs counted below
    assert st.honours_conditional_put()  # the If-None-Match probe's two PUTs, the same
    proxy = s3_proxied.proxy
    proxy.match_method, proxy.match_path = "PUT", r"manifest\.json"
    proxy.fail_every, proxy.fail_limit = 1, 1
    proxy.fail_status = (409, "ConditionalRequestConflict")
    assert st.create_if_absent("att/manifest.json", b'{"step": 1}') is True
    assert proxy.log.injected_by_status == {409: 1}
    proxy.reset()
    assert st.read_all("att/manifest.json", max_size=100) == b'{"step": 1}'
