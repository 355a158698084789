"""A storage kept for a whole job (a manager's tier) refreshes credentials that expire.

Re-attack 28, 1: the boto3 client of the S3 backend (writes, listings) was built from a frozen
copy of the session's credentials, so a role's, a web identity's or a credential process's
temporary keys were used past their expiry and every request of a kept storage failed from
then on (``ExpiredToken``, said to be retryable, but no fresh token ever reached the client).
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from portable_ckpt.storage.s3 import S3Storage

from .conftest import S3Env

pytestmark = [pytest.mark.s3]

_PROCESS = textwrap.dedent('''
    import datetime, json, sys
    key = open(sys.argv[1]).read().strip()
    # Within botocore's advisory window (15 minutes): every use asks for fresh keys.
    expires = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=12)
    print(json.dumps({"Version": 1, "AccessKeyId": key, "SecretAccessKey": "secret" + key,
                      "SessionToken": "token" + key,
                      "Expiration": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}))
''')


def test_a_kept_storage_uses_refreshed_credentials(
    s3_proxied: S3Env, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    keyfile = tmp_path / "key"
    keyfile.write_text("OLDKEY0001")
    script = tmp_path / "credential_process.py"
    script.write_text(_PROCESS)
    config = tmp_path / "config"
    config.write_text(f"[default]\ncredential_process = {sys.executable} {script} {keyfile}\n")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    st = S3Storage.from_url(s3_proxied.root("refresh"), backoff_initial=0.01)
    st.put("v/a", b"x" * 10)  # the client is made with the first keys
    assert [o.path for o in st.list("")] == ["v/a"]
    keyfile.write_text("NEWKEY0002")  # refreshed; the first keys expire
    s3_proxied.proxy.deny_keys = {"OLDKEY0001"}
    s3_proxied.proxy.log.denied = 0
    st.put("v/b", b"y" * 10)
    assert sorted(o.path for o in st.list("")) == ["v/a", "v/b"]
    assert s3_proxied.proxy.log.denied == 0
