"""``ls`` of an S3 root lists each level once (attack review L5: the root six times, pins twice).

Requests are counted by the fault proxy in front of moto (real HTTP); the same ``ls`` output
as with every listing asked again, and nothing kept across commands.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import portable_ckpt
from portable_ckpt.cli.main import main as cli

from .conftest import S3Env

pytestmark = [pytest.mark.s3]



def test_ls_lists_the_root_once(s3_proxied: S3Env, capsys: pytest.CaptureFixture[str]) -> None:
    root = s3_proxied.root("ls")
    for step in (10, 20, 30):
        portable_ckpt.save_arrays(root, step=step, arrays={"w": np.arange(4.0) * step})
    s3_proxied.boto().put_object(Bucket=s3_proxied.bucket, Key="ls/NOTES.txt", Body=b"x")
    capsys.readouterr()
    s3_proxied.proxy.reset()
    assert cli(["ls", "--json", root]) == 0
    doc = json.loads(capsys.readouterr().out)
    seen = s3_proxied.listings()
    assert seen[("ls/", True)] == 1, seen  # was 6: attempts, pins' parent, foreign entries
    assert seen[("ls/pins/", True)] == 1, seen  # was 2
    assert max(seen.values()) == 1, seen
    assert [v["step"] for v in doc["versions"]] == [10, 20, 30]
    assert doc["foreign_keys"] == ["NOTES.txt"] and doc["foreign_key_count"] == 1
    # nothing is kept across commands: a version saved since is listed by the next ls
    portable_ckpt.save_arrays(root, step=40, arrays={"w": np.arange(4.0)})
    capsys.readouterr()
    s3_proxied.proxy.reset()
    assert cli(["ls", "--json", root]) == 0
    assert [v["step"] for v in json.loads(capsys.readouterr().out)["versions"]] == \
        [10, 20, 30, 40]
    assert s3_proxied.listings()[("ls/", True)] == 1


def test_no_save_into_a_version_on_s3(s3: S3Env) -> None:
    """Framework review 26, F1 on an object store: a root that is a version's prefix (it
    holds a manifest.json) or lies below one is refused before anything is written."""
    from portable_ckpt.errors import UsageError

    root = s3.root("nest")
    m = portable_ckpt.save_arrays(root, step=1, arrays={"w": np.ones(2)})
    for inner in (f"{root}/{m.attempt_id}", f"{root}/{m.attempt_id}/data/x"):
        with pytest.raises(UsageError, match="version directory"):
            portable_ckpt.save_arrays(inner, step=2, arrays={"w": np.ones(2)})
    keys = [o["Key"] for o in s3.boto().list_objects_v2(Bucket=s3.bucket)["Contents"]]
    assert not any("s000000000002" in k for k in keys), keys
