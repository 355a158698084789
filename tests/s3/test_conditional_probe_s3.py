"""The S3 backend's probes (moto on loopback, through the fault proxy): whether the store honours
``If-None-Match: *`` (attack review L2, spec R-COMMIT-13), and what a probe leaves at the root
(attack review L3, spec §15.2: ``.pck-probe-<16 hex>``, readers ignore it, ``ls`` leaves it out
of foreign entries, gc deletes one an hour old).
"""

from __future__ import annotations

import json
import logging
import re

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.cli.main import main as cli_main
from portable_ckpt.errors import StorageError
from portable_ckpt.io.gc import gc
from portable_ckpt.logs import EVENT_ATTR
from portable_ckpt.storage import _s3_probes
from portable_ckpt.storage.s3 import S3Storage

from .conftest import S3Env

pytestmark = pytest.mark.s3

PROBE = re.compile(r"\.pck-probe-[0-9a-f]{16}\Z")


def _keys(s3: S3Env) -> list[str]:
    return [o["Key"] for o in s3.boto().list_objects_v2(Bucket=s3.bucket).get("Contents", [])]


def _save(root: str, step: int) -> str:
    m = portable_ckpt.save_arrays(root, {"w": np.full(16, step, np.float32)}, step=step)
    return m.attempt_id


def test_a_store_that_ignores_if_none_match_refuses_to_commit(s3_proxied: S3Env) -> None:
    """L2, R-COMMIT-13: a store that accepts ``If-None-Match: *`` and overwrites anyway (the
    proxy drops the header on its way to moto) let two committers both "win". The probe finds
    it before the first create: nothing is committed, the error names the endpoint, the bucket
    and the fix, one ERROR ``storage.conditional_put_ignored`` says so, and the probe is gone."""
    proxy = s3_proxied.proxy
    proxy.match_method, proxy.drop_request_headers = "PUT", {"If-None-Match"}
    root = s3_proxied.root("run")
    st = S3Storage.from_url(root)
    st.put("x/data", b"abc")  # a plain PUT still works
    with pytest.raises(StorageError) as info:
        _save(root, 1)
    err = info.value
    assert err.code == "PCK-STORAGE" and not err.retryable
    assert proxy.url in err.message and repr(s3_proxied.bucket) in err.message
    assert "If-None-Match" in err.message and "conditional writes" in err.message
    assert proxy.log.dropped_headers >= 2  # the probe's two PUTs lost their condition
    assert not [k for k in _keys(s3_proxied) if k.endswith("manifest.json")]
    assert not [k for k in _keys(s3_proxied) if "pck-probe" in k]  # the probe was deleted
    with pytest.raises(StorageError, match="ignores If-None-Match"):
        st.create_if_absent("x/data", b"new")  # would have replaced the object
    assert st.read_all("x/data", max_size=10) == b"abc"
    # A new storage object of the process asks nothing again, and refuses at once.
    proxy.reset()
    again = S3Storage.from_url(root)
    with pytest.raises(StorageError, match="ignores If-None-Match"):
        again.create_if_absent("y/manifest.json", b"{}")
    assert proxy.log.requests == 0


def test_the_ignored_condition_is_logged_once_with_its_fields(
    s3_proxied: S3Env, caplog: pytest.LogCaptureFixture
) -> None:
    """L2: the refusal is a structured event, as ``storage.unchecked_uploads`` is."""
    proxy = s3_proxied.proxy
    proxy.match_method, proxy.drop_request_headers = "PUT", {"If-None-Match"}
    st = S3Storage.from_url(s3_proxied.root("run"))
    with caplog.at_level(logging.WARNING, logger="portable_ckpt"):
        for path in ("a/manifest.json", "b/manifest.json"):
            with pytest.raises(StorageError, match="supports conditional writes"):
                st.create_if_absent(path, b"{}")
    events = [getattr(r, EVENT_ATTR) for r in caplog.records if hasattr(r, EVENT_ATTR)
              and getattr(r, EVENT_ATTR)["event"] == "storage.conditional_put_ignored"]
    assert len(events) == 1
    assert events[0]["endpoint"] == proxy.url and events[0]["bucket"] == s3_proxied.bucket
    assert [r.levelno for r in caplog.records if hasattr(r, EVENT_ATTR) and getattr(
        r, EVENT_ATTR)["event"] == "storage.conditional_put_ignored"] == [logging.ERROR]
    assert _keys(s3_proxied) == []  # neither record, nor the probe


def test_the_probe_costs_three_requests_once_per_process(s3_proxied: S3Env) -> None:
    """L2: PUT, PUT again (refused 412: moto honours the condition), DELETE (obstore's is a
    bulk delete, a POST), before the first create of the process and (endpoint, bucket); none
    where conditional PUT is off."""
    proxy = s3_proxied.proxy
    root = s3_proxied.root("run")
    st = S3Storage.from_url(root)
    assert st.validates_checksums() is False  # its own probe first: moto keeps a wrong CRC32C
    proxy.reset()
    assert st.create_if_absent("a/manifest.json", b"{}") is True
    # the probe's PUT, PUT (412) and DELETE; the create's PUT and its read-back GET
    assert proxy.log.by_method == {"PUT": 3, "POST": 1, "GET": 1}, proxy.log.by_method
    proxy.reset()
    other = S3Storage.from_url(root)
    assert other.create_if_absent("b/manifest.json", b"{}") is True
    assert other.create_if_absent("b/manifest.json", b"[]") is False  # the condition holds
    assert proxy.log.by_method == {"PUT": 2, "GET": 2}, proxy.log.by_method
    assert not [k for k in _keys(s3_proxied) if "pck-probe" in k]
    # conditional PUT off: refused without a request (no probe)
    proxy.reset()
    off = S3Storage.from_url(s3_proxied.root("off"), conditional_put=False)
    with pytest.raises(StorageError, match="conditional PUT is off"):
        off.create_if_absent("c/manifest.json", b"{}")
    assert proxy.log.requests == 0


def test_a_409_on_the_probe_is_asked_again(s3_proxied: S3Env) -> None:
    """L2: S3 answers a conditional PUT 409 ConditionalRequestConflict while another
    conditional write of the key is in progress; the probe asks once more, and its 412 then
    says the store honours the condition."""
    proxy = s3_proxied.proxy
    proxy.match_method, proxy.match_path = "PUT", r"\.pck-probe-[0-9a-f]{16}"
    proxy.fail_status, proxy.fail_every, proxy.fail_limit = (409, "ConditionalRequestConflict"), 2, 1
    st = S3Storage.from_url(s3_proxied.root("run"), checksum="off")
    assert st.create_if_absent("a/manifest.json", b"{}") is True
    assert proxy.log.injected_by_status == {409: 1}
    assert proxy.log.by_method["PUT"] == 4  # the probe's three and the create's
    assert not [k for k in _keys(s3_proxied) if "pck-probe" in k]


def test_a_probe_without_an_answer_creates_and_is_asked_again(
    s3_proxied: S3Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """L2: a probe the store refused (403 on the probe's key) says nothing of the condition:
    the create goes on as before the probe, the next creates do not ask for the next
    ``PROBE_UNKNOWN_SECONDS``, and once they are over the store is asked again."""
    proxy = s3_proxied.proxy
    proxy.match_method, proxy.match_path = "PUT", r"\.pck-probe-[0-9a-f]{16}"
    proxy.fail_status, proxy.fail_every = (403, "AccessDenied"), 1
    st = S3Storage.from_url(s3_proxied.root("run"), checksum="off")
    assert st.create_if_absent("a/manifest.json", b"{}") is True
    assert proxy.log.injected_by_status == {403: 1}
    assert st.create_if_absent("b/manifest.json", b"{}") is True
    assert proxy.log.injected_by_status == {403: 1}  # remembered: not asked again
    proxy.reset()
    monkeypatch.setattr(_s3_probes, "PROBE_UNKNOWN_SECONDS", 0.0)  # the period is over
    assert st.create_if_absent("c/manifest.json", b"{}") is True
    # the probe's PUT, PUT (412), DELETE (a POST); the create's PUT and read-back GET
    assert proxy.log.by_method == {"PUT": 3, "POST": 1, "GET": 1}  # answered now, and kept
    assert st.create_if_absent("d/manifest.json", b"{}") is True
    assert proxy.log.by_method == {"PUT": 4, "POST": 1, "GET": 2}


def test_a_store_that_refuses_the_probes_is_asked_once_per_period(
    s3_proxied: S3Env, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Re-attack 26: a store that refuses the probes' PUTs (a bucket policy on dot-keys) was
    probed at every create (commit, pin, deletion mark): two probe PUTs and two warnings each.
    The unknown answers are kept for ``PROBE_UNKNOWN_SECONDS``: one probe of each kind and one
    warning each, then none; the safe ways stay (commit records are read back, the creates go
    on with the condition); after the period the store is asked, and warned about, again."""
    proxy = s3_proxied.proxy
    proxy.match_method, proxy.match_path = "PUT", r"\.pck-probe-"
    proxy.fail_status, proxy.fail_every = (403, "AccessDenied"), 1
    root = s3_proxied.root("run")
    st = S3Storage.from_url(root)

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if "could not learn" in r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="portable_ckpt"):
        for i in range(5):
            assert st.create_if_absent(f"a{i}/manifest.json", b"{}") is True
        # Another storage object of the process (a pin, a gc's deletion mark) asks nothing.
        assert S3Storage.from_url(root).create_if_absent("pin/x.json", b"{}") is True
        assert proxy.log.injected_by_status == {403: 2}  # one PUT of each probe
        # the probes' 2 PUTs and the If-None-Match probe's DELETE (a POST); each create's PUT
        # and its read-back GET (the store's checks unknown: commit records are read back)
        assert proxy.log.by_method == {"PUT": 2 + 6, "POST": 1, "GET": 6}, proxy.log.by_method
        msgs = warnings()
        assert len(msgs) == 2, msgs
        assert "honours If-None-Match" in msgs[0] and "asked again in 10 minutes" in msgs[0]
        assert "checks uploaded CRC32C" in msgs[1] and "asked again in 10 minutes" in msgs[1]
        assert st.create_if_absent("a0/manifest.json", b"[]") is False  # the condition holds
        # The period is over: asked (and warned about) once more, then kept again.
        monkeypatch.setattr(_s3_probes, "PROBE_UNKNOWN_SECONDS", 0.0)
        proxy.reset()
        proxy.match_method, proxy.match_path = "PUT", r"\.pck-probe-"
        proxy.fail_status, proxy.fail_every = (403, "AccessDenied"), 1
        assert st.create_if_absent("b/manifest.json", b"{}") is True
        assert proxy.log.injected_by_status == {403: 2}
        monkeypatch.setattr(_s3_probes, "PROBE_UNKNOWN_SECONDS", 600.0)
        for i in range(3):
            assert st.create_if_absent(f"c{i}/manifest.json", b"{}") is True
        assert proxy.log.injected_by_status == {403: 2}
        assert len(warnings()) == 4
    assert not [k for k in _keys(s3_proxied) if "pck-probe" in k]


def test_a_probe_left_behind_is_named_by_the_spec_and_tidied_by_gc(
    s3_proxied: S3Env, capsys: pytest.CaptureFixture[str]
) -> None:
    """L3, spec §15.2: the checksum probe whose delete failed was ``.pck-checksum-probe-<hex>``,
    a foreign entry no gc removed. It is ``.pck-probe-<16 hex>``: readers ignore it, ``ls``
    leaves it out of foreign entries, and gc deletes it once an hour old on the storage's
    clock (the proxy dates it 2020 in listings), a younger one not."""
    proxy = s3_proxied.proxy
    root = s3_proxied.root("run")
    proxy.delete_key_errors, proxy.delete_key_code = 1, "AccessDenied"  # kept, and said so
    assert S3Storage.from_url(root).validates_checksums() is False
    left = proxy.log.refused_keys
    assert len(left) == 1 and PROBE.match(left[0].removeprefix("run/")), left
    proxy.reset()
    assert [k for k in _keys(s3_proxied) if k.startswith("run/.pck")] == left
    _save(root, 1)
    second = _save(root, 2)
    young = "run/.pck-probe-00112233445566aa"
    s3_proxied.boto().put_object(Bucket=s3_proxied.bucket, Key=young, Body=b"")
    s3_proxied.boto().put_object(Bucket=s3_proxied.bucket, Key="run/notes.txt", Body=b"mine")
    # a save in progress: gc dates it on the storage's clock, and asks it with a clock probe
    s3_proxied.boto().put_object(Bucket=s3_proxied.bucket, Body=b"x",
                                 Key="run/s000000000003-20200101T000000000000Z-00000000000000cc/w")
    assert portable_ckpt.open(root).id == second  # readers ignore it
    assert cli_main(["ls", root, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["foreign_keys"] == ["notes.txt"]
    # The storage's clock: listings date the leftover 2020, the young one as moto does.
    proxy.match_method, proxy.match_path = "GET", r"list-type=2"
    proxy.body_subs = [(rb"(<Key>" + re.escape(left[0]).encode() + rb"</Key>\s*<LastModified>)"
                        rb"[^<]*", rb"\g<1>2020-01-01T00:00:00.000Z")]
    report = gc(root, keep=1)
    proxy.reset()
    assert len(report.deleted) == 1 and len(report.in_grace) == 1
    keys = _keys(s3_proxied)
    assert left[0] not in keys and young in keys and "run/notes.txt" in keys
    assert not [k for k in keys if k.startswith("run/.pck-clock-")]
    assert portable_ckpt.open(root).id == second


def test_threads_that_create_at_once_send_one_checksum_probe(s3_proxied: S3Env) -> None:
    """Re-attack 26: the checksum probe ran outside any lock, so threads creating at once
    (a job's ranks sharing a process, gc's marks) each sent one and each warned."""
    import threading

    st = S3Storage.from_url(s3_proxied.root(), backoff_initial=0.01)
    s3_proxied.proxy.reset()
    start = threading.Barrier(8)
    answers: list[bool] = []

    def ask() -> None:
        start.wait()
        answers.append(st.validates_checksums())

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == [False] * 8  # moto keeps a wrong CRC32C: it does not check
    assert s3_proxied.proxy.log.by_method.get("PUT", 0) == 1, s3_proxied.proxy.log.by_method
